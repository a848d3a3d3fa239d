import DLCore
import DLJobTable
import DLTransfer
import Foundation
import Logging

/// Unsynced progress: what running transfers have written but not yet synced, recorded a few
/// times a second with the boot id, so that a resume after dld alone died (SIGKILL, a crash)
/// refetches a fraction of a second of transfer, not everything since the last checkpoint.
/// A reboot or a power loss ends the boot, and with it the trust (see docs/architecture.md,
/// "Checkpoints").
extension Engine {
    /// How often the running transfers' unsynced progress is recorded: at most this much
    /// transfer is fetched again after a kill of dld (plus what was in flight and the tick's
    /// own latency, so that the whole stays about 0.25 s). A tick of 0.25 s missed the target of
    /// the bench's kill cycle (docs/benchmarks.md, "What was tried": unsynced progress every
    /// 0.2 s); each tick is one small write without an fsync.
    public static let unsyncedInterval: Duration = .milliseconds(200)

    /// The kernel's id of this boot; nil when it cannot be read (then nothing unsynced is
    /// recorded or trusted).
    public static func currentBootID(path: String = "/proc/sys/kernel/random/boot_id") -> String? {
        guard let text = try? String(contentsOfFile: path, encoding: .utf8) else { return nil }
        let id = text.trimmingCharacters(in: .whitespacesAndNewlines)
        return id.isEmpty ? nil : id
    }

    /// One store write for every running transfer whose written bytes moved since the last
    /// record (a tick of `Engine+Loops`, which ticks only while transfers run). In a turn of
    /// the serial queue, so that it never lands after the outcome of the same transfer (which
    /// clears it).
    func recordUnsynced() async {
        // A turn that waits behind a long one is enough; the next tick would repeat it.
        guard !recordingUnsynced, !running.isEmpty, let boot = configuration.bootID else { return }
        recordingUnsynced = true
        defer { recordingUnsynced = false }
        do {
            try await serial { () async throws(DLError) in
                guard accepting else { return }
                var records: [UnsyncedRecord] = []
                for (id, entry) in running where entry.stop == nil {
                    guard let written = entry.progress.written else { continue }
                    let record = UnsyncedProgress(
                        bootID: boot, received: written.received, segments: written.segments, size: written.size,
                        validators: written.validators, finalURL: written.finalURL)
                    guard record != entry.recorded else { continue }
                    records.append(UnsyncedRecord(id: id, epoch: entry.job.epoch, progress: record))
                }
                guard !records.isEmpty else { return }
                try await storage { try await store.recordUnsynced(records, owner: configuration.worker) }
                for record in records { running[record.id]?.recorded = record.progress }
            }
        } catch {
            // The next tick tries again; a checkpoint is still due every 2 s.
            logger.debug("unsynced progress not recorded", metadata: ["error": "\(error)"])
        }
    }

    /// At start-up: a row whose unsynced progress this boot wrote, over a partial file that
    /// holds it, continues from there. The file is synced first, then the progress becomes the
    /// row's committed offset (the caller commits it). Any other record is dropped: the row's
    /// synced offset counts, and the file is cut back to it.
    func adoptingUnsynced(_ job: Job) -> Job {
        guard let unsynced = job.unsynced else { return job }
        var adopted = job
        adopted.unsynced = nil
        // Only a transfer records it; a row left running (or queued again from an expired
        // lease) is the one to continue. A finished or failed row's bytes are what they are.
        guard [.running, .queued, .waiting, .paused].contains(job.state) else { return adopted }
        var info = stat()
        let length: Int64? = lstat(job.partialPath, &info) == 0 && (info.st_mode & S_IFMT) == S_IFREG ? Int64(info.st_size) : nil
        let choice = ResumePoint.choose(synced: job.received, unsynced: unsynced, bootID: configuration.bootID, fileLength: length)
        guard case .unsynced(let record) = choice else {
            if case .synced(let reason) = choice, reason != .notAhead {
                logger.info(
                    "bytes written but not synced before dld stopped are not trusted", metadata: ["job": "\(job.id)", "why": "\(reason)"])
            }
            return adopted
        }
        do throws(TransferFailure) {
            let file = try PartialFile(path: job.partialPath)
            defer { file.close() }
            try file.syncData()
        } catch {
            logger.warning(
                "could not sync a partial file; resuming from its last checkpoint",
                metadata: ["job": "\(job.id)", "error": "\(error.error.message)"])
            return adopted
        }
        logger.info(
            "resuming from bytes written but not synced before dld stopped (same boot)",
            metadata: ["job": "\(job.id)", "committed": "\(job.received)", "from": "\(record.received)"])
        adopted.received = record.received
        adopted.segments = record.segments
        adopted.size = record.size
        adopted.validators = record.validators
        if let finalURL = record.finalURL { adopted.finalURL = finalURL }
        return adopted
    }
}
