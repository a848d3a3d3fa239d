import DLCore
import DLJobTable
import Foundation
import Logging
import PostgresNIO

extension PostgresJobStore {
    // MARK: Inserts

    public func insert(_ jobs: [NewJob], now: Date) async throws -> [InsertOutcome] {
        let (outcomes, events) = try await transaction { connection in
            try await Self.insert(jobs, groupID: nil, now: now, on: connection, logger: logger)
        }
        await published(events)
        return outcomes
    }

    /// Creates jobs with the SQLite store's rules, set-based: one read of the keys and one of
    /// the paths that the request names, then the decisions in order (a key that exists, in
    /// the table or earlier in the request, returns that job; a path that an unfinished job
    /// writes to, in the table or earlier in the request, refuses the whole insert), then the
    /// rows in a few statements and their events.
    ///
    /// The checks and the writes must not interleave with another daemon's, or two jobs could
    /// take one path: inserts hold `LockKey.inserts` until they commit, one at a time across
    /// the fleet, as behind SQLite's single writer. They take it first, and the event lock
    /// last, so no two transactions wait for each other's locks.
    static func insert(
        _ jobs: [NewJob], groupID: GroupID?, now: Date, on connection: PostgresConnection, logger: Logger
    ) async throws -> (outcomes: [InsertOutcome], events: [StoredEvent]) {
        guard !jobs.isEmpty else { return ([], []) }
        try await connection.run("SELECT pg_advisory_xact_lock(\(LockKey.inserts))", logger: logger)
        var existing: [String: Job] = [:]
        let keys = Array(Set(jobs.compactMap { $0.key.map(storedText) }))
        if !keys.isEmpty {
            for row in try await connection.rows("SELECT \(unescaped: JobColumn.list) FROM jobs WHERE key = ANY(\(keys))", logger: logger) {
                let job = try JobColumn.decode(row)
                if let key = job.key { existing[key] = job }
            }
        }
        var pathUsers: [String: JobID] = [:]
        let paths = Array(Set(jobs.map { storedText($0.path) }))
        for row in try await connection.rows(
            """
            SELECT path, MIN(id) FROM jobs WHERE path = ANY(\(paths)) AND state NOT IN ('completed', 'failed', 'canceled')
            GROUP BY path
            """,
            logger: logger)
        {
            let (path, id) = try row.decode((String, Int64).self)
            pathUsers[path] = id
        }

        enum Decision {
            case existing(Job)
            /// Created: its place in `creates`.
            case created(Int)
            /// Its key is that of a job created earlier in this request.
            case sameAs(Int)
        }
        var decisions: [Decision] = []
        decisions.reserveCapacity(jobs.count)
        var creates: [NewJob] = []
        var createdKeys: [String: Int] = [:]
        var createdPaths: [String: Int] = [:]
        for new in jobs {
            let key = new.key.map(storedText)
            if let key, let earlier = createdKeys[key] {
                decisions.append(.sameAs(earlier))
                continue
            }
            if let key, let job = existing[key] {
                decisions.append(.existing(job))
                continue
            }
            let path = storedText(new.path)
            if let other = pathUsers[path] {
                throw StoreError.pathInUse(path: new.path, by: other)
            }
            if let earlier = createdPaths[path] {
                // The earlier job of this request would have had its id by now.
                let ids = try await allocateIDs(earlier + 1, on: connection, logger: logger)
                throw StoreError.pathInUse(path: new.path, by: ids[earlier])
            }
            if let key { createdKeys[key] = creates.count }
            if !new.state.isFinished { createdPaths[path] = creates.count }
            decisions.append(.created(creates.count))
            creates.append(new)
        }

        let ids = try await allocateIDs(creates.count, on: connection, logger: logger)
        let at = now.timeIntervalSince1970
        let records = zip(ids, creates).map { InsertRecord(id: $0, $1, groupID: groupID, at: at) }
        let set = InsertRecord.set
        for chunk in try set.chunks(records) {
            var binds = Binds()
            let json = binds.json(chunk)
            try await connection.run(
                binds.query("INSERT INTO jobs (\(set.names)) SELECT \(set.names) FROM \(set.source(json))"), logger: logger)
        }
        var created: [Job] = []
        created.reserveCapacity(creates.count)
        for (id, new) in zip(ids, creates) {
            created.append(new.created(id: id, groupID: groupID, now: now))
        }
        let events = try await record(
            created.map { StoredEvent(seq: 0, at: now, kind: .jobState, jobID: $0.id, groupID: groupID, state: $0.state.rawValue) },
            on: connection, logger: logger)
        let outcomes = decisions.map { decision -> InsertOutcome in
            switch decision {
            case .existing(let job): return InsertOutcome(job: job, created: false)
            case .created(let index): return InsertOutcome(job: created[index], created: true)
            case .sameAs(let index): return InsertOutcome(job: created[index], created: false)
            }
        }
        return (outcomes, events)
    }

