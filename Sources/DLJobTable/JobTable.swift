import DLCore
import Foundation
import Synchronization

/// The job table as the daemon sees it: every read and write the engine makes, and nothing of
/// how rows are kept. Two backends implement it with the same semantics (the store tests run
/// on both): `SQLiteJobStore` (SQLite through GRDB, the embedded default) and `PostgresJobStore`
/// (PostgreSQL through postgres-nio, for a fleet of daemons that share one queue).
///
/// What every backend keeps:
/// - every write is one transaction, and a method returns only after its commit;
/// - every state change writes its event (`events`) in the same transaction, numbered by
///   `seq` in commit order; committed events go to the event sink after the commit, and the
///   newest `EventLog.kept` stay in the table for replays;
/// - a command over many rows (`apply`, `delete`, `requeueDue`) is set-based: one statement,
///   whatever the count, with the columns the state machine sets (`BulkCommand`);
/// - `insert` returns the existing job for a key that exists, and refuses a path that an
///   unfinished job writes to (`StoreError.pathInUse`), and then creates nothing;
/// - a row that leaves `running` loses its `worker`, `leaseUntil` and `stopRequest` (`save`,
///   `saveOwned`, bulk commands); a whole row written while `running` keeps the lease and the
///   stop request the table holds (only claims and renewals write leases);
/// - every claim (and every hand-over of a running job by another than its worker: an
///   expired lease, a release) increments the row's `epoch`, the fencing token: a write by an owner
///   (`checkpoint`, `recordUnsynced`, `saveOwned`, the `first` rows of `apply`) is a
///   compare-and-set on (id, worker, epoch), so a stale attempt never writes;
/// - a pause, cancel or remove of a job `running` under another worker becomes its
///   `stopRequest`, carried out by that worker (the owner) or, when its lease runs out, by
///   `expireLeases`.
///
/// How events reach the sink differs:
/// - SQLite (`SQLiteJobStore`): one daemon writes the table; each write hands its own events to the
///   sink right after its commit (publish: false ones when the caller says, after a
///   `holdEvents()` that keeps later writes' events back until then), in commit order.
/// - PostgreSQL (`PostgresJobStore`): the sink gets EVERY committed event of the table, this
///   daemon's and other daemons', in `seq` order, each once: one serial reader follows
///   `events(after:)` from the last number it delivered, woken by this store's commits and by
///   `NOTIFY dld_events`, which every transaction that writes events sends. A write returns
///   after the reader has delivered its events (unless an earlier `publish: false` write holds
///   them back: nothing after a held event is delivered before it is published).
public protocol JobTable: Sendable {
    // MARK: Events

    /// Receives the events of every committed write, in commit order, after the commit.
    /// `wanted` tells whether anyone listens: events of a bulk change are read back from the
    /// table (a page at a time) only then.
    func setEventSink(wanted: @escaping @Sendable () -> Bool, _ deliver: @escaping @Sendable ([StoredEvent]) -> Void)
    /// Called before a `publish: false` write: events of later writes wait until its own are
    /// handed over by `publishEvents`, which ends the hold (exactly one call for each hold,
    /// with no events when the write failed).
    func holdEvents()
    /// Hands events to the sink: for writers that were told not to publish (`publish: false`)
    /// because they had to finish something first.
    func publishEvents(_ events: [StoredEvent])
    /// Events after `seq`, oldest first, at most `limit`.
    func events(after seq: Int64, limit: Int) async throws -> [StoredEvent]
    /// The newest event's number (0 when there is none).
    func lastEventSeq() async throws -> Int64

    // MARK: Jobs: writes

