import CDLSystem
import DLCore
import DLRPC
import Foundation
import Logging
import NIOCore
import NIOPosix
import Synchronization

/// Splits the byte stream into lines of at most `maxLength` bytes (without the newline; a
/// trailing CR is dropped). A longer line is an error: the connection gets one error response
/// and is closed, because the rest of that line cannot be told from the next request.
struct LineDecoder: ByteToMessageDecoder {
    typealias InboundOut = ByteBuffer
    struct LineTooLong: Error {}

    let maxLength: Int
    private var scanned = 0

    init(maxLength: Int) { self.maxLength = maxLength }

    mutating func decode(context: ChannelHandlerContext, buffer: inout ByteBuffer) throws -> DecodingState {
        let view = buffer.readableBytesView
        let start = view.index(view.startIndex, offsetBy: min(scanned, view.count))
        guard let newline = view[start...].firstIndex(of: UInt8(ascii: "\n")) else {
            scanned = view.count
            if view.count > maxLength { throw LineTooLong() }
            return .needMoreData
        }
        scanned = 0
        var length = newline - view.startIndex
        guard length <= maxLength + 1 else { throw LineTooLong() }
        guard var line = buffer.readSlice(length: length) else { return .needMoreData }
        buffer.moveReaderIndex(forwardBy: 1)
        if length > 0, line.getInteger(at: line.readerIndex + length - 1, as: UInt8.self) == UInt8(ascii: "\r") {
            length -= 1
            line = line.getSlice(at: line.readerIndex, length: length) ?? line
        }
        guard length <= maxLength else { throw LineTooLong() }
        context.fireChannelRead(wrapInboundOut(line))
        return .continue
    }

    mutating func decodeLast(context: ChannelHandlerContext, buffer: inout ByteBuffer, seenEOF: Bool) throws -> DecodingState {
        while try decode(context: context, buffer: &buffer) == .continue {}
        // A last request without its newline is still served.
        if buffer.readableBytes > 0, buffer.readableBytes <= maxLength, let rest = buffer.readSlice(length: buffer.readableBytes) {
            context.fireChannelRead(wrapInboundOut(rest))
        }
        return .needMoreData
    }
}

/// A connection the listening socket accepted, until a task serves it. One the server never
/// takes (accepted while it closes, when serving ends or start-up fails after the bind) is
/// closed when dropped: NIO traps on an async channel dropped with its writer unfinished
/// (apple/swift-nio#3481), and which connections are in flight at a close is a race.
public final class AcceptedConnection: Sendable {
    private let channel: NIOAsyncChannel<ByteBuffer, ByteBuffer>
    private let taken = Atomic(false)

    init(_ channel: NIOAsyncChannel<ByteBuffer, ByteBuffer>) { self.channel = channel }

    /// The connection, for the task that serves it (and closes it with `executeThenClose`).
    func take() -> NIOAsyncChannel<ByteBuffer, ByteBuffer> {
        taken.store(true, ordering: .relaxed)
        return channel
    }

    deinit {
        guard !taken.load(ordering: .relaxed) else { return }
        let channel = self.channel
        Task { try? await channel.executeThenClose { _, _ in } }
    }
}

/// The control socket: a Unix stream socket, one task per connection, requests on a connection
/// answered in order. Only the daemon's own uid is served.
public final class ControlServer: Sendable {
    public struct Limits: Sendable {
        public var maxLineBytes = 4 << 20
        public var maxConnections = 64
        /// A connection silent this long between requests is closed.
        public var idleTimeout: TimeAmount = .seconds(300)
        public init() {}
    }

    /// The bound socket, its connections not yet served.
    public typealias Listening = NIOAsyncChannel<AcceptedConnection, Never>

    let path: String
    let dispatcher: Dispatcher
    let hub: EventHub
    /// Read for each connection: a reload changes them for the connections that follow.
    private let currentLimits: Mutex<Limits>
    var limits: Limits { currentLimits.withLock { $0 } }
    let logger: Logger
    /// Called once a `shutdown` request has been answered.
    let onShutdown: @Sendable () -> Void
    private let connections = Mutex(0)

    public init(
        path: String, dispatcher: Dispatcher, hub: EventHub, limits: Limits = Limits(), logger: Logger,
        onShutdown: @escaping @Sendable () -> Void
    ) {
        self.path = path
        self.hub = hub
        self.dispatcher = dispatcher
        self.currentLimits = Mutex(limits)
        self.logger = logger
        self.onShutdown = onShutdown
    }