    /// `count` new job ids, ascending: a request's jobs get ids in its order.
    private static func allocateIDs(_ count: Int, on connection: PostgresConnection, logger: Logger) async throws -> [JobID] {
        guard count > 0 else { return [] }
        return try await connection.rows(
            "SELECT nextval(pg_get_serial_sequence('jobs', 'id')) FROM generate_series(1, \(Int64(count)))", logger: logger
        ).map { try $0.decode(Int64.self) }.sorted()
    }

    // MARK: Whole rows

    @discardableResult
    public func save(_ jobs: [Job], publish: Bool) async throws -> [StoredEvent] {
        guard !jobs.isEmpty else { return [] }
        return try await eventTransaction(publish: publish, events: { $0 }) { connection in
            // Row locks in id order, as every saver takes them, and the states before.
            var state: [JobID: String] = [:]
            for row in try await connection.rows(
                "SELECT id, state FROM jobs WHERE id = ANY(\(jobs.map(\.id))) ORDER BY id FOR UPDATE", logger: logger)
            {
                let (id, before) = try row.decode((Int64, String).self)
                state[id] = before
            }
            try await Self.update(jobs, on: connection, logger: logger)
            // An event for each row whose state changed, in the order given (a row that is
            // not there gets one too, as in the SQLite store).
            var changes: [StoredEvent] = []
            for job in jobs where state[job.id] != job.state.rawValue {
                if state[job.id] != nil { state[job.id] = job.state.rawValue }
                changes.append(
                    StoredEvent(
                        seq: 0, at: job.updatedAt, kind: .jobState, jobID: job.id, groupID: job.groupID, state: job.state.rawValue,
                        waitReason: job.waitReason, error: job.error))
            }
            return try await Self.record(changes, on: connection, logger: logger)
        }
    }

    /// A transaction that writes events. With `publish` they reach the sink after the commit,
    /// before this returns; without, they are held from before the COMMIT (the event reader
    /// stops before them) until the caller hands them to `publishEvents`.
    func eventTransaction<T: Sendable>(
        publish: Bool, events: (T) -> [StoredEvent], _ body: (PostgresConnection) async throws -> T
    ) async throws -> T {
        var held: [StoredEvent] = []
        do {
            let value = try await transaction { connection in
                let value = try await body(connection)
                if !publish {
                    held = events(value)
                    follower.hold(held)
                }
                return value
            }
            if publish { await published(events(value)) }
            return value
        } catch {
            follower.unhold(held)
            throw error
        }
    }

