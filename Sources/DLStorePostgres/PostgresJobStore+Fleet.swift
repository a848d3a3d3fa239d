import DLCore
import DLJobTable
import Foundation
import Logging
import PostgresNIO

/// The fleet primitives of `JobTable`: several daemons claim from one queue, each job on one
/// worker at a time, held by a lease that its worker renews.
extension PostgresJobStore {
    public var sharesQueue: Bool { true }

    /// One statement: the SELECT walks `jobs_queued` (the scheduler's partial index) in
    /// order and locks the rows it takes; `SKIP LOCKED` passes over rows another daemon is
    /// claiming at this moment instead of waiting for them, and a row that another claim
    /// committed as `running` meanwhile no longer matches `state = 'queued'` when it is
    /// locked (READ COMMITTED rechecks the row's newest version). So two claims never take
    /// the same job, and neither waits for the other. The SELECT is a MATERIALIZED CTE, run
    /// once: as a plain `id IN (SELECT … LIMIT n)` the planner may run it again for each row
    /// of a join, and then its LIMIT no longer bounds the claim (seen here: 4 rows for 3).
    /// While hosts are excluded, the rows looked at are the first `claimWindow` queued ones.
    /// Each claimed row gets a new epoch, and a lease on the server's clock (`serverNow`).
    public func claim(
        limit: Int, worker: String, leaseUntil: Date, excludingHosts: Set<String>, lightOnly: Int64?, group: GroupID?, now: Date
    ) async throws -> [Job] {
        guard limit > 0 else { return [] }
        return try await eventTransaction(publish: true, events: { $0.events }) { connection -> (jobs: [Job], events: [StoredEvent]) in
            let at = now.timeIntervalSince1970
            let hosts = excludingHosts.sorted().map(storedText)
            let light = lightOnly
            let window =
                group != nil || (hosts.isEmpty && light == nil)
                ? ""
                : """
                AND id IN (SELECT id FROM jobs WHERE state = 'queued' AND group_id IS NULL
                           ORDER BY priority DESC, id LIMIT \(Self.claimWindow))
                """
            var jobs = try await connection.rows(
                """
                WITH picked AS MATERIALIZED (
                    SELECT id FROM jobs
                    WHERE state = 'queued' AND \(unescaped: group.map { "group_id = \($0)" } ?? "group_id IS NULL") AND host <> ALL(\(hosts))
                        \(unescaped: window) \(unescaped: light.map { "AND (CASE WHEN size IS NULL THEN received ELSE size - received END) <= \($0)" } ?? "")
                    ORDER BY priority DESC, id LIMIT \(Int64(limit))
                    FOR UPDATE SKIP LOCKED)
                UPDATE jobs SET state = 'running', attempts = attempts + 1, updated_at = \(at),
                    worker = \(text: worker), lease_until = \(unescaped: Self.serverNow) + \(leaseUntil.timeIntervalSince(now)),
                    epoch = epoch + 1, stop_request = NULL
                WHERE state = 'queued' AND id IN (SELECT id FROM picked)
                RETURNING \(unescaped: JobColumn.list)
                """,
                logger: logger
            ).map(JobColumn.decode)
            jobs.sort { ($0.priority, -$0.id) > ($1.priority, -$1.id) }
            let events = try await Self.record(
                jobs.sorted { $0.id < $1.id }.map {
                    StoredEvent(seq: 0, at: now, kind: .jobState, jobID: $0.id, groupID: $0.groupID, state: $0.state.rawValue)
                },
                on: connection, logger: logger)
            return (jobs, events)
        }.jobs
    }

    /// The server's clock in seconds, as leases are written and judged: each worker's clock
    /// may be wrong, the table's is the one they share.
    static let serverNow = "extract(epoch FROM clock_timestamp())::float8"

    public func renewLeases(worker: String, until: Date, now: Date) async throws -> [JobID: Int64] {
        try await transaction { connection in
            try await Self.heartbeat(worker, now: now, on: connection, logger: logger)
            var epochs: [JobID: Int64] = [:]
            for row in try await connection.rows(
                """
                UPDATE jobs SET lease_until = \(unescaped: Self.serverNow) + \(until.timeIntervalSince(now))
                WHERE state = 'running' AND worker = \(text: worker) RETURNING id, epoch
                """,
                logger: logger)
            {
                let (id, epoch) = try row.decode((Int64, Int64).self)
                epochs[id] = epoch
            }
            return epochs
        }
    }

