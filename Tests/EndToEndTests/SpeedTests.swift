import DLCore
import DLRPC
import DLTestSupport
import Foundation
import Testing

/// Speed limits (`max_speed`, `speed_schedule`, `set_speed`) and `change` (a job's new URL and
/// headers), with the real dld and the test origin. Nothing here asserts a time: a limited job
/// is shown to be held back by an unlimited one that finishes first, and bytes kept or fetched
/// again are counted by the origin.
@Suite(.serialized) struct SpeedTests {
    static let size: Int64 = 4 << 20
    /// Big enough that buffers cannot hold half of it: the kernel's autotuned receive window may
    /// grow to tcp_rmem's maximum (32 MiB on these machines) and the origin's send buffer to
    /// tcp_wmem's (4 MiB); under load the origin got more than half of a 64 MiB file ahead of
    /// its limit.
    /// An hour at 32 KiB/s, a second or two at full speed.
    static let big: Int64 = 128 << 20

    /// A job with a tiny `max_speed` is still running after an unlimited job of a quarter of its
    /// size has finished; lifting its limit with `set_speed` lets it complete byte-exact. The global
    /// limit set over the socket holds every job back until it goes back to the config's.
    @Test func jobAndGlobalLimitsHoldTransfersBack() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness()
            try daemon.start()
            defer { daemon.stop() }
            let limited = try daemon.enqueue([
                "url": .string("\(origin.baseURL)/bytes/\(Self.big)?job=limited"), "name": "limited.bin", "max_speed": 32768,
            ])
            #expect(try daemon.job(limited)["max_speed"] == 32768)
            try daemon.waitForJob(limited) { ($0["received"]?.int64Value ?? 0) > 0 }
            // 16 MiB without a limit: done long before the limited job could have had as much.
            let free = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/\(16 << 20)?job=free"), "name": "free.bin"])
            #expect(try daemon.waitForState(free, ["completed", "failed", "waiting"])["state"] == "completed")
            let held = try daemon.job(limited)
            #expect(held["state"] == "running", "\(held.serializedString())")
            #expect((held["received"]?.int64Value ?? Self.big) < Self.big)
            // The origin could not have sent it much more than the limit lets through either
            // (socket buffers aside): far less than the whole file.
            #expect(origin.bytesServed(uri: "/bytes/\(Self.big)?job=limited") < Self.big / 2)

            let lifted = try daemon.call("set_speed", ["id": .int(limited), "max_speed": 0])
            #expect(lifted["max_speed"] == .null)
            #expect(try daemon.waitForState(limited, ["completed", "failed", "waiting"])["state"] == "completed")
            try expectOriginBytes(at: daemon.downloadDir + "/limited.bin", count: Int(Self.big))

            // The global limit, over the socket: shown by stats and dlctl.
            let global = try daemon.call("set_speed", ["global": true, "max_speed": 32768])
            #expect(global["limit"] == 32768 && global["source"] == "set_speed", "\(global.serializedString())")
            #expect(try daemon.call("stats")["max_speed"]?["limit"] == 32768)
            let shown = try daemon.dlctl(["speed"])
            #expect(shown.status == 0 && shown.stdout.contains("32K/s (from set_speed"), "\(shown.stdout)\(shown.stderr)")
            let slow = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/\(Self.big)?job=global"), "name": "global.bin"])
            try daemon.waitForJob(slow) { ($0["received"]?.int64Value ?? 0) > 0 }
            // A job's own higher limit does not escape the global one.
            _ = try daemon.call("set_speed", ["id": .int(slow), "max_speed": .int(100 << 20)])
            let other = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/65536?job=small"), "name": "small.bin"])
            #expect(try daemon.waitForState(other, ["completed", "failed", "waiting"])["state"] == "completed")
            #expect(try daemon.job(slow)["state"] == "running")
            #expect(origin.bytesServed(uri: "/bytes/\(Self.big)?job=global") < Self.big / 2)

