import DLCore
import DLRPC
import DLTestSupport
import Foundation
import Testing

/// The real `dld` with its job table in a real PostgreSQL (started by the test run itself,
/// see PostgresServer): the same queue as with SQLite, one daemon per worker id, and
/// `dld migrate` moving a SQLite table over. FleetTests has several workers on one queue.
@Suite(.serialized) struct PostgresDaemonTests {
    /// A database of its own, and its connection string with a password in it (trust
    /// authentication ignores it; it is there to be kept out of what dld prints).
    private func database() throws -> (server: PostgresServer, name: String, url: String) {
        let server = try PostgresServer.shared()
        let name = try server.createDatabase()
        return (server, name, "postgresql://\(server.user):s3cret-pw@/\(name)?host=\(server.socketFolder)&port=\(server.port)")
    }

    @Test func daemonKeepsItsQueueInPostgreSQL() async throws {
        let (server, name, url) = try database()
        defer { server.dropDatabase(name) }
        try await withOrigin { origin in
            let config = "database = \"\(url)\"\n"
            let daemon = try DaemonHarness(config: config)
            try daemon.start()
            let size = 3 << 20
            let id = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/\(size)"), "name": "pg.bin"])
            let done = try daemon.waitForState(id, ["completed", "failed"])
            #expect(done["state"] == "completed", "\(done.serializedString())")
            try expectOriginBytes(at: daemon.downloadDir + "/pg.bin", count: size)
            let paused = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/1000"), "name": "later.bin", "paused": true])

            // The rows are in PostgreSQL, not in a SQLite file.
            #expect(!FileManager.default.fileExists(atPath: daemon.stateDir + "/jobs.sqlite"))
            let rows = try server.psql(database: name, "SELECT id || ':' || state FROM jobs ORDER BY id")
            #expect(rows.split(separator: "\n").map(String.init) == ["\(id):completed", "\(paused):paused"])

            // A second daemon on the same database under the same worker id is refused, with
            // a reason (it would take the first one's jobs as its own).
            let second = try DaemonHarness(config: config)
            let refused = try runProgram(BuiltProducts.path("dld"), second.arguments, environment: second.environment)
            #expect(refused.status == 1)
            #expect(
                refused.stderr.contains("another dld runs as worker") && refused.stderr.contains("/dld on the database"),
                "\(refused.stderr)")

            // The password never shows: not in the printed config, not in the log.
            let printed = try runProgram(BuiltProducts.path("dld"), second.arguments + ["--print-config"], environment: second.environment)
            #expect(printed.stdout.contains("database = \"postgresql://\(server.user):***@"), "\(printed.stdout)")
            #expect(!printed.stdout.contains("s3cret-pw") && !refused.stderr.contains("s3cret-pw"))

            // After a restart the queue is there, and the second daemon may start once the
            // first has stopped (the lock goes with its connection).
            #expect(daemon.stop() == 0)
            #expect(!daemon.log.contains("s3cret-pw"))
            try second.start()
            defer { second.stop() }
            #expect(try second.job(id)["state"] == "completed")
            #expect(try second.job(paused)["state"] == "paused")
            _ = try second.call("resume", ["id": .int(paused)])
            #expect(try second.waitForState(paused, ["completed", "failed"])["state"] == "completed")
        }
    }

    /// A database that cannot be used is a clear start-up error, never a hang.
    @Test func unusableDatabaseIsAClearError() throws {
        let server = try PostgresServer.shared()
        let daemon = try DaemonHarness(
            config: "database = \"postgresql://\(server.user):pw@/no_such_db?host=\(server.socketFolder)&port=\(server.port)\"\n")
        let output = try runProgram(BuiltProducts.path("dld"), daemon.arguments, environment: daemon.environment)
        #expect(output.status == 1)
        #expect(output.stderr.contains("no_such_db") && output.stderr.contains("does not exist"), "\(output.stderr)")
        #expect(!output.stderr.contains("pw@"))
        let bad = try DaemonHarness(config: "database = \"mysql://x\"\n")
        let invalid = try runProgram(BuiltProducts.path("dld"), bad.arguments, environment: bad.environment)
        #expect(invalid.status != 0)
        #expect(invalid.stderr.contains("database: not a PostgreSQL URL"), "\(invalid.stderr)")
    }

    /// `dld migrate --to` copies jobs, groups and events with their ids into an empty
    /// database; the daemon then serves the same queue from it and new ids follow the old.
    @Test func migrateMovesTheQueue() async throws {
        let (server, name, url) = try database()
        defer { server.dropDatabase(name) }
        try await withOrigin { origin in
            let daemon = try DaemonHarness()
            try daemon.start()
            let done = try daemon.enqueue([
                "url": .string("\(origin.baseURL)/bytes/4000"), "name": "done.bin", "key": "k-done", "meta": ["n": 1],
            ])
            #expect(try daemon.waitForState(done, ["completed", "failed"])["state"] == "completed")
            let waiting = try daemon.enqueue([
                "url": .string("\(origin.baseURL)/bytes/5000"), "name": "wait.bin", "paused": true, "priority": 7,
            ])
            let group = try daemon.call(
                "enqueue",
                [
                    "group": ["name": "chapter", "dir": .string(daemon.downloadDir + "/chapter")], "paused": true,
                    "jobs": [
                        ["url": .string("\(origin.baseURL)/bytes/100"), "name": "p1"],
                        ["url": .string("\(origin.baseURL)/bytes/200"), "name": "p2"],
                    ],
                ])
            let groupID = try #require(group["group"]?["id"]?.int64Value)
            let before = try daemon.call("list", [:])["jobs"]?.arrayValue ?? []

            // Not while the daemon runs: the state folder's lock says so.
            let running = try runProgram(
                BuiltProducts.path("dld"), ["migrate", "--state-dir", daemon.stateDir, "--to", url], environment: daemon.environment)
            #expect(running.status == 1)
            #expect(running.stderr.contains("stop dld before migrating"), "\(running.stderr)")

            #expect(daemon.stop() == 0)
            let moved = try runProgram(
                BuiltProducts.path("dld"), ["migrate", "--state-dir", daemon.stateDir, "--to", url], environment: daemon.environment)
            #expect(moved.status == 0, "\(moved.stderr)")
            #expect(moved.stdout.contains("copied 4 jobs, 1 groups"), "\(moved.stdout)")
            #expect(!moved.stdout.contains("s3cret-pw") && !moved.stderr.contains("s3cret-pw"))

            // Into a table that is no longer empty: refused, nothing written.
            let again = try runProgram(
                BuiltProducts.path("dld"), ["migrate", "--state-dir", daemon.stateDir, "--to", url], environment: daemon.environment)
            #expect(again.status == 1)
            #expect(again.stderr.contains("not empty"), "\(again.stderr)")

            let onPostgres = try DaemonHarness(config: "database = \"\(url)\"\n")
            try onPostgres.start()
            defer { onPostgres.stop() }
            let after = try onPostgres.call("list", [:])["jobs"]?.arrayValue ?? []
            // The same jobs, field for field (speed and progress are live values).
            let strip = { (jobs: [JSONValue]) in
                jobs.map { job -> JSONValue in
                    guard case .object(var object) = job else { return job }
                    object["speed"] = nil
                    return .object(object)
                }
            }
            #expect(strip(after) == strip(before))
            #expect(try onPostgres.call("status", ["group": .int(groupID)])["group"]?["name"] == "chapter")
            #expect(try onPostgres.call("enqueue", ["url": .string("\(origin.baseURL)/bytes/10"), "key": "k-done"])["created"] == false)
            let fresh = try onPostgres.enqueue(["url": .string("\(origin.baseURL)/bytes/300"), "name": "new.bin"])
            #expect(fresh > (before.compactMap { $0["id"]?.int64Value }.max() ?? 0))
            // The events came along: a replay from the start has the first job's completion.
            let replayed = try server.psql(database: name, "SELECT count(*) FROM events WHERE job_id = \(done) AND state = 'completed'")
            #expect(replayed.trimmingCharacters(in: .whitespacesAndNewlines) == "1")
            _ = try onPostgres.call("resume", ["id": .int(waiting)])
            #expect(try onPostgres.waitForState(waiting, ["completed", "failed"])["state"] == "completed")
        }
    }
}
