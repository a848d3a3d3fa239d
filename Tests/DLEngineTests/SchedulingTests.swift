import DLCore
import DLEngine
import Foundation
import Testing

/// A transfer as the scheduler sees it, with the load the test gives it.
struct FakeTransfer: TransferLoad {
    var connections = 1
    var hostConnections: [String: Int]? = nil
    var received: Int64 = 0
}

typealias Book = Scheduling<FakeTransfer, String>

/// A test clock: fixed instants, advanced by hand.
struct SchedulingClock {
    var now = Date(timeIntervalSince1970: 1_800_000_000)
    mutating func advance(_ seconds: TimeInterval) { now = now.addingTimeInterval(seconds) }
}

func queuedJob(_ id: JobID, host: String = "a.example", group: GroupID? = nil, size: Int64? = nil) -> Job {
    let created = SchedulingClock().now
    return Job(
        id: id, url: "http://\(host)/f\(id)", path: "/tmp/f\(id)", state: .queued, size: size,
        createdAt: created, updatedAt: created, groupID: group)
}

extension Book {
    init(maxActive: Int = 3, maxLight: Int = 4, groupParallel: Int = 2, maxPerHost: Int = 6) {
        self.init(
            limits: SchedulingLimits(
                lanes: Lanes(maxActive: maxActive, maxLight: maxLight),
                groupLanes: Lanes(maxActive: groupParallel, maxLight: 0),
                hosts: HostLimits(maxPerHost: maxPerHost)))
    }

    /// Starts `job`'s transfer, as the engine does once its claim is committed or it was
    /// handed off; `long`: it holds its connection for long (bytes past the light lane's).
    @discardableResult
    mutating func run(_ job: Job, long: Bool = false) -> UInt64 {
        let attempt = nextAttempt()
        started(job, transfer: FakeTransfer(received: long ? 64 << 20 : 0), host: URLRules.hostKey(job.url), attempt: attempt)
        return attempt
    }

    mutating func handOff(group: GroupID? = nil, at clock: SchedulingClock) -> Job? {
        handOff(group: group, open: true, worker: "local/dld", lease: 30, now: clock.now)
    }
}

/// The scheduling state machine (`Scheduling`): each invariant of its documentation, with a
/// test clock and no store, socket or transfer.
@Suite struct SchedulingTests {
    /// A turn's read of ready jobs that continues the last one (`readyTopUp`) adds to the list.
    /// A claim for free slots holds the list aside (nothing starts from it meanwhile) and its
    /// turn gives it back without the jobs the claim took; a dropped list, or a store that does
    /// not count queue changes, asks for a whole read again.
    @Test func aContinuedReadAddsToTheReadyList() throws {
        let clock = SchedulingClock()
        var book = Book(maxActive: 3, maxLight: 0)
        #expect(book.readyTopUp() == nil, "nothing read yet")
        book.turnRead(ready: (1...4).map { queuedJob($0) }, members: [:], version: 7)
        let rows = book.limits.readyRows
        var top = try #require(book.readyTopUp())
        #expect(top.id == 4 && top.version == 7 && top.rows == rows - 4, "what fills the list")
        #expect(book.handOff(at: clock)?.id == 1)
        top = try #require(book.readyTopUp())
        #expect(top.id == 4 && top.rows == rows - 3)
        book.turnRead(ready: [queuedJob(5)], members: [:], continued: true, version: 7)
        #expect(book.ready.map(\.id) == [2, 3, 4, 5])
        #expect(book.readyTopUp()?.id == 5)
        // Nothing more after the last: the end stays.
        book.turnRead(ready: [], members: [:], continued: true, version: 7)
        #expect(book.ready.map(\.id) == [2, 3, 4, 5] && book.readyTopUp()?.id == 5)

        // A claim for free slots: held, none handed off; the turn claimed 2 and 3.
        book.claiming(free: 2)
        #expect(book.ready.isEmpty && book.handOff(at: clock) == nil)
        #expect(book.readyTopUp()?.rows == rows - 4, "the held jobs count")
        book.turnRead(ready: [queuedJob(6), queuedJob(7)], members: [:], continued: true, version: 7, claimed: [2, 3])
        #expect(book.ready.map(\.id) == [4, 5, 6, 7])
        // A whole read instead: the held jobs are gone with the old list.
        book.claiming(free: 1)
        book.turnRead(ready: [queuedJob(9)], members: [:], version: 8, claimed: [4])
        #expect(book.ready.map(\.id) == [9] && book.readyTopUp()?.version == 8)

        book.dropReady()
        #expect(book.readyTopUp() == nil)
        book.turnRead(ready: [queuedJob(10)], members: [:])
        #expect(book.ready.map(\.id) == [10] && book.readyTopUp() == nil, "no count, no continuation")
    }

