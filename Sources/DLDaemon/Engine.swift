import DLCore
import DLRPC
import DLStore
import DLTransfer
import Foundation
import Logging

/// One job to create, as a client asked for it (already checked for types, not yet for the
/// filesystem).
public struct EnqueueSpec: Sendable, Equatable {
    public var url: String
    public var path: String?
    public var dir: String?
    public var name: String?
    public var priority: Int = 0
    public var key: String?
    public var meta: String?
    public var headers: [HeaderField] = []
    public var overwrite = false
    public var paused = false
    public var checksum: Checksum?
    public var size: Int64?
    public var onExists: ExistingFilePolicy = .error
    public var insecure = false

    public init(url: String) { self.url = url }
}

/// Engine settings.
public struct EngineConfiguration: Sendable {
    public var downloadDir: String
    /// Transfers at once; 1 means strictly one at a time.
    public var maxActive: Int
    public var backoff: BackoffPolicy
    public var diskSpace: DiskSpacePolicy
    public var checkpoints: CheckpointPolicy
    /// Start with the queue stopped (the boot-loop guard): commands work, nothing starts.
    public var queuePausedReason: String?
    /// Members of one group downloading at once, inside the group's single slot.
    public var groupParallel = 4
    /// Where downloads may be written (resolved folders); nil allows anywhere.
    public var pathPolicy: PathPolicy?
    /// Unfinished jobs at most; an enqueue beyond it is refused with `queue_full`.
    public var maxQueued = 1_000_000
    /// Credentials by host (`~/.netrc`), read when a transfer starts; never stored.
    public var netrcPath: String?

    public init(downloadDir: String, maxActive: Int = 3, backoff: BackoffPolicy = BackoffPolicy(),
                diskSpace: DiskSpacePolicy = DiskSpacePolicy(), checkpoints: CheckpointPolicy = CheckpointPolicy(),
                queuePausedReason: String? = nil, groupParallel: Int = 4, pathPolicy: PathPolicy? = nil,
                maxQueued: Int = 1_000_000, netrcPath: String? = nil) {
        self.groupParallel = groupParallel
        self.pathPolicy = pathPolicy
        self.maxQueued = maxQueued
        self.netrcPath = netrcPath
        self.downloadDir = downloadDir
        self.maxActive = maxActive
        self.backoff = backoff
        self.diskSpace = diskSpace
        self.checkpoints = checkpoints
        self.queuePausedReason = queuePausedReason
    }
}

