import DLCore
import DLJobTable
import Foundation
import GRDB

extension RowSelection {
    /// The SQL condition and its arguments. Ids travel as one JSON array (`json_each`), so a
    /// list of 100 000 ids is one argument, not 100 000 host parameters.
    /// The condition names its argument `:selection`; `now` is passed as `:now` when given.
    func condition(now: Date? = nil) -> (sql: String, arguments: StatementArguments) {
        var arguments: StatementArguments = [:]
        if let now { _ = arguments.append(contentsOf: ["now": now.timeIntervalSince1970]) }
        switch self {
        case .all:
            return ("1", arguments)
        case .ids(let ids):
            _ = arguments.append(contentsOf: ["selection": Self.jsonArray(ids)])
            return ("id IN (SELECT value FROM json_each(:selection))", arguments)
        case .group(let id):
            _ = arguments.append(contentsOf: ["selection": id])
            return ("group_id = :selection", arguments)
        case .finished(let states, let before):
            let list = "[" + states.map { "\"\($0.rawValue)\"" }.joined(separator: ",") + "]"
            _ = arguments.append(contentsOf: ["selection": list])
            var sql = "group_id IS NULL AND state IN (SELECT value FROM json_each(:selection))"
            if let before {
                _ = arguments.append(contentsOf: ["before": before.timeIntervalSince1970])
                sql += " AND COALESCE(finished_at, updated_at) <= :before"
            }
            return (sql, arguments)
        }
    }

    static func jsonArray(_ ids: [JobID]) -> String {
        "[" + ids.map(String.init).joined(separator: ",") + "]"
    }
}

extension BulkCommand {
    /// The columns the command sets, in SQLite's words (`:now` is bound by the caller).
    var assignments: String {
        let startsOver = "error_code IN (" + Self.startOverCodes.map { "'\($0)'" }.joined(separator: ",") + ")"
        return assignments(now: ":now", startsOver: startsOver, falseValue: "0")
    }
}

extension SQLiteJobStore {
    // MARK: Bulk commands: one statement, one transaction, whatever the count

    /// For an explicit list: the first id that does not exist, and the first job whose state
    /// refuses the command (its states in `refused`). Reads one index range, not the rows.
    public func check(_ ids: [JobID], refused: Set<JobState>) async throws -> (missing: JobID?, refusedBy: (JobID, JobState)?) {
        try await pool.read { db in
            let list = RowSelection.jsonArray(ids)
            let missing = try JobID.fetchOne(
                db,
                sql:
                    "SELECT value FROM json_each(?) WHERE value NOT IN (SELECT id FROM jobs WHERE id IN (SELECT value FROM json_each(?))) LIMIT 1",
                arguments: [list, list])
            var refusedBy: (JobID, JobState)? = nil
            if !refused.isEmpty {
                let states = refused.map { "'\($0.rawValue)'" }.joined(separator: ",")
                if let row = try Row.fetchOne(
                    db,
                    sql:
                        "SELECT id, state FROM jobs WHERE id IN (SELECT value FROM json_each(?)) AND state IN (\(states)) ORDER BY id LIMIT 1",
                    arguments: [list]),
                    let state = JobState(rawValue: row["state"])
                {
                    refusedBy = (row["id"], state)
                }
            }
            return (missing, refusedBy)
        }
    }