    /// Invariant 1: a section of the queue that is not a turn gets the claims of every job
    /// started early before it may change the queue, and the ready lists are gone: no slot
    /// that frees up afterwards starts a job from a list read before that section.
    @Test func claimsAreCommittedBeforeTheQueueChanges() throws {
        let clock = SchedulingClock()
        var book = Book()
        let first = book.run(queuedJob(1))
        book.run(queuedJob(2))
        book.turnRead(ready: [queuedJob(3), queuedJob(4), queuedJob(5)], members: [:])
        let freed1 = book.ended(1, attempt: first)
        #expect(freed1 == (true, nil))
        let handed1 = book.handOff(at: clock)
        let started = try #require(handed1)
        #expect(started.id == 3 && started.state == .running && started.worker == "local/dld")
        #expect(started.leaseUntil == clock.now.addingTimeInterval(30))
        book.run(started)

        // A turn (the end of transfers) keeps the list and the claims for its own commit.
        let turn = book.beginSection(turn: true)
        #expect(turn.claims.isEmpty && book.ready.map(\.id) == [4, 5])

        // A command: the claim first, and nothing is handed off from the old list.
        let command = book.beginSection(turn: false)
        #expect(command.claims.map(\.id) == [3])
        #expect(book.startedEarly.isEmpty && book.ready.isEmpty)
        let freed2 = book.ended(2, attempt: 2)
        #expect(freed2.free)
        let handed2 = book.handOff(at: clock)
        #expect(handed2 == nil)
        // A list read by a later turn leaves out the jobs that run already.
        book.turnRead(ready: [queuedJob(3), queuedJob(6)], members: [:])
        #expect(book.ready.map(\.id) == [6])
    }

    /// Invariant 2: the slot of a transfer that ended goes to the first ready job that may
    /// start in it; a job whose host is at its limit is passed over, not waited for.
    @Test func aFreedSlotGoesToTheNextReadyJob() throws {
        let clock = SchedulingClock()
        var book = Book(maxLight: 3, maxPerHost: 2)
        let one = book.run(queuedJob(1, host: "a.example"), long: true)
        book.run(queuedJob(2, host: "a.example"), long: true)
        book.run(queuedJob(3, host: "b.example"))
        book.turnRead(
            ready: [queuedJob(4, host: "a.example"), queuedJob(5, host: "b.example"), queuedJob(6, host: "b.example")], members: [:])
        // Every light slot is taken: nothing starts before a transfer ends.
        let handed1 = book.handOff(at: clock)
        #expect(handed1 == nil)
        let freed1 = book.ended(3, attempt: 3)
        #expect(freed1.free)
        // Host a has its two connections held for long: its job is passed over.
        let handed2 = book.handOff(at: clock)
        let next = try #require(handed2)
        #expect(next.id == 5)
        book.run(next)
        // A transfer to a ends: a's job goes first now.
        let freed2 = book.ended(1, attempt: one)
        #expect(freed2.free)
        let handed3 = book.handOff(at: clock)
        #expect(handed3?.id == 4)
        #expect(book.ready.map(\.id) == [6])
        // The outcome recorded: the slot is gone; a stale outcome finds nothing.
        let settled1 = book.settle(1, attempt: one)
        #expect(settled1?.job.id == 1)
        let settled2 = book.settle(1, attempt: one)
        #expect(settled2 == nil)
    }

