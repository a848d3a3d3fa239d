import DLCore
import DLJobTable
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
        guard online != self.online else { return }
        self.online = online
        logger.notice(online ? "the network is back" : "no route to any network")
        guard online else { return }
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

/// Downloads on a metered connection (docs/architecture.md, "Network awareness"): while
/// NetworkManager says the connection is metered, a job that may not download on it
/// (`MeteredPolicy`) waits with `metered` instead of starting, without using an attempt, and
/// a running one is stopped with its bytes kept; when the connection is no longer metered,
/// every job waiting with `metered` is queued again at once.
extension Engine {
    /// How long a job held for a metered connection waits if no change is ever reported (a
    /// safety net: the monitor queues it again as soon as the connection is not metered).
    static let meteredRecheck: TimeInterval = 3600

    /// The state at start-up, before the queue runs (nothing to stop or queue yet).
    public func setConnectionMetered(_ metered: Bool) {
        connectionMetered = metered
    }

    /// The metered monitor saw the state change: running jobs that may not download on a
    /// metered connection stop and wait; jobs that waited for it are queued again.
    public func meteredChanged(_ metered: Bool) async {
        guard metered != connectionMetered else { return }
        connectionMetered = metered
        logger.notice(metered ? "the connection is metered" : "the connection is no longer metered")
        do {
            try await serial { () async throws(DLError) in
                guard accepting else { return }
                if metered {
                    await holdRunningForMetered()
                    // Committed before the groups are looked at: a group whose members all
                    // wait gives its slot back.
                    try await flush()
                } else {
                    try await requeueHeldForMetered()
                }
                try await schedule()
                try await flush()
            }
        } catch {
            logger.error("could not apply the change of the metered state", metadata: ["error": "\(error)"])
        }
    }

    /// Whether `job` may transfer now.
    func mayTransfer(_ job: Job) -> Bool {
        MeteredPolicy.mayTransfer(
            connectionMetered: connectionMetered, job: job.options.metered, allowedByDefault: configuration.meteredByDefault)
    }

    /// Splits jobs just claimed (committed `running`) into the ones that may transfer and the
    /// others as `waiting(metered)` rows, their claim not counted as an attempt.
    func holdForMetered(_ claimed: [Job]) -> (starting: [Job], held: [Job]) {
        guard connectionMetered else { return (claimed, []) }
        var starting: [Job] = []
        var held: [Job] = []
        for job in claimed {
            if mayTransfer(job) {
                starting.append(job)
            } else {
                var job = job
                job.attempts = max(0, job.attempts - 1)
                if let waiting = heldRow(job) { held.append(waiting) }
            }
        }
        return (starting, held)
    }

    /// Stops the transfers that may not go on while the connection is metered, as a pause
    /// does (their synced bytes are kept), and records them waiting with `metered`. Runs
    /// inside `serial`; the caller flushes.
    func holdRunningForMetered() async {
        let ids = running.values.filter { $0.stop == nil && !mayTransfer($0.job) }.map(\.job.id)
        guard !ids.isEmpty else { return }
        for job in await stopTransfers(in: .ids(ids), intent: .pause) {
            var job = job
            // The attempt was cut short here, not by the server.
            job.attempts = max(0, job.attempts - 1)
            if let waiting = heldRow(job) {
                pending.saves.append(waiting)
                pending.owned.insert(waiting.id)
            }
        }
        logger.info("stopped the transfers that wait for a connection that is not metered", metadata: ["jobs": "\(ids.count)"])
    }

    /// Queues again every job waiting with `metered`; the ones that still may not transfer
    /// (the config's default changed while the connection is metered) go back to waiting as
    /// they are claimed. Runs inside `serial`.
    func requeueHeldForMetered() async throws(DLError) {
        let count = try await storage { try await store.requeueWaiting(for: .metered, now: now()) }
        if count > 0 {
            logger.info("queued again the jobs that waited for a connection that is not metered", metadata: ["jobs": "\(count)"])
        }
        wakeMayHaveChanged = true
    }

    /// A `running` row of this worker as `waiting(metered)`.
    private func heldRow(_ job: Job) -> Job? {
        let error = JobError(
            code: .metered,
            message: "the connection is metered and this job downloads only on a connection that is not metered")
        do {
            return try StateMachine.apply(.wait(.metered, error, until: now().addingTimeInterval(Self.meteredRecheck)), to: job, now: now())
        } catch {
            logger.error("could not hold a job for a metered connection", metadata: ["job": "\(job.id)", "error": "\(error)"])
            return nil
        }
    }
}
