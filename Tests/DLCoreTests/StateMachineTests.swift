import DLCore
import Foundation
import Testing

/// A test clock: fixed instants, advanced by hand.
struct TestClock {
    var now = Date(timeIntervalSince1970: 1_800_000_000)
    mutating func advance(_ seconds: TimeInterval) { now = now.addingTimeInterval(seconds) }
}

func makeJob(_ state: JobState, attempts: Int = 0, clock: TestClock = TestClock()) -> Job {
    Job(
        id: 1, url: "http://example.com/a", path: "/tmp/a", state: state, attempts: attempts,
        createdAt: clock.now, updatedAt: clock.now)
}

@Suite struct StateMachineTests {
    /// The happy path: queued → running → completed, with timestamps from the clock.
    @Test func queuedRunsAndCompletes() throws {
        var clock = TestClock()
        var job = makeJob(.queued, clock: clock)
        clock.advance(5)
        job = try StateMachine.apply(.start, to: job, now: clock.now)
        #expect(job.state == .running)
        #expect(job.attempts == 1)
        #expect(job.updatedAt == clock.now)
        clock.advance(10)
        job = try StateMachine.apply(.complete, to: job, now: clock.now)
        #expect(job.state == .completed)
        #expect(job.finishedAt == clock.now)
        #expect(job.error == nil)
    }

    /// A transient failure waits with its reason and time; when due the job is queued again.
    @Test func waitingCarriesReasonAndNextAttempt() throws {
        let clock = TestClock()
        let until = clock.now.addingTimeInterval(30)
        let error = JobError(code: "http_status", message: "the server answered 503")
        var job = try StateMachine.apply(.wait(.retry, error, until: until), to: makeJob(.running), now: clock.now)
        #expect(job.state == .waiting)
        #expect(job.waitReason == .retry)
        #expect(job.nextAttemptAt == until)
        #expect(job.error == error)
        job = try StateMachine.apply(.due, to: job, now: until)
        #expect(job.state == .queued)
        #expect(job.waitReason == nil)
        #expect(job.nextAttemptAt == nil)
        // The last error stays visible until something replaces it.
        #expect(job.error == error)
    }

    /// Pause is allowed from queued, running and waiting; resume queues it with a fresh budget.
    @Test(arguments: [JobState.queued, .running, .waiting])
    func pauseAndResume(from state: JobState) throws {
        let clock = TestClock()
        let paused = try StateMachine.apply(.pause, to: makeJob(state, attempts: 4), now: clock.now)
        #expect(paused.state == .paused)
        #expect(paused.nextAttemptAt == nil)
        let resumed = try StateMachine.apply(.resume, to: paused, now: clock.now)
        #expect(resumed.state == .queued)
        #expect(resumed.attempts == 0)
    }

    /// Resuming a failed job clears its error and queues it.
    @Test func resumeFailed() throws {
        var job = makeJob(.running)
        job = try StateMachine.apply(.fail(JobError(code: "http_status", message: "404")), to: job, now: TestClock().now)
        #expect(job.state == .failed)
        #expect(job.finishedAt != nil)
        job = try StateMachine.apply(.resume, to: job, now: TestClock().now)
        #expect(job.state == .queued)
        #expect(job.error == nil)
        #expect(job.finishedAt == nil)
    }

    /// Resuming after a checksum or size mismatch starts over from byte 0 (the partial file
    /// cannot be trusted); after any other failure the bytes on disk are kept.
    @Test func resumeAfterAMismatchStartsOver() throws {
        for (code, keeps) in [(JobErrorCode.checksumMismatch, false), (.sizeMismatch, false), (.httpStatus, true), (.timeout, true)] {
            var job = makeJob(.running)
            job.received = 4096
            job.segments = "0-4096"
            job.validators = Validators(etag: "\"v1\"", lastModified: nil, acceptsRanges: true)
            job.sha256 = "ab"
            job = try StateMachine.apply(.fail(JobError(code: code, message: "no")), to: job, now: TestClock().now)
            let resumed = try StateMachine.apply(.resume, to: job, now: TestClock().now)
            #expect(resumed.state == .queued)
            #expect(resumed.received == (keeps ? 4096 : 0), "\(code)")
            #expect((resumed.segments != nil) == keeps, "\(code)")
            #expect((resumed.validators.etag != nil) == keeps && (resumed.sha256 != nil) == keeps, "\(code)")
        }
    }

