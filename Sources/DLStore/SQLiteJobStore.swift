import DLCore
import DLJobTable
import Foundation
import GRDB
import GRDBSQLite
import Synchronization

/// The job table in SQLite, the embedded default backend of `JobTable`. One `DatabasePool` per
/// file (WAL); every write goes through GRDB's single serialized writer, and every state change
/// is one transaction. The writer runs with `synchronous=FULL`, so a committed state survives
/// power loss, not just a crash.
public final class SQLiteJobStore: JobTable {
    let pool: DatabasePool
    public let path: String
    /// The streams `changes()` handed out, finished by `close`.
    let changeStreams = ChangeStreams()

    public init(path: String) throws {
        self.path = path
        var configuration = Configuration()
        configuration.label = "dld.jobs"
        // Another process holding a write lock (there should be none) is waited for, not failed on.
        configuration.busyMode = .timeout(5)
        // Each reader keeps its own page cache (up to 2 MiB); three are plenty for a daemon
        // whose reads are short (GRDB opens up to five by default).
        configuration.maximumReaderCount = 3
        pool = try DatabasePool(path: path, configuration: configuration)
        // DatabasePool opens its writer with synchronous=NORMAL, which can lose the last
        // transactions on power loss. A command is answered only after its commit, so the
        // commit must be durable: FULL, on the one writer connection, outside a transaction.
        try pool.writeWithoutTransaction { db in
            try db.execute(sql: "PRAGMA synchronous = FULL")
            // Free pages can be given back (`compact`) only in incremental auto-vacuum mode. A
            // new file takes it before its first table; an older one is rewritten once.
            if try Int.fetchOne(db, sql: "PRAGMA auto_vacuum") != 2 {
                try db.execute(sql: "PRAGMA auto_vacuum = INCREMENTAL")
                try db.execute(sql: "VACUUM")
            }
        }
        try Self.migrator.migrate(pool)
        try Self.countQueueChanges(in: pool, into: queueVersion)
    }

    /// Writes that queued, unqueued or reordered a standalone job, counted on the writer by
    /// temporary triggers (they live in its connection, not in the file): a claim's move from
    /// `queued` to `running` is not one, so a turn whose count did not move reads only the
    /// jobs after its last ready row (`TurnClaim.readyAfter`). A write rolled back still
    /// counts: the next read is then a whole one, which is never wrong.
    let queueVersion = QueueVersion()

    final class QueueVersion: Sendable {
        private let count = Mutex<UInt64>(0)
        var value: UInt64 { count.withLock { $0 } }
        func bump() { count.withLock { $0 &+= 1 } }
    }

    private static func countQueueChanges(in pool: DatabasePool, into version: QueueVersion) throws {
        try pool.writeWithoutTransaction { db in
            db.add(
                function: DatabaseFunction("dld_queue_changed", argumentCount: 0, pure: false) { _ in
                    version.bump()
                    return nil
                })
            let standalone = "group_id IS NULL"
            try db.execute(
                sql: """
                    CREATE TEMP TRIGGER IF NOT EXISTS dld_queue_insert AFTER INSERT ON main.jobs
                    WHEN NEW.state = 'queued' AND NEW.\(standalone) BEGIN SELECT dld_queue_changed(); END;
                    CREATE TEMP TRIGGER IF NOT EXISTS dld_queue_delete AFTER DELETE ON main.jobs
                    WHEN OLD.state = 'queued' AND OLD.\(standalone) BEGIN SELECT dld_queue_changed(); END;
                    CREATE TEMP TRIGGER IF NOT EXISTS dld_queue_update AFTER UPDATE ON main.jobs
                    WHEN ((OLD.state = 'queued' AND OLD.\(standalone)) OR (NEW.state = 'queued' AND NEW.\(standalone)))
                        AND NOT (OLD.state = 'queued' AND NEW.state = 'running')
                    BEGIN SELECT dld_queue_changed(); END;
                    """)
        }
    }

    public func databaseBytes() async throws -> Int64 {
        try await pool.read { db in
            let pages = try Int64.fetchOne(db, sql: "PRAGMA page_count") ?? 0
            return pages * (try Int64.fetchOne(db, sql: "PRAGMA page_size") ?? 0)
        }
    }