    /// Invariant 3: over a long random run of ends, hand-offs, answers that tell sizes and
    /// lists read again, no start takes more than the light lane's slots, a bulk slot that is
    /// not free, more than a group's places, or more than a host's limit. The host's limit is
    /// judged here by the book's own count of fake transfers; the connections that really
    /// reach a host (ranges and mirror hosts included) are counted by the servers themselves
    /// in HostLimitTests.
    @Test(arguments: [1, 2, 3, 4, 5]) func limitsHoldForEveryStart(seed: UInt64) {
        var random = SeededRandom(seed: seed)
        let clock = SchedulingClock()
        var book = Book(maxActive: 2, maxLight: 5, groupParallel: 2, maxPerHost: 2)
        let group: GroupID = 9
        book.activeGroups = [group]
        let hosts = ["a.example", "b.example", "c.example"]
        var nextID: JobID = 1
        var starts = 0
        func fresh(group: GroupID? = nil) -> Job {
            defer { nextID += 1 }
            let size: Int64? = random.next() % 3 == 0 ? 64 << 20 : (random.next() % 2 == 0 ? 4096 : nil)
            return queuedJob(nextID, host: hosts[Int(random.next() % 3)], group: group, size: size)
        }
        /// A hand-off, checked against the host's limit as it was when the slot was given.
        func start(group: GroupID?) {
            let long = book.hostLongLoad()
            let load = book.hostLoad(excludingEnded: true)
            guard let job = book.handOff(group: group, at: clock) else { return }
            let host = URLRules.hostKey(job.url)
            #expect(load[host, default: 0] < book.hostStartLimit(host, long: long), "\(host) had \(load[host, default: 0])")
            book.run(job)
            starts += 1
        }
        for _ in 0..<2000 {
            switch random.next() % 5 {
            case 0:
                book.turnRead(ready: (0..<8).map { _ in fresh() }, members: [group: (0..<4).map { _ in fresh(group: group) }])
            case 1:
                // A transfer ends; its slot is handed off at once.
                let live = book.running.values.filter { !$0.ended }.sorted { $0.job.id < $1.job.id }
                if !live.isEmpty {
                    let slot = live[Int(random.next() % UInt64(live.count))]
                    let freed = book.ended(slot.job.id, attempt: slot.attempt)
                    if freed.free { start(group: freed.group) }
                }
            case 2:
                // The next turn records the outcomes.
                for slot in book.running.values where slot.ended { _ = book.settle(slot.job.id, attempt: slot.attempt) }
            case 3:
                // An answer tells a running transfer's size.
                let light = book.running.values.filter { !$0.ended && !$0.bulk }.sorted { $0.job.id < $1.job.id }
                if let slot = light.first {
                    let remaining: Int64 = random.next() % 2 == 0 ? 64 << 20 : 1000
                    if book.admit(slot.job.id, attempt: slot.attempt, remaining: remaining, received: 0) == .park {
                        _ = book.settle(slot.job.id, attempt: slot.attempt)
                    }
                }
            default:
                start(group: nil)
                start(group: group)
            }
            let lanes = book.limits.lanes
            #expect(book.lightTaken(excludingEnded: true) <= lanes.maxLight)
            #expect(book.bulkTaken(excludingEnded: true) <= lanes.maxActive)
            #expect(book.busy(group: group, excludingEnded: true) <= book.limits.groupLanes.maxActive)
        }
        #expect(starts > 100)
    }

    /// Invariant 4: a turn that failed before its commit loses exactly its rows; the jobs it
    /// had claimed start; the claims of early starts wait for their own commit.
    @Test func aFailedTurnDropsExactlyItsUncommittedRows() throws {
        let clock = SchedulingClock()
        var book = Book()
        book.turnRead(ready: [queuedJob(7)], members: [:])
        let handed = book.handOff(at: clock)
        let early = try #require(handed)
        book.run(early)
        book.pending.saves = [queuedJob(1), queuedJob(2)]
        book.pending.owned = [1]
        book.pending.launches = [queuedJob(3)]
        book.pending.notices = ["job 2 failed"]
        book.pending.claimFree = 2
        let start = book.beginSection(turn: true)
        #expect(start.droppedRows == 2)
        #expect(start.launches.map(\.id) == [3])
        #expect(start.claims.isEmpty && book.startedEarly.map(\.id) == [7])
        #expect(book.pending.saves.isEmpty && book.pending.owned.isEmpty && book.pending.notices.isEmpty)
        #expect(book.pending.launches.isEmpty && book.pending.claimFree == nil)
        // Nothing left over: the next section drops nothing.
        let next = book.beginSection(turn: false)
        #expect(next.droppedRows == 0 && next.launches.isEmpty && next.claims.map(\.id) == [7])
    }

