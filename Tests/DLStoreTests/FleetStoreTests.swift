import DLCore
import DLJobTable
import DLStore
import DLStorePostgres
import Foundation
import Synchronization
import Testing

/// The fleet primitives: claims, leases, ownership of writes, workers. On both backends
/// (SQLite has one daemon, but the same answers), and what only PostgreSQL has: several
/// daemons at once (several stores on one database), notifications and the whole table's
/// events.
@Suite struct FleetStoreTests {
    private func new(_ n: Int, priority: Int = 0, host: String = "e.com") -> NewJob {
        NewJob(url: "https://\(host)/\(n)", path: "/tmp/fleet/\(n)", priority: priority)
    }

    /// A claim takes queued standalone jobs of hosts not excluded, by priority then id, up to
    /// the limit; marks them running as `start` does, with the worker and lease; one event each.
    @Test(arguments: Backend.allCases)
    func claimOrderLimitHostsAndEvents(_ backend: Backend) async throws {
        try await withStore(backend) { store, _ in
            let jobs = try await store.insert(
                [new(1), new(2, priority: 5), new(3, host: "busy.org"), new(4), new(5, priority: 5), new(6)], now: t0
            ).map(\.job)
            _ = try await store.insertGroup(
                name: "g", dir: "/tmp/fleet/g", priority: 9, members: [NewJob(url: "https://e.com/m", path: "/tmp/fleet/g/m")], now: t0)
            _ = try await store.apply(.pause, to: .ids([jobs[5].id]), now: t0)
            let before = try await store.lastEventSeq()
            let at = t0.addingTimeInterval(10)
            let lease = at.addingTimeInterval(30)

            let first = try await store.claim(limit: 3, worker: "w1", leaseUntil: lease, excludingHosts: ["busy.org"], now: at)
            #expect(first.map(\.id) == [jobs[1].id, jobs[4].id, jobs[0].id], "priority first, then id")
            for job in first {
                #expect(job.state == .running)
                #expect(job.worker == "w1")
                try await expectLease(job.leaseUntil, of: 30, at: at, store, backend)
                #expect(job.attempts == 1, "as StateMachine's start")
                #expect(job.updatedAt == at)
            }
            #expect(try await store.fetch(first.map(\.id)) == first, "returned as committed")
            let events = try await store.events(after: before)
            #expect(events.map(\.jobID) == first.map(\.id).sorted().map(Optional.init))
            #expect(events.allSatisfy { $0.state == "running" && $0.kind == .jobState && $0.at == at })

            let rest = try await store.claim(limit: 10, worker: "w1", leaseUntil: lease, excludingHosts: ["busy.org"], now: at)
            #expect(rest.map(\.id) == [jobs[3].id], "not the excluded host, the paused job, or the group member")
            let busy = try await store.claim(limit: 10, worker: "w2", leaseUntil: lease, excludingHosts: [], now: at)
            #expect(busy.map(\.id) == [jobs[2].id])
            #expect(try await store.claim(limit: 10, worker: "w2", leaseUntil: lease, excludingHosts: [], now: at).isEmpty)
        }
    }

