import Foundation
import Synchronization

/// A throwaway PostgreSQL server for tests, from Debian's `postgresql` package: `initdb` into
/// a temporary folder (trust authentication, UTF8, C locale), then `postgres` listening only
/// on a Unix socket in that folder (no TCP port, so parallel test runs never collide).
///
/// PostgreSQL refuses to run as root, and tests often do (containers, CI): then the folder is
/// handed to the `postgres` system user that the Debian package creates, and `initdb` and
/// `postgres` run as that user through `setpriv`. The server's superuser is `dld` either way.
///
/// One server serves many tests: each asks for a fresh database (`createDatabase()`), so tests
/// never see each other's rows. `shared()` starts one per test process, lazily, and stops it
/// when the process exits. A server left behind by a test process that was killed is stopped
/// and removed by the next `start()`.
public final class PostgresServer: Sendable {
    /// The temporary folder: the data folder, the socket and the log.
    public let folder: String
    /// Where the server's programs are (`initdb`, `postgres`, `createdb`, ...).
    public let binDir: String
    /// The superuser, trusted on the socket without a password.
    public let user = "dld"
    /// Only names the socket file (`.s.PGSQL.<port>`); nothing listens on TCP.
    public let port = 5432
    /// The postmaster running now (another one after `restart`).
    private let current: Mutex<Process>
    private var process: Process { current.withLock { $0 } }
    /// The user the server runs as when the tests run as root (uid, gid).
    private let runAs: [UInt32]?
    private let names = Mutex(0)

    /// The folder `unix_socket_directories` names (a libpq `host=` value).
    public var socketFolder: String { folder }
    /// The socket file itself, which postgres-nio connects to.
    public var socketPath: String { folder + "/.s.PGSQL.\(port)" }
    public var dataDir: String { folder + "/data" }
    /// Everything the server logged.
    public var log: String { (try? String(contentsOfFile: folder + "/postgres.log", encoding: .utf8)) ?? "" }

    // MARK: One server per test process

    private static let sharedServer = Mutex<Result<PostgresServer, PostgresServerError>?>(nil)

    /// The server of this test process, started on first use. A failure to start is kept and
    /// thrown to every caller, so that each test fails with the same message (PostgreSQL
    /// missing, say) instead of trying again.
    public static func shared() throws(PostgresServerError) -> PostgresServer {
        let result = sharedServer.withLock { shared -> Result<PostgresServer, PostgresServerError> in
            if let shared { return shared }
            let started: Result<PostgresServer, PostgresServerError>
            do throws(PostgresServerError) {
                started = .success(try PostgresServer.start())
                atexit { PostgresServer.stopShared() }
            } catch {
                started = .failure(error)
            }
            shared = started
            return started
        }
        return try result.get()
    }

    private static func stopShared() {
        if case .success(let server)? = sharedServer.withLock({ $0 }) { server.stop() }
    }

    // MARK: Starting and stopping

    /// Creates the cluster and starts the server; returns once it accepts connections.
    public static func start(timeout: TimeInterval = 60) throws(PostgresServerError) -> PostgresServer {
        let binDir = try findBinaries()
        removeLeftovers()
        var template = Array((NSTemporaryDirectory() + "dld-pg-\(getpid())-XXXXXX").utf8CString)
        let made = template.withUnsafeMutableBufferPointer { buffer -> String? in
            guard let base = buffer.baseAddress, mkdtemp(base) != nil else { return nil }
            return String(cString: base)
        }
        guard let folder = made else {
            throw PostgresServerError("cannot create a temporary folder for PostgreSQL: \(String(cString: strerror(errno)))")
        }
        do throws(PostgresServerError) {
            let runAs = try serverUser()
            if let runAs, chown(folder, runAs.uid, runAs.gid) != 0 {
                throw PostgresServerError("cannot hand \(folder) to the postgres user: \(String(cString: strerror(errno)))")
            }
            let initdb = try run(
                binDir + "/initdb",
                ["-D", folder + "/data", "-U", "dld", "--auth=trust", "-E", "UTF8", "--no-locale"],
                as: runAs, in: folder)
            guard initdb.status == 0 else {
                throw PostgresServerError("initdb failed (status \(initdb.status)):\n\(initdb.stdout)\(initdb.stderr)")
            }
            let process = try launch(binDir: binDir, folder: folder, as: runAs, log: folder + "/postgres.log")
            let server = PostgresServer(folder: folder, binDir: binDir, process: process, runAs: runAs)
            try server.waitUntilReady(timeout: timeout)
            return server
        } catch {
            try? FileManager.default.removeItem(atPath: folder)
            throw error
        }
    }

