import DLCore
import DLJobTable
import Foundation
import GRDB
import Synchronization

/// The fleet primitives of `JobTable` on SQLite. One daemon owns a SQLite table, so no two
/// claims ever race here; these still do what the PostgreSQL store does, on the one writer,
/// so that the engine has one way to run jobs and the store tests hold on both backends.
extension SQLiteJobStore {
    public var sharesQueue: Bool { false }

    public func claim(
        limit: Int, worker: String, leaseUntil: Date, excludingHosts: Set<String>, lightOnly: Int64?, group: GroupID?, now: Date
    ) async throws -> [Job] {
        guard limit > 0 else { return [] }
        // Power loss may undo a claim: its jobs are then queued again, as start-up leaves a
        // crashed daemon's running jobs, and their transfers start over from the committed
        // offset. So a claim, on the path of every slot that refills, does not wait for the disk.
        // A claim takes a few jobs (at most the free slots): their events are read in its own
        // transaction, not by a reader after it.
        let (jobs, events) = try await pool.writeWithoutTransaction { db in
            try Self.withoutWaitingForTheDisk(db) {
                try Self.inTransaction(db) { () throws -> ([Job], [StoredEvent]) in
                    let (jobs, range) = try Self.claimRows(
                        limit: limit, worker: worker, leaseUntil: leaseUntil, excludingHosts: excludingHosts, lightOnly: lightOnly,
                        group: group,
                        now: now, in: db)
                    guard range.1 > range.0, sink.wanted else { return (jobs, []) }
                    return (jobs, try Self.events(after: range.0, through: range.1, limit: Int(range.1 - range.0), in: db))
                }
            }
        }
        sink.publish(events)
        return jobs
    }

