import DLCore
import DLRPC
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import NIOWebSocket
import Synchronization

/// The HTTP listener: the same JSON-RPC as the socket, for a browser or a remote client
/// (docs/protocol.md, "Transports"), behind a token, Host and Origin checks, and TLS beyond
/// loopback. Every request goes through the socket's `Dispatcher`.
public final class HTTPListener: Sendable {
    /// What every connection is served with.
    struct Settings: Sendable {
        let policy: HostPolicy
        let token: String
        let maxBodyBytes: Int
        let maxConnections: Int
        /// A connection silent this long is closed; a request must be whole within it too.
        let readTimeout: TimeAmount
        /// The listener of `aria2_listen`: only aria2's `/jsonrpc` is served.
        var aria2Only = false
    }

    let settings: Settings
    let dispatcher: Dispatcher
    let hub: EventHub
    /// What `GET /metrics` renders; nil: 404 (tests of the listener alone).
    let metrics: Metrics?
    let logger: Logger
    let throttle = AuthThrottle()
    let onShutdown: @Sendable () -> Void
    /// aria2's JSON-RPC on `/jsonrpc` (docs/aria2.md).
    let aria2: Aria2RPC
    /// The listener of `aria2_listen`, closed with this one.
    private let companion = Mutex<HTTPListener?>(nil)
    private let server: Mutex<(any Channel)?> = Mutex(nil)
    /// The open connections, closed with the listener.
    private let children = Mutex<[ObjectIdentifier: any Channel]>([:])
    /// The URL served, as written to `<state_dir>/http-url`.
    public let url: String
    private let urlFile: String

    /// Binds the listener of `config` (nil when `http_listen` is ""), writes its URL to
    /// `<state_dir>/http-url`; throws a `DaemonError` that says why it cannot.
    /// A TCP socket passed by systemd (`adopting`, dld-http.socket) is served instead of
    /// `http_listen`, under the same rules (its address decides whether TLS is needed).
    /// With `aria2_listen`, aria2's listener is bound too, and closed with the one returned
    /// (which is aria2's alone when `http_listen` is "").
    static func start(
        config: DaemonConfig, adopting inherited: Int32? = nil, dispatcher: Dispatcher, hub: EventHub, metrics: Metrics?,
        logger: Logger, liveConfig: (@Sendable () -> DaemonConfig)? = nil, onShutdown: @escaping @Sendable () -> Void
    ) async throws -> HTTPListener? {
        let urlFile = config.stateDir + "/http-url"
        unlink(urlFile)
        let common = try Common(config, logger: logger, liveConfig: liveConfig)
        let main: HTTPListener?
        if let inherited {
            main = try await adopt(
                inherited, config: config, common: common, dispatcher: dispatcher, hub: hub, metrics: metrics, logger: logger,
                onShutdown: onShutdown)
        } else if config.httpListen == "" {
            main = nil
        } else {
            main = try await bindMain(
                config: config, common: common, dispatcher: dispatcher, hub: hub, metrics: metrics, logger: logger, onShutdown: onShutdown)
        }
        guard let text = config.aria2Listen else { return main }
        let aria2: HTTPListener
        do {
            aria2 = try await bindAria2(
                text, config: config, common: common, dispatcher: dispatcher, hub: hub, logger: logger, onShutdown: onShutdown)
        } catch {
            main?.close()
            throw error
        }
        guard let main else { return aria2 }
        main.companion.withLock { $0 = aria2 }
        return main
    }

    /// The listener of `aria2_listen`: aria2's `/jsonrpc` only, under the same rules.
    private static func bindAria2(
        _ text: String, config: DaemonConfig, common: Common, dispatcher: Dispatcher, hub: EventHub, logger: Logger,
        onShutdown: @escaping @Sendable () -> Void
    ) async throws -> HTTPListener {
        let address: HTTPAddress
        do {
            address = try HTTPAddress.parse(text)
        } catch {
            throw DaemonError("aria2_listen: \(error)")
        }
        let tls = try tlsContext(config)
        try requireTLS(beyondLoopback: address, tls: tls, config: config, key: "aria2_listen")
        let listener = HTTPListener(
            serving: address, tls: tls != nil, common: common, config: config, dispatcher: dispatcher, hub: hub, metrics: nil,
            logger: logger, onShutdown: onShutdown, aria2Only: true)
        let bound: any Channel
        do {
            bound = try await listener.bind(host: address.host, port: address.port, tls: tls)
        } catch let error as IOError where error.errnoCode == EADDRINUSE {
            throw DaemonError("aria2_listen \(address.hostInURL):\(address.port): the port is in use; choose another")
        } catch {
            throw DaemonError("aria2_listen \(address.hostInURL):\(address.port): \(error)")
        }
        listener.server.withLock { $0 = bound }
        logger.info("aria2 JSON-RPC listening", metadata: ["url": "\(listener.url)jsonrpc"])
        return listener
    }

