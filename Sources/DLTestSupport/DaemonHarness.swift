import DLRPC
import Foundation

/// Finds the `dld`, `dlctl` and `dld-origin` of this build: in `DLD_BIN_DIR` if set, else in
/// the folder that holds the running test binary (SwiftPM puts a build's executables and its
/// test binary or `.xctest` bundle side by side). Never elsewhere: binaries left over from
/// another build or configuration would test code other than the one under test.
public enum BuiltProducts {
    /// The folder searched: `DLD_BIN_DIR`, else the products folder of the running build.
    public static var folder: String {
        if let dir = ProcessInfo.processInfo.environment["DLD_BIN_DIR"], !dir.isEmpty { return dir }
        let exe = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
        var dir = (exe as NSString).deletingLastPathComponent
        // Inside an .xctest bundle (macOS) the binary sits a few folders down.
        var probe = dir
        while probe != "/" && !probe.isEmpty {
            if probe.hasSuffix(".xctest") {
                dir = (probe as NSString).deletingLastPathComponent
                break
            }
            probe = (probe as NSString).deletingLastPathComponent
        }
        return dir
    }

    /// The path of the executable `name` of this build; throws, saying what to do, when it is
    /// not there.
    public static func path(_ name: String) throws -> String {
        let dir = folder
        let candidate = dir + "/" + name
        guard FileManager.default.isExecutableFile(atPath: candidate) else {
            throw HarnessError(
                "\(name) of this build is missing: no executable at \(candidate). The end-to-end tests run the "
                    + "binaries built with them: run `swift build --build-tests` (same configuration) first, "
                    + "or set DLD_BIN_DIR to the folder that holds them.")
        }
        return candidate
    }
}

/// What a finished program printed.
public struct ProgramOutput: Sendable {
    public var status: Int32
    public var stdout: String
    public var stderr: String
}

/// Runs a program to its end and collects its output.
///
/// Its output goes to temporary files, not pipes: a pipe's end is only seen when every process
/// holding its write side has closed it, and a process that another test launches at the same
/// moment may inherit that side (seen: a FUSE daemon started by one test kept `mount`'s pipe
/// of another open, and the reader waited forever on a program that had exited).
public func runProgram(
    _ path: String, _ arguments: [String], environment: [String: String]? = nil, stdin: Data? = nil, currentDirectory: String? = nil
) throws -> ProgramOutput {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: path)
    process.arguments = arguments
    if let environment { process.environment = environment }
    if let currentDirectory { process.currentDirectoryURL = URL(fileURLWithPath: currentDirectory) }
    let out = try OutputFile()
    let err = try OutputFile()
    let input = Pipe()
    process.standardOutput = out.handle
    process.standardError = err.handle
    process.standardInput = input
    try process.run()
    if let stdin { input.fileHandleForWriting.write(stdin) }
    try? input.fileHandleForWriting.close()
    process.waitUntilExit()
    return ProgramOutput(
        status: process.terminationStatus, stdout: String(decoding: out.contents(), as: UTF8.self),
        stderr: String(decoding: err.contents(), as: UTF8.self))
}

/// An unnamed temporary file a child process writes its output to.
private final class OutputFile {
    let handle: FileHandle
    private let path: String

    init() throws {
        var template = Array("/tmp/dld-output-XXXXXX".utf8CString)
        let fd = template.withUnsafeMutableBufferPointer { buffer -> Int32 in
            guard let base = buffer.baseAddress else { return -1 }
            return mkstemp(base)
        }
        guard fd >= 0 else { throw HarnessError("mkstemp failed: \(String(cString: strerror(errno)))") }
        path = template.withUnsafeBufferPointer { buffer in buffer.baseAddress.map { String(cString: $0) } ?? "" }
        handle = FileHandle(fileDescriptor: fd, closeOnDealloc: true)
    }

    func contents() -> Data {
        (try? Data(contentsOf: URL(fileURLWithPath: path))) ?? Data()
    }

    deinit { unlink(path) }
}

