import DLCore
import DLRPC
import DLTestSupport
import Foundation
import Testing

/// Starts an origin, runs `body`, and shuts the origin down whatever happens.
func withOrigin(_ body: (TestOrigin) async throws -> Void) async throws {
    try await withStarted(try await TestOrigin.start(), body)
}

/// Runs `body` with a started origin, and shuts it down whatever happens.
func withStarted(_ origin: TestOrigin, _ body: (TestOrigin) async throws -> Void) async throws {
    do {
        try await body(origin)
    } catch {
        try? await origin.shutdown()
        throw error
    }
    try await origin.shutdown()
}

/// The file's bytes equal the origin's first `count` bytes.
func expectOriginBytes(at path: String, count: Int, sourceLocation: SourceLocation = #_sourceLocation) throws {
    let data = try Data(contentsOf: URL(fileURLWithPath: path))
    #expect(data.count == count, sourceLocation: sourceLocation)
    // The first byte that differs, not the two files: Swift Testing diffs the operands of a
    // failed `==`, which took more than 20 minutes of CPU for two files of 3 MiB.
    let expected = TestOrigin.bytes(count: count)
    let differs = zip(data, expected).enumerated().first { $0.element.0 != $0.element.1 }.map { "\($0.offset)" } ?? "none"
    #expect(differs == "none", "content differs from byte \(differs) on", sourceLocation: sourceLocation)
}

/// Polls the job table of a running daemon (a SELECT beside it: SQLite in WAL lets readers
/// in) until job `id`'s committed offset is at least `atLeast`; returns it. `status` shows live
/// counters, so a checkpoint can only be seen here.
func committedReceived(_ daemon: DaemonHarness, _ id: Int64, atLeast: Int64, timeout: TimeInterval) throws -> Int64 {
    let table = daemon.stateDir + "/jobs.sqlite"
    let deadline = Date().addingTimeInterval(timeout)
    var last = ""
    repeat {
        let read = try runProgram(
            "/usr/bin/sqlite3", [table, "SELECT received FROM jobs WHERE id = \(id)"], environment: daemon.environment)
        last = read.stdout + read.stderr
        if read.status == 0, let value = Int64(read.stdout.trimmingCharacters(in: .whitespacesAndNewlines)), value >= atLeast {
            return value
        }
        usleep(50_000)
    } while Date() < deadline
    throw HarnessError("job \(id) had no checkpoint of \(atLeast) bytes within \(timeout) s; last read: \(last)")
}