    /// Incremental vacuum, `policy.step` pages per write so that commands wait for one step at
    /// most, then a checkpoint, which is when the file itself shrinks (WAL mode).
    public func compact(_ policy: CompactionPolicy) async throws -> Int64 {
        let (pages, free, pageSize) = try await pool.read { db in
            (
                try Int.fetchOne(db, sql: "PRAGMA page_count") ?? 0, try Int.fetchOne(db, sql: "PRAGMA freelist_count") ?? 0,
                try Int64.fetchOne(db, sql: "PRAGMA page_size") ?? 0
            )
        }
        guard policy.shouldCompact(pages: pages, freePages: free) else { return 0 }
        var left = free
        while left > 0 {
            let now = try await pool.writeWithoutTransaction { db in
                try db.execute(sql: "PRAGMA incremental_vacuum(\(max(1, policy.step)))")
                return try Int.fetchOne(db, sql: "PRAGMA freelist_count") ?? 0
            }
            guard now < left else { break }  // not in incremental mode after all: nothing to gain
            left = now
        }
        try await pool.writeWithoutTransaction { db in
            try db.execute(sql: "PRAGMA wal_checkpoint(PASSIVE)")
        }
        return Int64(free) * pageSize
    }

    /// Schema history. A migration that has shipped is never edited; add a new one.
    static var migrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1-jobs") { db in
            try db.execute(
                sql: """
                    CREATE TABLE jobs (
                        id INTEGER PRIMARY KEY AUTOINCREMENT,
                        url TEXT NOT NULL,
                        path TEXT NOT NULL,
                        state TEXT NOT NULL,
                        wait_reason TEXT,
                        priority INTEGER NOT NULL DEFAULT 0,
                        size INTEGER,
                        received INTEGER NOT NULL DEFAULT 0,
                        error_code TEXT,
                        error_message TEXT,
                        attempts INTEGER NOT NULL DEFAULT 0,
                        created_at REAL NOT NULL,
                        updated_at REAL NOT NULL,
                        finished_at REAL,
                        next_attempt_at REAL,
                        key TEXT UNIQUE,
                        meta TEXT,
                        headers TEXT NOT NULL DEFAULT '[]',
                        overwrite INTEGER NOT NULL DEFAULT 0,
                        final_url TEXT,
                        etag TEXT,
                        last_modified TEXT,
                        accepts_ranges INTEGER NOT NULL DEFAULT 0
                    );
                    CREATE INDEX jobs_by_state ON jobs(state, priority DESC, id);
                    CREATE INDEX jobs_by_path ON jobs(path);
                    """)
        }
        migrator.registerMigration("v2-integrity") { db in
            try db.execute(
                sql: """
                    ALTER TABLE jobs ADD COLUMN checksum TEXT;
                    ALTER TABLE jobs ADD COLUMN expected_size INTEGER;
                    ALTER TABLE jobs ADD COLUMN sha256 TEXT;
                    ALTER TABLE jobs ADD COLUMN digest TEXT;
                    ALTER TABLE jobs ADD COLUMN progress_at REAL;
                    """)
        }
        migrator.registerMigration("v3-groups-events") { db in
            try db.execute(
                sql: """
                    CREATE TABLE groups (
                        id INTEGER PRIMARY KEY AUTOINCREMENT,
                        name TEXT NOT NULL,
                        dir TEXT NOT NULL,
                        staging TEXT NOT NULL,
                        priority INTEGER NOT NULL DEFAULT 0,
                        closed TEXT,
                        error_code TEXT,
                        error_message TEXT,
                        created_at REAL NOT NULL,
                        updated_at REAL NOT NULL,
                        finished_at REAL
                    );
                    ALTER TABLE jobs ADD COLUMN group_id INTEGER REFERENCES groups(id);
                    ALTER TABLE jobs ADD COLUMN staging_path TEXT;
                    CREATE INDEX jobs_by_group ON jobs(group_id);
                    CREATE TABLE events (
                        seq INTEGER PRIMARY KEY AUTOINCREMENT,
                        at REAL NOT NULL,
                        kind TEXT NOT NULL,
                        job_id INTEGER,
                        group_id INTEGER,
                        state TEXT NOT NULL,
                        wait_reason TEXT,
                        error_code TEXT,
                        error_message TEXT
                    );
                    """)
        }
        migrator.registerMigration("v4-options") { db in
            try db.execute(sql: "ALTER TABLE jobs ADD COLUMN options TEXT NOT NULL DEFAULT '{}'")
        }
        migrator.registerMigration("v5-hosts") { db in
            // `host` is what the per-host limit counts; (group_id, state, id) finds a group's
            // next queued member and its counts without reading the whole group.
            try db.execute(
                sql: """
                    ALTER TABLE jobs ADD COLUMN host TEXT NOT NULL DEFAULT '';
                    CREATE INDEX jobs_by_group_state ON jobs(group_id, state, id);
                    """)
            let rows = try Row.fetchAll(db, sql: "SELECT id, url FROM jobs")
            for row in rows {
                try db.execute(sql: "UPDATE jobs SET host = ? WHERE id = ?", arguments: [URLRules.hostKey(row["url"]), row["id"] as Int64])
            }
        }
        migrator.registerMigration("v6-one-group-index") { db in
            // jobs_by_group_state starts with group_id and serves every look-up by group;
            // jobs_by_group only cost its upkeep on every insert.
            try db.execute(sql: "DROP INDEX IF EXISTS jobs_by_group")
        }
        migrator.registerMigration("v7-workers") { db in
            // A running job's worker and lease (see `JobTable.claim`), and the workers'
            // heartbeats. SQLite has one daemon, but keeps the same columns so that a table
            // moves between the backends unchanged.
            try db.execute(
                sql: """
                    ALTER TABLE jobs ADD COLUMN worker TEXT;
                    ALTER TABLE jobs ADD COLUMN lease_until REAL;
                    CREATE TABLE workers (
                        id TEXT PRIMARY KEY,
                        started_at REAL NOT NULL,
                        seen_at REAL NOT NULL
                    );
                    """)
        }
        migrator.registerMigration("v8-standalone-queue") { db in
            // The queue of standalone jobs in the scheduler's order, without group members:
            // jobs_by_state also holds every queued member of a group, which a turn looking for
            // standalone jobs walked past, all of them, every turn (the same partial index as
            // PostgreSQL's jobs_queued).
            try db.execute(
                sql: """
                    CREATE INDEX jobs_standalone_queue ON jobs(priority DESC, id) WHERE state = 'queued' AND group_id IS NULL
                    """)
        }
        migrator.registerMigration("v9-segments") { db in
            // A segmented download's ranges, each synced up to its own offset (SegmentLayout's
            // stored form); NULL for one stream of `received` bytes.
            try db.execute(sql: "ALTER TABLE jobs ADD COLUMN segments TEXT")
        }
        migrator.registerMigration("v10-unsynced-progress") { db in
            // What a running transfer has written but not yet synced, with the boot id it was
            // written in (UnsyncedProgress's stored form); NULL when nothing is recorded.
            try db.execute(sql: "ALTER TABLE jobs ADD COLUMN unsynced TEXT")
        }
        migrator.registerMigration("v11-mirrors") { db in
            // More URLs of the same file and which were dropped, why (JSON, ColumnCoding.mirrors);
            // NULL for a job without mirrors.
            try db.execute(sql: "ALTER TABLE jobs ADD COLUMN mirrors TEXT")
        }
        migrator.registerMigration("v12-hls") { db in
            // An HLS group's recipe (HLSRecipe's JSON), written with the group's row; NULL for
            // any other group.
            try db.execute(sql: "ALTER TABLE groups ADD COLUMN hls TEXT")
        }
        migrator.registerMigration("v13-pieces") { db in
            // A file's piece hashes from a Metalink (PieceHashes.encoded), written once at
            // enqueue; NULL for a job without them.
            try db.execute(sql: "ALTER TABLE jobs ADD COLUMN pieces TEXT")
        }
        migrator.registerMigration("v14-epochs") { db in
            // The fencing token of each attempt (`Job.epoch`) and a command waiting for the
            // worker that runs the job (`Job.stopRequest`): SQLite has one daemon, but keeps
            // the same columns and rules so that a table moves between the backends unchanged.
            try db.execute(
                sql: """
                    ALTER TABLE jobs ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0;
                    ALTER TABLE jobs ADD COLUMN stop_request TEXT;
                    """)
        }
        migrator.registerMigration("v15-partial-tags") { db in
            // The attempt whose bytes the committed offset counts (`Job.partialTag`), written
            // by owned checkpoints only.
            try db.execute(sql: "ALTER TABLE jobs ADD COLUMN partial_tag TEXT")
        }
        return migrator
    }

    /// Jobs that are not finished (they count against `max_queued`).
    public func unfinishedCount() async throws -> Int {
        try await pool.read { db in
            try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM jobs WHERE state IN ('queued', 'running', 'waiting', 'paused')") ?? 0
        }
    }

    /// Which of these paths an unfinished job downloads to: an indexed look-up each (for
    /// `on_exists` "rename", which asks about one candidate name at a time).
    public func unfinishedPaths(among paths: [String]) async throws -> Set<String> {
        try await pool.read { db in
            var used: Set<String> = []
            for path in paths where try Self.pathUser(path, in: db) != nil { used.insert(path) }
            return used
        }
    }

    static func pathUser(_ path: String, in db: Database) throws -> JobID? {
        try JobID.fetchOne(db.cachedStatement(sql: pathUserSQL), arguments: [path])
    }

    static let pathUserSQL = "SELECT id FROM jobs WHERE path = ? AND state NOT IN ('completed', 'failed', 'canceled') LIMIT 1"

    /// Events kept for replay; older ones are pruned as new ones are written.
    public static let eventsKept: Int64 = EventLog.kept

    let sink = EventSink()

    public func setEventSink(wanted: @escaping @Sendable () -> Bool, _ deliver: @escaping @Sendable ([StoredEvent]) -> Void) {
        sink.set(wanted: wanted, deliver)
    }

    /// Before a `publish: false` write: events published from now on wait until that write's
    /// own are handed over (`publishEvents`), so that they still go out in commit order.
    public func holdEvents() {
        sink.hold()
    }

    /// Hands over the events of a `publish: false` write (held since `holdEvents`). Writers
    /// that must finish something first (linking the files that were just recorded as
    /// completed) call this themselves after it.
    public func publishEvents(_ events: [StoredEvent]) {
        sink.release(publishing: events)
    }

    /// Hands the events numbered `(after, through]` to the sink, read from the table a page at
    /// a time, so that a change of 100 000 rows never holds 100 000 events in memory.
    func publishEvents(after first: Int64, through last: Int64) {
        sink.publish(after: first, through: last) { after, through, limit in
            try pool.read { db in try Self.events(after: after, through: through, limit: limit, in: db) }
        }
    }

    /// The pool closes its connections when the store is released; `changes()` streams end.
    public func close() async {
        changeStreams.finish()
    }

    /// Records an event in the same transaction as the change it describes.
    static func record(
        _ kind: StoredEvent.Kind, job: Job?, groupID: GroupID?, state: String, at: Date, in db: Database
    ) throws -> StoredEvent {
        try db.cachedStatement(
            sql:
                "INSERT INTO events (at, kind, job_id, group_id, state, wait_reason, error_code, error_message) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
        ).execute(arguments: [
            at.timeIntervalSince1970, kind.rawValue, job?.id, groupID, state, job?.waitReason?.rawValue,
            job?.error?.code, job?.error?.message,
        ])
        let seq = db.lastInsertedRowID
        if seq % 100 == 0 { try pruneEvents(through: seq - 1, in: db) }
        return StoredEvent(
            seq: seq, at: at, kind: kind, jobID: job?.id, groupID: groupID, state: state,
            waitReason: job?.waitReason, error: job?.error)
    }

    /// Keeps the newest `eventsKept` events up to `seq`: a transaction prunes from the number
    /// it started at, never its own events (a reader of the table, another daemon's
    /// `EventFollower` on PostgreSQL, needs every number after the ones it read).
    static func pruneEvents(through seq: Int64, in db: Database) throws {
        try db.cachedStatement(sql: "DELETE FROM events WHERE seq <= ?").execute(arguments: [seq - eventsKept])
    }

    /// Events after `seq`, oldest first.
    public func events(after seq: Int64, limit: Int) async throws -> [StoredEvent] {
        try await pool.read { db in try Self.events(after: seq, through: Int64.max, limit: limit, in: db) }
    }

    static func events(after seq: Int64, through last: Int64, limit: Int, in db: Database) throws -> [StoredEvent] {
        try rows(
            EventColumn.self,
            db.cachedStatement(sql: "SELECT \(EventColumn.list) FROM events WHERE seq > ? AND seq <= ? ORDER BY seq LIMIT ?"),
            arguments: [seq, last, limit])
    }

    /// The newest event's number (0 when there is none).
    public func lastEventSeq() async throws -> Int64 {
        try await pool.read { db in try Int64.fetchOne(db, sql: "SELECT MAX(seq) FROM events") ?? 0 }
    }

    /// The value of `PRAGMA synchronous` on the writer (2 = FULL), for tests and diagnostics.
    public func writerSynchronousMode() throws -> Int {
        try pool.writeWithoutTransaction { db in try Int.fetchOne(db, sql: "PRAGMA synchronous") ?? -1 }
    }

    // MARK: Writes

    /// Creates jobs in one transaction. A job whose `key` exists already returns the existing
    /// job. A path that an unfinished job already writes to is refused, and then nothing is
    /// created.
    public func insert(_ jobs: [NewJob], now: Date) async throws -> [InsertOutcome] {
        let (outcomes, events) = try await pool.write { db in
            var events: [StoredEvent] = []
            let outcomes = try Self.insert(jobs, groupID: nil, now: now, events: &events, in: db)
            return (outcomes, events)
        }
        sink.publish(events)
        return outcomes
    }

    /// Writes whole rows (their state, error, counters) in one transaction: one commit for
    /// every change that is ready (group commit). With `publish: false` the events are
    /// returned instead of published, for a caller that has work to finish first.
    @discardableResult
    public func save(_ jobs: [Job], publish: Bool) async throws -> [StoredEvent] {
        guard !jobs.isEmpty else { return [] }
        let events = try await pool.write { db in
            var events: [StoredEvent] = []
            for job in jobs {
                let before = try String.fetchOne(db.cachedStatement(sql: "SELECT state FROM jobs WHERE id = ?"), arguments: [job.id])
                try Self.update(job, in: db)
                if before != job.state.rawValue {
                    events.append(
                        try Self.record(.jobState, job: job, groupID: job.groupID, state: job.state.rawValue, at: job.updatedAt, in: db))
                }
            }
            return events
        }
        if publish { sink.publish(events) }
        return events
    }

    // MARK: Reads (concurrent with the writer: WAL snapshots)

    public func fetch(_ id: JobID) async throws -> Job? {
        try await pool.read { db in
            try Self.job(db.cachedStatement(sql: "SELECT \(JobColumn.list) FROM jobs WHERE id = ?"), arguments: [id])
        }
    }

    /// The jobs with these ids that exist, in the order asked.
    public func fetch(_ ids: [JobID]) async throws -> [Job] {
        try await pool.read { db in
            try ids.compactMap { id in
                try Self.job(db.cachedStatement(sql: "SELECT \(JobColumn.list) FROM jobs WHERE id = ?"), arguments: [id])
            }
        }
    }

    /// A page of jobs by ascending id, optionally only in some states.
    public func list(states: [JobState]?, afterID: JobID, limit: Int) async throws -> [Job] {
        try await pool.read { db in
            var sql = "SELECT \(JobColumn.list) FROM jobs WHERE id > ?"
            var arguments: StatementArguments = [afterID]
            if let states {
                sql += " AND state IN (\(states.map { _ in "?" }.joined(separator: ",")))"
                for state in states { _ = arguments.append(contentsOf: [state.rawValue]) }
            }
            sql += " ORDER BY id LIMIT ?"
            _ = arguments.append(contentsOf: [min(limit, Int(Int32.max))])
            return try Self.jobs(db.cachedStatement(sql: sql), arguments: arguments)
        }
    }

    public func counts() async throws -> [JobState: Int] {
        try await pool.read { db in
            var counts: [JobState: Int] = [:]
            for row in try Row.fetchAll(db, sql: "SELECT state, COUNT(*) AS n FROM jobs GROUP BY state") {
                if let state = JobState(rawValue: row["state"]) { counts[state] = row["n"] }
            }
            return counts
        }
    }

    /// The earliest `next_attempt_at` of a waiting job.
    public func nextWakeUp() async throws -> Date? {
        try await pool.read { db in
            try Double.fetchOne(db, sql: "SELECT MIN(next_attempt_at) FROM jobs WHERE state = 'waiting'")
                .map(Date.init(timeIntervalSince1970:))
        }
    }

    // MARK: Rows

    /// Writes a whole row (but its epoch). A worker holds a job only while it runs it: a row
    /// written as not `running` loses its worker, lease and stop request; one written as
    /// `running` keeps those the table has (only claims and renewals write leases: a row read at
    /// its claim and written back later would move its lease into the past, and another worker
    /// would take a job that still runs).
    ///
    /// `owned`: the write of a worker's own attempt (its outcome, a stopped transfer's row), which
    /// leaves the URL, headers and options as the table has them: only `revise` changes those
    /// (`set_speed`, `change`), and a row the owner read at its claim would undo a revision
    /// made since (`make fleet-chaos` saw a set_speed undone by the owner's pause 7 ms later).
    static func update(_ job: Job, in db: Database, owned: Bool = false) throws {
        let values: [(any DatabaseValueConvertible)?] = [
            job.url, job.path, job.state.rawValue, job.waitReason?.rawValue, job.priority, job.size,
            job.received, job.error?.code, job.error?.message, job.attempts, job.updatedAt.timeIntervalSince1970,
            job.finishedAt?.timeIntervalSince1970, job.nextAttemptAt?.timeIntervalSince1970, job.key, job.meta,
            ColumnCoding.encodeHeaders(job.headers), job.overwrite, job.finalURL, job.validators.etag,
            job.validators.lastModified, job.validators.acceptsRanges, job.checksum?.description, job.expectedSize,
            job.sha256, job.digest, job.progressAt?.timeIntervalSince1970, job.stagingPath, ColumnCoding.encodeOptions(job.options),
            job.segments, job.unsynced?.encoded, ColumnCoding.mirrors(job),
        ]
        let written = owned ? WholeRow.owned : WholeRow.all
        var arguments: [(any DatabaseValueConvertible)?] = written.positions.map { values[$0] }
        arguments.append(job.id)
        try db.cachedStatement(sql: written.sql).execute(arguments: StatementArguments(arguments))
    }

    /// The whole-row UPDATE: the columns `update` writes, in the order of its values (the
    /// state's number used again for the lease columns); `owned` leaves out the ones only
    /// `revise` changes.
    struct WholeRow {
        static let columns = [
            "url", "path", "state", "wait_reason", "priority", "size", "received", "error_code", "error_message", "attempts",
            "updated_at", "finished_at", "next_attempt_at", "key", "meta", "headers", "overwrite", "final_url", "etag",
            "last_modified", "accepts_ranges", "checksum", "expected_size", "sha256", "digest", "progress_at", "staging_path",
            "options", "segments", "unsynced", "mirrors",
        ]
        static let all = WholeRow(leaving: [])
        static let owned = WholeRow(leaving: ["url", "headers", "options"])

        /// The indices into `update`'s values that are bound, in order (the id comes last).
        let positions: [Int]
        let sql: String

        init(leaving kept: Set<String>) {
            positions = Self.columns.indices.filter { !kept.contains(Self.columns[$0]) }
            let names = positions.map { Self.columns[$0] }
            let state = "?\((names.firstIndex(of: "state") ?? 0) + 1)"
            let assignments =
                names.map { "\($0) = ?" }
                + ["worker", "lease_until", "stop_request"].map { "\($0) = CASE WHEN \(state) = 'running' THEN \($0) END" }
            // The id's `?` takes the number after the largest before it: the last value's + 1.
            sql = "UPDATE jobs SET \(assignments.joined(separator: ", ")) WHERE id = ?"
        }
    }

    /// The cells of a stepped statement's current row, read with SQLite's C API: GRDB's
    /// generic `row[i]` looked up type metadata for every column and cost about as much as
    /// writing the job out as JSON.
    struct Cells: RowCells {
        let handle: OpaquePointer

        private func column(_ position: Int) -> Int32? {
            let column = Int32(truncatingIfNeeded: position)
            return sqlite3_column_type(handle, column) == SQLITE_NULL ? nil : column
        }

        func int64(_ position: Int) -> Int64? { column(position).map { sqlite3_column_int64(handle, $0) } }
        func double(_ position: Int) -> Double? { column(position).map { sqlite3_column_double(handle, $0) } }
        func bool(_ position: Int) -> Bool? { int64(position).map { $0 != 0 } }
        /// As GRDB reads a text: up to its first NUL.
        func text(_ position: Int) -> String? {
            guard let column = column(position), let bytes = sqlite3_column_text(handle, column) else { return nil }
            return String(cString: bytes)
        }
    }

    /// Steps a statement that lists `columns` (`SELECT \(Columns.list) …`, or `… RETURNING`
    /// them) and hands each row to `body` as it is read, decoded as both backends decode it.
    static func each<Columns: TableColumns>(
        _ columns: Columns.Type, _ statement: Statement, arguments: StatementArguments, _ body: (Columns.Value) throws -> Void
    ) throws {
        try statement.setArguments(arguments)
        let handle = statement.sqliteStatement
        defer { sqlite3_reset(handle) }
        while true {
            switch sqlite3_step(handle) {
            case SQLITE_DONE: return
            case SQLITE_ROW: try body(try Columns.value(from: Cells(handle: handle)))
            case let code: throw stepError(code, statement)
            }
        }
    }

    /// The first row of a statement that lists `columns`, in one step: for a lookup by a
    /// unique key (a job's id, its client key), which has one row at most.
    static func first<Columns: TableColumns>(_ columns: Columns.Type, _ statement: Statement, arguments: StatementArguments) throws
        -> Columns.Value?
    {
        try statement.setArguments(arguments)
        let handle = statement.sqliteStatement
        defer { sqlite3_reset(handle) }
        switch sqlite3_step(handle) {
        case SQLITE_DONE: return nil
        case SQLITE_ROW: return try Columns.value(from: Cells(handle: handle))
        case let code: throw stepError(code, statement)
        }
    }

    /// What a failed `sqlite3_step` of `statement` says.
    private static func stepError(_ code: Int32, _ statement: Statement) -> DatabaseError {
        let message = sqlite3_db_handle(statement.sqliteStatement).map { String(cString: sqlite3_errmsg($0)) }
        return DatabaseError(resultCode: ResultCode(rawValue: code), message: message, sql: statement.sql)
    }

    /// The job a `SELECT \(JobColumn.list) … WHERE id = ?` (or another unique key) finds.
    static func job(_ statement: Statement, arguments: StatementArguments) throws -> Job? {
        try first(JobColumn.self, statement, arguments: arguments)
    }

    /// The rows of a statement that lists `columns`, as `each` reads them.
    static func rows<Columns: TableColumns>(_ columns: Columns.Type, _ statement: Statement, arguments: StatementArguments = []) throws
        -> [Columns.Value]
    {
        var rows: [Columns.Value] = []
        try each(columns, statement, arguments: arguments) { rows.append($0) }
        return rows
    }

    /// The jobs a `SELECT \(JobColumn.list) …` statement returns.
    static func jobs(_ statement: Statement, arguments: StatementArguments) throws -> [Job] {
        try rows(JobColumn.self, statement, arguments: arguments)
    }
}