    /// A turn reads the next queued standalone jobs (`ready`) after its claim, none while an
    /// open group waits for a slot, and the next members of groups that hold slots; a later turn claims the ones started from them only while
    /// they are still queued, before its rows, and names the others lost. PostgreSQL, whose
    /// queue is shared, gives no ready jobs.
    @Test(arguments: Backend.allCases)
    func turnReadsReadyJobsAndClaimsThoseStarted(_ backend: Backend) async throws {
        try await withStore(backend) { store, _ in
            let jobs = try await store.insert((1...6).map { new($0, priority: $0 == 4 ? 5 : 0) }, now: t0).map(\.job)
            func claim(free: Int, started: [JobID] = [], ready: Int) -> TurnClaim {
                var claim = TurnClaim(
                    free: free, limit: free, excludingGroups: [], excludingHosts: [], worker: "w", leaseUntil: t0.addingTimeInterval(60),
                    now: t0.addingTimeInterval(1))
                claim.started = started
                claim.ready = ready
                return claim
            }
            let first = try await store.turn(saves: [], owned: [], owner: "w", claim: claim(free: 1, ready: 3))
            #expect(first.claimed.map(\.id) == [jobs[3].id], "priority first")
            guard backend == .sqlite else {
                #expect(first.ready.isEmpty)
                let lost = try await store.turn(saves: [], owned: [], owner: "w", claim: claim(free: 0, started: [jobs[0].id], ready: 3))
                #expect(lost.startedLost == [jobs[0].id], "nothing is ever started from a shared queue's ready jobs")
                return
            }
            #expect(first.ready.map(\.id) == [jobs[0].id, jobs[1].id, jobs[2].id], "after the claim, in the queue's order")
            #expect(first.ready.allSatisfy { $0.state == .queued })

            // Job 1 was started from the list, job 2 was paused meanwhile; job 1's transfer has
            // already ended (its outcome is among the rows, owned).
            _ = try await store.apply(.pause, to: .ids([jobs[1].id]), now: t0)
            var done = try StateMachine.apply(.start, to: jobs[0], now: t0.addingTimeInterval(1))
            // What a start from the list holds (`Scheduling.handOff`): the worker, and the epoch
            // its claim will give.
            done.worker = "w"
            done.epoch += 1
            done = try StateMachine.apply(.fail(JobError(code: "http_404", message: "gone")), to: done, now: t0.addingTimeInterval(2))
            let before = try await store.lastEventSeq()
            let second = try await store.turn(
                saves: [done], owned: [done.id], owner: "w", claim: claim(free: 0, started: [jobs[0].id, jobs[1].id], ready: 2))
            #expect(second.startedLost == [jobs[1].id])
            #expect(second.lost.isEmpty, "the started job was claimed before its outcome was written")
            let rows = try await store.fetch([jobs[0].id, jobs[1].id])
            #expect(rows[0].state == .failed && rows[0].attempts == 1)
            #expect(rows[1].state == .paused && rows[1].attempts == 0)
            let events = try await store.events(after: before)
            #expect(events.map(\.state) == ["running", "failed"])
            #expect(second.ready.map(\.id) == [jobs[2].id, jobs[4].id])

            // An open group waiting for a slot may come first: no ready jobs then.
            let (group, groupMembers) = try await store.insertGroup(
                name: "g", dir: "/tmp/fleet/g", priority: 0,
                members: (1...3).map { NewJob(url: "https://e.com/m\($0)", path: "/tmp/fleet/g/m\($0)") }, now: t0)
            let third = try await store.turn(saves: [], owned: [], owner: "w", claim: claim(free: 0, ready: 3))
            #expect(third.ready.isEmpty)
            #expect(third.readyMembers.isEmpty, "the group holds no slot")

            // A group that holds a slot: its next queued members, by id.
            var members = claim(free: 0, ready: 0)
            members.excludingGroups = [group.id]
            members.readyMembers = 2
            let fourth = try await store.turn(saves: [], owned: [], owner: "w", claim: members)
            #expect(fourth.readyMembers[group.id]?.map(\.id) == Array(groupMembers.map(\.id).sorted().prefix(2)))
        }
    }