    /// The listener of `http_listen` (or its default).
    private static func bindMain(
        config: DaemonConfig, common: Common, dispatcher: Dispatcher, hub: EventHub, metrics: Metrics?, logger: Logger,
        onShutdown: @escaping @Sendable () -> Void
    ) async throws -> HTTPListener {
        let explicit = config.httpListen != nil
        let address: HTTPAddress
        do {
            address = try config.httpListen.map(HTTPAddress.parse) ?? .default
        } catch {
            throw DaemonError("http_listen: \(error)")
        }
        let tls = try tlsContext(config)
        try requireTLS(beyondLoopback: address, tls: tls, config: config)
        // The default address tries its neighbours; one that was asked for is that one or none.
        let ports = explicit || address.port != HTTPAddress.defaultPort ? address.port...address.port : HTTPAddress.defaultPorts
        var bound: (any Channel)?
        var listener: HTTPListener?
        var boundAddress = address
        for port in ports {
            boundAddress.port = port
            let candidate = HTTPListener(
                serving: boundAddress, tls: tls != nil, common: common, config: config, dispatcher: dispatcher, hub: hub, metrics: metrics,
                logger: logger, onShutdown: onShutdown)
            do {
                bound = try await candidate.bind(host: boundAddress.host, port: port, tls: tls)
                listener = candidate
                break
            } catch let error as IOError where error.errnoCode == EADDRINUSE {
                if ports.count == 1 {
                    throw DaemonError(
                        "http_listen \(boundAddress.hostInURL):\(port): the port is in use; choose another, or \"\" for no HTTP listener")
                }
                logger.info("HTTP port in use; trying the next", metadata: ["port": "\(port)"])
            } catch {
                throw DaemonError("http_listen \(boundAddress.hostInURL):\(port): \(error)")
            }
        }
        guard let bound, let listener else {
            throw DaemonError(
                "the HTTP ports \(ports.lowerBound)…\(ports.upperBound) are all in use; set http_listen to a free address, or \"\" for none"
            )
        }
        if boundAddress.port != address.port {
            logger.notice("HTTP port \(address.port) was in use; took the next free one", metadata: ["url": "\(listener.url)"])
        }
        try listener.serve(bound, from: "dld")
        return listener
    }

    /// The listener on a TCP socket that systemd bound: `http_listen` is not used then.
    private static func adopt(
        _ fd: Int32, config: DaemonConfig, common: Common, dispatcher: Dispatcher, hub: EventHub, metrics: Metrics?, logger: Logger,
        onShutdown: @escaping @Sendable () -> Void
    ) async throws -> HTTPListener {
        guard let address = HTTPAddress.bound(to: fd) else {
            throw DaemonError("the HTTP socket systemd passed (dld-http.socket) has no IP address and port")
        }
        if config.httpListen != nil {
            logger.notice("http_listen is not used: systemd passed the HTTP socket (dld-http.socket)")
        }
        let tls = try tlsContext(config)
        do {
            try requireTLS(beyondLoopback: address, tls: tls, config: config)
        } catch {
            Glibc.close(fd)
            throw error
        }
        let listener = HTTPListener(
            serving: address, tls: tls != nil, common: common, config: config, dispatcher: dispatcher, hub: hub,
            metrics: metrics, logger: logger,
            onShutdown: onShutdown)
        let bound: any Channel
        do {
            bound = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                .childChannelInitializer { [listener] channel in
                    channel.eventLoop.makeCompletedFuture { try listener.initialize(channel, tls: tls) }
                }
                .withBoundSocket(NIOBSDSocket.Handle(fd)).get()
        } catch {
            throw DaemonError("the HTTP socket systemd passed (dld-http.socket): \(error)")
        }
        try listener.serve(bound, from: "systemd")
        return listener
    }