    /// Creates jobs in one transaction, with one `job.state` event each; see the protocol's
    /// notes for keys and paths.
    func insert(_ jobs: [NewJob], now: Date) async throws -> [InsertOutcome]
    /// Writes whole rows in one transaction, with an event for each row whose state changed.
    /// With `publish: false` the events are returned instead of published.
    @discardableResult
    func save(_ jobs: [Job], publish: Bool) async throws -> [StoredEvent]
    /// Records a running transfer's synced progress (counters, validators, and a segmented
    /// download's ranges) while the row is still `running` (and, when `owner` is given, still
    /// that attempt's: its worker and epoch, so that a stale attempt never writes over the new
    /// owner's offset). Returns whether the row was written, and the command that waits for
    /// the owner (`stopRequest`): a worker that missed the signal still hears it within one
    /// checkpoint. Callers sync the bytes first (durability rule 2).
    @discardableResult
    func checkpoint(
        _ id: JobID, received: Int64, size: Int64?, validators: Validators, finalURL: String?, segments: String?, now: Date,
        owner: JobOwner?
    ) async throws -> CheckpointAnswer
    /// Records what running transfers have written to their partial files but not yet synced
    /// (`UnsyncedProgress`, with the boot id), for every job given, in one transaction: the
    /// engine calls it about four times a second for all its transfers together. Only rows
    /// still `running` (and, with `owner`, still `owner`'s) are written. The commit need not
    /// reach the disk (SQLite: `synchronous = NORMAL` for it; PostgreSQL: `synchronous_commit
    /// = off`): the record is only trusted in the boot that wrote it, which a power loss ends.
    /// With `owner`, each record applies only with its attempt's `epoch`.
    /// Returns how many rows were written.
    @discardableResult
    func recordUnsynced(_ records: [UnsyncedRecord], owner: String?) async throws -> Int
    /// Applies `command` to every selected job in a state it changes, with one event each;
    /// `first` rows (the stopped transfers of `owner`) are written in the same transaction,
    /// before the command, each only while it is still that attempt's (worker and epoch).
    /// With `owner`, a pause or cancel of a job `running` under another worker is recorded as
    /// its `stopRequest` instead (counted in `requested`), and a resume withdraws a pending
    /// pause; nil: a daemon that does not claim, every row changes here. With `.ids`, a job in
    /// one of `command.refusedStates` (moved there by another worker after the engine's check)
    /// throws `StoreError.refused` and the transaction changes nothing.
    func apply(_ command: BulkCommand, to selection: RowSelection, first: [Job], owner: String?, now: Date) async throws -> BulkOutcome
    /// Deletes the selected rows with one `job.removed` event each; returns the files to
    /// delete after the commit (partial files, and with `deleteFiles` the completed files,
    /// and their partial paths too: a worker that committed one but has not linked it yet
    /// then finds nothing to link). With `owner`, a job `running` under another worker is
    /// not deleted: its `stopRequest` becomes `remove` (counted in `requested`).
    func delete(_ selection: RowSelection, deleteFiles: Bool, owner: String?, now: Date) async throws -> BulkOutcome
    /// A user's change of one job (`JobRevision`: its URL, headers, options), written without
    /// touching what its worker owns (state, offsets, lease). With `expecting`, only while the
    /// row is still in that state with that epoch, and the epoch is then incremented (an
    /// attempt that runs restarts under the new one). Returns the row as written; nil when
    /// the job is gone or no longer as expected.
    func revise(_ id: JobID, _ revision: JobRevision, expecting: (state: JobState, epoch: Int64)?, now: Date) async throws -> Job?
    /// Queues again the waiting jobs whose `next_attempt_at` has come; returns how many.
    func requeueDue(now: Date) async throws -> Int
    /// Every job waiting for `reason` is queued again at once, whatever its time (the network
    /// came back), in one statement.
    func requeueWaiting(for reason: WaitReason, now: Date) async throws -> Int

    // MARK: Jobs: reads