    /// A turn given the end of the last ready read (`readyAfter`) reads only the jobs after it
    /// while nothing but claims changed the queue, and the whole list again after any other
    /// change: a job queued ahead of it, one paused, a parked outcome queued again, a new
    /// priority. A claim for free slots reads its share in one step (no group waits here).
    @Test func aTurnContinuesItsReadyListUntilTheQueueChanges() async throws {
        try await withStore(.sqlite) { store, _ in
            let jobs = try await store.insert((1...12).map { new($0) }, now: t0).map(\.job)
            func claim(free: Int = 0, started: [JobID] = [], ready: Int = 4, after: ReadyCursor? = nil) -> TurnClaim {
                var claim = TurnClaim(
                    free: free, limit: free, excludingGroups: [], excludingHosts: [], worker: "w", leaseUntil: t0.addingTimeInterval(60),
                    now: t0.addingTimeInterval(1))
                claim.started = started
                claim.ready = ready
                claim.readyAfter = after
                return claim
            }
            func cursor(_ outcome: TurnOutcome, rows: Int) throws -> ReadyCursor {
                let last = try #require(outcome.ready.last)
                return ReadyCursor(priority: last.priority, id: last.id, version: try #require(outcome.readyVersion), rows: rows)
            }
            let ids = jobs.map(\.id)
            let first = try await store.turn(saves: [], owned: [], owner: "w", claim: claim())
            #expect(first.ready.map(\.id) == Array(ids[0..<4]))
            #expect(!first.readyContinued)

            // Two of them started from the list and claimed: only the next two are read.
            let second = try await store.turn(
                saves: [], owned: [], owner: "w", claim: claim(started: [ids[0], ids[1]], after: try cursor(first, rows: 2)))
            #expect(second.readyContinued)
            #expect(second.ready.map(\.id) == Array(ids[4..<6]))
            #expect(second.readyVersion == first.readyVersion, "claims do not count as changes")

            // A claim for free slots takes jobs 3 and 4 (the list's head): the list continues,
            // with as many more as the claim took.
            let third = try await store.turn(saves: [], owned: [], owner: "w", claim: claim(free: 2, after: try cursor(second, rows: 0)))
            #expect(third.claimed.map(\.id) == [ids[2], ids[3]])
            #expect(third.standaloneSlots == 2)
            #expect(third.readyContinued)
            #expect(third.ready.map(\.id) == Array(ids[6..<8]))
            #expect(third.readyVersion == first.readyVersion)
            #expect(
                try await store.turn(saves: [], owned: [], owner: "w", claim: claim(free: 40)).standaloneSlots == 8, "all that is queued")

            // A job queued ahead: read whole again, the new one first.
            let base = try await store.turn(saves: [], owned: [], owner: "w", claim: claim())
            #expect(base.ready.isEmpty)
            let urgent = try await store.insert([new(99, priority: 9)] + (13...14).map { new($0) }, now: t0).map(\.job)
            let fourth = try await store.turn(saves: [], owned: [], owner: "w", claim: claim())
            #expect(fourth.ready.map(\.id) == urgent.map(\.id))
            let unchanged = try await store.turn(saves: [], owned: [], owner: "w", claim: claim(after: try cursor(fourth, rows: 4)))
            #expect(unchanged.readyContinued && unchanged.ready.isEmpty, "nothing after the last")

            // A queued job paused: a change.
            _ = try await store.apply(.pause, to: .ids([urgent[1].id]), now: t0)
            let fifth = try await store.turn(saves: [], owned: [], owner: "w", claim: claim(after: try cursor(fourth, rows: 4)))
            #expect(!fifth.readyContinued)
            #expect(fifth.ready.map(\.id) == [urgent[0].id, urgent[2].id])

            // A turn's own row queued again (a parked transfer): a change too.
            var parked = try await store.claim(limit: 1, worker: "w", leaseUntil: t0.addingTimeInterval(60), excludingHosts: [], now: t0)
            #expect(parked.map(\.id) == [urgent[0].id])
            parked[0].state = .queued
            let sixth = try await store.turn(
                saves: parked, owned: [parked[0].id], owner: "w", claim: claim(after: try cursor(fifth, rows: 4)))
            #expect(!sixth.readyContinued)
            #expect(sixth.ready.map(\.id) == [urgent[0].id, urgent[2].id])
        }
    }

    /// The jobs completed since a moment, newest first, at most the limit: what a worker looks
    /// at for files that a dead worker recorded but did not link.
    @Test(arguments: Backend.allCases)
    func completedSinceIsNewestFirstAndBounded(_ backend: Backend) async throws {
        try await withStore(backend) { store, _ in
            _ = try await store.insert((1...4).map { new($0) }, now: t0)
            let running = try await store.claim(limit: 4, worker: "w", leaseUntil: t0.addingTimeInterval(30), excludingHosts: [], now: t0)
            try #require(running.count == 4)
            // Jobs 1, 2 and 3 complete at t0 + 10, 20 and 30; job 4 stays running.
            let done = try running.prefix(3).enumerated().map { n, job in
                try StateMachine.apply(.complete, to: job, now: t0.addingTimeInterval(Double(n + 1) * 10))
            }
            _ = try await store.saveOwned(done, owner: "w", publish: true)
            let recent = try await store.completed(since: t0.addingTimeInterval(20), limit: 10)
            #expect(recent.map(\.id) == [running[2].id, running[1].id])
            #expect(try await store.completed(since: t0, limit: 1).map(\.id) == [running[2].id])
        }
    }