/// A real `dld` process on a temporary socket, state folder and download folder, for
/// end-to-end tests. Everything lives under one short temp folder (socket paths are limited to
/// 107 bytes), removed when the harness goes away.
public final class DaemonHarness: @unchecked Sendable {
    public let root: String
    public let socket: String
    public let stateDir: String
    public let downloadDir: String
    public var extraArguments: [String]
    private var process: Process?
    private var logPipe: Pipe?
    private let logLock = NSLock()
    private var logData = Data()

    /// A private `$HOME` (root/home) instead of the test runner's.
    public let home: String?
    /// No `--socket`: the default path under `XDG_RUNTIME_DIR=root/xdg` is used.
    public let defaultSocket: Bool
    /// The umask dld starts with (through /bin/sh), to test modes under a loose one.
    public var umask: String?
    /// Variables added to dld's environment (`SSL_CERT_FILE`, say).
    public var extraEnvironment: [String: String] = [:]
    /// A program that starts dld in its turn, with its arguments (dld's path and arguments
    /// follow): `systemd-socket-activate -l SOCKET` for socket activation. It must exec dld,
    /// so that its process becomes dld's. It runs under a small python3 parent that waits for
    /// it, not as a child of the test process: with systemd-socket-activate as its direct
    /// child, Foundation's `Process` never saw its other children (dlctl) exit.
    public var launcher: [String] = []
    private var launcherPIDFile: String { root + "/launcher.pid" }

    /// - Parameter config: the text of a config file to start dld with (docs/configuration.md).
    /// - Parameter dataRoot: the folder that holds the state folder and the download folder
    ///   (`state` and `dl`), when not the harness's own temp folder (a powercutfs mount).
    public init(
        extraArguments: [String] = [], config: String? = nil, privateHome: Bool = false, defaultSocket: Bool = false,
        dataRoot: String? = nil
    ) throws {
        let made = try makeTemporaryFolder("/tmp/dldt-XXXXXX")
        root = made
        self.defaultSocket = defaultSocket
        home = privateHome ? made + "/home" : nil
        if let home { try FileManager.default.createDirectory(atPath: home, withIntermediateDirectories: true) }
        socket = defaultSocket ? root + "/xdg/dld/dld.sock" : root + "/s.sock"
        stateDir = (dataRoot ?? root) + "/state"
        downloadDir = (dataRoot ?? root) + "/dl"
        self.extraArguments = extraArguments
        try FileManager.default.createDirectory(atPath: downloadDir, withIntermediateDirectories: true)
        if let config {
            try config.write(toFile: root + "/config.toml", atomically: true, encoding: .utf8)
            self.extraArguments += ["--config", root + "/config.toml"]
        }
    }

    deinit {
        if let process, process.isRunning {
            if let pid { kill(pid, SIGKILL) }
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
        try? FileManager.default.removeItem(atPath: root)
    }

    public var arguments: [String] {
        (defaultSocket ? [] : ["--socket", socket])
            + ["--state-dir", stateDir, "--download-dir", downloadDir, "--log-level", "debug"]
            + (httpListen.map { ["--http-listen", $0] } ?? []) + extraArguments
    }

    /// `--http-listen`: none ("") unless a test asks, so that the daemons of tests run in
    /// parallel do not take the default ports (6802…6811) from each other; nil: the config's.
    public var httpListen: String? = ""

    /// The environment for dld and dlctl: no user config file, no stray DLD_SOCKET.
    public var environment: [String: String] {
        var env = ProcessInfo.processInfo.environment
        env["XDG_CONFIG_HOME"] = root + "/config"
        // The URL cache's default folder: each daemon its own, never the test runner's.
        env["XDG_CACHE_HOME"] = root + "/cache"
        env["DLD_SOCKET"] = socket
        if let home { env["HOME"] = home }
        if defaultSocket { env["XDG_RUNTIME_DIR"] = root + "/xdg" }
        env.merge(extraEnvironment) { _, new in new }
        return env
    }

    /// Starts dld and waits until it answers on its socket.
    public func start(timeout: TimeInterval = 20) throws {
        let process = try launch()
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            if !process.isRunning {
                throw HarnessError("dld exited with status \(process.terminationStatus) at start:\n\(log)")
            }
            if (try? call("version")) != nil { return }
            usleep(20_000)
        }
        throw HarnessError("dld did not answer within \(timeout) s:\n\(log)")
    }

