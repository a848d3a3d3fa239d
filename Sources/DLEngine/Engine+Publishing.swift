import DLCore
import DLJobTable
import DLTransfer
import Foundation
import Logging

/// A downloaded, verified file on its way to its final name.
struct PublishItem: Sendable {
    /// The row with the transfer's checkpoint applied (still `running`).
    var job: Job
    /// Where the bytes are (the job's path may change to the name it is published under).
    var partialPath: String
    var checkpoint: TransferCheckpoint
    /// The offset committed before this attempt: all that is durable until the file is synced.
    var committed: Int64
    /// The ranges committed with `committed`, for a segmented download.
    var committedSegments: String? = nil
}

/// The publisher's state: files that wait for a batch, the batch being synced, and batches
/// between their commit and their links.
struct PublisherState {
    /// Downloaded files waiting to be synced, recorded and published in a batch. Their rows are
    /// still `running`; they hold no slot.
    var queue: [PublishItem] = []
    /// The publisher's task runs (it ends when the queue is empty).
    var running = false
    /// Jobs taken from `queue` whose files are being synced (their rows are still running).
    var batch: Set<JobID> = []
    /// Batches of finished files between their commit and their links, outside the queue.
    var linksInFlight = 0
    var linkWaiters: [CheckedContinuation<Void, Never>] = []
}

/// Finished files, in batches: a small file gives its slot back as soon as its last byte is
/// written; syncing, recording and linking happen here for every file that is ready at once
/// (see `Publisher` for why the order is safe).
extension Engine {
    func enqueuePublish(_ item: PublishItem) {
        publisher.queue.append(item)
        guard !publisher.running else { return }
        publisher.running = true
        // Not a loop that waits: it publishes the batches that are ready and ends; shutdown
        // takes what is left in its own turn.
        Task { [weak self] in await self?.runPublisher() }
    }

    private func takePublishBatch() -> [PublishItem] {
        let batch = publisher.queue
        publisher.queue = []
        publisher.batch = Set(batch.map(\.job.id))
        if batch.isEmpty { publisher.running = false }
        return batch
    }

    private func runPublisher() async {
        while true {
            let batch = takePublishBatch()
            guard !batch.isEmpty else { return }
            let failures = await Publisher.syncAll(batch.map(\.partialPath))
            do {
                // The commit and the links wait for the disk outside the queue: transfers that
                // end meanwhile get their slots refilled. Commands that would race a link
                // (`remove`) wait for it (`linksSettled`).
                let prepared = try await serial(turn: true) { () async throws(DLError) in
                    // A completion is written after its claim: claims left waiting go first.
                    let early = scheduling.startedEarly
                    if !early.isEmpty, batch.contains(where: { item in early.contains { $0.id == item.job.id } }) {
                        await commitStarted(scheduling.takeStartedEarly())
                    }
                    publisher.linksInFlight += 1
                    return prepareCompletion(batch, syncFailures: failures)
                }
                let outcome = await commitAndLink(prepared)
                linksDone()
                try await serial(turn: true) { () async throws(DLError) in
                    try finishCompletion(outcome.get())
                    try await schedule()
                    try await flush()
                }
            } catch {
                logger.error("could not record finished files", metadata: ["error": "\(error)"])
                // A commit cut off by a shared table's server (a restart, a partition) may have
                // committed all the same: once the table answers, what it says is done.
                if store.sharesQueue { resolveInDoubt(batch.map(\.job.id)) }
            }
            publisher.batch = []
        }
    }

    /// Completions whose commit failed on a shared table (`ids`) are read again once the table
    /// answers (every second, for at most two leases): a row that says completed had committed
    /// (the COMMIT reached the server, its answer did not), and its file, still a complete
    /// `.part` here, is linked; the others are queued again by the lease turn as usual.
    func resolveInDoubt(_ ids: [JobID]) {
        let tries = max(1, Int(configuration.lease * 2))
        Task { [weak self] in
            for _ in 0..<tries {
                try? await Task.sleep(for: .seconds(1))
                guard let self, await self.linkInDoubt(ids) else { continue }
                return
            }
        }
    }

    /// One look at in-doubt completions; false while the table does not answer.
    private func linkInDoubt(_ ids: [JobID]) async -> Bool {
        do {
            try await serial { () async throws(DLError) in
                let rows = try await storage { try await store.fetch(ids) }
                let linked = rows.filter { $0.state == .completed && access($0.downloadPath, F_OK) != 0 && finishPublish($0) }
                if !linked.isEmpty {
                    logger.notice(
                        "completions whose commit was cut off had committed: their files are linked",
                        metadata: ["jobs": "\(linked.map(\.id))"])
                }
            }
            return true
        } catch {
            return false
        }
    }

    private func linksDone() {
        publisher.linksInFlight -= 1
        guard publisher.linksInFlight == 0 else { return }
        for waiter in publisher.linkWaiters { waiter.resume() }
        publisher.linkWaiters = []
    }

