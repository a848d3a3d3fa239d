import DLCore
import Foundation
import Synchronization

/// Live counters of one transfer, written by the transfer on every chunk and read by status
/// calls. A lock, not an actor: the hot path must not hop executors per chunk.
public final class TransferProgress: Sendable {
    public struct Snapshot: Sendable, Equatable {
        public var received: Int64
        public var size: Int64?
        /// Bytes per second over the last window.
        public var speed: Double
        /// Why this transfer dropped its bytes and started over, if it did.
        public var startedOver: JobError? = nil
    }

    private struct State {
        var received: Int64
        var size: Int64?
        var speed: Double = 0
        var windowStart: ContinuousClock.Instant
        var windowBytes: Int64
        var startedOver: JobError?
        var connections = 1
        var hostConnections: [String: Int]?
        var waitedForConnection = false
    }

    /// Speed is measured over windows of this length.
    private static let window: Duration = .milliseconds(1000)
    private let state: Mutex<State>
    /// Where the bytes this transfer receives are added up with every other's (metrics).
    private let counter: ByteCounter?

    /// `received` is where the transfer resumes: only the bytes past it are added to `counter`.
    public init(received: Int64, size: Int64?, counter: ByteCounter? = nil) {
        state = Mutex(State(received: received, size: size, windowStart: .now, windowBytes: received))
        self.counter = counter
    }

    public func update(received: Int64, size: Int64?) {
        state.withLock { s in
            // A count that goes back started over: the bytes it receives again are counted again.
            if received > s.received { counter?.add(received - s.received) }
            s.received = received
            s.size = size
            let now = ContinuousClock.now
            let elapsed = now - s.windowStart
            if elapsed >= Self.window {
                let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
                s.speed = Double(received - s.windowBytes) / seconds
                s.windowStart = now
                s.windowBytes = received
            } else if received < s.windowBytes {
                // Started over from zero: the window no longer means anything.
                s.windowBytes = received
                s.windowStart = now
            }
        }
    }

    /// Set when the transfer gave up waiting for a connection to its host: every connection
    /// the pool may open was held past the connect timeout (requests wait behind busy
    /// connections: `HostLimits.startLimit`). The job goes back to the queue, and that is not
    /// an attempt: the server was never asked.
    public var waitedForConnection: Bool {
        get { state.withLock { $0.waitedForConnection } }
        set { state.withLock { $0.waitedForConnection = newValue } }
    }

    /// The transfer dropped its bytes and starts over, for this reason.
    public func note(_ startedOver: JobError) {
        state.withLock { $0.startedOver = startedOver }
    }

    /// Connections the transfer holds or may open to its host: the ranges it was allowed until
    /// it knows how many it uses (one when the file is one stream). The engine counts them
    /// against `max_per_host`.
    public var connections: Int {
        get { state.withLock { $0.connections } }
        set { state.withLock { $0.connections = max(1, newValue) } }
    }

    /// With mirrors: the connections the transfer holds or may open, by host (what the engine
    /// counts against each host's `max_per_host` instead of `connections` on the job's host).
    public var hostConnections: [String: Int]? {
        get { state.withLock { $0.hostConnections } }
        set { state.withLock { $0.hostConnections = newValue } }
    }

    public var snapshot: Snapshot {
        state.withLock { Snapshot(received: $0.received, size: $0.size, speed: $0.speed, startedOver: $0.startedOver) }
    }

    /// Asked once the transfer knows what it has left (the answer's head), before it writes
    /// a byte of the body: false parks it (`TransferParked`). Set by the engine for jobs that
    /// start in the light lane (`Lanes`); nil: always go on.
    private let admission = Mutex<(lanes: Lanes, decide: @Sendable (Int64?, Int64) async -> Bool)?>(nil)

    /// `decide` is asked only for a transfer that `lanes` finds big: a light one goes on
    /// without a hop to the engine.
    public func setAdmission(_ lanes: Lanes, _ decide: (@Sendable (_ remaining: Int64?, _ received: Int64) async -> Bool)?) {
        admission.withLock { $0 = decide.map { (lanes, $0) } }
    }

    /// Asks the admission once (it is cleared after): throws `TransferParked` when the
    /// transfer must stop and wait for a bulk slot.
    func admit(remaining: Int64?, received: Int64) async throws {
        guard
            let (lanes, decide) = admission.withLock({ value -> (Lanes, @Sendable (Int64?, Int64) async -> Bool)? in
                defer { value = nil }
                return value
            })
        else { return }
        if lanes.isLight(remaining: remaining, received: received) { return }
        if await !decide(remaining, received) { throw TransferParked() }
    }

    /// Reads what the body loop has written so far (not synced): set while bytes stream into
    /// the partial file, nil before and after. A closure over the stream's own state, so that
    /// the per-chunk path costs nothing more: the engine asks it a few times a second.
    private let writtenSource = Mutex<(@Sendable () -> TransferCheckpoint)?>(nil)

    func setWritten(_ source: (@Sendable () -> TransferCheckpoint)?) {
        writtenSource.withLock { $0 = source }
    }

    /// What the transfer has written to its partial file so far, not yet synced: every byte
    /// before `received` (or each range's `done`) has been handed to the kernel with `pwrite`,
    /// under the size and validators it came with. Nil while no body is streaming.
    public var written: TransferCheckpoint? {
        writtenSource.withLock { $0 }?()
    }
}

/// A transfer stopped before writing its body because no bulk slot was free (`Lanes`): its
/// outcome is `stopped`, and its job waits in the queue.
public struct TransferParked: Error, Sendable {}

/// Bytes received by every transfer since the daemon started, for the metrics: one atomic add
/// per update of a transfer's progress, and a read per scrape.
public final class ByteCounter: Sendable {
    private let value = Atomic<Int64>(0)

    public init() {}

    public func add(_ bytes: Int64) {
        value.add(bytes, ordering: .relaxed)
    }

    public var total: Int64 { value.load(ordering: .relaxed) }
}
