import CDLSystem
import DLCore
import DLJobTable
import DLTransfer
import Foundation
import Logging

/// What clients ask: enqueue, the bulk commands (one statement each, whatever the count),
/// and reads.
extension Engine {
    public func enqueue(_ specs: [EnqueueSpec]) async throws(DLError) -> [InsertOutcome] {
        try await serial { () async throws(DLError) in
            try requireAccepting()
            var existing: [Int: Job] = [:]
            var news: [NewJob] = []
            news.reserveCapacity(specs.count)
            var seenPaths: [String: Int] = [:]
            let unfinished = try await storage { try await store.unfinishedCount() }
            guard unfinished + specs.count <= configuration.maxQueued else {
                throw DLError(.queueFull, "\(unfinished) jobs are unfinished and the limit is \(configuration.maxQueued) (max_queued)")
            }
            let policy = specs.allSatisfy(\.intoCache) ? nil : configuration.pathPolicy
            let destination = Destination(downloadDir: configuration.downloadDir, policy: policy, jobs: specs.count)
            // Jobs whose key exists already, in one read (they are returned, not created).
            let keys = specs.compactMap(\.key)
            let keyed = keys.isEmpty ? [:] : try await storage { try await store.fetch(keys: keys) }
            for (index, spec) in specs.enumerated() {
                if let key = spec.key, let job = keyed[key] {
                    existing[index] = job
                    continue
                }
                do throws(DLError) {
                    let host: String
                    if let known = spec.host {
                        host = known
                    } else {
                        host = try URLRules.checked(spec.url).get().host
                    }
                    // Names in use by unfinished jobs, for on_exists "rename" (else the store
                    // refuses them): the name the folder leaves free is asked of the store (an
                    // indexed look-up, never the whole table); a taken one makes it try the next.
                    var usedByJobs: Set<String> = []
                    func resolve() throws(DLError) -> Destination.Resolved {
                        try destination.resolve(
                            url: spec.url, path: spec.path, dir: spec.dir, name: spec.name, overwrite: spec.overwrite,
                            onExists: spec.onExists, encrypted: spec.encryptTo != nil,
                            taken: { seenPaths[$0] != nil || usedByJobs.contains($0) })
                    }
                    var resolved = try resolve()
                    while spec.onExists == .rename, try await storage({ try await store.isPathInUse(resolved.path) }) {
                        usedByJobs.insert(resolved.path)
                        resolved = try resolve()
                    }
                    let path = resolved.path
                    if let other = seenPaths[path] {
                        throw DLError(.destinationExists, "jobs \(other) and \(index) of this request both download to \(path)")
                    }
                    seenPaths[path] = index
                    var new = NewJob(
                        url: spec.url, path: path, priority: spec.priority, key: spec.key, meta: spec.meta,
                        headers: spec.headers, overwrite: spec.overwrite, state: spec.paused ? .paused : .queued,
                        checksum: spec.checksum, expectedSize: spec.size)
                    new.host = host
                    new.mirrors = spec.mirrors
                    new.pieces = spec.pieces?.encoded
                    new.options = JobOptions(
                        automaticName: resolved.automatic, renameIfTaken: spec.onExists == .rename, insecure: spec.insecure, tls: spec.tls,
                        maxSpeed: spec.maxSpeed, segments: spec.segments, metered: spec.metered, encryptTo: spec.encryptTo)
                    news.append(new)
                } catch {
                    if specs.count == 1 { throw error }
                    throw DLError(error.code, "jobs[\(index)]: \(error.message)")
                }
            }
            let inserted = try await storage { try await store.insert(news, now: now()) }
            // A call of thousands: every array here is reserved once and none copied, as an
            // outcome holds a whole job and a copy of thousands of them raised the peak memory
            // (docs/benchmarks.md, "What was tried": an `enqueue` without copies). Jobs whose
            // key existed are merged in; without them the store's outcomes are the reply.
            var outcomes: [InsertOutcome] = []
            if existing.isEmpty {
                outcomes = inserted
            } else {
                outcomes.reserveCapacity(specs.count)
                var next = inserted.makeIterator()
                for index in specs.indices {
                    if let job = existing[index] {
                        outcomes.append(InsertOutcome(job: job, created: false))
                    } else if let outcome = next.next() {
                        outcomes.append(outcome)
                    }
                }
            }
            let created = outcomes.reduce(0) { $1.created ? $0 + 1 : $0 }
            if created > 0 { logger.info("enqueued", metadata: ["jobs": "\(created)"]) }
            try await schedule()
            try await flush()
            return outcomes
        }
    }