    private init(folder: String, binDir: String, process: Process, runAs: (uid: uid_t, gid: gid_t)?) {
        self.folder = folder
        self.binDir = binDir
        self.current = Mutex(process)
        self.runAs = runAs.map { [$0.uid, $0.gid] }
    }

    /// The postmaster, with this server's settings.
    private static func launch(binDir: String, folder: String, as runAs: (uid: uid_t, gid: gid_t)?, log: String) throws(PostgresServerError)
        -> Process
    {
        try launch(
            binDir + "/postgres",
            [
                "-D", folder + "/data", "-c", "listen_addresses=", "-c", "unix_socket_directories=\(folder)",
                // Every test has a database and a small pool of its own, and tests run in parallel.
                "-c", "max_connections=300",
            ],
            as: runAs, in: folder, log: log)
    }

    /// The server goes away as in a crash or a power cut of its machine (`pg_ctl stop -m
    /// immediate`: every backend ends at once, every connection is cut), and stays away until
    /// `restart`. Its data folder is kept; committed transactions survive (WAL).
    public func halt() {
        let process = self.process
        guard process.isRunning else { return }
        kill(process.processIdentifier, SIGQUIT)
        process.waitUntilExit()
    }

    /// Starts the server again on its data after `halt`; returns once it accepts connections
    /// (after its crash recovery). Its log goes on in `postgres.log`.
    public func restart(timeout: TimeInterval = 60) throws(PostgresServerError) {
        guard !process.isRunning else { return }
        let runAs = self.runAs.map { (uid: $0[0], gid: $0[1]) }
        let log = folder + "/postgres-\(UUID().uuidString.prefix(8)).log"
        let process = try Self.launch(binDir: binDir, folder: folder, as: runAs, log: log)
        current.withLock { $0 = process }
        try waitUntilReady(timeout: timeout)
    }

    /// `pg_ctl stop -m immediate`: SIGQUIT to the postmaster, which ends every backend at
    /// once (nothing in a test server is worth a checkpoint), then the folder is removed.
    public func stop() {
        let process = self.process
        if process.isRunning {
            kill(process.processIdentifier, SIGQUIT)
            // The postmaster removes its pid file as it exits.
            let deadline = Date().addingTimeInterval(10)
            while process.isRunning, FileManager.default.fileExists(atPath: dataDir + "/postmaster.pid"), Date() < deadline {
                usleep(10_000)
            }
            if process.isRunning, FileManager.default.fileExists(atPath: dataDir + "/postmaster.pid") {
                kill(process.processIdentifier, SIGKILL)
            }
        }
        try? FileManager.default.removeItem(atPath: folder)
    }

