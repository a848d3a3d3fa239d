import DLCore
import DLRPC
import DLTestSupport
import Foundation
import Testing

/// Short retry delays so that faults clear within a test; a long base where a test wants to
/// see the waiting state before it moves on.
let quickRetries = """
    retry_base = 0.05
    retry_max_delay = 0.2
    read_timeout = 1
    min_free = 0
    """
let slowRetries = """
    retry_base = 60
    retry_max_delay = 600
    read_timeout = 1
    min_free = 0
    """

func sha256sum(_ path: String) throws -> String {
    let out = try runProgram("/usr/bin/sha256sum", [path])
    return String(out.stdout.prefix(64))
}

/// Faults of the network, the server, the disk and the daemon itself (issue: downloads that
/// survive anything). Each ends in the right state with the right reason and code, and in a
/// correct file when the fault clears.
@Suite(.serialized) struct FaultTests {
    /// A connection dropped mid-body: waiting(network, truncated); the retry continues from
    /// the bytes kept, and in total each byte is fetched once.
    @Test func droppedConnectionsResume() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: slowRetries)
            try daemon.start()
            defer { daemon.stop() }
            let size = 1_000_000
            let id = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/\(size)?drop_after=300000"), "name": "drop.bin"])
            try daemon.waitingThenResume(id, code: "truncated", reason: "network")
            var done = try daemon.waitForJob(id) { ["completed", "failed", "waiting"].contains($0["state"]?.stringValue ?? "") }
            while done["state"] == "waiting" {
                #expect(done["error"]?["code"] == "truncated")
                _ = try daemon.call("resume", ["id": .int(id)])
                usleep(50_000)
                done = try daemon.waitForJob(id) { ["completed", "failed", "waiting"].contains($0["state"]?.stringValue ?? "") }
            }
            #expect(done["state"] == "completed", "\(done.serializedString())")
            try expectOriginBytes(at: daemon.downloadDir + "/drop.bin", count: size)
            // Each retry continues where the kept bytes end, so every retry starts further on.
            // When the server closes, the HTTP client may report the close before it hands over
            // the bytes it still buffers; those are fetched again, never more than a drop's
            // worth per retry.
            let starts = origin.requests.compactMap { $0.header("range") }
                .compactMap { Int64($0.dropFirst(6).dropLast()) }
            #expect(!starts.isEmpty && starts.enumerated().allSatisfy { $1 > 0 && $1 <= 300_000 * Int64($0 + 1) }, "\(starts)")
            #expect(starts == starts.sorted() && Set(starts).count == starts.count, "\(starts)")
            #expect(origin.bytesServed <= Int64(size) + 300_000 * Int64(starts.count), "\(origin.bytesServed) for \(starts)")
            #expect(done["sha256"]?.stringValue == (try sha256sum(daemon.downloadDir + "/drop.bin")))
        }
    }

    /// A server that stalls: the idle read timeout makes it waiting(network, timeout); a slow
    /// trickle is not a stall.
    @Test func stallTimesOutTrickleDoesNot() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: slowRetries)
            try daemon.start()
            defer { daemon.stop() }
            let id = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/200000?stall_after=120000"), "name": "stall.bin"])
            try daemon.waitingThenResume(id, code: "timeout", reason: "network")
            #expect(try daemon.waitForState(id, ["completed", "failed"])["state"] == "completed")
            try expectOriginBytes(at: daemon.downloadDir + "/stall.bin", count: 200_000)
            // 3 s at 60 KB/s with a 1 s read timeout: slow but never idle.
            let trickle = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/180000?rate=60000"), "name": "trickle.bin"])
            let done = try daemon.waitForState(trickle, ["completed", "failed", "waiting"])
            #expect(done["state"] == "completed", "\(done.serializedString())")
            #expect(done["attempts"] == 1)
        }
    }

    /// A body shorter than its Content-Length never completes: waiting(network, truncated).
    @Test func wrongContentLength() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: slowRetries)
            try daemon.start()
            defer { daemon.stop() }
            let id = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/1000?length=2000"), "name": "short.bin"])
            let job = try daemon.waitForJob(id) { $0["state"] != "queued" && $0["state"] != "running" }
            #expect(job["state"] == "waiting")
            #expect(job["wait_reason"] == "network")
            #expect(job["error"]?["code"] == "truncated")
            #expect(!FileManager.default.fileExists(atPath: daemon.downloadDir + "/short.bin"))
        }
    }

    /// The file changed on the server (new ETag): the If-Range resume gets a 200 and the
    /// download starts over from zero into the truncated partial file.
    @Test func changedETagStartsOver() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: quickRetries)
            try daemon.start()
            defer { daemon.stop() }
            let size = 3 << 20
            let id = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/\(size)?rate=2000000"), "name": "etag.bin"])
            try daemon.waitForJob(id) { ($0["received"]?.int64Value ?? 0) > 300_000 }
            _ = try daemon.call("pause", ["id": .int(id)])
            let kept = try #require(try daemon.job(id)["received"]?.int64Value)
            origin.setETag("v2")
            _ = try daemon.call("resume", ["id": .int(id)])
            let done = try daemon.waitForState(id, ["completed", "failed"])
            #expect(done["state"] == "completed", "\(done.serializedString())")
            try expectOriginBytes(at: daemon.downloadDir + "/etag.bin", count: size)
            let resume = try #require(origin.requests.last)
            #expect(resume.header("range") == "bytes=\(kept)-")
            #expect(resume.header("if-range") == "\"v1-\(size)\"")
            #expect(origin.bytesServed >= Int64(size) + kept)
        }
    }

    /// A server that ignores Range: the resume starts over and still ends byte-exact.
    @Test func ignoredRangeStartsOver() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: quickRetries)
            try daemon.start()
            defer { daemon.stop() }
            let size = 2 << 20
            let id = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/\(size)?rate=2000000&norange=1"), "name": "norange.bin"])
            try daemon.waitForJob(id) { ($0["received"]?.int64Value ?? 0) > 200_000 }
            _ = try daemon.call("pause", ["id": .int(id)])
            _ = try daemon.call("resume", ["id": .int(id)])
            let done = try daemon.waitForState(id, ["completed", "failed"])
            #expect(done["state"] == "completed")
            try expectOriginBytes(at: daemon.downloadDir + "/norange.bin", count: size)
        }
    }

    /// 503 and 429 with Retry-After: waiting(retry) until the time the server asked for.
    @Test func retryAfterIsHonoured() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: slowRetries)
            try daemon.start()
            defer { daemon.stop() }
            let id = try daemon.enqueue(["url": .string("\(origin.baseURL)/fail_first/2/bytes/5000"), "name": "busy.bin"])
            let waiting = try daemon.waitForJob(id) { $0["state"] == "waiting" }
            #expect(waiting["wait_reason"] == "retry")
            #expect(waiting["error"]?["code"] == "http_status")
            #expect(waiting["error"]?["message"]?.stringValue?.contains("503") == true)
            // Retry-After: 1, not the 60 s base of the backoff.
            let done = try daemon.waitForState(id, ["completed", "failed"], timeout: 15)
            #expect(done["state"] == "completed")
            try expectOriginBytes(at: daemon.downloadDir + "/busy.bin", count: 5000)

            let limited = try daemon.enqueue(["url": .string("\(origin.baseURL)/status/429?retry_after=3600"), "name": "limited.bin"])
            let job = try daemon.waitForJob(limited) { $0["state"] == "waiting" }
            #expect(job["error"]?["message"]?.stringValue?.contains("429") == true)
            // Clamped to retry_max_delay (600 s), not an hour.
            let next = try #require(job["next_attempt_at"]?.stringValue.flatMap { try? Date($0, strategy: .iso8601) })
            #expect(next.timeIntervalSinceNow < 601)
            #expect(next.timeIntervalSinceNow > 500)
        }
    }

    /// A complete partial file whose publish failed (a file appeared at the destination) is
    /// verified from disk on resume, after the server's 416, and not fetched again.
    @Test func completePartialIsVerifiedNotRefetched() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: quickRetries)
            try daemon.start()
            defer { daemon.stop() }
            let size = 600_000
            let digest = try originDigest(.sha256, count: size)
            let id = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/\(size)?rate=600000"), "name": "blocked.bin",
                                         "checksum": .string("sha256:\(digest)")])
            try daemon.waitForJob(id) { $0["state"] == "running" }
            let target = daemon.downloadDir + "/blocked.bin"
            try Data("someone else's".utf8).write(to: URL(fileURLWithPath: target))
            let failed = try daemon.waitForState(id, ["failed", "completed"])
            #expect(failed["error"]?["code"] == "destination_exists")
            #expect(failed["received"]?.int64Value == Int64(size))
            #expect(try String(contentsOfFile: target, encoding: .utf8) == "someone else's")
            let served = origin.bytesServed
            try FileManager.default.removeItem(atPath: target)
            _ = try daemon.call("resume", ["id": .int(id)])
            let done = try daemon.waitForState(id, ["completed", "failed"])
            #expect(done["state"] == "completed", "\(done.serializedString())")
            #expect(done["digest"]?.stringValue == digest)
            #expect(origin.requests.last?.header("range") == "bytes=\(size)-")
            #expect(origin.bytesServed == served)
            try expectOriginBytes(at: target, count: size)
        }
    }

    /// After max_attempts without progress the job fails with retries_exhausted.
    @Test func retriesExhausted() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: quickRetries + "\nmax_attempts = 3\n")
            try daemon.start()
            defer { daemon.stop() }
            let id = try daemon.enqueue(["url": .string("\(origin.baseURL)/status/500"), "name": "never.bin"])
            let job = try daemon.waitForState(id, ["failed"])
            #expect(job["error"]?["code"] == "retries_exhausted")
            #expect(job["attempts"] == 3)
            #expect(origin.requests.count == 3)
        }
    }

    /// The real dld is SIGKILLed ten times during one download from a throttled origin and
    /// restarted each time: the file is byte-exact, its SHA-256 is right, and few bytes are
    /// fetched twice.
    @Test func tenKillsDuringOneDownload() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: quickRetries + "\ncheckpoint_interval = 0.25\n")
            try daemon.start()
            let size = 32 << 20
            let id = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/\(size)?rate=4000000"), "name": "killed.bin"])
            var kills = 0
            var lastCommitted: Int64 = 0
            while kills < 10 {
                // Let it commit some progress, then kill it without warning.
                let job = try daemon.waitForJob(id, timeout: 30) {
                    ($0["received"]?.int64Value ?? 0) > lastCommitted || $0["state"] == "completed"
                }
                if job["state"] == "completed" { break }
                usleep(400_000)
                daemon.crash()
                kills += 1
                try daemon.start()
                lastCommitted = try daemon.job(id)["received"]?.int64Value ?? 0
            }
            #expect(kills == 10)
            let done = try daemon.waitForState(id, ["completed", "failed"], timeout: 60)
            #expect(done["state"] == "completed", "\(done.serializedString())")
            let path = daemon.downloadDir + "/killed.bin"
            try expectOriginBytes(at: path, count: size)
            #expect(done["sha256"]?.stringValue == (try sha256sum(path)))
            #expect(origin.bytesServed < Int64(size) * 3 / 2, "served \(origin.bytesServed) for \(size)")
            print("ten kills: served \(origin.bytesServed) bytes for a \(size)-byte file (\(Double(origin.bytesServed) / Double(size)))")
            daemon.stop()
        }
    }

    /// A filesystem that fills: the job waits with disk_space, keeps its bytes, and completes
    /// by itself once space is freed. Uses a small tmpfs when the test may mount one (root);
    /// otherwise a min_free above the free space, lowered by restarting with another config.
    @Test func fullDiskWaitsAndRecovers() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: quickRetries + "\ndisk_recheck = 0.3\n")
            let small = daemon.downloadDir + "/small"
            try FileManager.default.createDirectory(atPath: small, withIntermediateDirectories: true)
            let mounted = try runProgram("/bin/mount", ["-t", "tmpfs", "-o", "size=4m", "tmpfs", small]).status == 0
            defer { if mounted { _ = try? runProgram("/bin/umount", ["-l", small]) } }
            try daemon.start()
            defer { daemon.stop() }
            if mounted {
                let filler = small + "/filler"
                try Data(count: 2 << 20).write(to: URL(fileURLWithPath: filler))
                let id = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/\(3 << 20)"), "dir": .string(small), "name": "big.bin"])
                let waiting = try daemon.waitForJob(id) { $0["state"] == "waiting" }
                #expect(waiting["wait_reason"] == "disk_space")
                #expect(waiting["error"]?["code"] == "disk_space")
                try FileManager.default.removeItem(atPath: filler)
                let done = try daemon.waitForState(id, ["completed", "failed"], timeout: 20)
                #expect(done["state"] == "completed", "\(done.serializedString())")
                try expectOriginBytes(at: small + "/big.bin", count: 3 << 20)
            } else {
                print("fullDiskWaitsAndRecovers: cannot mount tmpfs here; using min_free above the free space")
                daemon.stop()
                try "min_free = 9223372036854775807\ndisk_recheck = 0.3\n".write(toFile: daemon.root + "/config.toml", atomically: true, encoding: .utf8)
                try daemon.start()
                let id = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/5000"), "name": "floor.bin"])
                let waiting = try daemon.waitForJob(id) { $0["state"] == "waiting" }
                #expect(waiting["wait_reason"] == "disk_space")
                daemon.stop()
                try "min_free = 0\ndisk_recheck = 0.3\n".write(toFile: daemon.root + "/config.toml", atomically: true, encoding: .utf8)
                try daemon.start()
                #expect(try daemon.waitForState(id, ["completed", "failed"])["state"] == "completed")
            }
        }
    }

    /// Start-up reconciliation: a partial file longer than its committed offset is cut back; a
    /// completed file that is gone is marked file_missing; a leftover partial of a finished job
    /// is removed.
    @Test func reconciliationAtStart() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: quickRetries)
            try daemon.start()
            let done = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/1000"), "name": "done.bin"])
            try daemon.waitForState(done, ["completed"])
            let paused = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/\(4 << 20)?rate=2000000"), "name": "paused.bin"])
            try daemon.waitForJob(paused) { ($0["received"]?.int64Value ?? 0) > 100_000 }
            _ = try daemon.call("pause", ["id": .int(paused)])
            let committed = try #require(try daemon.job(paused)["received"]?.int64Value)
            #expect(daemon.stop() == 0)

            // Garbage past the committed offset, a deleted file, a stray partial of a finished job.
            let partial = daemon.downloadDir + "/paused.bin.part"
            let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: partial))
            try handle.seekToEnd()
            try handle.write(contentsOf: Data(repeating: 0xEE, count: 12345))
            try handle.close()
            try FileManager.default.removeItem(atPath: daemon.downloadDir + "/done.bin")
            try Data("stray".utf8).write(to: URL(fileURLWithPath: daemon.downloadDir + "/done.bin.part"))
            try Data("browser".utf8).write(to: URL(fileURLWithPath: daemon.downloadDir + "/firefox.iso.part"))
            // The staging folder of a group that no longer exists (a crash in the middle of remove).
            let orphan = daemon.downloadDir + "/.gone.dld-staging-77"
            try FileManager.default.createDirectory(atPath: orphan, withIntermediateDirectories: true)
            try Data("partial".utf8).write(to: URL(fileURLWithPath: orphan + "/page.jpg.part"))

            try daemon.start()
            defer { daemon.stop() }
            let size = try #require(try FileManager.default.attributesOfItem(atPath: partial)[.size] as? Int)
            #expect(Int64(size) == committed)
            let missing = try daemon.job(done)
            #expect(missing["state"] == "completed")
            #expect(missing["error"]?["code"] == "file_missing")
            #expect(!FileManager.default.fileExists(atPath: daemon.downloadDir + "/done.bin.part"))
            #expect(FileManager.default.fileExists(atPath: daemon.downloadDir + "/firefox.iso.part"))
            #expect(!FileManager.default.fileExists(atPath: orphan))
            #expect(daemon.log.contains("removed the staging folder"))
            _ = try daemon.call("resume", ["id": .int(paused)])
            #expect(try daemon.waitForState(paused, ["completed", "failed"])["state"] == "completed")
            try expectOriginBytes(at: daemon.downloadDir + "/paused.bin", count: 4 << 20)
        }
    }

    /// Three start-ups in a row that did not finish: the next start pauses the queue and says
    /// so; `queue resume` lets jobs run again. A start-up that finishes resets the count.
    @Test func bootLoopGuard() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: quickRetries)
            let counter = daemon.stateDir + "/failed-starts"
            try daemon.start()
            #expect(try String(contentsOfFile: counter, encoding: .utf8) == "0\n")
            let id = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/1000"), "name": "g.bin", "paused": true])
            daemon.crash()
            // Start-ups that die before serving: a socket path that is a folder cannot be bound.
            let blocked = try DaemonHarness()
            let badSocket = blocked.root + "/is-a-folder"
            try FileManager.default.createDirectory(atPath: badSocket, withIntermediateDirectories: true)
            for n in 1...3 {
                let failed = try runProgram(
                    BuiltProducts.path("dld"),
                    ["--socket", badSocket, "--state-dir", daemon.stateDir, "--download-dir", daemon.downloadDir],
                    environment: daemon.environment)
                #expect(failed.status != 0)
                #expect(try String(contentsOfFile: counter, encoding: .utf8) == "\(n)\n")
            }
            try daemon.start()
            defer { daemon.stop() }
            let stats = try daemon.call("stats")
            #expect(stats["queue_paused"] == true)
            #expect(stats["queue_paused_reason"]?.stringValue?.contains("queue resume") == true)
            _ = try daemon.call("resume", ["id": .int(id)])
            usleep(300_000)
            #expect(try daemon.job(id)["state"] == "queued")
            let human = try daemon.dlctl(["stats"])
            #expect(human.stdout.contains("paused"))
            let resumed = try daemon.dlctl(["queue", "resume"])
            #expect(resumed.stdout.contains("queue running"))
            #expect(try daemon.waitForState(id, ["completed", "failed"])["state"] == "completed")
            // A clean stop and start: the queue runs.
            #expect(daemon.stop() == 0)
            try daemon.start()
            #expect(try daemon.call("stats")["queue_paused"] == false)
        }
    }
}