    public func pause(_ selection: JobSelection) async throws(DLError) -> BulkOutcome {
        try await bulk(.pause, selection, stopping: .pause)
    }

    public func resume(_ selection: JobSelection) async throws(DLError) -> BulkOutcome {
        try await serial { () async throws(DLError) in
            if case .group(let reference) = selection {
                var group = try await resolve(reference)
                if group.closed == nil, group.error != nil {
                    // A publish that failed (a file appeared in the folder) is tried again.
                    group.error = nil
                    group.updatedAt = now()
                    try await storage { try await store.saveGroup(group) }
                    try await settle(group.id)
                }
            }
            return try await bulkInQueue(.resume, selection, stopping: nil)
        }
    }

    public func cancel(_ selection: JobSelection) async throws(DLError) -> BulkOutcome {
        try await serial { () async throws(DLError) in
            // A live HLS recording stops, and publishes what it fetched (`Engine+HLSLive`).
            var recording: (JobGroup, HLSRecipe)?
            if case .group(let reference) = selection {
                let group = try await resolve(reference)
                if group.closed == nil, let recipe = try await recipeRead(group).hls.flatMap(HLSRecipe.decode), recipe.live != nil {
                    liveRecordings.removeValue(forKey: group.id)?.cancel()
                    recording = (group, recipe)
                }
            }
            let outcome = try await bulkInQueue(.cancel, selection, stopping: .cancel)
            if let (group, recipe) = recording, try await publishStoppedRecording(group, recipe) {
                try await schedule()
                try await flush()
                return outcome
            }
            if case .group(let reference) = selection {
                var group = try await resolve(reference)
                if group.closed == nil {
                    activeGroups.remove(group.id)
                    group.closed = .canceled
                    group.updatedAt = now()
                    group.finishedAt = now()
                    try await storage { try await store.saveGroup(group) }
                    removeStaging(group)
                    try await schedule()
                    try await flush()
                }
            }
            return outcome
        }
    }

    private func bulk(_ command: BulkCommand, _ selection: JobSelection, stopping: StopIntent?) async throws(DLError) -> BulkOutcome {
        try await serial { () async throws(DLError) in
            try await bulkInQueue(command, selection, stopping: stopping)
        }
    }

    /// Applies a user command to the selected jobs in one statement. With explicit ids, every
    /// job must exist and accept the command, or nothing changes; with `all` or a group, the
    /// jobs that accept it change. Transfers of the jobs it stops are stopped first (their
    /// last checkpoints commit with the command). Runs inside `serial`.
    private func bulkInQueue(_ command: BulkCommand, _ selection: JobSelection, stopping: StopIntent?) async throws(DLError)
        -> BulkOutcome
    {
        try requireAccepting()
        let rows = try await rowSelection(selection, refusing: command.refusedStates, verb: command.event.verb)
        var first: [Job] = []
        if let stopping {
            first = await stopTransfers(in: rows, intent: stopping)
        }
        // Its events may be many: they are not held back behind a batch of files being linked.
        await linksSettled()
        // Jobs that other workers run get the command as a request their owners carry out.
        let outcome = try await storage { try await store.apply(command, to: rows, first: first, owner: configuration.worker, now: now()) }
        for path in outcome.files { removePartial(at: path) }
        Self.trimAfterBulk(outcome.count)
        if outcome.count > 0 {
            logger.info("\(command.event.verb)", metadata: ["jobs": "\(outcome.count)"])
        }
        if outcome.requested > 0 {
            logger.info("\(command.event.verb): sent to the workers that run them", metadata: ["jobs": "\(outcome.requested)"])
        }
        try await schedule()
        try await flush()
        return outcome
    }

