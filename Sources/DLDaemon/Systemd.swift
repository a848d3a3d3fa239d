import Foundation

/// The sd_notify protocol, spoken by dld itself: one datagram of `KEY=VALUE` lines to the
/// Unix socket named by `$NOTIFY_SOCKET` (a path, or `@name` in the abstract namespace). It is
/// one `sendto`, so libsystemd is not needed. Without `$NOTIFY_SOCKET` (not started by systemd
/// with `Type=notify`) every call does nothing.
public final class SystemdNotifier: Sendable {
    private let address: Data?
    private let fd: Int32
    /// Half of `WatchdogSec=` when systemd asks this process for keep-alive pings.
    public let watchdogInterval: Duration?

    public init(environment: [String: String] = ProcessInfo.processInfo.environment) {
        let path = environment["NOTIFY_SOCKET"] ?? ""
        if (path.hasPrefix("/") || path.hasPrefix("@")), path.utf8.count < 108 {
            address = Data(path.utf8)
            fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        } else {
            address = nil
            fd = -1
        }
        // WATCHDOG_PID, when set, names the process the pings are for (not a child).
        let forUs = environment["WATCHDOG_PID"].map { Int32($0) == getpid() } ?? true
        if forUs, let usec = environment["WATCHDOG_USEC"].flatMap(UInt64.init), usec > 0 {
            watchdogInterval = .microseconds(Int64(usec / 2))
        } else {
            watchdogInterval = nil
        }
    }

    deinit { if fd >= 0 { close(fd) } }

    public var isActive: Bool { fd >= 0 }

    /// Sends the lines as one datagram; a failure is not an error (systemd may be gone).
    public func notify(_ lines: String...) {
        guard fd >= 0, let address else { return }
        var storage = sockaddr_un()
        storage.sun_family = sa_family_t(AF_UNIX)
        let length = withUnsafeMutableBytes(of: &storage.sun_path) { path -> Int in
            path.copyBytes(from: address)
            // The abstract namespace: a leading NUL instead of '@', and no trailing NUL counted.
            if address.first == UInt8(ascii: "@") { path[0] = 0 }
            return address.count
        }
        let size = socklen_t(MemoryLayout<sa_family_t>.size + length + (address.first == UInt8(ascii: "@") ? 0 : 1))
        let message = Data(lines.joined(separator: "\n").utf8)
        _ = message.withUnsafeBytes { bytes in
            withUnsafePointer(to: &storage) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    sendto(fd, bytes.baseAddress, bytes.count, Int32(MSG_NOSIGNAL), $0, size)
                }
            }
        }
    }

    /// `MONOTONIC_USEC` for `RELOADING=1`: CLOCK_MONOTONIC now, as systemd wants it.
    public static var monotonicMicroseconds: UInt64 {
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC, &now)
        return UInt64(now.tv_sec) * 1_000_000 + UInt64(now.tv_nsec) / 1000
    }
}

/// Socket activation: the listening sockets systemd (or `systemd-socket-activate`) opened for
/// dld and handed over as file descriptor 3 onwards, named by `$LISTEN_FDS`, `$LISTEN_PID`
/// and `$LISTEN_FDNAMES` (sd_listen_fds(3)): the control socket (dld.socket) and, when
/// dld-http.socket is enabled, the HTTP listener's TCP socket.
public enum SocketActivation {
    /// The first descriptor passed by systemd.
    static let firstDescriptor: Int32 = 3

    /// What systemd passed to this process.
    public struct Sockets: Sendable, Equatable {
        /// The Unix stream socket that listens, for the control socket.
        public var control: Int32?
        /// A TCP stream socket that listens, for the HTTP listener.
        public var http: Int32?
    }

    /// The passed sockets (none when nothing was passed to this process). Of several Unix
    /// stream sockets the one named `dld` (`FileDescriptorName=`) is taken, else the first; of
    /// several TCP ones the one named `dld-http`, else the first. The variables are removed, so
    /// that hooks and other children do not take them for theirs; every passed descriptor is
    /// set close-on-exec.
    public static func adopt(environment: [String: String] = ProcessInfo.processInfo.environment) throws -> Sockets {
        guard let pid = environment["LISTEN_PID"].flatMap(Int32.init), pid == getpid(),
            let count = environment["LISTEN_FDS"].flatMap(Int32.init), count > 0
        else { return Sockets() }
        defer {
            unsetenv("LISTEN_PID")
            unsetenv("LISTEN_FDS")
            unsetenv("LISTEN_FDNAMES")
        }
        let names = environment["LISTEN_FDNAMES"].map { $0.split(separator: ":", omittingEmptySubsequences: false).map(String.init) } ?? []
        var unix: [(fd: Int32, name: String?)] = []
        var tcp: [(fd: Int32, name: String?)] = []
        // At most a few sockets make sense; a huge LISTEN_FDS is not looked through.
        for index in 0..<min(count, 64) {
            let fd = firstDescriptor + index
            _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
            let name = Int(index) < names.count ? names[Int(index)] : nil
            switch listeningStreamDomain(fd) {
            case AF_UNIX: unix.append((fd, name))
            case AF_INET, AF_INET6: tcp.append((fd, name))
            default: break
            }
        }
        let sockets = Sockets(
            control: (unix.first(where: { $0.name == "dld" }) ?? unix.first)?.fd,
            http: (tcp.first(where: { $0.name == "dld-http" }) ?? tcp.first)?.fd)
        guard sockets.control != nil || sockets.http != nil else {
            throw DaemonError(
                "systemd passed \(count) socket(s) (LISTEN_FDS), but none is a listening Unix or TCP stream socket; "
                    + "check ListenStream= in dld.socket and dld-http.socket"
            )
        }
        return sockets
    }

    /// The path a passed socket is bound to, for the log.
    static func path(of fd: Int32) -> String? {
        var address = sockaddr_un()
        var length = socklen_t(MemoryLayout<sockaddr_un>.size)
        let named = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        guard named == 0, address.sun_family == sa_family_t(AF_UNIX) else { return nil }
        return withUnsafeBytes(of: &address.sun_path) { raw in
            let bytes = raw.prefix(while: { $0 != 0 })
            return bytes.isEmpty ? nil : String(decoding: bytes, as: UTF8.self)
        }
    }

    /// The address family of a listening stream socket, or nil for anything else.
    private static func listeningStreamDomain(_ fd: Int32) -> Int32? {
        func option(_ name: Int32) -> Int32? {
            var value: Int32 = 0
            var length = socklen_t(MemoryLayout<Int32>.size)
            return getsockopt(fd, SOL_SOCKET, name, &value, &length) == 0 ? value : nil
        }
        guard option(SO_TYPE) == Int32(SOCK_STREAM.rawValue), option(SO_ACCEPTCONN) == 1 else { return nil }
        return option(SO_DOMAIN)
    }
}
