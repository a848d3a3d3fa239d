import DLCore
import DLRPC
import DLTransfer
import Foundation
import Synchronization

/// Fans committed events out to subscribed connections. State events come from the job
/// table's commits, in commit order, and are never dropped: a subscriber that falls
/// `bufferLimit` events behind is disconnected (it can resubscribe with `since` and replay).
/// Progress events are live only.
public final class EventHub: Sendable {
    /// Which events a subscriber wants; empty means all.
    public struct Filter: Sendable, Equatable {
        public var ids: Set<JobID>?
        public var group: GroupID?

        public init(ids: Set<JobID>? = nil, group: GroupID? = nil) {
            self.ids = ids
            self.group = group
        }

        func matches(job: JobID?, group: GroupID?) -> Bool {
            if ids == nil && self.group == nil { return true }
            if let job, ids?.contains(job) == true { return true }
            if let group, self.group == group { return true }
            return false
        }
    }

    /// What a subscriber receives: what one commit (or one progress tick) has for it, so that
    /// a burst of events costs its consumer one wake-up and one write, not one per event.
    public enum Item: Sendable {
        /// A commit's events that the subscriber wants, in commit order; never empty.
        case stored([StoredEvent])
        /// Live progress of running jobs, one message each; never empty.
        case progress([JSONValue])

        /// The messages it holds, as `bufferLimit` counts them.
        var count: Int {
            switch self {
            case .stored(let events): events.count
            case .progress(let messages): messages.count
            }
        }
    }

    /// A subscriber's messages not yet taken care of: those buffered, and those of the item its
    /// consumer holds (it is done with one when it asks for the next).
    final class Backlog: Sendable {
        private let count = Mutex(0)

        /// Takes up to `wanted` places under `limit`; returns how many it took.
        func take(_ wanted: Int, limit: Int) -> Int {
            count.withLock { count in
                let taken = max(0, min(wanted, limit - count))
                count += taken
                return taken
            }
        }

        func release(_ done: Int) {
            guard done > 0 else { return }
            count.withLock { $0 -= done }
        }
    }

    /// The live messages of one subscription, in order.
    public struct Stream: AsyncSequence, Sendable {
        let items: AsyncStream<Item>
        let backlog: Backlog

        public struct AsyncIterator: AsyncIteratorProtocol {
            var base: AsyncStream<Item>.AsyncIterator
            let backlog: Backlog
            var held = 0

            public mutating func next() async -> Item? {
                backlog.release(held)
                let item = await base.next()
                held = item?.count ?? 0
                return item
            }
        }

        public func makeAsyncIterator() -> AsyncIterator {
            AsyncIterator(base: items.makeAsyncIterator(), backlog: backlog)
        }
    }

    private struct Subscriber {
        let filter: Filter
        let continuation: AsyncStream<Item>.Continuation
        let backlog: Backlog
    }

    /// At most this many messages wait for a subscriber (held by its consumer included).
    public static let bufferLimit = 10_000
    private let subscribers = Mutex<[UInt64: Subscriber]>([:])
    private let overflowed = Mutex<Set<UInt64>>([])
    private let counter = Mutex<UInt64>(0)

    public init() {}

    public func subscribe(_ filter: Filter) -> (token: UInt64, stream: Stream) {
        let token = counter.withLock { value -> UInt64 in
            value += 1
            return value
        }
        // Bounded by the backlog, in messages rather than items.
        let (stream, continuation) = AsyncStream<Item>.makeStream(bufferingPolicy: .unbounded)
        let backlog = Backlog()
        subscribers.withLock { $0[token] = Subscriber(filter: filter, continuation: continuation, backlog: backlog) }
        return (token, Stream(items: stream, backlog: backlog))
    }

    public func unsubscribe(_ token: UInt64) {
        let subscriber = subscribers.withLock { $0.removeValue(forKey: token) }
        subscriber?.continuation.finish()
    }

    /// Whether the subscriber was cut off for falling behind.
    public func didOverflow(_ token: UInt64) -> Bool {
        overflowed.withLock { $0.remove(token) != nil }
    }

    public var subscriberCount: Int { subscribers.withLock { $0.count } }