    /// Writes whole rows (all but id, created_at, group_id and host, as the SQLite store), many
    /// a statement. A row given twice is written twice, in order: a statement never holds the
    /// same id twice (PostgreSQL would apply only one of them).
    /// `owned`: the writes of a worker's own attempts, which leave the URL, headers and options
    /// as the table has them (only `revise` changes those; see the SQLite store's `update`).
    static func update(_ jobs: [Job], on connection: PostgresConnection, logger: Logger, owned: Bool = false) async throws {
        guard !jobs.isEmpty else { return }
        let set = UpdateRecord.set
        let revised: Set<String> = owned ? ["url", "headers", "options"] : []
        // A worker holds a job only while it runs it; only claims and renewals write leases.
        let assignments =
            (set.columns.dropFirst().filter { !revised.contains($0.name) }.map { "\($0.name) = r.\($0.name)" }
            + ["worker", "lease_until", "stop_request"].map { "\($0) = CASE WHEN r.state = 'running' THEN j.\($0) END" })
            .joined(separator: ", ")
        var start = 0
        while start < jobs.count {
            var seen: Set<JobID> = []
            var end = start
            while end < jobs.count, seen.insert(jobs[end].id).inserted { end += 1 }
            for chunk in try set.chunks(jobs[start..<end].map(UpdateRecord.init)) {
                var binds = Binds()
                let json = binds.json(chunk)
                try await connection.run(
                    binds.query("UPDATE jobs AS j SET \(assignments) FROM \(set.source(json)) WHERE j.id = r.id"), logger: logger)
            }
            start = end
        }
    }

    @discardableResult
    public func checkpoint(
        _ id: JobID, received: Int64, size: Int64?, validators: Validators, finalURL: String?, segments: String?, now: Date,
        owner: JobOwner?
    ) async throws -> CheckpointAnswer {
        let rows = try await rows(
            """
            UPDATE jobs SET progress_at = CASE WHEN \(received)::bigint > received THEN \(now.timeIntervalSince1970) ELSE progress_at END,
                received = \(received), size = \(size), etag = \(text: validators.etag), last_modified = \(text: validators.lastModified),
                accepts_ranges = \(validators.acceptsRanges), final_url = COALESCE(\(text: finalURL), final_url),
                segments = \(text: segments), partial_tag = COALESCE(\(text: owner?.tag), partial_tag)
            WHERE id = \(id) AND state = 'running'
                AND (\(text: owner?.worker)::text IS NULL OR (worker = \(text: owner?.worker) AND epoch = \(owner?.epoch ?? 0)))
            RETURNING stop_request
            """
        )
        guard let row = rows.first else { return CheckpointAnswer(written: false) }
        return CheckpointAnswer(written: true, stopRequest: try row.decode(String?.self).flatMap(StopRequest.init(rawValue:)))
    }

    /// Reads the row (locked) and writes the revised columns (url, headers, mirrors, options)
    /// in one transaction; see `JobTable.revise`. The worker that runs the job hears of it
    /// (`dld_jobs`) and takes a new limit at once.
    public func revise(_ id: JobID, _ revision: JobRevision, expecting: (state: JobState, epoch: Int64)?, now: Date) async throws -> Job? {
        try await transaction { connection -> Job? in
            guard
                let row = try await connection.rows(
                    "SELECT \(unescaped: JobColumn.list) FROM jobs WHERE id = \(id) FOR UPDATE", logger: logger
                )
                .first
            else { return nil }
            let stored = try JobColumn.decode(row)
            guard JobRevision.matches(stored, expecting) else { return nil }
            var job = revision.applied(to: stored)
            job.updatedAt = now
            if expecting != nil { job.epoch += 1 }
            try await connection.run(
                """
                UPDATE jobs SET url = \(text: job.url), headers = \(text: ColumnCoding.headers(job.headers)),
                    mirrors = \(text: ColumnCoding.mirrors(job)), options = \(text: ColumnCoding.options(job.options)),
                    updated_at = \(now.timeIntervalSince1970), epoch = \(job.epoch)
                WHERE id = \(id)
                """,
                logger: logger)
            try await connection.run("SELECT pg_notify('dld_jobs', '')", logger: logger)
            return job
        }
    }

