import DLCore
import Foundation

/// What a turn of the scheduler takes after its writes (`JobTable.turn`): the first `free`
/// entries of the queue in its order, where an open group not in `excludingGroups` stands at
/// its first queued member and takes one slot (`SchedulerPolicy.share`); of the standalone
/// jobs among them, at most `limit` are claimed, passing over `excludingHosts`, as `claim`
/// does.
///
/// First of all, before the turn's rows (the outcomes of their transfers may be among them),
/// `started` (jobs the worker already started from the last turn's `ready` or `readyMembers`
/// rows) are claimed as `claim` would, each only while still queued; after the claim, the first `ready` queued standalone jobs are read, when no open group waits for
/// a slot, and the first `readyMembers` queued members of each group in `excludingGroups` (the
/// groups that hold slots).
public struct TurnClaim: Sendable {
    public var free: Int
    public var limit: Int
    public var excludingGroups: Set<GroupID>
    public var excludingHosts: Set<String>
    public var worker: String
    public var leaseUntil: Date
    public var now: Date
    /// Of the `free` entries, standalone jobs take at most this many and groups at most
    /// `groupLimit` (nil: `free`); an entry over its kind's limit is passed over
    /// (`SchedulerPolicy.share`, the lanes of `Lanes`).
    public var standaloneLimit: Int? = nil
    public var groupLimit: Int? = nil
    /// While every bulk slot is taken: only standalone jobs with at most this many bytes left
    /// (or an unknown size and at most this many on disk) are claimed (`Lanes.claimFilter`).
    public var lightOnly: Int64? = nil
    public var started: [JobID] = []
    public var ready = 0
    /// Where the last read of `ready` jobs ended: while no write but claims has queued,
    /// unqueued or reordered a row since (`ReadyCursor.version`), only the next `rows` after
    /// it are read, and as many more as this turn's claim took (`TurnOutcome.readyContinued`);
    /// otherwise the first `ready` again. A store that does not count such writes always reads
    /// them again.
    public var readyAfter: ReadyCursor? = nil
    public var readyMembers = 0

    public init(
        free: Int, limit: Int, excludingGroups: Set<GroupID>, excludingHosts: Set<String>, worker: String, leaseUntil: Date, now: Date
    ) {
        self.free = free
        self.limit = limit
        self.excludingGroups = excludingGroups
        self.excludingHosts = excludingHosts
        self.worker = worker
        self.leaseUntil = leaseUntil
        self.now = now
    }
}

/// The last standalone job a turn read as ready, in the queue's order (priority, then id), and
/// the store's count of writes that changed the queue otherwise when it was read.
public struct ReadyCursor: Sendable, Equatable {
    public var priority: Int
    public var id: JobID
    public var version: UInt64
    /// How many jobs to read after it.
    public var rows: Int

    public init(priority: Int, id: JobID, version: UInt64, rows: Int = 0) {
        self.priority = priority
        self.id = id
        self.version = version
        self.rows = rows
    }
}

/// What a turn wrote and took.
public struct TurnOutcome: Sendable {
    /// The events of the turn: its rows' and its claim's (already published).
    public var events: [StoredEvent] = []
    /// Owned rows that were not written: no longer `running` under the owner.
    public var lost: Set<JobID> = []
    /// Standalone jobs claimed, as committed (`running`), in claim order.
    public var claimed: [Job] = []
    /// Standalone jobs that have a slot among the first `free` entries (`claimed` may hold
    /// fewer: `limit`, or hosts passed over).
    public var standaloneSlots = 0
    /// Groups that have a slot among the first `free` entries, in the queue's order.
    public var groups: [GroupID] = []
    /// The next queued standalone jobs after the claim, in the queue's order (at most
    /// `TurnClaim.ready`; none while an open group waits for a slot, or on a table that
    /// several workers share). Until the table changes otherwise, the worker may start them
    /// as slots free up, before a turn claims them (`TurnClaim.started`).
    public var ready: [Job] = []
    /// The next queued members of each group that holds a slot, by id (at most
    /// `TurnClaim.readyMembers` each; none on a shared table): started as `ready` jobs are, as
    /// places in their group free up.
    public var readyMembers: [GroupID: [Job]] = [:]
    /// `ready` continues the last read (the jobs after `TurnClaim.readyAfter`) rather than
    /// replacing it.
    public var readyContinued = false
    /// The store's count of writes that changed the queue otherwise than by claims, when
    /// `ready` was read (nil: the store does not count them).
    public var readyVersion: UInt64? = nil
    /// Jobs of `TurnClaim.started` that were no longer queued: not claimed; their transfers
    /// must stop.
    public var startedLost: Set<JobID> = []

    public init() {}
}

extension JobTable {
    /// The turn as separate calls, each its own transaction (`PostgresJobStore`).
    public func turn(saves: [Job], owned: Set<JobID>, owner: String, claim: TurnClaim?) async throws -> TurnOutcome {
        var outcome = TurnOutcome()
        let mine = saves.filter { owned.contains($0.id) }
        let others = saves.filter { !owned.contains($0.id) }
        if !mine.isEmpty {
            (outcome.events, outcome.lost) = try await saveOwned(mine, owner: owner, publish: true)
        }
        if !others.isEmpty {
            outcome.events += try await save(others, publish: true)
        }
        // Never gives `ready` rows (a shared queue could hand them to another worker), so
        // nothing is started from them.
        outcome.startedLost = Set(claim?.started ?? [])
        guard let claim, claim.free > 0 else { return outcome }
        let (jobs, groups) = try await nextQueued(limit: claim.free, excludingGroups: claim.excludingGroups)
        let share = SchedulerPolicy.share(
            free: claim.free, standaloneLimit: claim.standaloneLimit, groupLimit: claim.groupLimit,
            standalone: jobs.map { QueueEntry(id: $0.id, priority: $0.priority) },
            groups: groups.map { (entry: $0.entry, group: $0.groupID) })
        outcome.standaloneSlots = share.standalone
        outcome.groups = share.groups
        let limit = min(share.standalone, claim.limit)
        if limit > 0 {
            outcome.claimed = try await self.claim(
                limit: limit, worker: claim.worker, leaseUntil: claim.leaseUntil, excludingHosts: claim.excludingHosts,
                lightOnly: claim.lightOnly, group: nil, now: claim.now)
        }
        return outcome
    }
}