extension SQLiteJobStore {
    /// The jobs with these client keys that exist, by key, in one read.
    public func fetch(keys: [String]) async throws -> [String: Job] {
        try await pool.read { db in
            var found: [String: Job] = [:]
            let statement = try db.cachedStatement(sql: "SELECT \(JobColumn.list) FROM jobs WHERE key = ?")
            for key in keys {
                if let job = try Self.job(statement, arguments: [key]) { found[key] = job }
            }
            return found
        }
    }

    /// Records a running transfer's synced progress: only its counters and validators, in one
    /// small transaction. Callers sync the bytes first (durability rule 2).
    @discardableResult
    public func checkpoint(
        _ id: JobID, received: Int64, size: Int64?, validators: Validators, finalURL: String?, segments: String?, now: Date,
        owner: JobOwner?
    ) async throws -> CheckpointAnswer {
        try await pool.write { db in
            let written = try Row.fetchOne(
                db.cachedStatement(
                    sql: """
                        UPDATE jobs SET progress_at = CASE WHEN ? > received THEN ? ELSE progress_at END,
                            received = ?, size = ?, etag = ?, last_modified = ?, accepts_ranges = ?,
                            final_url = COALESCE(?, final_url), segments = ?, partial_tag = COALESCE(?, partial_tag)
                        WHERE id = ? AND state = 'running' AND (? IS NULL OR (worker = ? AND epoch = ?))
                        RETURNING stop_request
                        """),
                arguments: [
                    received, now.timeIntervalSince1970, received, size, validators.etag, validators.lastModified,
                    validators.acceptsRanges, finalURL, segments, owner?.tag, id, owner?.worker, owner?.worker, owner?.epoch,
                ])
            guard let written else { return CheckpointAnswer(written: false) }
            let request: String? = written[0]
            return CheckpointAnswer(written: true, stopRequest: request.flatMap(StopRequest.init(rawValue:)))
        }
    }