    /// Starts dld (through `launcher` and `umask` if set) and returns at once.
    @discardableResult
    public func launch() throws -> Process {
        let process = Process()
        let command = launcher + [try BuiltProducts.path("dld")] + arguments
        if !launcher.isEmpty {
            // A blocking waitpid: a shell's `wait` sleeps for a SIGCHLD that the test
            // process's children may have blocked, and never reaps dld.
            let wrapper = """
                import os, sys
                if len(sys.argv[1]): os.umask(int(sys.argv[1], 8))
                pid = os.fork()
                if pid == 0:
                    os.execv(sys.argv[3], sys.argv[3:])
                with open(sys.argv[2], "w") as f: f.write(str(pid))
                sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) & 0xFF)
                """
            process.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
            process.arguments = ["-c", wrapper, umask ?? "", launcherPIDFile] + command
        } else if let umask {
            process.executableURL = URL(fileURLWithPath: "/bin/sh")
            process.arguments = ["-c", "umask \(umask); exec \"$0\" \"$@\""] + command
        } else {
            process.executableURL = URL(fileURLWithPath: command[0])
            process.arguments = Array(command.dropFirst())
        }
        process.environment = environment
        let pipe = Pipe()
        process.standardOutput = pipe
        process.standardError = pipe
        pipe.fileHandleForReading.readabilityHandler = { [weak self] handle in
            let data = handle.availableData
            guard let self, !data.isEmpty else { return }
            self.logLock.lock()
            self.logData.append(data)
            self.logLock.unlock()
        }
        try process.run()
        self.process = process
        self.logPipe = pipe
        return process
    }

    /// Sends a signal to dld (SIGHUP to reload, say) and returns at once.
    public func send(_ sig: Int32) {
        if let process, process.isRunning, let pid { kill(pid, sig) }
    }

