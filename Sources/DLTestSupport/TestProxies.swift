import Foundation

/// A real proxy server from Debian's packages (installed by scripts/deps.sh), started on a free
/// loopback port in a folder of its own and stopped when this goes away: `tinyproxy` (HTTP,
/// `CONNECT`) or `microsocks` (SOCKS5). Both write one line per connection they forward, which
/// tests read to know that a transfer went through them.
public final class TestProxy: @unchecked Sendable {
    public enum Kind: Sendable { case tinyproxy, microsocks }

    public let kind: Kind
    public let port: Int
    private let folder: String
    private let process: Process
    private let logFile: String

    /// `http://127.0.0.1:PORT` or `socks5://127.0.0.1:PORT`.
    public var url: String { (kind == .tinyproxy ? "http" : "socks5") + "://127.0.0.1:\(port)" }

    /// Starts the proxy and waits until it accepts connections. `login`: tinyproxy asks for
    /// these Basic credentials (407 without them).
    public init(_ kind: Kind, in parent: String, login: (user: String, password: String)? = nil) throws {
        self.kind = kind
        folder = parent + "/proxy-\(kind)"
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        port = try freeLoopbackPort()
        let process = Process()
        switch kind {
        case .tinyproxy:
            let program = try Self.find("tinyproxy")
            logFile = folder + "/tinyproxy.log"
            // No ConnectPort line: CONNECT to every port (the test origin's is random).
            let config = """
                Port \(port)
                Listen 127.0.0.1
                Timeout 60
                MaxClients 50
                LogFile "\(logFile)"
                LogLevel Connect
                """ + (login.map { "\nBasicAuth \($0.user) \($0.password)\n" } ?? "")
            try config.write(toFile: folder + "/tinyproxy.conf", atomically: true, encoding: .utf8)
            process.executableURL = URL(fileURLWithPath: program)
            process.arguments = ["-d", "-c", folder + "/tinyproxy.conf"]
            process.standardOutput = FileHandle.nullDevice
            process.standardError = FileHandle.nullDevice
        case .microsocks:
            let program = try Self.find("microsocks")
            logFile = folder + "/microsocks.log"
            _ = FileManager.default.createFile(atPath: logFile, contents: nil)
            process.executableURL = URL(fileURLWithPath: program)
            process.arguments = ["-i", "127.0.0.1", "-p", "\(port)"]
            let log = try FileHandle(forWritingTo: URL(fileURLWithPath: logFile))
            process.standardOutput = log
            process.standardError = log
        }
        try process.run()
        self.process = process
        let deadline = Date().addingTimeInterval(10)
        while Date() < deadline {
            guard process.isRunning else { throw HarnessError("\(kind) exited at start:\n\(log)") }
            if canConnect(port: port) { return }
            usleep(20_000)
        }
        throw HarnessError("\(kind) did not listen on 127.0.0.1:\(port) within 10 s:\n\(log)")
    }

    deinit { stop() }

    /// Stops the proxy (it is stopped anyway when this goes away).
    public func stop() {
        if process.isRunning {
            // tinyproxy waits for its open tunnels after SIGTERM; a test's proxy just goes.
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
    }

    /// What the proxy logged so far: tinyproxy's `CONNECT 127.0.0.1:PORT` lines, microsocks'
    /// `connected to 127.0.0.1:PORT` lines.
    public var log: String {
        (try? String(contentsOfFile: logFile, encoding: .utf8)) ?? ""
    }

    /// Whether the proxy forwarded a connection to this port of 127.0.0.1.
    public func forwarded(toPort target: Int) -> Bool {
        switch kind {
        case .tinyproxy: return log.contains("CONNECT 127.0.0.1:\(target) ")
        case .microsocks: return log.contains("connected to 127.0.0.1:\(target)")
        }
    }

    private static func find(_ name: String) throws -> String {
        for dir in ["/usr/bin", "/usr/sbin", "/usr/local/bin"] where FileManager.default.isExecutableFile(atPath: dir + "/" + name) {
            return dir + "/" + name
        }
        throw HarnessError("\(name) is not installed; scripts/deps.sh (run by `make test`) installs it: sudo apt-get install \(name)")
    }
}

/// A TCP port on 127.0.0.1 that nothing listens on now (bound to port 0, then closed).
public func freeLoopbackPort() throws -> Int {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard fd >= 0 else { throw HarnessError("socket() failed") }
    defer { close(fd) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    address.sin_port = 0
    let bound = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
    }
    guard bound == 0 else { throw HarnessError("bind() failed") }
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let named = withUnsafeMutablePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
    }
    guard named == 0 else { throw HarnessError("getsockname() failed") }
    return Int(UInt16(bigEndian: address.sin_port))
}

/// Whether something accepts TCP connections on 127.0.0.1:port.
func canConnect(port: Int) -> Bool {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard fd >= 0 else { return false }
    defer { close(fd) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    address.sin_port = UInt16(port).bigEndian
    return withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
    }
}
