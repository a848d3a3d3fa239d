import DLCore
import DLJobTable
import DLTransfer
import Foundation
import Logging

/// Start-up and shutdown.
extension Engine {
    /// Rows reconciled per read at start-up: memory stays flat whatever the table holds.
    static let reconcilePage = 1000

    /// Recovers from a crash and starts the queue: jobs left `running` by a daemon that died
    /// are queued again, and resume from their committed offset. The table is read a page at
    /// a time, and only the rows that can have files on disk.
    public func start() async throws(DLError) {
        applySpeedLimits()
        try await serial { () async throws(DLError) in
            // Leases (claims, the look for ended ones) are reckoned on a shared table's clock.
            if store.sharesQueue { await measureTableClock() }
            // First, so that members of a group whose move a crash interrupted have their
            // files in place before the rows are checked against the disk.
            try await removeOrphanStaging()
            var cursor: JobID = 0
            var requeued = 0
            while true {
                var page = try await storage { try await store.reconcilePage(afterID: cursor, limit: Self.reconcilePage) }
                guard let last = page.last?.id else { break }
                cursor = last
                if store.sharesQueue {
                    // Another worker's rows are its own, except a completed file that is
                    // still `.part`: its worker died between the commit and the link.
                    for job in page where job.state == .completed && access(job.downloadPath, F_OK) != 0 {
                        _ = finishPublish(job)
                    }
                    page = page.filter(isOwnLeftover)
                }
                requeued += page.filter { $0.state == .running }.count
                let changed = page.compactMap(reconcile)
                // On a shared table, each only while it is still this worker's attempt: another
                // worker may have taken it once its lease ran out.
                _ = try await save(changed, owned: store.sharesQueue ? Set(changed.map(\.id)) : [], publish: true)
            }
            if requeued > 0 {
                logger.info("requeued jobs that were running when dld stopped", metadata: ["count": "\(requeued)"])
            }
            if let reason = configuration.queuePausedReason {
                logger.warning("the queue is paused: \(reason)")
            }
            // A group whose last member completed just before the daemon died is published now.
            for id in try await storage({ try await store.openGroups() }) {
                guard let group = try await storage({ try await store.fetchGroup(id) }), group.error == nil else { continue }
                // A live HLS recording that was open resumes its reloads (and is not published).
                try await resumeRecording(group)
                if liveRecordings[id] != nil { continue }
                let counts = try await storage { try await store.memberCounts(of: id) }
                let total = counts.values.reduce(0, +)
                if total > 0, counts[.completed, default: 0] == total {
                    let members = try await storage { try await store.members(of: id) }
                    try await publish(group, members: members)
                }
            }
            try await schedule()
            try await flush()
        }
        markStarted()
    }

    /// On a shared table, start-up reconciles only the jobs this worker was running when it
    /// stopped (or that a daemon which did not claim left running): the other rows belong to
    /// other workers, whose files this machine may not even see; their jobs come back through
    /// the leases.
    func isOwnLeftover(_ job: Job) -> Bool {
        job.state == .running && (job.worker == nil || job.worker == configuration.worker)
    }

    /// A completed job whose file is still `<name>.part`, complete: a daemon died between
    /// recording it and linking it (this one, or on a shared table any worker). Links it now;
    /// returns whether it did. A file that another worker links at the same moment counts.
    func finishPublish(_ job: Job) -> Bool {
        var info = stat()
        // An encrypted file is longer than its plaintext by the age layout, a known amount.
        let complete =
            job.options.isEncrypted
            ? AgeLayout.encryptedSize(plaintext: job.received, recipients: job.options.encryptTo?.count ?? 0) : job.received
        guard lstat(job.partialPath, &info) == 0, (info.st_mode & S_IFMT) == S_IFREG, Int64(info.st_size) == complete else {
            return false
        }
        do throws(TransferFailure) {
            try PartialFile.link(job.partialPath, to: job.downloadPath, overwrite: job.overwrite)
            PartialFile.syncDirectory(of: job.downloadPath)
            logger.notice(
                "published a file recorded as completed by a daemon that stopped before linking it",
                metadata: ["job": "\(job.id)", "path": "\(job.downloadPath)"])
            return true
        } catch {
            if Self.linkedElsewhere(partial: job.partialPath, final: job.downloadPath) { return true }
            logger.warning("could not publish a completed file", metadata: ["job": "\(job.id)", "error": "\(error.error.message)"])
            return false
        }
    }

