import Foundation
import Synchronization

/// The continuations of `changes()` streams, finished at `close`.
public final class ChangeStreams: Sendable {
    private let state = Mutex<(open: Bool, streams: [AsyncStream<Void>.Continuation])>((true, []))

    public init() {}

    /// Keeps `continuation`; false when the store is closed already.
    public func add(_ continuation: AsyncStream<Void>.Continuation) -> Bool {
        state.withLock { state in
            guard state.open else { return false }
            state.streams.append(continuation)
            return true
        }
    }

    /// Tells every stream that something changed.
    public func signal() {
        for continuation in state.withLock({ $0.streams }) { continuation.yield() }
    }

    public func finish() {
        let streams = state.withLock { state -> [AsyncStream<Void>.Continuation] in
            state.open = false
            defer { state.streams = [] }
            return state.streams
        }
        for continuation in streams { continuation.finish() }
    }
}