    /// While a host is excluded, a claim looks only at the first `claimWindow` queued jobs: a
    /// job of another host beyond them waits, one within them is taken.
    @Test(arguments: Backend.allCases)
    func claimWithExcludedHostsLooksAtABoundedWindow(_ backend: Backend) async throws {
        try await withStore(backend) { store, _ in
            let window = SQLiteJobStore.claimWindow
            _ = try await store.insert((1...window).map { new($0, host: "busy.org") } + [new(window + 1)], now: t0)
            let lease = t0.addingTimeInterval(30)
            #expect(try await store.claim(limit: 5, worker: "w", leaseUntil: lease, excludingHosts: ["busy.org"], now: t0).isEmpty)
            let one = try await store.claim(limit: 1, worker: "w", leaseUntil: lease, excludingHosts: [], now: t0)
            #expect(one.map(\.id) == [1])
            let other = try await store.claim(limit: 5, worker: "w", leaseUntil: lease, excludingHosts: ["busy.org"], now: t0)
            #expect(other.map(\.id) == [JobID(window + 1)], "one busy job left the window")
        }
    }

    /// Renewal extends only this worker's running jobs, says which they are (not one paused by
    /// another daemon, nor another worker's), and records the heartbeat.
    @Test(arguments: Backend.allCases)
    func renewReturnsOnlyOwnedRunningJobs(_ backend: Backend) async throws {
        try await withStore(backend) { a, fixture in
            let b = try await fixture.open()
            _ = try await a.insert((1...4).map { new($0) }, now: t0)
            let mine = try await a.claim(limit: 3, worker: "w1", leaseUntil: t0.addingTimeInterval(30), excludingHosts: [], now: t0)
            let theirs = try await b.claim(limit: 3, worker: "w2", leaseUntil: t0.addingTimeInterval(30), excludingHosts: [], now: t0)
            try #require(mine.count == 3 && theirs.count == 1)
            _ = try await b.apply(.pause, to: .ids([mine[0].id]), now: t0.addingTimeInterval(1))
            #expect(try await a.fetch(mine[0].id)?.worker == nil, "a paused job has no worker")

            let later = t0.addingTimeInterval(60)
            let theirLease = try await a.fetch(theirs[0].id)?.leaseUntil
            let owned = try await a.renewLeases(worker: "w1", until: later, now: t0.addingTimeInterval(20))
            #expect(owned == [mine[1].id: mine[1].epoch, mine[2].id: mine[2].epoch])
            try await expectLease(try await a.fetch(mine[1].id)?.leaseUntil, of: 40, at: t0.addingTimeInterval(20), a, backend)
            #expect(try await a.fetch(theirs[0].id)?.leaseUntil == theirLease, "another worker's lease stays")
            #expect(try await a.workers(seenSince: t0).map(\.id) == ["w1"])
            _ = try await b.renewLeases(worker: "w2", until: later, now: t0.addingTimeInterval(25))
            let workers = try await b.workers(seenSince: t0.addingTimeInterval(21))
            #expect(workers.map(\.id) == ["w2"])
            #expect(workers.first?.seenAt == t0.addingTimeInterval(25))
        }
    }

