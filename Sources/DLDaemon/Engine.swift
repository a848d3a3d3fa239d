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

    public init(downloadDir: String, maxActive: Int = 3, backoff: BackoffPolicy = BackoffPolicy(),
                diskSpace: DiskSpacePolicy = DiskSpacePolicy(), checkpoints: CheckpointPolicy = CheckpointPolicy(),
                queuePausedReason: String? = nil) {
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
            if access(job.path, F_OK) != 0, job.error?.code != "file_missing" {
                fixed.error = JobError(code: "file_missing", message: "\(job.path) was deleted or moved after it completed")
                logger.notice("completed file is missing", metadata: ["job": "\(job.id)", "path": "\(job.path)"])
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
            for (index, spec) in specs.enumerated() {
                if let key = spec.key, let job = try await storage({ try await store.fetch(key: key) }) {
                    existing[index] = job
                    continue
                }
                do throws(DLError) {
                    _ = try URLRules.validate(spec.url).get()
                    let path = try Destination.resolve(
                        url: spec.url, path: spec.path, dir: spec.dir, name: spec.name,
                        downloadDir: configuration.downloadDir, overwrite: spec.overwrite)
                    if let other = seenPaths[path] {
                        throw DLError(.destinationExists, "jobs \(other) and \(index) of this request both download to \(path)")
                    }
                    seenPaths[path] = index
                    news.append(NewJob(
                        url: spec.url, path: path, priority: spec.priority, key: spec.key, meta: spec.meta,
                        headers: spec.headers, overwrite: spec.overwrite, state: spec.paused ? .paused : .queued,
                        checksum: spec.checksum, expectedSize: spec.size))
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
        try await command(.resume, selection, noOp: [.queued, .running]) { (job) async throws(DLError) -> Job? in
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
        try await command(.cancel, selection, noOp: [.canceled]) { (job) async throws(DLError) -> Job? in
            if running[job.id] != nil {
                return try await stopTransfer(job.id, intent: .cancel)
            }
            let canceled = try await transition(job, .cancel)
            removePartial(of: job)
            return canceled
        }
    }

    /// Deletes job records. Unfinished jobs are stopped and their partial data removed; a
    /// finished file stays unless `deleteFile` (nothing the user owns goes silently).
    public func remove(_ selection: JobSelection, deleteFile: Bool) async throws(DLError) -> [Job] {
        try await serial { () async throws(DLError) in
            try requireAccepting()
            let jobs = try await select(selection)
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

    /// Starts queued jobs while slots are free. Runs inside `serial`.
    private func schedule() async throws(DLError) {
        guard accepting, configuration.queuePausedReason == nil else { return }
        let free = configuration.maxActive - running.count
        if free > 0 {
            let queued = try await storage { try await store.queued(limit: free) }
            for id in SchedulerPolicy.jobsToStart(queued: queued, active: running.count, maxActive: configuration.maxActive) {
                guard let job = try await storage({ try await store.fetch(id) }), job.state == .queued else { continue }
                try await launch(job)
            }
        }
        try await armWakeUp()
    }

    private func launch(_ job: Job) async throws(DLError) {
        let started = try await transition(job, .start)
        let progress = TransferProgress(received: started.received, size: started.size)
        var request = TransferRequest(
            jobID: started.id, url: started.url, headers: started.headers, path: started.path,
            overwrite: started.overwrite, offset: started.received, size: started.size, validators: started.validators,
            checksum: started.checksum)
        request.expectedSize = started.expectedSize
        request.diskSpace = configuration.diskSpace
        request.checkpoints = configuration.checkpoints
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
                try await record(result, for: entry.job)
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
        apply(checkpoint, to: &job)
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

    private func apply(_ checkpoint: TransferCheckpoint, to job: inout Job) {
        // Progress resets the retry budget: an attempt that moved bytes counts as the first.
        if checkpoint.received > job.received {
            job.attempts = 1
            job.progressAt = now()
        }
        job.received = checkpoint.received
        job.size = checkpoint.size
        job.validators = checkpoint.validators
        if let finalURL = checkpoint.finalURL { job.finalURL = finalURL }
        if let sha256 = checkpoint.sha256 { job.sha256 = sha256 }
        if let digest = checkpoint.digest { job.digest = digest }
    }

    @discardableResult
    private func record(_ result: TransferResult, for started: Job) async throws(DLError) -> Job {
        var job = try await storage { try await store.fetch(started.id) } ?? started
        job.state = .running
        switch result {
        case .completed(let checkpoint):
            apply(checkpoint, to: &job)
            logger.info("completed", metadata: ["job": "\(job.id)", "bytes": "\(job.received)", "path": "\(job.path)"])
            return try await transition(job, .complete)
        case .stopped(let checkpoint):
            apply(checkpoint, to: &job)
            job.state = .queued
            try await storage { try await store.save(job) }
            return job
        case .failed(let failure, let checkpoint):
            apply(checkpoint, to: &job)
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
