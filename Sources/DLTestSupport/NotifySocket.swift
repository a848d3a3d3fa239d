import Foundation

/// A Unix datagram socket standing in for systemd's `$NOTIFY_SOCKET`: what dld sends with
/// sd_notify arrives here, one datagram per message.
public final class NotifySocket: @unchecked Sendable {
    public let path: String
    private let fd: Int32

    public init(path: String) throws {
        self.path = path
        unlink(path)
        fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw HarnessError("socket(AF_UNIX, SOCK_DGRAM) failed") }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        guard path.utf8.count < MemoryLayout.size(ofValue: address.sun_path) else { throw HarnessError("notify socket path too long") }
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: Array(path.utf8)) }
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard bound == 0 else {
            close(fd)
            throw HarnessError("bind(\(path)) failed: \(String(cString: strerror(errno)))")
        }
    }

    deinit {
        close(fd)
        unlink(path)
    }

    /// The next message, or nil if none arrives within `timeout` seconds.
    public func receive(timeout: TimeInterval) -> String? {
        var poller = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        guard poll(&poller, 1, Int32(timeout * 1000)) == 1 else { return nil }
        var buffer = [UInt8](repeating: 0, count: 4096)
        let count = recv(fd, &buffer, buffer.count, 0)
        guard count > 0 else { return nil }
        return String(decoding: buffer[..<count], as: UTF8.self)
    }

    /// Messages until one holds `line` as a whole line (returned with those before it), or
    /// nil when none did within `timeout` seconds.
    public func receive(until line: String, timeout: TimeInterval) -> [String]? {
        let deadline = Date().addingTimeInterval(timeout)
        var seen: [String] = []
        while Date() < deadline {
            guard let message = receive(timeout: max(0.01, deadline.timeIntervalSinceNow)) else { continue }
            seen.append(message)
            if message.split(separator: "\n").contains(Substring(line)) { return seen }
        }
        return nil
    }
}
