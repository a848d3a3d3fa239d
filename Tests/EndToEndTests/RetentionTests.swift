import DLCore
import DLRPC
import DLTestSupport
import Foundation
import Testing

/// Records that do not grow forever (issue 11): retention by age, `dlctl rm --finished`,
/// and a job table that gives its space back.
@Suite struct RetentionTests {
    /// With `keep_finished = 1`, completed and canceled records go on their own within a few
    /// sweeps; the downloaded file stays, and a failed record stays (`keep_failed = 0`).
    @Test func oldRecordsGoFilesStay() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(
                config: """
                    keep_finished = "1s"
                    keep_failed = 0
                    max_attempts = 1
                    """)
            try daemon.start()
            defer { daemon.stop() }
            let done = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/5000"), "name": "kept.bin"])
            let canceled = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/5000"), "name": "c.bin", "paused": true])
            _ = try daemon.call("cancel", ["id": .int(canceled)])
            let failed = try daemon.enqueue(["url": .string("\(origin.baseURL)/status/404"), "name": "f.bin"])
            _ = try daemon.waitForJob(done) { $0["state"] == "completed" }
            _ = try daemon.waitForJob(failed) { $0["state"] == "failed" }
            for id in [done, canceled] {
                let deadline = Date().addingTimeInterval(30)
                while Date() < deadline, (try? daemon.job(id)) != nil { usleep(100_000) }
                #expect(try daemon.callError("status", ["id": .int(id)]).stableCode == "job_not_found", "job \(id) is gone")
            }
            #expect(FileManager.default.fileExists(atPath: daemon.downloadDir + "/kept.bin"), "retention never deletes a file")
            try expectOriginBytes(at: daemon.downloadDir + "/kept.bin", count: 5000)
            #expect(try daemon.job(failed)["state"] == "failed", "keep_failed = 0 keeps failed records")
        }
    }

    /// `dlctl rm --finished --older-than` leaves recent records; `--finished` alone takes them,
    /// and not the unfinished or failed ones; a mixed selection is refused.
    @Test func removeFinishedByHand() throws {
        let daemon = try DaemonHarness()
        try daemon.start()
        defer { daemon.stop() }
        let a = try daemon.enqueue(["url": "http://127.0.0.1:9/a", "name": "a.bin", "paused": true])
        let b = try daemon.enqueue(["url": "http://127.0.0.1:9/b", "name": "b.bin", "paused": true])
        _ = try daemon.call("cancel", ["id": .int(a)])
        let recent = try daemon.dlctl(["rm", "--finished", "--older-than", "1h", "--json"])
        #expect(recent.status == 0, "\(recent.stderr)")
        #expect(try JSONValue.parse(Data(recent.stdout.utf8))["count"]?.int64Value == 0, "\(recent.stdout)")
        #expect(try daemon.job(a)["state"] == "canceled")
        let all = try daemon.dlctl(["rm", "--finished", "--failed", "--json"])
        #expect(all.status == 0, "\(all.stderr)")
        #expect(try JSONValue.parse(Data(all.stdout.utf8))["ids"] == [.int(a)], "\(all.stdout)")
        #expect(try daemon.callError("status", ["id": .int(a)]).stableCode == "job_not_found")
        #expect(try daemon.job(b)["state"] == "paused")

        let mixed = try daemon.callError("remove", ["finished": true, "all": true])
        #expect(mixed.stableCode == "invalid_params" && mixed.message.contains("all"), "\(mixed.message)")
        #expect(try daemon.callError("remove", ["older_than": 10]).stableCode == "invalid_params")
        #expect(try daemon.dlctl(["rm", "--older-than", "1d"]).status == 64)
        let badDuration = try daemon.dlctl(["rm", "--finished", "--older-than", "soon"])
        #expect(badDuration.status == 64 && badDuration.stderr.contains("--older-than"), "\(badDuration.stderr)")
    }

    /// After thousands of records are removed, the job table's file shrinks and `stats` says so.
    @Test func theTableShrinksAfterARemove() throws {
        let daemon = try DaemonHarness()
        try daemon.start()
        defer { daemon.stop() }
        let jobs: [JSONValue] = (0..<5000).map {
            .object(["url": .string("http://127.0.0.1:9/some/longer/path/\($0)?token=abcdefghijklmnopqrstuvwxyz"), "paused": true])
        }
        _ = try daemon.call("enqueue", ["jobs": .array(jobs)])
        let full = try #require(try daemon.call("stats")["database_bytes"]?.int64Value)
        #expect(full > 1 << 20, "5000 jobs take over a MiB: \(full)")
        _ = try daemon.call("remove", ["all": true])
        // The pages are freed first (`stats`), the file shrinks at the checkpoint after them.
        let file = daemon.stateDir + "/jobs.sqlite"
        let deadline = Date().addingTimeInterval(30)
        var now = full
        var size = full
        while Date() < deadline {
            now = try #require(try daemon.call("stats")["database_bytes"]?.int64Value)
            size = try #require(try FileManager.default.attributesOfItem(atPath: file)[.size] as? Int64)
            if now < full / 2, size < full / 2 { break }
            usleep(100_000)
        }
        #expect(now < full / 2, "\(now) bytes after removing every job, \(full) before")
        #expect(size < full / 2, "the file itself shrinks: \(size) bytes")
    }
}
