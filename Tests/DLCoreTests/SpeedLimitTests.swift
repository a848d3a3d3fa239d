import DLCore
import Testing

/// Transfers that read as fast as the limits let them, on a simulated clock: each takes a chunk,
/// waits what the limits say, and takes the next. Returns when each chunk went on, per job.
private func simulate(
    _ limits: inout SpeedLimits, jobs: [JobID], seconds: Double, chunks: (JobID, Int) -> Int64,
    change: (Double, inout SpeedLimits) -> Void = { _, _ in }
) -> [(at: Double, job: JobID, bytes: Int64)] {
    var next = Dictionary(uniqueKeysWithValues: jobs.map { ($0, 0.0) })
    var count = 0
    var passed: [(Double, JobID, Int64)] = []
    while let (job, at) = next.min(by: { $0.value < $1.value || ($0.value == $1.value && $0.key < $1.key) }), at < seconds {
        change(at, &limits)
        let bytes = chunks(job, count)
        count += 1
        let wait = limits.take(bytes, job: job, now: at)
        passed.append((at + wait, job, bytes))
        // The next read comes a little after the chunk went on (the network is not instant).
        next[job] = at + wait + 0.0005
    }
    return passed
}

/// Bytes that went on in every window [start, start + length) from `from` to `to`, by steps of 0.5 s.
private func windows(_ passed: [(at: Double, job: JobID, bytes: Int64)], length: Double, from: Double, to: Double, job: JobID? = nil)
    -> [Int64]
{
    var out: [Int64] = []
    var start = from
    while start + length <= to {
        out.append(passed.filter { $0.at >= start && $0.at < start + length && (job == nil || $0.job == job) }.reduce(0) { $0 + $1.bytes })
        start += 0.5
    }
    return out
}

@Suite struct SpeedLimitTests {
    /// Sizes and rates as people write them; junk is refused.
    @Test func ratesParse() {
        #expect(ByteRate.parse("2M") == 2 << 20)
        #expect(ByteRate.parse("512k") == 512 << 10)
        #expect(ByteRate.parse("1.5G") == 3 << 29)
        #expect(ByteRate.parse("100000") == 100_000)
        #expect(ByteRate.parse("0") == 0)
        for bad in ["", "M", "-1", "2MB", "1.2.3", ".5M", "5.M", "2 M", "1e3", "99999T", "２M"] {
            #expect(ByteRate.parse(bad) == nil, "\(bad)")
        }
        #expect(ByteRate.format(2 << 20) == "2M")
        #expect(ByteRate.format(1000) == "1000")
    }

    /// One transfer with big and small chunks at 10 MB/s: every 10 s window within 5 % of the rate.
    @Test func globalRateHeldOverTenSecondWindows() {
        var limits = SpeedLimits()
        limits.setGlobal(10_000_000, now: 0)
        let sizes: [Int64] = [1 << 20, 64 << 10, 300_000, 4096, 1 << 20]
        let passed = simulate(&limits, jobs: [1], seconds: 60, chunks: { _, n in sizes[n % sizes.count] })
        for bytes in windows(passed, length: 10, from: 0, to: 55) {
            #expect(abs(Double(bytes) - 100_000_000) <= 5_000_000, "\(bytes)")
        }
    }

    /// Three transfers share the global rate: together they keep to it, and none is starved.
    @Test func transfersShareTheGlobalRate() {
        var limits = SpeedLimits()
        limits.setGlobal(6_000_000, now: 0)
        let passed = simulate(&limits, jobs: [1, 2, 3], seconds: 40, chunks: { job, _ in Int64(job) * 100_000 })
        for bytes in windows(passed, length: 10, from: 0, to: 35) {
            #expect(abs(Double(bytes) - 60_000_000) <= 3_000_000, "\(bytes)")
        }
        for job: JobID in [1, 2, 3] {
            #expect(passed.filter { $0.job == job }.reduce(0) { $0 + $1.bytes } > 20_000_000)
        }
    }

    /// A job's own limit holds inside the global one; the other jobs use what is left.
    @Test func jobLimitInsideGlobal() {
        var limits = SpeedLimits()
        limits.setGlobal(8_000_000, now: 0)
        limits.setJob(2, 1_000_000, now: 0)
        let passed = simulate(&limits, jobs: [1, 2], seconds: 40, chunks: { _, _ in 128 << 10 })
        for bytes in windows(passed, length: 10, from: 0, to: 35, job: 2) {
            #expect(abs(Double(bytes) - 10_000_000) <= 500_000, "job 2: \(bytes)")
        }
        for bytes in windows(passed, length: 10, from: 0, to: 35) {
            #expect(abs(Double(bytes) - 80_000_000) <= 4_000_000, "all: \(bytes)")
        }
    }

