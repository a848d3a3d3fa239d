import DLTestSupport
import Foundation
import Testing

/// The throwaway PostgreSQL the store tests run against: started by the test run itself (as
/// the `postgres` user when the tests run as root), one database per test.
@Suite struct PostgresServerTests {
    /// The shared server answers on its socket, and two databases do not see each other's tables.
    @Test func databasesAreSeparate() throws {
        let server = try PostgresServer.shared()
        #expect(FileManager.default.fileExists(atPath: server.socketPath))
        #expect(try PostgresServer.shared() === server, "one server per test process")
        let a = try server.createDatabase()
        let b = try server.createDatabase()
        #expect(a != b)
        _ = try server.psql(database: a, "CREATE TABLE only_in_a (n int); INSERT INTO only_in_a VALUES (7)")
        #expect(try server.psql(database: a, "SELECT n FROM only_in_a") == "7\n")
        #expect(try server.psql(database: b, "SELECT count(*) FROM pg_tables WHERE tablename = 'only_in_a'") == "0\n")
        #expect(throws: PostgresServerError.self) { try server.psql(database: b, "SELECT n FROM only_in_a") }
        server.dropDatabase(a)
        server.dropDatabase(b)
        #expect(try server.psql(database: "postgres", "SELECT count(*) FROM pg_database WHERE datname IN ('\(a)', '\(b)')") == "0\n")
    }

    /// A server of its own starts, serves, and leaves nothing behind when stopped.
    @Test func startsAndStopsCleanly() throws {
        let server = try PostgresServer.start()
        #expect(try server.psql(database: "postgres", "SHOW listen_addresses") == "\n", "no TCP listener")
        #expect(try server.psql(database: "postgres", "SHOW fsync") == "on\n")
        server.stop()
        #expect(!FileManager.default.fileExists(atPath: server.folder))
    }
}

@Suite struct PostgresServerSetupTests {
    /// Without PostgreSQL's programs the error says so, and how to install them.
    @Test func missingProgramsSayHowToInstall() throws {
        let folder = try TempFolder()
        do {
            _ = try PostgresServer.findBinaries(searchPath: folder.path, libRoot: folder.path + "/none")
            Issue.record("found PostgreSQL in an empty folder")
        } catch {
            #expect(error.description.contains("PostgreSQL is not installed"))
            #expect(error.description.contains("sudo apt-get install postgresql"))
            #expect(error.description.contains("make deps"))
        }
    }

    /// Programs are found through the search path, and in the newest version's folder of
    /// Debian's layout.
    @Test func findsProgramsOnThePathAndInDebiansLayout() throws {
        let folder = try TempFolder()
        let fm = FileManager.default
        for version in ["13", "15"] {
            let bin = folder.path + "/lib/\(version)/bin"
            try fm.createDirectory(atPath: bin, withIntermediateDirectories: true)
            for program in ["initdb", "postgres", "createdb", "dropdb", "psql"] {
                #expect(
                    fm.createFile(atPath: bin + "/" + program, contents: Data("#!/bin/sh\n".utf8), attributes: [.posixPermissions: 0o755]))
            }
        }
        #expect(try PostgresServer.findBinaries(searchPath: "/nonexistent", libRoot: folder.path + "/lib") == folder.path + "/lib/15/bin")
        // A link on the search path leads to the folder that holds the rest.
        try fm.createDirectory(atPath: folder.path + "/path", withIntermediateDirectories: true)
        try fm.createSymbolicLink(atPath: folder.path + "/path/initdb", withDestinationPath: folder.path + "/lib/13/bin/initdb")
        let found = try PostgresServer.findBinaries(searchPath: folder.path + "/path", libRoot: folder.path + "/lib")
        #expect(found.hasSuffix("/lib/13/bin"))
    }

    /// The folder of a test run that died with its server still there is removed by the next start.
    @Test func leftoversOfDeadRunsAreRemoved() throws {
        let dead = Process()
        dead.executableURL = URL(fileURLWithPath: "/bin/true")
        try dead.run()
        dead.waitUntilExit()
        let leftover = NSTemporaryDirectory() + "dld-pg-\(dead.processIdentifier)-abcdef"
        try FileManager.default.createDirectory(atPath: leftover + "/data", withIntermediateDirectories: true)
        let server = try PostgresServer.start()
        defer { server.stop() }
        #expect(!FileManager.default.fileExists(atPath: leftover))
    }
}