    /// After a link failed: the partial file is gone and the final name is there, so another
    /// worker of a shared table linked the file first (see `finishPublish`).
    static func linkedElsewhere(partial: String, final: String) -> Bool {
        var info = stat()
        return lstat(partial, &info) != 0 && errno == ENOENT && access(final, F_OK) == 0
    }

    /// Start-up reconciliation of one row with the disk. Returns the row if it changed.
    ///  - running (the daemon died): queued again.
    ///  - unfinished: the partial file is cut back to the committed offset (durability rule 3);
    ///    a partial file that is shorter or gone lowers the offset to what is really there.
    ///  - completed: a file that was recorded but not yet linked when dld died is linked now
    ///    (Publisher's order); a file that is gone is marked `file_missing` (the state stays).
    ///  - completed or canceled: a leftover partial file is ours and is removed. Other `.part`
    ///    files are never touched: browsers use the same suffix in the same folders.
    ///  Before all that, unsynced progress written in this boot over a partial file that holds
    ///  it becomes the committed offset, synced (`adoptingUnsynced`).
    func reconcile(_ original: Job) -> Job? {
        let job = adoptingUnsynced(original)
        var fixed = job
        switch job.state {
        case .running, .queued, .paused, .waiting, .failed:
            if job.state == .running { fixed.state = .queued }
            var info = stat()
            if let stored = job.segments {
                // A segmented download: each range keeps its own synced offset; the file is cut
                // back to the furthest (bytes past a range's offset inside the file are
                // overwritten by its next request). Ranges past the file's end are lowered; a
                // layout that cannot be read, or no file, starts over.
                let onDisk: Int64? = lstat(job.partialPath, &info) == 0 && (info.st_mode & S_IFMT) == S_IFREG ? Int64(info.st_size) : nil
                let layout = job.size.flatMap { SegmentLayout(encoded: stored, size: $0) }
                if let onDisk, let layout {
                    let clamped = layout.clamped(toFileSize: onDisk)
                    if clamped != layout {
                        fixed.received = clamped.written
                        fixed.segments = clamped.encoded
                    }
                    if onDisk > clamped.furthest, let file = try? PartialFile(path: job.partialPath) {
                        try? file.truncate(to: clamped.furthest)
                        try? file.syncData()
                        logger.info(
                            "cut partial file back to its furthest committed range",
                            metadata: ["job": "\(job.id)", "from": "\(onDisk)", "to": "\(clamped.furthest)"])
                    }
                } else {
                    fixed.received = 0
                    fixed.segments = nil
                    if onDisk != nil, let file = try? PartialFile(path: job.partialPath) {
                        try? file.truncate(to: 0)
                        try? file.syncData()
                    }
                }
            } else if lstat(job.partialPath, &info) == 0, (info.st_mode & S_IFMT) == S_IFREG {
                let onDisk = Int64(info.st_size)
                if onDisk > job.received {
                    if let file = try? PartialFile(path: job.partialPath) {
                        try? file.truncate(to: job.received)
                        try? file.syncData()
                        logger.info(
                            "cut partial file back to its committed offset",
                            metadata: ["job": "\(job.id)", "from": "\(onDisk)", "to": "\(job.received)"])
                    }
                } else if onDisk < job.received {
                    fixed.received = onDisk
                }
            } else if job.received > 0 {
                fixed.received = 0
            }
        case .completed:
            if access(job.downloadPath, F_OK) != 0, finishPublish(job) {
                break
            }
            if access(job.downloadPath, F_OK) != 0, job.error?.code != JobErrorCode.fileMissing.rawValue {
                fixed.error = JobError(
                    code: .fileMissing,
                    message: "\(job.downloadPath) was deleted or moved after it completed; remove the record with dlctl rm \(job.id)")
                logger.notice("completed file is missing", metadata: ["job": "\(job.id)", "path": "\(job.downloadPath)"])
            }
            removeLeftover(of: job)
        case .canceled:
            removeLeftover(of: job)
        }
        guard fixed != original else { return nil }
        fixed.updatedAt = now()
        return fixed
    }