    /// The turn in one transaction: the rows, then the claim. A turn that writes no rows
    /// (a slot refilled after a file was downloaded) does not wait for the disk, as `claim`.
    public func turn(saves: [Job], owned: Set<JobID>, owner: String, claim: TurnClaim?) async throws -> TurnOutcome {
        guard !saves.isEmpty || (claim.map { $0.free > 0 || $0.ready > 0 || $0.readyMembers > 0 || !$0.started.isEmpty } ?? false) else {
            return TurnOutcome()
        }
        let wanted = sink.wanted
        let queueVersion = self.queueVersion
        let outcome = try await pool.writeWithoutTransaction { db in
            let body = {
                try Self.inTransaction(db) { () throws -> TurnOutcome in
                    var outcome = TurnOutcome()
                    // First the jobs already started: the outcomes of their transfers may be
                    // among the rows.
                    if let claim, !claim.started.isEmpty {
                        let (claimed, range) = try Self.claimStarted(claim, in: db)
                        outcome.startedLost = Set(claim.started).subtracting(claimed)
                        if range.1 > range.0, wanted {
                            outcome.events += try Self.events(after: range.0, through: range.1, limit: Int(range.1 - range.0), in: db)
                        }
                    }
                    let read = try db.cachedStatement(sql: "SELECT state, worker, epoch FROM jobs WHERE id = ?")
                    for job in saves {
                        let row = try Row.fetchOne(read, arguments: [job.id])
                        let state: String? = row?["state"]
                        if owned.contains(job.id) {
                            guard let row, Self.owns(row, job: job, owner: owner) else {
                                outcome.lost.insert(job.id)
                                continue
                            }
                        }
                        try Self.update(job, in: db, owned: owned.contains(job.id))
                        if state != job.state.rawValue {
                            outcome.events.append(
                                try Self.record(
                                    .jobState, job: job, groupID: job.groupID, state: job.state.rawValue, at: job.updatedAt, in: db))
                        }
                    }
                    guard let claim else { return outcome }
                    var waitingGroups: [(entry: QueueEntry, groupID: GroupID)]? = nil
                    if claim.free > 0 {
                        let groups = try Self.queuedGroups(excluding: claim.excludingGroups, in: db)
                        waitingGroups = groups
                        let share: (standalone: Int, groups: [GroupID])
                        if groups.isEmpty {
                            // No group to interleave: the standalone jobs take what they are,
                            // up to their limit, counted in one step rather than read row by row.
                            let count = try Int.fetchOne(
                                db.cachedStatement(
                                    sql: """
                                        SELECT COUNT(*) FROM (SELECT 1 FROM jobs INDEXED BY jobs_standalone_queue
                                        WHERE state = 'queued' AND group_id IS NULL LIMIT ?)
                                        """),
                                arguments: [min(claim.free, claim.standaloneLimit ?? claim.free)])
                            share = (count ?? 0, [])
                        } else {
                            let standalone = try Row.fetchAll(
                                db.cachedStatement(
                                    sql: """
                                        SELECT id, priority FROM jobs INDEXED BY jobs_standalone_queue
                                        WHERE state = 'queued' AND group_id IS NULL ORDER BY priority DESC, id LIMIT ?
                                        """),
                                arguments: [claim.free]
                            ).map { QueueEntry(id: $0["id"], priority: $0["priority"]) }
                            share = SchedulerPolicy.share(
                                free: claim.free, standaloneLimit: claim.standaloneLimit, groupLimit: claim.groupLimit,
                                standalone: standalone, groups: groups.map { (entry: $0.entry, group: $0.groupID) })
                        }
                        outcome.standaloneSlots = share.standalone
                        outcome.groups = share.groups
                        let limit = min(share.standalone, claim.limit)
                        if limit > 0 {
                            let (jobs, range) = try Self.claimRows(
                                limit: limit, worker: claim.worker, leaseUntil: claim.leaseUntil, excludingHosts: claim.excludingHosts,
                                lightOnly: claim.lightOnly, group: nil, now: claim.now, in: db)
                            outcome.claimed = jobs
                            if range.1 > range.0, wanted {
                                outcome.events += try Self.events(after: range.0, through: range.1, limit: Int(range.1 - range.0), in: db)
                            }
                        }
                    }
                    // An open group that waits for a slot may come before these jobs
                    // (`SchedulerPolicy.share`): then only a turn decides.
                    if claim.ready > 0 {
                        let groups = try waitingGroups ?? Self.queuedGroups(excluding: claim.excludingGroups, in: db)
                        if groups.allSatisfy({ outcome.groups.contains($0.groupID) }) {
                            let version = queueVersion.value
                            outcome.readyVersion = version
                            if let after = claim.readyAfter, after.version == version {
                                // Nothing but claims changed the queue since the last read:
                                // its rows, but those claimed, are still the first, and only
                                // the next are read.
                                outcome.readyContinued = true
                                // What the claim above took from the list is read anew.
                                let rows = after.rows + outcome.claimed.count
                                if rows > 0 {
                                    outcome.ready = try Self.jobs(
                                        db.cachedStatement(
                                            sql: """
                                                SELECT \(JobColumn.list) FROM jobs INDEXED BY jobs_standalone_queue
                                                WHERE state = 'queued' AND group_id IS NULL AND (priority < ?1 OR (priority = ?1 AND id > ?2))
                                                ORDER BY priority DESC, id LIMIT ?3
                                                """),
                                        arguments: [after.priority, after.id, rows])
                                }
                            } else {
                                outcome.ready = try Self.jobs(
                                    db.cachedStatement(
                                        sql: """
                                            SELECT \(JobColumn.list) FROM jobs INDEXED BY jobs_standalone_queue
                                            WHERE state = 'queued' AND group_id IS NULL ORDER BY priority DESC, id LIMIT ?
                                            """),
                                    arguments: [claim.ready])
                            }
                        }
                    }
                    if claim.readyMembers > 0 {
                        let members = try db.cachedStatement(
                            sql: """
                                SELECT \(JobColumn.list) FROM jobs INDEXED BY jobs_by_group_state
                                WHERE group_id = ? AND state = 'queued' ORDER BY id LIMIT ?
                                """)
                        for group in claim.excludingGroups {
                            let next = try Self.jobs(members, arguments: [group, claim.readyMembers])
                            if !next.isEmpty { outcome.readyMembers[group] = next }
                        }
                    }
                    return outcome
                }
            }
            return saves.isEmpty ? try Self.withoutWaitingForTheDisk(db, body) : try body()
        }
        sink.publish(outcome.events)
        return outcome
    }