    /// Cancel works from every state but completed and canceled.
    @Test func cancelRules() throws {
        for state in JobState.allCases {
            let allowed = StateMachine.allows(.cancel, from: state)
            #expect(allowed == (state != .completed && state != .canceled), "cancel from \(state)")
        }
    }

    /// Events that make no sense are refused with a message naming both sides.
    @Test func invalidTransitionsThrow() {
        #expect(throws: TransitionError(from: .completed, event: "pause")) {
            try StateMachine.apply(.pause, to: makeJob(.completed), now: TestClock().now)
        }
        #expect(!StateMachine.allows(.start, from: .paused))
        #expect(!StateMachine.allows(.complete, from: .queued))
        #expect(!StateMachine.allows(.resume, from: .completed))
        #expect(!StateMachine.allows(.due, from: .queued))
        #expect(TransitionError(from: .completed, event: "pause").description == "cannot pause a job that is completed")
    }

    @Test func finishedStates() {
        #expect(JobState.allCases.filter(\.isFinished) == [.completed, .failed, .canceled])
    }
}

@Suite struct SchedulerPolicyTests {
    /// Higher priority first, then first in, first out.
    @Test func priorityThenFIFO() {
        let queued = [
            QueueEntry(id: 5, priority: 0), QueueEntry(id: 2, priority: 0), QueueEntry(id: 9, priority: 10),
            QueueEntry(id: 7, priority: -1), QueueEntry(id: 3, priority: 10),
        ]
        #expect(SchedulerPolicy.jobsToStart(queued: queued, active: 0, maxActive: 10) == [3, 9, 2, 5, 7])
    }

    /// Only free slots are filled; max_active 1 means strictly one at a time.
    @Test func slots() {
        let queued = [QueueEntry(id: 1, priority: 0), QueueEntry(id: 2, priority: 0)]
        #expect(SchedulerPolicy.jobsToStart(queued: queued, active: 0, maxActive: 1) == [1])
        #expect(SchedulerPolicy.jobsToStart(queued: queued, active: 1, maxActive: 1) == [])
        #expect(SchedulerPolicy.jobsToStart(queued: queued, active: 2, maxActive: 3) == [1])
        #expect(SchedulerPolicy.jobsToStart(queued: queued, active: 5, maxActive: 3) == [])
        #expect(SchedulerPolicy.jobsToStart(queued: [], active: 0, maxActive: 3) == [])
    }

    /// A group takes one slot, placed by its first queued member: ahead of later standalone
    /// jobs of its priority, behind jobs of a higher one.
    @Test func groupsShareSlotsInQueueOrder() {
        let standalone = [QueueEntry(id: 4, priority: 0), QueueEntry(id: 9, priority: 0), QueueEntry(id: 2, priority: 5)]
        let groups = [(entry: QueueEntry(id: 6, priority: 0), group: "g6"), (entry: QueueEntry(id: 1, priority: 0), group: "g1")]
        var share = SchedulerPolicy.share(free: 3, standalone: standalone, groups: groups)
        #expect(share.standalone == 2 && share.groups == ["g1"])  // 2 (priority 5), g1, 4
        share = SchedulerPolicy.share(free: 5, standalone: standalone, groups: groups)
        #expect(share.standalone == 3 && share.groups == ["g1", "g6"])
        share = SchedulerPolicy.share(free: 1, standalone: standalone, groups: groups)
        #expect(share.standalone == 1 && share.groups.isEmpty)
        share = SchedulerPolicy.share(free: 2, standalone: [], groups: groups)
        #expect(share.standalone == 0 && share.groups == ["g1", "g6"])
        share = SchedulerPolicy.share(free: 0, standalone: standalone, groups: groups)
        #expect(share.standalone == 0 && share.groups.isEmpty)
    }
}

