import DLCore
import Foundation

/// What a running transfer tells the scheduler of the connections it holds. Live values: a
/// segmented download gives back the connections it does not use once it knows it is one
/// stream.
public protocol TransferLoad {
    /// Connections to the job's host the transfer may use (its ranges).
    var connections: Int { get }
    /// With mirrors, the connections by host; nil without.
    var hostConnections: [String: Int]? { get }
    /// Bytes on disk.
    var received: Int64 { get }
}

/// Why a command stops a running transfer. `lost`: the job is no longer this worker's
/// (another daemon paused, canceled or requeued it): its transfer stops and nothing of it is
/// written or published.
public enum StopIntent: Int, Comparable, Sendable {
    case shutdown = 0
    case pause, cancel, remove, lost
    public static func < (a: StopIntent, b: StopIntent) -> Bool { a.rawValue < b.rawValue }
}

/// The limits the scheduler works within: the lanes of standalone jobs and of a group's slot,
/// the host limits, and which hosts answered over HTTP/2 (they take streams, not connections).
public struct SchedulingLimits {
    public var lanes: Lanes
    public var groupLanes: Lanes
    public var hosts: HostLimits
    /// Whether `host` answered over HTTP/2 (the client's knowledge).
    public var multiplexed: (String) -> Bool
    /// Ready rows a turn reads for standalone jobs, and for each group that holds a slot.
    public var readyRows: Int
    public var readyMemberRows: Int

    public init(lanes: Lanes, groupLanes: Lanes, hosts: HostLimits, multiplexed: @escaping (String) -> Bool = { _ in false }) {
        self.lanes = lanes
        self.groupLanes = groupLanes
        self.hosts = hosts
        self.multiplexed = multiplexed
        // Four rows a slot with strictly one at a time or `max_light = 0`, at most 16; 16 with
        // the light lane. With small files fewer rows were slower, and so were more: each turn
        // reads every row (docs/benchmarks.md, "What was tried": a slot handed straight to the
        // next job).
        self.readyRows = lanes.strict ? min(4 * lanes.maxActive, 16) : 16
        self.readyMemberRows = lanes.strict ? min(4 * groupLanes.maxActive, 16) : 16
    }
}

/// The engine's scheduling as a value: which transfers hold slots, the next queued jobs a
/// freed slot starts without a trip to the table (the ready lists), the jobs started from
/// them whose claims are not committed yet, and the changes of the turn under way. No I/O:
/// the engine feeds it events (a section of the queue begins, a transfer started or ended, a
/// turn read the ready lists, a timer fired, an answer told a transfer's size) and carries
/// out what each returns (start these transfers, commit these claims, drop these rows, arm
/// this timer). Its invariants are unit-tested with a test clock (SchedulingTests):
///
/// 1. The claims of jobs started early are committed before anything else may change the
///    queue: a section that is not a turn drops the ready lists and returns those claims first.
/// 2. A slot freed by a transfer that ended goes to the first ready job that may start in it.
/// 3. The lanes, a group's places and each host's limit hold for every start.
/// 4. A turn that failed before its commit loses exactly its uncommitted rows; its claims are
///    committed, so their transfers start.
public struct Scheduling<Transfer: TransferLoad, Notice> {
    /// A transfer in flight; it holds a slot (or a place in its group's slot).
    public struct Slot {
        public var job: Job
        public var transfer: Transfer
        /// `URLRules.hostKey` of the job's URL, parsed once.
        public var host: String
        /// Tells this transfer's outcome from that of an earlier transfer of the same job.
        public var attempt: UInt64
        /// Set when a command stops the transfer; the command then handles its outcome.
        public var stop: StopIntent?
        /// The unsynced progress last recorded for it.
        public var recorded: UnsyncedProgress?
        /// It ended on its own and its outcome waits for the queue: its slot may be handed to
        /// a ready job already.
        public var ended = false
        /// It holds a bulk slot (`Lanes`): its answer told more than `lightBytes` left.
        public var bulk = false
        /// It stopped before writing because no bulk slot was free (`Lanes.Admission.park`):
        /// it goes back to the queue without using up an attempt.
        public var parked = false

        public init(job: Job, transfer: Transfer, host: String, attempt: UInt64) {
            self.job = job
            self.transfer = transfer
            self.host = host
            self.attempt = attempt
        }
    }

