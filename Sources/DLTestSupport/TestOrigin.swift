// TestOrigin: an HTTP/1.1 origin server on loopback for end-to-end tests and benchmarks.
//
// Every body it serves is a window onto one deterministic byte stream (`TestOrigin.byte(at:)`),
// so tests can compute expected content and digests without storing it. Routes:
//
//   /bytes/<N>                    N deterministic bytes; Range, If-Range, HEAD.
//                                 Query: rate, etag, norange, drop_after, stall_after, length, name,
//                                 linger=MS (a drop closes MS after its last byte, not at once),
//                                 nolength (no Content-Length: chunked, the size is unknown),
//                                 overlong=K (a 206 body runs K bytes past the total its
//                                 Content-Range announces; Content-Length covers them),
//                                 ranges_for=K (Range is honoured for the first K ranged
//                                 requests to that path, then ignored: 200 and the whole body),
//                                 novalidators (no ETag, no Last-Modified: nothing for If-Range),
//                                 variant=K (the body is the stream from byte K on: the same
//                                 size, other bytes; `setVariant` overrides it for every path).
//                                 corrupt=K (the byte at file offset K is served flipped, in
//                                 every response that covers it: a mirror with a bad piece);
//                                 with corrupt_every=P also K+P, K+2P, … (a bad piece each).
//                                 duplicate=URL sends `Link: <URL>; rel=duplicate` (RFC 6249);
//                                 sha256=BASE64 sends `Digest: SHA-256=BASE64` (RFC 3230).
//                                 `rate` (bytes/s) throttles each response, so each connection.
//                                 gate=N holds the body's first byte until N bodies stream at
//                                 once (at most 20 s): a peak of concurrency as an event.
//                                 deep_after=K counts the body in `mostConcurrentDeepBodies`
//                                 from its K-th byte written until it ends or is cut.
//                                 cache_control=V sends `Cache-Control: V`. If-None-Match with
//                                 the ETag (or If-Modified-Since with Last-Modified) gets 304.
//   /status/<CODE>                that status and a short text body; query retry_after.
//   /redirect/<K>?to=<url>        302 chain of K more hops, then Location: <url>.
//   /loop                         302 Location: /loop, forever.
//   /close                        no answer: the connection is closed after the request.
//   /fail_first/<M>/bytes/<N>     503 + Retry-After: 1 for the first M requests to that path
//                                 (fail_status=429: that status instead).
//   /_stats                       {"bytes_served": N}: body bytes served so far (not counting itself).
//   /doc/<NAME>                   the text given to `setDocument(NAME, …)` (a Metalink), else 404.
//
// `bytesServed(uri:)` counts the body bytes of one path+query, so a test can tell what a
// resume fetched from each URL.
//   anything else                 404.
//
// With `tls`, the same routes are served over https with the given certificate (self-signed, or
// from a `TestCA`), optionally asking clients for a certificate of their own.
//
// Bodies are streamed from a precomputed table as zero-copy ByteBuffer slices, respecting
// channel writability, so memory stays flat whatever the size.

import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import NIOHTTP2
import NIOPosix
import NIOSSL

// MARK: - Public API

/// One request as the origin saw it: method, path+query, and headers with lowercased names.
public struct RecordedRequest: Sendable {
    public let method: String
    public let uri: String
    public let headers: [(String, String)]

    public init(method: String, uri: String, headers: [(String, String)]) {
        self.method = method
        self.uri = uri
        self.headers = headers
    }

    /// The path part of `uri` (without the query).
    public var path: String {
        if let q = uri.firstIndex(of: "?") { return String(uri[..<q]) }
        return uri
    }

    /// The first value of a header (name compared case-insensitively).
    public func header(_ name: String) -> String? {
        let wanted = name.lowercased()
        return headers.first { $0.0 == wanted }?.1
    }
}

public enum TestOriginError: Error, Sendable, CustomStringConvertible {
    case noLocalAddress
    case certificate(String)

    public var description: String {
        switch self {
        case .noLocalAddress: return "the origin has no local address"
        case .certificate(let message): return "cannot make a test certificate: \(message)"
        }
    }
}

/// A PEM certificate and its private key, for an https origin.
public struct TLSFiles: Sendable {
    public let certificatePath: String
    public let keyPath: String
    /// When set, the origin asks every client for a certificate issued by this CA (PEM) and
    /// refuses the handshake without one.
    public var clientCAPath: String?

    public init(certificatePath: String, keyPath: String, clientCAPath: String? = nil) {
        self.certificatePath = certificatePath
        self.keyPath = keyPath
        self.clientCAPath = clientCAPath
    }

    /// A self-signed certificate for 127.0.0.1 and localhost, made by `openssl req -x509` in
    /// `folder`. No client trusts it: only a job with `insecure` can fetch from it.
    public static func selfSigned(in folder: String) throws -> TLSFiles {
        let files = TLSFiles(certificatePath: folder + "/origin-cert.pem", keyPath: folder + "/origin-key.pem")
        try TestCA.openssl([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
            "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
            "-keyout", files.keyPath, "-out", files.certificatePath,
        ])
        return files
    }
}

public final class TestOrigin: Sendable {
    private let group: MultiThreadedEventLoopGroup
    private let channel: any Channel
    private let state: OriginState
    private let host: String
    private let scheme: String

    /// The port the origin listens on.
    public let port: Int