extension SchedulerPolicyTests {
    /// A freed slot starts the first ready job whose host has room; none while every slot is
    /// taken (max_active 1 stays one at a time) or every host is full.
    @Test func handOffTakesTheFirstJobWithRoom() {
        let hosts = ["a", "b", "a"]
        let six: (String) -> Int = { _ in 6 }
        #expect(SchedulerPolicy.handOff(hosts: hosts, free: 1, load: ["a": 2], limit: six) == 0)
        #expect(SchedulerPolicy.handOff(hosts: hosts, free: 1, load: ["a": 6], limit: six) == 1)
        #expect(SchedulerPolicy.handOff(hosts: hosts, free: 1, load: ["a": 6, "b": 6], limit: six) == nil)
        #expect(SchedulerPolicy.handOff(hosts: hosts, free: 0, load: [:], limit: six) == nil)
        #expect(SchedulerPolicy.handOff(hosts: [], free: 3, load: [:], limit: six) == nil)
        // Each host has its own limit (a host that answered over HTTP/2 takes more).
        #expect(SchedulerPolicy.handOff(hosts: hosts, free: 1, load: ["a": 6, "b": 6], limit: { $0 == "a" ? 32 : 6 }) == 0)
        // A job the lanes do not let start is passed over, not waited for.
        #expect(SchedulerPolicy.handOff(hosts: hosts, free: 1, load: [:], limit: six, mayStart: { $0 != 0 }) == 1)
    }

    /// Kinds over their limit are passed over without blocking the others: a group waiting
    /// for a bulk slot does not stop standalone jobs behind it from taking light slots.
    @Test func shareKeepsEachKindWithinItsLimit() {
        let standalone = [QueueEntry(id: 4, priority: 0), QueueEntry(id: 9, priority: 0), QueueEntry(id: 2, priority: 5)]
        let groups = [(entry: QueueEntry(id: 6, priority: 0), group: "g6"), (entry: QueueEntry(id: 1, priority: 0), group: "g1")]
        var share = SchedulerPolicy.share(free: 5, groupLimit: 0, standalone: standalone, groups: groups)
        #expect(share.standalone == 3 && share.groups.isEmpty)
        share = SchedulerPolicy.share(free: 5, standaloneLimit: 1, groupLimit: 1, standalone: standalone, groups: groups)
        #expect(share.standalone == 1 && share.groups == ["g1"])
        share = SchedulerPolicy.share(free: 2, standaloneLimit: 0, groupLimit: 5, standalone: standalone, groups: groups)
        #expect(share.standalone == 0 && share.groups == ["g1", "g6"])
    }
}

@Suite struct LanesTests {
    let lanes = Lanes(maxActive: 3, maxLight: 32, lightBytes: 2 << 20)

    /// Every job starts in the light lane, whatever the bulk lane holds: small files do not
    /// wait behind big ones.
    @Test func startsFollowTheLightLane() {
        #expect(lanes.free(bulk: 0, light: 0) == 32)
        #expect(lanes.free(bulk: 3, light: 0) == 32)
        #expect(lanes.free(bulk: 3, light: 30) == 2)
        #expect(lanes.free(bulk: 0, light: 40) == 0)
        // Groups are bulk work: they take bulk slots.
        #expect(lanes.freeForGroups(bulk: 1, light: 30) == 2)
        #expect(lanes.freeForGroups(bulk: 3, light: 0) == 0)
    }

