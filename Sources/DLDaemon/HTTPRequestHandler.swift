import DLCore
import DLRPC
import Foundation
import Logging
import NIOCore
import NIOHTTP1

/// One HTTP connection: collects each request (its body up to the socket's line limit), checks
/// Host, Origin and the token, and answers. `POST /rpc` goes to the socket's dispatcher.
final class HTTPRequestHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    static let cookieName = "dld_token"

    let listener: HTTPListener
    private var head: HTTPRequestHead?
    private var body = ByteBuffer()
    /// The request was answered before its end (too large): the rest is dropped.
    private var discarding = false
    /// A whole request must arrive within the read timeout from its head (a slow drip of
    /// bytes would otherwise hold a connection forever).
    private var deadline: Scheduled<Void>?
    /// Whether the client keeps the connection for another request.
    private var keepAlive = true
    /// A request is being answered (a `get` may wait minutes for its download): the client is
    /// waiting for us, not idle.
    private var answering = false
    /// The request's `Origin` when `http_origins` names it: its answer carries CORS headers.
    private var corsOrigin: String?

    init(listener: HTTPListener) { self.listener = listener }

    private var settings: HTTPListener.Settings { listener.settings }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let requestHead):
            head = requestHead
            corsOrigin = nil
            keepAlive = requestHead.isKeepAlive
            body.clear()
            discarding = false
            let channel = context.channel
            deadline = context.eventLoop.scheduleTask(in: settings.readTimeout) { channel.close(promise: nil) }
            if let length = requestHead.headers.first(name: "content-length").flatMap(Int.init), length > settings.maxBodyBytes {
                tooLarge(context)
            }
        case .body(var part):
            guard !discarding else { return }
            guard body.readableBytes + part.readableBytes <= settings.maxBodyBytes else { return tooLarge(context) }
            body.writeBuffer(&part)
        case .end:
            deadline?.cancel()
            deadline = nil
            if discarding { return context.close(promise: nil) }
            guard let head else { return }
            self.head = nil
            route(context, head)
        }
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let idle = event as? IdleStateHandler.IdleStateEvent, idle == .read {
            if !answering { context.close(promise: nil) }
            return
        }
        context.fireUserInboundEventTriggered(event)
    }

    func channelInactive(context: ChannelHandlerContext) {
        deadline?.cancel()
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        listener.logger.debug("HTTP connection ended with an error", metadata: ["error": "\(error)"])
        context.close(promise: nil)
    }

    /// Answered at once, then only our side is closed: the client may still be sending, and a
    /// full close with its bytes unread would reset the connection and lose the answer. The
    /// rest is read and dropped until the request ends or its deadline closes the connection.
    private func tooLarge(_ context: ChannelHandlerContext) {
        discarding = true
        keepAlive = false
        respond(
            context, .payloadTooLarge, ByteBuffer(string: "request body longer than \(settings.maxBodyBytes) bytes\n"),
            type: "text/plain; charset=utf-8", keepAlive: false, closingOutputOnly: true)
    }

    private func route(_ context: ChannelHandlerContext, _ head: HTTPRequestHead) {
        let path = head.uri.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false).first.map(String.init) ?? ""
        // DNS rebinding: a page of another site whose name now points here names that site.
        guard let host = head.headers.first(name: "host") else {
            return respond(context, .badRequest, "a Host header is required\n", close: true)
        }
        guard settings.policy.allows(host: host) else {
            listener.logger.warning("HTTP request for another host refused", metadata: ["host": "\(host.prefix(100))"])
            return respond(context, .misdirectedRequest, "this listener does not serve \(host.prefix(100)); see http_hosts\n", close: true)
        }
        // Cross-site requests: a browser names the page's origin on a POST or an upgrade (whose
        // `Upgrade` header `UpgradeGate` removed if it was refused; its key stays).
        let upgrade = path == "/ws" || head.headers.contains(name: "sec-websocket-key")
        if head.method == .POST || upgrade, let origin = head.headers.first(name: "origin"),
            !settings.policy.allows(origin: origin, host: host)
        {
            listener.logger.warning("HTTP request from another origin refused", metadata: ["origin": "\(origin.prefix(100))"])
            return respond(context, .forbidden, "requests from another origin are refused\n", close: true)
        }
        corsOrigin = settings.policy.corsOrigin(head.headers.first(name: "origin"))
        // A preflight carries no credentials: answered for the origins of http_origins only, on
        // the paths they may call. Others go on, and are refused as any request without a token.
        if head.method == .OPTIONS, corsOrigin != nil, ["/rpc", "/jsonrpc", "/ws"].contains(path) {
            return respond(
                context, .noContent, ByteBuffer(),
                extra: [
                    ("Access-Control-Allow-Methods", "GET, POST, OPTIONS"),
                    ("Access-Control-Allow-Headers", "Authorization, Content-Type"), ("Access-Control-Max-Age", "600"),
                ], keepAlive: keepAlive)
        }
        // aria2's calls carry their secret in their params (`token:SECRET`), not in a header.
        if path == "/jsonrpc" { return aria2(context, head) }
        if settings.aria2Only { return respond(context, .notFound, "this listener serves aria2's JSON-RPC on /jsonrpc only\n") }
        if path == "/login", head.method == .GET { return login(context, head) }
        switch Self.credential(head, token: settings.token) {
        case .none:
            return respond(
                context, .unauthorized,
                "a token is required: Authorization: Bearer <token> (<state_dir>/http-token), or the cookie of /login?token=<token>\n",
                extra: [("WWW-Authenticate", "Bearer")])
        case .wrong:
            return refuseSlowly(context, what: path)
        case .valid:
            break
        }
        switch (head.method, path) {
        case (.POST, "/rpc"):
            let type = head.headers.first(name: "content-type")?.split(separator: ";").first?.trimmingCharacters(in: .whitespaces)
            guard type?.lowercased() == "application/json" else {
                return respond(context, .unsupportedMediaType, "Content-Type must be application/json\n")
            }
            rpc(context, head)
        case (_, "/rpc"):
            respond(context, .methodNotAllowed, "POST a JSON-RPC request to /rpc\n", extra: [("Allow", "POST")])
        case (.GET, "/ws"):
            respond(context, .upgradeRequired, "/ws is a WebSocket\n", extra: [("Upgrade", "websocket")])
        case (.GET, "/metrics"):
            guard let metrics = listener.metrics else { return respond(context, .notFound, "no metrics here\n") }
            later(context, head, type: "text/plain; version=0.0.4; charset=utf-8") { ByteBuffer(string: await metrics.render()) }
        case (.GET, "/openrpc.json"):
            respond(context, .ok, ByteBuffer(bytes: OpenRPC.document.serialized()), type: "application/json", keepAlive: keepAlive)
        case (.GET, let path) where Dashboard.files[path] != nil:
            guard let file = Dashboard.files[path] else { return respond(context, .notFound, "not found\n") }
            respond(context, .ok, ByteBuffer(bytes: file.bytes), type: file.contentType, extra: Dashboard.headers, keepAlive: keepAlive)
        default:
            respond(context, .notFound, "not found\n")
        }
    }

    enum Credential { case none, wrong, valid }

    /// `Authorization: Bearer …`; on a WebSocket upgrade, the subprotocol `dld.token.<token>`
    /// (a browser's WebSocket can send no header of its own, docs/protocol.md); else the cookie
    /// `/login` sets.
    static func credential(_ head: HTTPRequestHead, token: String) -> Credential {
        if let authorization = head.headers.first(name: "authorization") {
            let parts = authorization.split(separator: " ", maxSplits: 1)
            guard parts.count == 2, parts[0].lowercased() == "bearer" else { return .wrong }
            return HTTPToken.matches(parts[1].drop { $0 == " " }, token) ? .valid : .wrong
        }
        if head.headers.contains(name: "sec-websocket-key"),
            let offered = offeredProtocols(head).first(where: { $0.hasPrefix(tokenProtocolPrefix) })
        {
            return HTTPToken.matches(offered.dropFirst(tokenProtocolPrefix.count), token) ? .valid : .wrong
        }
        var sawCookie = false
        for header in head.headers[canonicalForm: "cookie"] {
            for pair in header.split(separator: ";") {
                let trimmed = pair.drop { $0 == " " }
                guard trimmed.hasPrefix(Self.cookieName + "=") else { continue }
                sawCookie = true
                if HTTPToken.matches(trimmed.dropFirst(Self.cookieName.count + 1), token) { return .valid }
            }
        }
        return sawCookie ? .wrong : .none
    }

    /// The subprotocol that carries the token, and the one dld answers with when offered (a
    /// browser fails an upgrade whose answer names none of the subprotocols it offered).
    static let tokenProtocolPrefix = "dld.token."
    static let webSocketProtocol = "dld"

    /// The subprotocols a WebSocket upgrade offers (`Sec-WebSocket-Protocol`, comma-separated).
    static func offeredProtocols(_ head: HTTPRequestHead) -> [Substring] {
        head.headers[canonicalForm: "sec-websocket-protocol"]
    }

    /// `GET /login?token=…`: sets the cookie and sends the browser to `/`.
    private func login(_ context: ChannelHandlerContext, _ head: HTTPRequestHead) {
        let query = URLComponents(string: head.uri)?.queryItems ?? []
        guard let given = query.first(where: { $0.name == "token" })?.value, HTTPToken.matches(given[...], settings.token) else {
            return refuseSlowly(context, what: "/login")
        }
        var cookie = "\(Self.cookieName)=\(settings.token); HttpOnly; SameSite=Strict; Path=/"
        if settings.policy.tls { cookie += "; Secure" }
        respond(context, .seeOther, "logged in\n", extra: [("Set-Cookie", cookie), ("Location", "/")])
    }

    /// A wrong token: logged, and answered after a delay that grows with the failures in a
    /// row, scheduled on this connection's loop (never a sleep that would hold the others).
    private func refuseSlowly(_ context: ChannelHandlerContext, what: String) {
        let (delay, failures) = listener.throttle.failed()
        listener.logger.warning(
            "HTTP request with a wrong token refused",
            metadata: [
                "path": "\(what.prefix(100))", "peer": "\(context.channel.remoteAddress.map { "\($0)" } ?? "?")",
                "failures_in_a_row": "\(failures)",
            ])
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        context.eventLoop.scheduleTask(in: delay) {
            let (handler, context) = bound.value
            handler.respond(context, .unauthorized, "wrong token\n", extra: [("WWW-Authenticate", "Bearer")], close: true)
        }
    }

    /// Answers with what `body` makes, off the event loop (a scrape reads the job table).
    private func later(
        _ context: ChannelHandlerContext, _ head: HTTPRequestHead, type: String, _ body: @escaping @Sendable () async -> ByteBuffer
    ) {
        answering = true
        let promise = context.eventLoop.makePromise(of: ByteBuffer.self)
        promise.completeWithTask { await body() }
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        promise.futureResult.whenSuccess { buffer in
            let (handler, context) = bound.value
            handler.answering = false
            handler.respond(context, .ok, buffer, type: type, keepAlive: head.isKeepAlive)
        }
    }

    /// The body as one request line of the socket; the reply as the response body. A
    /// `subscribe` needs a connection that stays open: it is refused here, pointing to /ws.
    private func rpc(_ context: ChannelHandlerContext, _ head: HTTPRequestHead) {
        let line = Data(body.readableBytesView)
        body.clear()
        let dispatcher = listener.dispatcher
        answering = true
        let promise = context.eventLoop.makePromise(of: Dispatcher.Reply.self)
        promise.completeWithTask { await dispatcher.handle(line: line) }
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        let onShutdown = listener.onShutdown
        promise.futureResult.whenSuccess { reply in
            let (handler, context) = bound.value
            handler.answering = false
            var data = reply.data
            if let subscription = reply.subscription {
                let error = RPCResponse(
                    id: subscription.id,
                    result: .failure(
                        RPCError(DLError(.invalidRequest, "subscribe needs a connection that stays open: use the WebSocket /ws"))))
                data = error.json.serialized()
            }
            if let data {
                handler.respond(
                    context, .ok, ByteBuffer(bytes: data), type: "application/json", keepAlive: head.isKeepAlive && !reply.shutdown)
            } else {
                // Only notifications: nothing to answer, as on the socket.
                handler.respond(context, .noContent, ByteBuffer(), keepAlive: head.isKeepAlive && !reply.shutdown)
            }
            if reply.shutdown { onShutdown() }
        }
    }

    /// aria2's JSON-RPC: a POST's body, or a GET's `method`, `id` and base64 `params`; the
    /// answer to a call with a wrong secret waits as a wrong token's does.
    private func aria2(_ context: ChannelHandlerContext, _ head: HTTPRequestHead) {
        let aria2 = listener.aria2
        let work: @Sendable () async -> Aria2RPC.Reply
        switch head.method {
        case .POST:
            let body = Data(self.body.readableBytesView)
            self.body.clear()
            work = { await aria2.handle(body: body) }
        case .GET:
            let items = URLComponents(string: head.uri)?.queryItems ?? []
            work = { await aria2.handle(query: items) }
        default:
            return respond(context, .methodNotAllowed, "POST aria2's JSON-RPC to /jsonrpc\n", extra: [("Allow", "GET, POST")])
        }
        answering = true
        let promise = context.eventLoop.makePromise(of: Aria2RPC.Reply.self)
        promise.completeWithTask { await work() }
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        let listener = listener
        promise.futureResult.whenSuccess { reply in
            let answer: @Sendable () -> Void = {
                let (handler, context) = bound.value
                handler.answering = false
                handler.respond(
                    context, .ok, ByteBuffer(bytes: reply.data), type: "application/json", keepAlive: head.isKeepAlive && !reply.shutdown)
                if reply.shutdown { listener.onShutdown() }
            }
            guard reply.unauthorized else { return answer() }
            let (delay, failures) = listener.throttle.failed()
            listener.logger.warning(
                "aria2 call with a wrong secret refused",
                metadata: [
                    "path": "/jsonrpc", "peer": "\(bound.value.1.channel.remoteAddress.map { "\($0)" } ?? "?")",
                    "failures_in_a_row": "\(failures)",
                ])
            bound.value.1.eventLoop.scheduleTask(in: delay) { answer() }
        }
    }

    private func respond(
        _ context: ChannelHandlerContext, _ status: HTTPResponseStatus, _ text: String, extra: [(String, String)] = [], close: Bool = false
    ) {
        respond(context, status, ByteBuffer(string: text), type: "text/plain; charset=utf-8", extra: extra, keepAlive: !close && keepAlive)
    }

    private func respond(
        _ context: ChannelHandlerContext, _ status: HTTPResponseStatus, _ body: ByteBuffer, type: String? = nil,
        extra: [(String, String)] = [], keepAlive: Bool, closingOutputOnly: Bool = false
    ) {
        guard context.channel.isActive else { return }
        var headers = HTTPHeaders()
        if let corsOrigin {
            // No Access-Control-Allow-Credentials: the cookie of /login stays the dashboard's.
            headers.add(name: "Access-Control-Allow-Origin", value: corsOrigin)
            headers.add(name: "Vary", value: "Origin")
        }
        if let type { headers.add(name: "Content-Type", value: type) }
        if status != .noContent { headers.add(name: "Content-Length", value: "\(body.readableBytes)") }
        // Replies hold job data and the token's cookie: never cached, never sniffed.
        headers.add(name: "Cache-Control", value: "no-store")
        headers.add(name: "X-Content-Type-Options", value: "nosniff")
        for (name, value) in extra { headers.add(name: name, value: value) }
        if !keepAlive { headers.add(name: "Connection", value: "close") }
        context.write(wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: status, headers: headers))), promise: nil)
        if status != .noContent { context.write(wrapOutboundOut(.body(.byteBuffer(body))), promise: nil) }
        let channel = context.channel
        context.writeAndFlush(wrapOutboundOut(.end(nil))).whenComplete { _ in
            if !keepAlive { channel.close(mode: closingOutputOnly ? .output : .all, promise: nil) }
        }
    }
}