    /// Beyond loopback the token must not cross the network in clear.
    private static func requireTLS(
        beyondLoopback address: HTTPAddress, tls: NIOSSLContext?, config: DaemonConfig, key: String = "http_listen"
    ) throws {
        if !address.isLoopback && tls == nil && !config.httpAllowInsecure {
            throw DaemonError(
                "\(key) \(address.hostInURL):\(address.port) is beyond loopback: set http_cert and http_key (TLS), "
                    + "or http_allow_insecure = true if a TLS proxy is in front; the token would otherwise cross the network in clear")
        }
    }

    /// Keeps the bound channel, writes `<state_dir>/http-url`, and says so.
    private func serve(_ bound: any Channel, from source: String) throws {
        server.withLock { $0 = bound }
        try writeURLFile()
        logger.info("HTTP listening", metadata: ["url": "\(url)", "tls": "\(url.hasPrefix("https"))", "socket_from": "\(source)"])
    }

    /// What every candidate address is served with: the token (read or made once) and the
    /// read timeout.
    private struct Common {
        let token: String
        let readTimeout: TimeAmount
        /// aria2's secret: `aria2_secret`, else the token.
        let aria2Secret: String
        let liveConfig: @Sendable () -> DaemonConfig

        init(_ config: DaemonConfig, logger: Logger, liveConfig: (@Sendable () -> DaemonConfig)?) throws {
            token = try HTTPToken.loadOrCreate(stateDir: config.stateDir)
            readTimeout = HTTPListener.testReadTimeout(logger: logger) ?? .seconds(30)
            aria2Secret = config.aria2Secret ?? token
            self.liveConfig = liveConfig ?? { config }
        }
    }

    /// A listener for `address` with the config's limits, not bound yet.
    private convenience init(
        serving address: HTTPAddress, tls: Bool, common: Common, config: DaemonConfig, dispatcher: Dispatcher, hub: EventHub,
        metrics: Metrics?, logger: Logger, onShutdown: @escaping @Sendable () -> Void, aria2Only: Bool = false
    ) {
        self.init(
            settings: Settings(
                policy: HostPolicy(
                    address: address, tls: tls, extraHosts: Set(config.httpHosts ?? []), origins: Set(config.httpOrigins ?? [])),
                token: common.token, maxBodyBytes: config.maxLineBytes, maxConnections: config.maxConnections,
                readTimeout: common.readTimeout, aria2Only: aria2Only),
            dispatcher: dispatcher, hub: hub, metrics: metrics, logger: logger, onShutdown: onShutdown,
            aria2: Aria2RPC(dispatcher: dispatcher, secret: common.aria2Secret, config: common.liveConfig),
            url: "\(tls ? "https" : "http")://\(address.localHostInURL):\(address.port)/", urlFile: config.stateDir + "/http-url")
    }

    private init(
        settings: Settings, dispatcher: Dispatcher, hub: EventHub, metrics: Metrics?, logger: Logger,
        onShutdown: @escaping @Sendable () -> Void, aria2: Aria2RPC, url: String, urlFile: String
    ) {
        self.aria2 = aria2
        self.settings = settings
        self.dispatcher = dispatcher
        self.hub = hub
        self.metrics = metrics
        self.logger = logger
        self.onShutdown = onShutdown
        self.url = url
        self.urlFile = urlFile
    }

    /// For tests only: `DLD_TEST_HTTP_TIMEOUT=<seconds>` replaces the 30 s of the read timeout
    /// and the request deadline, so that slow clients are shown cut off in a second. Not a
    /// setting: it is logged as a warning when set.
    static func testReadTimeout(logger: Logger) -> TimeAmount? {
        guard let text = ProcessInfo.processInfo.environment["DLD_TEST_HTTP_TIMEOUT"] else { return nil }
        guard let seconds = Double(text), seconds.isFinite, seconds > 0, seconds <= 3600 else {
            logger.warning("DLD_TEST_HTTP_TIMEOUT is not a number of seconds; ignored", metadata: ["value": "\(text.prefix(40))"])
            return nil
        }
        logger.warning("test hook: the HTTP read timeout is changed", metadata: ["seconds": "\(seconds)"])
        return .milliseconds(Int64(seconds * 1000))
    }