    private init(group: MultiThreadedEventLoopGroup, channel: any Channel, state: OriginState, host: String, port: Int, scheme: String) {
        self.group = group
        self.channel = channel
        self.state = state
        self.host = host
        self.port = port
        self.scheme = scheme
    }

    /// Starts listening on 127.0.0.1 with an OS-chosen port (or `port` if non-zero); over
    /// https when `tls` is given, offering HTTP/2 in ALPN with `http2` (each stream is served
    /// as an HTTP/1.1 request is). Every answer waits `latency` before its head is sent, as a
    /// round trip to a distant server would.
    public static func start(
        host: String = "127.0.0.1", port: Int = 0, tls: TLSFiles? = nil, http2: Bool = false, latency: TimeAmount = .zero
    ) async throws -> TestOrigin {
        let sslContext: NIOSSLContext?
        if let tls {
            let chain = try NIOSSLCertificate.fromPEMFile(tls.certificatePath).map { NIOSSLCertificateSource.certificate($0) }
            let key = try NIOSSLPrivateKey(file: tls.keyPath, format: .pem)
            var configuration = TLSConfiguration.makeServerConfiguration(certificateChain: chain, privateKey: .privateKey(key))
            if let clientCA = tls.clientCAPath {
                configuration.certificateVerification = .noHostnameVerification
                configuration.trustRoots = .certificates(try NIOSSLCertificate.fromPEMFile(clientCA))
            }
            if http2 { configuration.applicationProtocols = ["h2", "http/1.1"] }
            sslContext = try NIOSSLContext(configuration: configuration)
        } else {
            sslContext = nil
        }
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let state = OriginState()
        state.box.withLockedValue { $0.latency = latency }
        let bootstrap = ServerBootstrap(group: group)
            .serverChannelOption(.backlog, value: 256)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.tcpOption(.tcp_nodelay), value: 1)
            .childChannelOption(.writeBufferWaterMark, value: .init(low: 256 * 1024, high: 1024 * 1024))
            .childChannelOption(.maxMessagesPerRead, value: 16)
            .childChannelInitializer { channel in
                state.box.withLockedValue { $0.connections += 1 }
                guard let sslContext, http2 else {
                    return channel.eventLoop.makeCompletedFuture {
                        if let sslContext {
                            try channel.pipeline.syncOperations.addHandler(NIOSSLServerHandler(context: sslContext))
                        }
                        try channel.pipeline.syncOperations.configureHTTPServerPipeline(withErrorHandling: true)
                        try channel.pipeline.syncOperations.addHandler(OriginHandler(state: state))
                    }
                }
                return channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(NIOSSLServerHandler(context: sslContext))
                }.flatMap {
                    channel.configureHTTP2SecureUpgrade(
                        h2ChannelConfigurator: { connection in
                            state.box.withLockedValue { $0.http2Connections += 1 }
                            return connection.configureHTTP2Pipeline(
                                mode: .server,
                                inboundStreamInitializer: { stream in
                                    stream.eventLoop.makeCompletedFuture {
                                        state.box.withLockedValue { $0.http2Streams += 1 }
                                        try stream.pipeline.syncOperations.addHandler(HTTP2FramePayloadToHTTP1ServerCodec())
                                        try stream.pipeline.syncOperations.addHandler(OriginHandler(state: state))
                                    }
                                }
                            ).map { _ in }
                        },
                        http1ChannelConfigurator: { connection in
                            connection.eventLoop.makeCompletedFuture {
                                try connection.pipeline.syncOperations.configureHTTPServerPipeline(withErrorHandling: true)
                                try connection.pipeline.syncOperations.addHandler(OriginHandler(state: state))
                            }
                        })
                }
            }
        do {
            let channel = try await bootstrap.bind(host: host, port: port).get()
            guard let boundPort = channel.localAddress?.port else {
                try? await channel.close().get()
                throw TestOriginError.noLocalAddress
            }
            return TestOrigin(
                group: group, channel: channel, state: state, host: host, port: boundPort, scheme: tls == nil ? "http" : "https")
        } catch {
            try? await group.shutdownGracefully()
            throw error
        }
    }

    /// "http://127.0.0.1:PORT" (https with TLS)
    public var baseURL: String {
        let h = host.contains(":") ? "[\(host)]" : host
        return "\(scheme)://\(h):\(port)"
    }

    /// Total response BODY bytes written to clients so far (all routes).
    public var bytesServed: Int64 {
        state.box.withLockedValue { $0.bytesServed }
    }

    /// Body bytes written for requests of exactly this path+query.
    public func bytesServed(uri: String) -> Int64 {
        state.box.withLockedValue { $0.servedByURI[uri] ?? 0 }
    }

    /// From now on every `/bytes` response carries this ETag (nil: back to the default), as
    /// when the file changes on the server between two requests.
    public func setETag(_ etag: String?) {
        state.box.withLockedValue { $0.etagOverride = etag }
    }

    /// From now on every `/bytes` body is the deterministic stream from byte `variant` on (nil:
    /// back to each URL's own `variant`, default 0): the file changed on the server and kept its
    /// size. Its bytes are `TestOrigin.bytes(from: variant + offset, count:)`.
    public func setVariant(_ variant: Int64?) {
        state.box.withLockedValue { $0.variantOverride = variant }
    }

    /// Serves `text` at `/doc/<name>` from now on (a Metalink, say), as text/plain: dld goes by
    /// the URL's suffix, not the type.
    public func setDocument(_ name: String, _ text: String) {
        state.box.withLockedValue { $0.documents[name] = text }
    }

    /// The most response bodies that were ever being streamed at once, to every client: how
    /// many transfers really ran together.
    public var mostConcurrentBodies: Int {
        state.box.withLockedValue { $0.mostStreaming }
    }

    /// The most bodies with `deep_after=K` that were ever streaming at once past their K-th
    /// byte: transfers that really ran together, leaving out answers a client cut after the
    /// head (a transfer dld parks before writing).
    public var mostConcurrentDeepBodies: Int {
        state.box.withLockedValue { $0.mostDeep }
    }

    /// The most requests ever waiting for or receiving their answers at once: how many
    /// requests a client really had in flight together.
    public var mostInFlight: Int {
        state.box.withLockedValue { $0.mostInFlight }
    }

    /// TCP connections accepted so far (each one TLS handshake with https).
    public var connections: Int {
        state.box.withLockedValue { $0.connections }
    }

    /// Connections that spoke HTTP/2, and the streams (requests) they carried.
    public var http2Connections: Int {
        state.box.withLockedValue { $0.http2Connections }
    }

    public var http2Streams: Int {
        state.box.withLockedValue { $0.http2Streams }
    }

    /// For each path+query, the most bodies of it that were ever streamed at once: 1 for a
    /// file that no two transfers fetched at the same time.
    public var mostConcurrentBodiesByURI: [String: Int] {
        state.box.withLockedValue { $0.mostStreamingByURI }
    }

    /// Response bodies being streamed now (begun, not yet ended or cut by either side).
    public var bodiesStreaming: Int {
        Int(state.streamingNow)
    }

    /// Every request seen so far, in order.
    public var requests: [RecordedRequest] {
        state.box.withLockedValue { $0.requests }
    }

    /// Stops listening and closes every open connection (including stalled ones). Idempotent.
    public func shutdown() async throws {
        let first = state.box.withLockedValue { values -> Bool in
            defer { values.isShutdown = true }
            return !values.isShutdown
        }
        guard first else { return }
        try? await channel.close().get()
        try await group.shutdownGracefully()
    }

    /// The byte at offset i of every deterministic body.
    public static func byte(at offset: Int64) -> UInt8 {
        let period = Int64(Pattern.period)
        var index = offset % period
        if index < 0 { index += period }
        return Pattern.value(Int(index))
    }

    /// Convenience: the first n deterministic bytes.
    public static func bytes(count: Int) -> [UInt8] {
        bytes(from: 0, count: count)
    }

    /// Convenience: `count` deterministic bytes starting at `offset`.
    public static func bytes(from offset: Int64, count: Int) -> [UInt8] {
        guard count > 0 else { return [] }
        var out = [UInt8]()
        out.reserveCapacity(count)
        let period = Int64(Pattern.period)
        var index = Int(((offset % period) + period) % period)
        Pattern.table.withUnsafeReadableBytes { raw in
            var left = count
            while left > 0 {
                let n = min(Pattern.period - index, left)
                out.append(contentsOf: raw[index..<(index + n)])
                left -= n
                index = 0
            }
        }
        return out
    }
}