/// The real `dld` binary on a temp socket and state folder, with a loopback origin.
@Suite(.serialized) struct EndToEndTests {
    /// A multi-MiB file is downloaded byte-exact; no partial file stays behind.
    @Test func downloadsAFile() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness()
            try daemon.start()
            defer { daemon.stop() }
            let size = 8 << 20
            let id = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/\(size)")])
            let job = try daemon.waitForState(id, ["completed", "failed"])
            #expect(job["state"] == "completed", "\(job.serializedString())")
            #expect(job["received"]?.int64Value == Int64(size))
            #expect(job["size"]?.int64Value == Int64(size))
            let path = daemon.downloadDir + "/\(size)"
            #expect(job["path"]?.stringValue == path)
            try expectOriginBytes(at: path, count: size)
            #expect(!FileManager.default.fileExists(atPath: path + ".part"))
        }
    }

    /// Pause keeps the bytes; resume asks only for the rest (Range + If-Range) and completes.
    /// One stream (`segments: 1`); SegmentedTests pauses a download of several ranges.
    @Test func pauseAndResume() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness()
            try daemon.start()
            defer { daemon.stop() }
            let size = 6 << 20
            let id = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/\(size)?rate=3000000"), "name": "slow.bin", "segments": 1])
            try daemon.waitForJob(id) { ($0["received"]?.int64Value ?? 0) > 512 << 10 }
            let paused = try daemon.dlctl(["pause", "\(id)"])
            #expect(paused.status == 0, "\(paused.stderr)")
            let job = try daemon.job(id)
            #expect(job["state"] == "paused")
            let kept = try #require(job["received"]?.int64Value)
            #expect(kept > 0 && kept < Int64(size))
            // The committed offset is on disk, synced; nothing moves while paused.
            let partial = daemon.downloadDir + "/slow.bin.part"
            let onDisk = try #require(try FileManager.default.attributesOfItem(atPath: partial)[.size] as? Int)
            #expect(Int64(onDisk) >= kept)
            // Nothing moves while paused. Instead of a time window: another download runs to
            // its end meanwhile (about a second at its rate), and afterwards the paused job has
            // the same bytes, the same partial file, and the origin had no new request for it.
            let requestsBefore = origin.requests.filter { $0.path == "/bytes/\(size)" }.count
            let other = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/400000?rate=400000"), "name": "other.bin"])
            #expect(try daemon.waitForState(other, ["completed", "failed"])["state"] == "completed")
            let still = try daemon.job(id)
            #expect(still["state"] == "paused")
            #expect(still["received"]?.int64Value == kept)
            #expect(try FileManager.default.attributesOfItem(atPath: partial)[.size] as? Int == onDisk)
            #expect(origin.requests.filter { $0.path == "/bytes/\(size)" }.count == requestsBefore)

            let resumed = try daemon.dlctl(["resume", "\(id)"])
            #expect(resumed.status == 0, "\(resumed.stderr)")
            let done = try daemon.waitForState(id, ["completed", "failed"])
            #expect(done["state"] == "completed", "\(done.serializedString())")
            try expectOriginBytes(at: daemon.downloadDir + "/slow.bin", count: size)
            let rangeRequests = origin.requests.filter { $0.header("range") != nil }
            let range = try #require(rangeRequests.last)
            #expect(range.header("range") == "bytes=\(kept)-")
            #expect(range.header("if-range") == "\"v1-\(size)\"")
            // Only the missing bytes were fetched again (plus what was in flight at the pause).
            #expect(origin.bytesServed < Int64(size) + (2 << 20))
        }
    }

    /// Cancel stops the transfer and removes its partial data; the job stays as canceled.
    @Test func cancelRemovesPartial() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness()
            try daemon.start()
            defer { daemon.stop() }
            let id = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/\(20 << 20)?rate=2000000"), "name": "c.bin"])
            try daemon.waitForJob(id) { ($0["received"]?.int64Value ?? 0) > 0 }
            let result = try daemon.dlctl(["cancel", "\(id)"])
            #expect(result.status == 0, "\(result.stderr)")
            #expect(try daemon.job(id)["state"] == "canceled")
            #expect(!FileManager.default.fileExists(atPath: daemon.downloadDir + "/c.bin.part"))
            #expect(!FileManager.default.fileExists(atPath: daemon.downloadDir + "/c.bin"))
            let removed = try daemon.dlctl(["rm", "\(id)"])
            #expect(removed.status == 0)
            #expect(try daemon.callError("status", ["id": .int(id)]).stableCode == "job_not_found")
        }
    }

    /// Jobs survive a restart with the same ids and states; a SIGKILLed transfer resumes.
    @Test func restartKeepsJobsAndResumesAfterCrash() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness()
            try daemon.start()
            var ids: [Int64] = []
            for n in 1...3 {
                ids.append(
                    try daemon.enqueue([
                        "url": .string("\(origin.baseURL)/bytes/\(n * 1000)"), "paused": true, "meta": ["n": .int(Int64(n))],
                    ]))
            }
            let before = try daemon.call("list")["jobs"]
            #expect(daemon.stop() == 0)
            try daemon.start()
            #expect(try daemon.call("list")["jobs"] == before)

            let size = 8 << 20
            // One stream (segments are SegmentedTests' subject): the resume is one range.
            let id = try daemon.enqueue([
                "url": .string("\(origin.baseURL)/bytes/\(size)?rate=2000000"), "name": "crash.bin", "segments": 1,
            ])
            // Wait for a checkpoint (every 2 s), seen in the job table itself (status shows live
            // counters), so that the crash has committed bytes to keep.
            try daemon.waitForJob(id, timeout: 30) { ($0["received"]?.int64Value ?? 0) > 0 && $0["state"] == "running" }
            let committed = try committedReceived(daemon, id, atLeast: 1, timeout: 30)
            daemon.crash()
            #expect(committed < Int64(size), "the whole file was committed before the crash")
            try daemon.start()
            let done = try daemon.waitForState(id, ["completed", "failed"])
            #expect(done["state"] == "completed", "\(done.serializedString())")
            try expectOriginBytes(at: daemon.downloadDir + "/crash.bin", count: size)
            // The second request continued from a committed offset.
            let resumedFrom = origin.requests.compactMap { $0.header("range") }.last
            let resumedAt = resumedFrom.flatMap { Int64($0.dropFirst("bytes=".count).dropLast()) }
            #expect(resumedAt != nil && resumedAt ?? 0 >= committed, "resumed with \(resumedFrom ?? "no range"); committed \(committed)")
            #expect(origin.bytesServed < Int64(size) * 3 / 2)
            daemon.stop()
        }
    }

    /// A 404 fails the job with http_status and the status in the message; no file appears.
    @Test func httpErrorFails() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness()
            try daemon.start()
            defer { daemon.stop() }
            let id = try daemon.enqueue(["url": .string("\(origin.baseURL)/status/404"), "name": "missing.bin"])
            let job = try daemon.waitForState(id, ["failed", "completed"])
            #expect(job["state"] == "failed")
            #expect(job["error"]?["code"] == "http_status")
            #expect(job["error"]?["message"]?.stringValue?.contains("404") == true)
            #expect(!FileManager.default.fileExists(atPath: daemon.downloadDir + "/missing.bin"))
            let status = try daemon.dlctl(["status", "\(id)"])
            #expect(status.stdout.contains("http_status"))
        }
    }

    /// Redirects are followed by dld; a loop ends in too_many_redirects.
    @Test func redirects() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness()
            try daemon.start()
            defer { daemon.stop() }
            let id = try daemon.enqueue(["url": .string("\(origin.baseURL)/redirect/3?to=%2Fbytes%2F5000"), "name": "r.bin"])
            let job = try daemon.waitForState(id, ["completed", "failed"])
            #expect(job["state"] == "completed")
            #expect(job["final_url"] == .string("\(origin.baseURL)/bytes/5000"))
            try expectOriginBytes(at: daemon.downloadDir + "/r.bin", count: 5000)
            let loop = try daemon.enqueue(["url": .string("\(origin.baseURL)/loop"), "name": "loop.bin"])
            let failed = try daemon.waitForState(loop, ["completed", "failed"])
            #expect(failed["error"]?["code"] == "too_many_redirects")
        }
    }

    /// Bad requests get their error codes; the daemon keeps serving and the table is unchanged.
    @Test func badRequestsOnTheSocket() throws {
        let daemon = try DaemonHarness()
        try daemon.start()
        defer { daemon.stop() }
        try Data("mine".utf8).write(to: URL(fileURLWithPath: daemon.downloadDir + "/exists.bin"))
        let lines = [
            "this is not json",
            #"{"jsonrpc":"2.0","id":1}"#,
            #"{"jsonrpc":"2.0","id":2,"method":"explode"}"#,
            #"{"jsonrpc":"2.0","id":3,"method":"enqueue","params":{"url":"http://127.0.0.1:9/x","colour":"red"}}"#,
            #"{"jsonrpc":"2.0","id":4,"method":"enqueue","params":{"url":"file:///etc/passwd"}}"#,
            "{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"enqueue\",\"params\":{\"url\":\"http://127.0.0.1:9/x\",\"dir\":\"\(daemon.downloadDir)/no/such\"}}",
            #"{"jsonrpc":"2.0","id":6,"method":"enqueue","params":{"url":"http://127.0.0.1:9/exists.bin"}}"#,
            #"{"jsonrpc":"2.0","id":7,"method":"pause","params":{"id":12345}}"#,
            #"[{"jsonrpc":"2.0","id":8,"method":"version"},{"bad":true}]"#,
            "{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":\"version\",\"params\":" + String(repeating: "[", count: 5000) + "}",
            #"{"jsonrpc":"2.0","id":10,"method":"enqueue","params":{"url":"http://127.0.0.1:9/x","priority":1e400}}"#,
        ]
        let responses = try daemon.exchange(lines)
        let codes = responses.map { $0["error"]?["data"]?["code"]?.stringValue ?? ($0.arrayValue.map { _ in "batch" } ?? "ok") }
        #expect(
            codes == [
                "parse_error", "invalid_request", "method_not_found", "invalid_params", "invalid_url",
                "destination_invalid", "destination_exists", "job_not_found", "batch", "parse_error", "parse_error",
            ])
        #expect(responses[0]["error"]?["code"] == -32700)
        #expect(responses[2]["error"]?["code"] == -32601)
        #expect(responses[3]["error"]?["message"]?.stringValue?.contains("colour") == true)
        #expect(responses[8][1]?["error"]?["code"] == -32600)
        #expect(try String(contentsOfFile: daemon.downloadDir + "/exists.bin", encoding: .utf8) == "mine")
        #expect(try daemon.call("list")["jobs"] == .array([]))
        #expect(try daemon.call("version")["version"] == .string(DLDVersion.current))
    }

    /// An over-long line gets line_too_long and the connection is closed; others carry on.
    @Test func oversizeLineClosesTheConnection() throws {
        let daemon = try DaemonHarness()
        try daemon.start()
        defer { daemon.stop() }
        let client = RPCClient(socketPath: daemon.socket)
        try client.sendLine(Data(("{\"x\":\"" + String(repeating: "a", count: (4 << 20) + 100) + "\"}").utf8))
        let response = try JSONValue.parse(Data(try client.readLine()))
        #expect(response["error"]?["data"]?["code"] == "line_too_long")
        #expect(throws: RPCClientError.self) { _ = try client.readLine() }
        #expect(try daemon.call("version")["protocol"] == 3)
    }

    /// dlctl: enqueue prints the id, status shows a table and JSON, stats counts.
    @Test func dlctlCommands() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness()
            try daemon.start()
            defer { daemon.stop() }
            let target = daemon.root + "/dl/pages/001.jpg"
            try FileManager.default.createDirectory(atPath: daemon.root + "/dl/pages", withIntermediateDirectories: true)
            let enqueued = try daemon.dlctl(["enqueue", "-o", target, "\(origin.baseURL)/bytes/4096"])
            #expect(enqueued.status == 0, "\(enqueued.stderr)")
            let id = try #require(Int64(enqueued.stdout.trimmingCharacters(in: .whitespacesAndNewlines)))
            try daemon.waitForState(id, ["completed"])
            try expectOriginBytes(at: target, count: 4096)

            let table = try daemon.dlctl(["status"])
            #expect(table.status == 0)
            #expect(table.stdout.contains("ID"))
            #expect(table.stdout.contains("completed"))
            #expect(table.stdout.contains("001.jpg"))
            #expect(table.stdout.contains("100.0%"))
            let json = try daemon.dlctl(["status", "--json"])
            let parsed = try JSONValue.parse(Data(json.stdout.utf8))
            #expect(parsed[0]?["id"]?.int64Value == id)
            let detail = try daemon.dlctl(["status", "\(id)"])
            #expect(detail.stdout.contains(target))
            let stats = try daemon.dlctl(["stats", "--json"])
            #expect(try JSONValue.parse(Data(stats.stdout.utf8))["counts"]?["completed"] == 1)

            // Paused enqueue, then pause/resume --all.
            let second = try daemon.dlctl(["enqueue", "--paused", "\(origin.baseURL)/bytes/100", "\(origin.baseURL)/bytes/200"])
            #expect(second.stdout.split(separator: "\n").count == 2)
            let pausedIDs = try second.stdout.split(separator: "\n").map { try #require(Int64($0.trimmingCharacters(in: .whitespaces))) }
            for paused in pausedIDs { #expect(try daemon.job(paused)["state"] == "paused") }
            let resumeAll = try daemon.dlctl(["resume", "--all"])
            #expect(resumeAll.status == 0, "\(resumeAll.stderr)")
            // Both paused jobs left `paused` and run to the end; the completed one is untouched.
            for paused in pausedIDs {
                #expect(try daemon.job(paused)["state"] != "paused")
                #expect(try daemon.waitForState(paused, ["completed", "failed"])["state"] == "completed")
            }
            try expectOriginBytes(at: daemon.downloadDir + "/100", count: 100)
            try expectOriginBytes(at: daemon.downloadDir + "/200", count: 200)
            let listed = try daemon.call("list")["jobs"]?.arrayValue ?? []
            #expect(listed.count == 3 && listed.allSatisfy { $0["state"] == "completed" }, "\(listed)")
            // Errors: exit 1 with the daemon's message; usage errors exit 64.
            let missing = try daemon.dlctl(["pause", "999"])
            #expect(missing.status == 1)
            #expect(missing.stderr.contains("job_not_found"))
            let usage = try daemon.dlctl(["pause"])
            #expect(usage.status == 64)
            let exists = try daemon.dlctl(["enqueue", "-o", target, "\(origin.baseURL)/bytes/1"])
            #expect(exists.status == 1)
            #expect(exists.stderr.contains("destination_exists"))
        }
    }

    /// With no daemon, dlctl says so in one line naming the socket, and exits 69.
    @Test func dlctlWithoutDaemon() throws {
        let daemon = try DaemonHarness()
        let result = try daemon.dlctl(["status"])
        #expect(result.status == 69)
        #expect(result.stderr.contains(daemon.socket))
        #expect(result.stderr.contains("dld"))
        #expect(result.stderr.split(separator: "\n").count == 1)
        #expect(result.stdout.isEmpty)
    }

    /// One daemon per state folder: a second one exits non-zero naming the lock.
    @Test func secondDaemonIsRefused() throws {
        let daemon = try DaemonHarness()
        try daemon.start()
        defer { daemon.stop() }
        let second = try runProgram(
            BuiltProducts.path("dld"),
            ["--socket", daemon.root + "/other.sock", "--state-dir", daemon.stateDir, "--download-dir", daemon.downloadDir],
            environment: daemon.environment)
        #expect(second.status != 0)
        #expect(second.stderr.contains("dld.lock"))
        // And a second daemon on the same socket with another state folder is refused too.
        let third = try runProgram(
            BuiltProducts.path("dld"),
            ["--socket", daemon.socket, "--state-dir", daemon.root + "/state2", "--download-dir", daemon.downloadDir],
            environment: daemon.environment)
        #expect(third.status != 0)
        #expect(third.stderr.contains("already running"))
        #expect(try daemon.call("version")["protocol"] == 3)
    }

    /// `shutdown` answers, then the daemon exits 0; SIGTERM does the same.
    @Test func shutdownAndSignals() throws {
        let daemon = try DaemonHarness()
        try daemon.start()
        let result = try daemon.dlctl(["shutdown"])
        #expect(result.status == 0)
        let deadline = Date().addingTimeInterval(10)
        while daemon.isRunning && Date() < deadline { usleep(20_000) }
        #expect(!daemon.isRunning)
        #expect(!FileManager.default.fileExists(atPath: daemon.socket))
        try daemon.start()
        #expect(daemon.stop() == 0)
    }

    /// `--print-config` shows the effective configuration: file, then flags.
    @Test func printConfig() throws {
        let daemon = try DaemonHarness()
        let config = daemon.root + "/c.toml"
        try "max_active = 2\nlog_level = \"warning\"\n".write(toFile: config, atomically: true, encoding: .utf8)
        let out = try runProgram(
            BuiltProducts.path("dld"), ["--config", config, "--max-active", "5", "--print-config"], environment: daemon.environment)
        #expect(out.status == 0)
        #expect(out.stdout.contains("max_active = 5"))
        #expect(out.stdout.contains("log_level = \"warning\""))
        try "max_active = 2\nbogus = 1\n".write(toFile: config, atomically: true, encoding: .utf8)
        let bad = try runProgram(BuiltProducts.path("dld"), ["--config", config, "--print-config"], environment: daemon.environment)
        #expect(bad.status != 0)
        #expect(bad.stderr.contains("bogus"))
    }
}
