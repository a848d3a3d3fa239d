import DLCore
import Foundation
import NIOCore
import Synchronization

/// The address of the HTTP listener, `host:port` (`[v6]:port`): an IP address or `localhost`,
/// never a name to resolve, so that what is bound is what the config file says.
public struct HTTPAddress: Sendable, Equatable {
    /// The address bound (`localhost` is 127.0.0.1), without brackets.
    public var host: String
    public var port: Int

    public static let defaultPort = 6802
    /// A busy default port moves on to the next free one of these (several daemons of one user).
    public static let defaultPorts = 6802...6811
    public static let `default` = HTTPAddress(host: "127.0.0.1", port: defaultPort)

    public struct ParseError: Error, CustomStringConvertible {
        public let description: String
    }

    public static func parse(_ text: String) throws(ParseError) -> HTTPAddress {
        let host: Substring
        let port: Substring
        if text.hasPrefix("[") {
            guard let close = text.firstIndex(of: "]"), text[close...].hasPrefix("]:") else {
                throw ParseError(description: "\"\(text.prefix(100))\" is not [address]:port")
            }
            host = text[text.index(after: text.startIndex)..<close]
            port = text[text.index(close, offsetBy: 2)...]
        } else {
            guard let colon = text.lastIndex(of: ":"), !text[..<colon].contains(":") else {
                throw ParseError(description: "\"\(text.prefix(100))\" is not host:port (an IPv6 address goes in brackets)")
            }
            host = text[..<colon]
            port = text[text.index(after: colon)...]
        }
        guard let number = Int(port), (1...65535).contains(number) else {
            throw ParseError(description: "\"\(text.prefix(100))\": the port must be from 1 to 65535")
        }
        let address = host.lowercased() == "localhost" ? "127.0.0.1" : String(host)
        guard (try? SocketAddress(ipAddress: address, port: number)) != nil else {
            throw ParseError(description: "\"\(text.prefix(100))\": the host must be an IP address or localhost")
        }
        return HTTPAddress(host: address, port: number)
    }

    /// The IP address and port a TCP socket is bound to (one systemd passed), or nil.
    public static func bound(to fd: Int32) -> HTTPAddress? {
        var storage = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let named = withUnsafeMutablePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        guard named == 0 else { return nil }
        var text = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN) + 1)
        switch Int32(storage.ss_family) {
        case AF_INET:
            let address = withUnsafePointer(to: &storage) { $0.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { $0.pointee } }
            var bytes = address.sin_addr
            guard inet_ntop(AF_INET, &bytes, &text, socklen_t(text.count)) != nil else { return nil }
            return HTTPAddress(host: Self.text(text), port: Int(UInt16(bigEndian: address.sin_port)))
        case AF_INET6:
            let address = withUnsafePointer(to: &storage) { $0.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { $0.pointee } }
            var bytes = address.sin6_addr
            guard inet_ntop(AF_INET6, &bytes, &text, socklen_t(text.count)) != nil else { return nil }
            return HTTPAddress(host: Self.text(text), port: Int(UInt16(bigEndian: address.sin6_port)))
        default:
            return nil
        }
    }

    private static func text(_ characters: [CChar]) -> String {
        String(decoding: characters.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// 127.0.0.0/8 or ::1: only this machine can connect.
    public var isLoopback: Bool {
        host == "::1" || host.hasPrefix("127.")
    }

    /// The host as a URL or a Host header writes it.
    public var hostInURL: String { host.contains(":") ? "[\(host)]" : host }

    /// Where this machine reaches the listener: loopback for a wildcard address (0.0.0.0, ::),
    /// which is not an address to connect to.
    public var localHostInURL: String {
        switch host {
        case "0.0.0.0": return "127.0.0.1"
        case "::": return "[::1]"
        default: return hostInURL
        }
    }
}

/// The token that requests must carry: 32 random bytes in hex, made at the first start and kept
/// in `<state_dir>/http-token` (0600) for the next ones, so that a bookmarked login keeps working.
public enum HTTPToken {
    public static func path(stateDir: String) -> String { stateDir + "/http-token" }

    public static func loadOrCreate(stateDir: String) throws -> String {
        let path = path(stateDir: stateDir)
        if let existing = try read(path) { return existing }
        var generator = SystemRandomNumberGenerator()
        let token = Hex.encode((0..<32).map { _ in UInt8.random(in: .min ... .max, using: &generator) })
        let fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            // Made by another process in the meantime: that one is the token.
            if errno == EEXIST, let existing = try read(path) { return existing }
            throw DaemonError("cannot write \(path): \(String(cString: strerror(errno)))")
        }
        defer { close(fd) }
        let line = token + "\n"
        let written = line.withCString { Glibc.write(fd, $0, strlen($0)) }
        guard written == line.utf8.count, fsync(fd) == 0 else {
            unlink(path)
            throw DaemonError("cannot write \(path): \(String(cString: strerror(errno)))")
        }
        return token
    }

    /// The token of the file, or nil when there is none; a file that holds something else is
    /// an error rather than replaced, since a client may rely on it.
    private static func read(_ path: String) throws -> String? {
        guard FileManager.default.fileExists(atPath: path) else { return nil }
        chmod(path, 0o600)
        guard let text = try? String(contentsOfFile: path, encoding: .utf8) else {
            throw DaemonError("cannot read \(path)")
        }
        let token = text.trimmingCharacters(in: .whitespacesAndNewlines)
        guard token.utf8.count == 64, token.utf8.allSatisfy({ (48...57).contains($0) || (97...102).contains($0) }) else {
            throw DaemonError("\(path) does not hold a token (64 hex digits); delete it and dld makes a new one")
        }
        return token
    }

    /// Compares in time that depends only on the expected token's length, so that the reply's
    /// timing does not tell how many leading characters were right.
    static func matches(_ candidate: Substring, _ expected: String) -> Bool {
        let given = Array(candidate.utf8)
        var difference = UInt8(given.count == expected.utf8.count ? 0 : 1)
        for (index, byte) in expected.utf8.enumerated() {
            difference |= byte ^ (index < given.count ? given[index] : 0)
        }
        return difference == 0
    }
}