    /// The jobs with these ids that exist, in the order asked.
    func fetch(_ ids: [JobID]) async throws -> [Job]
    /// The jobs with these client keys that exist, by key.
    func fetch(keys: [String]) async throws -> [String: Job]
    /// A page of jobs by ascending id, optionally only in some states.
    func list(states: [JobState]?, afterID: JobID, limit: Int) async throws -> [Job]
    func counts() async throws -> [JobState: Int]
    /// Bytes the job table takes (SQLite: the file's pages; PostgreSQL: the database).
    func databaseBytes() async throws -> Int64
    /// Gives free pages back to the file system once the policy says so, a step at a time;
    /// returns the bytes given back (PostgreSQL: 0, its autovacuum does this).
    func compact(_ policy: CompactionPolicy) async throws -> Int64
    /// Jobs that are not finished (they count against `max_queued`).
    func unfinishedCount() async throws -> Int
    /// Which of these paths an unfinished job downloads to (indexed look-ups, in one read).
    func unfinishedPaths(among paths: [String]) async throws -> Set<String>
    /// For an explicit list: the first id that does not exist, and the first job (by id)
    /// whose state is in `refused`.
    func check(_ ids: [JobID], refused: Set<JobState>) async throws -> (missing: JobID?, refusedBy: (JobID, JobState)?)
    /// What can start next: at most `limit` queued standalone jobs by priority then id, and
    /// the open groups (not in `excludingGroups`) with queued members, each placed by its
    /// first queued member.
    func nextQueued(limit: Int, excludingGroups active: Set<GroupID>) async throws -> (
        jobs: [Job], groups: [(entry: QueueEntry, groupID: GroupID)]
    )
    /// The earliest `next_attempt_at` of a waiting job.
    func nextWakeUp() async throws -> Date?
    /// A page of the rows start-up reconciliation looks at (finished, or started at least once).
    func reconcilePage(afterID: JobID, limit: Int) async throws -> [Job]
    /// Up to `limit` jobs completed at or after `since`, newest first: a worker that died may
    /// have recorded them without linking their files (see `Engine.finishPublish`).
    func completed(since: Date, limit: Int) async throws -> [Job]

    // MARK: Fleet: workers, claims and leases
    //
    // A daemon of a fleet is a worker with a stable id. It takes queued jobs with `claim`,
    // which marks them `running` under its id with a lease, keeps the lease with
    // `renewLeases`, and writes its transfers' outcomes with `saveOwned`, which refuses rows
    // that are no longer its own. A worker that dies stops renewing; `requeueExpired` (run by
    // any worker) queues its jobs again once their lease has passed. On SQLite there is one
    // daemon, and these do the same on its one table.

    /// Takes up to `limit` queued standalone jobs whose `host` is not in `excludingHosts`, by
    /// priority (higher first) then id, and marks them `running` as `StateMachine`'s `start`
    /// does (`attempts + 1`), with `worker` and `leaseUntil`; one `job.state` event each; one
    /// transaction. Two workers claiming at once never get the same job. Returns the rows as
    /// committed, in claim order.
    /// While hosts are excluded, a standalone claim looks only at the first `claimWindow` queued
    /// jobs, so that a long queue of an excluded host costs no more than that (jobs further back
    /// wait for the window).
    /// With `lightOnly`, only jobs with at most that many bytes left (`size -
    /// received`), or with an unknown size and at most that many received, are taken
    /// (`Lanes.claimFilter`), likewise from the first `claimWindow` queued jobs.
    /// With `group`, the same among that group's members (each of which runs on one worker,
    /// though a group's members may run on several).
    func claim(limit: Int, worker: String, leaseUntil: Date, excludingHosts: Set<String>, lightOnly: Int64?, group: GroupID?, now: Date)
        async throws -> [Job]
    /// Whether other daemons share this table (PostgreSQL): then rows running under another
    /// worker are left to it at start-up, and changes by others are watched (`changes()`).
    var sharesQueue: Bool { get }
    /// Extends the lease of every `running` job of `worker` and records its heartbeat
    /// (`workers.seen_at`). Returns the epochs of the jobs it still owns: a running transfer
    /// whose job is not there, or under another epoch, was paused, canceled, requeued or taken
    /// by someone else, and must stop.
    /// On a table with a clock of its own (`serverClock`), leases are reckoned on it: the
    /// lease written is the table's now plus `until - now` (likewise for `claim`), and
    /// `expireLeases` compares with the table's now.
    func renewLeases(worker: String, until: Date, now: Date) async throws -> [JobID: Int64]
    /// Every `running` job whose lease has passed is handed over, one event each: queued again
    /// (`worker` and `leaseUntil` cleared, `received` kept), or, with a pending
    /// `stopRequest`, paused, canceled or removed as it asked (no answered command is lost
    /// when its owner dies). Returns their ids, and the partial files of the canceled and
    /// removed ones.
    func expireLeases(now: Date) async throws -> BulkOutcome
    /// A clean stop: the worker's running jobs go back to `queued` (worker cleared), one event
    /// each. Returns their ids.
    @discardableResult
    func releaseJobs(worker: String, now: Date) async throws -> [JobID]
    /// `save` for the outcomes of `owner`'s transfers: every job given comes from `running`.
    /// A row that is no longer `running`, or that another worker holds, is not written and is
    /// returned in `lost` (the caller stops that transfer and publishes nothing). Rows that
    /// leave `running` lose their worker and lease.
    func saveOwned(_ jobs: [Job], owner: String, publish: Bool) async throws -> (events: [StoredEvent], lost: Set<JobID>)
    /// One turn of the scheduler: writes `saves` (the `owned` ones as `saveOwned` does for
    /// `owner`, the others as `save`), then, with `claim`, takes the next queued work as
    /// `nextQueued` and `claim` would (see `TurnClaim`), publishing every event after the
    /// commit. Jobs already started from an earlier turn's ready rows are claimed first, and
    /// the next ready rows read last (`TurnClaim.started`, `.ready`). The SQLite store does it
    /// all in one transaction; the default runs those calls one after the other, and gives no
    /// ready rows.
    func turn(saves: [Job], owned: Set<JobID>, owner: String, claim: TurnClaim?) async throws -> TurnOutcome
    /// The table's own clock, for a shared table (PostgreSQL: its `clock_timestamp()`): the
    /// clock that leases are reckoned on, whatever the workers' clocks say. nil: the table
    /// has no clock of its own (SQLite, one daemon).
    func serverClock() async throws -> Date?
    /// The workers whose last heartbeat is at or after `seenSince`, by id.
    func workers(seenSince: Date) async throws -> [(id: String, seenAt: Date)]
    /// Yields when job states may have changed in the table, by any daemon: a daemon re-reads
    /// what it runs then (a pause of one of its jobs by another daemon). PostgreSQL: on every
    /// `NOTIFY dld_jobs`, which every state-changing transaction sends (this daemon's too).
    /// SQLite: one daemon owns the table and its own commands reach its engine directly, so
    /// the stream never yields; it ends at `close`.
    func changes() -> AsyncStream<Void>

