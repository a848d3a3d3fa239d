import DLCore
import DLRPC
import Foundation
import NIOCore
import NIOHTTP1
import NIOWebSocket

/// A WebSocket of the HTTP listener after its upgrade. The frames are handled here for both
/// services: text messages answered one at a time in order (at most `maxPending` waiting),
/// binary ones refused, pings answered, a quiet connection pinged and then closed. What a
/// message means is the service's:
/// - `GET /ws`: each text message is a request line of the socket, answered by the socket's
///   dispatcher; `subscribe` turns the connection into the socket's event stream
///   (`Dispatcher.stream`), one notification per text message.
/// - `/jsonrpc`: aria2's JSON-RPC (WebSocketHandler+Aria2.swift).
final class WebSocketHandler: ChannelInboundHandler {
    typealias InboundIn = WebSocketFrame
    typealias OutboundOut = WebSocketFrame

    enum Service { case dld, aria2 }

    let listener: HTTPListener
    let service: Service
    /// Messages waiting for the one being answered (a client may send several at once).
    private var pending: [Data] = []
    /// A message is being answered.
    var busy = false
    /// `/ws` after `subscribe`: the connection only streams, as on the socket.
    private var subscribed = false
    /// What pushes to the client: the event stream of `/ws`, aria2's notifications.
    var pushing: Task<Void, Never>?
    /// A ping was sent for a quiet connection and nothing came back yet.
    private var awaitingPong = false

    /// Messages a client may have waiting; more is flooding, and the connection is closed.
    static let maxPending = 64

    init(listener: HTTPListener, service: Service) {
        self.listener = listener
        self.service = service
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let frame = unwrapInboundIn(data)
        awaitingPong = false
        switch frame.opcode {
        case .text:
            guard !subscribed else { return }
            guard pending.count < Self.maxPending else { return close(context, .policyViolation) }
            pending.append(Data(frame.unmaskedData.readableBytesView))
            next(context)
        case .binary, .continuation:
            close(context, .unacceptableData)
        case .ping:
            var payload = frame.unmaskedData
            let pong = WebSocketFrame(
                fin: true, opcode: .pong, data: payload.readSlice(length: min(payload.readableBytes, 125)) ?? ByteBuffer())
            context.writeAndFlush(wrapOutboundOut(pong), promise: nil)
        case .connectionClose:
            close(context, .normalClosure)
        default:
            break
        }
    }

    /// Answers the next waiting message once the one before is answered.
    func next(_ context: ChannelHandlerContext) {
        guard !busy, !pending.isEmpty else { return }
        busy = true
        let message = pending.removeFirst()
        switch service {
        case .dld: answer(context, line: message)
        case .aria2: answerAria2(context, body: message)
        }
    }

    private func answer(_ context: ChannelHandlerContext, line: Data) {
        let dispatcher = listener.dispatcher
        let promise = context.eventLoop.makePromise(of: Dispatcher.Reply.self)
        promise.completeWithTask { await dispatcher.handle(line: line) }
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        let onShutdown = listener.onShutdown
        promise.futureResult.whenSuccess { reply in
            let (handler, context) = bound.value
            handler.busy = false
            if let data = reply.data { handler.send(context, data) }
            if reply.shutdown { onShutdown() }
            if let subscription = reply.subscription {
                handler.subscribe(context, subscription)
            } else {
                handler.next(context)
            }
        }
    }

    private func subscribe(_ context: ChannelHandlerContext, _ subscription: Dispatcher.Subscription) {
        subscribed = true
        pending.removeAll()
        let channel = context.channel
        let dispatcher = listener.dispatcher
        let hub = listener.hub
        pushing = Task { await WebSocketHandler.stream(subscription, of: dispatcher, from: hub, to: channel) }
    }

    /// Each message is written and waited for: a client that reads slowly holds the stream
    /// back until the hub cuts it off (events.overflow), as on the socket.
    private static func stream(
        _ subscription: Dispatcher.Subscription, of dispatcher: Dispatcher, from hub: EventHub, to channel: any Channel
    ) async {
        let overflowed: Bool
        do {
            overflowed = try await dispatcher.stream(subscription, from: hub) { messages in
                try await writeFrames(messages, to: channel)
            }
        } catch {
            // The connection went, or the table could not be read: the client resubscribes.
            channel.close(promise: nil)
            return
        }
        if overflowed { closeForFallingBehind(channel) }
    }

    /// Messages as text frames, flushed once; returns when the last is written.
    static func writeFrames(_ messages: [Data], to channel: any Channel) async throws {
        guard let last = messages.last else { return }
        for data in messages.dropLast() {
            channel.write(WebSocketFrame(fin: true, opcode: .text, data: ByteBuffer(bytes: data)), promise: nil)
        }
        try await channel.writeAndFlush(WebSocketFrame(fin: true, opcode: .text, data: ByteBuffer(bytes: last))).get()
    }

    /// A subscriber the hub cut off for falling behind: closed with 1008.
    static func closeForFallingBehind(_ channel: any Channel) {
        let close = WebSocketFrame(fin: true, opcode: .connectionClose, data: closeData(.policyViolation))
        channel.writeAndFlush(close).whenComplete { _ in channel.close(promise: nil) }
    }

    func send(_ context: ChannelHandlerContext, _ data: Data) {
        context.writeAndFlush(wrapOutboundOut(WebSocketFrame(fin: true, opcode: .text, data: ByteBuffer(bytes: data))), promise: nil)
    }

    /// A quiet connection is pinged; one that stays quiet for another read timeout is closed.
    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        guard let idle = event as? IdleStateHandler.IdleStateEvent, idle == .read else {
            return context.fireUserInboundEventTriggered(event)
        }
        if awaitingPong { return close(context, .goingAway) }
        awaitingPong = true
        context.writeAndFlush(wrapOutboundOut(WebSocketFrame(fin: true, opcode: .ping, data: ByteBuffer())), promise: nil)
    }

    func channelInactive(context: ChannelHandlerContext) {
        pushing?.cancel()
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        listener.logger.debug(
            "WebSocket ended with an error", metadata: ["error": "\(error)", "path": "\(service == .dld ? "/ws" : "/jsonrpc")"])
        context.close(promise: nil)
    }

    private func close(_ context: ChannelHandlerContext, _ code: WebSocketErrorCode) {
        let channel = context.channel
        let frame = WebSocketFrame(fin: true, opcode: .connectionClose, data: Self.closeData(code))
        context.writeAndFlush(wrapOutboundOut(frame)).whenComplete { _ in channel.close(promise: nil) }
    }

    private static func closeData(_ code: WebSocketErrorCode) -> ByteBuffer {
        var buffer = ByteBuffer()
        buffer.write(webSocketErrorCode: code)
        return buffer
    }
}