    /// Reads the row and writes the revised columns (url, headers, mirrors, options) in one
    /// transaction of the single writer; see `JobTable.revise`.
    public func revise(_ id: JobID, _ revision: JobRevision, expecting: (state: JobState, epoch: Int64)?, now: Date) async throws -> Job? {
        try await pool.write { db in
            guard
                let stored = try Self.jobs(db.cachedStatement(sql: "SELECT \(JobColumn.list) FROM jobs WHERE id = ?"), arguments: [id])
                    .first,
                JobRevision.matches(stored, expecting)
            else { return nil }
            var job = revision.applied(to: stored)
            job.updatedAt = now
            if expecting != nil { job.epoch += 1 }
            try db.execute(
                sql: "UPDATE jobs SET url = ?, headers = ?, mirrors = ?, options = ?, updated_at = ?, epoch = ? WHERE id = ?",
                arguments: [
                    job.url, ColumnCoding.encodeHeaders(job.headers), ColumnCoding.mirrors(job), ColumnCoding.encodeOptions(job.options),
                    now.timeIntervalSince1970, job.epoch, id,
                ])
            return job
        }
    }

    /// One small transaction for every record, on the writer, committed with
    /// `synchronous = NORMAL`: in WAL mode that commit is written to the WAL (the page cache,
    /// which a SIGKILL of dld does not lose) without an fsync, and never corrupts the file; the
    /// next FULL commit makes it durable with the rest. A power loss may lose it, and a record
    /// is trusted only in the boot that wrote it anyway.
    @discardableResult
    public func recordUnsynced(_ records: [UnsyncedRecord], owner: String?) async throws -> Int {
        guard !records.isEmpty else { return 0 }
        return try await pool.writeWithoutTransaction { db in
            try db.execute(sql: "PRAGMA synchronous = NORMAL")
            var written = 0
            do {
                try db.inTransaction {
                    let statement = try db.cachedStatement(
                        sql: "UPDATE jobs SET unsynced = ? WHERE id = ? AND state = 'running' AND (? IS NULL OR (worker = ? AND epoch = ?))"
                    )
                    for record in records {
                        try statement.execute(arguments: [record.progress.encoded, record.id, owner, owner, record.epoch])
                        written += db.changesCount
                    }
                    return .commit
                }
            } catch {
                try? db.execute(sql: "PRAGMA synchronous = FULL")
                throw error
            }
            // Back to FULL: every other write relies on it (durability rule 1).
            try db.execute(sql: "PRAGMA synchronous = FULL")
            return written
        }
    }
}