    // MARK: Groups

    /// Creates a group and its members (staged under the group's folder) in one transaction;
    /// `hls`, an HLS recipe, is written with the group's row.
    func insertGroup(name: String, dir: String, priority: Int, members: [NewJob], hls: String?, now: Date) async throws -> (JobGroup, [Job])
    /// Records a group's closing or failed publish, with its event; `members` rows are written
    /// in the same transaction. With `publish: false` the event is returned instead.
    @discardableResult
    func saveGroup(_ group: JobGroup, members: [Job], publish: Bool) async throws -> [StoredEvent]
    /// Deletes a group record (after its members), with its event.
    func deleteGroup(_ id: GroupID, now: Date) async throws
    func fetchGroup(_ id: GroupID) async throws -> JobGroup?
    /// An HLS group's recipe (nil for other groups), which `fetchGroup` does not read.
    func hlsRecipe(of id: GroupID) async throws -> String?
    /// A live HLS recording's reload: `members` added to the open `group` (staged as its
    /// others) and its recipe replaced by `hls`, in one transaction. Nil, with nothing
    /// written, when the group is closed or gone.
    func extendGroup(_ group: JobGroup, members: [NewJob], hls: String, now: Date) async throws -> [Job]?
    /// Groups with this name, newest first.
    func fetchGroups(named name: String) async throws -> [JobGroup]
    func members(of id: GroupID) async throws -> [Job]
    func memberCounts(of id: GroupID) async throws -> [JobState: Int]
    func firstFailedMember(of id: GroupID) async throws -> Job?
    /// A group and its members' counts by state, from one snapshot (its members are claimed).
    /// While some member is queued or running, `counts` holds only `queued` and `running`, 1
    /// when there is any (a turn needs no more, and counting a group of 100 000 members every
    /// turn would cost each turn the group's size); once none is, every state, counted.
    func groupTurn(_ id: GroupID) async throws -> (group: JobGroup?, counts: [JobState: Int])
    /// Every group folder, with how the group was closed (nil while open).
    func groupFolders() async throws -> [(id: GroupID, dir: String, closed: GroupState?)]
    /// Ids of groups that are neither published nor canceled.
    func openGroups() async throws -> [GroupID]

    // MARK: Lifetime

    /// Lets go of the connections; the table is not used after this.
    func close() async
}