    /// Rows to write in the next commit, and what to do once it is durable.
    public struct Pending {
        public var saves: [Job] = []
        /// Rows among `saves` that leave `running` from this worker's transfers: written only
        /// while the job is still this worker's.
        public var owned: Set<JobID> = []
        /// Jobs claimed (committed as `running`) whose transfers start after the commit.
        public var launches: [Job] = []
        public var notices: [Notice] = []
        /// Slots found free: the commit claims work for them.
        public var claimFree: Int? = nil

        public init() {}
    }

    /// What a section of the serial queue must do before its own work (`beginSection`).
    public struct SectionStart {
        /// Rows of a turn that failed before its commit: dropped, never committed.
        public var droppedRows = 0
        /// Claims that turn committed: their transfers start.
        public var launches: [Job] = []
        /// Jobs started from the ready lists whose claims must be committed now.
        public var claims: [Job] = []
    }

    public var limits: SchedulingLimits
    /// Transfers in flight.
    public var running: [JobID: Slot] = [:]
    /// Groups holding a slot of the queue.
    public var activeGroups: Set<GroupID> = []
    /// The next queued standalone jobs as the last turn read them.
    public private(set) var ready: [Job] = []
    /// The same for the members of each group that holds a slot.
    public private(set) var readyMembers: [GroupID: [Job]] = [:]
    /// The last standalone job the ready reads took, and the store's count of queue changes
    /// then: the next read takes only the jobs after it while that count holds
    /// (`readyTopUp`). Nil once the list is dropped.
    public private(set) var readyEnd: (priority: Int, id: JobID, version: UInt64)?
    /// The standalone ready jobs while a claim for free slots is on its way: none may start
    /// from them meanwhile (the claim counts those slots free), and the turn's read gives them
    /// back, but those it claimed, if it continues them (`turnRead`).
    private var heldReady: [Job]?
    /// Jobs started from the ready lists whose claims are not committed yet.
    public private(set) var startedEarly: [Job] = []
    /// Changes of this turn, committed together.
    public var pending = Pending()
    /// When the last claim for free slots found nothing.
    public private(set) var fruitlessClaimAt: Date?
    /// A timer commits the claims left waiting (`deferClaims`).
    public private(set) var claimTimerArmed = false
    /// The number of the last transfer started (`Slot.attempt`).
    public private(set) var lastAttempt: UInt64 = 0

    public init(limits: SchedulingLimits) {
        self.limits = limits
    }

    /// How long a turn leaves out the claim past ready jobs that could not start, after one
    /// that found nothing: another host's queued jobs start at most this late.
    public static var blockedClaimPause: TimeInterval { 0.1 }
    /// Claims that may wait at once for a commit; more are committed by the turn that starts them.
    public static var deferredClaimsLimit: Int { 64 }

    // MARK: Events

    /// A section of the serial queue begins. The rows of a turn that failed before its commit
    /// are dropped and its claims start; a section that is not a turn may change the queue:
    /// the ready lists are forgotten and the claims of jobs started from them are returned, to
    /// be committed before anything else (invariant 1).
    public mutating func beginSection(turn: Bool) -> SectionStart {
        var start = SectionStart()
        if !pending.saves.isEmpty || !pending.launches.isEmpty || pending.claimFree != nil {
            start.droppedRows = pending.saves.count
            start.launches = pending.launches
            pending = Pending()
        }
        if !turn {
            dropReady()
            start.claims = takeStartedEarly()
        }
        return start
    }

    /// Forgets the ready lists: the queue may change otherwise.
    public mutating func dropReady() {
        dropStandaloneReady()
        readyMembers = [:]
    }

    /// Forgets the ready members of `group`, or the standalone ready jobs (a claim of its own
    /// comes).
    public mutating func dropReady(group: GroupID?) {
        if let group { readyMembers[group] = nil } else { dropStandaloneReady() }
    }

    private mutating func dropStandaloneReady() {
        ready = []
        heldReady = nil
        readyEnd = nil
    }

    /// A claim for free slots comes: the standalone ready jobs are held aside until its turn's
    /// read (`heldReady`).
    private mutating func holdReady() {
        heldReady = (heldReady ?? []) + ready
        ready = []
    }

    /// What the next read of ready jobs may skip: the end of the last one, and how many jobs
    /// after it fill the list again (the store adds those its claim takes). Nil: the whole
    /// list is read again (none was read, or it was dropped).
    public func readyTopUp() -> (priority: Int, id: JobID, version: UInt64, rows: Int)? {
        guard let end = readyEnd else { return nil }
        return (end.priority, end.id, end.version, max(0, limits.readyRows - ready.count - (heldReady?.count ?? 0)))
    }

