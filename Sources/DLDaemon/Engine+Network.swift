import DLCore
import DLStore
import DLTransfer
import Foundation

/// Jobs that wait for the network (docs/architecture.md, "Network awareness"): a network
/// failure while this machine has no route to any network does not use up an attempt, and
/// the job waits until a route comes back, when every such job is queued again at once.
extension Engine {
    /// How long a job that failed offline waits if no route change is ever reported (a
    /// safety net: the route monitor queues it again as soon as the network is back).
    static let offlineRecheck: TimeInterval = 3600

    /// The route monitor saw the routes change. The tables are read again here, so reports
    /// that arrive out of order cannot leave a wrong state. Going online queues again the jobs
    /// that waited for the network.
    public func networkChanged() async {
        let online = hasNetwork()
        let wasOnline = self.online
        guard online != wasOnline else { return }
        self.online = online
        logger.notice(online ? "the network is back" : "no route to any network")
        guard online, !wasOnline else { return }
        do {
            try await serial { () async throws(DLError) in
                guard accepting else { return }
                let count = try await storage { try await store.requeueWaiting(for: .network, now: now()) }
                if count > 0 { logger.info("queued again the jobs that waited for the network", metadata: ["jobs": "\(count)"]) }
                wakeMayHaveChanged = true
                try await schedule()
                try await flush()
            }
        } catch {
            logger.error("could not queue the jobs that waited for the network", metadata: ["error": "\(error)"])
        }
    }

    /// True when `failure` is a network failure and this machine has no route: the job then
    /// waits for the network without using an attempt. Asked of the route tables at the
    /// moment of the failure, which may come before the monitor's report.
    func failedOffline(_ failure: TransferFailure) -> Bool {
        guard failure.kind == .transient(.network), !hasNetwork() else { return false }
        online = false
        return true
    }
}