    /// Polls until the log holds `text`; returns whether it did within the time.
    public func waitForLog(_ text: String, timeout: TimeInterval = 30) -> Bool {
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            if log.contains(text) { return true }
            usleep(20_000)
        }
        return log.contains(text)
    }

    /// Everything dld printed so far.
    public var log: String {
        logLock.lock()
        defer { logLock.unlock() }
        return String(decoding: logData, as: UTF8.self)
    }

    /// dld's process: the one started, or the launcher's (which became dld).
    public var pid: Int32? {
        guard let process else { return nil }
        if launcher.isEmpty { return process.processIdentifier }
        return (try? String(contentsOfFile: launcherPIDFile, encoding: .utf8)).flatMap {
            Int32($0.trimmingCharacters(in: .whitespacesAndNewlines))
        }
    }
    public var isRunning: Bool { process?.isRunning ?? false }

    /// SIGTERM, then waits for the exit; returns the exit status.
    @discardableResult
    public func stop(timeout: TimeInterval = 20) -> Int32 {
        signal(SIGTERM, timeout: timeout)
    }

    /// SIGKILL: the daemon gets no chance to clean up, as in a crash or power loss.
    public func crash() {
        _ = signal(SIGKILL, timeout: 10)
    }

    private func signal(_ sig: Int32, timeout: TimeInterval) -> Int32 {
        guard let process else { return -1 }
        let target = pid ?? process.processIdentifier
        if process.isRunning { kill(target, sig) }
        let deadline = Date().addingTimeInterval(timeout)
        while process.isRunning && Date() < deadline { usleep(10_000) }
        if process.isRunning {
            kill(target, SIGKILL)
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
        logPipe?.fileHandleForReading.readabilityHandler = nil
        self.process = nil
        return process.terminationStatus
    }

    /// One call on a fresh connection.
    public func call(_ method: String, _ params: [String: JSONValue] = [:]) throws -> JSONValue {
        let client = RPCClient(socketPath: socket)
        defer { client.close() }
        return try client.call(method, params)
    }

    /// The error a call fails with; throws if it succeeds.
    public func callError(_ method: String, _ params: [String: JSONValue] = [:]) throws -> RPCError {
        do {
            let result = try call(method, params)
            throw HarnessError("\(method) succeeded unexpectedly: \(result.serializedString())")
        } catch let error as RPCClientError {
            if case .remote(let rpcError) = error { return rpcError }
            throw error
        }
    }

    /// Sends raw lines on one connection and reads one response line per request line
    /// (callers pass only lines that get a response).
    public func exchange(_ lines: [String]) throws -> [JSONValue] {
        let client = RPCClient(socketPath: socket)
        defer { client.close() }
        var responses: [JSONValue] = []
        for line in lines {
            try client.sendLine(Data(line.utf8))
            let response = try client.readLine()
            responses.append(try JSONValue.parse(Data(response)))
        }
        return responses
    }

    public func job(_ id: Int64) throws -> JSONValue {
        try call("status", ["id": .int(id)])
    }

    /// Polls until the job is in one of `states`; returns it.
    @discardableResult
    public func waitForState(_ id: Int64, _ states: Set<String>, timeout: TimeInterval = 60) throws -> JSONValue {
        let deadline = Date().addingTimeInterval(timeout)
        var last: JSONValue = .null
        while Date() < deadline {
            last = try job(id)
            if let state = last["state"]?.stringValue, states.contains(state) { return last }
            usleep(20_000)
        }
        throw HarnessError("job \(id) did not reach \(states.sorted()) within \(timeout) s; last: \(last.serializedString())\n\(log)")
    }

    /// Polls until `condition` holds for the job.
    @discardableResult
    public func waitForJob(_ id: Int64, timeout: TimeInterval = 60, _ condition: (JSONValue) -> Bool) throws -> JSONValue {
        let deadline = Date().addingTimeInterval(timeout)
        var last: JSONValue = .null
        while Date() < deadline {
            last = try job(id)
            if condition(last) { return last }
            usleep(20_000)
        }
        throw HarnessError("job \(id) condition not met within \(timeout) s; last: \(last.serializedString())")
    }

    /// Runs the real `dlctl` against this daemon.
    public func dlctl(_ arguments: [String], stdin: Data? = nil) throws -> ProgramOutput {
        try runProgram(BuiltProducts.path("dlctl"), arguments, environment: environment, stdin: stdin)
    }

    /// Waits until the job waits with `code`, checks the reason, then resumes it at once
    /// (resume turns a waiting job into a queued one).
    @discardableResult
    public func waitingThenResume(_ id: Int64, code: String, reason: String, timeout: TimeInterval = 30) throws -> JSONValue {
        let waiting = try waitForJob(id, timeout: timeout) {
            $0["state"] == "waiting" || $0["state"] == "completed" || $0["state"] == "failed"
        }
        guard waiting["state"] == "waiting", waiting["error"]?["code"]?.stringValue == code,
            waiting["wait_reason"]?.stringValue == reason, waiting["next_attempt_at"]?.stringValue != nil
        else {
            throw HarnessError("expected job \(id) waiting(\(reason)) with \(code); got \(waiting.serializedString())")
        }
        _ = try call("resume", ["id": .int(id)])
        return waiting
    }

    /// Enqueues one URL and returns the new job's id.
    public func enqueue(_ params: [String: JSONValue]) throws -> Int64 {
        let result = try call("enqueue", params)
        guard let id = result["job"]?["id"]?.int64Value else { throw HarnessError("enqueue gave no id: \(result.serializedString())") }
        return id
    }
}

/// A new folder made with mkdtemp from `template` (ending in XXXXXX).
public func makeTemporaryFolder(_ template: String) throws -> String {
    var chars = Array(template.utf8CString)
    let made = chars.withUnsafeMutableBufferPointer { buffer -> String? in
        guard let base = buffer.baseAddress, mkdtemp(base) != nil else { return nil }
        return String(cString: base)
    }
    guard let made else { throw HarnessError("mkdtemp failed") }
    return made
}

public struct HarnessError: Error, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}
