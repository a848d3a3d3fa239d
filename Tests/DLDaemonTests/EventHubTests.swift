import DLCore
import Foundation
import Testing

@testable import DLDaemon
@testable import DLTransfer

/// The hub hands a subscriber what one commit has for it as one item, and bounds what waits
/// for it in messages, counting those its consumer holds.
@Suite struct EventHubTests {
    static func events(_ seqs: ClosedRange<Int64>, job: (Int64) -> JobID = { $0 }) -> [StoredEvent] {
        seqs.map { StoredEvent(seq: $0, at: Date(), kind: .jobState, jobID: job($0), groupID: nil, state: "queued") }
    }

    @Test func aCommitIsOneItemOfTheEventsTheSubscriberWants() async throws {
        let hub = EventHub()
        let (token, stream) = hub.subscribe(EventHub.Filter(ids: [1, 3]))
        defer { hub.unsubscribe(token) }
        hub.publish(Self.events(1...3))
        hub.publish(Self.events(4...5))  // nothing for it: no item
        hub.publish(Self.events(1...1))
        hub.unsubscribe(token)
        var items: [[Int64]] = []
        for await item in stream {
            guard case .stored(let events) = item else { continue }
            items.append(events.map(\.seq))
        }
        #expect(items == [[1, 3], [1]])
    }

    /// 6 000 events taken and held (a consumer stuck writing them), then 6 000 more: the
    /// first 4 000 of those fit under the limit of 10 000 and come, then the stream ends, cut off.
    @Test func theLimitCountsMessagesAndWhatTheConsumerHolds() async throws {
        let hub = EventHub()
        let (token, stream) = hub.subscribe(EventHub.Filter())
        defer { hub.unsubscribe(token) }
        var iterator = stream.makeAsyncIterator()
        hub.publish(Self.events(1...6_000))
        guard case .stored(let first)? = await iterator.next() else {
            Issue.record("no first item")
            return
        }
        #expect(first.count == 6_000)
        hub.publish(Self.events(6_001...12_000))
        #expect(hub.didOverflow(token))
        guard case .stored(let rest)? = await iterator.next() else {
            Issue.record("no second item")
            return
        }
        #expect(rest.map(\.seq) == Array(6_001...10_000))
        // Cut off: the stream has ended (unsubscribing again is only there so that a broken
        // limit fails here rather than waiting forever).
        hub.unsubscribe(token)
        #expect(await iterator.next() == nil)
    }

    /// Once the consumer asks for the next item, what it held no longer counts (20 000 events
    /// pass, 4 000 at a time, beside the 4 000 held); a progress tick that does not fit is left
    /// out without cutting the subscriber off.
    @Test func aConsumerThatKeepsUpIsNeverCutOffAndProgressIsDropped() async throws {
        let hub = EventHub()
        let (token, stream) = hub.subscribe(EventHub.Filter())
        defer { hub.unsubscribe(token) }
        var iterator = stream.makeAsyncIterator()
        for round in 0..<5 {
            let base = Int64(round * 4_000)
            hub.publish(Self.events(base + 1...base + 4_000))
            guard case .stored(let events)? = await iterator.next() else {
                Issue.record("round \(round): no item")
                return
            }
            #expect(events.count == 4_000)
        }
        #expect(!hub.didOverflow(token))
        // 4 000 held: a tick of 7 000 does not fit, one of 6 000 does.
        let running = (1...7_000).map {
            Job(id: JobID($0), url: "http://127.0.0.1:9/f", path: "/tmp/f", createdAt: Date(), updatedAt: Date())
        }
        let snapshots = running.map { _ in TransferProgress.Snapshot(received: 1, size: 2, speed: 0) }
        hub.publishProgress(running, snapshots)
        hub.publishProgress(Array(running.prefix(6_000)), Array(snapshots.prefix(6_000)))
        hub.unsubscribe(token)
        guard case .progress(let ticks)? = await iterator.next() else {
            Issue.record("no progress")
            return
        }
        #expect(ticks.count == 6_000)
        #expect(!hub.didOverflow(token))
    }
}