    func removeLeftover(of job: Job) {
        var info = stat()
        if lstat(job.partialPath, &info) == 0, (info.st_mode & S_IFMT) == S_IFREG, unlink(job.partialPath) == 0 {
            logger.notice("removed a partial file of a finished job", metadata: ["job": "\(job.id)", "path": "\(job.partialPath)"])
        }
    }

    /// Staging folders of groups that are gone or canceled (a crash in the middle of `remove` or
    /// `cancel`) hold only dld's own partial files: they are removed and logged. The staging
    /// folder of a group recorded as published is moved into place instead. Plain `.part`
    /// files that belong to no job are left alone: browsers use that suffix in the same folders,
    /// and dld cannot tell theirs from its own once the job's row is gone.
    func removeOrphanStaging() async throws(DLError) {
        let groups = try await storage { try await store.groupFolders() }
        let open = Set(groups.filter { $0.closed == nil }.map(\.id))
        let published = Set(groups.filter { $0.closed == .completed }.map(\.id))
        var folders = Set([configuration.downloadDir])
        for group in groups { folders.insert((group.dir as NSString).deletingLastPathComponent) }
        for folder in folders {
            guard let entries = try? FileManager.default.contentsOfDirectory(atPath: folder) else { continue }
            for entry in entries where entry.hasPrefix(".") {
                guard let range = entry.range(of: ".dld-staging-", options: .backwards),
                    let id = GroupID(entry[range.upperBound...]), !open.contains(id)
                else { continue }
                let path = folder + "/" + entry
                var info = stat()
                guard lstat(path, &info) == 0, (info.st_mode & S_IFMT) == S_IFDIR else { continue }
                if published.contains(id), let group = try await storage({ try await store.fetchGroup(id) }), group.staging == path {
                    // Recorded as published, but dld died before the files were moved.
                    let members = try await storage { try await store.members(of: id) }
                    if let recipe = try await recipeRead(group).hls.flatMap(HLSRecipe.decode) {
                        await finishHLSAfterRestart(group, recipe: recipe, overwrite: members.first?.overwrite ?? false)
                    } else {
                        moveIntoPlace(group, members: members)
                    }
                    logger.notice("finished moving a published group into its folder", metadata: ["group": "\(id)", "dir": "\(group.dir)"])
                    continue
                }
                try? FileManager.default.removeItem(atPath: path)
                logger.notice("removed the staging folder of a group that is gone", metadata: ["path": "\(path)"])
            }
        }
    }

    /// Stops or restarts the queue as a whole. Stopped, commands still work but nothing starts.
    public func setQueuePaused(_ paused: Bool) async throws(DLError) -> String? {
        try await serial { () async throws(DLError) in
            configuration.queuePausedReason = paused ? (configuration.queuePausedReason ?? "paused by the user") : nil
            try await schedule()
            try await flush()
            return configuration.queuePausedReason
        }
    }

    /// Stops taking commands, stops every transfer with its bytes synced and committed, and
    /// leaves those jobs queued so that the next start resumes them. Files already downloaded
    /// are synced, recorded and published first.
    public func shutdown() async {
        do {
            try await serial { () async throws(DLError) in
                // The loops (`Engine+Loops`) see it and start nothing more; the service group
                // ends them after this, before the table closes.
                accepting = false
                claimFlushTask?.cancel()
                // Their recipes stay open: the next start resumes the reloads.
                stopRecordings()
                let ready = publisher.queue
                publisher.queue = []
                if !ready.isEmpty {
                    try await complete(ready, syncFailures: await Publisher.syncAll(ready.map(\.partialPath)))
                }
                var stopped = await stopTransfers(in: .all, intent: .shutdown)
                // Files recorded completed are linked before dld exits.
                await linksSettled()
                for index in stopped.indices {
                    stopped[index].state = .queued
                    stopped[index].updatedAt = now()
                }
                pending.saves += stopped
                pending.owned.formUnion(stopped.map(\.id))
                try await flush()
            }
        } catch {
            logger.error("could not record every transfer at shutdown", metadata: ["error": "\(error)"])
        }
        await downloader.shutdown()
    }
}
