import DLCore
import DLStore
import Foundation
import Logging

/// A worker of a shared queue (the job table in PostgreSQL, several daemons): it renews the
/// leases of what it runs, queues again the jobs of workers whose leases ran out, and stops
/// the transfers of jobs that other daemons paused, canceled or took, within moments of the
/// change (`JobTable.changes`). On SQLite there is one daemon and none of this runs.
extension Engine {
    /// Waits between two looks after a change signal: the changes of that moment, seen once.
    static let changesSettle: Duration = .milliseconds(100)

    func startFleet() {
        guard store.sharesQueue, leaseTask == nil else { return }
        renewedAt = now()
        let period = Duration.milliseconds(Int64(configuration.lease * 1000 / 3))
        // The first turn at once: the worker shows among the live ones from the start.
        leaseTask = Task { [weak self] in
            while !Task.isCancelled {
                guard let self else { return }
                await self.leaseTurn()
                try? await Task.sleep(for: period)
            }
        }
        let changes = store.changes()
        changesTask = Task { [weak self] in
            for await _ in changes {
                try? await Task.sleep(for: Self.changesSettle)
                guard !Task.isCancelled, let self else { return }
                await self.changesTurn()
            }
        }
    }

    func stopFleet() {
        leaseTask?.cancel()
        changesTask?.cancel()
    }

    /// Renews this worker's leases, stops transfers whose jobs are no longer its own, queues
    /// again what it holds but does not run (claims of a turn that failed) and the jobs of
    /// workers whose leases ran out, then fills free slots.
    func leaseTurn() async {
        do {
            try await serial { () async throws(DLError) in
                guard accepting else { return }
                let at = now()
                let owned: Set<JobID>
                do {
                    owned = try await store.renewLeases(worker: configuration.worker, until: at.addingTimeInterval(configuration.lease), now: at)
                } catch {
                    await fence(at)
                    logger.warning("lease renewal failed", metadata: ["error": "\(error)"])
                    throw DLError(.storageError, "could not renew this worker's leases in the shared job table: \(Self.storageText(error))")
                }
                renewedAt = at
                await stopLost(running.keys.filter { !owned.contains($0) })
                try await requeueOrphans(owned)
                let expired = try await storage { try await store.requeueExpired(now: at) }
                if !expired.isEmpty {
                    logger.notice("queued again the jobs of workers whose leases ran out", metadata: ["jobs": "\(expired.count)"])
                    try await finishPublishes(since: at.addingTimeInterval(-3 * configuration.lease))
                }
                try await schedule()
                try await flush()
            }
        } catch {
            logger.warning("lease turn failed", metadata: ["error": "\(error)"])
        }
    }

    /// The table could not be reached to renew the leases. Transfers go on while the leases
    /// hold; once most of a lease has passed unrenewed, the other workers may take the jobs,
    /// so their transfers stop here (nothing of them is recorded: the table has what was
    /// committed) and nothing is published twice.
    private func fence(_ at: Date) async {
        guard let renewedAt, at.timeIntervalSince(renewedAt) > configuration.lease * 0.8, !running.isEmpty else { return }
        logger.error("the job table is unreachable and the leases are running out: stopping this worker's transfers", metadata: ["jobs": "\(running.count)"])
        await stopLost(Array(running.keys))
    }

    /// A worker whose lease ran out may have died between recording files as completed and
    /// linking them: the files of jobs completed since `since` (its last moments, and more)
    /// that are still `.part` where this worker sees them are linked here. A folder this
    /// machine does not share is left to that worker's next start.
    private func finishPublishes(since: Date) async throws(DLError) {
        let recent = try await storage { try await store.completed(since: since, limit: Self.finishPublishLimit) }
        let linked = recent.filter { access($0.downloadPath, F_OK) != 0 && finishPublish($0) }.count
        if linked > 0 {
            logger.notice("linked files that a worker recorded as completed before it stopped", metadata: ["files": "\(linked)"])
        }
    }

    /// Recent completions looked at after a lease ran out, at most.
    static let finishPublishLimit = 5000

    /// Looks at the rows of what runs here after other daemons changed the table.
    func changesTurn() async {
        do {
            try await serial { () async throws(DLError) in
                guard accepting else { return }
                let ids = running.keys.sorted()
                if !ids.isEmpty {
                    let rows = try await storage { try await store.fetch(ids) }
                    let mine = Set(rows.filter { $0.state == .running && ($0.worker == nil || $0.worker == configuration.worker) }.map(\.id))
                    await stopLost(ids.filter { !mine.contains($0) })
                }
                try await schedule()
                try await flush()
            }
        } catch {
            logger.warning("could not look at the table's changes", metadata: ["error": "\(error)"])
        }
    }

    /// Stops transfers of jobs this worker no longer holds; writes nothing.
    func stopLost(_ ids: [JobID]) async {
        guard !ids.isEmpty else { return }
        logger.notice("jobs changed by another worker or command: their transfers stop here", metadata: ["jobs": "\(ids.sorted())"])
        for id in ids {
            _ = await stopTransfer(id, intent: .lost)
        }
    }

    /// Jobs committed as running under this worker that nothing here runs, syncs or is about
    /// to start: queued again.
    private func requeueOrphans(_ owned: Set<JobID>) async throws(DLError) {
        let busy = Set(running.keys).union(publishing).union(toPublish.map(\.job.id)).union(pending.launches.map(\.id))
        let orphans = owned.subtracting(busy)
        guard !orphans.isEmpty else { return }
        let rows = try await storage { try await store.fetch(orphans.sorted()) }
        for var job in rows where job.state == .running {
            job.state = .queued
            job.updatedAt = now()
            pending.saves.append(job)
            pending.owned.insert(job.id)
        }
        logger.notice("queued again jobs claimed here that did not start", metadata: ["jobs": "\(orphans.sorted())"])
    }

    /// The workers seen within two leases (this one first when it has not renewed yet).
    func liveWorkers() async throws(DLError) -> [(id: String, seenAt: Date)] {
        guard store.sharesQueue else { return [(configuration.worker, now())] }
        let seen = try await storage { try await store.workers(seenSince: now().addingTimeInterval(-2 * configuration.lease)) }
        return seen.contains { $0.id == configuration.worker } ? seen : [(configuration.worker, startedAt)] + seen
    }
}