    /// Jobs whose lease has passed go back to the queue with their offset, one event each;
    /// the next claim is another attempt.
    @Test(arguments: Backend.allCases)
    func expiredLeasesAreRequeued(_ backend: Backend) async throws {
        try await withStore(backend) { store, _ in
            _ = try await store.insert((1...3).map { new($0) }, now: t0)
            // Leases by their length (PostgreSQL reckons them on its own clock): w1's have run
            // out, w2's has not.
            let short = try await store.claim(limit: 2, worker: "w1", leaseUntil: t0.addingTimeInterval(-1), excludingHosts: [], now: t0)
            let long = try await store.claim(limit: 1, worker: "w2", leaseUntil: t0.addingTimeInterval(3600), excludingHosts: [], now: t0)
            try #require(short.count == 2 && long.count == 1)
            #expect(
                try await store.checkpoint(
                    short[0].id, received: 500, size: 1000, validators: Validators(), finalURL: nil,
                    now: t0.addingTimeInterval(5), owner: JobOwner(short[0], worker: "w1")
                ).written)
            let before = try await store.lastEventSeq()
            let requeued = try await store.requeueExpired(now: t0.addingTimeInterval(31))
            #expect(requeued == short.map(\.id).sorted())
            for id in requeued {
                let job = try #require(try await store.fetch(id))
                #expect(job.state == .queued)
                #expect(job.worker == nil && job.leaseUntil == nil)
            }
            #expect(try await store.fetch(short[0].id)?.received == 500, "the committed offset is kept")
            #expect(try await store.fetch(long[0].id)?.state == .running)
            let events = try await store.events(after: before)
            #expect(events.map(\.jobID) == requeued.map(Optional.init))
            #expect(events.allSatisfy { $0.state == "queued" })
            let again = try await store.claim(
                limit: 5, worker: "w3", leaseUntil: t0.addingTimeInterval(99), excludingHosts: [], now: t0.addingTimeInterval(32))
            #expect(again.map(\.id) == short.map(\.id))
            #expect(again.allSatisfy { $0.attempts == 2 && $0.worker == "w3" })
        }
    }

    /// A worker whose job was taken over never writes over the new owner's row: its outcome
    /// and its checkpoints are refused and reported; the owner's are written, and a row that
    /// leaves running loses its worker.
    @Test(arguments: Backend.allCases)
    func savesOfALostJobAreRefused(_ backend: Backend) async throws {
        try await withStore(backend) { store, _ in
            let jobs = try await store.insert((1...2).map { new($0) }, now: t0).map(\.job)
            let old = try await store.claim(limit: 2, worker: "w1", leaseUntil: t0.addingTimeInterval(-1), excludingHosts: [], now: t0)
            _ = try await store.requeueExpired(now: t0.addingTimeInterval(31))
            let taken = try await store.claim(
                limit: 1, worker: "w2", leaseUntil: t0.addingTimeInterval(90), excludingHosts: [], now: t0.addingTimeInterval(32))
            try #require(taken.map(\.id) == [jobs[0].id])

            // w1 finishes both late: one is w2's now, the other queued (no one's).
            let done = old.map { job -> Job in
                var job = job
                job.state = .completed
                job.received = 1000
                job.finishedAt = t0.addingTimeInterval(33)
                job.updatedAt = t0.addingTimeInterval(33)
                return job
            }
            let before = try await store.lastEventSeq()
            let refused = try await store.saveOwned(done, owner: "w1", publish: true)
            #expect(refused.lost == Set(jobs.map(\.id)))
            #expect(refused.events.isEmpty)
            #expect(try await store.lastEventSeq() == before)
            #expect(try await store.fetch(jobs[0].id) == taken[0], "the new owner's row is untouched")
            #expect(try await store.fetch(jobs[1].id)?.state == .queued)
            #expect(
                !(try await store.checkpoint(
                    jobs[0].id, received: 999, size: nil, validators: Validators(), finalURL: nil,
                    now: t0.addingTimeInterval(34), owner: JobOwner(old[0], worker: "w1")
                ).written))
            #expect(try await store.fetch(jobs[0].id)?.received == 0)

            #expect(
                try await store.checkpoint(
                    jobs[0].id, received: 400, size: 1000, validators: Validators(), finalURL: nil,
                    now: t0.addingTimeInterval(34), owner: JobOwner(taken[0], worker: "w2")
                ).written)
            var finished = try #require(try await store.fetch(jobs[0].id))
            finished.state = .completed
            finished.received = 1000
            finished.updatedAt = t0.addingTimeInterval(35)
            let saved = try await store.saveOwned([finished], owner: "w2", publish: true)
            #expect(saved.lost.isEmpty)
            #expect(saved.events.map(\.state) == ["completed"])
            let row = try #require(try await store.fetch(jobs[0].id))
            #expect(row.state == .completed && row.received == 1000)
            #expect(row.worker == nil && row.leaseUntil == nil, "a row that leaves running has no worker")
        }
    }

    /// A clean stop gives the worker's running jobs back to the queue, and only its own.
    @Test(arguments: Backend.allCases)
    func releaseOnStop(_ backend: Backend) async throws {
        try await withStore(backend) { store, _ in
            _ = try await store.insert((1...3).map { new($0) }, now: t0)
            let mine = try await store.claim(limit: 2, worker: "w1", leaseUntil: t0.addingTimeInterval(30), excludingHosts: [], now: t0)
            let theirs = try await store.claim(limit: 1, worker: "w2", leaseUntil: t0.addingTimeInterval(30), excludingHosts: [], now: t0)
            try #require(mine.count == 2 && theirs.count == 1)
            let before = try await store.lastEventSeq()
            let released = try await store.releaseJobs(worker: "w1", now: t0.addingTimeInterval(5))
            #expect(released == mine.map(\.id).sorted())
            #expect(try await store.fetch(released).allSatisfy { $0.state == .queued && $0.worker == nil && $0.leaseUntil == nil })
            #expect(try await store.fetch(theirs.map(\.id)).map(\.state) == [.running])
            #expect(try await store.events(after: before).map(\.jobID) == released.map(Optional.init))
        }
    }

    /// Two daemons claiming at once, over and over, never get the same job, and together
    /// claim every one.
    @Test func concurrentClaimsNeverOverlap() async throws {
        let fixture = try StoreFixture(.postgres)
        let a = try await fixture.open()
        let b = try await fixture.open()
        let count = 300
        let ids = try await a.insert((0..<count).map { new($0) }, now: t0).map(\.job.id)
        // Each worker's first claim is made before either goes on (a barrier): the rest of the
        // claims run while both hold rows, whatever the machine's speed.
        let barrier = Barrier(parties: 2)
        let claimed = try await withThrowingTaskGroup(of: (String, [JobID]).self) { group in
            for (worker, store) in [("w1", a), ("w2", b)] {
                group.addTask {
                    var mine = try await store.claim(
                        limit: 3, worker: worker, leaseUntil: t0.addingTimeInterval(30), excludingHosts: [], now: t0
                    ).map(\.id)
                    await barrier.arrive()
                    while true {
                        let jobs = try await store.claim(
                            limit: 3, worker: worker, leaseUntil: t0.addingTimeInterval(30), excludingHosts: [], now: t0)
                        if jobs.isEmpty { return (worker, mine) }
                        mine += jobs.map(\.id)
                    }
                }
            }
            var all: [String: [JobID]] = [:]
            for try await (worker, mine) in group { all[worker] = mine }
            return all
        }
        let first = Set(claimed["w1"] ?? [])
        let second = Set(claimed["w2"] ?? [])
        #expect(first.count == claimed["w1"]?.count && second.count == claimed["w2"]?.count, "no job twice to one worker")
        #expect(first.isDisjoint(with: second), "no job to both workers")
        #expect(first.union(second) == Set(ids), "every job claimed")
        #expect(first.count >= 3 && second.count >= 3, "both claimed before the race")
        let rows = try await a.list()
        #expect(rows.allSatisfy { $0.state == .running && $0.attempts == 1 })
        #expect(Set(rows.filter { $0.worker == "w1" }.map(\.id)) == first)
        await fixture.finish()
    }

    /// A pause by one daemon reaches another's `changes()` (NOTIFY dld_jobs).
    @Test func aPauseElsewhereIsSignalled() async throws {
        let fixture = try StoreFixture(.postgres)
        let a = try await fixture.open()
        let job = try #require(try await a.insert([new(1)], now: t0).first?.job)
        _ = try await a.claim(limit: 1, worker: "w2", leaseUntil: t0.addingTimeInterval(30), excludingHosts: [], now: t0)
        // b opens after every earlier commit: what its stream yields comes from its listener
        // connecting (once) and from what is committed after.
        let b = try await fixture.open()
        let signals = Counter()
        let stream = b.changes()
        let watcher = Task {
            for await _ in stream { signals.add(1) }
        }
        try await within(.seconds(30)) {
            while signals.value < 1 { try await Task.sleep(for: .milliseconds(10)) }
        }
        _ = try await a.apply(.pause, to: .ids([job.id]), now: t0)
        try await within(.seconds(30)) {
            while signals.value < 2 { try await Task.sleep(for: .milliseconds(10)) }
        }
        #expect(try await b.fetch(job.id)?.state == .paused)
        #expect(try await b.renewLeases(worker: "w2", until: t0.addingTimeInterval(60), now: t0).isEmpty, "b stops that transfer")
        await fixture.finish()
        await watcher.value
    }

    /// A daemon's event sink receives every committed event of the table, other daemons'
    /// included, in `seq` order, each once.
    @Test func theSinkFollowsTheWholeTable() async throws {
        let fixture = try StoreFixture(.postgres)
        let a = try await fixture.open()
        let b = try await fixture.open()
        let start = try await b.lastEventSeq()
        let delivered = Collected()
        b.setEventSink { delivered.add($0) }
        try await withThrowingTaskGroup(of: Void.self) { group in
            for (n, store) in [a, b].enumerated() {
                group.addTask {
                    for round in 0..<20 {
                        let jobs = try await store.insert((0..<3).map { self.new(n * 1000 + round * 10 + $0) }, now: t0).map(\.job)
                        _ = try await store.apply(.pause, to: .ids(jobs.map(\.id)), now: t0)
                        var resumed = jobs
                        for index in resumed.indices { resumed[index].state = .queued }
                        try await store.save(resumed)
                    }
                }
            }
            try await group.waitForAll()
        }
        let last = try await a.lastEventSeq()
        #expect(last - start == 2 * 20 * 9)
        try await within(.seconds(30)) {
            while delivered.events.last?.seq ?? 0 < last { try await Task.sleep(for: .milliseconds(20)) }
        }
        #expect(delivered.events.map(\.seq) == Array((start + 1)...last), "in order, no gap, no duplicate")
        #expect(try await a.events(after: start) == delivered.events, "as committed")
        await fixture.finish()
    }
}

