import DLCore
import DLJobTable
import Foundation
import Logging
import Synchronization

/// Hands the event sink every committed event of the table, this daemon's and every other
/// daemon's, in `seq` order, each once.
///
/// One serial reader task follows `events(after:)` from the last number delivered; it is woken
/// by this store's commits and by `NOTIFY dld_events` (see `PostgresListener`). Events are
/// numbered in commit order under the event lock, so a reader that reads the committed events
/// after its cursor never skips one that commits later.
///
/// A writer that publishes its own events hands them over directly when they are the next
/// numbers (no read), else wakes the reader and waits for its pass. A writer told not to
/// publish (`publish: false`) holds its events' numbers from inside its transaction, before
/// COMMIT, so the reader stops before them until `publishEvents` hands them over: events
/// after a held one wait for it, as they would in one daemon.
final class EventFollower: Sendable {
    private struct State {
        /// The last number handed to the sink.
        var delivered: Int64
        /// Numbers committed by a `publish: false` write and not yet published.
        var held: Set<Int64> = []
        /// Writers waiting for the reader's next pass.
        var waiters: [CheckedContinuation<Void, Never>] = []
        var closed = false
        /// Numbers passed over since the last warning: pruned before this reader read them.
        var skipped: Int64 = 0
    }

    private let state: Mutex<State>
    /// Serializes handing events to the sink: the reader and direct hand-overs never interleave.
    private let delivery = NSLock()
    private let sink: EventSink
    private let wakes: AsyncStream<Void>.Continuation
    private let stream: AsyncStream<Void>
    private let logger: Logger

    init(sink: EventSink, delivered: Int64, logger: Logger) {
        self.sink = sink
        self.logger = logger
        state = Mutex(State(delivered: delivered))
        (stream, wakes) = AsyncStream<Void>.makeStream(bufferingPolicy: .bufferingNewest(1))
    }

    /// The reader: one pass per wake-up, until `close`. `read(after, limit)` reads committed
    /// events; `last()` the newest number (to skip what no one listens to).
    func run(read: @escaping @Sendable (Int64, Int) async throws -> [StoredEvent], last: @escaping @Sendable () async throws -> Int64) async
    {
        for await _ in stream {
            let waiters = state.withLock { state -> [CheckedContinuation<Void, Never>] in
                defer { state.waiters = [] }
                return state.waiters
            }
            await pass(read: read, last: last)
            for waiter in waiters { waiter.resume() }
        }
        // Closed: nobody waits for a pass that will not come.
        for waiter in state.withLock({ state -> [CheckedContinuation<Void, Never>] in
            state.closed = true
            defer { state.waiters = [] }
            return state.waiters
        }) {
            waiter.resume()
        }
    }

    private func pass(read: @Sendable (Int64, Int) async throws -> [StoredEvent], last: @Sendable () async throws -> Int64) async {
        guard sink.wanted else {
            // No one listens: nothing is read, and what was committed meanwhile is not owed.
            if let newest = try? await last() {
                state.withLock { $0.delivered = max($0.delivered, newest) }
            }
            return
        }
        while true {
            let cursor = state.withLock { $0.delivered }
            guard let page = try? await read(cursor, EventLog.page), !page.isEmpty else { return }
            let handed = hand(page, wholeTable: true)
            // A held number, or a page that was not full: the rest waits for the next wake-up.
            if handed < page.count || page.count < EventLog.page { return }
        }
    }

    /// Hands the leading events that are the next numbers and not held; returns how many.
    /// `wholeTable`: `events` are every committed event after the cursor (a read of the
    /// table), so a number missing at their start was pruned, not yet to come.
    @discardableResult
    private func hand(_ events: [StoredEvent], wholeTable: Bool = false) -> Int {
        delivery.withLock {
            let (ready, through, skipped) = state.withLock { state -> ([StoredEvent], Int64, Int64) in
                var next = state.delivered
                var ready: [StoredEvent] = []
                // A page holds the committed events after the cursor, in order. Numbers follow
                // commit order (the event lock is held to COMMIT), so one missing at its start
                // can only have been pruned before this reader got to it: it is passed over
                // (said once), never waited for.
                if wholeTable, let first = events.first(where: { $0.seq > state.delivered }), first.seq > next + 1,
                    !state.held.contains(first.seq)
                {
                    state.skipped += first.seq - next - 1
                    next = first.seq - 1
                }
                for event in events where event.seq > state.delivered {
                    guard event.seq == next + 1, !state.held.contains(event.seq) else { break }
                    ready.append(event)
                    next = event.seq
                }
                state.delivered = next
                defer { state.skipped = 0 }
                return (ready, next, state.skipped)
            }
            if skipped > 0 {
                logger.warning(
                    "events were pruned before this daemon read them: they are passed over", metadata: ["events": "\(skipped)"])
            }
            sink.publish(ready)
            return events.filter { $0.seq <= through }.count
        }
    }

    /// Wakes the reader (a notification, or a commit of this store), without waiting.
    func wake() {
        wakes.yield()
    }

    /// After this store's commit of `events`: hands them over if they are next, else lets the
    /// reader catch up to them (and whatever other daemons committed before), and returns
    /// after its pass.
    func committed(_ events: [StoredEvent]) async {
        if let last = events.last?.seq {
            hand(events)
            if state.withLock({ $0.delivered >= last }) { return }
        }
        await catchUp()
    }

    /// Wakes the reader and waits for its next whole pass.
    func catchUp() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let closed = state.withLock { state -> Bool in
                if !state.closed { state.waiters.append(continuation) }
                return state.closed
            }
            if closed { continuation.resume() } else { wakes.yield() }
        }
    }

    /// Called inside a `publish: false` transaction, before COMMIT.
    func hold(_ events: [StoredEvent]) {
        guard !events.isEmpty else { return }
        state.withLock { $0.held.formUnion(events.map(\.seq)) }
    }

    /// The transaction that held these did not commit.
    func unhold(_ events: [StoredEvent]) {
        guard !events.isEmpty else { return }
        state.withLock { $0.held.subtract(events.map(\.seq)) }
        wakes.yield()
    }

    /// `publishEvents`: the held events are handed over now (when they are next), and the
    /// reader goes on past them.
    func publish(_ events: [StoredEvent]) {
        guard !events.isEmpty else { return }
        state.withLock { $0.held.subtract(events.map(\.seq)) }
        hand(events)
        wakes.yield()
    }

    func close() {
        wakes.finish()
    }
}
