import DLCore
import DLRPC
import Foundation
import NIOCore
import NIOWebSocket

/// `/jsonrpc` after a WebSocket upgrade, as aria2 serves it: each text message is a request or
/// a batch of aria2's JSON-RPC, answered in order; and aria2's notifications
/// (`aria2.onDownloadStart`, …) of dld's own state events, pushed between the answers. The
/// notifications start after the connection's first call with the secret: the upgrade
/// itself carries none (aria2's clients put it in each call's params).
extension WebSocketHandler {
    /// Answers one message; an answer to a wrong secret waits as long as a wrong token's on
    /// HTTP.
    func answerAria2(_ context: ChannelHandlerContext, body: Data) {
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
        guard pushing == nil else { return }
        let channel = context.channel
        let hub = listener.hub
        // Subscribed now, so that nothing after the call that asked is missed.
        let subscription = hub.subscribe(EventHub.Filter())
        let live = subscription.stream
        let token = subscription.token
        pushing = Task { await WebSocketHandler.forwardAria2(live, token: token, hub: hub, to: channel) }
    }

    private static func forwardAria2(_ live: EventHub.Stream, token: UInt64, hub: EventHub, to channel: any Channel) async {
        defer { hub.unsubscribe(token) }
        for await item in live {
            guard case .stored(let events) = item else { continue }
            let messages = events.compactMap { event -> Data? in
                guard event.kind == .jobState, let id = event.jobID, let method = aria2Notification(state: event.state) else { return nil }
                let message: JSONValue = ["jsonrpc": "2.0", "method": .string(method), "params": [["gid": .string(Aria2GID.gid(id))]]]
                return message.serialized()
            }
            do {
                try await writeFrames(messages, to: channel)
            } catch {
                return
            }
        }
        // Cut off for falling behind, as a subscriber of /ws is.
        if hub.didOverflow(token) { closeForFallingBehind(channel) }
    }

    /// aria2's notification of a job that entered `state`; nil for states aria2 does not tell.
    static func aria2Notification(state: String) -> String? {
        switch state {
        case "running": "aria2.onDownloadStart"
        case "paused": "aria2.onDownloadPause"
        case "canceled": "aria2.onDownloadStop"
        case "completed": "aria2.onDownloadComplete"
        case "failed": "aria2.onDownloadError"
        default: nil
        }
    }
}