    /// One statement for every record, in a transaction committed with `synchronous_commit =
    /// off`: the commit does not wait for the server's WAL flush (a crash of the server may
    /// lose it, never corrupt anything), which costs the daemon nothing four times a second.
    /// The record is only trusted in the boot that wrote it anyway.
    @discardableResult
    public func recordUnsynced(_ records: [UnsyncedRecord], owner: String?) async throws -> Int {
        guard !records.isEmpty else { return 0 }
        let logger = self.logger
        return try await transaction { connection in
            try await connection.run("SET LOCAL synchronous_commit = off", logger: logger)
            var binds = Binds()
            let ids = binds.ints(records.map(\.id))
            let epochs = binds.ints(records.map(\.epoch))
            let texts = binds.texts(records.map(\.progress.encoded))
            let worker = binds.text(owner)
            return try await connection.rows(
                binds.query(
                    """
                    UPDATE jobs AS j SET unsynced = r.unsynced
                    FROM unnest(\(ids)::bigint[], \(epochs)::bigint[], \(texts)::text[]) AS r(id, epoch, unsynced)
                    WHERE j.id = r.id AND j.state = 'running'
                        AND (\(worker)::text IS NULL OR (j.worker = \(worker) AND j.epoch = r.epoch))
                    RETURNING j.id
                    """),
                logger: logger
            ).count
        }
    }

    // MARK: Groups

    public func insertGroup(
        name: String, dir: String, priority: Int, members: [NewJob], hls: String?, now: Date
    ) async throws -> (JobGroup, [Job]) {
        let (group, jobs, events) = try await transaction { connection in
            let id =
                try await connection.rows("SELECT nextval(pg_get_serial_sequence('groups', 'id'))", logger: logger)
                .first?.decode(Int64.self) ?? 0
            guard id > 0 else { throw PostgresStoreError("PostgreSQL gave no group id") }
            let staging = JobGroup.stagingFolder(for: dir, id: id)
            let at = now.timeIntervalSince1970
            try await connection.run(
                """
                INSERT INTO groups (id, name, dir, staging, priority, created_at, updated_at, hls)
                VALUES (\(id), \(text: name), \(text: dir), \(text: staging), \(priority), \(at), \(at), \(text: hls))
                """,
                logger: logger)
            let group = JobGroup(
                id: id, name: name, dir: dir, staging: staging, priority: priority, createdAt: now, updatedAt: now, hls: hls)
            let staged = NewJob.staged(members, dir: dir, staging: staging)
            let (outcomes, events) = try await Self.insert(staged, groupID: id, now: now, on: connection, logger: logger)
            return (group, outcomes.map(\.job), events)
        }
        await published(events)
        return (group, jobs)
    }

    @discardableResult
    public func saveGroup(_ group: JobGroup, members: [Job], publish: Bool) async throws -> [StoredEvent] {
        try await eventTransaction(publish: publish, events: { $0 }) { connection -> [StoredEvent] in
            try await Self.update(members, on: connection, logger: logger)
            let row = try await connection.rows("SELECT closed, error_code FROM groups WHERE id = \(group.id) FOR UPDATE", logger: logger)
                .first
            let (before, errorBefore) = try row?.decode((String?, String?).self) ?? (nil, nil)
            try await connection.run(
                """
                UPDATE groups SET name = \(text: group.name), dir = \(text: group.dir), staging = \(text: group.staging),
                    priority = \(group.priority), closed = \(text: group.closed?.rawValue), error_code = \(text: group.error?.code),
                    error_message = \(text: group.error?.message), updated_at = \(group.updatedAt.timeIntervalSince1970),
                    finished_at = \(group.finishedAt?.timeIntervalSince1970)
                WHERE id = \(group.id)
                """,
                logger: logger)
            let state: String
            if group.closed == nil, errorBefore == nil, group.error != nil {
                // Its publish failed (a file appeared in the folder): it is `failed` until resumed.
                state = "failed"
            } else if let closed = group.closed, before != closed.rawValue {
                state = closed.rawValue
            } else {
                return []
            }
            return try await Self.record(
                [StoredEvent(seq: 0, at: group.updatedAt, kind: .groupState, jobID: nil, groupID: group.id, state: state)],
                on: connection, logger: logger)
        }
    }

    public func deleteGroup(_ id: GroupID, now: Date) async throws {
        let events = try await transaction { connection in
            try await connection.run("DELETE FROM groups WHERE id = \(id)", logger: logger)
            return try await Self.record(
                [StoredEvent(seq: 0, at: now, kind: .groupState, jobID: nil, groupID: id, state: "removed")], on: connection, logger: logger
            )
        }
        await published(events)
    }