    /// Applies `command` to every selected job in a state it changes, in one transaction, with
    /// one event per changed job. `first` rows (jobs whose transfers were just stopped, with
    /// their last checkpoint) are written in the same transaction, before the command, each
    /// only while it is still that attempt's. With `owner`, jobs that another worker runs get
    /// the command as a request (`OwnerRequests`), and a resume withdraws a pending pause.
    public func apply(_ command: BulkCommand, to selection: RowSelection, first: [Job], owner: String?, now: Date) async throws
        -> BulkOutcome
    {
        let (outcome, range) = try await pool.write { db -> (BulkOutcome, (Int64, Int64)) in
            let read = try db.cachedStatement(sql: "SELECT state, worker, epoch FROM jobs WHERE id = ?")
            // The stopped transfers' rows, each only while it is still that attempt's.
            for job in first {
                if let owner, let row = try Row.fetchOne(read, arguments: [job.id]), !Self.owns(row, job: job, owner: owner) { continue }
                try Self.update(job, in: db, owned: owner != nil)
            }
            let before = try Self.lastSeq(db)
            var (condition, arguments) = selection.condition(now: now)
            var requested = 0
            if let owner {
                _ = arguments.append(contentsOf: ["owner": owner])
                let elsewhere = OwnerRequests.elsewhere(owner: ":owner")
                if let request = command.stopRequest {
                    try db.execute(
                        sql: "UPDATE jobs SET \(OwnerRequests.assignment(request)) WHERE \(elsewhere) AND \(condition)",
                        arguments: arguments)
                    requested = db.changesCount
                } else {
                    try db.execute(
                        sql: "UPDATE jobs SET stop_request = NULL WHERE state = 'running' AND stop_request = 'pause' AND \(condition)",
                        arguments: arguments)
                }
                condition += " AND NOT \(elsewhere)"
            }
            let states = command.sources.map { "'\($0.rawValue)'" }.joined(separator: ",")
            let update = "UPDATE jobs SET \(command.assignments) WHERE state IN (\(states)) AND \(condition) RETURNING "
            var changed: [JobID] = []
            var files: [String] = []
            if command == .cancel {
                // What a canceled job leaves on disk goes: read back with the rows.
                var canceled = FilesColumn.Canceled()
                try Self.each(FilesColumn.self, db.makeStatement(sql: update + FilesColumn.list), arguments: arguments) {
                    canceled.add($0)
                }
                (changed, files) = canceled.result
            } else {
                changed = try JobID.fetchAll(db, sql: update + "id", arguments: arguments).sorted()
            }
            if case .ids(let ids) = selection, let refused = try Self.refused(ids, command, in: db) { throw refused }
            try Self.recordStates(of: changed, at: now, in: db)
            return (
                BulkOutcome(count: changed.count, ids: Array(changed.prefix(BulkOutcome.idsShown)), files: files, requested: requested),
                (before, try Self.lastSeq(db))
            )
        }
        publishEvents(after: range.0, through: range.1)
        return outcome
    }

    /// With explicit ids every job must accept the command, as the engine checked before the
    /// transaction; one that another worker moved since into a state that refuses it makes the
    /// whole command fail (`StoreError.refused`, the transaction rolled back), as on one daemon.
    static func refused(_ ids: [JobID], _ command: BulkCommand, in db: Database) throws -> StoreError? {
        let states = command.refusedStates.map { "'\($0.rawValue)'" }.sorted().joined(separator: ",")
        let found = try Row.fetchOne(
            db,
            sql:
                "SELECT id, state FROM jobs WHERE id IN (\(ids.map(String.init).joined(separator: ","))) AND state IN (\(states)) ORDER BY id LIMIT 1"
        )
        guard let found, let state = JobState(rawValue: found["state"]) else { return nil }
        return StoreError.refused(id: found["id"], state: state, verb: command.event.verb)
    }

    /// Deletes the selected job records in one transaction, with one `job.removed` event each.
    /// Returns the files to delete after the commit: the partial files of unfinished jobs,
    /// and with `deleteFiles` the files of completed ones (`JobFiles.filesDeleted`). With
    /// `owner`, a job that another worker runs is left to it, with a `remove` request.
    public func delete(_ selection: RowSelection, deleteFiles: Bool, owner: String?, now: Date) async throws -> BulkOutcome {
        let (outcome, range) = try await pool.write { db -> (BulkOutcome, (Int64, Int64)) in
            let before = try Self.lastSeq(db)
            var (condition, arguments) = selection.condition(now: now)
            var (deleteCondition, deleteArguments) = selection.condition()
            var requested = 0
            if let owner {
                let elsewhere = OwnerRequests.elsewhere(owner: ":owner")
                _ = arguments.append(contentsOf: ["owner": owner])
                try db.execute(
                    sql: "UPDATE jobs SET \(OwnerRequests.assignment(.remove)) WHERE \(elsewhere) AND \(condition)", arguments: arguments)
                requested = db.changesCount
                condition += " AND NOT \(elsewhere)"
                deleteCondition += " AND NOT \(elsewhere)"
                _ = deleteArguments.append(contentsOf: ["owner": owner])
            }
            try db.execute(
                sql: """
                    INSERT INTO events (at, kind, job_id, group_id, state)
                    SELECT :now, 'job.removed', id, group_id, 'removed' FROM jobs WHERE \(condition) ORDER BY id
                    """,
                arguments: arguments)
            var ids: [JobID] = []
            var rows: [JobFiles] = []
            var count = 0
            try Self.each(
                FilesColumn.self, db.makeStatement(sql: "DELETE FROM jobs WHERE \(deleteCondition) RETURNING \(FilesColumn.list)"),
                arguments: deleteArguments
            ) { row in
                count += 1
                if ids.count < BulkOutcome.idsShown { ids.append(row.id) }
                if row.files.fileDeleted(onRemove: deleteFiles) != nil { rows.append(row.files) }
            }
            // A completed file's partial path is deleted too unless an unfinished job writes there.
            let completed = rows.filter { $0.state == .completed }.map(\.path)
            let inUse = Set(try completed.filter { try Self.pathUser($0, in: db) != nil })
            let files = rows.flatMap { $0.filesDeleted(onRemove: deleteFiles, partialFree: !inUse.contains($0.path)) }
            let last = try Self.lastSeq(db)
            try Self.pruneEvents(through: before, in: db)
            ids.sort()
            return (
                BulkOutcome(count: count, ids: Array(ids.prefix(BulkOutcome.idsShown)), files: files, requested: requested), (before, last)
            )
        }
        publishEvents(after: range.0, through: range.1)
        return outcome
    }