    private static func claimRows(
        limit: Int, worker: String, leaseUntil: Date, excludingHosts: Set<String>, lightOnly: Int64?, group: GroupID?, now: Date,
        in db: Database
    ) throws -> ([Job], (Int64, Int64)) {
        let before = try Self.lastSeq(db)
        let hosts = Self.jsonTexts(excludingHosts.sorted())
        let ids: [JobID]
        if let group {
            // A group's members share its priority: they are taken by id, from the group's index.
            ids = try JobID.fetchAll(
                db.cachedStatement(
                    sql: """
                        SELECT id FROM jobs INDEXED BY jobs_by_group_state
                        WHERE group_id = ? AND state = 'queued' AND host NOT IN (SELECT value FROM json_each(?))
                            AND (? IS NULL OR (CASE WHEN size IS NULL THEN received ELSE size - received END) <= ?)
                        ORDER BY id LIMIT ?
                        """),
                arguments: [group, hosts, lightOnly, lightOnly, limit])
        } else {
            // With hosts excluded, or only light jobs wanted, only the first `claimWindow`
            // queued jobs are looked at.
            let window = excludingHosts.isEmpty && lightOnly == nil ? limit : Self.claimWindow
            ids = try JobID.fetchAll(
                db.cachedStatement(
                    sql: """
                        SELECT id FROM (
                            SELECT id, host, priority, size, received FROM jobs INDEXED BY jobs_standalone_queue
                            WHERE state = 'queued' AND group_id IS NULL ORDER BY priority DESC, id LIMIT ?)
                        WHERE host NOT IN (SELECT value FROM json_each(?))
                            AND (? IS NULL OR (CASE WHEN size IS NULL THEN received ELSE size - received END) <= ?)
                        ORDER BY priority DESC, id LIMIT ?
                        """),
                arguments: [window, hosts, lightOnly, lightOnly, limit])
        }
        guard !ids.isEmpty else { return ([], (before, before)) }
        // What `StateMachine.apply(.start)` sets, plus the worker, its lease and a new epoch.
        try db.cachedStatement(
            sql: """
                UPDATE jobs SET state = 'running', attempts = attempts + 1, updated_at = ?, worker = ?, lease_until = ?,
                    epoch = epoch + 1, stop_request = NULL
                WHERE id IN (SELECT value FROM json_each(?))
                """
        ).execute(
            arguments: [now.timeIntervalSince1970, worker, leaseUntil.timeIntervalSince1970, RowSelection.jsonArray(ids)])
        try Self.recordStates(of: ids.sorted(), at: now, in: db)
        let statement = try db.cachedStatement(sql: "SELECT \(JobColumn.list) FROM jobs WHERE id = ?")
        let jobs = try ids.compactMap { try Self.job(statement, arguments: [$0]) }
        return (jobs, (before, try Self.lastSeq(db)))
    }

    /// Claims the jobs a worker started from a turn's `ready` rows, each only while it is still
    /// queued (what `claimRows` writes). Returns the ids claimed and the range of their events.
    private static func claimStarted(_ claim: TurnClaim, in db: Database) throws -> ([JobID], (Int64, Int64)) {
        let before = try Self.lastSeq(db)
        let ids = try JobID.fetchAll(
            db.cachedStatement(
                sql: """
                    UPDATE jobs SET state = 'running', attempts = attempts + 1, updated_at = ?, worker = ?, lease_until = ?,
                        epoch = epoch + 1, stop_request = NULL
                    WHERE id IN (SELECT value FROM json_each(?)) AND state = 'queued'
                    RETURNING id
                    """),
            arguments: [
                claim.now.timeIntervalSince1970, claim.worker, claim.leaseUntil.timeIntervalSince1970,
                RowSelection.jsonArray(claim.started),
            ]
        ).sorted()
        try Self.recordStates(of: ids, at: claim.now, in: db)
        return (ids, (before, try Self.lastSeq(db)))
    }