/// The scheduler: ONE serial queue that decides what runs. Every command and every transfer
/// outcome goes through `serial`, one at a time, even across the awaits of its database writes,
/// so that no two of them can interleave on the same job. Reads (status, list, stats) do not
/// queue: they see committed rows plus the live counters of running transfers.
public actor Engine {
    private let store: JobStore
    private let downloader: Downloader
    private let logger: Logger
    private var configuration: EngineConfiguration
    private let now: @Sendable () -> Date

    private struct Running {
        var job: Job
        var progress: TransferProgress
        var task: Task<TransferResult, Never>
        /// Set when a command stops the transfer; the command then handles its outcome.
        var stop: StopIntent?
    }

    private enum StopIntent: Int, Comparable {
        case shutdown = 0, pause, cancel, remove
        static func < (a: StopIntent, b: StopIntent) -> Bool { a.rawValue < b.rawValue }
    }

    private var running: [JobID: Running] = [:]
    /// Groups holding a slot of the queue.
    private var activeGroups: Set<GroupID> = []
    /// Called after a job or group finishes (completed or failed), outside the serial queue.
    private var onFinished: (@Sendable (FinishedNotice) -> Void)?
    private var progressTask: Task<Void, Never>?
    private var accepting = true
    private var busy = false
    private var waiters: [CheckedContinuation<Void, Never>] = []
    private var wakeTask: Task<Void, Never>?
    private var wakeAt: Date?
    private let startedAt: Date

    public init(
        store: JobStore, downloader: Downloader, configuration: EngineConfiguration, logger: Logger,
        now: @escaping @Sendable () -> Date = { Date() }
    ) {
        self.store = store
        self.downloader = downloader
        self.configuration = configuration
        self.logger = logger
        self.now = now
        self.startedAt = now()
    }

    /// What hooks are told about a finished job or group.
    public struct FinishedNotice: Sendable {
        public var jobID: JobID?
        public var group: JobGroup?
        public var path: String
        public var url: String
        public var state: String
        public var error: JobError?
    }

    public func setOnFinished(_ handler: @escaping @Sendable (FinishedNotice) -> Void) {
        onFinished = handler
    }

    /// Reports live progress of running transfers every `interval` (job.progress events are
    /// coalesced to this rate).
    public func startProgressReports(every interval: Duration, _ report: @escaping @Sendable ([Job], [TransferProgress.Snapshot]) -> Void) {
        progressTask?.cancel()
        progressTask = Task { [weak self] in
            while !Task.isCancelled {
                try? await Task.sleep(for: interval)
                guard let self else { return }
                let (jobs, snapshots) = await self.liveSnapshots()
                if !jobs.isEmpty { report(jobs, snapshots) }
            }
        }
    }

    private func liveSnapshots() -> ([Job], [TransferProgress.Snapshot]) {
        let entries = running.values.sorted { $0.job.id < $1.job.id }
        return (entries.map(\.job), entries.map { $0.progress.snapshot })
    }

    // MARK: The serial queue

    private func serial<T: Sendable>(_ body: () async throws(DLError) -> T) async throws(DLError) -> T {
        if busy {
            await withCheckedContinuation { waiters.append($0) }
        } else {
            busy = true
        }
        defer {
            if waiters.isEmpty { busy = false } else { waiters.removeFirst().resume() }
        }
        return try await body()
    }

    private func storage<T>(_ body: () async throws -> T) async throws(DLError) -> T {
        do {
            return try await body()
        } catch let error as DLError {
            throw error
        } catch let StoreError.pathInUse(path, other) {
            throw DLError(.destinationExists, "job \(other) already downloads to \(path)")
        } catch {
            logger.error("job table error", metadata: ["error": "\(error)"])
            throw DLError(.storageError, "the job table could not be written: \(error)")
        }
    }

    // MARK: Start and stop

    /// Recovers from a crash and starts the queue: jobs left `running` by a daemon that died
    /// are queued again, and resume from their committed offset.
    public func start() async throws(DLError) {
        try await serial { () async throws(DLError) in
            let jobs = try await storage { try await store.list() }
            var changed: [Job] = []
            for job in jobs {
                if let fixed = reconcile(job) { changed.append(fixed) }
            }
            try await storage { try await store.save(changed) }
            let requeued = jobs.filter { $0.state == .running }.count
            if requeued > 0 {
                logger.info("requeued jobs that were running when dld stopped", metadata: ["count": "\(requeued)"])
            }
            if let reason = configuration.queuePausedReason {
                logger.warning("the queue is paused: \(reason)")
            }
            try await removeOrphanStaging()
            // A group whose last member completed just before the daemon died is published now.
            for id in try await storage({ try await store.openGroups() }) {
                guard let group = try await storage({ try await store.fetchGroup(id) }), group.error == nil else { continue }
                let members = try await storage { try await store.members(of: id) }
                if !members.isEmpty, members.allSatisfy({ $0.state == .completed }) {
                    try await publish(group, members: members)
                }
            }
            try await schedule()
        }
    }

    /// Start-up reconciliation of one row with the disk. Returns the row if it changed.
    ///  - running (the daemon died): queued again.
    ///  - unfinished: the partial file is cut back to the committed offset (durability rule 3);
    ///    a partial file that is shorter or gone lowers the offset to what is really there.
    ///  - completed: a file that is gone is marked `file_missing` (the state stays).
    ///  - completed or canceled: a leftover partial file is ours and is removed. Other `.part`
    ///    files are never touched: browsers use the same suffix in the same folders.
    private func reconcile(_ job: Job) -> Job? {
        var fixed = job
        switch job.state {
        case .running, .queued, .paused, .waiting, .failed:
            if job.state == .running { fixed.state = .queued }
            var info = stat()
            if lstat(job.partialPath, &info) == 0, (info.st_mode & S_IFMT) == S_IFREG {
                let onDisk = Int64(info.st_size)
                if onDisk > job.received {
                    if let file = try? PartialFile(path: job.partialPath) {
                        try? file.truncate(to: job.received)
                        try? file.syncData()
                        logger.info("cut partial file back to its committed offset", metadata: ["job": "\(job.id)", "from": "\(onDisk)", "to": "\(job.received)"])
                    }
                } else if onDisk < job.received {
                    fixed.received = onDisk
                }
            } else if job.received > 0 {
                fixed.received = 0
            }
        case .completed:
            if access(job.downloadPath, F_OK) != 0, job.error?.code != "file_missing" {
                fixed.error = JobError(code: "file_missing", message: "\(job.downloadPath) was deleted or moved after it completed")
                logger.notice("completed file is missing", metadata: ["job": "\(job.id)", "path": "\(job.downloadPath)"])
            }
            removeLeftover(of: job)
        case .canceled:
            removeLeftover(of: job)
        }
        guard fixed != job else { return nil }
        fixed.updatedAt = now()
        return fixed
    }

    private func removeLeftover(of job: Job) {
        var info = stat()
        if lstat(job.partialPath, &info) == 0, (info.st_mode & S_IFMT) == S_IFREG, unlink(job.partialPath) == 0 {
            logger.notice("removed a partial file of a finished job", metadata: ["job": "\(job.id)", "path": "\(job.partialPath)"])
        }
    }

    /// Staging folders of groups that are gone or closed (a crash in the middle of `remove` or
    /// `cancel`) hold only dld's own partial files: they are removed and logged. Plain `.part`
    /// files that belong to no job are left alone: browsers use that suffix in the same folders,
    /// and dld cannot tell theirs from its own once the job's row is gone.
    private func removeOrphanStaging() async throws(DLError) {
        let groups = try await storage { try await store.groupFolders() }
        let open = Set(groups.filter(\.open).map(\.id))
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
            return configuration.queuePausedReason
        }
    }

    /// Stops taking commands, stops every transfer with its bytes synced and committed, and
    /// leaves those jobs queued so that the next start resumes them.
    public func shutdown() async {
        _ = try? await serial { () async throws(DLError) in
            accepting = false
            wakeTask?.cancel()
            progressTask?.cancel()
            for id in Array(running.keys) {
                _ = try? await stopTransfer(id, intent: .shutdown)
            }
        }
        await downloader.shutdown()
    }

    private func requireAccepting() throws(DLError) {
        guard accepting else { throw DLError(.shuttingDown, "dld is shutting down") }
    }

    // MARK: Commands

    public func enqueue(_ specs: [EnqueueSpec]) async throws(DLError) -> [InsertOutcome] {
        try await serial { () async throws(DLError) in
            try requireAccepting()
            var existing: [Int: Job] = [:]
            var news: [NewJob] = []
            var seenPaths: [String: Int] = [:]
            let unfinished = try await storage { try await store.unfinishedCount() }
            guard unfinished + specs.count <= configuration.maxQueued else {
                throw DLError(.queueFull, "\(unfinished) jobs are unfinished and the limit is \(configuration.maxQueued) (max_queued)")
            }
            // Names in use by unfinished jobs, for on_exists "rename" (else the store refuses them).
            let inUse: Set<String> = specs.contains(where: { $0.onExists == .rename })
                ? Set(try await storage { try await store.unfinishedPaths() }) : []
            let destination = Destination(downloadDir: configuration.downloadDir, policy: configuration.pathPolicy)
            for (index, spec) in specs.enumerated() {
                if let key = spec.key, let job = try await storage({ try await store.fetch(key: key) }) {
                    existing[index] = job
                    continue
                }
                do throws(DLError) {
                    _ = try URLRules.validate(spec.url).get()
                    let resolved = try destination.resolve(
                        url: spec.url, path: spec.path, dir: spec.dir, name: spec.name, overwrite: spec.overwrite,
                        onExists: spec.onExists, taken: { inUse.contains($0) || seenPaths[$0] != nil })
                    let path = resolved.path
                    if let other = seenPaths[path] {
                        throw DLError(.destinationExists, "jobs \(other) and \(index) of this request both download to \(path)")
                    }
                    seenPaths[path] = index
                    var new = NewJob(
                        url: spec.url, path: path, priority: spec.priority, key: spec.key, meta: spec.meta,
                        headers: spec.headers, overwrite: spec.overwrite, state: spec.paused ? .paused : .queued,
                        checksum: spec.checksum, expectedSize: spec.size)
                    new.options = JobOptions(automaticName: resolved.automatic, renameIfTaken: spec.onExists == .rename, insecure: spec.insecure)
                    news.append(new)
                } catch {
                    if specs.count == 1 { throw error }
                    throw DLError(error.code, "jobs[\(index)]: \(error.message)")
                }
            }
            let inserted = try await storage { try await store.insert(news, now: now()) }
            var outcomes: [InsertOutcome] = []
            var next = inserted.makeIterator()
            for index in specs.indices {
                if let job = existing[index] {
                    outcomes.append(InsertOutcome(job: job, created: false))
                } else if let outcome = next.next() {
                    outcomes.append(outcome)
                }
            }
            let created = outcomes.filter(\.created).count
            if created > 0 { logger.info("enqueued", metadata: ["jobs": "\(created)"]) }
            try await schedule()
            return outcomes
        }
    }

    public func pause(_ selection: JobSelection) async throws(DLError) -> [Job] {
        try await command(.pause, selection, noOp: [.paused]) { (job) async throws(DLError) -> Job? in
            if running[job.id] != nil {
                return try await stopTransfer(job.id, intent: .pause)
            }
            return try await transition(job, .pause)
        }
    }

    public func resume(_ selection: JobSelection) async throws(DLError) -> [Job] {
        if case .group(let reference) = selection {
            try await serial { () async throws(DLError) in
                var group = try await resolve(reference)
                guard group.closed == nil, group.error != nil else { return }
                // A publish that failed (a file appeared in the folder) is tried again.
                group.error = nil
                group.updatedAt = now()
                try await storage { try await store.saveGroup(group) }
                try await settle(group.id)
            }
        }
        return try await command(.resume, selection, noOp: [.queued, .running]) { (job) async throws(DLError) -> Job? in
            var job = job
            if let code = job.error?.code, Self.startOverCodes.contains(code) {
                // The bytes on disk are known bad: download again from zero.
                job.received = 0
                job.validators = Validators()
                job.sha256 = nil
                job.digest = nil
            }
            return try await transition(job, .resume)
        }
    }

    /// Failures after which the partial file cannot be trusted.
    static let startOverCodes: Set<String> = ["checksum_mismatch", "size_mismatch"]

    public func cancel(_ selection: JobSelection) async throws(DLError) -> [Job] {
        let jobs = try await command(.cancel, selection, noOp: [.canceled]) { (job) async throws(DLError) -> Job? in
            if running[job.id] != nil {
                return try await stopTransfer(job.id, intent: .cancel)
            }
            let canceled = try await transition(job, .cancel)
            removePartial(of: job)
            return canceled
        }
        if case .group(let reference) = selection {
            try await serial { () async throws(DLError) in
                var group = try await resolve(reference)
                guard group.closed == nil else { return }
                activeGroups.remove(group.id)
                group.closed = .canceled
                group.updatedAt = now()
                group.finishedAt = now()
                try await storage { try await store.saveGroup(group) }
                removeStaging(group)
                try await schedule()
            }
        }
        return jobs
    }

    /// Deletes job records. Unfinished jobs are stopped and their partial data removed; a
    /// finished file stays unless `deleteFile` (nothing the user owns goes silently).
    public func remove(_ selection: JobSelection, deleteFile: Bool) async throws(DLError) -> [Job] {
        try await serial { () async throws(DLError) in
            try requireAccepting()
            let jobs = try await select(selection)
            if case .group(let reference) = selection {
                let group = try await resolve(reference)
                for job in jobs where running[job.id] != nil { _ = try await stopTransfer(job.id, intent: .remove) }
                activeGroups.remove(group.id)
                try await storage { try await store.deleteGroup(group.id, now: now()) }
                if group.closed != .completed { removeStaging(group) }
                if deleteFile && group.closed == .completed {
                    for job in jobs where unlink(job.path) != 0 && errno != ENOENT {
                        logger.warning("could not delete file", metadata: ["path": "\(job.path)"])
                    }
                }
                try await schedule()
                return jobs
            }
            var removed: [Job] = []
            for job in jobs {
                if running[job.id] != nil {
                    if let stopped = try await stopTransfer(job.id, intent: .remove) { removed.append(stopped) }
                } else {
                    try await storage { try await store.delete([job.id]) }
                    removePartial(of: job)
                    removed.append(job)
                }
                if deleteFile && job.state == .completed {
                    if unlink(job.path) != 0 && errno != ENOENT {
                        logger.warning("could not delete file", metadata: ["path": "\(job.path)", "errno": "\(errno)"])
                    }
                }
            }
            try await schedule()
            return removed
        }
    }

    /// Applies a user command to the selected jobs. With explicit ids, every job must exist and
    /// accept the command, or nothing changes; with `all`, the jobs that accept it change.
    private func command(
        _ event: JobEvent, _ selection: JobSelection, noOp: Set<JobState>,
        apply: (Job) async throws(DLError) -> Job?
    ) async throws(DLError) -> [Job] {
        try await serial { () async throws(DLError) in
            try requireAccepting()
            let selected = try await select(selection)
            var targets: [Job] = []
            for job in selected {
                if noOp.contains(job.state) { continue }
                if StateMachine.allows(event, from: job.state) {
                    targets.append(job)
                } else if case .ids = selection {
                    throw DLError(.invalidState, "job \(job.id): cannot \(event.verb) a job that is \(job.state.rawValue)")
                }
            }
            var changed: [Job] = []
            for job in targets {
                if let updated = try await apply(job) { changed.append(updated) }
            }
            try await schedule()
            if case .ids(let ids) = selection {
                // Report every job asked for, changed or already there, as it is now.
                return try await storage { try await store.fetch(ids) }
            }
            return changed
        }
    }

    private func select(_ selection: JobSelection) async throws(DLError) -> [Job] {
        switch selection {
        case .all:
            return try await storage { try await store.list() }
        case .group(let reference):
            let group = try await resolve(reference)
            return try await storage { try await store.members(of: group.id) }
        case .ids(let ids):
            let jobs = try await storage { try await store.fetch(ids) }
            let found = Set(jobs.map(\.id))
            if let missing = ids.first(where: { !found.contains($0) }) {
                throw DLError(.jobNotFound, "no job with id \(missing)")
            }
            return jobs
        }
    }

    private func transition(_ job: Job, _ event: JobEvent) async throws(DLError) -> Job {
        let next: Job
        do {
            next = try StateMachine.apply(event, to: job, now: now())
        } catch {
            throw DLError(.invalidState, "job \(job.id): \(error.description)")
        }
        try await storage { try await store.save(next) }
        return next
    }

    private func removePartial(of job: Job) {
        if unlink(job.partialPath) != 0 && errno != ENOENT {
            logger.warning("could not remove partial file", metadata: ["path": "\(job.partialPath)"])
        }
    }

    // MARK: Reads

    public func status(_ ids: [JobID]) async throws(DLError) -> [JSONValue] {
        let jobs = try await storage { try await store.fetch(ids) }
        let found = Set(jobs.map(\.id))
        if let missing = ids.first(where: { !found.contains($0) }) {
            throw DLError(.jobNotFound, "no job with id \(missing)")
        }
        return jobs.map(view)
    }

    public func list(states: [JobState]?, afterID: JobID, limit: Int) async throws(DLError) -> [JSONValue] {
        try await storage { try await store.list(states: states, afterID: afterID, limit: limit) }.map(view)
    }

    public struct Stats: Sendable {
        public var counts: [JobState: Int]
        public var active: Int
        public var speed: Double
        public var maxActive: Int
        public var accepting: Bool
        public var uptime: TimeInterval
        public var queuePausedReason: String?
    }

    public func stats() async throws(DLError) -> Stats {
        let counts = try await storage { try await store.counts() }
        let speed = running.values.reduce(0) { $0 + $1.progress.snapshot.speed }
        return Stats(
            counts: counts, active: running.count, speed: speed, maxActive: configuration.maxActive,
            accepting: accepting, uptime: now().timeIntervalSince(startedAt),
            queuePausedReason: configuration.queuePausedReason)
    }

    private func view(_ job: Job) -> JSONValue {
        guard let live = running[job.id]?.progress.snapshot else { return JobJSON.encode(job) }
        return JobJSON.encode(job, live: LiveProgress(received: live.received, size: live.size, speed: live.speed))
    }

    // MARK: Scheduling

    /// Starts queued work while slots are free. A slot holds a standalone job or a whole group;
    /// inside its slot a group runs up to `groupParallel` members. Runs inside `serial`.
    private func schedule() async throws(DLError) {
        guard accepting else { return }
        for id in activeGroups.sorted() { try await settle(id) }
        guard configuration.queuePausedReason == nil else { return try await armWakeUp() }
        let standalone = running.values.filter { $0.job.groupID == nil }.count
        let used = standalone + activeGroups.count
        let free = configuration.maxActive - used
        if free > 0 {
            let units = try await storage { try await store.queuedUnits(excluding: activeGroups, limit: free) }
            let order = SchedulerPolicy.jobsToStart(queued: units.map(\.entry), active: used, maxActive: configuration.maxActive)
            let groupOf = Dictionary(units.map { ($0.entry.id, $0.groupID) }, uniquingKeysWith: { first, _ in first })
            for id in order {
                if let groupID = groupOf[id] ?? nil {
                    activeGroups.insert(groupID)
                    try await fill(groupID)
                } else if let job = try await storage({ try await store.fetch(id) }), job.state == .queued {
                    try await launch(job)
                }
            }
        }
        try await armWakeUp()
    }

    /// Starts queued members of an active group up to `groupParallel`.
    private func fill(_ groupID: GroupID) async throws(DLError) {
        guard configuration.queuePausedReason == nil else { return }
        let busy = running.values.filter { $0.job.groupID == groupID }.count
        let want = configuration.groupParallel - busy
        guard want > 0 else { return }
        for member in try await storage({ try await store.queuedMembers(of: groupID, limit: want) }) {
            try await launch(member)
        }
    }

    /// Looks at an active group after a change: fills its slot, gives the slot back when
    /// nothing of it can run, and publishes it when every member is complete.
    private func settle(_ groupID: GroupID) async throws(DLError) {
        guard let group = try await storage({ try await store.fetchGroup(groupID) }), group.closed == nil else {
            activeGroups.remove(groupID)
            return
        }
        let members = try await storage { try await store.members(of: groupID) }
        if members.contains(where: { $0.state == .queued || $0.state == .running }) {
            if activeGroups.contains(groupID) { try await fill(groupID) }
            return
        }
        activeGroups.remove(groupID)
        if group.error == nil, !members.isEmpty, members.allSatisfy({ $0.state == .completed }) {
            try await publish(group, members: members)
        } else if let failed = members.first(where: { $0.state == .failed }) {
            logger.notice("group failed", metadata: ["group": "\(groupID)", "member": "\(failed.id)"])
            let summary = GroupSummary.summarize(group, members: members, active: false)
            onFinished?(FinishedNotice(jobID: nil, group: group, path: group.dir, url: "", state: "failed", error: summary.error))
        }
    }

    /// Moves a complete group from its staging folder into its folder. A folder that does not
    /// exist yet appears whole, in one rename; into an existing folder the files move one by one,
    /// after checking that none would replace a file that is there.
    private func publish(_ group: JobGroup, members: [Job]) async throws(DLError) {
        var group = group
        let fm = FileManager.default
        do throws(DLError) {
            if !fm.fileExists(atPath: group.dir), rename(group.staging, group.dir) == 0 {
                PartialFile.syncDirectory(of: group.dir)
            } else {
                if let clash = members.first(where: { !$0.overwrite && fm.fileExists(atPath: $0.path) }) {
                    throw DLError(.destinationExists, "\(clash.path) exists already; the group stays staged in \(group.staging)")
                }
                for member in members {
                    let folder = (member.path as NSString).deletingLastPathComponent
                    try? fm.createDirectory(atPath: folder, withIntermediateDirectories: true)
                    guard rename(member.downloadPath, member.path) == 0 else {
                        throw DLError(.storageError, "cannot move \(member.downloadPath) to \(member.path): \(String(cString: strerror(errno)))")
                    }
                    PartialFile.syncDirectory(of: member.path)
                }
                removeStaging(group)
            }
        } catch {
            group.error = JobError(code: error.code.rawValue, message: error.message)
            group.updatedAt = now()
            try await storage { try await store.saveGroup(group) }
            logger.warning("group not published", metadata: ["group": "\(group.id)", "error": "\(error.message)"])
            onFinished?(FinishedNotice(jobID: nil, group: group, path: group.dir, url: "", state: "failed", error: group.error))
            return
        }
        var published: [Job] = []
        for var member in members {
            member.stagingPath = nil
            member.updatedAt = now()
            published.append(member)
        }
        try await storage { try await store.save(published) }
        group.closed = .completed
        group.error = nil
        group.updatedAt = now()
        group.finishedAt = now()
        try await storage { try await store.saveGroup(group) }
        logger.info("group completed", metadata: ["group": "\(group.id)", "files": "\(members.count)", "dir": "\(group.dir)"])
        onFinished?(FinishedNotice(jobID: nil, group: group, path: group.dir, url: "", state: "completed", error: nil))
    }

    /// Deletes a group's staging folder: it holds only dld's own partial and staged files.
    private func removeStaging(_ group: JobGroup) {
        guard group.staging.contains(".dld-staging-") else { return }
        try? FileManager.default.removeItem(atPath: group.staging)
    }

    /// A group by id or name (the newest of that name).
    private func resolve(_ reference: GroupReference) async throws(DLError) -> JobGroup {
        switch reference {
        case .id(let id):
            guard let group = try await storage({ try await store.fetchGroup(id) }) else {
                throw DLError(.groupNotFound, "no group with id \(id)")
            }
            return group
        case .name(let name):
            guard let group = try await storage({ try await store.fetchGroups(named: name) }).first else {
                throw DLError(.groupNotFound, "no group named \(name)")
            }
            return group
        }
    }

    // MARK: Groups

    /// One member of a group to create: a URL and a path relative to the group's folder.
    public struct MemberSpec: Sendable, Equatable {
        public var url: String
        public var relativePath: String?
        public var checksum: Checksum?
        public var size: Int64?
        public var meta: String?
        public init(url: String) { self.url = url }
    }

    /// Creates a group and its members in one transaction.
    public func enqueueGroup(
        name: String, dir: String, priority: Int, headers: [HeaderField], overwrite: Bool, paused: Bool, members: [MemberSpec]
    ) async throws(DLError) -> (JobGroup, [Job]) {
        try await serial { () async throws(DLError) in
            try requireAccepting()
            guard dir.hasPrefix("/") else { throw .invalidParams("group \"dir\" must be absolute, got \(dir)") }
            let unfinished = try await storage { try await store.unfinishedCount() }
            guard unfinished + members.count <= configuration.maxQueued else {
                throw DLError(.queueFull, "\(unfinished) jobs are unfinished and the limit is \(configuration.maxQueued) (max_queued)")
            }
            let destination = Destination(downloadDir: configuration.downloadDir, policy: configuration.pathPolicy)
            let normalized = Destination.normalized(dir)
            let folder = try destination.resolvedFolder((normalized as NSString).deletingLastPathComponent)
                + "/" + (normalized as NSString).lastPathComponent
            var isDirectory: ObjCBool = false
            if FileManager.default.fileExists(atPath: folder, isDirectory: &isDirectory), !isDirectory.boolValue {
                throw DLError(.destinationInvalid, "\(folder) is a file, not a folder")
            }
            var seen: Set<String> = []
            var news: [NewJob] = []
            for (index, member) in members.enumerated() {
                do throws(DLError) {
                    _ = try URLRules.validate(member.url).get()
                    let relative = try RelativePath.validate(member.relativePath ?? FileNames.fromURL(member.url)).get()
                    guard seen.insert(relative).inserted else {
                        throw DLError(.destinationExists, "two members of the group are both named \(relative)")
                    }
                    let path = folder + "/" + relative
                    try destination.check(path)
                    if (path as NSString).lastPathComponent.lowercased().hasSuffix(".part") {
                        throw DLError(.destinationInvalid, "\(relative): names ending in .part are kept for partial files")
                    }
                    if !overwrite && FileManager.default.fileExists(atPath: path) {
                        throw DLError(.destinationExists, "\(path) exists already; pass overwrite to replace it")
                    }
                    news.append(NewJob(
                        url: member.url, path: path, priority: priority, meta: member.meta, headers: headers,
                        overwrite: overwrite, state: paused ? .paused : .queued, checksum: member.checksum, expectedSize: member.size))
                } catch {
                    throw DLError(error.code, "jobs[\(index)]: \(error.message)")
                }
            }
            let (group, jobs) = try await storage {
                try await store.insertGroup(name: name, dir: folder, priority: priority, members: news, now: now())
            }
            // Staged members keep their relative folders.
            for job in jobs {
                let folder = (job.downloadPath as NSString).deletingLastPathComponent
                try? FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
            }
            logger.info("enqueued group", metadata: ["group": "\(group.id)", "members": "\(jobs.count)"])
            try await schedule()
            return (group, jobs)
        }
    }

    /// A group with its summary and members.
    public func groupStatus(_ reference: GroupReference) async throws(DLError) -> (JobGroup, GroupSummary, [JSONValue]) {
        let group = try await resolve(reference)
        let members = try await storage { try await store.members(of: group.id) }
        let summary = GroupSummary.summarize(group, members: members, active: activeGroups.contains(group.id))
        return (group, summary, members.map(view))
    }

    // MARK: Events

    public func lastEventSeq() async throws(DLError) -> Int64 {
        try await storage { try await store.lastEventSeq() }
    }

    public func events(after seq: Int64) async throws(DLError) -> [StoredEvent] {
        try await storage { try await store.events(after: seq) }
    }

    private func launch(_ job: Job) async throws(DLError) {
        let started = try await transition(job, .start)
        let progress = TransferProgress(received: started.received, size: started.size)
        var request = TransferRequest(
            jobID: started.id, url: started.url, headers: started.headers, path: started.downloadPath,
            overwrite: started.overwrite, offset: started.received, size: started.size, validators: started.validators,
            checksum: started.checksum)
        request.expectedSize = started.expectedSize
        request.diskSpace = configuration.diskSpace
        request.checkpoints = configuration.checkpoints
        request.options = started.options
        if started.groupID != nil { request.options.automaticName = false }
        if let netrc = configuration.netrcPath, let text = try? String(contentsOfFile: netrc, encoding: .utf8) {
            request.netrc = Netrc.parse(text)
        }
        if started.options.insecure {
            logger.warning("TLS certificates are not verified for this job (insecure)", metadata: ["job": "\(started.id)"])
        }
        let store = self.store
        let downloader = self.downloader
        let id = started.id
        let task = Task {
            await downloader.run(request, progress: progress) { checkpoint in
                try await store.checkpoint(id, received: checkpoint.received, size: checkpoint.size,
                                           validators: checkpoint.validators, finalURL: checkpoint.finalURL)
            }
        }
        running[id] = Running(job: started, progress: progress, task: task, stop: nil)
        // The watcher hands a transfer that ends by itself to the serial queue. A transfer
        // stopped by a command is handled by that command, and the watcher finds it gone.
        Task { [weak self] in
            let result = await task.value
            await self?.transferEnded(id, task: task, result: result)
        }
    }

    private func transferEnded(_ id: JobID, task: Task<TransferResult, Never>, result: TransferResult) async {
        do {
            try await serial { () async throws(DLError) in
                guard let entry = running[id], entry.task == task, entry.stop == nil else { return }
                running[id] = nil
                let job = try await record(result, for: entry.job)
                if job.groupID == nil, job.state == .completed || job.state == .failed {
                    onFinished?(FinishedNotice(jobID: job.id, group: nil, path: job.path, url: job.url, state: job.state.rawValue, error: job.error))
                }
                try await schedule()
            }
        } catch {
            logger.error("could not record the end of a transfer", metadata: ["job": "\(id)", "error": "\(error)"])
        }
    }

    /// Stops a running transfer for a command and records the outcome the command asked for.
    /// Returns the job as it is afterwards (nil when removed).
    private func stopTransfer(_ id: JobID, intent: StopIntent) async throws(DLError) -> Job? {
        guard var entry = running[id] else { return nil }
        entry.stop = max(entry.stop ?? intent, intent)
        running[id] = entry
        entry.task.cancel()
        let result = await entry.task.value
        running[id] = nil
        var job = try await storage { try await store.fetch(id) } ?? entry.job
        job.state = .running
        if case .completed = result {
            // It finished before it could be stopped: the file is complete, keep it so.
            if intent == .remove {
                try await storage { try await store.delete([id]) }
                return job
            }
            return try await record(result, for: job)
        }
        let checkpoint: TransferCheckpoint
        switch result {
        case .stopped(let c), .failed(_, let c), .completed(let c): checkpoint = c
        }
        apply(checkpoint, to: &job, startedAt: entry.job.received)
        switch intent {
        case .shutdown:
            job.state = .queued
            job.updatedAt = now()
            try await storage { try await store.save(job) }
            return job
        case .pause:
            return try await transition(job, .pause)
        case .cancel:
            let canceled = try await transition(job, .cancel)
            removePartial(of: job)
            return canceled
        case .remove:
            try await storage { try await store.delete([id]) }
            removePartial(of: job)
            return job
        }
    }

    /// Records what a transfer reported. `startedAt` is the offset the attempt began from: the
    /// row read back may already hold the attempt's own checkpoints.
    private func apply(_ checkpoint: TransferCheckpoint, to job: inout Job, startedAt: Int64) {
        // Progress resets the retry budget: an attempt that moved bytes counts as the first.
        if checkpoint.received > startedAt {
            job.attempts = 1
            job.progressAt = now()
        }
        job.received = checkpoint.received
        job.size = checkpoint.size
        job.validators = checkpoint.validators
        if let finalURL = checkpoint.finalURL { job.finalURL = finalURL }
        if let sha256 = checkpoint.sha256 { job.sha256 = sha256 }
        if let digest = checkpoint.digest { job.digest = digest }
        if let finalPath = checkpoint.finalPath { job.path = finalPath }
    }

    @discardableResult
    private func record(_ result: TransferResult, for started: Job) async throws(DLError) -> Job {
        var job = try await storage { try await store.fetch(started.id) } ?? started
        job.state = .running
        switch result {
        case .completed(let checkpoint):
            apply(checkpoint, to: &job, startedAt: started.received)
            logger.info("completed", metadata: ["job": "\(job.id)", "bytes": "\(job.received)", "path": "\(job.path)"])
            return try await transition(job, .complete)
        case .stopped(let checkpoint):
            apply(checkpoint, to: &job, startedAt: started.received)
            job.state = .queued
            try await storage { try await store.save(job) }
            return job
        case .failed(let failure, let checkpoint):
            apply(checkpoint, to: &job, startedAt: started.received)
            if failure.kind == .transient(.diskSpace) {
                // A full disk is not the server's fault: it does not use up the retry budget.
                job.attempts = max(0, job.attempts - 1)
            }
            let sinceProgress = now().timeIntervalSince(job.progressAt ?? job.createdAt)
            let decision = RetryDecision.decide(
                failure, attempts: job.attempts, sinceProgress: sinceProgress, policy: configuration.backoff,
                now: now(), unit: Double.random(in: 0..<1))
            switch decision {
            case .wait(let reason, let until):
                logger.notice("waiting", metadata: ["job": "\(job.id)", "reason": "\(reason.rawValue)", "error": "\(failure.error.message)"])
                return try await transition(job, .wait(reason, failure.error, until: until))
            case .fail(let error):
                logger.notice("failed", metadata: ["job": "\(job.id)", "code": "\(error.code)", "error": "\(error.message)"])
                return try await transition(job, .fail(error))
            }
        }
    }

    // MARK: Waiting jobs

    /// Sleeps until the earliest `next_attempt_at`, then requeues what is due.
    private func armWakeUp() async throws(DLError) {
        let next = try await storage { try await store.nextWakeUp() }
        guard next != wakeAt else { return }
        wakeTask?.cancel()
        wakeAt = next
        guard let next else { return }
        let delay = max(0, next.timeIntervalSince(now()))
        wakeTask = Task { [weak self] in
            try? await Task.sleep(for: .milliseconds(Int(delay * 1000) + 10))
            guard !Task.isCancelled else { return }
            await self?.wake()
        }
    }

    private func wake() async {
        do {
            try await serial { () async throws(DLError) in
                wakeAt = nil
                let waiting = try await storage { try await store.list(states: [.waiting]) }
                let due = waiting.filter { ($0.nextAttemptAt ?? .distantPast) <= now() }
                var requeued: [Job] = []
                for job in due {
                    if let next = try? StateMachine.apply(.due, to: job, now: now()) { requeued.append(next) }
                }
                try await storage { try await store.save(requeued) }
                try await schedule()
            }
        } catch {
            logger.error("could not requeue waiting jobs", metadata: ["error": "\(error)"])
        }
    }
}