/// `body`, or a failure after `limit`: a guard against a hang, not a timing assertion.
@discardableResult
func within<T: Sendable>(_ limit: Duration, _ body: @escaping @Sendable () async throws -> T) async throws -> T {
    try await withThrowingTaskGroup(of: T?.self) { group in
        group.addTask { try await body() }
        group.addTask {
            try await Task.sleep(for: limit)
            return nil
        }
        defer { group.cancelAll() }
        guard let first = try await group.next(), let value = first else {
            throw TimedOut()
        }
        return value
    }
}

struct TimedOut: Error, CustomStringConvertible {
    var description: String { "nothing came in time" }
}

/// Lets `parties` tasks go on only once all of them have arrived.
actor Barrier {
    private let parties: Int
    private var arrived = 0
    private var waiting: [CheckedContinuation<Void, Never>] = []

    init(parties: Int) { self.parties = parties }

    func arrive() async {
        arrived += 1
        if arrived >= parties {
            for continuation in waiting { continuation.resume() }
            waiting = []
            return
        }
        await withCheckedContinuation { waiting.append($0) }
    }
}

/// A lease `length` seconds long given at `at`: exactly so on SQLite (the engine's clock), and
/// on PostgreSQL that long after the server's now (leases are reckoned on its clock).
func expectLease(_ lease: Date?, of length: TimeInterval, at: Date, _ store: any JobTable, _ backend: Backend) async throws {
    let lease = try #require(lease)
    switch backend {
    case .sqlite:
        #expect(lease == at.addingTimeInterval(length))
    case .postgres:
        let server = try #require(try await store.serverClock())
        #expect(abs(lease.timeIntervalSince(server) - length) < 10, "\(lease) against the server's \(server)")
    }
}
