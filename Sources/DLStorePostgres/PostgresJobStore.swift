import DLCore
import DLJobTable
import Foundation
import Logging
import PostgresNIO

/// The job table in PostgreSQL: the `JobTable` of a fleet of daemons that share one queue.
/// Same rows, same events and the same answers as the SQLite store (the store tests run on
/// both); what differs is how writers that are not one process stay in order:
///
/// - every write is one transaction on a connection of postgres-nio's pool;
/// - events are numbered under an advisory lock, so their `seq` follows commit order across
///   daemons (`lockEvents`);
/// - inserts, which check keys and paths before they write, run one at a time across daemons
///   (`LockKey.inserts`), as they do behind SQLite's single writer;
/// - reads of more than one statement read one snapshot (`REPEATABLE READ`).
///
/// Lifetime: `open` starts the client's pool in a task of its own and migrates the schema;
/// `close` ends the pool. The connection string's password is never logged.
public final class PostgresJobStore: JobTable {
    let client: PostgresClient
    private let runner: Task<Void, Never>
    let logger: Logger
    private let sink: EventSink
    /// Delivers every committed event of the table to the sink, in order (`EventFollower`).
    let follower: EventFollower
    private let reader: Task<Void, Never>
    /// LISTENs for other daemons' changes and events (`PostgresListener`).
    private let listener: Task<Void, Never>
    let changeStreams: ChangeStreams

    private init(
        client: PostgresClient, runner: Task<Void, Never>, logger: Logger, sink: EventSink, follower: EventFollower,
        reader: Task<Void, Never>, listener: Task<Void, Never>, changeStreams: ChangeStreams
    ) {
        self.client = client
        self.runner = runner
        self.logger = logger
        self.sink = sink
        self.follower = follower
        self.reader = reader
        self.listener = listener
        self.changeStreams = changeStreams
    }

    /// Brings the schema up to date, then starts a pool of at most `maxConnections`, the event
    /// reader and the listener (one connection of its own).
    ///
    /// The migrations run on a connection of their own, made once: a server that refuses
    /// (no such database, wrong password, nothing listening) fails the open at once, with the
    /// server's words. The pool would keep trying for a minute and then say only that it
    /// could not connect.
    public static func open(_ url: PostgresURL, maxConnections: Int = 8, logger: Logger) async throws -> PostgresJobStore {
        let connectionConfiguration: PostgresConnection.Configuration
        let lastSeq: Int64
        do {
            connectionConfiguration = try url.connectionConfiguration()
            let connection = try await PostgresConnection.connect(configuration: connectionConfiguration, id: 0, logger: logger)
            do {
                try await PostgresSchema.migrate(on: connection, logger: logger)
                lastSeq =
                    try await connection.rows("SELECT COALESCE(MAX(seq), 0)::bigint FROM events", logger: logger)
                    .first?.decode(Int64.self) ?? 0
            } catch {
                try? await connection.close().get()
                throw error
            }
            try await connection.close().get()
        } catch {
            throw PostgresStoreError(describing: error)
        }
        var configuration = url.configuration
        configuration.options.maximumConnections = maxConnections
        let client = PostgresClient(configuration: configuration, backgroundLogger: logger)
        // Detached: the pool must outlive a graceful shutdown of the caller's services until
        // `close`, after the engine has committed its last checkpoints. So must the reader and
        // the listener, which `close` ends too.
        let runner = Task.detached { await client.run() }
        let sink = EventSink()
        // Events committed before this open are history (replayed with `events(after:)`),
        // not news: the sink starts after them.
        let follower = EventFollower(sink: sink, delivered: lastSeq, logger: logger)
        let reader = Task.detached {
            await follower.run(
                read: { after, limit in
                    try await client.withConnection { connection in
                        try await connection.rows(
                            "SELECT \(unescaped: EventColumn.list) FROM events WHERE seq > \(after) ORDER BY seq LIMIT \(Int64(limit))",
                            logger: logger
                        ).map(EventColumn.decode)
                    }
                },
                last: {
                    try await client.withConnection { connection in
                        try await connection.rows("SELECT COALESCE(MAX(seq), 0)::bigint FROM events", logger: logger)
                            .first?.decode(Int64.self) ?? 0
                    }
                })
        }
        let changeStreams = ChangeStreams()
        let listener = Task.detached {
            await PostgresListener.run(
                configuration: connectionConfiguration, logger: logger,
                onJobs: { changeStreams.signal() }, onEvents: { follower.wake() })
        }
        return PostgresJobStore(
            client: client, runner: runner, logger: logger, sink: sink, follower: follower, reader: reader, listener: listener,
            changeStreams: changeStreams)
    }

