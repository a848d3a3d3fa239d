import DLCore
import DLJobTable
import DLStore
import Foundation
import Synchronization
import Testing

/// Set-based commands: one statement for any number of rows, the same result as the state
/// machine on each row, small outcomes.
@Suite struct BulkStoreTests {
    /// A row in `state` with every field a command may touch set to something.
    private func row(_ store: any JobTable, _ n: Int, _ state: JobState, error: String = "http_status") async throws -> Job {
        let created = try await store.insert([NewJob(url: "https://e.com/\(n)", path: "/tmp/bulk/\(n)")], now: t0)
        var job = created[0].job
        job.state = state
        job.attempts = 3
        job.received = 4096
        job.size = 10_000
        job.validators = Validators(etag: "\"v1\"", lastModified: nil, acceptsRanges: true)
        job.sha256 = state == .completed ? "ab" : nil
        job.digest = state == .completed ? "ab" : nil
        if state == .waiting {
            job.waitReason = .retry
            job.nextAttemptAt = t0.addingTimeInterval(60)
        }
        if state == .failed || state == .waiting { job.error = JobError(code: error, message: "it broke") }
        if state.isFinished { job.finishedAt = t0 }
        try await store.save(job)
        return try #require(try await store.fetch(job.id))
    }

    /// For every command and every state it applies to, the bulk statement writes the same row
    /// as `StateMachine.apply` (whose resume after a checksum failure starts over from zero).
    @Test(arguments: BulkCommand.allCases, Backend.allCases)
    func bulkAgreesWithTheStateMachine(_ command: BulkCommand, _ backend: Backend) async throws {
        try await withStore(backend) { store, _ in
            let now = t0.addingTimeInterval(100)
            var n = 0
            for state in command.sources {
                for code in state == .failed ? ["http_status", "checksum_mismatch"] : ["http_status"] {
                    n += 1
                    let before = try await row(store, n, state, error: code)
                    let expected = try StateMachine.apply(command.event, to: before, now: now)
                    let outcome = try await store.apply(command, to: .ids([before.id]), now: now)
                    #expect(outcome.count == 1)
                    let after = try #require(try await store.fetch(before.id))
                    #expect(after == expected, "\(command) from \(state) (\(code))")
                }
            }
            // A state the command does not apply to is left alone: one where the job is already
            // as wanted without a word, one that refuses it with `refused` (named by id).
            for state in JobState.allCases where !command.sources.contains(state) {
                n += 1
                let before = try await row(store, n, state)
                if command.noOpStates.contains(state) {
                    #expect(try await store.apply(command, to: .ids([before.id]), now: now).count == 0)
                } else {
                    await #expect(throws: StoreError.refused(id: before.id, state: state, verb: command.event.verb)) {
                        try await store.apply(command, to: .ids([before.id]), now: now)
                    }
                }
                #expect(try await store.fetch(before.id) == before)
            }
        }
    }

    /// Thousands of rows in mixed states: pause, resume and cancel change exactly the rows they
    /// apply to (checked row by row), write one event each, and answer with a count and at
    /// most 1000 ids.
    @Test(arguments: Backend.allCases)
    func thousandsOfRows(_ backend: Backend) async throws {
        try await withStore(backend) { store, _ in
            let states: [JobState] = [.queued, .paused, .waiting, .failed, .completed, .canceled]
            let news = (0..<3000).map { NewJob(url: "https://e.com/\($0)", path: "/tmp/many/\($0)") }
            let jobs = try await store.insert(news, now: t0).map(\.job)
            var rows: [Job] = []
            for (index, job) in jobs.enumerated() {
                var job = job
                job.state = states[index % states.count]
                if job.state == .waiting { job.nextAttemptAt = t0 }
                rows.append(job)
            }
            try await store.save(rows)
            let stateOf = Dictionary(uniqueKeysWithValues: rows.map { ($0.id, $0.state) })
            let eventsBefore = try await store.lastEventSeq()

            let paused = try await store.apply(.pause, to: .all, now: t0)
            let pausable = rows.filter { [.queued, .waiting].contains($0.state) }.map(\.id)
            #expect(paused.count == pausable.count)
            #expect(paused.ids == Array(pausable.prefix(1000)))
            for job in try await store.list() {
                let expected: JobState = [.queued, .waiting].contains(stateOf[job.id] ?? .failed) ? .paused : stateOf[job.id] ?? .failed
                #expect(job.state == expected, "job \(job.id)")
            }
            let eventsAfter = try await store.lastEventSeq()
            #expect(eventsAfter - eventsBefore == Int64(pausable.count))
            let events = try await store.events(after: eventsBefore)
            #expect(events.map(\.jobID) == pausable.map { Optional($0) })
            #expect(events.allSatisfy { $0.state == "paused" })

            let resumed = try await store.apply(.resume, to: .all, now: t0)
            let resumable = rows.filter { [.queued, .waiting, .paused, .failed].contains($0.state) }
            #expect(resumed.count == resumable.count)
            #expect(resumed.ids.count == 1000)
            for job in try await store.list() {
                let before = stateOf[job.id] ?? .failed
                #expect(job.state == (before.isFinished && before != .failed ? before : .queued), "job \(job.id)")
            }

            // Explicit ids: only those; cancel reports the partial files of jobs that had started.
            let some = Array(rows.filter { stateOf[$0.id] == .queued }.map(\.id).prefix(5))
            let canceled = try await store.apply(.cancel, to: .ids(some), now: t0)
            #expect(canceled.count == 5)
            #expect(try await store.counts()[.canceled] == 500 + 5)

            let removed = try await store.delete(.all, deleteFiles: true, now: t0)
            #expect(removed.count == 3000)
            #expect(removed.ids.count == 1000)
            #expect(removed.files.count == 500, "the completed jobs' files, and no partial file of jobs that never started")
            #expect(try await store.list().isEmpty)
            // The events table keeps its bound.
            #expect(try await store.events(after: 0).count <= Int(EventLog.kept))
        }
    }

    /// A bulk change hands its events to the sink after the commit, read back a page at a
    /// time, all of them in order; with no one listening nothing is delivered. `first` rows
    /// are written in the same transaction, before the command.
    @Test(arguments: Backend.allCases)
    func bulkEventsReachTheSinkInPages(_ backend: Backend) async throws {
        try await withStore(backend) { store, _ in
            let jobs = try await store.insert((0..<2500).map { NewJob(url: "https://e.com/\($0)", path: "/tmp/sink/\($0)") }, now: t0).map(
                \.job)
            let listening = Flag()
            let delivered = Collected()
            let pages = Counter()
            store.setEventSink(wanted: { listening.value }) { events in
                pages.add(1)
                delivered.add(events)
            }
            _ = try await store.apply(.pause, to: .all, now: t0)
            #expect(delivered.events.isEmpty, "no one listens: nothing read, nothing delivered")
            listening.set()
            let before = try await store.lastEventSeq()
            var stopped = try #require(try await store.fetch(jobs[0].id))
            stopped.received = 77
            let resumed = try await store.apply(.resume, to: .all, first: [stopped], owner: nil, now: t0.addingTimeInterval(1))
            #expect(resumed.count == 2500)
            let events = delivered.events
            #expect(events.count == 2500)
            #expect(events.map(\.seq) == Array((before + 1)...(before + 2500)), "numbered in order, without a gap")
            #expect(events.map(\.jobID) == jobs.map { Optional($0.id) }, "one event a job, in id order")
            #expect(delivered.events.allSatisfy { $0.state == "queued" && $0.at == t0.addingTimeInterval(1) })
            #expect(pages.value == 3, "pages of \(EventLog.page)")
            #expect(try await store.fetch(jobs[0].id)?.received == 77)
            #expect(try await store.fetch(jobs[0].id)?.state == .queued)
        }
    }

    /// Explicit ids are checked as a set: the first missing id, and the first refused state.
    @Test(arguments: Backend.allCases)
    func checkIds(_ backend: Backend) async throws {
        try await withStore(backend) { store, _ in
            let a = try await row(store, 1, .completed)
            let b = try await row(store, 2, .queued)
            let (missing, refused) = try await store.check([b.id, 99, a.id], refused: [.completed])
            #expect(missing == 99)
            #expect(refused?.0 == a.id && refused?.1 == .completed)
            let (none, ok) = try await store.check([b.id], refused: [.completed])
            #expect(none == nil && ok == nil)
        }
    }

    /// Waiting jobs are requeued by time, in one statement.
    @Test(arguments: Backend.allCases)
    func requeueDue(_ backend: Backend) async throws {
        try await withStore(backend) { store, _ in
            var due = try await row(store, 1, .waiting)
            due.nextAttemptAt = t0
            try await store.save(due)
            var later = try await row(store, 2, .waiting)
            later.nextAttemptAt = t0.addingTimeInterval(3600)
            try await store.save(later)
            #expect(try await store.requeueDue(now: t0.addingTimeInterval(1)) == 1)
            #expect(try await store.fetch(due.id)?.state == .queued)
            #expect(try await store.fetch(due.id)?.waitReason == nil)
            #expect(try await store.fetch(later.id)?.state == .waiting)
        }
    }

    /// Job options and headers, written and read without the JSON coder, come back the same.
    @Test(arguments: Backend.allCases)
    func optionsAndHeadersRoundTrip(_ backend: Backend) async throws {
        try await withStore(backend) { store, _ in
            for bits in 0..<8 {
                var new = NewJob(
                    url: "https://e.com/\(bits)", path: "/tmp/options/\(bits)",
                    headers: bits == 0 ? [] : [HeaderField(name: "X-N", value: "\(bits) \"q\"")])
                new.options = JobOptions(automaticName: bits & 1 != 0, renameIfTaken: bits & 2 != 0, insecure: bits & 4 != 0)
                let job = try await store.insert([new], now: t0)[0].job
                let back = try #require(try await store.fetch(job.id))
                #expect(back.options == new.options)
                #expect(back.headers == new.headers)
            }
        }
    }
}

