import DLCore
import Foundation
import NIOCore
import Synchronization

/// The limits of every transfer of the daemon: `SpeedLimits` (pure) behind a lock, and the
/// waits it asks for. A transfer calls `take` once per chunk it received, before it reads the
/// next (every segment of a job calls it too): while it sleeps it does not read, so the HTTP
/// body's backpressure holds the server back and memory stays flat.
///
/// A lock, not an actor: with no limit at all, `take` is one relaxed atomic load per chunk.
public final class SpeedLimiter: Sendable {
    private struct State {
        var limits = SpeedLimits()
        /// Bumped by every change: a transfer that sleeps on an older one goes on at once (a
        /// limit raised or lifted applies now, not after a wait computed at the old rate).
        var generation = 0
        /// Bytes let through, by job while it has a transfer, and in all (for tests and benches).
        var passed: Int64 = 0
    }

    private let state = Mutex(State())
    /// `!limits.isUnlimited`, readable without the lock.
    private let limited = Atomic<Bool>(false)
    /// The largest socket read while a limit is set (0: none), see `LimitedReads`.
    private let cap = Atomic<Int>(0)
    private let origin = ContinuousClock.now
    /// Sleeps are cut into slices of at most this, so that a change wakes them.
    static let slice: Duration = .milliseconds(200)

    public init() {}

    private func seconds() -> Double { (ContinuousClock.now - origin).seconds }

    /// Waits until `bytes` of job `job` may go on under the limits. Throws only when the task is
    /// cancelled (pause, cancel, shutdown), so a stopped transfer does not wait out its debt.
    public func take(_ bytes: Int, job: JobID) async throws {
        guard limited.load(ordering: .relaxed) else { return }
        let (wait, generation) = state.withLock { s in
            s.passed += Int64(bytes)
            return (s.limits.take(Int64(bytes), job: job, now: seconds()), s.generation)
        }
        guard wait > 0 else { return }
        let until = ContinuousClock.now + .milliseconds(Int64((wait * 1000).rounded(.up)))
        while ContinuousClock.now < until {
            try await Task.sleep(for: min(Self.slice, until - ContinuousClock.now))
            if state.withLock({ $0.generation }) != generation { return }
        }
    }

    /// The shared rate in bytes per second; nil or 0: none.
    public func setGlobal(_ rate: Int64?) {
        change { $0.setGlobal(rate, now: $1) }
    }

    /// A job's own rate; nil or 0: none. Set while the job has a transfer, removed after.
    public func setJob(_ id: JobID, _ rate: Int64?) {
        change { $0.setJob(id, rate, now: $1) }
    }

    private func change(_ body: (inout SpeedLimits, Double) -> Void) {
        state.withLock { s in
            let before = s.limits
            body(&s.limits, seconds())
            if s.limits != before { s.generation += 1 }
            limited.store(!s.limits.isUnlimited, ordering: .relaxed)
            let rates = (s.limits.global.map { [$0.rate] } ?? []) + s.limits.jobs.values.map(\.rate)
            cap.store(rates.min().map { Self.readCap(forRate: $0) } ?? 0, ordering: .relaxed)
        }
    }

    /// A twentieth of a second of `rate`, from 4 KiB to 1 MiB.
    static func readCap(forRate rate: Double) -> Int {
        Int(min(max(rate / 20, 4096), 1_048_576))
    }

    /// The largest socket read while some limit is set; 0: no limit, reads as large as they come.
    var readCap: Int { cap.load(ordering: .relaxed) }

    /// The global rate in force (0: none) and the jobs' own, for `status` and tests.
    public var globalRate: Int64 {
        state.withLock { s in s.limits.global.map { Int64($0.rate) } ?? 0 }
    }

    public func jobRate(_ id: JobID) -> Int64? {
        state.withLock { s in s.limits.jobs[id].map { Int64($0.rate) } }
    }

    /// Bytes counted by `take` while some limit was set.
    public var bytesLimited: Int64 { state.withLock { $0.passed } }
}

/// Socket reads no larger than a twentieth of a second at the lowest limit in force, so that a
/// limited transfer takes its bytes (and TCP opens its window to the server) in small steps,
/// not in bursts of a megabyte followed by a second of silence. Without limits it is the
/// adaptive allocator it wraps, pooled buffers and all. While capped it allocates each read
/// (it reports that the size may grow, so a pooled buffer of the old size is not reused):
/// that costs little at rates that are limited.
struct LimitedReads: RecvByteBufferAllocator {
    var adaptive: AdaptiveRecvByteBufferAllocator
    let limiter: SpeedLimiter

    func buffer(allocator: ByteBufferAllocator) -> ByteBuffer {
        let cap = limiter.readCap
        guard cap > 0 else { return adaptive.buffer(allocator: allocator) }
        return allocator.buffer(capacity: min(cap, adaptive.nextBufferSize() ?? cap))
    }

    func nextBufferSize() -> Int? {
        limiter.readCap > 0 ? nil : adaptive.nextBufferSize()
    }

    mutating func record(actualReadBytes: Int) -> Bool {
        let mayGrow = adaptive.record(actualReadBytes: actualReadBytes)
        return limiter.readCap > 0 ? true : mayGrow
    }
}