    /// A claim that found nothing while ready jobs could not start pauses the next claims for
    /// `blockedClaimPause` on the clock; then a turn claims again, and the claim counts the
    /// ready list's slots free (the list is gone).
    @Test func aFruitlessClaimPausesTheNextOnesForAWhile() {
        var clock = SchedulingClock()
        var book = Book(maxLight: 4, maxPerHost: 1)
        book.run(queuedJob(1, host: "a.example"), long: true)
        book.turnRead(ready: [queuedJob(2, host: "a.example")], members: [:])
        let handed = book.handOff(at: clock)
        #expect(handed == nil)
        book.claimed(free: 3, found: false, now: clock.now)
        clock.advance(0.05)
        let free1 = book.claimFree(now: clock.now)
        #expect(free1 == nil)
        #expect(book.ready.map(\.id) == [2])
        clock.advance(0.06)
        // Three light slots beside job 1, and the three bulk slots for groups.
        let free2 = book.claimFree(now: clock.now)
        #expect(free2 == 3 + 3)
        #expect(book.ready.isEmpty)
        // A claim that found something: no pause.
        book.claimed(free: 3, found: true, now: clock.now)
        book.turnRead(ready: [queuedJob(2, host: "a.example")], members: [:])
        let free3 = book.claimFree(now: clock.now)
        #expect(free3 != nil)
    }

    /// Claims of early starts wait for one timer while the lists hold a job for every slot;
    /// anything else to write commits them at once.
    @Test func earlyClaimsWaitForOneTimer() throws {
        let clock = SchedulingClock()
        var book = Book(maxActive: 1, maxLight: 0)
        #expect(book.limits.readyRows == 4)
        book.turnRead(ready: (1...6).map { queuedJob($0) }, members: [:])
        let handed = book.handOff(at: clock)
        book.run(try #require(handed))
        let deferral1 = book.deferClaims()
        #expect(deferral1 == .arm)
        let deferral2 = book.deferClaims()
        #expect(deferral2 == .wait)
        let waiting1 = book.claimTimerFired()
        #expect(waiting1)
        let deferral3 = book.deferClaims()
        #expect(deferral3 == .arm)
        book.pending.saves = [queuedJob(9)]
        let deferral4 = book.deferClaims()
        #expect(deferral4 == .commitNow)
        book.pending = .init()
        _ = book.takeStartedEarly()
        let waiting2 = book.claimTimerFired()
        #expect(!waiting2)
        let deferral5 = book.deferClaims()
        #expect(deferral5 == .commitNow)
    }

    /// Strictly one at a time: the one transfer takes the bulk slot whatever its size; with
    /// the light lane, a big answer takes a free bulk slot and is parked when none is free.
    @Test func answersTakeBulkSlotsOrPark() {
        var strict = Book(maxActive: 1, maxLight: 0)
        let only = strict.run(queuedJob(1))
        let admission1 = strict.admit(1, attempt: only, remaining: 10, received: 0)
        #expect(admission1 == .bulk)
        let admission2 = strict.admit(1, attempt: only, remaining: 10, received: 0)
        #expect(admission2 == nil)

        var book = Book(maxActive: 2, maxLight: 4)
        let a = book.run(queuedJob(1))
        let b = book.run(queuedJob(2))
        let c = book.run(queuedJob(3))
        let small = book.admit(1, attempt: a, remaining: 1000, received: 0)
        #expect(small == .light)
        let big = book.admit(1, attempt: a, remaining: 64 << 20, received: 0)
        #expect(big == .bulk)
        let second = book.admit(2, attempt: b, remaining: 64 << 20, received: 0)
        #expect(second == .bulk)
        let third = book.admit(3, attempt: c, remaining: 64 << 20, received: 0)
        #expect(third == .park)
        #expect(book.running[3]?.parked == true && book.bulkTaken() == 2)
        // A stale attempt is not this transfer.
        let admission3 = book.admit(3, attempt: c + 1, remaining: 1, received: 0)
        #expect(admission3 == nil)
    }
}

/// A deterministic generator (SplitMix64), so that a failing seed fails again.
struct SeededRandom {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