    /// Stops the running transfers of the selected jobs, all at once, and returns their rows
    /// with their last checkpoints.
    func stopTransfers(in rows: RowSelection, intent: StopIntent) async -> [Job] {
        let named: Set<JobID> = if case .ids(let ids) = rows { Set(ids) } else { [] }
        let ids = running.values.filter { entry in
            switch rows {
            case .all: return true
            case .ids: return named.contains(entry.job.id)
            case .group(let group): return entry.job.groupID == group
            case .finished: return false  // finished jobs have no transfer
            }
        }.map(\.job.id)
        for id in ids {
            guard var entry = running[id] else { continue }
            entry.stop = max(entry.stop ?? intent, intent)
            running[id] = entry
            entry.task.cancel()
        }
        var stopped: [Job] = []
        for id in ids {
            if let job = await stopTransfer(id, intent: intent) { stopped.append(job) }
        }
        return stopped
    }

    /// Deletes job records. Unfinished jobs are stopped and their partial data removed; a
    /// finished file stays unless `deleteFile` (nothing the user owns goes silently).
    public func remove(_ selection: JobSelection, deleteFile: Bool) async throws(DLError) -> BulkOutcome {
        try await serial { () async throws(DLError) in
            try requireAccepting()
            let rows = try await rowSelection(selection, refusing: [], verb: "remove")
            let stopped = await stopTransfers(in: rows, intent: .remove)
            var group: JobGroup? = nil
            if case .group(let reference) = selection { group = try await resolve(reference) }
            if !stopped.isEmpty {
                // Their offsets are recorded so that the delete below knows they have files
                // (each only while it is still this attempt's).
                _ = try await save(stopped, owned: Set(stopped.map(\.id)), publish: true)
            }
            // A file just recorded completed is linked before its row can go (else it would
            // appear after the delete, for no job).
            await linksSettled()
            // Jobs that other workers run are left to them, with a request to remove them.
            let outcome = try await storage {
                try await store.delete(rows, deleteFiles: deleteFile, owner: configuration.worker, now: now())
            }
            Self.trimAfterBulk(outcome.count)
            for path in outcome.files where unlink(path) != 0 && errno != ENOENT {
                logger.warning("could not delete file", metadata: ["path": "\(path)", "errno": "\(errno)"])
            }
            // A group whose members still run on other workers goes with a later remove (its
            // members' rows refer to it until their owners have removed them).
            if let group, outcome.requested == 0 {
                activeGroups.remove(group.id)
                try await storage { try await store.deleteGroup(group.id, now: now()) }
                if group.closed != .completed { removeStaging(group) }
            }
            try await schedule()
            try await flush()
            if outcome.count > 0 { compactSoon() }
            return outcome
        }
    }

    /// The rows a selection names, checked: explicit ids must all exist and none may be in a
    /// state in `refusing`; a group must exist.
    func rowSelection(_ selection: JobSelection, refusing: Set<JobState>, verb: String) async throws(DLError) -> RowSelection {
        switch selection {
        case .all:
            return .all
        case .group(let reference):
            return .group(try await resolve(reference).id)
        case .ids(let ids):
            let (missing, refusedBy) = try await storage { try await store.check(ids, refused: refusing) }
            if let missing { throw DLError(.jobNotFound, "no job with id \(missing)") }
            if let (id, state) = refusedBy {
                throw DLError(.invalidState, "job \(id): cannot \(verb) a job that is \(state.rawValue)")
            }
            return .ids(ids)
        }
    }

    // MARK: Reads
    //
    // A read waits for files between their commit and their link (`linksSettled`, a batch's
    // links and folder sync at most): a job this daemon shows `completed` has its file.

    public func status(_ ids: [JobID]) async throws(DLError) -> [JobView] {
        await linksSettled()
        let jobs = try await storage { try await store.fetch(ids) }
        let found = Set(jobs.map(\.id))
        if let missing = ids.first(where: { !found.contains($0) }) {
            throw DLError(.jobNotFound, "no job with id \(missing)")
        }
        return jobs.map(view)
    }

    /// A page of jobs after `afterID`, in id order.
    public func list(states: [JobState]?, afterID: JobID, limit: Int) async throws(DLError) -> JobViews {
        await linksSettled()
        return views(try await storage { try await store.list(states: states, afterID: afterID, limit: limit) })
    }

    /// A job, read once its file is linked (a `completed` row means the file is under its
    /// name): for the URL cache.
    public func settledJob(_ id: JobID) async throws(DLError) -> Job? {
        await linksSettled()
        return try await storage { try await store.fetch(id) }
    }