    /// A commit's events, one item for each subscriber that wants some. A subscriber that
    /// would go past `bufferLimit` gets the events that fit, then is cut off.
    public func publish(_ events: [StoredEvent]) {
        guard !events.isEmpty else { return }
        let current = subscribers.withLock { $0 }
        for (token, subscriber) in current {
            let wanted = events.filter { subscriber.filter.matches(job: $0.jobID, group: $0.groupID) }
            guard !wanted.isEmpty else { continue }
            let fits = subscriber.backlog.take(wanted.count, limit: Self.bufferLimit)
            if fits > 0 { subscriber.continuation.yield(.stored(fits == wanted.count ? wanted : Array(wanted.prefix(fits)))) }
            if fits < wanted.count {
                overflowed.withLock { _ = $0.insert(token) }
                unsubscribe(token)
            }
        }
    }

    /// Live progress of running jobs (called at most twice a second).
    public func publishProgress(_ jobs: [Job], _ snapshots: [TransferProgress.Snapshot]) {
        let current = subscribers.withLock { $0 }
        guard !current.isEmpty else { return }
        let messages: [(job: Job, params: JSONValue)] = zip(jobs, snapshots).map { job, snapshot in
            (
                job,
                [
                    "id": .int(job.id), "group": job.groupID.map { .int($0) } ?? .null,
                    "received": .int(snapshot.received), "size": snapshot.size.map { .int($0) } ?? .null,
                    "speed": .int(Int64(snapshot.speed.rounded())),
                ]
            )
        }
        for (_, subscriber) in current {
            let wanted = messages.filter { subscriber.filter.matches(job: $0.job.id, group: $0.job.groupID) }.map(\.params)
            guard !wanted.isEmpty else { continue }
            // Progress is coalesced anyway: a tick that does not fit is simply not added.
            let fits = subscriber.backlog.take(wanted.count, limit: Self.bufferLimit)
            guard fits == wanted.count else {
                subscriber.backlog.release(fits)
                continue
            }
            subscriber.continuation.yield(.progress(wanted))
        }
    }
}

extension Dispatcher {
    /// An event stream, the same on the socket and on a WebSocket: the answer with the current
    /// sequence number, then the missed events after `since` from the table, then live events,
    /// each as one JSON-RPC message given to `write`, until the task is cancelled (the client
    /// went) or the subscriber fell too far behind. `write` gets the messages of a commit (or
    /// of a part of the replay) at once, to write them with one flush. Returns whether it fell
    /// behind (the last message said so; the caller then ends the connection).
    func stream(_ subscription: Subscription, from hub: EventHub, write: ([Data]) async throws -> Void) async throws -> Bool {
        // Subscribe before reading the table, so that nothing falls between replay and live.
        let (token, live) = hub.subscribe(subscription.filter)
        defer { hub.unsubscribe(token) }
        let last = try await engine.lastEventSeq()
        try await write([RPCResponse(id: subscription.id, result: .success(["seq": .int(last)])).json.serialized()])
        if let since = subscription.since, since < last {
            let missed = try await engine.events(after: since).filter {
                $0.seq <= last && subscription.filter.matches(job: $0.jobID, group: $0.groupID)
            }
            try await writeInChunks(missed, as: Self.notification, to: write)
        }
        var delivered = last
        for await item in live {
            switch item {
            case .stored(let events):
                let fresh = events.filter { $0.seq > delivered }
                guard let newest = fresh.last else { continue }
                delivered = newest.seq
                try await writeInChunks(fresh, as: Self.notification, to: write)
            case .progress(let messages):
                try await writeInChunks(
                    messages, as: { RPCRequest(method: "job.progress", params: $0.objectValue ?? [:]).json.serialized() }, to: write)
            }
        }
        guard hub.didOverflow(token) else { return false }
        // Cut off rather than silently missing an event: say so, then end the stream.
        let note = RPCRequest(
            method: "events.overflow", params: ["message": "this subscriber fell too far behind; subscribe again with since"])
        try? await write([note.json.serialized()])
        return true
    }

    /// Messages are serialized and written this many at a time: a page of 1000 events is not
    /// held as 1000 serialized messages at once.
    static let writeChunk = 64

    /// `items` serialized by `message` and handed to `write`, `writeChunk` at a time.
    private func writeInChunks<Item>(
        _ items: [Item], as message: (Item) -> Data, to write: ([Data]) async throws -> Void
    ) async throws {
        for start in stride(from: 0, to: items.count, by: Self.writeChunk) {
            try await write(items[start..<min(start + Self.writeChunk, items.count)].map(message))
        }
    }

    private static func notification(_ event: StoredEvent) -> Data {
        RPCRequest(method: event.kind.rawValue, params: JobJSON.encodeEvent(event).objectValue ?? [:]).json.serialized()
    }
}
