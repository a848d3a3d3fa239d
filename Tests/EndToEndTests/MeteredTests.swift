import DLCore
import DLRPC
import DLTestSupport
import Foundation
import Testing

/// Downloads on a metered connection (issue 11): dld reads NetworkManager's `Metered` property
/// over D-Bus — here from a stand-in on a private bus — and jobs enqueued with
/// `metered: false` wait with `metered` while the connection is metered.
@Suite struct MeteredTests {
    @Test func jobsThatMayNotUseAMeteredConnectionWaitForOneThatIsNot() async throws {
        let bus = try PrivateBus.start()
        defer { bus.stop() }
        let manager = try FakeNetworkManager.start(on: bus, metered: 1)
        defer { manager.stop() }
        try await withOrigin { origin in
            let daemon = try DaemonHarness(
                config: """
                    min_free = 0
                    checkpoint_interval = 0.2
                    """)
            daemon.extraEnvironment["DBUS_SYSTEM_BUS_ADDRESS"] = bus.address
            try daemon.start()
            defer { daemon.stop() }
            #expect(daemon.waitForLog("the connection is metered (NetworkManager)"), "\(daemon.log)")

            // Metered: a job that may not use it waits without an attempt and without a
            // request; a job that says nothing (the config's default allows it) completes.
            let held = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/100001"), "name": "held.bin", "metered": false])
            let free = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/100002"), "name": "free.bin"])
            let group = try daemon.call(
                "enqueue",
                [
                    "group": ["name": "lesson", "dir": .string(daemon.downloadDir + "/lesson")],
                    "jobs": [["url": .string("\(origin.baseURL)/bytes/3000")], ["url": .string("\(origin.baseURL)/bytes/4000")]],
                    "metered": false,
                ])
            let members = (group["results"]?.arrayValue ?? []).compactMap { $0["id"]?.int64Value }
            try #require(members.count == 2)
            let groupID = try #require(group["group"]?["id"]?.int64Value)
            let completed = try daemon.waitForState(free, ["completed", "failed"])
            #expect(completed["state"] == "completed", "\(completed.serializedString())")
            for id in [held] + members {
                let job = try daemon.waitForJob(id) { $0["state"] == "waiting" }
                #expect(job["wait_reason"] == "metered", "\(job.serializedString())")
                #expect(job["attempts"]?.int64Value == 0, "no attempt is used: \(job.serializedString())")
                #expect(job["metered"] == false)
                #expect(job["error"]?["code"] == "metered", "\(job.serializedString())")
            }
            #expect(!origin.requests.contains { $0.path.hasPrefix("/bytes/100001") || $0.path.hasPrefix("/bytes/3000") })
            let shown = try daemon.dlctl(["status"])
            #expect(shown.stdout.contains("waiting(metered)"), "\(shown.stdout)")
            #expect(try daemon.call("status", ["group": .int(groupID)])["group"]?["state"] == "waiting")

            // Not metered any more: they are queued at once and complete.
            try manager.setMetered(false)
            for id in [held] + members {
                let job = try daemon.waitForState(id, ["completed", "failed"])
                #expect(job["state"] == "completed", "\(job.serializedString())")
            }
            try expectOriginBytes(at: daemon.downloadDir + "/held.bin", count: 100_001)
            // The group is published once its members are complete.
            let deadline = Date().addingTimeInterval(60)
            while try daemon.call("status", ["group": .int(groupID)])["group"]?["state"] != "completed", Date() < deadline {
                usleep(50_000)
            }
            try expectOriginBytes(at: daemon.downloadDir + "/lesson/3000", count: 3000)

            // Metered again while such a job runs: it stops into waiting(metered) with its
            // bytes kept, and goes on from them (a ranged request) once it is not metered.
            let size = 4_000_000
            let slow = try daemon.enqueue([
                "url": .string("\(origin.baseURL)/bytes/\(size)?rate=200000"), "name": "slow.bin", "metered": false,
            ])
            _ = try daemon.waitForJob(slow) { $0["state"] == "running" && ($0["received"]?.int64Value ?? 0) > 0 }
            try manager.setMetered(true)
            let stopped = try daemon.waitForJob(slow) { $0["state"] != "running" }
            #expect(stopped["state"] == "waiting" && stopped["wait_reason"] == "metered", "\(stopped.serializedString())")
            #expect(stopped["attempts"]?.int64Value == 0, "\(stopped.serializedString())")
            let kept = try #require(stopped["received"]?.int64Value)
            #expect(kept > 0 && kept < Int64(size), "\(stopped.serializedString())")
            try manager.setMetered(false)
            let done = try daemon.waitForState(slow, ["completed", "failed"])
            #expect(done["state"] == "completed", "\(done.serializedString())")
            try expectOriginBytes(at: daemon.downloadDir + "/slow.bin", count: size)
            let ranges = origin.requests.filter { $0.path.hasPrefix("/bytes/\(size)") }.compactMap { $0.header("range") }
            #expect(ranges.contains("bytes=\(kept)-"), "resumed from the kept bytes: \(ranges)")
        }
    }
}