// MARK: - Deterministic pattern

enum Pattern {
    /// Period of the stream: a prime just under 1 MiB, so it never lines up with power-of-two chunks.
    static let period = 1_048_573
    /// Largest body write.
    static let maxChunk = 65_536

    @inline(__always)
    static func value(_ index: Int) -> UInt8 {
        var x = (UInt64(truncatingIfNeeded: index) &+ 0x5DEE_CE66_D1CE_4E5B) &* 0x9E37_79B9_7F4A_7C15
        x ^= x >> 29
        x = x &* 0xBF58_476D_1CE4_E5B9
        x ^= x >> 32
        return UInt8(truncatingIfNeeded: x)
    }

    /// `period + maxChunk` bytes, so any chunk of up to `maxChunk` bytes is one contiguous slice.
    static let table: ByteBuffer = {
        let size = period + maxChunk
        var buffer = ByteBufferAllocator().buffer(capacity: size)
        buffer.writeWithUnsafeMutableBytes(minimumWritableBytes: size) { raw in
            for i in 0..<size {
                raw[i] = value(i % period)
            }
            return size
        }
        return buffer
    }()

    static func chunk(at offset: Int64, length: Int) -> ByteBuffer? {
        guard length >= 0, length <= maxChunk else { return nil }
        let index = Int(((offset % Int64(period)) + Int64(period)) % Int64(period))
        return table.getSlice(at: table.readerIndex + index, length: length)
    }
}

// MARK: - Shared state

final class OriginState: Sendable {
    struct Values {
        var bytesServed: Int64 = 0
        var servedByURI: [String: Int64] = [:]
        var requests: [RecordedRequest] = []
        var pathCounts: [String: Int] = [:]
        var isShutdown = false
        /// Replaces every `/bytes` ETag: the resource "changed" on the server.
        var etagOverride: String?
        /// Replaces every `/bytes` body's `variant`: the content changed under the same size.
        var variantOverride: Int64?
        /// `/doc/<name>`: texts to serve, with their content type.
        var documents: [String: String] = [:]
        /// Streamed bodies begun and not yet ended (or cut), and the most there ever were; the
        /// same for each path+query.
        var streaming = 0
        var mostStreaming = 0
        var streamingByURI: [String: Int] = [:]
        var mostStreamingByURI: [String: Int] = [:]
        /// Requests received and not yet answered in full (waiting for `latency` included),
        /// and the most there ever were.
        var inFlight = 0
        var mostInFlight = 0
        /// Bodies past their `deep_after` byte, and the most there ever were.
        var deep = 0
        var mostDeep = 0
        /// Each answer waits this long before its head (`start(latency:)`).
        var latency: TimeAmount = .zero
        var connections = 0
        var http2Connections = 0
        var http2Streams = 0
    }

