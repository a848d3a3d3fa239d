import DLCore
import DLJobTable
import DLStore
@testable import DLStorePostgres
import DLTestSupport
import Foundation
import Logging
import PostgresNIO
import Testing

/// What only the PostgreSQL backend has: connection strings, its own migrations, and writers
/// in several processes (here: several pools on one database, as several daemons would be).
@Suite struct PostgresStoreTests {
    /// Opening a table twice, or from two stores at once, applies each migration once.
    @Test func migrationsApplyOnce() async throws {
        let fixture = try StoreFixture(.postgres)
        async let a = fixture.open()
        async let b = fixture.open()
        let (first, second) = try await (a, b)
        _ = try await first.insert([NewJob(url: "https://e.com/1", path: "/tmp/1")], now: t0)
        #expect(try await second.list().count == 1)
        _ = try await fixture.open()
        let server = try PostgresServer.shared()
        let url = try #require(fixture.postgresURL)
        let applied = try server.psql(database: url.database ?? "", "SELECT id FROM schema_migrations ORDER BY id")
        #expect(
            applied
                == "v1-jobs-groups-events\nv2-workers-leases\nv3-segments\nv4-unsynced-progress\nv5-mirrors\nv6-hls\nv7-pieces\nv8-epochs\nv9-partial-tags\n"
        )
        await fixture.finish()
    }

    /// Events are numbered in commit order while several stores write at once: a reader that
    /// follows `events(after:)` never sees a number before every smaller one has committed,
    /// so it never skips one; at the end the numbers run 1...N with one event per change.
    @Test func eventsFollowCommitOrderAcrossWriters() async throws {
        let fixture = try StoreFixture(.postgres)
        let writers = [try await fixture.open(), try await fixture.open(), try await fixture.open()]
        let reader = try await fixture.open()
        let rounds = 40
        let done = Flag()
        async let follower: (seen: [Int64], gaps: [String]) = {
            var seen: [Int64] = []
            var gaps: [String] = []
            var cursor: Int64 = 0
            while true {
                let finished = done.value
                for event in try await reader.events(after: cursor, limit: 1000) {
                    if event.seq != cursor + 1 { gaps.append("after \(cursor) came \(event.seq)") }
                    cursor = event.seq
                    seen.append(event.seq)
                }
                if finished { return (seen, gaps) }
            }
        }()
        try await withThrowingTaskGroup(of: Void.self) { group in
            for (w, store) in writers.enumerated() {
                group.addTask {
                    for round in 0..<rounds {
                        let jobs = try await store.insert(
                            (0..<5).map { NewJob(url: "https://e.com/\(w)/\(round)/\($0)", path: "/tmp/w\(w)/\(round)/\($0)") }, now: t0
                        ).map(\.job)
                        var changed = jobs
                        for index in changed.indices { changed[index].state = .paused }
                        try await store.save(changed)
                        _ = try await store.apply(.resume, to: .ids(jobs.map(\.id)), now: t0)
                    }
                }
            }
            try await group.waitForAll()
        }
        done.set()
        let (seen, gaps) = try await follower
        #expect(gaps.isEmpty, "\(gaps.prefix(5))")
        let total = Int64(writers.count * rounds * 15)
        #expect(seen == Array(1...total))
        #expect(try await reader.lastEventSeq() == total)
        await fixture.finish()
    }

    /// Two daemons inserting a job to the same path at the same time: one gets it, the other
    /// is refused, never both (inserts check and write one at a time across the fleet).
    @Test func concurrentInsertsOfOnePathTakeItOnce() async throws {
        let fixture = try StoreFixture(.postgres)
        let a = try await fixture.open()
        let b = try await fixture.open()
        for round in 0..<30 {
            let path = "/tmp/race/\(round)"
            async let first = Result { try await a.insert([NewJob(url: "https://e.com/a", path: path)], now: t0) }
            async let second = Result { try await b.insert([NewJob(url: "https://e.com/b", path: path)], now: t0) }
            let results = await [first, second]
            #expect(results.filter { (try? $0.get()) != nil }.count == 1, "round \(round)")
            for case .failure(let error) in results {
                #expect(error is StoreError, "round \(round): \(error)")
            }
        }
        #expect(try await a.list().count == 30)
        await fixture.finish()
    }

    /// A statement sent on a connection that has closed fails at once. postgres-nio drops such
    /// a statement without an answer; when PostgreSQL went away as a store call took or used a
    /// connection, that call waited forever, and with it the engine's serial queue (issue 31).
    /// The watch that fails it forgets the connection once it has closed.
    @Test func aStatementOnAClosedConnectionFailsInsteadOfWaitingForever() async throws {
        let fixture = try StoreFixture(.postgres)
        let url = try #require(fixture.postgresURL)
        let connection = try await PostgresConnection.connect(
            configuration: try url.connectionConfiguration(), id: 1, logger: StoreFixture.logger)
        #expect(try await connection.rows("SELECT 1", logger: StoreFixture.logger).count == 1)
        #expect(ConnectionWatch.shared.watches(connection))
        try await connection.close()
        // In a task of its own, so that a statement that never answers fails this test
        // instead of hanging the run.
        let outcome = Outcome()
        Task {
            outcome.set(await Result { try await connection.run("ROLLBACK", logger: StoreFixture.logger) })
        }
        // Long enough for a loaded machine (the full suite on two cores once took more than
        // 10 s to run the task at all); it ends as soon as the statement has failed.
        let deadline = Date().addingTimeInterval(60)
        while outcome.value == nil, Date() < deadline { try await Task.sleep(for: .milliseconds(10)) }
        switch outcome.value {
        case nil: Issue.record("a statement on a closed connection did not answer within 60 s")
        case .success?: Issue.record("a statement on a closed connection succeeded")
        case .failure(let error)?: #expect(error is ConnectionLost, "\(error)")
        }
        // Forgotten by the close callback, which may come just after the failure.
        let forgotten = Date().addingTimeInterval(5)
        while ConnectionWatch.shared.watches(connection), Date() < forgotten { try await Task.sleep(for: .milliseconds(10)) }
        #expect(!ConnectionWatch.shared.watches(connection))
        await fixture.finish()
    }

    /// A server error reaches the caller with the server's words, and no password.
    @Test func errorsSayWhatThePostgreSQLServerSaid() async throws {
        let fixture = try StoreFixture(.postgres)
        var url = try #require(fixture.postgresURL)
        url.database = "no_such_database"
        url.password = "s3cret"
        do {
            let store = try await PostgresJobStore.open(url, maxConnections: 1, logger: StoreFixture.logger)
            await store.close()
            Issue.record("opened a database that does not exist")
        } catch {
            let text = "\(error)"
            #expect(text.contains("no_such_database"), "\(text)")
            #expect(!text.contains("s3cret"))
        }
        await fixture.finish()
    }
}