            let back = try daemon.dlctl(["speed", "config"])
            #expect(back.status == 0 && back.stdout.hasPrefix("none (from max_speed"), "\(back.stdout)\(back.stderr)")
            #expect(try daemon.waitForState(slow, ["completed", "failed", "waiting"])["state"] == "completed")
            try expectOriginBytes(at: daemon.downloadDir + "/global.bin", count: Int(Self.big))
            #expect(try daemon.dlctl(["speed", String(slow), "1M"]).stderr.contains("invalid_state"))
        }
    }

    /// The rate a running job gets (its `received` over the time it took to grow by
    /// `bytes`), measured once it runs: bytes written count, not bytes in socket buffers.
    private func measuredRate(_ daemon: DaemonHarness, _ id: Int64, bytes: Int64) throws -> Double {
        let first = try daemon.waitForJob(id) { ($0["received"]?.int64Value ?? 0) > 0 }
        let clock = ContinuousClock()
        let start = clock.now
        let from = first["received"]?.int64Value ?? 0
        let last = try daemon.waitForJob(id, timeout: 120) {
            ($0["received"]?.int64Value ?? 0) >= from + bytes || $0["state"] != "running"
        }
        let elapsed = (clock.now - start) / .milliseconds(1) / 1000
        return Double((last["received"]?.int64Value ?? 0) - from) / max(elapsed, 0.001)
    }

    /// A limit is a rate, measured end to end: a job's own `max_speed`, then the global limit,
    /// each measured over seconds of a transfer, falls within half to twice the limit (a
    /// generous bound, for loaded machines; a limiter wrong by a factor of 2 or more fails it).
    @Test func measuredRateFollowsTheLimit() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness()
            try daemon.start()
            defer { daemon.stop() }
            let limit: Int64 = 512 << 10
            let id = try daemon.enqueue([
                "url": .string("\(origin.baseURL)/bytes/\(Self.big)?job=measured"), "name": "measured.bin", "max_speed": .int(limit),
                "segments": 1,
            ])
            // About 4 s at the limit, past the bucket's first burst (a tenth of a second's worth).
            let own = try measuredRate(daemon, id, bytes: 2 << 20)
            #expect(own >= Double(limit) / 2 && own <= Double(limit) * 2, "job limit \(limit) B/s, measured \(Int(own)) B/s")

            _ = try daemon.call("set_speed", ["global": true, "max_speed": .int(limit)])
            _ = try daemon.call("set_speed", ["id": .int(id), "max_speed": 0])
            let global = try measuredRate(daemon, id, bytes: 2 << 20)
            #expect(global >= Double(limit) / 2 && global <= Double(limit) * 2, "global limit \(limit) B/s, measured \(Int(global)) B/s")
            _ = try daemon.call("cancel", ["id": .int(id)])
        }
    }

    /// A `speed_schedule` switches at its boundary in a live daemon: limited until 12:00, no
    /// limit after. The daemon's clock is set (a test hook, `DLD_TEST_CLOCK_OFFSET`) to 30 s
    /// before 12:00 local time: the limit in force, then its end, are seen in `stats`, and the
    /// held-back job completes once it is lifted.
    @Test func scheduleSwitchesAtItsBoundary() async throws {
        try await withOrigin { origin in
            let calendar = Calendar.current
            let noon = try #require(calendar.date(bySettingHour: 12, minute: 0, second: 0, of: Date()))
            let offset = noon.addingTimeInterval(-30).timeIntervalSinceNow
            let daemon = try DaemonHarness(config: "speed_schedule = \"11:00-12:00 32K\"\n")
            daemon.extraEnvironment["DLD_TEST_CLOCK_OFFSET"] = String(offset)
            try daemon.start()
            defer { daemon.stop() }
            let before = try #require(try daemon.call("stats")["max_speed"])
            #expect(before["limit"] == 32768 && before["source"] == "schedule", "\(before.serializedString())")
            func near(_ value: JSONValue?, _ date: Date) -> Bool {
                guard let text = value?.stringValue, let shown = ISO8601DateFormatter().date(from: text) else { return false }
                return abs(shown.timeIntervalSince(date)) < 2
            }
            #expect(near(before["next_change_at"], noon), "\(before.serializedString())")
            let size: Int64 = 8 << 20
            let id = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/\(size)"), "name": "scheduled.bin"])
            let held = try daemon.waitForJob(id) { ($0["received"]?.int64Value ?? 0) > 0 }
            #expect(held["state"] == "running", "\(held.serializedString())")

            // The boundary: stats shows no limit (an event of the daemon's clock, waited for).
            let deadline = Date().addingTimeInterval(90)
            var after = JSONValue.null
            while Date() < deadline {
                after = try daemon.call("stats")["max_speed"] ?? .null
                if after["limit"] == 0 { break }
                // Still before it: the job is held back (32 KiB/s for at most 30 s is < 1 MiB).
                #expect(try daemon.job(id)["state"] == "running")
                usleep(100_000)
            }
            #expect(after["limit"] == 0 && after["source"] == "max_speed", "\(after.serializedString())")
            #expect(near(after["next_change_at"], noon.addingTimeInterval(23 * 3600)), "\(after.serializedString())")
            #expect(try daemon.waitForState(id, ["completed", "failed", "waiting"])["state"] == "completed")
            try expectOriginBytes(at: daemon.downloadDir + "/scheduled.bin", count: Int(size))
        }
    }

    /// `max_speed` and `speed_schedule` from the config file, shown by stats; a reload applies a
    /// new `max_speed` live; a broken schedule is refused with its line.
    @Test func configLimitsAndReload() throws {
        let daemon = try DaemonHarness(config: "max_speed = \"2M\"\nspeed_schedule = \"00:00-00:00 0\"\n")
        try daemon.start()
        defer { daemon.stop() }
        let speed = try #require(try daemon.call("stats")["max_speed"])
        #expect(speed["limit"] == 0 && speed["source"] == "schedule" && speed["config"] == .int(2 << 20), "\(speed.serializedString())")
        #expect(speed["schedule"] == "00:00-00:00 0")

        try "max_speed = 1048576\n".write(toFile: daemon.root + "/config.toml", atomically: true, encoding: .utf8)
        daemon.send(SIGHUP)
        let deadline = Date().addingTimeInterval(30)
        var now = JSONValue.null
        while Date() < deadline {
            now = try daemon.call("stats")["max_speed"] ?? .null
            if now["limit"] == .int(1 << 20) { break }
            usleep(50_000)
        }
        #expect(now["limit"] == .int(1 << 20) && now["source"] == "max_speed" && now["schedule"] == .null, "\(now.serializedString())")

        let bad = daemon.root + "/bad.toml"
        try "speed_schedule = \"08:00-18:00 2M, 17:00-19:00 1M\"\n".write(toFile: bad, atomically: true, encoding: .utf8)
        let refused = try runProgram(BuiltProducts.path("dld"), ["--config", bad, "--print-config"], environment: daemon.environment)
        #expect(
            refused.status != 0 && refused.stderr.contains("line 1: speed_schedule: 17:00-19:00 overlaps 08:00-18:00"), "\(refused.stderr)")
        let good = daemon.root + "/good.toml"
        try "max_speed = \"512K\"\nspeed_schedule = \"08:00-18:00 2M\"\n".write(toFile: good, atomically: true, encoding: .utf8)
        let printed = try runProgram(BuiltProducts.path("dld"), ["--config", good, "--print-config"], environment: daemon.environment)
        #expect(
            printed.stdout.contains("max_speed = \"512K\"\n") && printed.stdout.contains("speed_schedule = \"08:00-18:00 2M\"\n"),
            "\(printed.stdout)")
    }

    /// A running job gets a new URL whose server has the same strong ETag: the transfer starts
    /// again from the bytes it had (a range with If-Range), and the new URL serves only the rest.
    /// One stream (`segments: 1`), so that the rest is one request (segmented resumes are
    /// SegmentedTests' subject).
    @Test func changedURLWithSameValidatorsKeepsTheBytes() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness()
            try daemon.start()
            defer { daemon.stop() }
            let id = try daemon.enqueue([
                "url": .string("\(origin.baseURL)/bytes/\(Self.size)?token=old"), "name": "kept.bin", "max_speed": 262144, "segments": 1,
            ])
            try daemon.waitForJob(id) { ($0["received"]?.int64Value ?? 0) >= 300_000 }
            let newURI = "/bytes/\(Self.size)?token=new"
            let changed = try daemon.call("change", ["id": .int(id), "url": .string(origin.baseURL + newURI)])
            #expect(changed["url"]?.stringValue == origin.baseURL + newURI)
            #expect(changed["state"] == "running")
            _ = try daemon.call("set_speed", ["id": .int(id), "max_speed": 0])
            let done = try daemon.waitForState(id, ["completed", "failed", "waiting"])
            #expect(done["state"] == "completed", "\(done.serializedString())")
            try expectOriginBytes(at: daemon.downloadDir + "/kept.bin", count: Int(Self.size))
            let asked = origin.requests.filter { $0.uri == newURI }
            #expect(asked.count == 1)
            let range = try #require(asked.first?.header("range"))
            let kept = try #require(Int64(range.dropFirst("bytes=".count).dropLast()))
            #expect(kept >= 300_000)
            #expect(asked.first?.header("if-range") == "\"v1-\(Self.size)\"")
            #expect(origin.bytesServed(uri: newURI) == Self.size - kept)
            #expect(!daemon.log.contains("starting over"))
        }
    }

    /// A new URL whose server has another ETag: the download starts over from 0, `status` says
    /// why (`started_over`) while it runs, and the file is the new one, byte-exact. A paused job
    /// changed then resumed does the same.
    @Test func changedURLWithAnotherETagStartsOverWithTheReason() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness()
            try daemon.start()
            defer { daemon.stop() }
            let id = try daemon.enqueue([
                "url": .string("\(origin.baseURL)/bytes/\(Self.size)?etag=first"), "name": "again.bin", "max_speed": 262144, "segments": 1,
            ])
            try daemon.waitForJob(id) { ($0["received"]?.int64Value ?? 0) >= 300_000 }
            let newURI = "/bytes/\(Self.size)?etag=second"
            _ = try daemon.call("change", ["id": .int(id), "url": .string(origin.baseURL + newURI)])
            let over = try daemon.waitForJob(id) { $0["error"]?["code"] == "started_over" || $0["state"] != "running" }
            #expect(over["state"] == "running", "\(over.serializedString())")
            let message = over["error"]?["message"]?.stringValue ?? ""
            #expect(message.contains("\"second\"") && message.contains("\"first\""), "\(message)")
            #expect(MessageRules.problems(message, mustName: ["127.0.0.1"]).isEmpty, "\(message)")
            let shown = try daemon.dlctl(["status", String(id)])
            #expect(shown.stdout.contains("[started_over]"), "\(shown.stdout)")
            _ = try daemon.call("set_speed", ["id": .int(id), "max_speed": 0])
            #expect(try daemon.waitForState(id, ["completed", "failed", "waiting"])["state"] == "completed")
            try expectOriginBytes(at: daemon.downloadDir + "/again.bin", count: Int(Self.size))
            #expect(origin.bytesServed(uri: newURI) == Self.size)

            // Paused, then changed: the next start finds another ETag and starts over.
            let paused = try daemon.enqueue([
                "url": .string("\(origin.baseURL)/bytes/\(Self.size)?etag=one"), "name": "paused.bin", "max_speed": 262144, "segments": 1,
            ])
            try daemon.waitForJob(paused) { ($0["received"]?.int64Value ?? 0) >= 300_000 }
            _ = try daemon.call("pause", ["id": .int(paused)])
            let other = "/bytes/\(Self.size)?etag=two"
            let out = try daemon.dlctl(["set-url", String(paused), origin.baseURL + other])
            #expect(out.status == 0 && out.stdout.contains("paused"), "\(out.stdout)\(out.stderr)")
            _ = try daemon.call("set_speed", ["id": .int(paused), "max_speed": 0])
            _ = try daemon.call("resume", ["id": .int(paused)])
            #expect(try daemon.waitForState(paused, ["completed", "failed", "waiting"])["state"] == "completed")
            try expectOriginBytes(at: daemon.downloadDir + "/paused.bin", count: Int(Self.size))
            #expect(origin.bytesServed(uri: other) == Self.size)
            #expect(daemon.waitForLog("starting over"))
        }
    }

    /// Secrets in a new URL and headers are shown redacted in the reply, status and the log, and
    /// still sent to the server; `change` and `set_speed` refuse what enqueue refuses, unknown
    /// jobs and finished ones.
    @Test func changeRedactsSecretsAndRefusesBadRequests() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness()
            try daemon.start()
            defer { daemon.stop() }
            let id = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/1000"), "name": "s.bin", "paused": true])
            let secretURL = "http://alice:hunter2@127.0.0.1:\(origin.port)/bytes/1000?k=v"
            let changed = try daemon.call(
                "change",
                [
                    "id": .int(id), "url": .string(secretURL),
                    "headers": ["Authorization": "Bearer tok-123", "X-Trace": "7"],
                ])
            for job in [changed, try daemon.job(id)] {
                #expect(job["url"]?.stringValue == "http://alice:***@127.0.0.1:\(origin.port)/bytes/1000?k=v")
                let text = job.serializedString()
                #expect(!text.contains("hunter2") && !text.contains("tok-123"), "\(text)")
                #expect(text.contains("<redacted>") && text.contains("X-Trace"))
            }
            _ = try daemon.call("resume", ["id": .int(id)])
            #expect(try daemon.waitForState(id, ["completed", "failed", "waiting"])["state"] == "completed")
            let sent = try #require(origin.requests.last { $0.uri == "/bytes/1000?k=v" })
            #expect(sent.header("authorization") == "Bearer tok-123")
            #expect(sent.header("x-trace") == "7")
            #expect(!daemon.log.contains("hunter2") && !daemon.log.contains("tok-123"))

            let other = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/10"), "name": "t.bin", "paused": true])
            func code(_ method: String, _ params: [String: JSONValue]) throws -> String {
                try daemon.callError(method, params).stableCode
            }
            #expect(try code("change", ["id": 999, "url": .string(origin.baseURL + "/bytes/1")]) == "job_not_found")
            #expect(try code("change", ["id": .int(id), "url": .string(origin.baseURL + "/bytes/1")]) == "invalid_state")
            #expect(try code("change", ["id": .int(other), "url": "ftp://example.com/x"]) == "invalid_url")
            #expect(try code("change", ["id": .int(other), "url": "not a url"]) == "invalid_url")
            #expect(try code("change", ["id": .int(other), "headers": ["Range": "bytes=0-"]]) == "invalid_params")
            #expect(try code("change", ["id": .int(other)]) == "invalid_params")
            #expect(try code("change", ["id": .int(other), "path": "/tmp/x"]) == "invalid_params")
            #expect(try code("set_speed", ["id": 999, "max_speed": 1]) == "job_not_found")
            #expect(try code("set_speed", ["id": .int(id), "max_speed": 1]) == "invalid_state")
            #expect(try code("set_speed", ["id": .int(other), "global": true, "max_speed": 1]) == "invalid_params")
            #expect(try code("set_speed", ["id": .int(other), "max_speed": -1]) == "invalid_params")
            #expect(try code("set_speed", ["id": .int(other)]) == "invalid_params")
            #expect(try code("enqueue", ["url": .string(origin.baseURL + "/bytes/1"), "max_speed": "fast"]) == "invalid_params")
            #expect(try daemon.job(other)["url"]?.stringValue == origin.baseURL + "/bytes/10")
        }
    }
}
