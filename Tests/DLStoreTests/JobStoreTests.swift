import DLCore
import DLJobTable
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

/// The job table's rules, on every backend.
@Suite struct JobStoreTests {
    /// A new table gets the schema and is empty; opening it again migrates nothing away.
    @Test(arguments: Backend.allCases)
    func migratesFromEmpty(_ backend: Backend) async throws {
        try await withStore(backend) { store, fixture in
            #expect(try await store.list().isEmpty)
            #expect(try await store.counts().isEmpty)
            #expect(try await store.lastEventSeq() == 0)
            _ = try await store.insert([NewJob(url: "https://e.com/1", path: "/tmp/1")], now: t0)
            let reopened = try await fixture.open()
            #expect(try await reopened.list().map(\.id) == [1])
        }
    }

    /// The SQLite writer commits with synchronous=FULL (GRDB opens it with NORMAL).
    @Test func sqliteWriterIsFullSync() async throws {
        let folder = try TempFolder()
        let store = try SQLiteJobStore(path: folder.path + "/jobs.sqlite")
        #expect(try store.writerSynchronousMode() == 2)
    }

    /// A claim commits without waiting for the disk (power loss may only requeue its jobs), and
    /// leaves the writer FULL for every other change, whether it took jobs or found none.
    @Test func claimLeavesTheWriterFullSync() async throws {
        let folder = try TempFolder()
        let store = try SQLiteJobStore(path: folder.path + "/jobs.sqlite")
        _ = try await store.insert([NewJob(url: "https://e.com/1", path: "/tmp/1")], now: t0)
        let lease = t0.addingTimeInterval(30)
        #expect(try await store.claim(limit: 5, worker: "w", leaseUntil: lease, excludingHosts: [], now: t0).count == 1)
        #expect(try store.writerSynchronousMode() == 2)
        #expect(try await store.claim(limit: 5, worker: "w", leaseUntil: lease, excludingHosts: [], now: t0).isEmpty)
        #expect(try store.writerSynchronousMode() == 2)
    }