/// Shorter forms of the requirements, for callers that take the usual choices.
extension JobTable {
    public func serverClock() async throws -> Date? { nil }

    public func setEventSink(_ deliver: @escaping @Sendable ([StoredEvent]) -> Void) {
        setEventSink(wanted: { true }, deliver)
    }

    /// Every kept event after `seq`.
    public func events(after seq: Int64) async throws -> [StoredEvent] {
        try await events(after: seq, limit: Int(EventLog.kept))
    }

    /// Queued standalone jobs a claim that excludes hosts looks at, at most.
    public static var claimWindow: Int { 1000 }

    /// Standalone jobs (see `claim(limit:worker:leaseUntil:excludingHosts:lightOnly:group:now:)`).
    public func claim(limit: Int, worker: String, leaseUntil: Date, excludingHosts: Set<String>, now: Date) async throws -> [Job] {
        try await claim(
            limit: limit, worker: worker, leaseUntil: leaseUntil, excludingHosts: excludingHosts, lightOnly: nil, group: nil, now: now)
    }

    /// Any of the lanes' jobs (see `claim(limit:worker:leaseUntil:excludingHosts:lightOnly:group:now:)`).
    public func claim(limit: Int, worker: String, leaseUntil: Date, excludingHosts: Set<String>, group: GroupID?, now: Date) async throws
        -> [Job]
    {
        try await claim(
            limit: limit, worker: worker, leaseUntil: leaseUntil, excludingHosts: excludingHosts, lightOnly: nil, group: group, now: now)
    }

    @discardableResult
    public func save(_ jobs: [Job]) async throws -> [StoredEvent] {
        try await save(jobs, publish: true)
    }

    public func save(_ job: Job) async throws {
        try await save([job], publish: true)
    }

    public func fetch(_ id: JobID) async throws -> Job? {
        try await fetch([id]).first
    }

    /// Every job (or every job in these states), by id.
    public func list(states: [JobState]? = nil) async throws -> [Job] {
        try await list(states: states, afterID: 0, limit: Int.max)
    }

    public func list(afterID: JobID, limit: Int) async throws -> [Job] {
        try await list(states: nil, afterID: afterID, limit: limit)
    }

    /// A command of a daemon that does not claim: every selected row changes here.
    public func apply(_ command: BulkCommand, to selection: RowSelection, now: Date) async throws -> BulkOutcome {
        try await apply(command, to: selection, first: [], owner: nil, now: now)
    }

    /// Deletes rows by id, keeping their files.
    public func delete(_ ids: [JobID], now: Date = Date()) async throws {
        guard !ids.isEmpty else { return }
        _ = try await delete(.ids(ids), deleteFiles: false, owner: nil, now: now)
    }

    /// A delete by a daemon that does not claim: every selected row goes.
    public func delete(_ selection: RowSelection, deleteFiles: Bool, now: Date) async throws -> BulkOutcome {
        try await delete(selection, deleteFiles: deleteFiles, owner: nil, now: now)
    }

    /// The ids `expireLeases` handed over.
    public func requeueExpired(now: Date) async throws -> [JobID] {
        try await expireLeases(now: now).ids
    }

    public func checkpoint(_ id: JobID, received: Int64, size: Int64?, validators: Validators, finalURL: String?) async throws {
        try await checkpoint(
            id, received: received, size: size, validators: validators, finalURL: finalURL, segments: nil, now: Date(), owner: nil)
    }

    /// A checkpoint of a daemon that does not claim (no owner check).
    public func checkpoint(_ id: JobID, received: Int64, size: Int64?, validators: Validators, finalURL: String?, now: Date) async throws {
        try await checkpoint(
            id, received: received, size: size, validators: validators, finalURL: finalURL, segments: nil, now: now, owner: nil)
    }

    /// A checkpoint of one stream (no ranges), for the attempt that owns the job.
    @discardableResult
    public func checkpoint(
        _ id: JobID, received: Int64, size: Int64?, validators: Validators, finalURL: String?, now: Date, owner: JobOwner?
    ) async throws -> CheckpointAnswer {
        try await checkpoint(
            id, received: received, size: size, validators: validators, finalURL: finalURL, segments: nil, now: now, owner: owner)
    }