    /// Waiting jobs whose time has come are queued again, in one statement.
    public func requeueDue(now: Date) async throws -> Int {
        try await requeueWaiting(where: "next_attempt_at <= ?", now.timeIntervalSince1970, now: now)
    }

    public func requeueWaiting(for reason: WaitReason, now: Date) async throws -> Int {
        try await requeueWaiting(where: "wait_reason = ?", reason.rawValue, now: now)
    }

    /// Queues again the waiting jobs that also meet `condition` (one `?`, bound to `value`).
    private func requeueWaiting(where condition: String, _ value: some DatabaseValueConvertible & Sendable, now: Date) async throws -> Int {
        let (count, range) = try await pool.write { db -> (Int, (Int64, Int64)) in
            let before = try Self.lastSeq(db)
            let changed = try JobID.fetchAll(
                db,
                sql: """
                    UPDATE jobs SET state = 'queued', wait_reason = NULL, next_attempt_at = NULL, updated_at = ?
                    WHERE state = 'waiting' AND \(condition) RETURNING id
                    """,
                arguments: [now.timeIntervalSince1970, value]
            ).sorted()
            try Self.recordStates(of: changed, at: now, in: db)
            return (changed.count, (before, try Self.lastSeq(db)))
        }
        publishEvents(after: range.0, through: range.1)
        return count
    }

    /// One `job.state` event per job, as the rows are now, in id order.
    static func recordStates(of ids: [JobID], at now: Date, in db: Database) throws {
        guard !ids.isEmpty else { return }
        let before = try lastSeq(db)
        try db.cachedStatement(
            sql: """
                INSERT INTO events (at, kind, job_id, group_id, state, wait_reason, error_code, error_message)
                SELECT ?, 'job.state', id, group_id, state, wait_reason, error_code, error_message
                FROM jobs WHERE id IN (SELECT value FROM json_each(?)) ORDER BY id
                """
        ).execute(arguments: [now.timeIntervalSince1970, RowSelection.jsonArray(ids)])
        try pruneEvents(through: before, in: db)
    }

    static func lastSeq(_ db: Database) throws -> Int64 {
        try Int64.fetchOne(db.cachedStatement(sql: "SELECT seq FROM events ORDER BY seq DESC LIMIT 1")) ?? 0
    }

    // MARK: Scheduling reads: indexed, bounded by what can start

    /// What can start next, in one read: queued standalone jobs in the scheduler's order
    /// (priority, then id; one walk of the (state, priority, id) index, at most `limit` rows),
    /// and the open groups with queued members that hold no slot yet, each placed by its first
    /// queued member. Groups are few next to jobs: one index look-up each.
    public func nextQueued(limit: Int, excludingGroups active: Set<GroupID>) async throws -> (
        jobs: [Job], groups: [(entry: QueueEntry, groupID: GroupID)]
    ) {
        try await pool.read { db in
            let jobs = try Self.jobs(
                db.cachedStatement(
                    sql: """
                        SELECT \(JobColumn.list) FROM jobs INDEXED BY jobs_standalone_queue
                        WHERE state = 'queued' AND group_id IS NULL ORDER BY priority DESC, id LIMIT ?
                        """),
                arguments: [limit])
            return (jobs, try Self.queuedGroups(excluding: active, in: db))
        }
    }