    /// A rate change applies at once: the windows after it hold the new rate; no limit lets
    /// everything through and leaves no bucket.
    @Test func rateChangeAppliesAtOnce() {
        var limits = SpeedLimits()
        limits.setGlobal(1_000_000, now: 0)
        let passed = simulate(&limits, jobs: [1], seconds: 60, chunks: { _, _ in 64 << 10 }) { at, limits in
            if at >= 20 && at < 40 && limits.global?.rate == 1_000_000 { limits.setGlobal(4_000_000, now: at) }
            if at >= 40 && limits.global?.rate == 4_000_000 { limits.setGlobal(500_000, now: at) }
        }
        for bytes in windows(passed, length: 10, from: 0, to: 20) {
            #expect(abs(Double(bytes) - 10_000_000) <= 500_000, "before: \(bytes)")
        }
        for bytes in windows(passed, length: 10, from: 20.5, to: 40) {
            #expect(abs(Double(bytes) - 40_000_000) <= 2_000_000, "raised: \(bytes)")
        }
        for bytes in windows(passed, length: 10, from: 40.5, to: 60) {
            #expect(abs(Double(bytes) - 5_000_000) <= 250_000, "lowered: \(bytes)")
        }
        limits.setGlobal(0, now: 60)
        #expect(limits.isUnlimited)
        #expect(limits.take(1 << 30, job: 1, now: 60) == 0)
        limits.setJob(1, 1000, now: 60)
        #expect(!limits.isUnlimited)
        limits.setJob(1, nil, now: 60)
        #expect(limits.isUnlimited)
    }

    /// After a quiet spell only a small burst passes at once, not the whole time saved up.
    @Test func idleTimeEarnsOnlyABurst() {
        var bucket = TokenBucket(rate: 1_000_000, now: 0)
        #expect(bucket.take(100_000, now: 0) == 0)
        // An hour of nothing, then 10 MB: the burst (0.1 s) passes, the rest is waited for.
        let wait = bucket.take(10_000_000, now: 3600)
        #expect(abs(wait - 9.9) < 0.001)
    }

    /// The schedule answers the rate at a time, and when it next changes, across midnight.
    @Test func scheduleBoundaries() throws {
        let schedule = try SpeedSchedule.parse("08:00-18:00 2M, 18:00-08:00 0").get()
        #expect(schedule.rate(atSecondOfDay: 8 * 3600) == 2 << 20)
        #expect(schedule.rate(atSecondOfDay: 8 * 3600 - 1) == 0)
        #expect(schedule.rate(atSecondOfDay: 18 * 3600 - 1) == 2 << 20)
        #expect(schedule.rate(atSecondOfDay: 18 * 3600) == 0)
        #expect(schedule.rate(atSecondOfDay: 0) == 0)
        #expect(schedule.secondsUntilChange(fromSecondOfDay: 7 * 3600 + 59 * 60 + 30) == 30)
        #expect(schedule.secondsUntilChange(fromSecondOfDay: 8 * 3600) == 10 * 3600)
        // From 23:00 the next change is 08:00 the next day.
        #expect(schedule.secondsUntilChange(fromSecondOfDay: 23 * 3600) == 9 * 3600)
        #expect(schedule.text == "08:00-18:00 2M, 18:00-08:00 0")

        // A gap: no entry covers 12:00-13:00, so max_speed applies there.
        let lunch = try SpeedSchedule.parse("09:00-12:00 1M,13:00-17:30 512K").get()
        var policy = GlobalSpeedPolicy(maxSpeed: 100, schedule: lunch)
        #expect(policy.limit(atSecondOfDay: 12 * 3600 + 30) == 100)
        #expect(policy.source(atSecondOfDay: 12 * 3600) == "max_speed")
        #expect(policy.limit(atSecondOfDay: 17 * 3600) == 512 << 10)
        #expect(policy.secondsUntilChange(fromSecondOfDay: 12 * 3600) == 3600)
        // From 17:30 the next change is 09:00 the next day: 15.5 hours.
        let fromEvening: Int? = policy.secondsUntilChange(fromSecondOfDay: 63_000)
        #expect(fromEvening == 55_800)
        // A rate set over the socket wins and does not change with the clock.
        policy.override = 7
        #expect(policy.limit(atSecondOfDay: 10 * 3600) == 7)
        #expect(policy.source(atSecondOfDay: 10 * 3600) == "set_speed")
        #expect(policy.secondsUntilChange(fromSecondOfDay: 0) == nil)

        let allDay = try SpeedSchedule.parse("00:00-00:00 1M").get()
        #expect(allDay.rate(atSecondOfDay: 86_399) == 1 << 20)
        #expect(allDay.secondsUntilChange(fromSecondOfDay: 0) == nil)
        #expect(try SpeedSchedule.parse("").get().isEmpty)
    }

    /// Bad schedules are refused with a reason: overlaps, bad times, bad rates.
    @Test func badSchedulesRefused() {
        for bad in [
            "08:00-18:00 2M, 17:00-19:00 1M", "8:00-18:00 2M", "08:00-24:00 1M", "08:00-18:00", "08:00-18:00 fast",
            "08:00-18:00 1M,", "08:00 18:00 1M", "23:00-01:00 1M, 00:30-02:00 2M",
        ] {
            if case .success = SpeedSchedule.parse(bad) { Issue.record("accepted \(bad)") }
        }
    }
}