    public func fetchGroup(_ id: GroupID) async throws -> JobGroup? {
        try await rows("SELECT \(unescaped: GroupColumn.list) FROM groups WHERE id = \(id)").first.map(GroupColumn.decode)
    }

    public func hlsRecipe(of id: GroupID) async throws -> String? {
        try await rows("SELECT hls FROM groups WHERE id = \(id)").first?.decode(String?.self) ?? nil
    }

    public func extendGroup(_ group: JobGroup, members: [NewJob], hls: String, now: Date) async throws -> [Job]? {
        let (jobs, events) = try await transaction { connection -> ([Job]?, [StoredEvent]) in
            let updated = try await connection.rows(
                """
                UPDATE groups SET hls = \(text: hls), updated_at = \(now.timeIntervalSince1970)
                WHERE id = \(group.id) AND closed IS NULL RETURNING id
                """,
                logger: logger)
            guard !updated.isEmpty else { return (nil, []) }
            let staged = NewJob.staged(members, dir: group.dir, staging: group.staging)
            let (outcomes, events) = try await Self.insert(staged, groupID: group.id, now: now, on: connection, logger: logger)
            return (outcomes.map(\.job), events)
        }
        await published(events)
        return jobs
    }

    public func fetchGroups(named name: String) async throws -> [JobGroup] {
        try await rows("SELECT \(unescaped: GroupColumn.list) FROM groups WHERE name = \(text: name) ORDER BY id DESC").map(
            GroupColumn.decode)
    }

    public func members(of id: GroupID) async throws -> [Job] {
        try await jobs("SELECT \(unescaped: JobColumn.list) FROM jobs WHERE group_id = \(id) ORDER BY id")
    }

    public func memberCounts(of id: GroupID) async throws -> [JobState: Int] {
        try Columns.counts(try await rows("SELECT state, COUNT(*) FROM jobs WHERE group_id = \(id) GROUP BY state"))
    }

    public func firstFailedMember(of id: GroupID) async throws -> Job? {
        try await jobs("SELECT \(unescaped: JobColumn.list) FROM jobs WHERE group_id = \(id) AND state = 'failed' ORDER BY id LIMIT 1")
            .first
    }

    public func groupTurn(_ id: GroupID) async throws -> (group: JobGroup?, counts: [JobState: Int]) {
        try await snapshot { connection in
            guard
                let group = try await connection.rows("SELECT \(unescaped: GroupColumn.list) FROM groups WHERE id = \(id)", logger: logger)
                    .first.map(GroupColumn.decode)
            else {
                return (nil, [:])
            }
            // While members are queued or running, only whether there are any (see `JobTable`).
            let open =
                try await connection.rows(
                    """
                    SELECT EXISTS (SELECT 1 FROM jobs WHERE group_id = \(id) AND state = 'queued'),
                        EXISTS (SELECT 1 FROM jobs WHERE group_id = \(id) AND state = 'running')
                    """, logger: logger
                ).first.map { try $0.decode((Bool, Bool).self) } ?? (false, false)
            if open.0 || open.1 {
                return (group, [.queued: open.0 ? 1 : 0, .running: open.1 ? 1 : 0].filter { $0.value > 0 })
            }
            let counts = try Columns.counts(
                try await connection.rows("SELECT state, COUNT(*) FROM jobs WHERE group_id = \(id) GROUP BY state", logger: logger))
            return (group, counts)
        }
    }

    public func groupFolders() async throws -> [(id: GroupID, dir: String, closed: GroupState?)] {
        try await rows("SELECT id, dir, closed FROM groups ORDER BY id").map { row in
            let (id, dir, closed) = try row.decode((Int64, String, String?).self)
            return (id, dir, closed.flatMap(GroupState.init(rawValue:)))
        }
    }

    public func openGroups() async throws -> [GroupID] {
        try await rows("SELECT id FROM groups WHERE closed IS NULL ORDER BY id").map { try $0.decode(Int64.self) }
    }
}