    public func close() async {
        listener.cancel()
        await listener.value
        follower.close()
        await reader.value
        changeStreams.finish()
        runner.cancel()
        await runner.value
    }

    /// Yields on every `NOTIFY dld_jobs` (any daemon's state change, this one's too), and once
    /// each time the listener (re)connects, since changes may have been missed meanwhile.
    public func changes() -> AsyncStream<Void> {
        let (stream, continuation) = AsyncStream<Void>.makeStream(bufferingPolicy: .bufferingNewest(1))
        if !changeStreams.add(continuation) { continuation.finish() }
        return stream
    }

    // MARK: Connections and transactions

    /// A connection of the pool for `body`; postgres-nio's errors become `PostgresStoreError`s
    /// (a `StoreError` of the body is thrown as it is).
    func connection<T: Sendable>(_ body: (PostgresConnection) async throws -> T) async throws -> T {
        do {
            return try await client.withConnection { connection in try await body(connection) }
        } catch let error as StoreError {
            throw error
        } catch {
            throw PostgresStoreError(describing: error)
        }
    }

    /// `body` in one transaction, committed before this returns; rolled back if it throws
    /// (and its error, a `StoreError` say, is thrown as it was).
    func transaction<T: Sendable>(_ body: (PostgresConnection) async throws -> T) async throws -> T {
        try await inTransaction("BEGIN", body)
    }

    /// Reads of several statements from one snapshot, as SQLite's WAL readers see one.
    func snapshot<T: Sendable>(_ body: (PostgresConnection) async throws -> T) async throws -> T {
        try await inTransaction("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", body)
    }

    private func inTransaction<T: Sendable>(_ begin: PostgresQuery, _ body: (PostgresConnection) async throws -> T) async throws -> T {
        try await connection { connection in
            do {
                // Inside the `do`: a BEGIN reported failed may have begun all the same, as when
                // its caller is cancelled (a checkpoint the fence abandons, a `stats` that gave
                // up): postgres-nio sends it, then stops reading its answer. Left open, the
                // transaction would go back to the pool, and the next calls on that connection
                // would run in it (after a `READ ONLY` one, their writes would fail).
                try await connection.run(begin, logger: logger)
                let value = try await body(connection)
                do {
                    try await connection.run("COMMIT", logger: logger)
                } catch  where Self.unanswered(error) {
                    // The COMMIT was sent and no answer came (the server restarted, a partition,
                    // the connection closed under it): it may have committed. The caller must not take the failure for "nothing
                    // changed" (in doubt: a completion is read again, a client is told).
                    throw PostgresStoreError(
                        "PostgreSQL: the connection was lost while committing, so the change may have been made all the same (\(PostgresStoreError(describing: error))); look before trying again"
                    )
                }
                return value
            } catch {
                try? await connection.run("ROLLBACK", logger: logger)
                throw error
            }
        }
    }

    /// Whether a statement's failure says the server never answered it (as opposed to an
    /// error the server sent): the connection closed (`ConnectionLost`), or postgres-nio gave up
    /// without a server message. A COMMIT that failed so may have committed.
    static func unanswered(_ error: any Error) -> Bool {
        if error is ConnectionLost { return true }
        if let error = error as? PSQLError { return error.serverInfo == nil }
        return false
    }

