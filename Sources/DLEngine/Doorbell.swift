import Synchronization

/// What a loop of the daemon sleeps on while it has no work: whoever makes work for it rings,
/// from any thread or actor, and the loop wakes. An idle daemon then has nothing that wakes it
/// (docs/architecture.md, "Processes and tasks"); a loop that polled instead woke the process
/// several times a second for nothing.
///
/// A ring is remembered until the next `wait`, so a ring that comes between the loop's look at
/// its work and its wait is not lost; several rings meanwhile count as one. One loop waits on a
/// bell: the remembered ring goes to whichever waits first. Every wait also ends when its task
/// is cancelled, so a loop of a service ends when the service group shuts it down. A wait may
/// end early (a ring meant for work the loop already did): loops look at their work again
/// after each wait.
public final class Doorbell: Sendable {
    private struct State {
        var rung = false
        var waiters: [UInt64: CheckedContinuation<Void, Never>] = [:]
        var nextWaiter: UInt64 = 0
    }

    private let state = Mutex(State())

    public init() {}

    public func ring() {
        let waiters = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            guard !state.waiters.isEmpty else {
                state.rung = true
                return []
            }
            defer { state.waiters = [:] }
            return Array(state.waiters.values)
        }
        for waiter in waiters { waiter.resume() }
    }

    /// Returns once the bell rings (at once if it rang since the last wait), or the task is
    /// cancelled.
    public func wait() async {
        let id = state.withLock { state -> UInt64 in
            state.nextWaiter += 1
            return state.nextWaiter
        }
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                // The cancellation flag is set before the handler runs, and both look under the
                // lock: either this sees it, or the handler finds the waiter.
                let now = state.withLock { state -> Bool in
                    if state.rung || Task.isCancelled {
                        state.rung = false
                        return true
                    }
                    state.waiters[id] = continuation
                    return false
                }
                if now { continuation.resume() }
            }
        } onCancel: {
            state.withLock { $0.waiters.removeValue(forKey: id) }?.resume()
        }
    }

    /// Like `wait`, but also returns at `deadline`. True when it was the bell (or a
    /// cancellation), false when the deadline came first.
    public func wait(until deadline: ContinuousClock.Instant) async -> Bool {
        await withTaskGroup(of: Bool.self) { group in
            group.addTask {
                await self.wait()
                return true
            }
            group.addTask {
                try? await Task.sleep(until: deadline, clock: .continuous)
                return Task.isCancelled
            }
            let first = await group.next() ?? true
            group.cancelAll()
            return first
        }
    }
}