    static func tlsContext(_ config: DaemonConfig) throws -> NIOSSLContext? {
        guard let certFile = config.httpCert, let keyFile = config.httpKey else { return nil }
        do {
            let chain = try NIOSSLCertificate.fromPEMFile(certFile).map { NIOSSLCertificateSource.certificate($0) }
            let key = try NIOSSLPrivateKey(file: keyFile, format: .pem)
            return try NIOSSLContext(configuration: .makeServerConfiguration(certificateChain: chain, privateKey: .privateKey(key)))
        } catch {
            throw DaemonError("http_cert/http_key: cannot use \(certFile) and \(keyFile): \(error)")
        }
    }

    private func bind(host: String, port: Int, tls: NIOSSLContext?) async throws -> any Channel {
        try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.backlog, value: 128)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { [self] channel in
                channel.eventLoop.makeCompletedFuture { try self.initialize(channel, tls: tls) }
            }
            .bind(host: host, port: port).get()
    }

    /// Each connection: counted against the limit, then TLS, timeouts, HTTP with its error
    /// handling (a malformed request or an oversized head gets a 400 and the connection ends).
    fileprivate func initialize(_ channel: any Channel, tls: NIOSSLContext?) throws {
        let id = ObjectIdentifier(channel)
        let open = children.withLock { children -> Int in
            children[id] = channel
            return children.count
        }
        channel.closeFuture.whenComplete { [self] _ in _ = children.withLock { $0.removeValue(forKey: id) } }
        let sync = channel.pipeline.syncOperations
        guard open <= settings.maxConnections else {
            logger.warning("HTTP connection refused: too many open connections", metadata: ["limit": "\(settings.maxConnections)"])
            try sync.addHandler(Refuser())
            return
        }
        if let tls { try sync.addHandler(NIOSSLServerHandler(context: tls)) }
        try sync.addHandler(IdleStateHandler(readTimeout: settings.readTimeout))
        // The same checks as every request, before the upgrade (`UpgradeGate`).
        let upgrader = NIOWebSocketServerUpgrader(
            maxFrameSize: settings.maxBodyBytes, automaticErrorHandling: true,
            shouldUpgrade: { [self] channel, head in
                guard self.admitsUpgrade(head) else { return channel.eventLoop.makeSucceededFuture(nil) }
                // The gate goes before the HTTP decoder does: the decoder hands the bytes it
                // read past the request (the first frames) on as bytes, not HTTP parts, and
                // the gate must not be there to receive them.
                let offered = HTTPRequestHandler.offeredProtocols(head).contains { $0 == HTTPRequestHandler.webSocketProtocol }
                let answer = HTTPHeaders(offered ? [("Sec-WebSocket-Protocol", HTTPRequestHandler.webSocketProtocol)] : [])
                return channel.pipeline.removeHandler(name: Self.gateName).map { answer }.recover { _ in answer }
            },
            upgradePipelineHandler: { [self] channel, head in
                channel.eventLoop.makeCompletedFuture {
                    // Fragments are joined into one message up to the same size as a body.
                    try channel.pipeline.syncOperations.addHandler(
                        NIOWebSocketFrameAggregator(
                            minNonFinalFragmentSize: 1, maxAccumulatedFrameCount: 1024, maxAccumulatedFrameSize: self.settings.maxBodyBytes)
                    )
                    let service: WebSocketHandler.Service = Self.path(of: head) == "/jsonrpc" ? .aria2 : .dld
                    try channel.pipeline.syncOperations.addHandler(WebSocketHandler(listener: self, service: service))
                }
            })
        var limits = NIOHTTPDecoderLimitConfiguration()
        limits.maxHeaderListSize = Self.maxHeaderBytes
        limits.maxHeaderFieldSize = Self.maxHeaderBytes
        limits.maxHeaderFieldCount = 100
        try sync.configureHTTPServerPipeline(
            withPipeliningAssistance: true,
            withServerUpgrade: (
                upgraders: [upgrader],
                completionHandler: { context in
                    context.pipeline.removeHandler(name: Self.requestHandlerName, promise: nil)
                }
            ),
            withErrorHandling: true, withOutboundHeaderValidation: true, withEncoderConfiguration: .init(),
            withDecoderLimitConfiguration: limits)
        let upgradeHandler = try sync.handler(type: HTTPServerUpgradeHandler.self)
        try sync.addHandler(UpgradeGate(listener: self), name: Self.gateName, position: .before(upgradeHandler))
        try sync.addHandler(HTTPRequestHandler(listener: self), name: Self.requestHandlerName)
    }

    static let requestHandlerName = "dld-http"
    static let gateName = "dld-upgrade-gate"
    /// A request's head at most, as NIO's decoder counts it (the request target and the header
    /// names and values; docs/protocol.md): far more than a browser sends.
    static let maxHeaderBytes = 32 << 10

    /// A request's path, without its query.
    static func path(of head: HTTPRequestHead) -> Substring {
        head.uri.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false).first ?? ""
    }

    /// Whether a request may become a WebSocket: /ws (with the token) or aria2's /jsonrpc (whose
    /// calls carry the secret), for this listener, from no other origin.
    func admitsUpgrade(_ head: HTTPRequestHead) -> Bool {
        let path = Self.path(of: head)
        guard path == "/ws" || path == "/jsonrpc", let host = head.headers.first(name: "host"), settings.policy.allows(host: host)
        else { return false }
        if let origin = head.headers.first(name: "origin"), !settings.policy.allows(origin: origin, host: host) { return false }
        if path == "/jsonrpc" { return true }
        guard !settings.aria2Only else { return false }
        return HTTPRequestHandler.credential(head, token: settings.token) == .valid
    }

    private func writeURLFile() throws {
        let temporary = urlFile + ".new"
        unlink(temporary)
        let fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw DaemonError("cannot write \(temporary): \(String(cString: strerror(errno)))") }
        let line = url + "\n"
        _ = line.withCString { Glibc.write(fd, $0, strlen($0)) }
        Glibc.close(fd)
        guard rename(temporary, urlFile) == 0 else { throw DaemonError("cannot write \(urlFile): \(String(cString: strerror(errno)))") }
    }

    /// Stops listening and closes every connection (event streams included).
    public func close() {
        companion.withLock { $0 }?.close()
        if !settings.aria2Only { unlink(urlFile) }
        server.withLock { $0?.close(promise: nil) }
        for channel in children.withLock({ Array($0.values) }) { channel.close(promise: nil) }
    }
}