    /// The open groups not in `active` with queued members, each placed by its first queued
    /// member.
    static func queuedGroups(excluding active: Set<GroupID>, in db: Database) throws -> [(entry: QueueEntry, groupID: GroupID)] {
        try Row.fetchAll(
            db.cachedStatement(
                sql: """
                    SELECT g.id AS group_id, g.priority AS priority,
                        (SELECT MIN(j.id) FROM jobs j WHERE j.group_id = g.id AND j.state = 'queued') AS first
                    FROM groups g WHERE g.closed IS NULL
                    """)
        ).compactMap { row -> (entry: QueueEntry, groupID: GroupID)? in
            let group: GroupID = row["group_id"]
            guard !active.contains(group), let first: JobID = row["first"] else { return nil }
            return (QueueEntry(id: first, priority: row["priority"]), group)
        }
    }

    /// What a turn of the queue needs of a group, in one read: the group and its members'
    /// counts by state (see `JobTable.groupTurn`: while members are queued or running, only
    /// whether there are any, two index look-ups whatever the group's size).
    public func groupTurn(_ id: GroupID) async throws -> (group: JobGroup?, counts: [JobState: Int]) {
        try await pool.read { db in
            guard
                let group = try Self.rows(
                    GroupColumn.self, db.cachedStatement(sql: "SELECT \(GroupColumn.list) FROM groups WHERE id = ?"), arguments: [id]
                ).first
            else {
                return (nil, [:])
            }
            let open = try Row.fetchOne(
                db.cachedStatement(
                    sql: """
                        SELECT EXISTS (SELECT 1 FROM jobs WHERE group_id = ?1 AND state = 'queued') AS queued,
                            EXISTS (SELECT 1 FROM jobs WHERE group_id = ?1 AND state = 'running') AS running
                        """), arguments: [id])
            let queued: Bool = open?["queued"] ?? false
            let running: Bool = open?["running"] ?? false
            if queued || running {
                return (group, [.queued: queued ? 1 : 0, .running: running ? 1 : 0].filter { $0.value > 0 })
            }
            var counts: [JobState: Int] = [:]
            for row in try Row.fetchAll(
                db.cachedStatement(sql: "SELECT state, COUNT(*) AS n FROM jobs WHERE group_id = ? GROUP BY state"), arguments: [id])
            {
                if let state = JobState(rawValue: row["state"]) { counts[state, default: 0] += row["n"] as Int }
            }
            return (group, counts)
        }
    }

    /// How many members of a group are in each state.
    public func memberCounts(of id: GroupID) async throws -> [JobState: Int] {
        try await pool.read { db in
            var counts: [JobState: Int] = [:]
            for row in try Row.fetchAll(
                db.cachedStatement(sql: "SELECT state, COUNT(*) AS n FROM jobs WHERE group_id = ? GROUP BY state"), arguments: [id])
            {
                if let state = JobState(rawValue: row["state"]) { counts[state, default: 0] += row["n"] as Int }
            }
            return counts
        }
    }

    /// The first failed member of a group.
    public func firstFailedMember(of id: GroupID) async throws -> Job? {
        try await pool.read { db in
            try Self.jobs(
                db.cachedStatement(sql: "SELECT \(JobColumn.list) FROM jobs WHERE group_id = ? AND state = 'failed' ORDER BY id LIMIT 1"),
                arguments: [id]
            ).first
        }
    }

    public func completed(since: Date, limit: Int) async throws -> [Job] {
        try await pool.read { db in
            try Self.jobs(
                db.cachedStatement(
                    sql: """
                        SELECT \(JobColumn.list) FROM jobs WHERE state = 'completed' AND finished_at >= ?
                        ORDER BY finished_at DESC LIMIT ?
                        """),
                arguments: [since.timeIntervalSince1970, limit])
        }
    }

    /// A page of rows that start-up reconciliation looks at: every row that may have a file on
    /// disk (finished, or started at least once), by ascending id.
    public func reconcilePage(afterID: JobID, limit: Int) async throws -> [Job] {
        try await pool.read { db in
            try Self.jobs(
                db.cachedStatement(
                    sql: """
                        SELECT \(JobColumn.list) FROM jobs WHERE id > ?
                            AND (state IN ('running', 'completed', 'canceled') OR attempts > 0 OR received > 0)
                        ORDER BY id LIMIT ?
                        """),
                arguments: [afterID, limit])
        }
    }
}