/// Slows down wrong tokens: each failure within a minute of the last doubles the delay before
/// the 401 is sent (from 50 ms, at most 5 s). The delay is a scheduled task of the connection's
/// event loop, so other connections are served meanwhile; the connection limit caps how many
/// wait at once.
final class AuthThrottle: Sendable {
    private let state = Mutex<(failures: Int, last: ContinuousClock.Instant?)>((0, nil))

    static let first = TimeAmount.milliseconds(50)
    static let longest = TimeAmount.seconds(5)

    /// Records a failure; returns the delay before it is answered and the failures in a row.
    func failed() -> (delay: TimeAmount, failures: Int) {
        let now = ContinuousClock.now
        let failures = state.withLock { state -> Int in
            if let last = state.last, now - last > .seconds(60) { state.failures = 0 }
            state.failures += 1
            state.last = now
            return state.failures
        }
        let factor = Int64(1) << Int64(min(failures - 1, 20))
        return (min(Self.first * factor, Self.longest), failures)
    }
}

/// Which requests name this listener (the Host header, against DNS rebinding) and come from
/// its own pages (the Origin header, against cross-site requests).
struct HostPolicy: Sendable {
    let address: HTTPAddress
    let tls: Bool
    /// `http_hosts`, lowercased: a bare name matches with any port or none (a proxy's), a name
    /// with `:port` only so.
    let extraHosts: Set<String>
    /// `http_origins`, lowercased: other origins (a page, a browser extension) that may call
    /// with the token, and get CORS headers.
    var origins: Set<String> = []

    var scheme: String { tls ? "https" : "http" }

    /// Names that reach the listener itself, when followed by its port.
    private var ownNames: Set<String> {
        var names: Set<String> = ["localhost", "127.0.0.1", "[::1]"]
        names.insert(address.hostInURL.lowercased())
        return names
    }

    /// Whether a Host header value names this listener.
    func allows(host: String) -> Bool {
        let value = host.lowercased()
        if extraHosts.contains(value) { return true }
        let (name, port) = Self.split(value)
        if extraHosts.contains(name) { return true }
        guard ownNames.contains(name) else { return false }
        if let port { return port == String(address.port) }
        // A client leaves out the scheme's default port.
        return address.port == (tls ? 443 : 80)
    }

    /// Whether an Origin header is the listener's own, as reached under `host` (already
    /// allowed): same scheme and authority. Through a proxy named in `http_hosts` the browser's
    /// scheme may differ from the listener's (TLS ends at the proxy).
    func allows(origin: String, host: String) -> Bool {
        let value = origin.lowercased()
        if origins.contains(value) { return true }
        let ownHost = host.lowercased()
        if value == "\(scheme)://\(ownHost)" { return true }
        let (name, _) = Self.split(ownHost)
        if extraHosts.contains(name) || extraHosts.contains(ownHost) {
            return value == "http://\(ownHost)" || value == "https://\(ownHost)"
        }
        return false
    }

    /// The origin as `http_origins` names it, for the CORS headers of its requests; nil for
    /// any other (the listener's own pages need none).
    func corsOrigin(_ origin: String?) -> String? {
        guard let origin, origins.contains(origin.lowercased()) else { return nil }
        return origin
    }

    /// "name:port" → ("name", "port"); "[v6]:port" keeps its brackets.
    static func split(_ value: String) -> (name: String, port: String?) {
        if value.hasPrefix("["), let close = value.firstIndex(of: "]") {
            let name = String(value[...close])
            let rest = value[value.index(after: close)...]
            return (name, rest.hasPrefix(":") ? String(rest.dropFirst()) : nil)
        }
        guard let colon = value.lastIndex(of: ":") else { return (value, nil) }
        return (String(value[..<colon]), String(value[value.index(after: colon)...]))
    }
}