    /// Leases are judged on the server's clock (`now` is not used): a worker whose clock is
    /// ahead never ends another's lease early.
    public func expireLeases(now: Date) async throws -> BulkOutcome {
        let at = now.timeIntervalSince1970
        let (outcome, range) = try await transaction { connection -> (BulkOutcome, (Int64, Int64)) in
            let expired = "state = 'running' AND lease_until < \(Self.serverNow)"
            // A remove that waited for the owner: the row goes, with its partial file.
            var removed: [(id: JobID, group: GroupID?)] = []
            var files: [String] = []
            for row in try await connection.rows(
                "DELETE FROM jobs WHERE \(unescaped: expired) AND stop_request = 'remove' RETURNING \(unescaped: FilesColumn.list)",
                logger: logger)
            {
                let row = try FilesColumn.decode(row)
                removed.append((row.id, row.groupID))
                if let file = row.files.partial { files.append(file) }
            }
            // The rest: a pending pause or cancel is carried out, every other job is queued again.
            // Not a row whose remove was committed after the DELETE above looked (this UPDATE
            // waited for its lock and reads the row as that command left it): queued, it would
            // lose an answered remove; the next turn deletes it.
            var canceled = FilesColumn.Canceled()
            var handed: [JobID] = []
            for row in try await connection.rows(
                """
                UPDATE jobs SET state = \(unescaped: OwnerRequests.expiredState),
                    finished_at = CASE WHEN stop_request = 'cancel' THEN \(at) ELSE finished_at END,
                    worker = NULL, lease_until = NULL, stop_request = NULL, epoch = epoch + 1, updated_at = \(at)
                WHERE \(unescaped: expired) AND stop_request IS DISTINCT FROM 'remove' RETURNING \(unescaped: FilesColumn.list)
                """,
                logger: logger)
            {
                let row = try FilesColumn.decode(row)
                if row.files.state == .canceled { canceled.add(row) } else { handed.append(row.id) }
            }
            let (canceledIDs, canceledFiles) = canceled.result
            let changed = (handed + canceledIDs).sorted()
            var range = try await Self.recordStates(of: changed, at: now, on: connection, logger: logger)
            if !removed.isEmpty {
                removed.sort { $0.id < $1.id }
                let through = try await Self.recordRemoved(removed, at: now, on: connection, logger: logger)
                range = (changed.isEmpty ? through.0 : range.0, through.1)
            }
            let ids = (changed + removed.map(\.id)).sorted()
            return (BulkOutcome(count: ids.count, ids: Array(ids.prefix(BulkOutcome.idsShown)), files: files + canceledFiles), range)
        }
        await publishEvents(after: range.0, through: range.1)
        return outcome
    }

    @discardableResult
    public func releaseJobs(worker: String, now: Date) async throws -> [JobID] {
        let (ids, range) = try await transaction { connection -> ([JobID], (Int64, Int64)) in
            let ids = try await connection.rows(
                """
                UPDATE jobs SET state = 'queued', worker = NULL, lease_until = NULL, stop_request = NULL, epoch = epoch + 1,
                    updated_at = \(now.timeIntervalSince1970)
                WHERE state = 'running' AND worker = \(text: worker) RETURNING id
                """,
                logger: logger
            ).map { try $0.decode(Int64.self) }.sorted()
            return (ids, try await Self.recordStates(of: ids, at: now, on: connection, logger: logger))
        }
        await publishEvents(after: range.0, through: range.1)
        return ids
    }

    public func saveOwned(_ jobs: [Job], owner: String, publish: Bool) async throws -> (events: [StoredEvent], lost: Set<JobID>) {
        guard !jobs.isEmpty else { return ([], []) }
        return try await eventTransaction(publish: publish, events: { $0.events }) {
            connection -> (events: [StoredEvent], lost: Set<JobID>) in
            // Row locks in id order, as every saver takes them: a claim, a command or another
            // worker's save that comes after sees these rows as written here.
            let stored = try await Self.owners(of: jobs.map(\.id), on: connection, logger: logger)
            var lost: Set<JobID> = []
            var owned: [Job] = []
            for job in jobs {
                guard let row = stored[job.id],
                    JobOwnership.owns(state: row.state, worker: row.worker, epoch: row.epoch, job: job, owner: owner),
                    !JobOwnership.overtakes(request: row.request, job: job)
                else {
                    lost.insert(job.id)
                    continue
                }
                owned.append(job)
            }
            try await Self.update(owned, on: connection, logger: logger, owned: true)
            var changes: [StoredEvent] = []
            var state = stored.mapValues(\.state)
            for job in owned where state[job.id] != job.state.rawValue {
                state[job.id] = job.state.rawValue
                changes.append(
                    StoredEvent(
                        seq: 0, at: job.updatedAt, kind: .jobState, jobID: job.id, groupID: job.groupID, state: job.state.rawValue,
                        waitReason: job.waitReason, error: job.error))
            }
            return (try await Self.record(changes, on: connection, logger: logger), lost)
        }
    }

    public func serverClock() async throws -> Date? {
        let seconds = try await rows("SELECT extract(epoch FROM clock_timestamp())::float8").first?.decode(Double.self)
        return seconds.map(Date.init(timeIntervalSince1970:))
    }

    public func workers(seenSince: Date) async throws -> [(id: String, seenAt: Date)] {
        try await rows("SELECT id, seen_at FROM workers WHERE seen_at >= \(seenSince.timeIntervalSince1970) ORDER BY id").map { row in
            let (id, seen) = try row.decode((String, Double).self)
            return (id: id, seenAt: Date(timeIntervalSince1970: seen))
        }
    }

    /// Inserts the worker's row, or moves its `seen_at` (what `stats` shows of the workers;
    /// the engine gives its clock moved by the table's, `leaseNow`).
    static func heartbeat(_ worker: String, now: Date, on connection: PostgresConnection, logger: Logger) async throws {
        let at = now.timeIntervalSince1970
        try await connection.run(
            """
            INSERT INTO workers (id, started_at, seen_at) VALUES (\(text: worker), \(at), \(at))
            ON CONFLICT (id) DO UPDATE SET seen_at = EXCLUDED.seen_at
            """,
            logger: logger)
    }

    /// The rows' state, worker and epoch, locked in id order, as every saver takes them: a
    /// claim, a command or another worker's save that comes after sees them as written here.
    static func owners(of ids: [JobID], on connection: PostgresConnection, logger: Logger) async throws
        -> [JobID: (state: String, worker: String?, epoch: Int64, request: String?)]
    {
        var stored: [JobID: (state: String, worker: String?, epoch: Int64, request: String?)] = [:]
        guard !ids.isEmpty else { return stored }
        for row in try await connection.rows(
            "SELECT id, state, worker, epoch, stop_request FROM jobs WHERE id = ANY(\(ids)) ORDER BY id FOR UPDATE", logger: logger)
        {
            let (id, state, worker, epoch, request) = try row.decode((Int64, String, String?, Int64, String?).self)
            stored[id] = (state, worker, epoch, request)
        }
        return stored
    }
}