    /// Binds the socket (mode 0600). Fails if another process answers on it already; a stale
    /// socket file left by a dead daemon is replaced. With `adopting`, the listening socket
    /// systemd passed (socket activation) is served instead, as it is: its path and mode are
    /// the socket unit's. Every check of a connection (peer uid, limits) is the same.
    public func bind(adopting adopted: Int32? = nil) async throws -> Listening {
        if let adopted {
            return try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                .childChannelOption(.allowRemoteHalfClosure, value: true)
                .bind(NIOBSDSocket.Handle(adopted), childChannelInitializer: childInitializer)
        }
        let probe = RPCClient(socketPath: path)
        if (try? probe.connect()) != nil {
            probe.close()
            throw DaemonError("another process is listening on \(path); is dld already running?")
        }
        // The socket file is created by bind with the process umask; until the chmod below it
        // must not be reachable by others, whatever umask dld was started with.
        let previousMask = umask(0o177)
        defer { umask(previousMask) }
        let server = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.backlog, value: 128)
            // A client may send its requests and shut down its side (`echo … | socat`): the
            // answers are still written before the connection closes.
            .childChannelOption(.allowRemoteHalfClosure, value: true)
            .bind(unixDomainSocketPath: path, cleanupExistingSocketFile: true, childChannelInitializer: childInitializer)
        chmod(path, 0o600)
        return server
    }

    public func setLimits(_ limits: Limits) {
        currentLimits.withLock { $0 = limits }
    }

    /// Each connection: the idle timeout, the line framing with its limit, an async channel.
    private var childInitializer: @Sendable (any Channel) -> EventLoopFuture<AcceptedConnection> {
        return { [self] channel in
            let limits = self.limits
            let maxLine = limits.maxLineBytes
            let idle = limits.idleTimeout
            return channel.eventLoop.makeCompletedFuture {
                try channel.pipeline.syncOperations.addHandler(IdleStateHandler(readTimeout: idle), name: "idle")
                try channel.pipeline.syncOperations.addHandler(IdleCloser(), name: "idle-closer")
                try channel.pipeline.syncOperations.addHandler(ByteToMessageHandler(LineDecoder(maxLength: maxLine)))
                // Finishing the writer half-closes the connection after what was written, so
                // a cut-off event stream still delivers its last notice.
                return AcceptedConnection(
                    try NIOAsyncChannel<ByteBuffer, ByteBuffer>(
                        wrappingChannelSynchronously: channel,
                        configuration: .init(isOutboundHalfClosureEnabled: true)))
            }
        }
    }

    /// Serves until the server channel is closed, then closes the connections.
    public func serve(_ server: Listening) async throws {
        try await withThrowingDiscardingTaskGroup { group in
            try await server.executeThenClose { inbound in
                for try await accepted in inbound {
                    let connection = accepted.take()
                    group.addTask { await self.handle(connection) }
                }
            }
            // The listening socket is closed: idle clients must not keep the daemon alive.
            group.cancelAll()
        }
    }

    private func handle(_ connection: NIOAsyncChannel<ByteBuffer, ByteBuffer>) async {
        let count = connections.withLock { value -> Int in
            value += 1
            return value
        }
        defer { connections.withLock { $0 -= 1 } }
        do {
            try await connection.executeThenClose { inbound, outbound in
                guard count <= limits.maxConnections else {
                    logger.warning("connection refused: too many open connections", metadata: ["limit": "\(limits.maxConnections)"])
                    let error = RPCResponse(
                        id: .null,
                        result: .failure(RPCError(DLError(.invalidRequest, "too many connections (limit \(limits.maxConnections))"))))
                    try await outbound.write(Self.line(error.json.serialized()))
                    return
                }
                guard await self.peerIsOwner(connection.channel) else {
                    let error = RPCResponse(
                        id: .null,
                        result: .failure(RPCError(DLError(.invalidRequest, "permission denied: only the daemon's own user may connect"))))
                    try await outbound.write(Self.line(error.json.serialized()))
                    return
                }
                do {
                    let idle = try? await connection.channel.pipeline.handler(type: IdleCloser.self).get()
                    try await withThrowingTaskGroup(of: Void.self) { group in
                        var subscribed = false
                        for try await line in inbound {
                            // Once subscribed the connection only streams; what the client
                            // sends is read (to notice when it goes) and ignored.
                            if subscribed { continue }
                            idle?.busy.withLock { $0 = true }
                            let reply = await dispatcher.handle(line: Data(line.readableBytesView))
                            idle?.busy.withLock { $0 = false }
                            if let response = reply.data {
                                Self.markReply()
                                try await outbound.write(Self.line(response))
                            }
                            // A request of thousands of jobs leaves megabytes of freed parse
                            // trees and rows in glibc's heaps; handing them back keeps the next
                            // such request from peaking on top of them (64 MiB budget).
                            if line.readableBytes >= Self.trimAfterBytes { _ = dld_trim_malloc() }
                            if reply.shutdown { onShutdown() }
                            if let subscription = reply.subscription {
                                subscribed = true
                                // An event stream is quiet on the client's side by design.
                                _ = try? await connection.channel.pipeline.removeHandler(name: "idle").get()
                                group.addTask { try await self.stream(subscription, to: outbound) }
                            }
                        }
                        // The client closed its side: stop streaming to it.
                        group.cancelAll()
                    }
                } catch is LineDecoder.LineTooLong {
                    let error = RPCResponse(
                        id: .null,
                        result: .failure(
                            RPCError(DLError(.lineTooLong, "request line longer than \(limits.maxLineBytes) bytes; closing the connection"))
                        ))
                    try await outbound.write(Self.line(error.json.serialized()))
                }
            }
        } catch {
            logger.debug("connection ended with an error", metadata: ["error": "\(error)"])
        }
    }

    /// The connection as an event stream (`Dispatcher.stream`), each message a line.
    private func stream(_ subscription: Dispatcher.Subscription, to outbound: NIOAsyncChannelOutboundWriter<ByteBuffer>) async throws {
        // The messages of one write (at most `Dispatcher.writeChunk`) in one buffer: the writer
        // takes it while the socket is writable, so a slow reader holds up at most one chunk
        // beyond the hub's limit, which counts the messages still in the writer's hand.
        let overflowed = try await dispatcher.stream(subscription, from: hub) { messages in
            var buffer = ByteBuffer()
            for data in messages {
                buffer.writeBytes(data)
                buffer.writeInteger(UInt8(ascii: "\n"))
            }
            try await outbound.write(buffer)
        }
        // Cut off after the overflow notice: the client resubscribes with `since`.
        if overflowed { outbound.finish() }
    }

    /// SO_PEERCRED: the uid of the process at the other end, checked against ours.
    private func peerIsOwner(_ channel: any Channel) async -> Bool {
        guard let provider = channel as? any SocketOptionProvider else {
            logger.warning("connection refused: cannot read peer credentials on this channel")
            return false
        }
        do {
            let credentials: PeerCredentials = try await provider.unsafeGetSocketOption(
                level: SocketOptionLevel(SOL_SOCKET), name: SocketOptionName(SO_PEERCRED)
            ).get()
            if credentials.uid == getuid() { return true }
            logger.warning(
                "connection refused: peer is another user", metadata: ["uid": "\(credentials.uid)", "pid": "\(credentials.pid)"])
            return false
        } catch {
            logger.warning("connection refused: peer credentials unreadable", metadata: ["error": "\(error)"])
            return false
        }
    }

    /// DLD_TEST_REPLY_MARK: for tests only, a file written (one byte) right before each reply
    /// is written, so that the power-cut tests' filesystem can freeze at the very moment a
    /// command is answered: whatever dld commits after it is lost with the cut.
    private static let replyMark = ProcessInfo.processInfo.environment["DLD_TEST_REPLY_MARK"].flatMap { $0.isEmpty ? nil : $0 }

    private static func markReply() {
        guard let replyMark else { return }
        let fd = open(replyMark, O_WRONLY | O_CREAT | O_CLOEXEC, 0o600)
        guard fd >= 0 else { return }
        var byte = UInt8(ascii: "r")
        _ = pwrite(fd, &byte, 1, 0)
        close(fd)
    }

    /// Requests from this size on (about 2000 jobs) are followed by `malloc_trim`.
    static let trimAfterBytes = 256 << 10

    private static func line(_ data: Data) -> ByteBuffer {
        var buffer = ByteBuffer()
        buffer.reserveCapacity(data.count + 1)
        buffer.writeBytes(data)
        buffer.writeInteger(UInt8(ascii: "\n"))
        return buffer
    }
}