/// dld 0.1.0 died with SIGSEGV after about 130 000 commits (pause all after resume all on
/// 100 000 jobs; SIGTERM after a large queue): the event sink, a bare closure kept in a
/// `Mutex`, came back from every `withLock` wrapped in two more reabstraction thunks, so each
/// call, and at last its release, recursed once per earlier commit until the stack ran out.
/// Publishing must cost the same stack the 300 000th time as the first, and so must releasing.
@Suite struct EventSinkTests {
    @Test(arguments: Backend.allCases)
    func publishingDoesNotDeepenTheSink(_ backend: Backend) async throws {
        let fixture = try StoreFixture(backend)
        var store: (any JobTable)? = try await fixture.open()
        let delivered = Counter()
        store?.setEventSink { delivered.add($0.count) }
        // Numbered as a table numbers them: the PostgreSQL store hands each number over once.
        for seq in 1...300_000 {
            store?.publishEvents([StoredEvent(seq: Int64(seq), at: t0, kind: .jobState, jobID: 1, groupID: nil, state: "queued")])
        }
        #expect(delivered.value == 300_000)
        store = nil
        await fixture.finish()
    }

    /// A `publish: false` write's hold keeps later writes' events back until its own are handed
    /// over; then all go out in number order, so a subscriber never sees a number go back.
    @Test func heldEventsGoOutInOrder() {
        let sink = EventSink()
        let delivered = Collected()
        sink.set(wanted: { true }) { delivered.add($0) }
        func event(_ seq: Int64) -> StoredEvent {
            StoredEvent(seq: seq, at: t0, kind: .jobState, jobID: seq, groupID: nil, state: "running")
        }
        sink.publish([event(1)])
        sink.hold()
        sink.publish([event(4)])
        sink.publish(after: 4, through: 5) { _, _, _ in [event(5)] }
        #expect(delivered.events.map(\.seq) == [1], "nothing after a hold goes out before it ends")
        sink.hold()
        sink.release(publishing: [event(2), event(3)])
        #expect(delivered.events.map(\.seq) == [1], "a second hold still holds")
        sink.release(publishing: [event(6)])
        #expect(delivered.events.map(\.seq) == [1, 2, 3, 4, 5, 6])
        sink.publish([event(7)])
        #expect(delivered.events.map(\.seq) == [1, 2, 3, 4, 5, 6, 7])
    }
}

final class Counter: Sendable {
    private let count = Mutex(0)
    func add(_ n: Int) { count.withLock { $0 += n } }
    var value: Int { count.withLock { $0 } }
}