    /// Runs `body` with `synchronous=NORMAL`: its commit is not waited for on disk, and the
    /// writer is back to FULL afterwards, whatever `body` did. Only for a change that power
    /// loss may undo harmlessly; the next FULL commit makes it durable too (the WAL is synced
    /// in order).
    static func withoutWaitingForTheDisk<T>(_ db: Database, _ body: () throws -> T) throws -> T {
        try db.execute(sql: "PRAGMA synchronous = NORMAL")
        let result = Result { try body() }
        try db.execute(sql: "PRAGMA synchronous = FULL")
        return try result.get()
    }

    /// `body` in one transaction, returning its value.
    static func inTransaction<T>(_ db: Database, _ body: () throws -> T) throws -> T {
        var result: T?
        try db.inTransaction {
            result = try body()
            return .commit
        }
        guard let result else { throw DatabaseError(resultCode: .SQLITE_INTERNAL, message: "a transaction returned nothing") }
        return result
    }

    public func renewLeases(worker: String, until: Date, now: Date) async throws -> [JobID: Int64] {
        try await pool.write { db in
            try Self.heartbeat(worker, now: now, in: db)
            var epochs: [JobID: Int64] = [:]
            for row in try Row.fetchAll(
                db, sql: "UPDATE jobs SET lease_until = ? WHERE state = 'running' AND worker = ? RETURNING id, epoch",
                arguments: [until.timeIntervalSince1970, worker])
            {
                epochs[row["id"]] = row["epoch"]
            }
            return epochs
        }
    }

    public func expireLeases(now: Date) async throws -> BulkOutcome {
        let (outcome, range) = try await pool.write { db -> (BulkOutcome, (Int64, Int64)) in
            let before = try Self.lastSeq(db)
            let at = now.timeIntervalSince1970
            // A remove that waited for the owner: the row goes, with its partial file.
            try db.execute(
                sql: """
                    INSERT INTO events (at, kind, job_id, group_id, state)
                    SELECT ?, 'job.removed', id, group_id, 'removed' FROM jobs
                    WHERE state = 'running' AND lease_until < ? AND stop_request = 'remove' ORDER BY id
                    """,
                arguments: [at, at])
            var removed: [JobID] = []
            var files: [String] = []
            try Self.each(
                FilesColumn.self,
                db.makeStatement(
                    sql:
                        "DELETE FROM jobs WHERE state = 'running' AND lease_until < ? AND stop_request = 'remove' RETURNING \(FilesColumn.list)"
                ), arguments: [at]
            ) { row in
                removed.append(row.id)
                if let file = row.files.partial { files.append(file) }
            }
            // The rest: a pending pause or cancel is carried out, every other job is queued again.
            var canceled = FilesColumn.Canceled()
            var handed: [JobID] = []
            try Self.each(
                FilesColumn.self,
                db.makeStatement(
                    sql: """
                        UPDATE jobs SET state = \(OwnerRequests.expiredState),
                            finished_at = CASE WHEN stop_request = 'cancel' THEN ? ELSE finished_at END,
                            worker = NULL, lease_until = NULL, stop_request = NULL, epoch = epoch + 1, updated_at = ?
                        WHERE state = 'running' AND lease_until < ? RETURNING \(FilesColumn.list)
                        """), arguments: [at, at, at]
            ) { row in
                if row.files.state == .canceled { canceled.add(row) } else { handed.append(row.id) }
            }
            let (canceledIDs, canceledFiles) = canceled.result
            let changed = (handed + canceledIDs).sorted()
            try Self.recordStates(of: changed, at: now, in: db)
            let ids = (changed + removed).sorted()
            return (
                BulkOutcome(count: ids.count, ids: Array(ids.prefix(BulkOutcome.idsShown)), files: files + canceledFiles),
                (before, try Self.lastSeq(db))
            )
        }
        publishEvents(after: range.0, through: range.1)
        return outcome
    }