    /// The postmaster writes `ready` on the 8th line of its pid file once it accepts
    /// connections (what `pg_ctl start -w` waits for).
    private func waitUntilReady(timeout: TimeInterval) throws(PostgresServerError) {
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            guard process.isRunning else {
                throw PostgresServerError("postgres exited with status \(process.terminationStatus) at start:\n\(log)")
            }
            if let pidFile = try? String(contentsOfFile: dataDir + "/postmaster.pid", encoding: .utf8) {
                let lines = pidFile.split(separator: "\n", omittingEmptySubsequences: false)
                if lines.count > 7, lines[7].trimmingCharacters(in: .whitespaces) == "ready" { return }
            }
            usleep(20_000)
        }
        stop()
        throw PostgresServerError("postgres did not accept connections within \(timeout) s:\n\(log)")
    }

    // MARK: Databases

    /// A new, empty database; its name is returned. Each test takes its own.
    public func createDatabase() throws(PostgresServerError) -> String {
        let n = names.withLock { n in
            n += 1
            return n
        }
        let name = "dld_test_\(n)_\(UUID().uuidString.prefix(8).lowercased())"
        let output = try Self.run(binDir + "/createdb", ["-h", folder, "-p", "\(port)", "-U", user, name], as: nil, in: folder)
        guard output.status == 0 else {
            throw PostgresServerError("createdb \(name) failed (status \(output.status)): \(output.stderr)\n\(log)")
        }
        return name
    }

    /// Drops a database, ending its connections (best effort: the server goes away anyway).
    public func dropDatabase(_ name: String) {
        _ = try? Self.run(
            binDir + "/dropdb", ["-h", folder, "-p", "\(port)", "-U", user, "--force", "--if-exists", name], as: nil, in: folder)
    }

    /// Runs SQL with `psql` on a database, as the superuser; returns what it printed (rows
    /// unaligned, without headers), or throws with its error.
    public func psql(database: String, _ sql: String) throws(PostgresServerError) -> String {
        let output = try Self.run(
            binDir + "/psql",
            ["-h", folder, "-p", "\(port)", "-U", user, "-d", database, "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql],
            as: nil, in: folder)
        guard output.status == 0 else { throw PostgresServerError("psql failed (status \(output.status)): \(output.stderr)") }
        return output.stdout
    }

    /// A libpq connection string for the database (for `psql` and error messages).
    public func url(database: String) -> String {
        "postgresql://\(user)@/\(database)?host=\(folder)&port=\(port)"
    }

    // MARK: Finding and running PostgreSQL's programs

    static let programs = ["initdb", "postgres", "createdb", "dropdb", "psql"]

    /// The folder that holds PostgreSQL's server programs: where `initdb` is on the search
    /// path (with symlinks resolved: Debian keeps them in /usr/lib/postgresql/<version>/bin),
    /// else the newest `<libRoot>/*/bin`. Throws, saying how to install them, when neither has them.
    public static func findBinaries(
        searchPath: String = ProcessInfo.processInfo.environment["PATH"] ?? "/usr/local/bin:/usr/bin:/bin",
        libRoot: String = "/usr/lib/postgresql"
    ) throws(PostgresServerError) -> String {
        var candidates: [String] = []
        for dir in searchPath.split(separator: ":") where !dir.isEmpty {
            let initdb = String(dir) + "/initdb"
            if FileManager.default.isExecutableFile(atPath: initdb), let real = realPath(initdb) {
                candidates.append((real as NSString).deletingLastPathComponent)
            }
        }
        let versions = ((try? FileManager.default.contentsOfDirectory(atPath: libRoot)) ?? [])
            .compactMap { Int($0) }.sorted(by: >)
        candidates += versions.map { "\(libRoot)/\($0)/bin" }
        for dir in candidates where programs.allSatisfy({ FileManager.default.isExecutableFile(atPath: dir + "/" + $0) }) {
            return dir
        }
        throw PostgresServerError(
            "PostgreSQL is not installed: the tests of the PostgreSQL store start a server of their own with "
                + "initdb and postgres, found neither on PATH nor in \(libRoot)/*/bin. Install it with "
                + "`sudo apt-get install postgresql` (Debian), or run `make deps` as root.")
    }

    /// The user the server runs as: nil for the current user; the `postgres` system user when
    /// we are root, which PostgreSQL refuses to run as.
    static func serverUser() throws(PostgresServerError) -> (uid: uid_t, gid: gid_t)? {
        guard geteuid() == 0 else { return nil }
        guard let entry = getpwnam("postgres") else {
            throw PostgresServerError(
                "PostgreSQL refuses to run as root, and there is no `postgres` user to run it as. Install Debian's "
                    + "postgresql package (it creates that user): `sudo apt-get install postgresql` or `make deps` "
                    + "as root; or run the tests as another user.")
        }
        return (entry.pointee.pw_uid, entry.pointee.pw_gid)
    }

    /// `setpriv` execs the program as that user, so the process we start is the program
    /// itself (its pid is the postmaster's).
    private static func command(_ program: String, _ arguments: [String], as user: (uid: uid_t, gid: gid_t)?) -> (String, [String]) {
        guard let user else { return (program, arguments) }
        return ("/usr/bin/setpriv", ["--reuid=\(user.uid)", "--regid=\(user.gid)", "--clear-groups", program] + arguments)
    }

    private static func run(_ program: String, _ arguments: [String], as user: (uid: uid_t, gid: gid_t)?, in folder: String)
        throws(PostgresServerError) -> ProgramOutput
    {
        let (executable, args) = command(program, arguments, as: user)
        do {
            return try runProgram(executable, args, environment: environment, currentDirectory: folder)
        } catch {
            throw PostgresServerError("cannot run \(program): \(error)")
        }
    }

    private static func launch(
        _ program: String, _ arguments: [String], as user: (uid: uid_t, gid: gid_t)?, in folder: String, log: String
    ) throws(PostgresServerError) -> Process {
        let (executable, args) = command(program, arguments, as: user)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = args
        process.environment = environment
        process.currentDirectoryURL = URL(fileURLWithPath: folder)
        guard FileManager.default.createFile(atPath: log, contents: nil), let handle = FileHandle(forWritingAtPath: log) else {
            throw PostgresServerError("cannot create \(log)")
        }
        defer { try? handle.close() }
        process.standardOutput = handle
        process.standardError = handle
        process.standardInput = FileHandle.nullDevice
        do {
            try process.run()
        } catch {
            throw PostgresServerError("cannot start \(program): \(error)")
        }
        return process
    }

    /// The test runner's environment without the libpq variables that would point the
    /// programs at another server, and with a locale every machine has.
    private static var environment: [String: String] {
        var env = ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("PG") }
        env["LC_ALL"] = "C"
        return env
    }

    /// Servers of test processes that died without stopping theirs (SIGKILL, a crash): their
    /// folders are named after the pid, which no longer runs.
    private static func removeLeftovers() {
        let tmp = NSTemporaryDirectory()
        for name in (try? FileManager.default.contentsOfDirectory(atPath: tmp)) ?? [] where name.hasPrefix("dld-pg-") {
            let parts = name.split(separator: "-")
            guard parts.count == 4, let owner = Int32(parts[2]), owner != getpid(), kill(owner, 0) != 0, errno == ESRCH else { continue }
            let folder = tmp + name
            // Only a postmaster is sent the signal: a pid in an old file may name another program by now.
            if let pidFile = try? String(contentsOfFile: folder + "/data/postmaster.pid", encoding: .utf8),
                let pid = Int32(pidFile.prefix(while: { $0 != "\n" })), pid > 0,
                (try? String(contentsOfFile: "/proc/\(pid)/comm", encoding: .utf8))?.hasPrefix("postgres") == true
            {
                kill(pid, SIGQUIT)
                let deadline = Date().addingTimeInterval(5)
                while FileManager.default.fileExists(atPath: folder + "/data/postmaster.pid"), Date() < deadline { usleep(10_000) }
            }
            try? FileManager.default.removeItem(atPath: folder)
        }
    }

    private static func realPath(_ path: String) -> String? {
        guard let real = realpath(path, nil) else { return nil }
        defer { free(real) }
        return String(cString: real)
    }
}

/// Why the test server could not be started or used; the message says what to do.
public struct PostgresServerError: Error, Sendable, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}

/// A `psql` session of its own, kept open: what it is sent runs in it (a transaction that
/// holds row locks, for one), until `close`.
public final class PostgresSession: @unchecked Sendable {
    let process = Process()
    let input = Pipe()

    public init(_ server: PostgresServer, database: String) throws {
        process.executableURL = URL(fileURLWithPath: server.binDir + "/psql")
        process.arguments = ["-h", server.socketFolder, "-p", "\(server.port)", "-U", server.user, "-d", database, "-X", "-q"]
        process.environment = ProcessInfo.processInfo.environment.merging(["PGAPPNAME": "dld-test-holder"]) { $1 }
        process.standardInput = input
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
    }

    public func send(_ sql: String) { input.fileHandleForWriting.write(Data((sql + "\n").utf8)) }

    public func close() {
        try? input.fileHandleForWriting.close()
        process.waitUntilExit()
    }
}
