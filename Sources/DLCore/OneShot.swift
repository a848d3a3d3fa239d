import Synchronization

/// A value handed over once, to one waiter, whether the value comes before the wait or after.
/// For racing outcomes (an answer against a time-out or a closed connection): the first
/// `resume` wins, later ones are dropped, and the waiter is never resumed twice.
public final class OneShot<T: Sendable>: Sendable {
    private enum State {
        case empty
        case waiting(CheckedContinuation<T, Never>)
        case done(T)
        case resumed
    }

    private let state = Mutex(State.empty)

    public init() {}

    /// The value of the first `resume`. Called once.
    public func wait() async -> T {
        await withCheckedContinuation { continuation in
            let early = state.withLock { state -> T? in
                guard case .done(let value) = state else {
                    state = .waiting(continuation)
                    return nil
                }
                state = .resumed
                return value
            }
            if let early { continuation.resume(returning: early) }
        }
    }

    /// Hands `value` over, unless a value was handed over already.
    public func resume(_ value: T) {
        let waiting = state.withLock { state -> CheckedContinuation<T, Never>? in
            switch state {
            case .empty:
                state = .done(value)
                return nil
            case .waiting(let continuation):
                state = .resumed
                return continuation
            case .done, .resumed:
                return nil
            }
        }
        waiting?.resume(returning: value)
    }
}