    @discardableResult
    public func releaseJobs(worker: String, now: Date) async throws -> [JobID] {
        let (ids, range) = try await pool.write { db -> ([JobID], (Int64, Int64)) in
            let before = try Self.lastSeq(db)
            let ids = try JobID.fetchAll(
                db,
                sql: """
                    UPDATE jobs SET state = 'queued', worker = NULL, lease_until = NULL, stop_request = NULL, epoch = epoch + 1,
                        updated_at = ?
                    WHERE state = 'running' AND worker = ? RETURNING id
                    """,
                arguments: [now.timeIntervalSince1970, worker]
            ).sorted()
            try Self.recordStates(of: ids, at: now, in: db)
            return (ids, (before, try Self.lastSeq(db)))
        }
        publishEvents(after: range.0, through: range.1)
        return ids
    }

    public func saveOwned(_ jobs: [Job], owner: String, publish: Bool) async throws -> (events: [StoredEvent], lost: Set<JobID>) {
        guard !jobs.isEmpty else { return ([], []) }
        let (events, lost) = try await pool.write { db -> ([StoredEvent], Set<JobID>) in
            var events: [StoredEvent] = []
            var lost: Set<JobID> = []
            let read = try db.cachedStatement(sql: "SELECT state, worker, epoch, stop_request FROM jobs WHERE id = ?")
            for job in jobs {
                guard let row = try Row.fetchOne(read, arguments: [job.id]) else {
                    lost.insert(job.id)
                    continue
                }
                let state: String = row["state"]
                guard Self.owns(row, job: job, owner: owner), !JobOwnership.overtakes(request: row["stop_request"], job: job) else {
                    lost.insert(job.id)
                    continue
                }
                try Self.update(job, in: db, owned: true)
                if state != job.state.rawValue {
                    events.append(
                        try Self.record(.jobState, job: job, groupID: job.groupID, state: job.state.rawValue, at: job.updatedAt, in: db))
                }
            }
            return (events, lost)
        }
        if publish { sink.publish(events) }
        return (events, lost)
    }

    /// Whether a row as stored (its state, worker and epoch) is still the attempt of `owner`
    /// that `job` comes from (a row running without a worker was started by a daemon that
    /// does not claim: it is anyone's).
    static func owns(_ row: Row, job: Job, owner: String) -> Bool {
        let worker: String? = row["worker"]
        let epoch: Int64 = row["epoch"]
        return JobOwnership.owns(state: row["state"], worker: worker, epoch: epoch, job: job, owner: owner)
    }

    public func workers(seenSince: Date) async throws -> [(id: String, seenAt: Date)] {
        try await pool.read { db in
            try Row.fetchAll(
                db, sql: "SELECT id, seen_at FROM workers WHERE seen_at >= ? ORDER BY id", arguments: [seenSince.timeIntervalSince1970]
            )
            .map { row in (id: row["id"], seenAt: Date(timeIntervalSince1970: row["seen_at"])) }
        }
    }

    /// Inserts the worker's row, or moves its `seen_at`.
    static func heartbeat(_ worker: String, now: Date, in db: Database) throws {
        try db.execute(
            sql: """
                INSERT INTO workers (id, started_at, seen_at) VALUES (?, ?, ?)
                ON CONFLICT (id) DO UPDATE SET seen_at = excluded.seen_at
                """,
            arguments: [worker, now.timeIntervalSince1970, now.timeIntervalSince1970])
    }

    /// SQLite has one daemon: its own commands reach its engine directly, so nothing ever
    /// needs to be signalled. The stream never yields; it ends when the store is closed.
    public func changes() -> AsyncStream<Void> {
        let (stream, continuation) = AsyncStream<Void>.makeStream()
        if !changeStreams.add(continuation) { continuation.finish() }
        return stream
    }

    /// A JSON array of texts, for `json_each`.
    static func jsonTexts(_ texts: [String]) -> String {
        (try? JSONEncoder().encode(texts)).map { String(decoding: $0, as: UTF8.self) } ?? "[]"
    }
}