    /// A transfer whose answer tells a small rest stays light; a big one takes a free bulk
    /// slot, or is parked while all are taken. An unknown size is light until the file on
    /// disk is big.
    @Test func admission() {
        #expect(lanes.admit(remaining: 16 << 10, received: 0, bulk: 3) == .light)
        #expect(lanes.admit(remaining: 2 << 20, received: 0, bulk: 3) == .light)
        #expect(lanes.admit(remaining: (2 << 20) + 1, received: 0, bulk: 2) == .bulk)
        #expect(lanes.admit(remaining: (2 << 20) + 1, received: 0, bulk: 3) == .park)
        #expect(lanes.admit(remaining: nil, received: 1 << 20, bulk: 3) == .light)
        #expect(lanes.admit(remaining: nil, received: 3 << 20, bulk: 3) == .park)
        #expect(lanes.admit(remaining: 100 << 20, received: 10, bulk: 5) == .park)
    }

    /// max_active = 1 keeps its meaning: strictly one transfer at a time, of any size.
    @Test func oneMeansStrictlyOne() {
        let one = Lanes(maxActive: 1)
        #expect(one.strict)
        #expect(one.free(bulk: 0, light: 0) == 1)
        #expect(one.free(bulk: 0, light: 1) == 0)
        #expect(one.free(bulk: 1, light: 0) == 0)
        #expect(one.freeForGroups(bulk: 0, light: 1) == 0)
        #expect(one.admit(remaining: 1 << 40, received: 0, bulk: 0) == .bulk)
        #expect(one.claimFilter(bulk: 1) == nil)
        #expect(Lanes(maxActive: 3, maxLight: 0).strict)
    }

    /// A job known to be bulk (it was parked, or it was half downloaded) is not started, nor
    /// claimed, while every bulk slot is taken; a job with a small rest is.
    @Test func knownBulkJobsWaitForABulkSlot() {
        #expect(!lanes.mayStart(size: 100 << 20, received: 0, bulk: 3))
        #expect(lanes.mayStart(size: 100 << 20, received: 0, bulk: 2))
        #expect(lanes.mayStart(size: 100 << 20, received: (100 << 20) - 10, bulk: 3))
        #expect(lanes.mayStart(size: nil, received: 0, bulk: 3))
        #expect(!lanes.mayStart(size: nil, received: 10 << 20, bulk: 3))
        #expect(lanes.claimFilter(bulk: 3) == 2 << 20)
        #expect(lanes.claimFilter(bulk: 2) == nil)
    }

    /// Over HTTP/2 a host takes `max_streams_per_host` streams; otherwise `max_per_host`
    /// connections.
    @Test func hostLimits() {
        let limits = HostLimits(maxPerHost: 6, maxStreams: 32)
        #expect(limits.limit(multiplexed: false) == 6)
        #expect(limits.limit(multiplexed: true) == 32)
    }

    /// Over HTTP/1.1 one request may wait behind each connection that a short transfer holds,
    /// none behind a long one; over HTTP/2 the streams are the limit.
    @Test func hostStartLimits() {
        let limits = HostLimits(maxPerHost: 6, maxStreams: 32)
        #expect(limits.startLimit(multiplexed: false, long: 0) == 12)
        #expect(limits.startLimit(multiplexed: false, long: 2) == 10)
        #expect(limits.startLimit(multiplexed: false, long: 6) == 6)
        #expect(limits.startLimit(multiplexed: false, long: 9) == 6)
        #expect(limits.startLimit(multiplexed: true, long: 0) == 32)
        #expect(HostLimits(maxPerHost: 1).startLimit(multiplexed: false, long: 0) == 2)
    }
}

@Suite struct BackoffTests {
    /// Full jitter: the delay is the draw times min(cap, base·2^(n-1)).
    @Test func exponentialWithFullJitter() {
        let policy = BackoffPolicy(base: 2, cap: 600, maxAttempts: 10)
        #expect(policy.delay(afterAttempt: 1, retryAfter: nil, unit: 0.5) == 1)
        #expect(policy.delay(afterAttempt: 3, retryAfter: nil, unit: 0.5) == 4)
        #expect(policy.delay(afterAttempt: 3, retryAfter: nil, unit: 0) == 0)
        #expect(policy.delay(afterAttempt: 20, retryAfter: nil, unit: 0.999) < 600)
        #expect(policy.delay(afterAttempt: 20, retryAfter: nil, unit: 1) == 600)
        #expect(policy.delay(afterAttempt: 1000, retryAfter: nil, unit: 0.5) == 300)
    }

