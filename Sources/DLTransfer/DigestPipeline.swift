import DLCore
import Dispatch
import Synchronization

/// Feeds an attempt's digests on a thread of their own, in the order the bytes joined the
/// file's contiguous prefix, so that hashing overlaps receiving and writing instead of
/// following them on the same thread.
///
/// A profile of one stream of 1 GiB from nginx put most of dld's samples in SHA-256, all on
/// the thread that also copied the bytes into the page cache: one thread did both in turn
/// (docs/benchmarks.md, "What was tried": the digest on its own thread). The bound is that
/// measurement's too: 8 MiB pushed the peak RSS of four ranges past 64 MiB, 2 MiB was slower.
///
/// What is queued is bounded: a worker that finds more than `highWater` bytes waiting waits
/// (`waitForRoom`) until the hasher is down to `lowWater`. Every exit of an attempt's stream
/// `drain`s the pipeline first, so no work runs after the digests are reset, finalized or the
/// file is closed.
final class DigestPipeline: Sendable {
    /// Files with less than this left to fetch are hashed inline (`StreamRun.hash`).
    static let worthFrom: Int64 = 4 << 20
    static let highWater = 4 << 20
    static let lowWater = 1 << 20

    private struct State {
        var queuedBytes = 0
        var failure: TransferFailure?
        var roomWaiters: [CheckedContinuation<Void, Never>] = []
    }

    private let queue = DispatchQueue(label: "dld.digests")
    private let state = Mutex(State())

    /// Runs `work` after everything submitted before it; `bytes` is what it holds in memory.
    /// After a failure the rest is skipped (the attempt fails with it at `drain`).
    func submit(bytes: Int, _ work: @escaping @Sendable () throws(TransferFailure) -> Void) {
        state.withLock { $0.queuedBytes += bytes }
        queue.async { [self] in
            let failed = state.withLock { $0.failure != nil }
            var failure: TransferFailure? = nil
            if !failed {
                do throws(TransferFailure) { try work() } catch { failure = error }
            }
            let waiters = state.withLock { state -> [CheckedContinuation<Void, Never>] in
                state.queuedBytes -= bytes
                if let failure, state.failure == nil { state.failure = failure }
                guard state.queuedBytes <= Self.lowWater || state.failure != nil else { return [] }
                defer { state.roomWaiters = [] }
                return state.roomWaiters
            }
            for waiter in waiters { waiter.resume() }
        }
    }

    /// Returns when the queue holds at most `highWater` bytes.
    func waitForRoom() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let ready = state.withLock { state -> Bool in
                guard state.queuedBytes > Self.highWater, state.failure == nil else { return true }
                state.roomWaiters.append(continuation)
                return false
            }
            if ready { continuation.resume() }
        }
    }

    /// Waits for everything submitted so far; throws the first failure of the queued work.
    func drain() async throws(TransferFailure) {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            queue.async { continuation.resume() }
        }
        if let failure = state.withLock({ $0.failure }) { throw failure }
    }
}
