import DLJobTable
import DLStore
import DLStorePostgres
import DLTestSupport
import Foundation
import Logging
import Testing

/// The backends every store test runs on.
enum Backend: String, CaseIterable, Sendable, CustomTestStringConvertible {
    case sqlite, postgres
    var testDescription: String { rawValue }
}

/// The job table of one test: a SQLite file in a temp folder, or a fresh database on the test
/// run's PostgreSQL server (started once, on first use, for the whole run). `open()` again
/// opens the same table anew (as a restarted daemon would); `finish()` closes every store it
/// opened and removes the table.
final class StoreFixture: @unchecked Sendable {
    let backend: Backend
    private let folder: TempFolder
    private let server: PostgresServer?
    private let database: String?
    private var opened: [any JobTable] = []
    private let lock = NSLock()

    /// Quiet: a test's output is its expectations.
    static let logger: Logger = {
        var logger = Logger(label: "dld.store.test")
        logger.logLevel = .error
        return logger
    }()

    init(_ backend: Backend) throws {
        self.backend = backend
        folder = try TempFolder()
        switch backend {
        case .sqlite:
            server = nil
            database = nil
        case .postgres:
            let server = try PostgresServer.shared()
            self.server = server
            database = try server.createDatabase()
        }
    }

    /// The connection string of this test's PostgreSQL database.
    var postgresURL: PostgresURL? {
        guard let server, let database else { return nil }
        return try? PostgresURL.parse(server.url(database: database), defaultUser: "dld")
    }

    /// A `psql` session of its own on this test's database, kept open (a transaction that
    /// holds row locks while the store works, for one).
    func session() throws -> PostgresSession {
        guard let server, let database else { throw PostgresServerError("not a PostgreSQL test") }
        return try PostgresSession(server, database: database)
    }

    /// Runs SQL on this test's PostgreSQL database with `psql` (what another program, or a
    /// fault, does to the table); returns what it printed.
    func psql(_ sql: String) throws -> String {
        guard let server, let database else { throw PostgresServerError("not a PostgreSQL test") }
        return try server.psql(database: database, sql)
    }

    /// Opens the table (migrating it), and keeps the store to close at the end.
    func open() async throws -> any JobTable {
        let store: any JobTable
        switch backend {
        case .sqlite:
            store = try SQLiteJobStore(path: folder.path + "/jobs.sqlite")
        case .postgres:
            guard let url = postgresURL else { throw PostgresServerError("no database for this test") }
            store = try await PostgresJobStore.open(url, maxConnections: 4, logger: Self.logger)
        }
        lock.withLock { opened.append(store) }
        return store
    }

    func finish() async {
        let stores = lock.withLock { () -> [any JobTable] in
            defer { opened = [] }
            return opened
        }
        for store in stores { await store.close() }
        if let server, let database {
            // Off Swift's cooperative pool: `dropdb --force` blocks until every backend has
            // absorbed a ProcSignalBarrier, and a backend that is writing rows to a client
            // waits for a task of this process to read them. With the pool's threads (two on
            // a two-core machine) blocked in `dropdb`, nothing read them: the run hung.
            await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
                DispatchQueue.global().async {
                    server.dropDatabase(database)
                    done.resume()
                }
            }
        }
    }
}

/// Runs `body` with a fresh table of `backend`, and closes and removes it after.
func withStore(_ backend: Backend, _ body: (any JobTable, StoreFixture) async throws -> Void) async throws {
    let fixture = try StoreFixture(backend)
    do {
        let store = try await fixture.open()
        try await body(store, fixture)
    } catch {
        await fixture.finish()
        throw error
    }
    await fixture.finish()
}