    /// A group without an HLS recipe.
    public func insertGroup(name: String, dir: String, priority: Int, members: [NewJob], now: Date) async throws -> (JobGroup, [Job]) {
        try await insertGroup(name: name, dir: dir, priority: priority, members: members, hls: nil, now: now)
    }

    @discardableResult
    public func saveGroup(_ group: JobGroup, members: [Job] = []) async throws -> [StoredEvent] {
        try await saveGroup(group, members: members, publish: true)
    }

    /// Whether an unfinished job downloads to `path`.
    public func isPathInUse(_ path: String) async throws -> Bool {
        try await unfinishedPaths(among: [path]).contains(path)
    }
}

/// The events table's bounds.
public enum EventLog {
    /// Events kept for replay; older ones are pruned as new ones are written.
    public static let kept: Int64 = 10_000
    /// Bulk changes publish their events read back from the table, this many a read.
    public static let page = 1000
}

/// Where a store hands its committed events, shared by the backends.
///
/// The closures live in a struct on purpose: a bare function type kept in a `Mutex` comes back
/// from every `withLock` wrapped in two more reabstraction thunks, so calling it (and at last
/// releasing it) recursed once per earlier commit: dld 0.1.0's SIGSEGV after about 130 000
/// commits. `EventSinkTests` guards this.
public final class EventSink: Sendable {
    private struct Sink {
        var deliver: @Sendable ([StoredEvent]) -> Void
        var wanted: @Sendable () -> Bool
    }

    /// Events held back while a writer's own events wait (see `hold`).
    private struct Held {
        var holds = 0
        var events: [StoredEvent] = []
    }

    private let sink = Mutex<Sink?>(nil)
    private let held = Mutex(Held())

    public init() {}

    public func set(wanted: @escaping @Sendable () -> Bool, _ deliver: @escaping @Sendable ([StoredEvent]) -> Void) {
        sink.withLock { $0 = Sink(deliver: deliver, wanted: wanted) }
    }

    /// Whether a sink is set and wants events.
    public var wanted: Bool {
        guard let sink = sink.withLock({ $0 }) else { return false }
        return sink.wanted()
    }

    public func publish(_ events: [StoredEvent]) {
        guard !events.isEmpty, let sink = sink.withLock({ $0 }) else { return }
        deliver(events, to: sink)
    }

    /// Holds back every event published from now until `release`: a writer whose events go
    /// out only after something else is done (files linked after their commit) takes a hold
    /// before it commits, so that the events of later commits do not overtake its own.
    /// Subscribers see events in the order of their numbers (commit order) all the same.
    public func hold() {
        held.withLock { $0.holds += 1 }
    }

    /// Ends a hold with the writer's own events: once no hold is left, everything held back
    /// goes out in order.
    public func release(publishing events: [StoredEvent]) {
        let sink = sink.withLock { $0 }
        held.withLock { held in
            // A hand-over without a hold (a caller that held nothing) is a plain publish.
            held.holds = max(0, held.holds - 1)
            held.events += events
            guard held.holds == 0, !held.events.isEmpty else { return }
            let ready = held.events.sorted { $0.seq < $1.seq }
            held.events = []
            sink?.deliver(ready)
        }
    }

    /// Hands events to the sink, or keeps them while a hold lasts. Under the lock, so that two
    /// writers publishing at once cannot overtake a hold's release.
    private func deliver(_ events: [StoredEvent], to sink: Sink) {
        held.withLock { held in
            if held.holds > 0 {
                held.events += events
            } else {
                sink.deliver(events)
            }
        }
    }

    /// Publishes the events numbered `(first, last]`, read by `read(after, through, limit)` a
    /// page at a time, so that a change of 100 000 rows never holds 100 000 events in memory.
    /// Nothing is read when no one listens. A page that cannot be read ends the publishing (a
    /// subscriber can still replay them from the table).
    public func publish(after first: Int64, through last: Int64, read: (Int64, Int64, Int) throws -> [StoredEvent]) {
        guard last > first, let sink = sink.withLock({ $0 }), sink.wanted() else { return }
        var cursor = first
        while cursor < last {
            guard let page = try? read(cursor, last, EventLog.page), let end = page.last?.seq else { return }
            deliver(page, to: sink)
            cursor = end
        }
    }

