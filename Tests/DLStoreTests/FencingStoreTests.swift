import DLCore
import DLJobTable
import DLStore
import DLStorePostgres
import DLTestSupport
import Foundation
import Synchronization
import Testing

/// The fence of a fleet (issue 36): every attempt at a job has its own epoch, every write of an
/// owner is a compare-and-set on it, commands for a job that another worker runs go to that
/// worker, and no whole-row write moves a lease. On both backends, with the same answers.
@Suite struct FencingStoreTests {
    private func new(_ n: Int, path: String? = nil) -> NewJob {
        NewJob(url: "https://e.com/\(n)", path: path ?? "/tmp/fence/\(n)")
    }

    /// A lease that has already run out, on any table's clock (PostgreSQL judges leases on its
    /// own clock, so a lease is given by its length).
    private let expired: TimeInterval = -1
    /// A lease that no test outlives.
    private let long: TimeInterval = 3600

    private func claim(_ store: any JobTable, _ worker: String, lease: TimeInterval, at: Date = t0) async throws -> Job {
        try #require(
            try await store.claim(limit: 1, worker: worker, leaseUntil: at.addingTimeInterval(lease), excludingHosts: [], now: at).first)
    }

    /// A job whose lease ran out and that its own worker claimed again: the old attempt's
    /// checkpoint, unsynced progress and outcome are all refused (the worker id matches, the
    /// epoch does not), and the renewal names the epoch the worker holds. Item 1 of issue 36:
    /// the engine adopted such an attempt and committed a file that a third worker had cut back.
    @Test(arguments: Backend.allCases)
    func aStaleAttemptOfTheSameWorkerWritesNothing(_ backend: Backend) async throws {
        try await withStore(backend) { store, _ in
            _ = try await store.insert([new(1)], now: t0)
            let first = try await claim(store, "w1", lease: expired)
            #expect(try await store.requeueExpired(now: t0.addingTimeInterval(1)) == [first.id])
            let second = try await claim(store, "w1", lease: long, at: t0.addingTimeInterval(2))
            #expect(second.id == first.id && second.epoch > first.epoch, "a claim gives a new epoch")

            let stale = JobOwner(first, worker: "w1")
            let checkpoint = try await store.checkpoint(
                first.id, received: 900, size: 1000, validators: Validators(), finalURL: nil, now: t0, owner: stale)
            #expect(!checkpoint.written)
            let progress = UnsyncedProgress(bootID: "boot", received: 950, size: 1000, validators: Validators(etag: "\"e\""))
            #expect(
                try await store.recordUnsynced([UnsyncedRecord(id: first.id, epoch: first.epoch, progress: progress)], owner: "w1") == 0)
            var done = first
            done.state = .completed
            done.received = 1000
            done.finishedAt = t0
            #expect(try await store.saveOwned([done], owner: "w1", publish: true).lost == [first.id])
            #expect(try await store.renewLeases(worker: "w1", until: t0.addingTimeInterval(long), now: t0) == [first.id: second.epoch])

            let current = JobOwner(second, worker: "w1")
            #expect(
                try await store.checkpoint(
                    first.id, received: 100, size: 1000, validators: Validators(), finalURL: nil, now: t0, owner: current
                )
                .written)
            let row = try #require(try await store.fetch(first.id))
            #expect(row.state == .running && row.received == 100 && row.unsynced == nil)
        }
    }

    /// Each owned checkpoint names its attempt in the row (`partial_tag`, `worker/epoch`): a
    /// worker later trusts a partial file only when it carries that tag (items 4 and 9 of
    /// issue 36). A stale attempt's refused checkpoint and a whole-row write leave it as it is.
    @Test(arguments: Backend.allCases)
    func theCheckpointNamesTheAttemptWhoseBytesItCounts(_ backend: Backend) async throws {
        try await withStore(backend) { store, _ in
            _ = try await store.insert([new(1)], now: t0)
            let first = try await claim(store, "w1", lease: expired)
            let owner = JobOwner(first, worker: "w1")
            #expect(owner.tag == "w1/\(first.epoch)")
            #expect(
                try await store.checkpoint(
                    first.id, received: 100, size: 1000, validators: Validators(), finalURL: nil, now: t0, owner: owner
                )
                .written)
            #expect(try await store.fetch(first.id)?.partialTag == owner.tag)
            #expect(try await store.requeueExpired(now: t0.addingTimeInterval(1)) == [first.id])
            let second = try await claim(store, "w2", lease: long, at: t0.addingTimeInterval(2))
            #expect(
                try await !store.checkpoint(
                    first.id, received: 200, size: 1000, validators: Validators(), finalURL: nil, now: t0, owner: owner
                )
                .written)
            var row = second
            row.partialTag = "w9/99"
            row.options.maxSpeed = 1000
            try await store.save([row])
            #expect(try await store.fetch(first.id)?.partialTag == owner.tag, "only an owned checkpoint names the attempt")
            let next = JobOwner(second, worker: "w2")
            #expect(
                try await store.checkpoint(
                    first.id, received: 100, size: 1000, validators: Validators(), finalURL: nil, now: t0, owner: next
                )
                .written)
            #expect(try await store.fetch(first.id)?.partialTag == "w2/\(second.epoch)")
        }
    }

    /// An attempt that ends waiting for a retry (or queued again) while a command waits for its
    /// worker never drops the command: its outcome is refused, the row stays the owner's with
    /// the request, and the owner's settling write (paused) goes in. A completion is written
    /// over a pending command: the job is done, nothing is left to stop.
    @Test(arguments: Backend.allCases)
    func anAttemptsEndNeverDropsACommandThatWaitsForIt(_ backend: Backend) async throws {
        try await withStore(backend) { store, _ in
            _ = try await store.insert([new(1), new(2)], now: t0)
            let first = try await claim(store, "w2", lease: long)
            let second = try await claim(store, "w2", lease: long)
            for job in [first, second] {
                #expect(try await store.apply(.pause, to: .ids([job.id]), first: [], owner: "w1", now: t0).requested == 1)
            }
            var retry = first
            retry.state = .waiting
            retry.waitReason = .retry
            retry.nextAttemptAt = t0.addingTimeInterval(5)
            #expect(try await store.saveOwned([retry], owner: "w2", publish: true).lost == [first.id])
            var row = try #require(try await store.fetch(first.id))
            #expect(row.state == .running && row.worker == "w2" && row.stopRequest == .pause)
            var settled = first
            settled.state = .paused
            #expect(try await store.saveOwned([settled], owner: "w2", publish: true).lost.isEmpty)
            row = try #require(try await store.fetch(first.id))
            #expect(row.state == .paused && row.stopRequest == nil)

            var done = second
            done.state = .completed
            done.finishedAt = t0
            #expect(try await store.saveOwned([done], owner: "w2", publish: true).lost.isEmpty)
            #expect(try await store.fetch(second.id)?.state == .completed)
        }
    }

    /// With explicit ids, a job that ended meanwhile (another worker completed it after the
    /// engine's check) makes the whole command fail and change nothing: an answer of `count: 0`
    /// for a job named by id said a pause was done when nothing was (`make fleet-chaos`).
    @Test(arguments: Backend.allCases)
    func aCommandForAJobThatEndedMeanwhileChangesNothing(_ backend: Backend) async throws {
        try await withStore(backend) { store, _ in
            let jobs = try await store.insert([new(1), new(2)], now: t0).map(\.job)
            var done = try await claim(store, "w2", lease: long)
            done.state = .completed
            done.finishedAt = t0
            #expect(try await store.saveOwned([done], owner: "w2", publish: true).lost.isEmpty)
            let other = try #require(jobs.first { $0.id != done.id })
            await #expect(throws: StoreError.refused(id: done.id, state: .completed, verb: "pause")) {
                try await store.apply(.pause, to: .ids([other.id, done.id]), first: [], owner: "w1", now: t0)
            }
            #expect(try await store.fetch(other.id)?.state == .queued, "nothing changed")
            let alone = try await store.apply(.pause, to: .ids([other.id]), first: [], owner: "w1", now: t0)
            #expect(alone.count == 1)
        }
    }

    /// An owner's whole-row writes (its attempt's outcome, a stopped transfer's row in a bulk
    /// command) keep a revision made since its claim (`set_speed`, `change`: `revise`): `make
    /// fleet-chaos` saw a set_speed answered, then undone 7 ms later by the owner's pause.
    @Test(arguments: Backend.allCases)
    func anOwnersWriteKeepsARevisionMadeSinceItsClaim(_ backend: Backend) async throws {
        try await withStore(backend) { store, _ in
            _ = try await store.insert([new(1), new(2)], now: t0)
            let first = try await claim(store, "w2", lease: long)
            let second = try await claim(store, "w2", lease: long)
            var options = JobOptions()
            options.maxSpeed = 1000
            for job in [first, second] {
                _ = try await store.revise(job.id, JobRevision(url: job.url + "?v=2", options: options), expecting: nil, now: t0)
            }
            var paused = first
            paused.state = .paused
            #expect(try await store.saveOwned([paused], owner: "w2", publish: true).lost.isEmpty)
            var row = try #require(try await store.fetch(first.id))
            #expect(row.state == .paused && row.options.maxSpeed == 1000 && row.url == first.url + "?v=2")
            _ = try await store.apply(.pause, to: .ids([second.id]), first: [second], owner: "w2", now: t0)
            row = try #require(try await store.fetch(second.id))
            #expect(row.state == .paused && row.options.maxSpeed == 1000 && row.url == second.url + "?v=2")
        }
    }

    /// A row read at its claim and written whole later (`set_speed` and `change` did that, as
    /// did any owned write of a row that stays running) keeps the lease the table holds, and
    /// its worker: item 2 of issue 36, where the lease went back into the past and another
    /// worker requeued a job that still ran.
    @Test(arguments: Backend.allCases)
    func aWholeRowWriteNeverMovesTheLease(_ backend: Backend) async throws {
        try await withStore(backend) { store, _ in
            _ = try await store.insert([new(1)], now: t0)
            let claimed = try await claim(store, "w1", lease: 30)
            _ = try await store.renewLeases(worker: "w1", until: t0.addingTimeInterval(long), now: t0)
            let renewed = try #require(try await store.fetch(claimed.id)?.leaseUntil)
            var row = claimed
            row.options.maxSpeed = 1000
            try await store.save([row])
            let saved = try #require(try await store.fetch(claimed.id))
            #expect(saved.leaseUntil == renewed && saved.worker == "w1" && saved.state == .running)
            #expect(saved.options.maxSpeed == 1000)
            _ = try await store.saveOwned([row], owner: "w1", publish: true)
            #expect(try await store.fetch(claimed.id)?.leaseUntil == renewed)
            // A revision writes only what it changes, and a compare-and-set one moves the epoch.
            let revised = try #require(
                try await store.revise(claimed.id, JobRevision(headers: [HeaderField(name: "X", value: "1")]), expecting: nil, now: t0))
            #expect(revised.epoch == claimed.epoch && revised.leaseUntil == renewed)
            #expect(
                try await store.revise(claimed.id, JobRevision(url: "https://e.com/x"), expecting: (.queued, claimed.epoch), now: t0) == nil
            )
            let moved = try #require(
                try await store.revise(claimed.id, JobRevision(url: "https://e.com/x"), expecting: (.running, claimed.epoch), now: t0))
            #expect(moved.epoch == claimed.epoch + 1 && moved.url == "https://e.com/x" && moved.state == .running)
            #expect(try await store.fetch(claimed.id)?.headers == [HeaderField(name: "X", value: "1")])
        }
    }

    /// A pause, cancel or remove of a job that another worker runs is that worker's to carry
    /// out: recorded as its request (its state, offset and lease untouched), heard in the
    /// owner's checkpoint, withdrawn by a resume of a pending pause, never weakened, and
    /// carried out when the owner's lease runs out. The stopped transfers' rows a command
    /// writes are written only while they are still the commanding worker's: item 3 of issue
    /// 36, where a stale offset overwrote the real owner's.
    @Test(arguments: Backend.allCases)
    func commandsForAnotherWorkersJobGoToItsOwner(_ backend: Backend) async throws {
        try await withStore(backend) { store, _ in
            let jobs = try await store.insert([new(1), new(2), new(3)], now: t0).map(\.job)
            let owned = try await claim(store, "w2", lease: long)
            let owner = JobOwner(owned, worker: "w2")
            #expect(
                try await store.checkpoint(
                    owned.id, received: 500, size: 1000, validators: Validators(), finalURL: nil, now: t0, owner: owner
                )
                .written)
            // w1's stale idea of the row, as a command of w1 that stopped a transfer would write it.
            var stale = owned
            stale.worker = "w1"
            stale.received = 100
            let paused = try await store.apply(.pause, to: .ids([owned.id]), first: [stale], owner: "w1", now: t0)
            #expect(paused.count == 0 && paused.requested == 1)
            var row = try #require(try await store.fetch(owned.id))
            #expect(row.state == .running && row.worker == "w2" && row.received == 500 && row.stopRequest == .pause)
            #expect(row.epoch == owned.epoch, "a request is no hand-over")
            let heard = try await store.checkpoint(
                owned.id, received: 600, size: 1000, validators: Validators(), finalURL: nil, now: t0, owner: owner)
            #expect(heard.written && heard.stopRequest == .pause)

            _ = try await store.apply(.resume, to: .ids([owned.id]), first: [], owner: "w1", now: t0)
            #expect(try await store.fetch(owned.id)?.stopRequest == nil, "a resume withdraws a pending pause")
            #expect(try await store.apply(.cancel, to: .ids([owned.id]), first: [], owner: "w1", now: t0).requested == 1)
            _ = try await store.apply(.pause, to: .ids([owned.id]), first: [], owner: "w1", now: t0)
            #expect(try await store.fetch(owned.id)?.stopRequest == .cancel, "a pause does not weaken a cancel")
            // The same command from the owner itself changes the row at once.
            let ownCancel = try await store.apply(.cancel, to: .ids([owned.id]), first: [], owner: "w2", now: t0)
            #expect(ownCancel.count == 1 && ownCancel.requested == 0)
            row = try #require(try await store.fetch(owned.id))
            #expect(row.state == .canceled && row.stopRequest == nil && row.worker == nil)

            // An owner that died: its requests are carried out when its lease runs out.
            let pausedLater = try await claim(store, "w3", lease: expired)
            let removedLater = try await claim(store, "w3", lease: expired)
            try #require(Set([pausedLater.id, removedLater.id]) == Set([jobs[1].id, jobs[2].id]))
            _ = try await store.checkpoint(
                removedLater.id, received: 10, size: 1000, validators: Validators(), finalURL: nil, now: t0,
                owner: JobOwner(removedLater, worker: "w3"))
            #expect(try await store.apply(.pause, to: .ids([pausedLater.id]), first: [], owner: "w1", now: t0).requested == 1)
            #expect(try await store.delete(.ids([removedLater.id]), deleteFiles: false, owner: "w1", now: t0).requested == 1)
            #expect(try await store.fetch(removedLater.id)?.stopRequest == .remove)
            let expiredOutcome = try await store.expireLeases(now: t0.addingTimeInterval(1))
            #expect(expiredOutcome.ids == [pausedLater.id, removedLater.id].sorted())
            #expect(expiredOutcome.files == ["/tmp/fence/\(removedLater.id).part"])
            let afterPause = try #require(try await store.fetch(pausedLater.id))
            #expect(afterPause.state == .paused && afterPause.epoch > pausedLater.epoch && afterPause.worker == nil)
            #expect(try await store.fetch(removedLater.id) == nil)
        }
    }

    /// A bulk command over more rows than the events kept prunes none of its own events:
    /// every other daemon's follower needs consecutive numbers (item 8 of issue 36: it waited
    /// for the pruned ones for good).
    @Test(arguments: Backend.allCases)
    func aBulkCommandNeverPrunesItsOwnEvents(_ backend: Backend) async throws {
        try await withStore(backend) { store, _ in
            let count = Int(EventLog.kept) + 50
            _ = try await store.insert((1...count).map { new($0) }, now: t0)
            let before = try await store.lastEventSeq()
            let paused = try await store.apply(.pause, to: .all, now: t0)
            #expect(paused.count == count)
            let events = try await store.events(after: before, limit: count + 10)
            #expect(events.count == count)
            #expect(events.first?.seq == before + 1)
        }
    }

    /// Remove with `delete_file` of a completed job deletes its file, its partial path and its
    /// file again, so that a worker that committed the job but had not linked it yet never
    /// makes the file appear after the answer (item 10 of issue 36); not the partial path
    /// while another unfinished job writes there.
    @Test(arguments: Backend.allCases)
    func removeWithTheFileTakesAPartialPathNoOneElseUses(_ backend: Backend) async throws {
        try await withStore(backend) { store, _ in
            let jobs = try await store.insert([new(1, path: "/tmp/fence/a"), new(2, path: "/tmp/fence/b")], now: t0).map(\.job)
            let done = jobs.map { job -> Job in
                var job = job
                job.state = .completed
                job.attempts = 1
                job.received = 10
                job.finishedAt = t0
                return job
            }
            try await store.save(done)
            // Another job now downloads to b again.
            _ = try await store.insert([new(3, path: "/tmp/fence/b")], now: t0)
            let removed = try await store.delete(.ids(done.map(\.id)), deleteFiles: true, owner: nil, now: t0)
            #expect(removed.count == 2)
            #expect(removed.files == ["/tmp/fence/a", "/tmp/fence/a.part", "/tmp/fence/a", "/tmp/fence/b"])
        }
    }

    /// On PostgreSQL leases are written and judged on the server's clock, whatever the
    /// worker's says (item 6 of issue 36: they were reckoned on each worker's clock plus a
    /// measured skew, which a slow measurement made wrong).
    @Test func leasesAreReckonedOnTheServersClock() async throws {
        try await withStore(.postgres) { store, _ in
            _ = try await store.insert([new(1), new(2)], now: t0)
            // A worker whose clock is an hour ahead gives a lease of 60 s, and one whose clock is
            // an hour behind looks for leases that ran out.
            let ahead = Date().addingTimeInterval(3600)
            let claimed = try await claim(store, "w1", lease: 60, at: ahead)
            let server = try #require(try await store.serverClock())
            let lease = try #require(claimed.leaseUntil)
            #expect(abs(lease.timeIntervalSince(server) - 60) < 10, "\(lease) against the server's \(server)")
            #expect(try await store.requeueExpired(now: Date().addingTimeInterval(7200)).isEmpty)
            let renewed = try await store.renewLeases(worker: "w1", until: ahead.addingTimeInterval(-30), now: ahead)
            #expect(renewed == [claimed.id: claimed.epoch])
            #expect(
                try await store.requeueExpired(now: Date().addingTimeInterval(-7200)) == [claimed.id],
                "a lease renewed into the past ran out")
        }
    }

    /// A remove recorded for a job's owner while the lease turn waits for that row's lock is
    /// carried out, never dropped. The turn deletes the expired rows that wait for a remove,
    /// then queues the rest; a remove committed between the two was read by the second, which
    /// queued the job and cleared the request (fleet chaos seed 359364: a remove answered
    /// `requested`, and the job was canceled later instead of removed).
    @Test func aRemoveRecordedWhileLeasesExpireIsCarriedOut() async throws {
        try await withStore(.postgres) { store, fixture in
            _ = try await store.insert([new(1)], now: t0)
            let claimed = try await claim(store, "w1", lease: expired, at: Date())
            // Another worker's remove holds the row, as its transaction does before it writes.
            let holder = try fixture.session()
            defer { holder.close() }
            holder.send("BEGIN; SELECT id FROM jobs WHERE id = \(claimed.id) FOR UPDATE;")
            // Polls with an await between reads, so that the lease turn's task gets a thread
            // (in `make test` the other suites may hold all but one of them for minutes).
            func poll(_ sql: String, until done: (String) -> Bool) async throws -> String {
                var value = ""
                let deadline = Date().addingTimeInterval(300)
                repeat {
                    value = try fixture.psql(sql).trimmingCharacters(in: .whitespacesAndNewlines)
                    if done(value) { break }
                    try await Task.sleep(for: .milliseconds(20))
                } while Date() < deadline
                return value
            }
            let held = try await poll(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'dld-test-holder' AND state = 'idle in transaction'"
            ) { $0 == "1" }
            #expect(held == "1", "the row was never held")
            let expiring = Task { try await store.expireLeases(now: Date()) }
            let waiting = try await poll(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%lease_until%'"
            ) { $0 != "0" }
            #expect(waiting != "0", "the lease turn never waited for the row")
            holder.send("UPDATE jobs SET stop_request = 'remove' WHERE id = \(claimed.id); COMMIT;")
            _ = try await expiring.value
            let row = try fixture.psql("SELECT state || ':' || coalesce(stop_request, '-') FROM jobs WHERE id = \(claimed.id)")
            #expect(row.trimmingCharacters(in: .whitespacesAndNewlines) == "running:remove", "the remove was dropped: \(row)")
            let next = try await store.expireLeases(now: Date())
            #expect(next.ids == [claimed.id])
            #expect(try fixture.psql("SELECT count(*) FROM jobs").trimmingCharacters(in: .whitespacesAndNewlines) == "0")
        }
    }

    /// A follower that finds events missing before the first it reads (pruned before it got to
    /// them) goes on from there instead of waiting for them for good (item 8 of issue 36).
    @Test func aFollowerPassesOverEventsPrunedBeforeItReadThem() async throws {
        try await withStore(.postgres) { store, fixture in
            let other = try await fixture.open()
            let seen = Mutex<[Int64]>([])
            other.setEventSink { events in seen.withLock { $0 += events.map(\.seq) } }
            _ = try await store.insert([new(1)], now: t0)
            let first = try await store.lastEventSeq()
            // Five numbers pruned before the other daemon read them, then a new event.
            _ = try fixture.psql(
                """
                INSERT INTO events (seq, at, kind, job_id, state) VALUES (\(first + 6), 0, 'job.state', 1, 'queued');
                SELECT pg_notify('dld_events', '');
                """)
            _ = try await store.apply(.pause, to: .all, now: t0)
            let deadline = Date().addingTimeInterval(20)
            while Date() < deadline, !(seen.withLock { $0.contains(first + 7) }) { try await Task.sleep(for: .milliseconds(50)) }
            #expect(seen.withLock { $0 } == [first, first + 6, first + 7])
        }
    }
}