    /// The rows of one statement.
    func rows(_ query: PostgresQuery) async throws -> [PostgresRow] {
        try await connection { connection in try await connection.rows(query, logger: logger) }
    }

    func jobs(_ query: PostgresQuery) async throws -> [Job] {
        try await rows(query).map(JobColumn.decode)
    }

    // MARK: Events

    public func setEventSink(wanted: @escaping @Sendable () -> Bool, _ deliver: @escaping @Sendable ([StoredEvent]) -> Void) {
        sink.set(wanted: wanted, deliver)
    }

    /// Nothing to do here: a `publish: false` write holds its own numbers inside its
    /// transaction (`EventFollower`), and the reader stops before them.
    public func holdEvents() {}

    /// Hands over events a `publish: false` write held back; the reader then goes on past them.
    public func publishEvents(_ events: [StoredEvent]) {
        follower.publish(events)
    }

    /// After a commit of this store: its events (and any other daemon's before them) reach the
    /// sink before this returns.
    func published(_ events: [StoredEvent]) async {
        await follower.committed(events)
    }

    /// After a commit of this store that numbered the events `(first, last]`: the reader reads
    /// them (a page at a time, only when someone listens) before this returns.
    func publishEvents(after first: Int64, through last: Int64) async {
        guard last > first else { return }
        await follower.catchUp()
    }

    public func events(after seq: Int64, limit: Int) async throws -> [StoredEvent] {
        try await rows("SELECT \(unescaped: EventColumn.list) FROM events WHERE seq > \(seq) ORDER BY seq LIMIT \(limit)").map(
            EventColumn.decode)
    }

    public func lastEventSeq() async throws -> Int64 {
        try await rows("SELECT COALESCE(MAX(seq), 0)::bigint FROM events").first?.decode(Int64.self) ?? 0
    }

    /// Takes the event lock of this transaction and returns the newest event's number.
    ///
    /// Why a lock: `seq` must follow commit order, because a subscriber replays `events(after:)`
    /// from the last number it saw. A sequence would hand out numbers in the order writers ask,
    /// so a reader could see 8 committed while 7 is not yet, move its cursor past 7, and lose
    /// it. Under `pg_advisory_xact_lock`, held until COMMIT, only one transaction at a time
    /// numbers events, so numbers are given in commit order and a reader never sees a gap
    /// that fills later.
    ///
    /// Notifications: `dld_events` wakes every daemon's event reader; `dld_jobs` every
    /// daemon's `changes()`.
    ///
    /// The lock is taken last, after a transaction's rows are written: the section it
    /// serializes stays short, and it never waits for a row lock while holding it (no deadlock
    /// with a writer that holds rows and waits for the lock). The number is read in a statement
    /// after the lock's, whose snapshot (READ COMMITTED) includes the previous holder's commit.
    static func lockEvents(on connection: PostgresConnection, logger: Logger) async throws -> Int64 {
        // Every transaction that writes events changes the table: other daemons hear of it at
        // COMMIT (PostgreSQL sends notifications then, once per channel and payload).
        try await connection.run(
            "SELECT pg_advisory_xact_lock(\(LockKey.events)), pg_notify('dld_events', ''), pg_notify('dld_jobs', '')", logger: logger)
        return try await connection.rows("SELECT COALESCE(MAX(seq), 0)::bigint FROM events", logger: logger).first?.decode(Int64.self) ?? 0
    }

    /// Keeps the newest `EventLog.kept` events before a transaction's own (`first` is the
    /// number it started after): a transaction never prunes its own events, which every
    /// daemon's follower still has to read (a bulk command over more than `kept` rows once
    /// pruned its own first events, and every follower waited for them for good). Checked
    /// when the numbers cross a hundred, as the SQLite store does.
    static func pruneEvents(from first: Int64, through last: Int64, on connection: PostgresConnection, logger: Logger) async throws {
        guard last / 100 != first / 100 else { return }
        try await connection.run("DELETE FROM events WHERE seq <= \(first - EventLog.kept)", logger: logger)
    }