    /// Every field written comes back the same, also after the table is opened again.
    @Test(arguments: Backend.allCases)
    func roundTrip(_ backend: Backend) async throws {
        try await withStore(backend) { store, fixture in
            let outcomes = try await store.insert(
                [
                    NewJob(
                        url: "https://example.com/a.bin", path: "/tmp/x/a.bin", priority: 5, key: "k1",
                        meta: #"{"chapter":3}"#, headers: [HeaderField(name: "X-Token", value: "t")], overwrite: true)
                ],
                now: t0)
            #expect(outcomes.count == 1)
            #expect(outcomes[0].created)
            var job = outcomes[0].job
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
            job.sha256 = "ab"
            job.digest = "cd"
            job.checksum = try Checksum.parse("sha256:" + String(repeating: "ab", count: 32)).get()
            job.expectedSize = 1234
            job.progressAt = t0.addingTimeInterval(0.125)
            job.finishedAt = t0.addingTimeInterval(1e-6)
            job.options = JobOptions(automaticName: true, renameIfTaken: false, insecure: true)
            try await store.save(job)
            #expect(try await store.fetch(job.id) == job)
            let reopened = try await fixture.open()
            #expect(try await reopened.fetch(1) == job)
            #expect(try await reopened.fetch(keys: ["k1", "nope"]) == ["k1": job])
        }
    }

    /// A job's own TLS files (and `insecure`) are kept by both backends, in the options column.
    @Test(arguments: Backend.allCases)
    func tlsOptionsRoundTrip(_ backend: Backend) async throws {
        try await withStore(backend) { store, fixture in
            var new = NewJob(url: "https://nas.home/a.bin", path: "/tmp/x/a.bin")
            let tls = JobTLS(caFile: "/etc/nas.pem", caDir: "/etc/nas-cas", clientCert: "/home/me/c.pem", clientKey: "/home/me/k.pem")
            new.options = JobOptions(insecure: true, tls: tls)
            let inserted = try await store.insert([new, NewJob(url: "https://e.com/b", path: "/tmp/x/b")], now: t0)
            #expect(inserted[0].job.options.tls == tls)
            #expect(try await fixture.open().fetch(inserted[0].job.id)?.options == JobOptions(insecure: true, tls: tls))
            #expect(try await store.fetch(inserted[1].job.id)?.options.tls == nil)
        }
    }

    /// A job's own speed limit (`max_speed`) is kept by both backends in the options column,
    /// from the insert and from a save (`set_speed`), and a save without it clears it.
    @Test(arguments: Backend.allCases)
    func speedLimitRoundTrip(_ backend: Backend) async throws {
        try await withStore(backend) { store, fixture in
            var new = NewJob(url: "https://e.com/big.iso", path: "/tmp/x/big.iso")
            new.options = JobOptions(renameIfTaken: true, maxSpeed: 2 << 20)
            let inserted = try await store.insert([new], now: t0)
            var job = inserted[0].job
            #expect(try await fixture.open().fetch(job.id)?.options == JobOptions(renameIfTaken: true, maxSpeed: 2 << 20))
            job.options.maxSpeed = 512
            _ = try await store.save([job], publish: false)
            #expect(try await fixture.open().fetch(job.id)?.options.maxSpeed == 512)
            job.options.maxSpeed = nil
            _ = try await store.save([job], publish: false)
            #expect(try await fixture.open().fetch(job.id)?.options == JobOptions(renameIfTaken: true))
        }
    }

    /// The age recipients of an encrypted job (`encrypt_to`) are kept by both backends in the
    /// options column, for standalone jobs and group members: a row read back without them
    /// would be downloaded in clear.
    @Test(arguments: Backend.allCases)
    func encryptionRecipientsRoundTrip(_ backend: Backend) async throws {
        try await withStore(backend) { store, fixture in
            let recipients = [
                "age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p",
                "age1lggyhqrw2nlhcxprm67z43rta597azn8gknawjehu9d9dl0jq3yqqvfafg",
            ]
            var new = NewJob(url: "https://e.com/secret.tar", path: "/tmp/x/secret.tar.age")
            new.options = JobOptions(automaticName: true, encryptTo: recipients)
            let plain = NewJob(url: "https://e.com/open.tar", path: "/tmp/x/open.tar")
            let inserted = try await store.insert([new, plain], now: t0)
            let reopened = try await fixture.open()
            #expect(try await reopened.fetch(inserted[0].job.id)?.options == JobOptions(automaticName: true, encryptTo: recipients))
            #expect(try await reopened.fetch(inserted[0].job.id)?.options.isEncrypted == true)
            #expect(try await reopened.fetch(inserted[1].job.id)?.options.encryptTo == nil)
            var member = NewJob(url: "https://e.com/page1.jpg", path: "/tmp/book/page1.jpg.age")
            member.options = JobOptions(encryptTo: [recipients[0]])
            let (_, members) = try await store.insertGroup(name: "book", dir: "/tmp/book", priority: 0, members: [member], now: t0)
            #expect(try await fixture.open().fetch(members[0].id)?.options.encryptTo == [recipients[0]])
        }
    }

    /// A key that exists returns the existing job, in the same batch too; nothing is duplicated.
    @Test(arguments: Backend.allCases)
    func keyUniqueness(_ backend: Backend) async throws {
        try await withStore(backend) { store, _ in
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
    }

    /// Two unfinished jobs may not write the same file; the whole batch is refused.
    @Test(arguments: Backend.allCases)
    func pathInUseRefusesTheBatch(_ backend: Backend) async throws {
        try await withStore(backend) { store, _ in
            _ = try await store.insert([NewJob(url: "https://e.com/1", path: "/tmp/same")], now: t0)
            await #expect(throws: StoreError.pathInUse(path: "/tmp/same", by: 1)) {
                try await store.insert(
                    [NewJob(url: "https://e.com/ok", path: "/tmp/ok"), NewJob(url: "https://e.com/2", path: "/tmp/same")], now: t0)
            }
            #expect(try await store.list().count == 1)
            #expect(try await store.isPathInUse("/tmp/same"))
            #expect(try await !store.isPathInUse("/tmp/ok"))
            #expect(try await store.unfinishedPaths(among: ["/tmp/ok", "/tmp/same", "/tmp/same"]) == ["/tmp/same"])
            // Once the first job is finished the path is free again.
            var job = try #require(try await store.fetch(1))
            job.state = .completed
            try await store.save(job)
            #expect(try await !store.isPathInUse("/tmp/same"))
            #expect(try await store.insert([NewJob(url: "https://e.com/2", path: "/tmp/same")], now: t0)[0].created)
        }
    }

    /// Paging by id, filtering by state, the scheduler's order and counts.
    @Test(arguments: Backend.allCases)
    func listsAndCounts(_ backend: Backend) async throws {
        try await withStore(backend) { store, _ in
            let news = (1...5).map { NewJob(url: "https://e.com/\($0)", path: "/tmp/\($0)", priority: $0 == 4 ? 9 : 0) }
            _ = try await store.insert(news, now: t0)
            var second = try #require(try await store.fetch(2))
            second.state = .paused
            try await store.save(second)
            #expect(try await store.list(afterID: 2, limit: 2).map(\.id) == [3, 4])
            #expect(try await store.list(states: [.paused]).map(\.id) == [2])
            #expect(try await store.list(states: [.paused, .queued], afterID: 3, limit: 10).map(\.id) == [4, 5])
            #expect(try await store.nextQueued(limit: 10, excludingGroups: []).jobs.map(\.id) == [4, 1, 3, 5])
            #expect(try await store.nextQueued(limit: 2, excludingGroups: []).jobs.map(\.id) == [4, 1])
            #expect(try await store.counts() == [.queued: 4, .paused: 1])
            #expect(try await store.unfinishedCount() == 5)
            #expect(try await store.fetch([5, 99, 1, 5]).map(\.id) == [5, 1, 5], "the ids that exist, in the order asked")
            try await store.delete([1, 3])
            #expect(try await store.list().map(\.id) == [2, 4, 5])
            // Ids are never reused after a delete.
            let next = try await store.insert([NewJob(url: "https://e.com/6", path: "/tmp/6")], now: t0)
            #expect(next[0].job.id == 6)
        }
    }

    /// A checkpoint records counters of a running job only.
    @Test(arguments: Backend.allCases)
    func checkpointOnlyTouchesRunningJobs(_ backend: Backend) async throws {
        try await withStore(backend) { store, _ in
            _ = try await store.insert([NewJob(url: "https://e.com/1", path: "/tmp/1")], now: t0)
            let validators = Validators(etag: "\"v\"", acceptsRanges: true)
            try await store.checkpoint(1, received: 10, size: 100, validators: validators, finalURL: nil)
            #expect(try await store.fetch(1)?.received == 0)
            var job = try #require(try await store.fetch(1))
            job.state = .running
            try await store.save(job)
            try await store.checkpoint(
                1, received: 10, size: 100, validators: validators, finalURL: "https://x/1", now: t0.addingTimeInterval(5))
            let after = try #require(try await store.fetch(1))
            #expect(after.received == 10)
            #expect(after.size == 100)
            #expect(after.validators == validators)
            #expect(after.finalURL == "https://x/1")
            #expect(after.progressAt == t0.addingTimeInterval(5), "bytes arrived: the give-up clock restarts")
            // No new bytes: the clock stays; no final URL: the last one stays.
            try await store.checkpoint(1, received: 10, size: nil, validators: Validators(), finalURL: nil, now: t0.addingTimeInterval(9))
            let again = try #require(try await store.fetch(1))
            #expect(again.progressAt == t0.addingTimeInterval(5))
            #expect(again.finalURL == "https://x/1")
            #expect(again.size == nil)
            #expect(again.validators == Validators())
        }
    }

    /// A segmented download's ranges are kept by checkpoints and saves, and cleared by a
    /// checkpoint of one stream and by a resume that starts the file over.
    @Test(arguments: Backend.allCases)
    func segmentsAreKeptAndCleared(_ backend: Backend) async throws {
        try await withStore(backend) { store, _ in
            _ = try await store.insert([NewJob(url: "https://e.com/1", path: "/tmp/1")], now: t0)
            var job = try #require(try await store.fetch(1))
            job.state = .running
            try await store.save(job)
            let validators = Validators(etag: "\"v\"", acceptsRanges: true)
            let ranges = "0-40-50,50-80-100"
            #expect(
                try await store.checkpoint(
                    1, received: 70, size: 100, validators: validators, finalURL: nil, segments: ranges,
                    now: t0, owner: nil
                ).written)
            var saved = try #require(try await store.fetch(1))
            #expect(saved.segments == ranges)
            #expect(saved.received == 70)
            // A whole-row save keeps them (a pause, say).
            saved.state = .paused
            try await store.save(saved)
            #expect(try await store.fetch(1)?.segments == ranges)
            // A checksum mismatch, then resume: the file starts over, ranges and all.
            saved = try #require(try await store.fetch(1))
            saved.state = .failed
            saved.error = JobError(code: "checksum_mismatch", message: "x")
            try await store.save(saved)
            _ = try await store.apply(.resume, to: .ids([1]), now: t0)
            let resumed = try #require(try await store.fetch(1))
            #expect(resumed.segments == nil)
            #expect(resumed.received == 0)
            // One stream writes no ranges.
            var running = resumed
            running.state = .running
            try await store.save(running)
            try await store.checkpoint(1, received: 10, size: 100, validators: validators, finalURL: nil, now: t0, owner: nil)
            #expect(try await store.fetch(1)?.segments == nil)
        }
    }