    /// The jobs started early, whose claims the caller commits now.
    public mutating func takeStartedEarly() -> [Job] {
        defer { startedEarly = [] }
        return startedEarly
    }

    /// The number of the next transfer to start (`started`).
    public mutating func nextAttempt() -> UInt64 {
        lastAttempt += 1
        return lastAttempt
    }

    /// A transfer starts (its `running` row committed, or started early): it holds a slot.
    public mutating func started(_ job: Job, transfer: Transfer, host: String, attempt: UInt64) {
        running[job.id] = Slot(job: job, transfer: transfer, host: host, attempt: attempt)
    }

    /// A transfer ended on its own. Returns whether its slot is free for a ready job
    /// (`handOff`); the outcome waits for the queue's next turn.
    public mutating func ended(_ id: JobID, attempt: UInt64) -> (free: Bool, group: GroupID?) {
        guard let entry = running[id], entry.attempt == attempt, entry.stop == nil else { return (false, nil) }
        running[id]?.ended = true
        return (true, entry.job.groupID)
    }

    /// The outcome of `id`'s transfer is recorded: its slot is gone. Returns the slot when the
    /// outcome is this transfer's and no command handles it.
    public mutating func settle(_ id: JobID, attempt: UInt64) -> Slot? {
        guard let entry = running[id], entry.attempt == attempt, entry.stop == nil else { return nil }
        running[id] = nil
        return entry
    }

    /// A turn's commit read the next queued jobs: jobs started while it ran are still among
    /// them, and are left out.
    /// `continued`: the jobs are the ones after the last read (`readyTopUp`), appended to the
    /// list, with the jobs held for its claim but those it claimed (`claimed`). `version`: the
    /// store's count of queue changes at the read (nil: not counted, and every read is a whole
    /// one).
    public mutating func turnRead(
        ready rows: [Job], members: [GroupID: [Job]], continued: Bool = false, version: UInt64? = nil, claimed: Set<JobID> = []
    ) {
        let fresh = rows.filter { running[$0.id] == nil }
        if continued {
            ready = ((heldReady ?? []) + ready).filter { !claimed.contains($0.id) && running[$0.id] == nil } + fresh
        } else {
            ready = fresh
        }
        heldReady = nil
        if let version, let last = rows.last {
            readyEnd = (last.priority, last.id, version)
        } else if !continued || version == nil {
            readyEnd = nil
        }
        readyMembers = members.mapValues { $0.filter { running[$0.id] == nil } }
    }

    /// A turn's commit is about to claim for `free` slots: the ready list is held aside (the
    /// claim counts those slots free, none may be handed off meanwhile).
    public mutating func claiming(free: Int) {
        if free > 0 { holdReady() }
    }

    /// A claim for `free` slots was committed; `found` tells whether it found anything to
    /// start (a claim that found nothing pauses the next ones, `claimFree`).
    public mutating func claimed(free: Int, found: Bool, now: Date) {
        fruitlessClaimAt = free > 0 && !found ? now : nil
    }

    /// Whether a turn reads the ready lists again: one that writes anything, claims or commits
    /// early starts does; one that writes nothing is not taken for that alone (the list is
    /// still valid then, and a slot that finds it empty claims in a turn anyway).
    public func turnReadsReady(claims: Bool, shared: Bool) -> Bool {
        !shared && (claims || !startedEarly.isEmpty || !pending.saves.isEmpty)
    }

    /// Starts the first ready job (or ready member of `group`, which holds a slot) whose host
    /// has room, if a slot is free counting the transfers that ended but wait for the queue
    /// (invariants 2 and 3). `open`: the queue runs as usual (not paused, not shutting down,
    /// not on a metered connection, not on a shared table). Returns the job as its claim will
    /// write it; the caller starts its transfer, and the next turn commits the claim.
    public mutating func handOff(group: GroupID? = nil, open: Bool, worker: String, lease: TimeInterval, now: Date) -> Job? {
        guard open else { return nil }
        let list = group.map { readyMembers[$0] ?? [] } ?? ready
        guard !list.isEmpty else { return nil }
        if let group, !activeGroups.contains(group) { return nil }
        // A group's places are its own; standalone jobs start in the lanes' free slots, and a
        // job known to be big only while a bulk slot is free.
        let lanes = self.lanes(group)
        let (bulk, light) = taken(group: group, excludingEnded: true)
        let free = lanes.free(bulk: bulk, light: light)
        let mayStart: (Int) -> Bool = { lanes.mayStart(size: list[$0].size, received: list[$0].received, bulk: bulk) }
        let long = hostLongLoad()
        guard
            let index = SchedulerPolicy.handOff(
                // Each URL is parsed only if the jobs before it cannot start.
                hosts: list.lazy.map { URLRules.hostKey($0.url) }, free: free,
                load: hostLoad(excludingEnded: true), limit: { self.hostStartLimit($0, long: long) }, mayStart: mayStart)
        else { return nil }
        if let group { readyMembers[group]?.remove(at: index) } else { ready.remove(at: index) }
        guard var job = try? StateMachine.apply(.start, to: list[index], now: now) else { return nil }
        // What the claim writes (`TurnClaim.started`), a new epoch with it.
        job.worker = worker
        job.leaseUntil = now.addingTimeInterval(lease)
        job.epoch += 1
        startedEarly.append(job)
        return job
    }