extension Result where Failure == any Error {
    init(catching body: () async throws -> Success) async {
        do { self = .success(try await body()) } catch { self = .failure(error) }
    }
}

final class Outcome: @unchecked Sendable {
    private let lock = NSLock()
    private var result: Result<Void, any Error>?
    func set(_ result: Result<Void, any Error>) { lock.withLock { self.result = result } }
    var value: Result<Void, any Error>? { lock.withLock { result } }
}

final class Flag: @unchecked Sendable {
    private let lock = NSLock()
    private var set_ = false
    func set() { lock.withLock { set_ = true } }
    var value: Bool { lock.withLock { set_ } }
}

/// Connection strings: parsed as libpq reads them, and never shown with their password.
@Suite struct PostgresURLTests {
    @Test func passwordsAreRedacted() {
        #expect(PostgresURL.redacted("postgresql://dld:s3cret@db.example.org:5432/jobs") == "postgresql://dld:***@db.example.org:5432/jobs")
        #expect(PostgresURL.redacted("postgres://u:p@ss@host/db?sslmode=require") == "postgres://u:***@host/db?sslmode=require")
        #expect(PostgresURL.redacted("postgresql://u:@host/db") == "postgresql://u:***@host/db")
        #expect(PostgresURL.redacted("postgresql://dld@host/db") == "postgresql://dld@host/db")
        #expect(
            PostgresURL.redacted("postgresql://host/db?user=u&password=s3cret&sslmode=disable")
                == "postgresql://host/db?user=u&password=***&sslmode=disable")
        #expect(PostgresURL.redacted("postgresql://host/db?PASSWORD=s3cret#x") == "postgresql://host/db?PASSWORD=***#x")
        #expect(PostgresURL.redacted("host=/run/postgresql password=s3cret dbname=jobs") == "host=/run/postgresql password=*** dbname=jobs")
        #expect(PostgresURL.redacted("postgresql://host/db?oldpassword=kept") == "postgresql://host/db?oldpassword=kept")
        #expect(PostgresURL.redacted("not a url") == "not a url")
    }

    @Test func parsesTCPAndUnixSocketForms() throws {
        let tcp = try PostgresURL.parse("postgresql://dld:p%40ss@db.example.org:6543/jobs?sslmode=require", defaultUser: "me")
        #expect(tcp.user == "dld")
        #expect(tcp.password == "p@ss")
        #expect(tcp.host == "db.example.org")
        #expect(tcp.port == 6543)
        #expect(tcp.database == "jobs")
        #expect(tcp.tls == .require)
        #expect(tcp.socketPath == nil)
        #expect(tcp.configuration.host == "db.example.org")

        let socket = try PostgresURL.parse("postgresql:///jobs?host=/run/postgresql", defaultUser: "me")
        #expect(socket.user == "me")
        #expect(socket.password == nil)
        #expect(socket.socketPath == "/run/postgresql/.s.PGSQL.5432")
        #expect(socket.configuration.unixSocketPath == "/run/postgresql/.s.PGSQL.5432")
        #expect(socket.database == "jobs")
        #expect(socket.tls == .disable)

        let plain = try PostgresURL.parse("postgres://db", defaultUser: "me")
        #expect(plain.host == "db")
        #expect(plain.port == 5432)
        #expect(plain.database == nil)
        #expect(plain.tls == .prefer)
    }

    @Test func refusesWhatItCannotUseWithoutShowingThePassword() {
        for bad in [
            "mysql://u:s3cret@h/db", "postgresql://u:s3cret@h/db?sslmode=verify-sometimes",
            "postgresql://u:s3cret@h/db?colour=blue", "postgresql://u:s3cret@h:99999/db",
            "postgresql://u:s3cret@/db?host=/run/pg&sslmode=require",
        ] {
            do {
                _ = try PostgresURL.parse(bad, defaultUser: "me")
                Issue.record("accepted \(bad)")
            } catch {
                #expect(!error.description.contains("s3cret"), "\(error)")
            }
        }
    }
}