    let box = NIOLockedValueBox(Values())

    func record(_ head: HTTPRequestHead) {
        let request = RecordedRequest(
            method: head.method.rawValue,
            uri: head.uri,
            headers: head.headers.map { ($0.name.lowercased(), $0.value) }
        )
        box.withLockedValue { $0.requests.append(request) }
    }

    func addServed(_ n: Int, uri: String) {
        box.withLockedValue {
            $0.bytesServed += Int64(n)
            $0.servedByURI[uri, default: 0] += Int64(n)
        }
    }

    /// Streamed bodies begun and not yet ended.
    var streamingNow: Int64 {
        Int64(box.withLockedValue { $0.streaming })
    }

    /// A streamed body of `uri` begins (`true`) or ends.
    func streaming(_ begins: Bool, uri: String) {
        box.withLockedValue { values in
            values.streaming += begins ? 1 : -1
            values.mostStreaming = max(values.mostStreaming, values.streaming)
            let now = values.streamingByURI[uri, default: 0] + (begins ? 1 : -1)
            values.streamingByURI[uri] = now == 0 ? nil : now
            values.mostStreamingByURI[uri] = max(values.mostStreamingByURI[uri] ?? 0, now)
        }
    }

    /// A body passed its `deep_after` byte (`true`), or such a body ended or was cut.
    func deep(_ begins: Bool) {
        box.withLockedValue { values in
            values.deep += begins ? 1 : -1
            values.mostDeep = max(values.mostDeep, values.deep)
        }
    }

    /// A request was received in full (`true`), or its answer ended or was cut.
    func inFlight(_ begins: Bool) {
        box.withLockedValue { values in
            values.inFlight += begins ? 1 : -1
            values.mostInFlight = max(values.mostInFlight, values.inFlight)
        }
    }

    /// Counts one more request to `path`; returns the count including this one.
    func hit(_ path: String) -> Int {
        box.withLockedValue { values in
            let n = (values.pathCounts[path] ?? 0) + 1
            values.pathCounts[path] = n
            return n
        }
    }
}

// MARK: - Per-connection handler

private let lastModifiedValue = "Wed, 21 Oct 2015 07:28:00 GMT"

/// A response body being streamed.
private struct BodyStream {
    enum Source {
        case pattern(start: Int64)
        case fixed(ByteBuffer)
    }

    enum Ending {
        /// Write `.end`; keep the connection for the next request.
        case keepAlive
        /// Write `.end`, then close once it is written.
        case closeAfterEnd
        /// Don't write `.end`: close once the body is written (Content-Length was a lie).
        case closeWithoutEnd
    }

    enum LimitAction {
        /// Close the connection, after `linger` once the last byte is written.
        case drop(linger: TimeAmount)
        case stall
    }

    var source: Source
    var remaining: Int64
    var sent: Int64 = 0
    var ending: Ending
    var limit: Int64?
    var limitAction: LimitAction = .drop(linger: .zero)
    var rate: Int64?
    var rateStart: NIODeadline?
    /// `gate=N`: the body's first byte waits until N bodies are streaming at once (this one
    /// among them), for at most `gateWait`; a peak of concurrency is then an event, not luck.
    var gate: Int64?
    var gateUntil: NIODeadline?
    static let gateWait: TimeAmount = .seconds(20)
    /// `deep_after=K`: from its K-th byte the body counts in `OriginState.deep`.
    var deepAfter: Int64?
    var stalled = false
    /// The request's path+query, for `bytesServed(uri:)`.
    var uri = ""
    /// `corrupt=K`: this offset of the pattern is served with its bits flipped; with
    /// `corrupt_every=P`, also every P bytes after it.
    var corrupt: Int64?
    var corruptEvery: Int64?

    func chunk(length: Int) -> ByteBuffer? {
        switch source {
        case .pattern(let start):
            let at = start + sent
            guard let corrupt, var chunk = Pattern.chunk(at: at, length: length) else { return Pattern.chunk(at: at, length: length) }
            let end = at + Int64(chunk.readableBytes)
            var offsets: [Int64] = []
            if let every = corruptEvery, every > 0 {
                var next = corrupt >= at ? corrupt : corrupt + (at - corrupt + every - 1) / every * every
                while next < end {
                    offsets.append(next)
                    next += every
                }
            } else if corrupt >= at && corrupt < end {
                offsets = [corrupt]
            }
            guard !offsets.isEmpty else { return chunk }
            // A copy: the pattern's table is shared by every response.
            var copy = ByteBufferAllocator().buffer(capacity: chunk.readableBytes)
            copy.writeBuffer(&chunk)
            for offset in offsets {
                let index = copy.readerIndex + Int(offset - at)
                copy.setInteger(~(copy.getInteger(at: index, as: UInt8.self) ?? 0), at: index)
            }
            return copy
        case .fixed(let buffer):
            return buffer.getSlice(at: buffer.readerIndex + Int(sent), length: length)
        }
    }
}

/// The parsed query-string options that shape a response.
private struct Query {
    var values: [String: String] = [:]

