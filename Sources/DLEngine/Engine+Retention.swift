import DLCore
import DLJobTable
import Foundation

/// Records that do not grow forever: finished records go after `keep_finished` and
/// `keep_failed` (the files stay), and the job table gives free pages back once they pass a
/// share of the file (docs/architecture.md, "Retention and compaction").
extension Engine {
    /// Deletes the records of standalone jobs in `states` finished at least `olderThan`
    /// seconds ago (all of them without it). Completed files stay; a failed job's partial file
    /// goes with its record, as with `remove`.
    public func removeFinished(_ states: [JobState], olderThan: TimeInterval?) async throws(DLError) -> BulkOutcome {
        let outcome = try await serial { () async throws(DLError) in
            try requireAccepting()
            await linksSettled()
            let rows = RowSelection.finished(states, before: olderThan.map { now().addingTimeInterval(-$0) })
            let outcome = try await storage { try await store.delete(rows, deleteFiles: false, now: now()) }
            for path in outcome.files { removePartial(at: path) }
            Self.trimAfterBulk(outcome.count)
            try await flush()
            return outcome
        }
        if outcome.count > 0 { compactSoon() }
        return outcome
    }

    /// One sweep (`Engine+Loops`); returns the seconds until the next (the policy may change at
    /// a reload).
    func sweep() async -> TimeInterval {
        let policy = configuration.retention
        guard let interval = policy.interval else { return 3600 }
        // Shutting down: the records stay for the next start.
        guard accepting else { return interval }
        var removed = 0
        for sweep in policy.sweeps(now: now()) {
            do {
                removed += try await removeFinished(sweep.states, olderThan: now().timeIntervalSince(sweep.before)).count
            } catch {
                logger.warning("retention: could not remove old records", metadata: ["error": "\(error.message)"])
            }
        }
        if removed > 0 {
            logger.info("retention: removed old records", metadata: ["jobs": "\(removed)"])
        }
        return interval
    }

    /// Compaction after deletes, in the background: a step at a time through the store's
    /// writer, so a command waits for one step at most.
    func compactSoon() {
        guard !compacting else { return }
        compacting = true
        // One compaction after a delete, which ends by itself (a step at a time, so shutdown's
        // turn waits for one step at most).
        Task { [weak self] in
            guard let self else { return }
            let store = self.store
            do {
                let freed = try await store.compact(CompactionPolicy())
                if freed > 0 { self.logger.info("job table compacted", metadata: ["freed_bytes": "\(freed)"]) }
            } catch {
                self.logger.warning("job table compaction failed", metadata: ["error": "\(error)"])
            }
            await self.compactionEnded()
        }
    }

    private func compactionEnded() { compacting = false }
}
