import DLCore
import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// Why a call did not get a result.
public enum RPCClientError: Error, Sendable, CustomStringConvertible {
    /// Nothing listens on the socket (no daemon, or a stale socket file).
    case unavailable(path: String, reason: String)
    /// The daemon answered with an error.
    case remote(RPCError)
    /// The connection broke or the answer was not JSON-RPC.
    case protocolError(String)
    /// Nothing arrived within the read timeout.
    case timedOut

    public var description: String {
        switch self {
        case .unavailable(let path, let reason): return "no dld daemon answers at \(path) (\(reason))"
        case .remote(let error): return error.description
        case .protocolError(let message): return message
        case .timedOut: return "timed out waiting for dld"
        }
    }
}

/// A blocking JSON-RPC client over the daemon's Unix socket: one connection, one line per
/// message. Blocking keeps `dlctl` simple and quick to start; the daemon side is async.
public final class RPCClient {
    public let socketPath: String
    private var fd: Int32 = -1
    private var buffer = [UInt8]()
    private var nextID: Int64 = 1
    /// Responses can be large (a long `list`); this only guards against a runaway peer.
    public static let maxResponseLine = 256 << 20

    public init(socketPath: String) {
        self.socketPath = socketPath
    }

    deinit { close() }

    public func connect() throws(RPCClientError) {
        if fd >= 0 { return }
        let s = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        guard s >= 0 else { throw .unavailable(path: socketPath, reason: String(cString: strerror(errno))) }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let pathBytes = Array(socketPath.utf8)
        let capacity = MemoryLayout.size(ofValue: address.sun_path)
        guard pathBytes.count < capacity else {
            _ = Glibc.close(s)
            throw .unavailable(path: socketPath, reason: "socket path is longer than \(capacity - 1) bytes")
        }
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            raw.copyBytes(from: pathBytes)
            raw[pathBytes.count] = 0
        }
        let result = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                Glibc.connect(s, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
        guard result == 0 else {
            let reason = String(cString: strerror(errno))
            _ = Glibc.close(s)
            throw .unavailable(path: socketPath, reason: reason)
        }
        fd = s
    }

    public func close() {
        if fd >= 0 {
            _ = Glibc.close(fd)
            fd = -1
        }
    }

    /// Sends one request and waits for its response's result.
    public func call(_ method: String, _ params: [String: JSONValue] = [:]) throws(RPCClientError) -> JSONValue {
        let id = nextID
        nextID += 1
        let request = RPCRequest(method: method, params: params, id: .int(id))
        try sendLine(request.json.serialized())
        let line = try readLine()
        let value: JSONValue
        do {
            value = try JSONValue.parse(Data(line))
        } catch {
            throw .protocolError("the daemon's answer is not JSON")
        }
        guard let response = RPCResponse(json: value) else {
            throw .protocolError("the daemon's answer is not a JSON-RPC response")
        }
        switch response.result {
        case .success(let result): return result
        case .failure(let error): throw .remote(error)
        }
    }

    /// Reads give up with `.timedOut` after this long without data (nil: wait forever).
    public func setReadTimeout(_ seconds: Double?) throws(RPCClientError) {
        try connect()
        var value = timeval()
        if let seconds, seconds > 0 {
            value.tv_sec = Int(seconds)
            value.tv_usec = Int((seconds - Double(Int(seconds))) * 1_000_000)
        }
        _ = setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &value, socklen_t(MemoryLayout<timeval>.size))
    }

    /// The next message from the daemon: after `subscribe`, notifications (`method`, `params`).
    public func readMessage() throws(RPCClientError) -> JSONValue {
        let line = try readLine()
        do {
            return try JSONValue.parse(Data(line))
        } catch {
            throw .protocolError("the daemon sent a line that is not JSON")
        }
    }

    /// Sends raw bytes as one line (the newline is added).
    public func sendLine(_ data: Data) throws(RPCClientError) {
        try connect()
        var bytes = [UInt8](data)
        bytes.append(UInt8(ascii: "\n"))
        var offset = 0
        while offset < bytes.count {
            let n = bytes[offset...].withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if n < 0 {
                if errno == EINTR { continue }
                throw .protocolError("lost the connection to dld: \(String(cString: strerror(errno)))")
            }
            offset += n
        }
    }

    /// Reads one line (without its newline).
    public func readLine() throws(RPCClientError) -> [UInt8] {
        try connect()
        var scanned = 0
        while true {
            if let newline = buffer[scanned...].firstIndex(of: UInt8(ascii: "\n")) {
                let line = Array(buffer[..<newline])
                buffer.removeSubrange(...newline)
                return line
            }
            scanned = buffer.count
            guard buffer.count <= Self.maxResponseLine else { throw .protocolError("the daemon's answer is too long") }
            var chunk = [UInt8](repeating: 0, count: 65536)
            let n = chunk.withUnsafeMutableBytes { Glibc.recv(fd, $0.baseAddress, $0.count, 0) }
            if n < 0 {
                if errno == EINTR { continue }
                if errno == EAGAIN || errno == EWOULDBLOCK { throw .timedOut }
                throw .protocolError("lost the connection to dld: \(String(cString: strerror(errno)))")
            }
            if n == 0 { throw .protocolError("dld closed the connection") }
            buffer.append(contentsOf: chunk[..<n])
        }
    }
}