    init(_ query: Substring?) {
        guard let query else { return }
        for pair in query.split(separator: "&", omittingEmptySubsequences: true) {
            if let eq = pair.firstIndex(of: "=") {
                values[percentDecode(pair[..<eq])] = percentDecode(pair[pair.index(after: eq)...])
            } else {
                values[percentDecode(pair)] = ""
            }
        }
    }

    subscript(_ key: String) -> String? { values[key] }

    /// `.invalid` if present but not a non-negative integer.
    func int(_ key: String) -> IntOption {
        guard let raw = values[key] else { return .absent }
        guard let v = Int64(raw), v >= 0 else { return .invalid }
        return .value(v)
    }

    enum IntOption {
        case absent
        case invalid
        case value(Int64)
    }
}

final class OriginHandler: ChannelInboundHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    private let state: OriginState
    private var requestHead: HTTPRequestHead?
    private var body: BodyStream?
    private var pumping = false
    private var closing = false
    private var timer: Scheduled<Void>?
    private var lastWrite: EventLoopFuture<Void>?
    /// A body of this connection counts in `OriginState.streaming`, under this path+query.
    private var counted: String?
    /// A request of this connection counts in `OriginState.inFlight`.
    private var answering = false
    /// The body of this connection counts in `OriginState.deep`.
    private var deep = false

    init(state: OriginState) {
        self.state = state
    }

    // MARK: Channel events

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            state.record(head)
            requestHead = head
        case .body:
            break
        case .end:
            guard let head = requestHead else { return }
            requestHead = nil
            guard !closing else { return }
            if !answering {
                answering = true
                state.inFlight(true)
            }
            let latency = state.box.withLockedValue { $0.latency }
            guard latency > .zero else {
                respond(context: context, request: head)
                return
            }
            // A distant server: the answer comes a round trip later.
            let loopBound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
            context.eventLoop.scheduleTask(in: latency) {
                let (handler, context) = loopBound.value
                guard !handler.closing, context.channel.isActive else { return }
                handler.respond(context: context, request: head)
            }
        }
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable {
            pump(context: context)
        }
        context.fireChannelWritabilityChanged()
    }

    func channelInactive(context: ChannelHandlerContext) {
        reset()
        context.fireChannelInactive()
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        reset()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        reset()
        context.close(promise: nil)
    }

    private func reset() {
        if let uri = counted {
            counted = nil
            state.streaming(false, uri: uri)
        }
        if deep {
            deep = false
            state.deep(false)
        }
        answered()
        timer?.cancel()
        timer = nil
        body = nil
        lastWrite = nil
        closing = true
    }

    // MARK: Routing

    private func respond(context: ChannelHandlerContext, request: HTTPRequestHead) {
        let uri = request.uri
        let path: Substring
        let queryString: Substring?
        if let q = uri.firstIndex(of: "?") {
            path = uri[..<q]
            queryString = uri[uri.index(after: q)...]
        } else {
            path = uri[...]
            queryString = nil
        }
        let query = Query(queryString)
        let parts = path.split(separator: "/", omittingEmptySubsequences: true)

        guard request.method == .GET || request.method == .HEAD else {
            var headers = HTTPHeaders()
            headers.add(name: "Allow", value: "GET, HEAD")
            sendText(context: context, request: request, status: .methodNotAllowed, headers: headers, text: "method not allowed\n")
            return
        }

        switch parts.first {
        case "bytes" where parts.count == 2:
            guard let n = Int64(parts[1]), n >= 0 else { return notFound(context: context, request: request) }
            serveBytes(context: context, request: request, size: n, query: query)

        case "fail_first" where parts.count == 4 && parts[2] == "bytes":
            guard let m = Int(parts[1]), m >= 0, let n = Int64(parts[3]), n >= 0 else {
                return notFound(context: context, request: request)
            }
            if state.hit(String(path)) <= m {
                var headers = HTTPHeaders()
                headers.add(name: "Retry-After", value: "1")
                let status = query["fail_status"] == "429" ? HTTPResponseStatus.tooManyRequests : .serviceUnavailable
                sendText(context: context, request: request, status: status, headers: headers, text: "try again later\n")
            } else {
                serveBytes(context: context, request: request, size: n, query: query)
            }

        case "status" where parts.count == 2:
            guard let code = Int(parts[1]), (200...599).contains(code) else {
                sendText(context: context, request: request, status: .badRequest, text: "bad status code\n")
                return
            }
            let status = HTTPResponseStatus(statusCode: code)
            var headers = HTTPHeaders()
            if let retry = query["retry_after"] {
                headers.add(name: "Retry-After", value: retry)
            }
            sendText(context: context, request: request, status: status, headers: headers, text: "\(code) \(status.reasonPhrase)\n")

        case "redirect" where parts.count == 2:
            guard let k = Int(parts[1]), k >= 0 else { return notFound(context: context, request: request) }
            guard let target = query["to"] else {
                sendText(context: context, request: request, status: .badRequest, text: "missing to=\n")
                return
            }
            let location = k == 0 ? target : "/redirect/\(k - 1)?to=\(percentEncode(target))"
            redirect(context: context, request: request, to: location)

        case "doc" where parts.count == 2:
            guard let document = state.box.withLockedValue({ $0.documents[String(parts[1])] }) else {
                return notFound(context: context, request: request)
            }
            sendText(context: context, request: request, status: .ok, text: document)

        case "loop" where parts.count == 1:
            redirect(context: context, request: request, to: "/loop")

        case "close" where parts.count == 1:
            // No answer at all: the connection closes after the request.
            context.close(promise: nil)

        case "_stats" where parts.count == 1:
            // For benchmarks that run the origin as a separate process.
            let served = state.box.withLockedValue { $0.bytesServed }
            sendText(context: context, request: request, status: .ok, text: "{\"bytes_served\": \(served)}\n")

        default:
            notFound(context: context, request: request)
        }
    }

    private func notFound(context: ChannelHandlerContext, request: HTTPRequestHead) {
        sendText(context: context, request: request, status: .notFound, text: "not found\n")
    }

    private func redirect(context: ChannelHandlerContext, request: HTTPRequestHead, to location: String) {
        var headers = HTTPHeaders()
        headers.add(name: "Location", value: location)
        sendText(context: context, request: request, status: .found, headers: headers, text: "")
    }

    private func sendText(
        context: ChannelHandlerContext,
        request: HTTPRequestHead,
        status: HTTPResponseStatus,
        headers extra: HTTPHeaders = HTTPHeaders(),
        text: String
    ) {
        var headers = extra
        let noBody = status == .noContent || status == .notModified
        var buffer = context.channel.allocator.buffer(capacity: text.utf8.count)
        if !noBody {
            buffer.writeString(text)
            headers.add(name: "Content-Type", value: "text/plain; charset=utf-8")
            headers.add(name: "Content-Length", value: String(buffer.readableBytes))
        }
        let isHead = request.method == .HEAD
        let stream = BodyStream(
            source: .fixed(buffer),
            remaining: isHead || noBody ? 0 : Int64(buffer.readableBytes),
            ending: request.isKeepAlive ? .keepAlive : .closeAfterEnd
        )
        start(context: context, request: request, status: status, headers: headers, stream: stream)
    }

    private enum RangeResult {
        case none
        case unsatisfiable
        case range(Int64, Int64)  // inclusive
    }

    private func parseRange(_ value: String, size: Int64) -> RangeResult {
        let trimmed = value.trimmingCharacters(in: .whitespaces)
        guard trimmed.lowercased().hasPrefix("bytes=") else { return .none }
        let spec = trimmed.dropFirst("bytes=".count).trimmingCharacters(in: .whitespaces)
        guard !spec.contains(","), let dash = spec.firstIndex(of: "-") else { return .none }
        let first = spec[..<dash].trimmingCharacters(in: .whitespaces)
        let last = spec[spec.index(after: dash)...].trimmingCharacters(in: .whitespaces)
        if first.isEmpty {
            // Suffix range: the last S bytes.
            guard let s = Int64(last), s >= 0 else { return .none }
            if s == 0 || size == 0 { return .unsatisfiable }
            return .range(max(0, size - s), size - 1)
        }
        guard let a = Int64(first), a >= 0 else { return .none }
        var b = size - 1
        if !last.isEmpty {
            guard let parsed = Int64(last), parsed >= a else { return .none }
            b = min(parsed, size - 1)
        }
        if a >= size { return .unsatisfiable }
        return .range(a, b)
    }

    private func serveBytes(context: ChannelHandlerContext, request: HTTPRequestHead, size: Int64, query: Query) {
        var numbers: [String: Int64] = [:]
        for key in [
            "rate", "drop_after", "stall_after", "length", "overlong", "linger", "ranges_for", "variant", "gate", "corrupt",
            "corrupt_every", "deep_after",
        ] {
            switch query.int(key) {
            case .absent:
                continue
            case .invalid:
                sendText(context: context, request: request, status: .badRequest, text: "bad \(key)=\n")
                return
            case .value(let v):
                numbers[key] = v
            }
        }
        let rate = numbers["rate"].flatMap { $0 > 0 ? $0 : nil }
        let dropAfter = numbers["drop_after"]
        let drop = BodyStream.LimitAction.drop(linger: .milliseconds(numbers["linger"] ?? 0))
        let stallAfter = numbers["stall_after"]
        let lengthLie = numbers["length"]
        let noRange = query["norange"].map { $0 != "0" && $0.lowercased() != "false" } ?? false
        let noLength = query["nolength"].map { $0 != "0" && $0.lowercased() != "false" } ?? false
        let overlong = numbers["overlong"] ?? 0
        let (override, variantOverride) = state.box.withLockedValue { ($0.etagOverride, $0.variantOverride) }
        let etag = "\"\(override ?? query["etag"] ?? "v1-\(size)")\""
        let noValidators = query["novalidators"].map { $0 != "0" && $0.lowercased() != "false" } ?? false
        let variant = variantOverride ?? numbers["variant"] ?? 0

        var headers = HTTPHeaders()
        headers.add(name: "Content-Type", value: "application/octet-stream")
        if !noRange {
            headers.add(name: "Accept-Ranges", value: "bytes")
        }
        if !noValidators {
            headers.add(name: "ETag", value: etag)
            headers.add(name: "Last-Modified", value: lastModifiedValue)
        }
        if let cacheControl = query["cache_control"] {
            headers.add(name: "Cache-Control", value: cacheControl)
        }
        if let duplicate = query["duplicate"] {
            headers.add(name: "Link", value: "<\(duplicate)>; rel=duplicate; pri=1")
        }
        if let digest = query["sha256"] {
            headers.add(name: "Digest", value: "SHA-256=\(digest)")
        }
        // A conditional GET whose validator still matches: 304, no body (RFC 9110 §13.1).
        let tags = request.headers.first(name: "if-none-match")
        let notModified: Bool
        if noValidators {
            notModified = false
        } else if let tags {
            notModified = tags.split(separator: ",").contains { tag in
                let trimmed = tag.trimmingCharacters(in: .whitespaces)
                return trimmed == "*" || (trimmed.hasPrefix("W/") ? String(trimmed.dropFirst(2)) : trimmed) == etag
            }
        } else {
            notModified = request.headers.first(name: "if-modified-since") == lastModifiedValue
        }
        if notModified {
            var h = HTTPHeaders()
            h.add(name: "ETag", value: etag)
            h.add(name: "Last-Modified", value: lastModifiedValue)
            if let cacheControl = query["cache_control"] { h.add(name: "Cache-Control", value: cacheControl) }
            sendText(context: context, request: request, status: .notModified, headers: h, text: "")
            return
        }
        if let name = query["name"] {
            let escaped = name.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "\"", with: "\\\"")
            headers.add(name: "Content-Disposition", value: "attachment; filename=\"\(escaped)\"")
        }

        var status = HTTPResponseStatus.ok
        var first: Int64 = 0
        var length = size
        if !noRange, let rangeValue = request.headers.first(name: "range") {
            var apply = true
            if let ifRange = request.headers.first(name: "if-range") {
                let v = ifRange.trimmingCharacters(in: .whitespaces)
                apply = !noValidators && (v == etag || v == lastModifiedValue)
            }
            if let honoured = numbers["ranges_for"] {
                let path = request.uri.split(separator: "?", maxSplits: 1).first.map(String.init) ?? request.uri
                if state.hit("ranges:" + path) > honoured { apply = false }
            }
            if apply {
                switch parseRange(rangeValue, size: size) {
                case .none:
                    break
                case .unsatisfiable:
                    var h = HTTPHeaders()
                    h.add(name: "Content-Range", value: "bytes */\(size)")
                    h.add(name: "Accept-Ranges", value: "bytes")
                    if !noValidators { h.add(name: "ETag", value: etag) }
                    sendText(context: context, request: request, status: .rangeNotSatisfiable, headers: h, text: "")
                    return
                case .range(let a, let b):
                    status = .partialContent
                    first = a
                    length = b - a + 1
                    headers.add(name: "Content-Range", value: "bytes \(a)-\(b)/\(size)")
                    // The body runs on past the end it announced (the pattern goes on).
                    length += overlong
                }
            }
        }

        let advertised = lengthLie ?? length
        if !noLength {
            // Without it, NIO frames the body as chunked: the client cannot know the size.
            headers.add(name: "Content-Length", value: String(advertised))
        }
        var ending: BodyStream.Ending = request.isKeepAlive ? .keepAlive : .closeAfterEnd
        if advertised > length && request.method != .HEAD {
            ending = .closeWithoutEnd
        }
        var stream = BodyStream(
            source: .pattern(start: first + variant),
            remaining: request.method == .HEAD ? 0 : min(advertised, length),
            ending: ending
        )
        stream.rate = rate
        stream.gate = numbers["gate"]
        stream.deepAfter = numbers["deep_after"]
        stream.corrupt = numbers["corrupt"].map { $0 + variant }
        stream.corruptEvery = numbers["corrupt_every"]
        switch (dropAfter, stallAfter) {
        case (let d?, let s?):
            stream.limit = min(d, s)
            stream.limitAction = d <= s ? drop : .stall
        case (let d?, nil):
            stream.limit = d
            stream.limitAction = drop
        case (nil, let s?):
            stream.limit = s
            stream.limitAction = .stall
        case (nil, nil):
            break
        }
        if let limit = stream.limit, limit >= stream.remaining {
            stream.limit = nil  // the whole body fits under the limit: nothing to drop or stall
        }
        start(context: context, request: request, status: status, headers: headers, stream: stream)
    }

    // MARK: Streaming

    private func start(
        context: ChannelHandlerContext,
        request: HTTPRequestHead,
        status: HTTPResponseStatus,
        headers: HTTPHeaders,
        stream: BodyStream
    ) {
        var headers = headers
        headers.add(name: "Server", value: "dld-test-origin")
        if stream.ending == .closeAfterEnd {
            headers.replaceOrAdd(name: "Connection", value: "close")
        } else if request.version.major == 1 && request.version.minor == 0 && request.isKeepAlive {
            headers.replaceOrAdd(name: "Connection", value: "keep-alive")
        }
        let head = HTTPResponseHead(version: request.version, status: status, headers: headers)
        lastWrite = context.write(wrapOutboundOut(.head(head)))
        if counted == nil {
            counted = request.uri
            state.streaming(true, uri: request.uri)
        }
        body = stream
        body?.uri = request.uri
        pump(context: context)
    }

    /// Writes as much of the current body as writability, rate and limits allow; finishes it when done.
    /// Re-entrant calls (from writability changes or pipelined requests delivered while writing `.end`)
    /// return at once: the outer loop picks up whatever `self.body` holds next.
    private func pump(context: ChannelHandlerContext) {
        guard !pumping else { return }
        pumping = true
        defer { pumping = false }
        var unflushed = 0

        loop: while var stream = body {
            if stream.stalled { break loop }
            if let gate = stream.gate {
                let now = NIODeadline.now()
                let until = stream.gateUntil ?? now + BodyStream.gateWait
                if state.streamingNow < gate && now < until {
                    stream.gateUntil = until
                    body = stream
                    scheduleWake(context: context, in: .milliseconds(5))
                    break loop
                }
                stream.gate = nil
                body = stream
            }
            if stream.remaining == 0 {
                unflushed = 0
                finish(context: context, stream: stream)
                continue loop
            }
            if let limit = stream.limit, stream.sent >= limit {
                switch stream.limitAction {
                case .drop(let linger):
                    body = nil
                    closing = true
                    unflushed = 0
                    closeAfterWrites(context: context, linger: linger)
                    return
                case .stall:
                    stream.stalled = true
                    body = stream
                    break loop
                }
            }
            guard context.channel.isActive, context.channel.isWritable else { break loop }

            var n = min(Int64(Pattern.maxChunk), stream.remaining)
            if let limit = stream.limit {
                n = min(n, limit - stream.sent)
            }
            if let rate = stream.rate {
                let now = NIODeadline.now()
                let startTime = stream.rateStart ?? now
                stream.rateStart = startTime
                let burst = max(1, min(262_144, rate / 50))
                let elapsed = Double((now - startTime).nanoseconds) / 1e9
                let earned = Int64(Double(rate) * elapsed) + burst
                let allowed = earned - stream.sent
                let want = min(n, burst)
                if allowed < want {
                    let deficit = want - max(0, allowed)
                    let delayNanos = max(1_000_000, Int64(Double(deficit) / Double(rate) * 1e9))
                    body = stream
                    scheduleWake(context: context, in: .nanoseconds(delayNanos))
                    break loop
                }
                n = min(n, allowed)
            }

            guard let chunk = stream.chunk(length: Int(n)) else { break loop }
            stream.sent += n
            stream.remaining -= n
            if let after = stream.deepAfter, !deep, stream.sent >= after {
                deep = true
                state.deep(true)
            }
            body = stream
            let count = Int(n)
            let state = self.state
            let uri = stream.uri
            let written = context.write(wrapOutboundOut(.body(.byteBuffer(chunk))))
            written.whenSuccess { state.addServed(count, uri: uri) }
            lastWrite = written
            unflushed += 1
            if unflushed >= 4 {
                unflushed = 0
                context.flush()
            }
        }
        if unflushed > 0 {
            context.flush()
        }
    }

    /// The request of this connection is no longer in flight.
    private func answered() {
        guard answering else { return }
        answering = false
        state.inFlight(false)
    }

    private func scheduleWake(context: ChannelHandlerContext, in delay: TimeAmount) {
        guard timer == nil else { return }
        timer = context.eventLoop.assumeIsolated().scheduleTask(in: delay) {
            self.timer = nil
            self.pump(context: context)
        }
    }

    private func finish(context: ChannelHandlerContext, stream: BodyStream) {
        body = nil
        if let uri = counted {
            counted = nil
            state.streaming(false, uri: uri)
        }
        if deep {
            deep = false
            state.deep(false)
        }
        answered()
        switch stream.ending {
        case .keepAlive:
            lastWrite = nil
            // May synchronously deliver the next pipelined request (which may set `body`).
            context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
        case .closeAfterEnd:
            closing = true
            lastWrite = context.write(wrapOutboundOut(.end(nil)))
            closeAfterWrites(context: context)
        case .closeWithoutEnd:
            closing = true
            closeAfterWrites(context: context)
        }
    }

    /// Flushes, then closes the connection once everything written so far has reached the socket.
    private func closeAfterWrites(context: ChannelHandlerContext, linger: TimeAmount = .zero) {
        context.flush()
        let close = {
            if linger > .zero {
                context.eventLoop.assumeIsolated().scheduleTask(in: linger) { context.close(promise: nil) }
            } else {
                context.close(promise: nil)
            }
        }
        if let last = lastWrite {
            lastWrite = nil
            last.assumeIsolated().whenComplete { _ in close() }
        } else {
            close()
        }
    }
}