    /// The job of a `key`, read once its file is linked.
    public func settledJob(key: String) async throws(DLError) -> Job? {
        await linksSettled()
        return try await storage { try await store.fetch(keys: [key]) }[key]
    }

    public struct Stats: Sendable {
        public var counts: [JobState: Int]
        public var active: Int
        public var speed: Double
        public var maxActive: Int
        public var accepting: Bool
        public var uptime: TimeInterval
        public var queuePausedReason: String?
        /// This daemon's worker id, and the workers of its table seen within two leases.
        public var worker: String
        public var workers: [(id: String, seenAt: Date)]
        /// Bytes the job table takes.
        public var databaseBytes: Int64
        /// A shared table: this worker's leases and its fence; nil on SQLite.
        public var lease: LeaseView?
        /// A shared table that did not answer within `statsTableWait`: why. `counts`,
        /// `workers` and `databaseBytes` are then the last ones read (zero if none were).
        public var tableUnreachable: String?
    }

    public func stats() async throws(DLError) -> Stats {
        var table: TableStats
        var unreachable: String? = nil
        if store.sharesQueue {
            // A table that went away must not hold `stats` up: it is how a fenced worker is seen.
            switch await Self.within(Self.statsTableWait, { () async throws -> TableStats in try await self.readTableStats() }) {
            case .success(let read)?:
                table = read
                leases.lastTableStats = read
            case .failure(let error)?:
                unreachable = (error as? DLError)?.message ?? Self.storageText(error)
                table = leases.lastTableStats ?? TableStats()
            case nil:
                unreachable = "the job table did not answer within \(Self.statsTableWait.components.seconds) s"
                table = leases.lastTableStats ?? TableStats()
            }
        } else {
            table = try await readTableStats()
        }
        let speed = running.values.reduce(0) { $0 + $1.progress.snapshot.speed }
        return Stats(
            counts: table.counts, active: running.count, speed: speed, maxActive: configuration.maxActive,
            accepting: accepting, uptime: now().timeIntervalSince(startedAt),
            queuePausedReason: configuration.queuePausedReason, worker: configuration.worker, workers: table.workers,
            databaseBytes: table.databaseBytes, lease: leaseView, tableUnreachable: unreachable)
    }

    /// What `stats` reads from the table.
    struct TableStats: Sendable {
        var counts: [JobState: Int] = [:]
        var workers: [(id: String, seenAt: Date)] = []
        var databaseBytes: Int64 = 0
    }

    private func readTableStats() async throws(DLError) -> TableStats {
        TableStats(
            counts: try await storage { try await store.counts() }, workers: try await liveWorkers(),
            databaseBytes: try await storage { try await store.databaseBytes() })
    }

    /// How long `stats` waits for a shared table.
    static let statsTableWait: Duration = .seconds(2)

    /// `stats()` answered from a turn of the serial queue: proof for the watchdog that the
    /// queue turns, not only that the actor answers (a turn stuck in an await leaves it free).
    public func statsFromTheQueue() async throws(DLError) -> Stats {
        try await serial(quiet: true) { () async throws(DLError) in try await stats() }
    }

    func view(_ job: Job) -> JobView {
        JobView(job, live: liveProgress(of: job.id))
    }

    /// The rows as read, with the counters of those that run here.
    func views(_ jobs: [Job]) -> JobViews {
        var live: [JobID: LiveProgress] = [:]
        if !running.isEmpty {
            for job in jobs { if let progress = liveProgress(of: job.id) { live[job.id] = progress } }
        }
        return JobViews(jobs, live: live)
    }

    /// The counters of the job's running transfer, if it runs here.
    func liveProgress(of id: JobID) -> LiveProgress? {
        guard let live = running[id]?.progress.snapshot else { return nil }
        return LiveProgress(received: live.received, size: live.size, speed: live.speed, startedOver: live.startedOver)
    }

    /// A command that changed tens of thousands of rows read their ids and events through
    /// buffers that glibc keeps after they are freed: given back, so that the next such
    /// command does not grow the daemon further (on PostgreSQL, each of resume, pause and
    /// cancel of 100 000 jobs left it larger than the one before).
    static func trimAfterBulk(_ count: Int) {
        if count >= 10_000 { _ = dld_trim_malloc() }
    }
}
