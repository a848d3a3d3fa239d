import DLCore
import DLStore
import Foundation
import Testing

/// Each test gets its own folder, removed at the end.
final class TempFolder {
    let path: String
    init() throws {
        path = NSTemporaryDirectory() + "dld-store-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    }
    deinit { try? FileManager.default.removeItem(atPath: path) }
}

let t0 = Date(timeIntervalSince1970: 1_800_000_000)

@Suite struct JobStoreTests {
    /// A new file gets the schema, and the writer commits with synchronous=FULL.
    @Test func migratesFromEmptyWithFullSync() async throws {
        let folder = try TempFolder()
        let store = try JobStore(path: folder.path + "/jobs.sqlite")
        #expect(try store.writerSynchronousMode() == 2)
        #expect(try await store.list().isEmpty)
        #expect(try await store.counts().isEmpty)
    }

    /// Every field written comes back the same, also after the file is opened again.
    @Test func roundTrip() async throws {
        let folder = try TempFolder()
        let path = folder.path + "/jobs.sqlite"
        var job: Job
        do {
            let store = try JobStore(path: path)
            let outcomes = try await store.insert(
                [NewJob(url: "https://example.com/a.bin", path: "/tmp/x/a.bin", priority: 5, key: "k1",
                        meta: #"{"chapter":3}"#, headers: [HeaderField(name: "X-Token", value: "t")], overwrite: true)],
                now: t0)
            #expect(outcomes.count == 1)
            #expect(outcomes[0].created)
            job = outcomes[0].job
            #expect(job.id == 1)
            job.state = .waiting
            job.waitReason = .diskSpace
            job.size = 1234
            job.received = 1000
            job.error = JobError(code: "disk_full", message: "no space")
            job.attempts = 2
            job.updatedAt = t0.addingTimeInterval(10)
            job.nextAttemptAt = t0.addingTimeInterval(40)
            job.finalURL = "https://cdn.example.com/a.bin"
            job.validators = Validators(etag: "\"abc\"", lastModified: "Wed, 21 Oct 2015 07:28:00 GMT", acceptsRanges: true)
            try await store.save(job)
            #expect(try await store.fetch(job.id) == job)
        }
        let reopened = try JobStore(path: path)
        #expect(try await reopened.fetch(1) == job)
        #expect(try await reopened.fetch(keys: ["k1", "nope"]) == ["k1": job])
    }

    /// A key that exists returns the existing job, in the same batch too; nothing is duplicated.
    @Test func keyUniqueness() async throws {
        let folder = try TempFolder()
        let store = try JobStore(path: folder.path + "/jobs.sqlite")
        let first = try await store.insert([NewJob(url: "https://e.com/1", path: "/tmp/1", key: "same")], now: t0)
        let again = try await store.insert(
            [NewJob(url: "https://e.com/2", path: "/tmp/2", key: "same"), NewJob(url: "https://e.com/3", path: "/tmp/3")],
            now: t0)
        #expect(again[0].created == false)
        #expect(again[0].job.id == first[0].job.id)
        #expect(again[0].job.url == "https://e.com/1")
        #expect(again[1].created)
        #expect(try await store.list().count == 2)
    }

    /// Two unfinished jobs may not write the same file; the whole batch is refused.
    @Test func pathInUseRefusesTheBatch() async throws {
        let folder = try TempFolder()
        let store = try JobStore(path: folder.path + "/jobs.sqlite")
        _ = try await store.insert([NewJob(url: "https://e.com/1", path: "/tmp/same")], now: t0)
        await #expect(throws: StoreError.pathInUse(path: "/tmp/same", by: 1)) {
            try await store.insert([NewJob(url: "https://e.com/ok", path: "/tmp/ok"), NewJob(url: "https://e.com/2", path: "/tmp/same")], now: t0)
        }
        #expect(try await store.list().count == 1)
        // Once the first job is finished the path is free again.
        var job = try #require(try await store.fetch(1))
        job.state = .completed
        try await store.save(job)
        #expect(try await store.insert([NewJob(url: "https://e.com/2", path: "/tmp/same")], now: t0)[0].created)
    }

    /// Paging by id, filtering by state, the scheduler's order and counts.
    @Test func listsAndCounts() async throws {
        let folder = try TempFolder()
        let store = try JobStore(path: folder.path + "/jobs.sqlite")
        let news = (1...5).map { NewJob(url: "https://e.com/\($0)", path: "/tmp/\($0)", priority: $0 == 4 ? 9 : 0) }
        _ = try await store.insert(news, now: t0)
        var second = try #require(try await store.fetch(2))
        second.state = .paused
        try await store.save(second)
        #expect(try await store.list(afterID: 2, limit: 2).map(\.id) == [3, 4])
        #expect(try await store.list(states: [.paused]).map(\.id) == [2])
        #expect(try await store.nextQueued(limit: 10, excludingGroups: []).jobs.map(\.id) == [4, 1, 3, 5])
        #expect(try await store.counts() == [.queued: 4, .paused: 1])
        try await store.delete([1, 3])
        #expect(try await store.list().map(\.id) == [2, 4, 5])
        // Ids are never reused after a delete.
        let next = try await store.insert([NewJob(url: "https://e.com/6", path: "/tmp/6")], now: t0)
        #expect(next[0].job.id == 6)
    }

    /// A checkpoint records counters of a running job only.
    @Test func checkpointOnlyTouchesRunningJobs() async throws {
        let folder = try TempFolder()
        let store = try JobStore(path: folder.path + "/jobs.sqlite")
        _ = try await store.insert([NewJob(url: "https://e.com/1", path: "/tmp/1")], now: t0)
        let validators = Validators(etag: "\"v\"", acceptsRanges: true)
        try await store.checkpoint(1, received: 10, size: 100, validators: validators, finalURL: nil)
        #expect(try await store.fetch(1)?.received == 0)
        var job = try #require(try await store.fetch(1))
        job.state = .running
        try await store.save(job)
        try await store.checkpoint(1, received: 10, size: 100, validators: validators, finalURL: "https://x/1")
        let after = try #require(try await store.fetch(1))
        #expect(after.received == 10)
        #expect(after.size == 100)
        #expect(after.validators == validators)
        #expect(after.finalURL == "https://x/1")
    }
}
