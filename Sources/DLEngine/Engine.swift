import DLCore
import DLJobTable
import DLTransfer
import Foundation
import Logging

/// Engine settings.
public struct EngineConfiguration: Sendable {
    /// The defaults of the engine's settings that the config table has keys for: the one
    /// source of each, which `DaemonConfig` starts from too.
    public enum Default {
        public static let maxActive = 3
        public static let groupParallel = 4
        public static let maxPerHost = 6
        public static let segments = 4
        public static let segmentMinSize: Int64 = 4 << 20
        public static let maxQueued = 1_000_000
        public static let lease: TimeInterval = 30
    }

    public var downloadDir: String
    /// Transfers that move bulk data at once; 1 means strictly one transfer at a time
    /// (`Lanes`).
    public var maxActive: Int
    /// Transfers bound by round trips (small files, the first bytes of any file) at once
    /// beside the bulk ones (`Lanes`).
    public var maxLight = Lanes.defaultMaxLight
    public var backoff: BackoffPolicy
    public var diskSpace: DiskSpacePolicy
    public var checkpoints: CheckpointPolicy
    /// Start with the queue stopped (the boot-loop guard): commands work, nothing starts.
    public var queuePausedReason: String?
    /// Members of one group downloading at once, inside the group's single slot.
    public var groupParallel = Default.groupParallel
    /// Where downloads may be written (resolved folders); nil allows anywhere.
    public var pathPolicy: PathPolicy?
    /// Unfinished jobs at most; an enqueue beyond it is refused with `queue_full`.
    public var maxQueued = Default.maxQueued
    /// Credentials by host (`~/.netrc`), read when a transfer starts; never stored.
    public var netrcPath: String?
    /// Transfers to one host (host and port) at once, across jobs and group members: over
    /// HTTP/1.1, connections; a host that answered over HTTP/2 takes `maxStreamsPerHost`
    /// streams of one connection instead.
    public var maxPerHost = Default.maxPerHost
    public var maxStreamsPerHost = HostLimits.defaultMaxStreams
    /// The lanes of `maxActive` and `maxLight`.
    public var lanes: Lanes { Lanes(maxActive: maxActive, maxLight: maxLight) }
    /// The lanes inside a group's slot: `groupParallel` big members at once, and small ones
    /// beside them as standalone jobs have (none while `maxActive` is 1: strictly one slot,
    /// `groupParallel` members in it, as before the lanes).
    public var groupLanes: Lanes { Lanes(maxActive: groupParallel, maxLight: lanes.strict ? 0 : maxLight) }
    public var hostLimits: HostLimits { HostLimits(maxPerHost: maxPerHost, maxStreams: maxStreamsPerHost) }
    /// This daemon's worker id: the jobs it claims carry it.
    public var worker = "local/dld"
    /// Seconds a claim holds without renewal (a shared table's workers renew every third).
    public var lease: TimeInterval = Default.lease
    /// How long finished records are kept.
    public var retention = RetentionPolicy()
    /// `max_speed` and `speed_schedule` of the config file (a `set_speed` on top is the engine's).
    public var speed = GlobalSpeedPolicy()
    /// Ranges a job fetches at once (segmented downloads), unless the job says; 1 turns them off.
    public var segments = Default.segments
    /// Files with less than this left to fetch are one stream.
    public var segmentMinSize: Int64 = Default.segmentMinSize
    /// Whether jobs that do not say may download on a metered connection (config `metered`).
    public var meteredByDefault = true
    /// The country (ISO 3166 code, lowercase) whose Metalink mirrors go first among those of
    /// the same priority (config `metalink_location`); nil: none.
    public var metalinkLocation: String?
    /// This boot's id (`/proc/sys/kernel/random/boot_id`), recorded with unsynced progress;
    /// nil when it cannot be read: then unsynced progress is neither recorded nor trusted.
    public var bootID: String?