    /// Retry-After wins over the jitter, clamped to the cap.
    @Test func retryAfter() {
        let policy = BackoffPolicy(base: 2, cap: 60, maxAttempts: 10)
        #expect(policy.delay(afterAttempt: 1, retryAfter: 7, unit: 0) == 7)
        #expect(policy.delay(afterAttempt: 1, retryAfter: 3600, unit: 0) == 60)
    }

    /// A transient failure waits until now + delay; after max attempts it fails for good.
    @Test func retryDecision() {
        let clock = TestClock()
        let policy = BackoffPolicy(base: 2, cap: 600, maxAttempts: 3)
        let transient = TransferFailure(.transient(.network), .timeout, "timed out", retryAfter: 5)
        #expect(
            RetryDecision.decide(transient, attempts: 1, policy: policy, now: clock.now, unit: 0.3)
                == .wait(.network, until: clock.now.addingTimeInterval(5)))
        guard case .fail(let error) = RetryDecision.decide(transient, attempts: 3, policy: policy, now: clock.now, unit: 0.3) else {
            Issue.record("expected a failure after max attempts")
            return
        }
        #expect(error.code == "retries_exhausted")
        #expect(error.message.contains("timed out"))
        let permanent = TransferFailure(.permanent, .httpStatus, "the server answered 404 Not Found")
        #expect(
            RetryDecision.decide(permanent, attempts: 1, policy: policy, now: clock.now, unit: 0)
                == .fail(JobError(code: "http_status", message: "the server answered 404 Not Found")))
    }

    /// 408, 429 and 5xx are worth retrying; other statuses are not.
    @Test func statusClassification() {
        for status in [408, 429, 500, 502, 503, 599] {
            #expect(HTTPFailurePolicy.kind(forStatus: status) == .transient(.retry), "\(status)")
        }
        for status in [400, 401, 403, 404, 410, 416, 451] {
            #expect(HTTPFailurePolicy.kind(forStatus: status) == .permanent, "\(status)")
        }
    }

    /// Retry-After as seconds or as an HTTP date, relative to the test clock.
    @Test func retryAfterParsing() {
        let now = Date(timeIntervalSince1970: 1_445_412_480)  // Wed, 21 Oct 2015 07:28:00 GMT
        #expect(HTTPFailurePolicy.retryAfter("120", now: now) == 120)
        #expect(HTTPFailurePolicy.retryAfter("Wed, 21 Oct 2015 07:28:30 GMT", now: now) == 30)
        #expect(HTTPFailurePolicy.retryAfter("Wed, 21 Oct 2015 07:27:00 GMT", now: now) == 0)
        #expect(HTTPFailurePolicy.retryAfter("-5", now: now) == nil)
        #expect(HTTPFailurePolicy.retryAfter("soon", now: now) == nil)
        #expect(HTTPFailurePolicy.retryAfter(nil, now: now) == nil)
    }
}

@Suite struct FileNameTests {
    @Test func namesFromURLs() {
        #expect(FileNames.fromURL("https://example.com/files/big.iso") == "big.iso")
        #expect(FileNames.fromURL("https://example.com/files/big.iso?token=abc#x") == "big.iso")
        #expect(FileNames.fromURL("https://example.com/a%20b.txt") == "a b.txt")
        #expect(FileNames.fromURL("https://example.com/") == "download")
        #expect(FileNames.fromURL("https://example.com") == "download")
        #expect(FileNames.fromURL("https://example.com/..%2F..%2Fetc%2Fpasswd") == "_.._etc_passwd")
        #expect(FileNames.fromURL("https://example.com/.bashrc") == "bashrc")
    }

