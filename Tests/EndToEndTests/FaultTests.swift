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
    /// A connection dropped mid-body: waiting(network, truncated); every retry asks for a
    /// range that starts at the offset committed when the previous attempt stopped, and in total
    /// the origin serves the file once plus at most `refetchPerDrop` bytes per drop.
    @Test func droppedConnectionsResume() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: slowRetries)
            try daemon.start()
            defer { daemon.stop() }
            let size: Int64 = 1_000_000
            let dropAfter: Int64 = 300_000
            // The origin closes 300 ms after its last byte: when the close comes first,
            // AsyncHTTPClient fails the body and drops the parts it still buffers (a limit of the
            // client, not of dld; they are fetched again), and on a busy machine that can be a
            // whole drop's worth. What this test proves is that every byte that reached dld is
            // kept: a resume refetches at most a chunk in flight, where one that kept nothing
            // would refetch up to `dropAfter` per drop.
            let refetchPerDrop: Int64 = 128 << 10
            let id = try daemon.enqueue([
                "url": .string("\(origin.baseURL)/bytes/\(size)?drop_after=\(dropAfter)&linger=300"), "name": "drop.bin",
            ])
            // The committed offset each time the job stopped on a drop.
            var committed: [Int64] = []
            var job = try daemon.waitForJob(id) { ["completed", "failed", "waiting"].contains($0["state"]?.stringValue ?? "") }
            while job["state"] == "waiting" && committed.count < 30 {
                #expect(job["error"]?["code"] == "truncated", "\(job.serializedString())")
                #expect(job["wait_reason"] == "network")
                committed.append(try #require(job["received"]?.int64Value))
                // resume answers once the job is queued again, so the next waiting state seen is new.
                _ = try daemon.call("resume", ["id": .int(id)])
                job = try daemon.waitForJob(id) { ["completed", "failed", "waiting"].contains($0["state"]?.stringValue ?? "") }
            }
            #expect(job["state"] == "completed", "\(job.serializedString())")
            try expectOriginBytes(at: daemon.downloadDir + "/drop.bin", count: Int(size))
            #expect(job["sha256"]?.stringValue == (try sha256sum(daemon.downloadDir + "/drop.bin")))

            let requests = origin.requests.filter { $0.path == "/bytes/\(size)" }
            #expect(committed.count >= 3, "a 1 MB file that drops every 300 kB stops at least 3 times: \(committed)")
            // Required: the walk below reads committed[n - 1] for every request.
            try #require(requests.count == committed.count + 1, "one request per attempt: \(requests.map(\.uri))")
            // The first asks from byte 0 (with an end: the file might have been fetched in ranges).
            #expect(requests.first.map { $0.header("range") == nil || $0.header("range")?.hasPrefix("bytes=0-") == true } == true)
            var served: Int64 = 0
            for (n, request) in requests.enumerated() {
                let start: Int64 = n == 0 ? 0 : committed[n - 1]
                if n > 0 {
                    #expect(start > (n >= 2 ? committed[n - 2] : 0), "every stop keeps bytes: \(committed)")
                    #expect(request.header("range") == "bytes=\(start)-", "attempt \(n + 1) after committing \(start)")
                    #expect(request.header("if-range") == "\"v1-\(size)\"")
                }
                let sent = min(dropAfter, size - start)
                served += sent
                if n < committed.count {
                    let lost = start + sent - committed[n]
                    #expect(lost >= 0 && lost <= refetchPerDrop, "drop \(n + 1): served up to \(start + sent), committed \(committed[n])")
                }
            }
            #expect(origin.bytesServed == served)
            #expect(
                origin.bytesServed <= size + refetchPerDrop * Int64(committed.count),
                "\(origin.bytesServed) bytes served for \(size) with \(committed.count) drops: \(committed)")
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

    /// 503 and 429 with Retry-After: waiting(retry) until the time the server asked for (capped
    /// at retry_max_delay), not the backoff's. Judged from the job's own timestamps (both set by
    /// dld in the same change), so no clock of the test is involved.
    @Test func retryAfterIsHonoured() async throws {
        try await withOrigin { origin in
            // Backoff draws below 60 s (full jitter, base 60); the servers ask for 120 s and 3600 s.
            let daemon = try DaemonHarness(config: slowRetries)
            try daemon.start()
            defer { daemon.stop() }
            func delay(_ job: JSONValue) throws -> TimeInterval {
                let next = try #require(job["next_attempt_at"]?.stringValue.flatMap { try? Date($0, strategy: .iso8601) })
                let changed = try #require(job["updated_at"]?.stringValue.flatMap { try? Date($0, strategy: .iso8601) })
                return next.timeIntervalSince(changed)
            }
            let busy = try daemon.enqueue(["url": .string("\(origin.baseURL)/status/503?retry_after=120"), "name": "busy.bin"])
            let waiting = try daemon.waitForJob(busy) { $0["state"] == "waiting" }
            #expect(waiting["wait_reason"] == "retry")
            #expect(waiting["error"]?["code"] == "http_status")
            #expect(waiting["error"]?["message"]?.stringValue?.contains("503") == true)
            // Timestamps are whole seconds: 120 ± 1.
            #expect(abs(try delay(waiting) - 120) <= 1, "\(waiting.serializedString())")

            let limited = try daemon.enqueue(["url": .string("\(origin.baseURL)/status/429?retry_after=3600"), "name": "limited.bin"])
            let job = try daemon.waitForJob(limited) { $0["state"] == "waiting" }
            #expect(job["error"]?["message"]?.stringValue?.contains("429") == true)
            // Clamped to retry_max_delay (600 s), not an hour.
            #expect(abs(try delay(job) - 600) <= 1, "\(job.serializedString())")

            // Retry-After: 1 twice, then the file: the job gets there by itself.
            let flaky = try daemon.enqueue(["url": .string("\(origin.baseURL)/fail_first/2/bytes/5000"), "name": "flaky.bin"])
            let first = try daemon.waitForJob(flaky) { $0["state"] == "waiting" }
            #expect(try delay(first) <= 2, "\(first.serializedString())")
            let done = try daemon.waitForState(flaky, ["completed", "failed"], timeout: 60)
            #expect(done["state"] == "completed")
            try expectOriginBytes(at: daemon.downloadDir + "/flaky.bin", count: 5000)
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
            let id = try daemon.enqueue([
                "url": .string("\(origin.baseURL)/bytes/\(size)?rate=600000"), "name": "blocked.bin",
                "checksum": .string("sha256:\(digest)"),
            ])
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
    /// fetched twice. One stream (`segments: 1`): the budget of bytes fetched again is that of
    /// one 4 MB/s connection (ranges lose what each of them had not committed; SegmentedTests
    /// kills a download of several ranges).
    @Test func tenKillsDuringOneDownload() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: quickRetries + "\ncheckpoint_interval = 0.25\n")
            try daemon.start()
            let size = 32 << 20
            let id = try daemon.enqueue([
                "url": .string("\(origin.baseURL)/bytes/\(size)?rate=4000000"), "name": "killed.bin", "segments": 1,
            ])
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

    /// Mounts a tmpfs of `size` on `folder` for the test's life. The tests run as root (CI
    /// does); where it cannot mount, the test fails saying so rather than testing something else.
    func withTmpfs(_ folder: String, size: String, _ body: () async throws -> Void) async throws {
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        let mount = try runProgram("/bin/mount", ["-t", "tmpfs", "-o", "size=\(size),mode=0755", "tmpfs", folder])
        guard mount.status == 0 else {
            Issue.record("cannot mount a tmpfs (the disk tests need root): \(mount.stderr)")
            return
        }
        defer { _ = try? runProgram("/bin/umount", ["-l", folder]) }
        try await body()
    }

    /// A file bigger than its filesystem, of a size the server does not announce (chunked, so
    /// nothing is reserved up front): the write in the middle of the body fails with ENOSPC;
    /// the job waits with disk_space and keeps the bytes it wrote; once the filesystem grows
    /// it continues by itself with a range from the kept offset and completes byte-exact.
    @Test func fullDiskWaitsAndRecovers() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: quickRetries + "\ndisk_recheck = 3\n")
            let small = daemon.downloadDir + "/small"
            try await withTmpfs(small, size: "2m") {
                try daemon.start()
                defer { daemon.stop() }
                let size = 3 << 20
                // One stream: the first request of a segmented download is a range, whose answer
                // would announce the size (Content-Range) that this test keeps unknown.
                let id = try daemon.enqueue([
                    "url": .string("\(origin.baseURL)/bytes/\(size)?nolength=1"), "dir": .string(small), "name": "big.bin", "segments": 1,
                ])
                let waiting = try daemon.waitForJob(id) { $0["state"] != "queued" && $0["state"] != "running" }
                #expect(waiting["state"] == "waiting", "\(waiting.serializedString())")
                #expect(waiting["wait_reason"] == "disk_space")
                // The write in the middle of the body failed (no size was announced, so nothing
                // was reserved and the start-up check had nothing to compare).
                #expect(waiting["error"]?["code"] == "disk_full", "\(waiting.serializedString())")
                #expect(waiting["error"]?["message"]?.stringValue?.contains("No space left") == true, "\(waiting.serializedString())")
                #expect(origin.requests.first?.header("range") == nil)
                let kept = try #require(waiting["received"]?.int64Value)
                #expect(kept > 0 && kept < Int64(size), "\(kept)")
                let onDisk = try #require(try FileManager.default.attributesOfItem(atPath: small + "/big.bin.part")[.size] as? Int)
                #expect(Int64(onDisk) >= kept)

                #expect(try runProgram("/bin/mount", ["-o", "remount,size=8m", small]).status == 0)
                let done = try daemon.waitForState(id, ["completed", "failed"], timeout: 60)
                #expect(done["state"] == "completed", "\(done.serializedString())")
                try expectOriginBytes(at: small + "/big.bin", count: size)
                #expect(origin.requests.last?.header("range") == "bytes=\(kept)-", "\(origin.requests.map { $0.header("range") ?? "-" })")
            }
        }
    }

    /// The low-space floor is also checked while the body streams (at checkpoints): another
    /// program filling the disk below min_free makes the job wait with disk_space before the
    /// disk is full; freeing space lets it finish.
    @Test func floorIsCheckedWhileStreaming() async throws {
        try await withOrigin { origin in
            // 8 MiB filesystem, 2 MiB floor: a 2 MiB file fits at the start.
            let daemon = try DaemonHarness(
                config:
                    "retry_base = 0.05\nretry_max_delay = 0.2\nread_timeout = 1\nmin_free = 2097152\ndisk_recheck = 3\ncheckpoint_interval = 0.1\n"
            )
            let small = daemon.downloadDir + "/small"
            try await withTmpfs(small, size: "8m") {
                try daemon.start()
                defer { daemon.stop() }
                let size = 2 << 20
                let id = try daemon.enqueue([
                    "url": .string("\(origin.baseURL)/bytes/\(size)?rate=500000"), "dir": .string(small), "name": "floor.bin",
                ])
                try daemon.waitForJob(id) { $0["state"] == "running" && ($0["received"]?.int64Value ?? 0) > 0 }
                // Another program takes 5 MiB: the space reserved for the file stays, but less
                // than the floor is left.
                let filler = small + "/filler"
                try Data(count: 5 << 20).write(to: URL(fileURLWithPath: filler))
                let waiting = try daemon.waitForJob(id) { $0["state"] != "queued" && $0["state"] != "running" }
                #expect(waiting["state"] == "waiting", "\(waiting.serializedString())")
                #expect(waiting["wait_reason"] == "disk_space")
                #expect(waiting["error"]?["code"] == "disk_space")
                #expect(waiting["error"]?["message"]?.stringValue?.contains("below the floor") == true, "\(waiting.serializedString())")
                let kept = try #require(waiting["received"]?.int64Value)
                #expect(kept > 0 && kept < Int64(size))
                try FileManager.default.removeItem(atPath: filler)
                let done = try daemon.waitForState(id, ["completed", "failed"], timeout: 60)
                #expect(done["state"] == "completed", "\(done.serializedString())")
                try expectOriginBytes(at: small + "/floor.bin", count: size)
                #expect(origin.requests.last?.header("range") == "bytes=\(kept)-")
            }
        }
    }

    /// Start-up reconciliation: a partial file longer than its committed bytes is cut back; a
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
            let pausedJob = try daemon.job(paused)
            // One stream: the committed offset. Ranges (4 MiB is segmented by default): the
            // furthest committed byte of any range.
            let committed = try #require(
                pausedJob["ranges"]?.arrayValue.map { $0.compactMap { $0.arrayValue?[1].int64Value }.max() ?? 0 }
                    ?? pausedJob["received"]?.int64Value)
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
            #expect(daemon.waitForLog("removed the staging folder"))
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
            let events = RPCClient(socketPath: daemon.socket)
            defer { events.close() }
            _ = try events.call("subscribe", ["ids": [.int(id)]])
            _ = try daemon.call("resume", ["id": .int(id)])
            // Nothing starts while the queue is paused. A resume is one turn of the scheduler
            // whose claims are committed before it is answered: a scheduler that ignored the
            // pause would have the job `running` by now. A second turn (the resume of another
            // job) is a second chance for it, ended before its answer too.
            #expect(try daemon.job(id)["state"] == "queued")
            let other = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/1000"), "name": "h.bin", "paused": true])
            _ = try daemon.call("resume", ["id": .int(other)])
            #expect(try daemon.job(id)["state"] == "queued")
            #expect(try daemon.job(other)["state"] == "queued")
            #expect(origin.requests.isEmpty)
            // The job's events so far: its resume, no start (read until the stream is quiet).
            try events.setReadTimeout(0.5)
            var seen: [String] = []
            while let message = try? events.readMessage() {
                if message["method"] == "job.state" { seen.append(message["params"]?["state"]?.stringValue ?? "") }
            }
            #expect(seen == ["queued"], "\(seen)")
            let human = try daemon.dlctl(["stats"])
            #expect(human.stdout.contains("paused"))
            let resumed = try daemon.dlctl(["queue", "resume"])
            #expect(resumed.stdout.contains("queue running"))
            #expect(try daemon.waitForState(id, ["completed", "failed"])["state"] == "completed")
            #expect(try daemon.waitForState(other, ["completed", "failed"])["state"] == "completed")
            // A clean stop and start: the queue runs.
            #expect(daemon.stop() == 0)
            try daemon.start()
            #expect(try daemon.call("stats")["queue_paused"] == false)
        }
    }
}
