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