// MARK: - Percent coding

private func hexValue(_ c: UInt8) -> UInt8? {
    switch c {
    case UInt8(ascii: "0")...UInt8(ascii: "9"): return c - UInt8(ascii: "0")
    case UInt8(ascii: "a")...UInt8(ascii: "f"): return c - UInt8(ascii: "a") + 10
    case UInt8(ascii: "A")...UInt8(ascii: "F"): return c - UInt8(ascii: "A") + 10
    default: return nil
    }
}

func percentDecode<S: StringProtocol>(_ s: S) -> String {
    let bytes = Array(s.utf8)
    var out = [UInt8]()
    out.reserveCapacity(bytes.count)
    var i = 0
    while i < bytes.count {
        if bytes[i] == UInt8(ascii: "%"), i + 2 < bytes.count,
            let hi = hexValue(bytes[i + 1]), let lo = hexValue(bytes[i + 2])
        {
            out.append(hi << 4 | lo)
            i += 3
        } else {
            out.append(bytes[i])
            i += 1
        }
    }
    return String(decoding: out, as: UTF8.self)
}

func percentEncode(_ s: String) -> String {
    let hex = Array("0123456789ABCDEF".utf8)
    var out = [UInt8]()
    for c in s.utf8 {
        switch c {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
            UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "."),
            UInt8(ascii: "_"), UInt8(ascii: "~"):
            out.append(c)
        default:
            out.append(UInt8(ascii: "%"))
            out.append(hex[Int(c >> 4)])
            out.append(hex[Int(c & 0x0F)])
        }
    }
    return String(decoding: out, as: UTF8.self)
}
