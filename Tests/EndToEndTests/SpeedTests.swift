import DLCore
import DLRPC
import DLTestSupport
import Foundation
import Testing

/// Speed limits (`max_speed`, `speed_schedule`, `set_speed`) with the real dld and the test
/// origin. Nothing here asserts a time: a limited job is shown to be held back by an unlimited
/// one that finishes first.
@Suite(.serialized) struct SpeedTests {
    static let size: Int64 = 4 << 20
    /// Big enough that buffers cannot hold half of it (the origin's send buffer, the kernel's
    /// autotuned TCP windows and a batch of reads in dld held about 12 MiB here): 34 minutes at
    /// 32 KiB/s, a second at full speed.
    static let big: Int64 = 64 << 20

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
        #expect(refused.status != 0 && refused.stderr.contains("line 1: speed_schedule: 17:00-19:00 overlaps 08:00-18:00"), "\(refused.stderr)")
        let good = daemon.root + "/good.toml"
        try "max_speed = \"512K\"\nspeed_schedule = \"08:00-18:00 2M\"\n".write(toFile: good, atomically: true, encoding: .utf8)
        let printed = try runProgram(BuiltProducts.path("dld"), ["--config", good, "--print-config"], environment: daemon.environment)
        #expect(printed.stdout.contains("max_speed = \"512K\"\n") && printed.stdout.contains("speed_schedule = \"08:00-18:00 2M\"\n"), "\(printed.stdout)")
    }
}
