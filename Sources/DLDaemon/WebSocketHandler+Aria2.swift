import DLCore
import DLRPC
import Foundation
import NIOCore
import NIOHTTP1
import NIOWebSocket

/// `/jsonrpc` after a WebSocket upgrade, as aria2 serves it: each text message is a request or
/// a batch of aria2's JSON-RPC, answered in order; and aria2's notifications
/// (`aria2.onDownloadStart`, …) of dld's own state events, pushed between the answers. The
/// notifications start after the connection's first call with the secret: the upgrade
/// itself carries none (aria2's clients put it in each call's params).
final class Aria2WebSocketHandler: ChannelInboundHandler {
    typealias InboundIn = WebSocketFrame
    typealias OutboundOut = WebSocketFrame

    let listener: HTTPListener
    private var pending: [Data] = []
    private var busy = false
    private var notifications: Task<Void, Never>?
    private var awaitingPong = false

    init(listener: HTTPListener) { self.listener = listener }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let frame = unwrapInboundIn(data)
        awaitingPong = false
        switch frame.opcode {
        case .text:
            guard pending.count < WebSocketHandler.maxPending else { return close(context, .policyViolation) }
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

    /// Answers the next waiting message once the one before is answered; an answer to a
    /// wrong secret waits as long as a wrong token's on HTTP.
    private func next(_ context: ChannelHandlerContext) {
        guard !busy, !pending.isEmpty else { return }
        busy = true
        let body = pending.removeFirst()
        let aria2 = listener.aria2
        let promise = context.eventLoop.makePromise(of: Aria2RPC.Reply.self)
        promise.completeWithTask { await aria2.handle(body: body) }
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        let listener = listener
        promise.futureResult.whenSuccess { reply in
            let answer: @Sendable () -> Void = {
                let (handler, context) = bound.value
                handler.busy = false
                handler.send(context, reply.data)
                if reply.shutdown { listener.onShutdown() }
                handler.next(context)
            }
            let (handler, context) = bound.value
            if reply.authorized { handler.notify(context) }
            guard reply.unauthorized else { return answer() }
            let (delay, failures) = listener.throttle.failed()
            listener.logger.warning(
                "aria2 call with a wrong secret refused", metadata: ["path": "/jsonrpc", "failures_in_a_row": "\(failures)"])
            context.eventLoop.scheduleTask(in: delay) { answer() }
        }
    }

    /// Starts the notifications once: live state events of jobs, in aria2's names.
    private func notify(_ context: ChannelHandlerContext) {
        guard notifications == nil else { return }
        let channel = context.channel
        let hub = listener.hub
        // Subscribed now, so that nothing after the call that asked is missed.
        let subscription = hub.subscribe(EventHub.Filter())
        let live = subscription.stream
        let token = subscription.token
        notifications = Task { await Aria2WebSocketHandler.forward(live, token: token, hub: hub, to: channel) }
    }

    private static func forward(_ live: AsyncStream<EventHub.Item>, token: UInt64, hub: EventHub, to channel: any Channel) async {
        defer { hub.unsubscribe(token) }
        for await item in live {
            guard case .stored(let event) = item, event.kind == .jobState, let id = event.jobID,
                let method = notification(state: event.state)
            else { continue }
            let message: JSONValue = ["jsonrpc": "2.0", "method": .string(method), "params": [["gid": .string(Aria2GID.gid(id))]]]
            let frame = WebSocketFrame(fin: true, opcode: .text, data: ByteBuffer(bytes: message.serialized()))
            do {
                try await channel.writeAndFlush(frame).get()
            } catch {
                return
            }
        }
        // Cut off for falling behind, as a subscriber of /ws is.
        if hub.didOverflow(token) { channel.close(promise: nil) }
    }

    /// aria2's notification of a job that entered `state`; nil for states aria2 does not tell.
    static func notification(state: String) -> String? {
        switch state {
        case "running": "aria2.onDownloadStart"
        case "paused": "aria2.onDownloadPause"
        case "canceled": "aria2.onDownloadStop"
        case "completed": "aria2.onDownloadComplete"
        case "failed": "aria2.onDownloadError"
        default: nil
        }
    }

    private func send(_ context: ChannelHandlerContext, _ data: Data) {
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
        notifications?.cancel()
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        listener.logger.debug("aria2 WebSocket ended with an error", metadata: ["error": "\(error)"])
        context.close(promise: nil)
    }

    private func close(_ context: ChannelHandlerContext, _ code: WebSocketErrorCode) {
        let channel = context.channel
        var buffer = ByteBuffer()
        buffer.write(webSocketErrorCode: code)
        let frame = WebSocketFrame(fin: true, opcode: .connectionClose, data: buffer)
        context.writeAndFlush(wrapOutboundOut(frame)).whenComplete { _ in channel.close(promise: nil) }
    }
}
