import DLCore
import DLStore
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
}

/// Finished files, in batches: a small file gives its slot back as soon as its last byte is
/// written; syncing, recording and linking happen here for every file that is ready at once
/// (see `Publisher` for why the order is safe).
extension Engine {
    func enqueuePublish(_ item: PublishItem) {
        toPublish.append(item)
        guard !publisherRunning else { return }
        publisherRunning = true
        Task { [weak self] in await self?.runPublisher() }
    }

    private func takePublishBatch() -> [PublishItem] {
        let batch = toPublish
        toPublish = []
        publishing = Set(batch.map(\.job.id))
        if batch.isEmpty { publisherRunning = false }
        return batch
    }

    private func runPublisher() async {
        while true {
            let batch = takePublishBatch()
            guard !batch.isEmpty else { return }
            let failures = await Publisher.syncAll(batch.map(\.partialPath))
            do {
                try await serial { () async throws(DLError) in
                    try await complete(batch, syncFailures: failures)
                    try await schedule()
                    try await flush()
                }
            } catch {
                logger.error("could not record finished files", metadata: ["error": "\(error)"])
            }
            publishing = []
        }
    }

    /// Records synced files as completed in one transaction, then links them under their
    /// names and syncs each folder once, then lets the events out. Runs inside `serial`.
    func complete(_ batch: [PublishItem], syncFailures: [String: TransferFailure]) async throws(DLError) {
        // A command (or another worker) may have paused, canceled, removed or taken a job
        // while its file was synced: its rows are written only while still this worker's
        // running jobs (`save(_:owned:)`), and only those written are linked.
        var completed: [(job: Job, item: PublishItem)] = []
        pending.owned.formUnion(batch.map(\.job.id))
        for item in batch {
            var job = item.job
            if let failure = syncFailures[item.partialPath] {
                job.received = item.committed
                fail(job, failure)
                continue
            }
            switch Publisher.chooseName(path: job.downloadPath, target: item.checkpoint.publishTarget,
                                        overwrite: job.overwrite, renameIfTaken: job.options.renameIfTaken) {
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
        var saves = pending.saves
        let owned = pending.owned
        pending.saves = []
        pending.owned = []
        if saves.contains(where: { $0.state == .waiting }) { wakeMayHaveChanged = true }
        saves += completed.map(\.job)
        let (events, lost) = try await save(saves, owned: owned, publish: false)
        pending.notices.removeAll { $0.jobID.map(lost.contains) ?? false }
        var linked: [String] = []
        for (job, item) in completed where !lost.contains(job.id) {
            do throws(TransferFailure) {
                try PartialFile.link(item.partialPath, to: job.downloadPath, overwrite: job.overwrite)
                linked.append(job.downloadPath)
                logger.info("completed", metadata: ["job": "\(job.id)", "bytes": "\(job.received)", "path": "\(job.path)"])
                if job.groupID == nil {
                    pending.notices.append(FinishedNotice(jobID: job.id, group: nil, path: job.path, url: job.url, state: "completed", error: nil))
                }
            } catch {
                // Another worker that saw this file recorded but not linked linked it first.
                if Self.linkedElsewhere(partial: item.partialPath, final: job.downloadPath) {
                    linked.append(job.downloadPath)
                    if job.groupID == nil {
                        pending.notices.append(FinishedNotice(jobID: job.id, group: nil, path: job.path, url: job.url, state: "completed", error: nil))
                    }
                    continue
                }
                // The name was taken in the moment since it was chosen: the bytes stay in the
                // partial file, and the job says why (its next commit).
                var back = job
                back.state = .running
                back.finishedAt = nil
                fail(back, error)
            }
        }
        Publisher.syncFolders(of: linked)
        store.publishEvents(events)
    }
}