    @Test func sanitize() {
        #expect(FileNames.sanitize("a/b\\c") == "a_b_c")
        #expect(FileNames.sanitize("...") == "download")
        #expect(FileNames.sanitize("x\u{0}y\u{7}z") == "x_y_z")
        #expect(FileNames.sanitize(String(repeating: "é", count: 300)).utf8.count <= FileNames.maxLength)
    }

    @Test func urlRules() throws {
        #expect(try URLRules.validate("https://example.com/x").get().host == "example.com")
        for bad in [
            "ftp://example.com/x", "file:///etc/passwd", "example.com/x", "http:///x", "", "https://" + String(repeating: "a", count: 9000),
        ] {
            guard case .failure(let error) = URLRules.validate(bad) else {
                Issue.record("accepted \(bad.prefix(40))")
                continue
            }
            #expect(error.code == .invalidURL)
        }
    }
}

/// Retention and compaction policies, and durations as people write them.
@Suite struct RetentionPolicyTests {
    let now = Date(timeIntervalSince1970: 1_800_000_000)

    @Test func sweepsFollowTheKeeps() {
        let policy = RetentionPolicy(keepFinished: 86_400, keepFailed: 0)
        #expect(
            policy.sweeps(now: now) == [RetentionPolicy.Sweep(states: [.completed, .canceled], before: now.addingTimeInterval(-86_400))])
        #expect(policy.interval == 3600, "a quarter of a day, capped at an hour")
        #expect(RetentionPolicy(keepFinished: 2, keepFailed: 8).interval == 1, "never faster than a second")
        #expect(RetentionPolicy(keepFinished: 400, keepFailed: 0).interval == 100)
        #expect(RetentionPolicy(keepFinished: 0, keepFailed: 0).sweeps(now: now).isEmpty)
        #expect(RetentionPolicy(keepFinished: 0, keepFailed: 0).interval == nil, "nothing to sweep")
        #expect(RetentionPolicy(keepFinished: 0, keepFailed: 60).sweeps(now: now).map(\.states) == [[.failed]])
    }

    @Test func compactionWaitsForAShareOfFreePages() {
        let policy = CompactionPolicy()
        #expect(!policy.shouldCompact(pages: 10_000, freePages: 2_000), "20 % free")
        #expect(policy.shouldCompact(pages: 10_000, freePages: 2_500), "25 % free")
        #expect(!policy.shouldCompact(pages: 400, freePages: 200), "a small file is left alone")
        #expect(!policy.shouldCompact(pages: 0, freePages: 0))
    }

    @Test func durations() {
        #expect(DurationText.seconds("90") == 90)
        #expect(DurationText.seconds("90s") == 90)
        #expect(DurationText.seconds("15m") == 900)
        #expect(DurationText.seconds("12h") == 43_200)
        #expect(DurationText.seconds(" 30D ") == 2_592_000)
        #expect(DurationText.seconds("2w") == 1_209_600)
        #expect(DurationText.seconds("1.5h") == 5400)
        for bad in ["", "d", "-1d", "10y", "abc", "1e999", "nan"] {
            #expect(DurationText.seconds(bad) == nil, "\(bad)")
        }
        #expect(DurationText.describe(2_592_000) == "30d")
        #expect(DurationText.describe(90) == "90s")
        #expect(DurationText.describe(5400) == "90m")
        #expect(DurationText.describe(0) == "0")
    }

    /// A duration too long for an Int (a config file may say one) is written as a Double
    /// that reads back, not trapped on; one that overflows to infinity is refused.
    @Test func hugeDurations() {
        #expect(DurationText.describe(1e20) == "1e+20s")
        #expect(DurationText.seconds(DurationText.describe(1e20)) == 1e20)
        #expect(DurationText.seconds(DurationText.describe(604_800e300)) == 604_800e300)
        #expect(DurationText.seconds("1e308w") == nil)
    }
}

/// Whether a route table reaches a network: samples of /proc/net/route and /proc/net/ipv6_route.
@Suite struct RouteTableTests {
    let header = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"

