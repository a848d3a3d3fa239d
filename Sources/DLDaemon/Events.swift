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

    /// What a subscriber receives.
    public enum Item: Sendable {
        case stored(StoredEvent)
        case progress(JSONValue)
    }

    private struct Subscriber {
        let filter: Filter
        let continuation: AsyncStream<Item>.Continuation
    }

    public static let bufferLimit = 10_000
    private let subscribers = Mutex<[UInt64: Subscriber]>([:])
    private let overflowed = Mutex<Set<UInt64>>([])
    private let counter = Mutex<UInt64>(0)

    public init() {}

    public func subscribe(_ filter: Filter) -> (token: UInt64, stream: AsyncStream<Item>) {
        let token = counter.withLock { value -> UInt64 in
            value += 1
            return value
        }
        let (stream, continuation) = AsyncStream<Item>.makeStream(bufferingPolicy: .bufferingOldest(Self.bufferLimit))
        subscribers.withLock { $0[token] = Subscriber(filter: filter, continuation: continuation) }
        return (token, stream)
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

    public func publish(_ events: [StoredEvent]) {
        let current = subscribers.withLock { $0 }
        for (token, subscriber) in current {
            for event in events where subscriber.filter.matches(job: event.jobID, group: event.groupID) {
                if case .dropped = subscriber.continuation.yield(.stored(event)) {
                    overflowed.withLock { _ = $0.insert(token) }
                    unsubscribe(token)
                    break
                }
            }
        }
    }

    /// Live progress of running jobs (called at most twice a second).
    public func publishProgress(_ jobs: [Job], _ snapshots: [TransferProgress.Snapshot]) {
        let current = subscribers.withLock { $0 }
        guard !current.isEmpty else { return }
        for (job, snapshot) in zip(jobs, snapshots) {
            let params: JSONValue = [
                "id": .int(job.id), "group": job.groupID.map { .int($0) } ?? .null,
                "received": .int(snapshot.received), "size": snapshot.size.map { .int($0) } ?? .null,
                "speed": .int(Int64(snapshot.speed.rounded())),
            ]
            for (_, subscriber) in current where subscriber.filter.matches(job: job.id, group: job.groupID) {
                // Progress is coalesced anyway: when a buffer is full it is simply not added.
                _ = subscriber.continuation.yield(.progress(params))
            }
        }
    }
}

extension Dispatcher {
    /// An event stream, the same on the socket and on a WebSocket: the answer with the current
    /// sequence number, then the missed events after `since` from the table, then live events,
    /// each as one JSON-RPC message given to `write`, until the task is cancelled (the client
    /// went) or the subscriber fell too far behind. Returns whether it fell behind (the last
    /// message said so; the caller then ends the connection).
    func stream(_ subscription: Subscription, from hub: EventHub, write: (Data) async throws -> Void) async throws -> Bool {
        // Subscribe before reading the table, so that nothing falls between replay and live.
        let (token, live) = hub.subscribe(subscription.filter)
        defer { hub.unsubscribe(token) }
        let last = try await engine.lastEventSeq()
        try await write(RPCResponse(id: subscription.id, result: .success(["seq": .int(last)])).json.serialized())
        if let since = subscription.since, since < last {
            for event in try await engine.events(after: since) where event.seq <= last {
                guard subscription.filter.matches(job: event.jobID, group: event.groupID) else { continue }
                try await write(Self.notification(event))
            }
        }
        var delivered = last
        for await item in live {
            switch item {
            case .stored(let event):
                guard event.seq > delivered else { continue }
                delivered = event.seq
                try await write(Self.notification(event))
            case .progress(let params):
                try await write(RPCRequest(method: "job.progress", params: params.objectValue ?? [:]).json.serialized())
            }
        }
        guard hub.didOverflow(token) else { return false }
        // Cut off rather than silently missing an event: say so, then end the stream.
        let note = RPCRequest(
            method: "events.overflow", params: ["message": "this subscriber fell too far behind; subscribe again with since"])
        try? await write(note.json.serialized())
        return true
    }

    private static func notification(_ event: StoredEvent) -> Data {
        RPCRequest(method: event.kind.rawValue, params: JobJSON.encodeEvent(event).objectValue ?? [:]).json.serialized()
    }
}