    /// Numbers and writes events given as values (their `seq` is ignored and set here), under
    /// the event lock; returns them numbered.
    static func record(_ events: [StoredEvent], on connection: PostgresConnection, logger: Logger) async throws -> [StoredEvent] {
        guard !events.isEmpty else { return [] }
        let last = try await lockEvents(on: connection, logger: logger)
        var numbered = events
        for index in numbered.indices { numbered[index].seq = last + 1 + Int64(index) }
        let set = EventRecord.set
        for chunk in try set.chunks(numbered.map(EventRecord.init)) {
            var binds = Binds()
            let json = binds.json(chunk)
            try await connection.run(
                binds.query("INSERT INTO events (\(set.names)) SELECT \(set.names) FROM \(set.source(json))"), logger: logger)
        }
        try await pruneEvents(from: last, through: last + Int64(numbered.count), on: connection, logger: logger)
        return numbered
    }

    /// One `job.state` event per job, as the rows are now, in id order. Returns the numbers
    /// they took: `(first, last]`.
    static func recordStates(of ids: [JobID], at now: Date, on connection: PostgresConnection, logger: Logger) async throws -> (
        Int64, Int64
    ) {
        guard !ids.isEmpty else { return (0, 0) }
        let last = try await lockEvents(on: connection, logger: logger)
        try await connection.run(
            """
            INSERT INTO events (seq, at, kind, job_id, group_id, state, wait_reason, error_code, error_message)
            SELECT \(last) + row_number() OVER (ORDER BY id), \(now.timeIntervalSince1970), 'job.state', id, group_id, state,
                wait_reason, error_code, error_message
            FROM jobs WHERE id = ANY(\(ids))
            """,
            logger: logger)
        let through = last + Int64(ids.count)
        try await pruneEvents(from: last, through: through, on: connection, logger: logger)
        return (last, through)
    }

    // MARK: Reads

    public func fetch(_ ids: [JobID]) async throws -> [Job] {
        guard !ids.isEmpty else { return [] }
        let found = try await jobs("SELECT \(unescaped: JobColumn.list) FROM jobs WHERE id = ANY(\(ids))")
        let byID = Dictionary(found.map { ($0.id, $0) }, uniquingKeysWith: { first, _ in first })
        return ids.compactMap { byID[$0] }
    }

    public func fetch(keys: [String]) async throws -> [String: Job] {
        guard !keys.isEmpty else { return [:] }
        let found = try await jobs("SELECT \(unescaped: JobColumn.list) FROM jobs WHERE key = ANY(\(texts: keys))")
        var byKey: [String: Job] = [:]
        for job in found { if let key = job.key { byKey[key] = job } }
        // Keys as asked: a key with a NUL was stored (and found) cut at it.
        var result: [String: Job] = [:]
        for key in keys { if let job = byKey[storedText(key)] { result[key] = job } }
        return result
    }

    public func list(states: [JobState]?, afterID: JobID, limit: Int) async throws -> [Job] {
        let limit = Int64(min(limit, Int(Int32.max)))
        if let states {
            return try await jobs(
                "SELECT \(unescaped: JobColumn.list) FROM jobs WHERE id > \(afterID) AND state = ANY(\(states.map(\.rawValue))) ORDER BY id LIMIT \(limit)"
            )
        }
        return try await jobs("SELECT \(unescaped: JobColumn.list) FROM jobs WHERE id > \(afterID) ORDER BY id LIMIT \(limit)")
    }

    public func counts() async throws -> [JobState: Int] {
        try Columns.counts(try await rows("SELECT state, COUNT(*) FROM jobs GROUP BY state"))
    }

    public func databaseBytes() async throws -> Int64 {
        try await rows("SELECT pg_database_size(current_database())").first?.decode(Int64.self) ?? 0
    }

    public func compact(_ policy: CompactionPolicy) async throws -> Int64 { 0 }