    /// `publish(after:through:read:)` for a backend whose reads are asynchronous.
    public func publish(after first: Int64, through last: Int64, fetch: (Int64, Int64, Int) async throws -> [StoredEvent]) async {
        guard last > first, let sink = sink.withLock({ $0 }), sink.wanted() else { return }
        var cursor = first
        while cursor < last {
            guard let page = try? await fetch(cursor, last, EventLog.page), let end = page.last?.seq else { return }
            deliver(page, to: sink)
            cursor = end
        }
    }
}

/// One attempt at a job, as its worker holds it: the worker's id and the epoch its claim
/// returned (`Job.epoch`, the fencing token). A write by an owner applies only while the row
/// is still `running` under both.
public struct JobOwner: Sendable, Hashable {
    public var worker: String
    public var epoch: Int64

    public init(worker: String, epoch: Int64) {
        self.worker = worker
        self.epoch = epoch
    }

    /// The attempt that `job`'s row, as claimed, belongs to.
    public init(_ job: Job, worker: String) {
        self.init(worker: worker, epoch: job.epoch)
    }

    /// The attempt's name on its partial file and in `Job.partialTag`: `worker/epoch`.
    public var tag: String { "\(worker)/\(epoch)" }
}

/// What a checkpoint did: whether the row was written (it was still the attempt's), and the
/// command that waits for the owner.
public struct CheckpointAnswer: Sendable, Equatable {
    public var written: Bool
    public var stopRequest: StopRequest?

    public init(written: Bool, stopRequest: StopRequest? = nil) {
        self.written = written
        self.stopRequest = stopRequest
    }
}

/// Progress a running transfer wrote but has not synced, for `recordUnsynced`, with the
/// epoch of its attempt.
public struct UnsyncedRecord: Sendable {
    public var id: JobID
    public var epoch: Int64
    public var progress: UnsyncedProgress

    public init(id: JobID, epoch: Int64, progress: UnsyncedProgress) {
        self.id = id
        self.epoch = epoch
        self.progress = progress
    }
}

/// A user's change of one job (`revise`): nil fields stay as they are. A new URL clears the
/// reason the old one was dropped (it is tried whatever the old one did).
public struct JobRevision: Sendable, Equatable {
    public var url: String?
    public var headers: [HeaderField]?
    public var options: JobOptions?

    public init(url: String? = nil, headers: [HeaderField]? = nil, options: JobOptions? = nil) {
        self.url = url
        self.headers = headers
        self.options = options
    }

    /// `job` with the revision's fields, as both backends write it.
    public func applied(to job: Job) -> Job {
        var job = job
        if let url {
            job.url = url
            job.urlDropped = nil
        }
        if let headers { job.headers = headers }
        if let options { job.options = options }
        return job
    }

    /// Whether a row read as `job` may be revised: it exists, and is as expected.
    public static func matches(_ job: Job, _ expecting: (state: JobState, epoch: Int64)?) -> Bool {
        guard let expecting else { return true }
        return job.state == expecting.state && job.epoch == expecting.epoch
    }
}

/// The owner check of both backends, on a row as stored.
public enum JobOwnership {
    /// Whether a row (its state, worker and epoch) is still the attempt of `owner` that `job`
    /// comes from: `running` under `owner` with `job`'s epoch. A row running without a worker
    /// was started by a daemon that does not claim: it is anyone's.
    public static func owns(state: String, worker: String?, epoch: Int64, job: Job, owner: String) -> Bool {
        guard state == JobState.running.rawValue else { return false }
        guard let worker else { return true }
        return worker == owner && epoch == job.epoch
    }

    /// Whether a command that waits for the owner (`request`, the row's `stop_request`: a pause,
    /// cancel or remove sent to another worker and answered `requested`) forbids writing `job`,
    /// the owner's outcome of its attempt. An attempt that ended waiting for a retry, or queued
    /// again, has not finished the job: written, it would drop the answered command and the job
    /// would run again. The write is refused as if the attempt were lost; the row stays the
    /// owner's, whose next lease turn carries the command out (`requeueOrphans`), or whichever
    /// worker sees its lease run out. A completion or a failure is the job's last word: nothing
    /// is left to stop, and the command has no effect.
    public static func overtakes(request: String?, job: Job) -> Bool {
        request != nil && (job.state == .waiting || job.state == .queued)
    }
}