    /// The slots a turn claims for, once the ready jobs took theirs: nil when none is free, or
    /// while ready jobs are left that could not start (their host at its limit, or big with the
    /// bulk lane full) and the last claim past them found nothing less than
    /// `blockedClaimPause` ago (else every turn would make that claim). Any other answer drops
    /// the ready list: the claim counts its slots free.
    public mutating func claimFree(now: Date) -> Int? {
        let (bulk, light) = taken(group: nil, excludingEnded: false)
        let forStandalone = limits.lanes.free(bulk: bulk, light: light)
        let forGroups = limits.lanes.freeForGroups(bulk: bulk, light: light)
        let total = limits.lanes.strict ? forStandalone : forStandalone + forGroups
        guard total > 0 else { return nil }
        if !ready.isEmpty, let last = fruitlessClaimAt, now.timeIntervalSince(last) < Self.blockedClaimPause { return nil }
        holdReady()
        return total
    }

    /// What a turn that has nothing to write but early claims does with them (`deferClaims`).
    public enum Deferral: Equatable { case commitNow, wait, arm }

    /// Whether a turn that has nothing to write but the claims of jobs started early may leave
    /// its commit to a later one: the lists still hold a job for every slot, so the next ends
    /// need no turn either. The claims then wait for the next commit, or for the timer this
    /// arms (`.arm`) when none runs yet; a small file's slot then costs no transaction of its
    /// own.
    public mutating func deferClaims() -> Deferral {
        guard pending.saves.isEmpty, pending.launches.isEmpty, pending.notices.isEmpty, pending.claimFree == nil,
            !startedEarly.isEmpty, startedEarly.count < Self.deferredClaimsLimit,
            ready.count >= min(limits.readyRows, max(limits.lanes.maxActive, busy(group: nil))),
            activeGroups.allSatisfy({ (readyMembers[$0]?.count ?? 0) >= min(16, max(limits.groupLanes.maxActive, busy(group: $0))) })
        else { return .commitNow }
        guard !claimTimerArmed else { return .wait }
        claimTimerArmed = true
        return .arm
    }

    /// The timer of deferred claims fired (or was cancelled): returns whether claims wait.
    public mutating func claimTimerFired() -> Bool {
        claimTimerArmed = false
        return !startedEarly.isEmpty
    }

    /// A light transfer's answer told its size: it stays light, takes a free bulk slot, or is
    /// parked (it stops before writing and goes back to the queue). Nil: not this transfer
    /// any more, or already bulk.
    public mutating func admit(_ id: JobID, attempt: UInt64, remaining: Int64?, received: Int64) -> Lanes.Admission? {
        guard let entry = running[id], entry.attempt == attempt, entry.stop == nil, !entry.bulk else { return nil }
        let group = entry.job.groupID
        let admission = lanes(group).admit(remaining: remaining, received: received, bulk: bulkTaken(group: group, excludingEnded: true))
        switch admission {
        case .light: break
        case .bulk: running[id]?.bulk = true
        case .park: running[id]?.parked = true
        }
        return admission
    }

    // MARK: What the slots hold

    /// The lanes of standalone jobs, or inside `group`'s slot.
    public func lanes(_ group: GroupID?) -> Lanes {
        group == nil ? limits.lanes : limits.groupLanes
    }