    public init(
        downloadDir: String, maxActive: Int = Default.maxActive, backoff: BackoffPolicy = BackoffPolicy(),
        diskSpace: DiskSpacePolicy = DiskSpacePolicy(), checkpoints: CheckpointPolicy = CheckpointPolicy(),
        queuePausedReason: String? = nil, groupParallel: Int = Default.groupParallel, pathPolicy: PathPolicy? = nil,
        maxQueued: Int = Default.maxQueued, netrcPath: String? = nil
    ) {
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
///
/// Writes are grouped: a turn of the queue collects every change that is ready (transfers
/// that ended while it waited, the jobs that start in the slots they free) in `pending`, and
/// `flush` commits them in one transaction. Bulk commands are one statement each. The engine
/// holds what runs, never what waits: the next jobs come from indexed queries.
///
/// The roles live in their own files, each with its state: `Scheduling` (Scheduling.swift: slots, ready
/// lists, early claims, the turn's rows; a value with no I/O), Engine+Commands (what clients
/// ask), Engine+Scheduling (transfers and their outcomes), Engine+Publishing
/// (`PublisherState`: finished files in batches), Engine+Fleet (`LeaseBook`: leases, the fence),
/// Engine+Groups, Engine+Recovery (start-up and shutdown), Engine+Loops (the timed work, run
/// by the daemon's service group).
public actor Engine {
    let store: any JobTable
    let downloader: Downloader
    let logger: Logger
    var configuration: EngineConfiguration {
        didSet { scheduling.limits = Self.limits(configuration, downloader) }
    }
    let now: @Sendable () -> Date

    /// A running transfer as the engine holds it: what it reports, and its task.
    struct Transfer: TransferLoad, Sendable {
        let progress: TransferProgress
        let task: Task<TransferResult, Never>
        var connections: Int { progress.connections }
        var hostConnections: [String: Int]? { progress.hostConnections }
        var received: Int64 { progress.snapshot.received }
    }
    typealias Slot = Scheduling<Transfer, FinishedNotice>.Slot
    typealias Pending = Scheduling<Transfer, FinishedNotice>.Pending

    /// The limits of `configuration`; a host's HTTP version is the client's knowledge.
    static func limits(_ configuration: EngineConfiguration, _ downloader: Downloader) -> SchedulingLimits {
        SchedulingLimits(
            lanes: configuration.lanes, groupLanes: configuration.groupLanes, hosts: configuration.hostLimits,
            multiplexed: { downloader.multiplexed(host: $0) })
    }

    /// What holds slots, the ready lists, the claims not committed yet and this turn's rows
    /// (`Scheduling`, a value with no I/O: the engine carries out what it decides).
    var scheduling: Scheduling<Transfer, FinishedNotice>
    /// Transfers in flight; each holds a slot (or a place in its group's slot).
    var running: [JobID: Slot] {
        get { scheduling.running }
        _modify { yield &scheduling.running }
    }
    /// Groups holding a slot of the queue.
    var activeGroups: Set<GroupID> {
        get { scheduling.activeGroups }
        _modify { yield &scheduling.activeGroups }
    }
    /// Changes of this turn of the queue, committed together by `flush`.
    var pending: Pending {
        get { scheduling.pending }
        _modify { yield &scheduling.pending }
    }
    /// A turn to fill slots freed outside of a turn is on its way (`scheduleTurn`).
    var refillScheduled = false
    /// A look at the table's changes is on its way (`changesSoon`).
    var changesScheduled = false
    /// Live HLS recordings by group: each reloads its playlist until the recipe closes
    /// (`Engine+HLSLive`).
    var liveRecordings: [GroupID: Task<Void, Never>] = [:]
    /// Transfers that ended and wait for the queue's next turn, which records them together.
    var ended: [(id: JobID, attempt: UInt64, result: TransferResult)] = []
    var drainScheduled = false
    /// Finished files on their way to their names (`Engine+Publishing`).
    var publisher = PublisherState()
    /// Commits claims that `Scheduling.deferClaims` left waiting, after `claimDelay`.
    var claimFlushTask: Task<Void, Never>?
    /// Called after a job or group finishes (completed or failed), outside the serial queue.
    var onFinished: (@Sendable (FinishedNotice) -> Void)?
    /// Called with how long each turn's transaction took (`flush`), for the daemon's metrics.
    var onCommit: (@Sendable (Duration) -> Void)?
    /// Bytes received by this engine's transfers since it started (the daemon's metrics read it).
    public nonisolated let receivedBytes = ByteCounter()
    var recordingUnsynced = false
    var accepting = true
    private var busy = false
    private var waiters: [CheckedContinuation<Void, Never>] = []
    /// When the earliest waiting job is due (`armWakeUp`); the wake-up loop sleeps until then.
    var wakeAt: Date?
    /// Set when a commit may have made a job `waiting` or requeued waiting jobs: the next flush
    /// looks up the earliest wake-up again.
    var wakeMayHaveChanged = true
    let startedAt: Date

    /// Whether this machine has a route to a network, as last seen (`Engine+Network`).
    var online = true
    /// Reads the route tables; a test may pass its own.
    let hasNetwork: @Sendable () -> Bool
    /// Whether the connection is metered, as NetworkManager last said (`Engine+Network`).
    var connectionMetered = false
    /// A compaction runs (one at a time).
    var compacting = false
    /// This worker's leases on a shared table (`Engine+Fleet`).
    var leases = LeaseBook()
    /// The global rate set by `set_speed`, over the config file's; nil: the config's.
    var speedOverride: Int64?
    /// `~/.netrc` as last read, by what `stat` said of it then (`currentNetrc`).
    var netrcCache: (key: [Int], entries: [NetrcEntry])?
    /// When the speed schedule next changes the limit (`applySpeedLimits`); the speed loop
    /// sleeps until then.
    var speedChangeAt: Date?
    /// What wakes the engine's loops (`Engine+Loops`).
    let bells = Bells()
    /// Set once `start` is done: the loops wait for it.
    var started = false

    public init(
        store: any JobTable, downloader: Downloader, configuration: EngineConfiguration, logger: Logger,
        now: @escaping @Sendable () -> Date = { Date() },
        hasNetwork: @escaping @Sendable () -> Bool = { Routes.hasNetwork() }
    ) {
        self.store = store
        self.downloader = downloader
        self.configuration = configuration
        self.scheduling = Scheduling(limits: Self.limits(configuration, downloader))
        self.logger = logger
        self.now = now
        self.hasNetwork = hasNetwork
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

    /// `handler` is told how long each turn's transaction took, in the serial queue: it must
    /// not block (the daemon records it in a histogram).
    public func setOnCommit(_ handler: @escaping @Sendable (Duration) -> Void) {
        onCommit = handler
    }

    // MARK: The serial queue

    /// Runs `body` alone in the queue. A `turn` (the end of transfers, the publisher's steps)
    /// keeps the ready jobs; any other section, which may change the queue, first drops them and
    /// commits the claims of those already started. Each section but a `quiet` one (the
    /// heartbeat's read) rings `bells.activity`: systemd's status line follows the queue.
    func serial<T: Sendable>(turn: Bool = false, quiet: Bool = false, _ body: () async throws(DLError) -> T) async throws(DLError) -> T {
        if busy {
            await withCheckedContinuation { waiters.append($0) }
        } else {
            busy = true
        }
        defer {
            if waiters.isEmpty { busy = false } else { waiters.removeFirst().resume() }
            if !quiet { bells.activity.ring() }
        }
        // A turn that failed before its flush left changes that were never committed: they
        // are dropped, not committed by the next turn. Its claims are committed: they start.
        // A section that is not a turn may change the queue: the claims of jobs started from
        // the ready lists are committed first.
        let start = scheduling.beginSection(turn: turn)
        if start.droppedRows > 0 {
            logger.warning("dropped changes of a turn that failed", metadata: ["rows": "\(start.droppedRows)"])
        }
        if accepting { await launch(start.launches) }
        await commitStarted(start.claims)
        return try await body()
    }

    /// A store's error in words for a person: SQLite's message with a hint, or the PostgreSQL
    /// store's own wording.
    static func storageText(_ error: any Error) -> String {
        StorageText.of(error)
    }

    @discardableResult
    func storage<T>(_ body: () async throws -> T) async throws(DLError) -> T {
        do {
            return try await body()
        } catch let error as DLError {
            throw error
        } catch let StoreError.pathInUse(path, other) {
            throw DLError(.destinationExists, "job \(other) already downloads to \(path)")
        } catch let StoreError.refused(id, state, verb) {
            throw DLError(
                .invalidState, "job \(id): cannot \(verb) a job that is \(state.rawValue) (it became so meanwhile; nothing changed)")
        } catch {
            logger.error("job table error", metadata: ["error": "\(error)"])
            throw DLError(.storageError, "the job table could not be written: \(Self.storageText(error))")
        }
    }

    /// Commits this turn's changes in one transaction, with the claim of the slots `schedule`
    /// found free, then starts the transfers of the jobs it recorded as running and tells
    /// hooks what finished. Runs inside `serial`.
    func flush() async throws(DLError) {
        var claim = pending.claimFree.map { turnClaim(free: $0) }
        // A turn that writes anything commits the claims of jobs started early and reads the
        // next ready ones. One that writes nothing is not taken for that alone: the list is
        // still valid then, and a slot that finds it empty claims in a turn anyway.
        let readsReady = scheduling.turnReadsReady(claims: claim != nil, shared: store.sharesQueue)
        if readsReady {
            var handOff = claim ?? turnClaim(free: 0)
            handOff.started = scheduling.takeStartedEarly().map(\.id)
            // A few ends may come between two turns (`SchedulingLimits.readyRows`).
            handOff.ready = scheduling.limits.readyRows
            handOff.readyAfter = scheduling.readyTopUp().map {
                ReadyCursor(priority: $0.priority, id: $0.id, version: $0.version, rows: $0.rows)
            }
            handOff.readyMembers = scheduling.limits.readyMemberRows
            claim = handOff
        }
        scheduling.claiming(free: claim?.free ?? 0)
        var batch = pending
        pending = Pending()
        if batch.saves.contains(where: { $0.state == .waiting }) { wakeMayHaveChanged = true }
        let outcome: TurnOutcome
        let committing = ContinuousClock.now
        do throws(DLError) {
            outcome = try await storage {
                try await store.turn(saves: batch.saves, owned: batch.owned, owner: configuration.worker, claim: claim)
            }
            // A turn with nothing to write or claim is no commit.
            if let onCommit, claim != nil || !batch.saves.isEmpty { onCommit(ContinuousClock.now - committing) }
        } catch {
            // The claims are committed whatever became of the other rows.
            await launch(batch.launches)
            await stopLost(claim?.started ?? [])
            throw error
        }
        await stopLost(outcome.startedLost.sorted())
        if readsReady {
            // Jobs started from the old list while the turn ran are still queued in its read.
            scheduling.turnRead(
                ready: outcome.ready, members: outcome.readyMembers, continued: outcome.readyContinued, version: outcome.readyVersion,
                claimed: Set(outcome.claimed.map(\.id)))
        }
        if !outcome.lost.isEmpty {
            logger.notice("jobs taken over while their transfers ended here: not recorded", metadata: ["jobs": "\(outcome.lost.sorted())"])
        }
        if let claim {
            // What starts after the commit may add rows (a group settled, jobs held for a
            // metered connection): committed here, before the transfers start.
            pending.launches = batch.launches
            do throws(DLError) {
                try await startTurn(outcome, claim: claim)
            } catch {
                await launch(pending.launches)
                pending = Pending()
                throw error
            }
            batch.launches = pending.launches
            batch.notices += pending.notices
            pending.launches = []
            pending.notices = []
            if !pending.saves.isEmpty {
                let rows = pending
                pending = Pending()
                if rows.saves.contains(where: { $0.state == .waiting }) { wakeMayHaveChanged = true }
                do throws(DLError) {
                    _ = try await save(rows.saves, owned: rows.owned, publish: true)
                } catch {
                    await launch(batch.launches)
                    throw error
                }
            }
        }
        // Rows that became `waiting` are committed now: the wake-up can see them.
        try await armWakeUp()
        await launch(batch.launches)
        for notice in batch.notices where notice.jobID.map({ !outcome.lost.contains($0) }) ?? true { onFinished?(notice) }
    }

    /// Commits the claims of jobs started from the ready lists (`started`, taken from
    /// `scheduling`) in a transaction of their own; the transfers of jobs that are no longer
    /// queued stop.
    func commitStarted(_ started: [Job]) async {
        guard !started.isEmpty else { return }
        var claim = turnClaim(free: 0)
        claim.started = started.map(\.id)
        do {
            let outcome = try await store.turn(saves: [], owned: [], owner: configuration.worker, claim: claim)
            await stopLost(outcome.startedLost.sorted())
        } catch {
            logger.error("could not record the start of transfers: they stop", metadata: ["error": "\(Self.storageText(error))"])
            await stopLost(claim.started)
        }
    }

    /// Writes rows in one transaction; the `owned` ones (outcomes of this worker's transfers)
    /// only while their jobs are still this worker's, as `saveOwned` does. Returns the events
    /// and the owned rows that were not written: another daemon paused, canceled or took them.
    func save(_ rows: [Job], owned: Set<JobID>, publish: Bool) async throws(DLError) -> (events: [StoredEvent], lost: Set<JobID>) {
        guard !owned.isEmpty else {
            return (try await storage { try await store.save(rows, publish: publish) }, [])
        }
        let mine = rows.filter { owned.contains($0.id) }
        let others = rows.filter { !owned.contains($0.id) }
        let (events, lost) = try await storage { try await store.saveOwned(mine, owner: configuration.worker, publish: publish) }
        if !lost.isEmpty {
            logger.notice("jobs taken over while their transfers ended here: not recorded", metadata: ["jobs": "\(lost.sorted())"])
        }
        let more = others.isEmpty ? [] : try await storage { try await store.save(others, publish: publish) }
        return (events + more, lost)
    }

    func requireAccepting() throws(DLError) {
        guard accepting else { throw DLError(.shuttingDown, "dld is shutting down") }
    }

    /// Applies `event` through the state machine and queues the row for the next commit.
    @discardableResult
    func transition(_ job: Job, _ event: JobEvent) throws(DLError) -> Job {
        let next: Job
        do {
            next = try StateMachine.apply(event, to: job, now: now())
        } catch {
            throw DLError(.invalidState, "job \(job.id): \(error.description)")
        }
        pending.saves.append(next)
        return next
    }

    func removePartial(at path: String) {
        if unlink(path) != 0 && errno != ENOENT {
            logger.warning("could not remove partial file", metadata: ["path": "\(path)"])
        }
    }
}

extension Scheduling.Slot where Transfer == Engine.Transfer {
    var progress: TransferProgress { transfer.progress }
    var task: Task<TransferResult, Never> { transfer.task }
}