    @Test func aDefaultOrConnectedRouteIsANetwork() {
        #expect(Routes.hasNetwork(ipv4: header + "eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n", ipv6: ""))
        #expect(Routes.hasNetwork(ipv4: header + "veth1\t00004D0A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n", ipv6: ""))
        let v6 =
            "fd000000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001     eth0\n"
        #expect(Routes.hasNetwork(ipv4: header, ipv6: v6))
    }

    @Test func loopbackLinkLocalOwnAddressesAndRejectRoutesAreNot() {
        #expect(!Routes.hasNetwork(ipv4: header, ipv6: ""))
        #expect(!Routes.hasNetwork(ipv4: header + "lo\t0000007F\t00000000\t0001\t0\t0\t0\t000000FF\t0\t0\t0\n", ipv6: ""))
        #expect(!Routes.hasNetwork(ipv4: header + "eth0\t00000000\t00000000\t0201\t0\t0\t0\t00000000\t0\t0\t0\n", ipv6: ""), "reject")
        #expect(!Routes.hasNetwork(ipv4: header + "eth0\t00000000\t010200C0\t0002\t0\t0\t0\t00000000\t0\t0\t0\n", ipv6: ""), "not up")
        let v6 = """
            fe800000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000002 00000000 00000001     eth0
            00000000000000000000000000000001 80 00000000000000000000000000000000 00 00000000000000000000000000000000 00000000 00000002 00000000 80200001       lo
            fd000000000000000000000000000002 80 00000000000000000000000000000000 00 00000000000000000000000000000000 00000000 00000004 00000000 80200001     eth0
            ff000000000000000000000000000000 08 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000003 00000000 00000001     eth0

            """
        #expect(!Routes.hasNetwork(ipv4: header, ipv6: v6))
        #expect(!Routes.hasNetwork(ipv4: "garbage", ipv6: "more garbage"))
    }
}

/// Downloads on a metered connection (`MeteredPolicy`), from NetworkManager's NMMetered values.
@Suite struct MeteredPolicyTests {
    /// Yes and guess-yes are metered; no, guess-no, unknown, no NetworkManager and values of a
    /// newer NetworkManager are not.
    @Test func networkManagerValues() {
        #expect(MeteredPolicy.isMetered(1))
        #expect(MeteredPolicy.isMetered(3))
        for value in [0, 2, 4, 5, -1, nil] as [Int?] {
            #expect(!MeteredPolicy.isMetered(value), "\(String(describing: value))")
        }
    }

    /// A job that says `metered: false` waits while the connection is metered; a job that
    /// says nothing follows the config; every job runs when the connection is not metered.
    @Test func whoMayTransfer() {
        #expect(!MeteredPolicy.mayTransfer(connectionMetered: true, job: false, allowedByDefault: true))
        #expect(MeteredPolicy.mayTransfer(connectionMetered: true, job: true, allowedByDefault: false))
        #expect(MeteredPolicy.mayTransfer(connectionMetered: true, job: nil, allowedByDefault: true))
        #expect(!MeteredPolicy.mayTransfer(connectionMetered: true, job: nil, allowedByDefault: false))
        for job in [true, false, nil] as [Bool?] {
            for allowed in [true, false] {
                #expect(MeteredPolicy.mayTransfer(connectionMetered: false, job: job, allowedByDefault: allowed))
            }
        }
    }
}

/// A job's name is the last part of its path, read as bytes; what Foundation calls the last
/// path component where the path ends with "/" or has none.
@Suite struct JobNameTests {
    @Test func lastPathComponent() {
        for path in ["/tmp/a.bin", "/tmp/日本/ページ 1.jpg", "/tmp/e\u{301}/x", "/tmp/dir/", "name", "/", "/x", "/tmp/a\u{301}b"] {
            var job = makeJob(.queued)
            job.path = path
            #expect(job.name == (path as NSString).lastPathComponent, "\(path)")
        }
    }
}