/// Lets only admitted requests reach the WebSocket upgrader: NIO's upgrader answers a refusal
/// with an error and no reply, so a request that may not upgrade loses its `Upgrade` header
/// here and goes on to `HTTPRequestHandler` as a plain request, which answers it with the
/// reason (401, 403, 421), wrong tokens slowed down as anywhere else.
private final class UpgradeGate: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias InboundOut = HTTPServerRequestPart

    let listener: HTTPListener

    init(listener: HTTPListener) { self.listener = listener }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if case .head(var head) = unwrapInboundIn(data), head.headers.contains(name: "upgrade"), !listener.admitsUpgrade(head) {
            head.headers.remove(name: "upgrade")
            context.fireChannelRead(wrapInboundOut(.head(head)))
            return
        }
        context.fireChannelRead(data)
    }
}

/// A connection beyond the limit: one 503 and the end, whatever it sent.
private final class Refuser: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private var refused = false

    // The handler may be added before or after the connection becomes active.
    func handlerAdded(context: ChannelHandlerContext) {
        if context.channel.isActive { refuse(context) }
    }

    func channelActive(context: ChannelHandlerContext) {
        refuse(context)
    }

    private func refuse(_ context: ChannelHandlerContext) {
        guard !refused else { return }
        refused = true
        let text =
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 21\r\nConnection: close\r\n\r\ntoo many connections\n"
        let channel = context.channel
        context.writeAndFlush(wrapOutboundOut(ByteBuffer(string: text))).whenComplete { _ in channel.close(promise: nil) }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {}
}