    /// Transfers of `group`'s members (nil: standalone jobs), running or about to start, and
    /// those of them in the bulk lane, in one pass; with `excludingEnded`, not those that
    /// ended on their own and wait for the queue.
    func tally(group: GroupID?, excludingEnded: Bool) -> (busy: Int, bulk: Int) {
        var busy = 0
        var bulk = 0
        for slot in running.values where slot.job.groupID == group && !(excludingEnded && slot.ended) {
            busy += 1
            if slot.bulk { bulk += 1 }
        }
        for job in pending.launches where job.groupID == group { busy += 1 }
        return (busy, bulk)
    }

    /// Transfers of `group`'s members (nil: standalone jobs), running or about to start.
    public func busy(group: GroupID?, excludingEnded: Bool = false) -> Int {
        tally(group: group, excludingEnded: excludingEnded).busy
    }

    /// Bulk slots taken: standalone transfers in the bulk lane and the groups that hold
    /// slots; with `group`, that group's members in its bulk lane.
    public func bulkTaken(group: GroupID? = nil, excludingEnded: Bool = false) -> Int {
        tally(group: group, excludingEnded: excludingEnded).bulk + (group == nil ? activeGroups.count : 0)
    }

    /// Transfers in the light lane (standalone, or `group`'s members), running or about to
    /// start (every start is light until its answer tells its size).
    public func lightTaken(group: GroupID? = nil, excludingEnded: Bool = false) -> Int {
        let counts = tally(group: group, excludingEnded: excludingEnded)
        return counts.busy - counts.bulk
    }

    /// The lanes' taken slots of `group` (nil: standalone jobs) in one pass: bulk (with the
    /// groups that hold slots, for standalone jobs) and light.
    func taken(group: GroupID?, excludingEnded: Bool) -> (bulk: Int, light: Int) {
        let counts = tally(group: group, excludingEnded: excludingEnded)
        return (counts.bulk + (group == nil ? activeGroups.count : 0), counts.busy - counts.bulk)
    }

    /// The limit of `host`: a host that answered over HTTP/2 takes more streams than an
    /// HTTP/1.1 host takes connections.
    public func hostLimit(_ host: String) -> Int {
        limits.hosts.limit(multiplexed: limits.multiplexed(host))
    }

    /// How many transfers to `host` may be under way, counting requests that wait in the
    /// client's pool for a connection (`HostLimits.startLimit`); `long` is `hostLongLoad()`.
    public func hostStartLimit(_ host: String, long: [String: Int]) -> Int {
        limits.hosts.startLimit(multiplexed: limits.multiplexed(host), long: long[host, default: 0])
    }

    /// Connections by host held for long: by bulk transfers, ranges of segmented downloads,
    /// and transfers of unknown size past `lightBytes`. No request waits behind those.
    public func hostLongLoad() -> [String: Int] {
        var long: [String: Int] = [:]
        let lightBytes = limits.lanes.lightBytes
        for entry in running.values where !entry.ended {
            if let byHost = entry.transfer.hostConnections {
                for (host, count) in byHost { long[host, default: 0] += count }
                continue
            }
            let connections = entry.transfer.connections
            if entry.bulk || connections > 1 || entry.transfer.received > lightBytes {
                long[entry.host, default: 0] += connections
            }
        }
        return long
    }

    /// Transfers by host: running (with `excludingEnded`, only those that did not end on
    /// their own yet), and about to start in this turn. A transfer counts the connections it
    /// may use: its ranges, until it knows it is one stream; with mirrors, against the hosts
    /// they go to.
    public func hostLoad(excludingEnded: Bool = false) -> [String: Int] {
        var load: [String: Int] = [:]
        for entry in running.values where !(excludingEnded && entry.ended) {
            if let byHost = entry.transfer.hostConnections {
                for (host, count) in byHost { load[host, default: 0] += count }
            } else {
                load[entry.host, default: 0] += entry.transfer.connections
            }
        }
        for job in pending.launches { load[URLRules.hostKey(job.url), default: 0] += 1 }
        return load
    }

    /// The hosts at their limit, and the room of the fullest other host (the default limit
    /// when none is busy): a claim passes over the first and takes no more than the second.
    public func hostRoom() -> (full: Set<String>, room: Int) {
        let load = hostLoad()
        let long = hostLongLoad()
        var full: Set<String> = []
        var busiest: Int? = nil
        for (host, count) in load {
            let left = hostStartLimit(host, long: long) - count
            if left <= 0 { full.insert(host) } else { busiest = min(busiest ?? left, left) }
        }
        return (full, busiest ?? limits.hosts.maxPerHost)
    }
}

extension Scheduling.Slot: Sendable where Transfer: Sendable {}
extension Scheduling.Pending: Sendable where Notice: Sendable {}