    /// A job's mirrors are written by insert (none dropped), their drops by a whole-row save,
    /// and read back by every read; a job without mirrors has none. Reopened, they are there.
    @Test(arguments: Backend.allCases)
    func mirrorsAndTheirDropsAreKept(_ backend: Backend) async throws {
        try await withStore(backend) { store, fixture in
            var new = NewJob(url: "https://a.example/f", path: "/tmp/f")
            new.mirrors = [JobMirror(url: "https://b.example/f"), JobMirror(url: "https://c.example:8443/f")]
            let inserted = try await store.insert([new, NewJob(url: "https://a.example/g", path: "/tmp/g")], now: t0).map(\.job)
            #expect(inserted[0].mirrors == new.mirrors)
            var job = try #require(try await store.fetch(inserted[0].id))
            #expect(job.mirrors == new.mirrors)
            #expect(job.urlDropped == nil)
            #expect(try await store.fetch(inserted[1].id)?.mirrors == [])
            job.mirrors[1].dropped = "size differs: 11 vs 10"
            job.urlDropped = "the server answered 404"
            job.state = .paused
            try await store.save(job)
            let reopened = try await fixture.open()
            let saved = try #require(try await reopened.fetch(job.id))
            #expect(
                saved.mirrors == [
                    JobMirror(url: "https://b.example/f"), JobMirror(url: "https://c.example:8443/f", dropped: "size differs: 11 vs 10"),
                ])
            #expect(saved.urlDropped == "the server answered 404")
            #expect(try await reopened.list(afterID: 0, limit: 10).first?.mirrors == saved.mirrors)
        }
    }

    /// A job's piece hashes (from a Metalink) are written by insert, kept by a whole-row save
    /// (which never writes them), and read back by every read; other jobs have none.
    @Test(arguments: Backend.allCases)
    func piecesAreKept(_ backend: Backend) async throws {
        try await withStore(backend) { store, fixture in
            let pieces = PieceHashes(
                algorithm: .sha1, length: 4, hashes: [String(repeating: "a", count: 40), String(repeating: "b", count: 40)])
            var new = NewJob(url: "https://a.example/f", path: "/tmp/f")
            new.pieces = pieces.encoded
            let inserted = try await store.insert([new, NewJob(url: "https://a.example/g", path: "/tmp/g")], now: t0).map(\.job)
            #expect(inserted[0].pieces == pieces.encoded)
            var job = try #require(try await store.fetch(inserted[0].id))
            #expect(job.pieces.flatMap(PieceHashes.init(encoded:)) == pieces)
            #expect(try await store.fetch(inserted[1].id)?.pieces == nil)
            job.state = .paused
            try await store.save(job)
            let reopened = try await fixture.open()
            #expect(try await reopened.fetch(job.id)?.pieces == pieces.encoded)
            #expect(try await reopened.list(afterID: 0, limit: 10).first?.pieces == pieces.encoded)
        }
    }

    /// Unsynced progress is recorded for many running rows in one call, only while they run
    /// (and are the owner's); it reads back as written, a whole-row save writes the row's own
    /// value (nil clears it), a checkpoint leaves it, and a resume that starts over clears it.
    @Test(arguments: Backend.allCases)
    func unsyncedProgressIsRecordedForRunningRows(_ backend: Backend) async throws {
        try await withStore(backend) { store, fixture in
            _ = try await store.insert((1...3).map { NewJob(url: "https://e.com/\($0)", path: "/tmp/\($0)") }, now: t0)
            // Jobs 1 and 2 run under w1 (a claim: only claims give a running row its worker).
            let claimed = try await store.claim(
                limit: 2, worker: "w1", leaseUntil: t0.addingTimeInterval(3600), excludingHosts: [], now: t0)
            try #require(claimed.map(\.id) == [1, 2])
            let epoch = { (id: JobID) in claimed.first { $0.id == id }?.epoch ?? 0 }
            let validators = Validators(etag: "\"v\"", acceptsRanges: true)
            let one = UnsyncedProgress(bootID: "boot-a", received: 70, size: 100, validators: validators, finalURL: "https://e.com/one")
            let two = UnsyncedProgress(bootID: "boot-a", received: 30, segments: "0-10-50,50-70-100", size: 100, validators: validators)
            let three = UnsyncedProgress(bootID: "boot-a", received: 5)
            // Job 3 is queued: not written.
            #expect(
                try await store.recordUnsynced(
                    [
                        UnsyncedRecord(id: 1, epoch: epoch(1), progress: one), UnsyncedRecord(id: 2, epoch: epoch(2), progress: two),
                        UnsyncedRecord(id: 3, epoch: 0, progress: three),
                    ], owner: "w1") == 2)
            #expect(try await store.fetch(1)?.unsynced == one)
            #expect(try await store.fetch(2)?.unsynced == two)
            #expect(try await store.fetch(3)?.unsynced == nil)
            // Another worker's record is not written over this one's.
            #expect(try await store.recordUnsynced([UnsyncedRecord(id: 1, epoch: epoch(1), progress: three)], owner: "w2") == 0)
            // Nor an older attempt's of the same worker.
            #expect(try await store.recordUnsynced([UnsyncedRecord(id: 1, epoch: epoch(1) - 1, progress: three)], owner: "w1") == 0)
            #expect(try await store.fetch(1)?.unsynced == one)
            #expect(try await store.recordUnsynced([], owner: nil) == 0)
            // A checkpoint leaves it; it is still there for a store opened anew (a restart).
            #expect(
                try await store.checkpoint(
                    1, received: 40, size: 100, validators: validators, finalURL: nil, segments: nil,
                    now: t0, owner: JobOwner(worker: "w1", epoch: epoch(1))
                ).written)
            let reopened = try await fixture.open()
            let read = try #require(try await reopened.fetch(1))
            #expect(read.unsynced == one)
            #expect(read.received == 40)
            #expect(try await reopened.reconcilePage(afterID: 0, limit: 10).first { $0.id == 2 }?.unsynced == two)
            // A whole-row save writes the row's own value: the outcome of a transfer clears it.
            var ended = read
            ended.state = .queued
            ended.unsynced = nil
            try await reopened.save(ended)
            #expect(try await reopened.fetch(1)?.unsynced == nil)
            var kept = try #require(try await reopened.fetch(2))
            kept.priority = 5
            try await reopened.save(kept)
            #expect(try await reopened.fetch(2)?.unsynced == two)
            // A resume that starts the file over drops it with the offset.
            kept.state = .failed
            kept.error = JobError(code: "checksum_mismatch", message: "x")
            try await reopened.save(kept)
            _ = try await reopened.apply(.resume, to: .ids([2]), now: t0)
            let resumed = try #require(try await reopened.fetch(2))
            #expect(resumed.unsynced == nil)
            #expect(resumed.received == 0)
        }
    }

    /// A save writes one event for each row whose state changed (with its reason and error),
    /// none for a row whose state stayed; events are numbered from 1, in order.
    @Test(arguments: Backend.allCases)
    func saveRecordsStateChanges(_ backend: Backend) async throws {
        try await withStore(backend) { store, _ in
            let jobs = try await store.insert((1...3).map { NewJob(url: "https://e.com/\($0)", path: "/tmp/\($0)") }, now: t0).map(\.job)
            var waiting = jobs[0]
            waiting.state = .waiting
            waiting.waitReason = .retry
            waiting.error = JobError(code: "http_status", message: "503")
            waiting.updatedAt = t0.addingTimeInterval(3)
            var same = jobs[1]
            same.received = 7
            var running = jobs[2]
            running.state = .running
            let delivered = Collected()
            store.setEventSink { delivered.add($0) }
            store.holdEvents()
            let events = try await store.save([waiting, same, running], publish: false)
            #expect(events.map(\.seq) == [4, 5])
            #expect(events.map(\.jobID) == [jobs[0].id, jobs[2].id])
            #expect(
                events[0]
                    == StoredEvent(
                        seq: 4, at: t0.addingTimeInterval(3), kind: .jobState, jobID: jobs[0].id, groupID: nil,
                        state: "waiting", waitReason: .retry, error: JobError(code: "http_status", message: "503")))
            #expect(delivered.events.isEmpty, "publish: false leaves publishing to the caller")
            store.publishEvents(events)
            #expect(delivered.events == events)
            #expect(try await store.events(after: 3) == events)
            #expect(try await store.events(after: 0, limit: 2).map(\.seq) == [1, 2])
            #expect(try await store.lastEventSeq() == 5)
            #expect(try await store.fetch(jobs[1].id)?.received == 7)
            // Published by the store itself after the commit.
            running.state = .completed
            try await store.save(running)
            #expect(delivered.events.last?.state == "completed")
            #expect(delivered.events.last?.seq == 6)
        }
    }

    /// Waiting jobs give the earliest wake-up; reconciliation reads only rows that can have files.
    @Test(arguments: Backend.allCases)
    func wakeUpsAndReconcilePages(_ backend: Backend) async throws {
        try await withStore(backend) { store, _ in
            var jobs = try await store.insert((1...6).map { NewJob(url: "https://e.com/\($0)", path: "/tmp/\($0)") }, now: t0).map(\.job)
            #expect(try await store.nextWakeUp() == nil)
            jobs[0].state = .waiting
            jobs[0].nextAttemptAt = t0.addingTimeInterval(90)
            jobs[1].state = .waiting
            jobs[1].nextAttemptAt = t0.addingTimeInterval(30)
            jobs[2].state = .running
            jobs[3].attempts = 1
            jobs[4].state = .canceled
            try await store.save(jobs)
            #expect(try await store.nextWakeUp() == t0.addingTimeInterval(30))
            #expect(try await store.reconcilePage(afterID: 0, limit: 10).map(\.id) == [3, 4, 5])
            #expect(try await store.reconcilePage(afterID: 3, limit: 1).map(\.id) == [4])
        }
    }
}

final class Collected: @unchecked Sendable {
    private let lock = NSLock()
    private var collected: [StoredEvent] = []
    func add(_ events: [StoredEvent]) { lock.withLock { collected += events } }
    var events: [StoredEvent] { lock.withLock { collected } }
}
