import DLCore
import DLRPC
import DLTestSupport
import Foundation
import Testing

/// SIGHUP re-reads the config file while transfers run (issue 10).
@Suite(.serialized) struct ReloadTests {
    /// A larger `max_active` starts the queued jobs at once and new hooks run for them, while
    /// the slow transfer that was running goes on (same attempt, never stopped); a change that
    /// needs a restart is named in the log; sd_notify hears RELOADING=1 then READY=1; a file
    /// with an error is refused whole, its line logged, and the settings in force stay.
    @Test func sighupAppliesWhileATransferRunsAndRefusesABrokenFile() async throws {
        let daemon = try DaemonHarness(config: "max_active = 1\n")
        let notify = try NotifySocket(path: daemon.root + "/notify.sock")
        daemon.extraEnvironment["NOTIFY_SOCKET"] = notify.path
        let hookLog = daemon.root + "/hooks.log"
        let configFile = daemon.root + "/config.toml"
        let origin = try await TestOrigin.start()
        do {
            try daemon.start()
            defer { daemon.stop() }
            #expect(notify.receive(until: "READY=1", timeout: 30) != nil)
            // About 6 s at 100 kB/s: still running when the others are done.
            let slow = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/600000?rate=100000"), "name": "slow.bin"])
            try daemon.waitForState(slow, ["running"])
            let quick = try (1...2).map {
                try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/2000"), "name": .string("quick\($0).bin")])
            }
            #expect(try daemon.job(quick[0])["state"] == "queued")

            try """
            max_active = 3
            worker_name = "renamed"
            on_complete = ["/bin/sh", "-c", "echo new-$DLD_JOB_ID >> \(hookLog)"]
            """.write(toFile: configFile, atomically: true, encoding: .utf8)
            daemon.send(SIGHUP)
            for id in quick { #expect(try daemon.waitForState(id, ["completed", "failed", "waiting"])["state"] == "completed") }
            let running = try daemon.job(slow)
            #expect(
                running["state"] == "running" && running["attempts"] == 1,
                "the running transfer was disturbed: \(running.serializedString())")
            #expect(try daemon.call("stats")["max_active"] == 3)
            #expect(daemon.waitForLog("worker_name changed in the config file; it applies at the next start"), "\(daemon.log.suffix(2000))")
            #expect(daemon.waitForLog("configuration reloaded"))
            let deadline = Date().addingTimeInterval(30)
            var hooks = ""
            while Date() < deadline {
                hooks = (try? String(contentsOfFile: hookLog, encoding: .utf8)) ?? ""
                if quick.allSatisfy({ hooks.contains("new-\($0)") }) { break }
                usleep(20_000)
            }
            #expect(quick.allSatisfy { hooks.contains("new-\($0)") }, "\(hooks)")
            let reloading = try #require(notify.receive(until: "READY=1", timeout: 30))
            #expect(reloading.contains { $0.contains("RELOADING=1") && $0.contains("MONOTONIC_USEC=") }, "\(reloading)")

            try "max_active = 2\nmax_queued = \"lots\"\n".write(toFile: configFile, atomically: true, encoding: .utf8)
            daemon.send(SIGHUP)
            #expect(daemon.waitForLog("line 2: max_queued must be an integer"), "\(daemon.log.suffix(2000))")
            #expect(daemon.waitForLog("the config file was not reloaded"))
            #expect(try daemon.call("stats")["max_active"] == 3)
            #expect(try daemon.job(slow)["state"] == "running")
            #expect(try daemon.waitForState(slow, ["completed", "failed", "waiting"])["state"] == "completed")
            try expectOriginBytes(at: daemon.downloadDir + "/slow.bin", count: 600000)
        } catch {
            try? await origin.shutdown()
            throw error
        }
        try await origin.shutdown()
    }
}
