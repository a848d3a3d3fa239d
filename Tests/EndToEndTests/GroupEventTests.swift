import DLCore
import DLRPC
import DLTestSupport
import DLTransfer
import Foundation
import Testing

/// The subscriber buffer of dld's event hub (EventHub.bufferLimit).
enum EventHubLimit { static let value = 10_000 }

func originDigest(_ algorithm: DigestAlgorithm, count: Int) throws -> String {
    let digest = try #require(StreamingDigest(algorithm))
    digest.update(TestOrigin.bytes(count: count))
    return digest.finalize()
}

/// Verified files, groups that land whole, live events, wait, hooks and input lists.
@Suite(.serialized) struct GroupEventTests {
    /// Right, wrong and absent checksums of each algorithm; a wrong size.
    @Test func checksums() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: quickRetries)
            try daemon.start()
            defer { daemon.stop() }
            let size = 300_000
            let url = "\(origin.baseURL)/bytes/\(size)"
            for algorithm in DigestAlgorithm.allCases {
                let hex = try originDigest(algorithm, count: size)
                let good = try daemon.enqueue([
                    "url": .string(url), "name": .string("good-\(algorithm)"), "checksum": .string("\(algorithm.rawValue):\(hex)"),
                ])
                let done = try daemon.waitForState(good, ["completed", "failed"])
                #expect(done["state"] == "completed", "\(algorithm): \(done.serializedString())")
                #expect(done["digest"]?.stringValue == hex)
                #expect(done["sha256"]?.stringValue == (try originDigest(.sha256, count: size)))

                let wrongHex = String(hex.reversed())
                let bad = try daemon.enqueue([
                    "url": .string(url), "name": .string("bad-\(algorithm)"), "checksum": .string("\(algorithm.rawValue):\(wrongHex)"),
                ])
                let failed = try daemon.waitForState(bad, ["completed", "failed"])
                #expect(failed["state"] == "failed")
                #expect(failed["error"]?["code"] == "checksum_mismatch")
                let message = failed["error"]?["message"]?.stringValue ?? ""
                #expect(message.contains(hex) && message.contains(wrongHex), "\(message)")
                #expect(!FileManager.default.fileExists(atPath: daemon.downloadDir + "/bad-\(algorithm)"))
                // Quarantined, never under the final name.
                #expect(FileManager.default.fileExists(atPath: daemon.downloadDir + "/bad-\(algorithm).part"))
            }
            // Resume after a mismatch downloads again from zero.
            let requestsBefore = origin.requests.count
            let again = try #require(try daemon.call("list", ["state": "failed"])["jobs"]?[0]?["id"]?.int64Value)
            _ = try daemon.call("resume", ["id": .int(again)])
            let refailed = try daemon.waitForState(again, ["completed", "failed"])
            #expect(refailed["error"]?["code"] == "checksum_mismatch")
            let retry = origin.requests[requestsBefore...]
            #expect(retry.count == 1)
            #expect(retry.first?.header("range") == nil)

            let absent = try daemon.enqueue(["url": .string(url), "name": "plain"])
            let plain = try daemon.waitForState(absent, ["completed"])
            #expect(plain["checksum"] == .null)
            #expect(plain["digest"] == .null)
            #expect(plain["sha256"]?.stringValue == (try originDigest(.sha256, count: size)))

            let wrongSize = try daemon.enqueue(["url": .string(url), "name": "sized", "size": 12345])
            let sized = try daemon.waitForState(wrongSize, ["completed", "failed"])
            #expect(sized["error"]?["code"] == "size_mismatch")
            #expect(!FileManager.default.fileExists(atPath: daemon.downloadDir + "/sized"))
            #expect(try daemon.callError("enqueue", ["url": .string(url), "checksum": "sha256:abc"]).stableCode == "invalid_params")
        }
    }

    /// A 30-file group: no member is visible in its folder until the last completes; then all
    /// are, byte-exact. The group takes one slot and shows members and bytes done.
    @Test func thirtyFilesLandTogether() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: quickRetries + "\nmax_active = 1\ngroup_parallel = 4\n")
            try daemon.start()
            defer { daemon.stop() }
            let dir = daemon.root + "/dl/chapter-1"
            var members: [JSONValue] = []
            for n in 0..<30 {
                let size = 20_000 + n * 1000
                // The last page is slow, so the group stays incomplete for a while.
                let rate = n == 29 ? "?rate=100000" : ""
                members.append(["url": .string("\(origin.baseURL)/bytes/\(size)\(rate)"), "name": .string(String(format: "%03d.jpg", n))])
            }
            members.append(["url": .string("\(origin.baseURL)/bytes/1000"), "path": "extra/notes.json"])
            let result = try daemon.call("enqueue", ["group": ["name": "chapter-1", "dir": .string(dir)], "jobs": .array(members)])
            let groupID = try #require(result["group"]?["id"]?.int64Value)
            #expect(result["results"]?.arrayValue?.count == 31)
            // A standalone job queued behind the group waits for the group's single slot.
            let after = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/10"), "name": "after.bin"])

            var sawPartial = false
            let deadline = Date().addingTimeInterval(60)
            while Date() < deadline {
                // Look at the folder and the other job first: if the group is still not
                // complete afterwards, it was not complete when they were looked at.
                let folderExisted = FileManager.default.fileExists(atPath: dir)
                let afterState = try daemon.job(after)["state"]
                let status = try daemon.call("status", ["group": .int(groupID)])
                let state = status["group"]?["state"]?.stringValue
                if state == "completed" { break }
                let done = status["group"]?["members_done"]?.int64Value ?? 0
                if done > 0 && done < 31 { sawPartial = true }
                #expect(!folderExisted, "the folder appeared before the group completed")
                #expect(afterState == "queued")
                usleep(50_000)
            }
            #expect(sawPartial)
            let status = try daemon.call("status", ["group": "chapter-1"])
            #expect(status["group"]?["state"] == "completed")
            #expect(status["group"]?["members_done"] == 31)
            #expect(status["group"]?["bytes_done"] == status["group"]?["bytes_total"])
            for n in 0..<30 {
                try expectOriginBytes(at: dir + String(format: "/%03d.jpg", n), count: 20_000 + n * 1000)
            }
            try expectOriginBytes(at: dir + "/extra/notes.json", count: 1000)
            let leftovers = try FileManager.default.contentsOfDirectory(atPath: daemon.root + "/dl").filter { $0.contains("staging") }
            #expect(leftovers.isEmpty)
            #expect(try daemon.waitForState(after, ["completed"])["state"] == "completed")
        }
    }

    /// A member failing for good fails the group; the others stay staged; resume retries only
    /// the missing member, and the group then lands.
    @Test func memberFailureAndGroupResume() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: quickRetries + "\nmax_attempts = 1\n")
            try daemon.start()
            defer { daemon.stop() }
            let dir = daemon.root + "/dl/lesson"
            let result = try daemon.call(
                "enqueue",
                [
                    "group": ["name": "lesson", "dir": .string(dir)],
                    "jobs": [
                        ["url": .string("\(origin.baseURL)/bytes/5000"), "name": "a.bin"],
                        ["url": .string("\(origin.baseURL)/bytes/6000"), "name": "b.bin"],
                        ["url": .string("\(origin.baseURL)/fail_first/1/bytes/7000"), "name": "c.bin"],
                    ],
                ])
            let groupID = try #require(result["group"]?["id"]?.int64Value)
            var status: JSONValue = .null
            for _ in 0..<300 {
                status = try daemon.call("status", ["group": .int(groupID)])
                if status["group"]?["state"] == "failed" { break }
                usleep(20_000)
            }
            #expect(status["group"]?["state"] == "failed", "\(status.serializedString())")
            #expect(status["group"]?["error"]?["code"] == "retries_exhausted")
            #expect(status["group"]?["members_done"] == 2)
            #expect(!FileManager.default.fileExists(atPath: dir))
            let fetchedBefore = origin.requests.filter { $0.path.hasPrefix("/bytes/") }.count
            #expect(fetchedBefore == 2)

            let resumed = try daemon.dlctl(["resume", "--group", "lesson"])
            #expect(resumed.status == 0, "\(resumed.stderr)")
            let waited = try daemon.dlctl(["wait", "--group", "lesson", "--timeout", "30"])
            #expect(waited.status == 0, "\(waited.stderr)")
            #expect(origin.requests.filter { $0.path.hasPrefix("/bytes/") }.count == 2)
            try expectOriginBytes(at: dir + "/a.bin", count: 5000)
            try expectOriginBytes(at: dir + "/c.bin", count: 7000)

            // `enqueue --group --wait` ends with 1 once a member failed for good and the last
            // one still running stops, not when the failure happens, and not with a timeout.
            let list = daemon.root + "/failing.txt"
            try "\(origin.baseURL)/status/404\n\(origin.baseURL)/bytes/6000?rate=3000\n".write(
                toFile: list, atomically: true, encoding: .utf8)
            let failing = try daemon.dlctl(["enqueue", "--group", "broken", "-d", daemon.root + "/dl/broken", "-i", list, "--wait"])
            #expect(failing.status == 1, "\(failing.stdout) \(failing.stderr)")
            let broken = try daemon.call("status", ["group": "broken"])
            #expect(broken["group"]?["state"] == "failed")
            #expect(broken["group"]?["members_done"] == 1, "the slow member finished before the wait ended")
        }
    }

    /// subscribe streams job.state in commit order with growing seq; since replays them.
    @Test func subscribeOrderAndReplay() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: quickRetries)
            try daemon.start()
            defer { daemon.stop() }
            let first = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/100"), "name": "first", "paused": true])
            let client = RPCClient(socketPath: daemon.socket)
            defer { client.close() }
            let answer = try client.call("subscribe", ["ids": [.int(first)]])
            let start = try #require(answer["seq"]?.int64Value)
            try client.setReadTimeout(20)
            _ = try daemon.call("resume", ["id": .int(first)])
            var states: [String] = []
            var seqs: [Int64] = []
            while states.last != "completed" {
                let message = try client.readMessage()
                guard message["method"] == "job.state" else { continue }
                #expect(message["params"]?["id"]?.int64Value == first)
                states.append(message["params"]?["state"]?.stringValue ?? "")
                seqs.append(message["params"]?["seq"]?.int64Value ?? 0)
            }
            #expect(states == ["queued", "running", "completed"])
            #expect(seqs == seqs.sorted() && seqs.first ?? 0 > start)

            // A client that was away replays what it missed, in the same order.
            let late = RPCClient(socketPath: daemon.socket)
            defer { late.close() }
            _ = try late.call("subscribe", ["ids": [.int(first)], "since": .int(start)])
            try late.setReadTimeout(5)
            var replayed: [Int64] = []
            while replayed.count < seqs.count {
                let message = try late.readMessage()
                if message["method"] == "job.state", let seq = message["params"]?["seq"]?.int64Value { replayed.append(seq) }
            }
            #expect(replayed == seqs)
            #expect(try daemon.callError("subscribe", ["idz": [1]]).stableCode == "invalid_params")
        }
    }

    /// A subscriber that stops reading is cut off with events.overflow once it is 10000 events
    /// behind, rather than silently missing one; others are not affected.
    @Test func slowSubscriberIsCutOff() throws {
        let daemon = try DaemonHarness(config: "max_line_bytes = 16777216\n")
        try daemon.start()
        defer { daemon.stop() }
        let sleeper = RPCClient(socketPath: daemon.socket)
        defer { sleeper.close() }
        let answer = try sleeper.call("subscribe")
        let start = try #require(answer["seq"]?.int64Value)
        // Two calls: one takes at most 10 000 jobs.
        for part in 0..<2 {
            let jobs = JSONValue.array((0..<6_000).map { n in ["url": .string("http://127.0.0.1:9/f\(part)-\(n)"), "paused": true] })
            #expect(try daemon.call("enqueue", ["jobs": jobs])["results"]?.arrayValue?.count == 6_000)
        }
        try sleeper.setReadTimeout(30)
        var seen = 0
        var last = start
        var overflow = false
        while true {
            guard let message = try? sleeper.readMessage() else { break }
            if message["method"] == "events.overflow" {
                overflow = true
                continue
            }
            if let seq = message["params"]?["seq"]?.int64Value {
                #expect(seq == last + 1, "events arrive in order without gaps")
                last = seq
                seen += 1
            }
        }
        #expect(overflow)
        #expect(seen >= EventHubLimit.value && seen < 12_000, "\(seen)")
        // The daemon and other clients carry on.
        #expect(try daemon.call("stats")["total"] == 12_000)
    }

    /// wait: 0 when all completed, 1 when one failed, 124 on timeout; enqueue --wait; watch
    /// prints one line per event when not on a terminal.
    @Test func waitAndWatch() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: quickRetries)
            try daemon.start()
            defer { daemon.stop() }
            let ok = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/1000"), "name": "ok.bin"])
            let bad = try daemon.enqueue(["url": .string("\(origin.baseURL)/status/404"), "name": "bad.bin"])
            #expect(try daemon.dlctl(["wait", "\(ok)"]).status == 0)
            let failed = try daemon.dlctl(["wait", "\(ok)", "\(bad)"])
            #expect(failed.status == 1)
            #expect(failed.stderr.contains("job \(bad) failed"))
            // A paused job never finishes by itself, so only the timeout can end this wait.
            let held = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/1000"), "name": "held.bin", "paused": true])
            let timedOut = try daemon.dlctl(["wait", "\(held)", "--timeout", "1"])
            #expect(timedOut.status == 124, "\(timedOut.stderr)")
            _ = try daemon.call("cancel", ["id": .int(held)])

            let enqueued = try daemon.dlctl(["enqueue", "--wait", "\(origin.baseURL)/bytes/2000"])
            #expect(enqueued.status == 0, "\(enqueued.stderr)")
            #expect(FileManager.default.fileExists(atPath: daemon.downloadDir + "/2000"))

            let watched = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/300000?rate=300000"), "name": "w.bin"])
            let watch = try daemon.dlctl(["watch", "\(watched)"])
            #expect(watch.status == 0)
            #expect(watch.stdout.contains("job \(watched) completed"), "\(watch.stdout)")
            #expect(watch.stdout.contains("job \(watched) progress"), "\(watch.stdout)")
        }
    }

    /// Hooks run without a shell: arguments that a shell would expand arrive as written, and
    /// nothing in them runs. The job is in the environment, with the URL's password as `***`;
    /// the hook's output reaches dld's log; a hook that never exits is killed at hook_timeout;
    /// a failing or hanging hook changes nothing.
    @Test func hooks() async throws {
        try await withOrigin { origin in
            let out = NSTemporaryDirectory() + "dld-hooks-\(UUID().uuidString)"
            try FileManager.default.createDirectory(atPath: out, withIntermediateDirectories: true)
            defer { try? FileManager.default.removeItem(atPath: out) }
            // Python, not sh: the kernel starts the interpreter from the #! line, no shell.
            // Written aside and renamed, so that the test never reads a half-written file.
            let recorder = out + "/record.py"
            try """
            #!/usr/bin/python3
            import json, os, sys
            env = {k: v for k, v in os.environ.items() if k.startswith("DLD_")}
            name = "%s-j%s-g%s" % (env["DLD_STATE"], env["DLD_JOB_ID"], env["DLD_GROUP"])
            path = os.path.join(sys.argv[1], name)
            with open(path + ".tmp", "w") as f:
                json.dump({"argv": sys.argv[2:], "env": env}, f)
            os.rename(path + ".tmp", path)
            print("hook-output: recorded " + name, flush=True)
            sys.exit(3)
            """.write(toFile: recorder, atomically: true, encoding: .utf8)
            // Never exits, and ignores SIGTERM: only the SIGKILL after it ends it.
            let hanger = out + "/hang.py"
            try """
            #!/usr/bin/python3
            import os, signal, sys, time
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            with open(os.path.join(sys.argv[1], "hang-%s.pid" % os.environ["DLD_JOB_ID"]), "w") as f:
                f.write(str(os.getpid()))
            print("hook-output: hanging", flush=True)
            while True:
                time.sleep(3600)
            """.write(toFile: hanger, atomically: true, encoding: .utf8)
            chmod(recorder, 0o755)
            chmod(hanger, 0o755)
            let hostile = ["$DLD_PATH", "`touch \(out)/pwned1`", "$(touch \(out)/pwned2)", "a b; touch \(out)/pwned3", "*", "'q'\"", ""]
            func toml(_ items: [String]) -> String {
                "["
                    + items.map {
                        "\"" + $0.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "\"", with: "\\\"") + "\""
                    }.joined(separator: ", ") + "]"
            }
            let daemon = try DaemonHarness(
                config: quickRetries
                    + "\non_complete = \(toml([recorder, out] + hostile))\non_error = \(toml([hanger, out]))\nhook_timeout = 1\n")
            try daemon.start()
            defer { daemon.stop() }
            let url = "http://alice:hooksecret@127.0.0.1:\(origin.port)/bytes/1000"
            let ok = try daemon.enqueue(["url": .string(url), "name": "hooked.bin"])
            let bad = try daemon.enqueue(["url": .string("\(origin.baseURL)/status/404"), "name": "nope.bin"])
            try daemon.waitForState(ok, ["completed"])
            try daemon.waitForState(bad, ["failed"])
            func read(_ name: String) throws -> String {
                let deadline = Date().addingTimeInterval(30)
                while Date() < deadline {
                    if let text = try? String(contentsOfFile: out + "/" + name, encoding: .utf8) { return text }
                    usleep(20_000)
                }
                throw HarnessError("hook output \(name) never appeared")
            }
            func record(_ name: String) throws -> (argv: [String], env: [String: String]) {
                let parsed = try JSONValue.parse(Data(try read(name).utf8))
                let argv = (parsed["argv"]?.arrayValue ?? []).compactMap(\.stringValue)
                var env: [String: String] = [:]
                for (key, value) in parsed["env"]?.objectValue ?? [:] { env[key] = value.stringValue }
                return (argv, env)
            }
            let completed = try record("completed-j\(ok)-g")
            #expect(completed.argv == hostile, "\(completed.argv)")
            let files = try FileManager.default.contentsOfDirectory(atPath: out)
            #expect(!files.contains { $0.hasPrefix("pwned") }, "a shell ran: \(files)")
            #expect(completed.env["DLD_JOB_ID"] == "\(ok)")
            #expect(completed.env["DLD_PATH"] == "\(daemon.downloadDir)/hooked.bin")
            #expect(completed.env["DLD_URL"] == "http://alice:***@127.0.0.1:\(origin.port)/bytes/1000")
            #expect(completed.env["DLD_STATE"] == "completed")
            #expect(completed.env["DLD_ERROR_CODE"] == "")
            #expect(completed.env["DLD_GROUP"] == "")

            // The hung on_error hook: killed once hook_timeout passed (SIGTERM ignored, so SIGKILL).
            let pid = try #require(Int32(try read("hang-\(bad).pid")))
            let deadline = Date().addingTimeInterval(30)
            while kill(pid, 0) == 0 && Date() < deadline { usleep(50_000) }
            #expect(kill(pid, 0) == -1 && errno == ESRCH, "hook \(pid) still runs")
            func logged(_ text: String) -> Bool {
                let deadline = Date().addingTimeInterval(30)
                while !daemon.log.contains(text) && Date() < deadline { usleep(20_000) }
                return daemon.log.contains(text)
            }
            #expect(logged("hook timed out; killing it"), "\(daemon.log.suffix(3000))")
            // Their output, line by line, in dld's log.
            #expect(logged("hook-output: recorded completed-j\(ok)-g"), "\(daemon.log.suffix(3000))")
            #expect(logged("hook-output: hanging"), "\(daemon.log.suffix(3000))")
            #expect(!daemon.log.contains("hooksecret"))
            #expect(try daemon.job(ok)["state"] == "completed")
            #expect(try daemon.job(bad)["state"] == "failed")
            // The group hook names the group.
            let group = try daemon.call(
                "enqueue",
                ["group": ["name": "g", "dir": .string(daemon.root + "/dl/g")], "jobs": [["url": .string("\(origin.baseURL)/bytes/10")]]])
            let groupID = try #require(group["group"]?["id"]?.int64Value)
            let groupEnv = try record("completed-j-g\(groupID)").env
            #expect(groupEnv["DLD_GROUP"] == "\(groupID)")
            #expect(groupEnv["DLD_GROUP_NAME"] == "g")
            #expect(groupEnv["DLD_PATH"] == daemon.root + "/dl/g")
        }
    }

    /// Input lists: a bad line names its number and nothing is enqueued; a good list enqueues
    /// every entry with its options, also as a group.
    @Test func inputLists() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: quickRetries)
            try daemon.start()
            defer { daemon.stop() }
            let bad = "\(origin.baseURL)/bytes/10\n# comment\n\(origin.baseURL)/bytes/20\n  colour=red\n"
            let refused = try daemon.dlctl(["enqueue", "-i", "-"], stdin: Data(bad.utf8))
            #expect(refused.status == 65)
            #expect(refused.stderr.contains("line 4"), "\(refused.stderr)")
            #expect(try daemon.call("list")["jobs"] == .array([]))

            let hex = try originDigest(.sha256, count: 30)
            let good = """
                # pages
                \(origin.baseURL)/bytes/10
                  out=ten.bin
                \(origin.baseURL)/bytes/30
                \tout=thirty.bin
                \tchecksum=sha-256=\(hex)

                \(origin.baseURL)/bytes/40
                """
            let file = daemon.root + "/list.txt"
            try good.write(toFile: file, atomically: true, encoding: .utf8)
            let accepted = try daemon.dlctl(["enqueue", "-i", file, "--wait"])
            #expect(accepted.status == 0, "\(accepted.stderr)")
            #expect(accepted.stdout.split(separator: "\n").count == 3)
            try expectOriginBytes(at: daemon.downloadDir + "/ten.bin", count: 10)
            try expectOriginBytes(at: daemon.downloadDir + "/thirty.bin", count: 30)
            try expectOriginBytes(at: daemon.downloadDir + "/40", count: 40)

            let grouped = try daemon.dlctl(["enqueue", "--group", "book", "-d", daemon.root + "/dl/book", "-i", file, "--wait"])
            #expect(grouped.status == 0, "\(grouped.stderr)")
            try expectOriginBytes(at: daemon.root + "/dl/book/thirty.bin", count: 30)
        }
    }
}
