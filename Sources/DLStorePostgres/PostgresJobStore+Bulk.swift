import DLCore
import DLJobTable
import Foundation
import Logging
import PostgresNIO

extension PostgresJobStore {
    // MARK: Bulk commands: one statement, one transaction, whatever the count

    /// The SQL condition for a selection, its value bound in `binds`. Ids travel as one
    /// `bigint[]` parameter, so 100 000 ids are one parameter, not 100 000.
    private static func condition(_ selection: RowSelection, _ binds: inout Binds) -> String {
        switch selection {
        case .all: return "TRUE"
        case .ids(let ids): return "id = ANY(\(binds.ints(ids)))"
        case .group(let id): return "group_id = \(binds.int(id))"
        case .finished(let states, let before):
            let condition = "group_id IS NULL AND state = ANY(\(binds.texts(states.map(\.rawValue))))"
            guard let before else { return condition }
            return condition + " AND COALESCE(finished_at, updated_at) <= \(binds.double(before.timeIntervalSince1970))"
        }
    }

    /// The columns a command sets, in PostgreSQL's words; `now` and `startOver` are
    /// placeholders of bound values.
    private static func assignments(_ command: BulkCommand, now: String, startOver: String) -> String {
        command.assignments(now: now, startsOver: "error_code = ANY(\(startOver))", falseValue: "false")
    }

    public func apply(_ command: BulkCommand, to selection: RowSelection, first: [Job], owner: String?, now: Date) async throws
        -> BulkOutcome
    {
        let (outcome, range) = try await transaction { connection -> (BulkOutcome, (Int64, Int64)) in
            // The stopped transfers' rows, each only while it is still that attempt's.
            if let owner {
                let stored = try await Self.owners(of: first.map(\.id), on: connection, logger: logger)
                let mine = first.filter { job in
                    stored[job.id].map { JobOwnership.owns(state: $0.state, worker: $0.worker, epoch: $0.epoch, job: job, owner: owner) }
                        ?? false
                }
                try await Self.update(mine, on: connection, logger: logger, owned: true)
            } else {
                try await Self.update(first, on: connection, logger: logger)
            }
            var binds = Binds()
            let at = binds.double(now.timeIntervalSince1970)
            let startOver = binds.texts(BulkCommand.startOverCodes)
            let states = binds.texts(command.sources.map(\.rawValue))
            var condition = Self.condition(selection, &binds)
            if let owner { condition += " AND NOT \(OwnerRequests.elsewhere(owner: binds.text(owner)))" }
            let update =
                "UPDATE jobs SET \(Self.assignments(command, now: at, startOver: startOver)) WHERE state = ANY(\(states)) AND \(condition) RETURNING "
            var changedSet: Set<JobID> = []
            var files: [String] = []
            // The command here, then the requests for other workers' jobs, then the command here
            // again: each statement reads the rows as committed when it reaches them (READ
            // COMMITTED), so a job claimed by another worker between the two (queued at the
            // first, running elsewhere at the second) gets a request, and one that left another
            // worker meanwhile gets the command; in one pass it was missed by both and the
            // answered pause was lost (`make fleet-chaos`, seed 5).
            func applyHere() async throws {
                if command == .cancel {
                    // What a canceled job leaves on disk goes: read back with the rows.
                    var canceled = FilesColumn.Canceled()
                    for row in try await connection.rows(binds.query(update + FilesColumn.list), logger: logger) {
                        canceled.add(try FilesColumn.decode(row))
                    }
                    let (ids, removed) = canceled.result
                    changedSet.formUnion(ids)
                    files += removed
                } else {
                    changedSet.formUnion(
                        try await connection.rows(binds.query(update + "id"), logger: logger).map { try $0.decode(Int64.self) })
                }
            }
            try await applyHere()
            let requested = try await Self.requestOfOwners(command.stopRequest, selection, owner: owner, on: connection, logger: logger)
            if owner != nil { try await applyHere() }
            // With explicit ids every job must accept the command, as the engine checked before
            // the transaction; one that another worker moved since (it completed there) makes
            // the whole command fail, rolled back, as on one daemon: an answer of count 0 for a
            // job named by id said the pause was done when nothing was (`make fleet-chaos`).
            if case .ids(let ids) = selection,
                let row = try await connection.rows(
                    "SELECT id, state FROM jobs WHERE id = ANY(\(ids)) AND state = ANY(\(command.refusedStates.map(\.rawValue).sorted())) ORDER BY id LIMIT 1",
                    logger: logger
                ).first
            {
                let (id, state) = try row.decode((Int64, String).self)
                throw StoreError.refused(id: id, state: JobState(rawValue: state) ?? .failed, verb: command.event.verb)
            }
            let changed = changedSet.sorted()
            let range = try await Self.recordStates(of: changed, at: now, on: connection, logger: logger)
            return (
                BulkOutcome(count: changed.count, ids: Array(changed.prefix(BulkOutcome.idsShown)), files: files, requested: requested),
                range
            )
        }
        await publishEvents(after: range.0, through: range.1)
        return outcome
    }