    public func unfinishedCount() async throws -> Int {
        Int(
            try await rows("SELECT COUNT(*) FROM jobs WHERE state IN ('queued', 'running', 'waiting', 'paused')").first?.decode(Int64.self)
                ?? 0)
    }

    public func unfinishedPaths(among paths: [String]) async throws -> Set<String> {
        guard !paths.isEmpty else { return [] }
        var used: Set<String> = []
        for row in try await rows(
            "SELECT DISTINCT path FROM jobs WHERE path = ANY(\(texts: paths)) AND state NOT IN ('completed', 'failed', 'canceled')")
        {
            used.insert(try row.decode(String.self))
        }
        return Set(paths.filter { used.contains(storedText($0)) })
    }

    public func check(_ ids: [JobID], refused: Set<JobState>) async throws -> (missing: JobID?, refusedBy: (JobID, JobState)?) {
        try await snapshot { connection in
            // The first id of the list (in its order) that has no row.
            let missing = try await connection.rows(
                """
                SELECT u.id FROM unnest(\(ids)::bigint[]) WITH ORDINALITY AS u(id, n)
                WHERE NOT EXISTS (SELECT 1 FROM jobs WHERE jobs.id = u.id) ORDER BY u.n LIMIT 1
                """,
                logger: logger
            ).first?.decode(Int64.self)
            var refusedBy: (JobID, JobState)? = nil
            if !refused.isEmpty,
                let row = try await connection.rows(
                    "SELECT id, state FROM jobs WHERE id = ANY(\(ids)) AND state = ANY(\(refused.map(\.rawValue))) ORDER BY id LIMIT 1",
                    logger: logger
                ).first
            {
                let (id, state) = try row.decode((Int64, String).self)
                if let state = JobState(rawValue: state) { refusedBy = (id, state) }
            }
            return (missing, refusedBy)
        }
    }

    public func nextQueued(limit: Int, excludingGroups active: Set<GroupID>) async throws -> (
        jobs: [Job], groups: [(entry: QueueEntry, groupID: GroupID)]
    ) {
        try await snapshot { connection in
            let jobs = try await connection.rows(
                """
                SELECT \(unescaped: JobColumn.list) FROM jobs
                WHERE state = 'queued' AND group_id IS NULL ORDER BY priority DESC, id LIMIT \(Int64(limit))
                """,
                logger: logger
            ).map(JobColumn.decode)
            var groups: [(entry: QueueEntry, groupID: GroupID)] = []
            for row in try await connection.rows(
                """
                SELECT g.id, g.priority,
                    (SELECT MIN(j.id) FROM jobs j WHERE j.group_id = g.id AND j.state = 'queued')
                FROM groups g WHERE g.closed IS NULL ORDER BY g.id
                """,
                logger: logger)
            {
                let (group, priority, first) = try row.decode((Int64, Int, Int64?).self)
                guard !active.contains(group), let first else { continue }
                groups.append((QueueEntry(id: first, priority: priority), group))
            }
            return (jobs, groups)
        }
    }

    public func nextWakeUp() async throws -> Date? {
        try await rows("SELECT MIN(next_attempt_at) FROM jobs WHERE state = 'waiting'").first?
            .decode(Double?.self).map(Date.init(timeIntervalSince1970:))
    }

    public func completed(since: Date, limit: Int) async throws -> [Job] {
        try await jobs(
            """
            SELECT \(unescaped: JobColumn.list) FROM jobs WHERE state = 'completed' AND finished_at >= \(since.timeIntervalSince1970)
            ORDER BY finished_at DESC LIMIT \(Int64(limit))
            """)
    }

    public func reconcilePage(afterID: JobID, limit: Int) async throws -> [Job] {
        try await jobs(
            """
            SELECT \(unescaped: JobColumn.list) FROM jobs WHERE id > \(afterID)
                AND (state IN ('running', 'completed', 'canceled') OR attempts > 0 OR received > 0)
            ORDER BY id LIMIT \(Int64(limit))
            """)
    }
}