/// Closes a connection that sent nothing for the idle timeout (a client that connected and
/// forgot, or one that holds a slot of `max_connections` on purpose).
final class IdleCloser: ChannelInboundHandler, Sendable {
    typealias InboundIn = NIOAny
    /// A request is being served: the client is waiting for us, not idle.
    let busy = Mutex(false)

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let idle = event as? IdleStateHandler.IdleStateEvent, idle == .read, !busy.withLock({ $0 }) {
            // Say why before closing, where it can still be said.
            let error = RPCResponse(
                id: .null, result: .failure(RPCError(DLError(.invalidRequest, "idle for too long; closing the connection"))))
            var line = context.channel.allocator.buffer(capacity: 160)
            line.writeBytes(error.json.serialized())
            line.writeInteger(UInt8(ascii: "\n"))
            let channel = context.channel
            context.writeAndFlush(NIOAny(line)).whenComplete { _ in channel.close(promise: nil) }
            return
        }
        context.fireUserInboundEventTriggered(event)
    }
}

/// `struct ucred` of <sys/socket.h>, which Swift's Glibc module does not export.
struct PeerCredentials: Sendable {
    var pid: Int32 = 0
    var uid: UInt32 = 0
    var gid: UInt32 = 0
}

/// A start-up problem, said in one line.
public struct DaemonError: Error, CustomStringConvertible, Sendable {
    public let description: String
    public init(_ description: String) { self.description = description }
}