    /// With `owner`: the selected jobs that another worker runs get `request` (a resume, nil,
    /// withdraws a pending pause); the caller's statement then leaves them out. Returns how
    /// many requests were recorded; their owners hear of them through `dld_jobs`.
    private static func requestOfOwners(
        _ request: StopRequest?, _ selection: RowSelection, owner: String?, on connection: PostgresConnection, logger: Logger
    ) async throws -> Int {
        guard let owner else { return 0 }
        var binds = Binds()
        let condition = Self.condition(selection, &binds)
        let requested: Int
        if let request {
            let elsewhere = OwnerRequests.elsewhere(owner: binds.text(owner))
            requested = try await connection.rows(
                binds.query(
                    "UPDATE jobs SET \(OwnerRequests.assignment(request)) WHERE \(elsewhere) AND \(condition) RETURNING id"),
                logger: logger
            ).count
        } else {
            requested = 0
            try await connection.run(
                binds.query("UPDATE jobs SET stop_request = NULL WHERE state = 'running' AND stop_request = 'pause' AND \(condition)"),
                logger: logger)
        }
        if requested > 0 { try await connection.run("SELECT pg_notify('dld_jobs', '')", logger: logger) }
        return requested
    }

    public func delete(_ selection: RowSelection, deleteFiles: Bool, owner: String?, now: Date) async throws -> BulkOutcome {
        let (outcome, range) = try await transaction { connection -> (BulkOutcome, (Int64, Int64)) in
            var binds = Binds()
            var condition = Self.condition(selection, &binds)
            if let owner { condition += " AND NOT \(OwnerRequests.elsewhere(owner: binds.text(owner)))" }
            var removed: [(id: JobID, group: GroupID?)] = []
            var rows: [JobFiles] = []
            // As `apply`: the delete, the requests, the delete again (a job claimed elsewhere in
            // between gets a request, one that left another worker is deleted).
            func deleteHere() async throws {
                for row in try await connection.rows(
                    binds.query("DELETE FROM jobs WHERE \(condition) RETURNING \(FilesColumn.list)"), logger: logger)
                {
                    let row = try FilesColumn.decode(row)
                    removed.append((row.id, row.groupID))
                    if row.files.fileDeleted(onRemove: deleteFiles) != nil { rows.append(row.files) }
                }
            }
            try await deleteHere()
            let requested = try await Self.requestOfOwners(.remove, selection, owner: owner, on: connection, logger: logger)
            if owner != nil { try await deleteHere() }
            removed.sort { $0.id < $1.id }
            let ids = removed.prefix(BulkOutcome.idsShown).map(\.id)
            guard !removed.isEmpty else { return (BulkOutcome(count: 0, ids: [], files: [], requested: requested), (0, 0)) }
            // A completed file's partial path is deleted too unless an unfinished job writes there.
            let completed = rows.filter { $0.state == .completed }.map { storedText($0.path) }
            var inUse: Set<String> = []
            if !completed.isEmpty {
                for row in try await connection.rows(
                    "SELECT DISTINCT path FROM jobs WHERE path = ANY(\(completed)) AND state NOT IN ('completed', 'failed', 'canceled')",
                    logger: logger)
                {
                    inUse.insert(try row.decode(String.self))
                }
            }
            let files = rows.flatMap { $0.filesDeleted(onRemove: deleteFiles, partialFree: !inUse.contains(storedText($0.path))) }
            let range = try await Self.recordRemoved(removed, at: now, on: connection, logger: logger)
            return (BulkOutcome(count: removed.count, ids: ids, files: files, requested: requested), range)
        }
        await publishEvents(after: range.0, through: range.1)
        return outcome
    }

    /// One `job.removed` event a row, in id order; returns the numbers they took. Group ids
    /// travel as 0 for none (ids start at 1): postgres-nio binds no arrays with NULLs in them.
    static func recordRemoved(_ removed: [(id: JobID, group: GroupID?)], at now: Date, on connection: PostgresConnection, logger: Logger)
        async throws -> (Int64, Int64)
    {
        guard !removed.isEmpty else { return (0, 0) }
        let last = try await Self.lockEvents(on: connection, logger: logger)
        try await connection.run(
            """
            INSERT INTO events (seq, at, kind, job_id, group_id, state)
            SELECT \(last) + u.n, \(now.timeIntervalSince1970), 'job.removed', u.id, NULLIF(u.g, 0), 'removed'
            FROM unnest(\(removed.map(\.id))::bigint[], \(removed.map { $0.group ?? 0 })::bigint[]) WITH ORDINALITY AS u(id, g, n)
            """,
            logger: logger)
        let through = last + Int64(removed.count)
        try await Self.pruneEvents(from: last, through: through, on: connection, logger: logger)
        return (last, through)
    }

    public func requeueDue(now: Date) async throws -> Int {
        try await requeueWaiting(reasons: WaitReason.allCases, dueBy: now.timeIntervalSince1970, now: now)
    }

    public func requeueWaiting(for reason: WaitReason, now: Date) async throws -> Int {
        try await requeueWaiting(reasons: [reason], dueBy: .greatestFiniteMagnitude, now: now)
    }

    /// Queues again the waiting jobs with one of `reasons` whose next attempt is due by `dueBy`.
    private func requeueWaiting(reasons: [WaitReason], dueBy: Double, now: Date) async throws -> Int {
        let (count, range) = try await transaction { connection -> (Int, (Int64, Int64)) in
            let at = now.timeIntervalSince1970
            let changed = try await connection.rows(
                """
                UPDATE jobs SET state = 'queued', wait_reason = NULL, next_attempt_at = NULL, updated_at = \(at)
                WHERE state = 'waiting' AND next_attempt_at <= \(dueBy) AND wait_reason = ANY(\(reasons.map(\.rawValue)))
                RETURNING id
                """,
                logger: logger
            ).map { try $0.decode(Int64.self) }
            return (changed.count, try await Self.recordStates(of: changed, at: now, on: connection, logger: logger))
        }
        await publishEvents(after: range.0, through: range.1)
        return count
    }
}