    /// Returns once no finished file is between its commit and its link.
    func linksSettled() async {
        guard publisher.linksInFlight > 0 else { return }
        await withCheckedContinuation { publisher.linkWaiters.append($0) }
    }

    /// Records synced files as completed in one transaction, then links them under their
    /// names and syncs each folder once, then lets the events out; all inside `serial` (at
    /// shutdown). The publisher does the same in three steps, the middle one outside it.
    func complete(_ batch: [PublishItem], syncFailures: [String: TransferFailure]) async throws(DLError) {
        let prepared = prepareCompletion(batch, syncFailures: syncFailures)
        try finishCompletion(await commitAndLink(prepared).get())
    }

    /// What a batch of finished files writes: the completions, and every other change of the
    /// turn (failures recorded above, rows of the turn). Runs inside `serial`, and takes
    /// those changes out of the turn, so that they are committed with the completions.
    func prepareCompletion(_ batch: [PublishItem], syncFailures: [String: TransferFailure]) -> PreparedCompletion {
        // A command (or another worker) may have paused, canceled, removed or taken a job
        // while its file was synced: its rows are written only while still this worker's
        // running jobs (`save(_:owned:)`), and only those written are linked.
        var completed: [(job: Job, item: PublishItem)] = []
        pending.owned.formUnion(batch.map(\.job.id))
        for item in batch {
            var job = item.job
            if let failure = syncFailures[item.partialPath] {
                job.received = item.committed
                job.segments = item.committedSegments
                fail(job, failure)
                continue
            }
            switch Publisher.chooseName(
                path: job.downloadPath, target: item.checkpoint.publishTarget,
                overwrite: job.overwrite, renameIfTaken: job.options.renameIfTaken)
            {
            case .failure(let failure):
                fail(job, failure)
            case .success(let name):
                if job.stagingPath == nil { job.path = name }
                do throws(TransitionError) {
                    completed.append((try StateMachine.apply(.complete, to: job, now: now()), item))
                } catch {
                    logger.error("could not complete", metadata: ["job": "\(job.id)", "error": "\(error.description)"])
                }
            }
        }
        // Failures above are in `pending`; they commit with the completions.
        let prepared = PreparedCompletion(
            saves: pending.saves + completed.map(\.job), owned: pending.owned, completed: completed, notices: pending.notices)
        if pending.saves.contains(where: { $0.state == .waiting }) { wakeMayHaveChanged = true }
        pending.saves = []
        pending.owned = []
        pending.notices = []
        return prepared
    }

    /// Commits the rows, links the files whose completions were written and syncs their
    /// folders (on the blocking pool), then lets the events out.
    func commitAndLink(_ prepared: PreparedCompletion) async -> Result<LinkOutcome, DLError> {
        let events: [StoredEvent]
        let lost: Set<JobID>
        // Events committed after these wait for them (they go out once the files are linked).
        store.holdEvents()
        do throws(DLError) {
            (events, lost) = try await save(prepared.saves, owned: prepared.owned, publish: false)
        } catch {
            store.publishEvents([])
            return .failure(error)
        }
        let written = prepared.completed.filter { !lost.contains($0.job.id) }
        let failures = await Publisher.linkAll(
            written.map {
                Publisher.Link(partial: $0.item.partialPath, final: $0.job.downloadPath, overwrite: $0.job.overwrite)
            })
        var outcome = LinkOutcome(notices: prepared.notices.filter { $0.jobID.map { !lost.contains($0) } ?? true })
        for ((job, item), failure) in zip(written, failures) {
            // Another worker that saw this file recorded but not linked may have linked it first.
            if let failure, !Self.linkedElsewhere(partial: item.partialPath, final: job.downloadPath) {
                outcome.unlinked.append((job, failure))
                continue
            }
            logger.info("completed", metadata: ["job": "\(job.id)", "bytes": "\(job.received)", "path": "\(job.path)"])
            if job.groupID == nil {
                outcome.notices.append(
                    FinishedNotice(jobID: job.id, group: nil, path: job.path, url: job.url, state: "completed", error: nil))
            }
        }
        store.publishEvents(events)
        return .success(outcome)
    }

    /// Back in `serial`: the notices go out with the turn's flush; a file whose name was taken
    /// in the moment since it was chosen keeps its bytes in the partial file, and its job says
    /// why (its next commit).
    func finishCompletion(_ outcome: LinkOutcome) {
        pending.notices += outcome.notices
        for (job, failure) in outcome.unlinked {
            var back = job
            back.state = .running
            back.finishedAt = nil
            fail(back, failure)
        }
    }
}

/// The rows a batch of finished files commits, and the files to link once they are.
struct PreparedCompletion: Sendable {
    var saves: [Job]
    var owned: Set<JobID>
    var completed: [(job: Job, item: PublishItem)]
    /// Notices of the turn's failures: they go out only for rows that were written.
    var notices: [Engine.FinishedNotice]
}

/// What linking a batch gave: notices to let out, and files that could not be linked.
struct LinkOutcome: Sendable {
    var notices: [Engine.FinishedNotice]
    var unlinked: [(job: Job, failure: TransferFailure)] = []
}
