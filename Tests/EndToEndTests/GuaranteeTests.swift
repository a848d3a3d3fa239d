import DLCore
import DLRPC
import DLTestSupport
import Foundation
import Testing

/// Polls a group's status until `condition` holds; returns the status.
@discardableResult
func waitForGroup(
    _ daemon: DaemonHarness, _ reference: JSONValue, timeout: TimeInterval = 60,
    _ condition: (JSONValue) -> Bool
) throws -> JSONValue {
    let deadline = Date().addingTimeInterval(timeout)
    var last: JSONValue = .null
    while Date() < deadline {
        last = try daemon.call("status", ["group": reference])
        if condition(last) { return last }
        usleep(20_000)
    }
    throw HarnessError("group \(reference.serializedString()) condition not met within \(timeout) s; last: \(last.serializedString())")
}

/// The staging folders beside `folder`'s entries.
func stagingFolders(in folder: String) throws -> [String] {
    try FileManager.default.contentsOfDirectory(atPath: folder).filter { $0.contains(".dld-staging-") }
}

/// Guarantees the documentation makes (docs/architecture.md, docs/protocol.md), each shown
/// with the real dld and the loopback origin.
@Suite(.serialized) struct GuaranteeTests {
    /// The harness runs the binaries of this build and nothing else: a missing one is an error
    /// that says what to do, not a fall-back to some other build's copy.
    @Test func harnessRunsOnlyThisBuild() throws {
        let dld = try BuiltProducts.path("dld")
        #expect(dld == BuiltProducts.folder + "/dld")
        do {
            let found = try BuiltProducts.path("dld-no-such-program")
            Issue.record("a missing binary was \"found\" at \(found)")
        } catch {
            let message = String(describing: error)
            #expect(message.contains(BuiltProducts.folder + "/dld-no-such-program"), "\(message)")
            #expect(message.contains("swift build --build-tests"), "\(message)")
        }
    }

    /// SIGTERM during a transfer: the job is left `queued` with its bytes synced and committed
    /// (no checkpoint runs in this test, so the offset can only come from the shutdown), and at
    /// the next start it continues with one range request from exactly that offset. One stream
    /// (`segments: 1`): SegmentedTests shows the same for ranges.
    @Test func sigtermDuringTransferKeepsItsBytes() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: "checkpoint_interval = 600\nmin_free = 0\n")
            try daemon.start()
            let size = 4 << 20
            let id = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/\(size)?rate=1000000"), "name": "term.bin", "segments": 1])
            try daemon.waitForJob(id) { $0["state"] == "running" && ($0["received"]?.int64Value ?? 0) > 300_000 }
            #expect(daemon.stop() == 0, "\(daemon.log.suffix(2000))")
            let partial = daemon.downloadDir + "/term.bin.part"
            let kept = Int64(try #require(try FileManager.default.attributesOfItem(atPath: partial)[.size] as? Int))
            #expect(kept > 300_000 && kept < Int64(size), "\(kept)")
            #expect(Data(try Data(contentsOf: URL(fileURLWithPath: partial))) == Data(TestOrigin.bytes(count: Int(kept))))
            let requestsBefore = origin.requests.count

            try daemon.start()
            defer { daemon.stop() }
            let done = try daemon.waitForState(id, ["completed", "failed"])
            #expect(done["state"] == "completed", "\(done.serializedString())")
            try expectOriginBytes(at: daemon.downloadDir + "/term.bin", count: size)
            let after = Array(origin.requests[requestsBefore...])
            #expect(after.count == 1, "\(after.map { $0.header("range") ?? "-" })")
            #expect(after.first?.header("range") == "bytes=\(kept)-")
            #expect(after.first?.header("if-range") == "\"v1-\(size)\"")
            // The table's events: running, then queued by the shutdown, then running again.
            let replay = RPCClient(socketPath: daemon.socket)
            defer { replay.close() }
            _ = try replay.call("subscribe", ["ids": [.int(id)], "since": 0])
            try replay.setReadTimeout(10)
            var states: [String] = []
            while states.last != "completed" {
                let message = try replay.readMessage()
                if message["method"] == "job.state" { states.append(message["params"]?["state"]?.stringValue ?? "") }
            }
            #expect(states == ["queued", "running", "queued", "running", "completed"], "\(states)")
        }
    }

    /// Durability rule 5: `remove` deletes a completed file only with `delete_file: true`.
    @Test func removeDeletesAFileOnlyWhenAsked() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness()
            try daemon.start()
            defer { daemon.stop() }
            let kept = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/1000"), "name": "kept.bin"])
            let gone = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/2000"), "name": "gone.bin"])
            let alsoKept = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/3000"), "name": "also.bin"])
            for id in [kept, gone, alsoKept] { try daemon.waitForState(id, ["completed"]) }

            _ = try daemon.call("remove", ["id": .int(kept)])
            #expect(try daemon.callError("status", ["id": .int(kept)]).stableCode == "job_not_found")
            try expectOriginBytes(at: daemon.downloadDir + "/kept.bin", count: 1000)

            _ = try daemon.call("remove", ["id": .int(gone), "delete_file": true])
            #expect(try daemon.callError("status", ["id": .int(gone)]).stableCode == "job_not_found")
            #expect(!FileManager.default.fileExists(atPath: daemon.downloadDir + "/gone.bin"))

            let all = try daemon.dlctl(["rm", "--all"])
            #expect(all.status == 0, "\(all.stderr)")
            #expect(try daemon.call("list")["jobs"] == .array([]))
            try expectOriginBytes(at: daemon.downloadDir + "/also.bin", count: 3000)
        }
    }

    /// A body longer than its announced total: waiting(retry, length_mismatch); the offset kept
    /// is at most the total and nothing is published. (The extra bytes may sit in the partial
    /// file past the committed offset: rule 3 cuts them off at the next attempt.)
    @Test func longerBodyThanAnnounced() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: slowRetries)
            try daemon.start()
            defer { daemon.stop() }
            // The first answer drops after 60 kB; the resume's 206 says "…/100000" and sends
            // 1000 bytes more than that.
            let size: Int64 = 100_000
            let id = try daemon.enqueue([
                "url": .string("\(origin.baseURL)/bytes/\(size)?drop_after=60000&overlong=1000"), "name": "long.bin",
            ])
            var job = try daemon.waitForJob(id) { $0["state"] != "queued" && $0["state"] != "running" }
            var rounds = 0
            while job["error"]?["code"] == "truncated" && rounds < 10 {
                rounds += 1
                _ = try daemon.call("resume", ["id": .int(id)])
                job = try daemon.waitForJob(id) { $0["state"] != "queued" && $0["state"] != "running" }
            }
            if job["state"] == "completed" {
                // The resume started from byte 0 (the drop came before a checkpoint): its
                // first answer is a range whose length disagrees with its Content-Range, which
                // is not trusted, and the whole file is fetched in one answer instead. What is
                // published is exactly the file, not the overlong bytes.
                #expect(origin.requests.last?.header("range") == nil, "\(origin.requests.map(\.uri))")
                try expectOriginBytes(at: daemon.downloadDir + "/long.bin", count: Int(size))
                return
            }
            #expect(job["state"] == "waiting", "\(job.serializedString())")
            #expect(job["wait_reason"] == "retry")
            #expect(job["error"]?["code"] == "length_mismatch", "\(job.serializedString())")
            #expect((job["received"]?.int64Value ?? .max) <= size)
            #expect(origin.requests.last?.header("range") != nil)
            #expect(!FileManager.default.fileExists(atPath: daemon.downloadDir + "/long.bin"))
        }
    }

    /// TLS end to end, against an origin with a self-signed certificate: verified by default
    /// (the handshake fails for good, no request is made); a job with `insecure` downloads from it; and
    /// a redirect from https down to http is refused, even for an insecure job.
    @Test func tlsVerifiedInsecureAndNoDowngrade() async throws {
        let daemon = try DaemonHarness(config: slowRetries)
        let tls = try TLSFiles.selfSigned(in: daemon.root)
        let secure = try await TestOrigin.start(tls: tls)
        do {
            try await withOrigin { plain in
                try daemon.start()
                defer { daemon.stop() }
                #expect(secure.baseURL.hasPrefix("https://"))
                let verified = try daemon.enqueue(["url": .string("\(secure.baseURL)/bytes/1000"), "name": "verified.bin"])
                let refused = try daemon.waitForJob(verified) { $0["state"] != "queued" && $0["state"] != "running" }
                #expect(refused["state"] == "failed", "\(refused.serializedString())")
                #expect(refused["error"]?["code"] == "tls_untrusted")
                #expect(
                    refused["error"]?["message"]?.stringValue?.lowercased().contains("certificate") == true, "\(refused.serializedString())"
                )
                #expect(secure.requests.isEmpty, "a request went out over an unverified connection")
                #expect(!FileManager.default.fileExists(atPath: daemon.downloadDir + "/verified.bin"))
                _ = try daemon.call("cancel", ["id": .int(verified)])

                let size = 300_000
                let insecure = try daemon.enqueue([
                    "url": .string("\(secure.baseURL)/bytes/\(size)"), "name": "insecure.bin", "insecure": true,
                ])
                let done = try daemon.waitForState(insecure, ["completed", "failed", "waiting"])
                #expect(done["state"] == "completed", "\(done.serializedString())")
                #expect(done["insecure"] == true)
                try expectOriginBytes(at: daemon.downloadDir + "/insecure.bin", count: size)
                #expect(secure.requests.contains { $0.path == "/bytes/\(size)" })
                #expect(daemon.waitForLog("TLS certificates are not verified"), "the log pipe may lag the job: waited for")

                let target = "\(plain.baseURL)/bytes/500"
                let escaped = target.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? target
                let downgrade = try daemon.enqueue([
                    "url": .string("\(secure.baseURL)/redirect/0?to=\(escaped)"), "name": "down.bin", "insecure": true,
                ])
                let failed = try daemon.waitForState(downgrade, ["completed", "failed", "waiting"])
                #expect(failed["state"] == "failed", "\(failed.serializedString())")
                #expect(failed["error"]?["code"] == "redirect_refused")
                #expect(secure.requests.contains { $0.path == "/redirect/0" })
                #expect(plain.requests.isEmpty, "the http hop was made: \(plain.requests.map(\.uri))")
                #expect(!FileManager.default.fileExists(atPath: daemon.downloadDir + "/down.bin"))
            }
        } catch {
            try? await secure.shutdown()
            throw error
        }
        try await secure.shutdown()
    }

    /// Publishing into a folder that exists: files are moved in one by one and what was there
    /// stays; a file that would be replaced is a clash, reported, and then nothing is moved.
    /// Once the clash is gone, `resume` publishes.
    @Test func groupIntoAnExistingFolder() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: quickRetries)
            try daemon.start()
            defer { daemon.stop() }
            let dir = daemon.downloadDir + "/book"
            try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
            try Data("mine".utf8).write(to: URL(fileURLWithPath: dir + "/notes.txt"))
            _ = try daemon.call(
                "enqueue",
                [
                    "group": ["name": "book", "dir": .string(dir)],
                    "jobs": [
                        ["url": .string("\(origin.baseURL)/bytes/1000"), "name": "a.bin"],
                        ["url": .string("\(origin.baseURL)/bytes/2000"), "path": "sub/b.bin"],
                    ],
                ])
            let published = try waitForGroup(daemon, "book") { $0["group"]?["state"] == "completed" || $0["group"]?["error"] != .null }
            #expect(published["group"]?["state"] == "completed", "\(published.serializedString())")
            try expectOriginBytes(at: dir + "/a.bin", count: 1000)
            try expectOriginBytes(at: dir + "/sub/b.bin", count: 2000)
            #expect(try String(contentsOfFile: dir + "/notes.txt", encoding: .utf8) == "mine")
            #expect(try stagingFolders(in: daemon.downloadDir).isEmpty)

            // A file that appears in the folder after the enqueue (which refuses a taken name),
            // while a slow member keeps the group from publishing for a couple of seconds.
            let clashDir = daemon.downloadDir + "/clash"
            try FileManager.default.createDirectory(atPath: clashDir, withIntermediateDirectories: true)
            _ = try daemon.call(
                "enqueue",
                [
                    "group": ["name": "clash", "dir": .string(clashDir)],
                    "jobs": [
                        ["url": .string("\(origin.baseURL)/bytes/3000"), "name": "c.bin"],
                        ["url": .string("\(origin.baseURL)/bytes/4000?rate=2000"), "name": "d.bin"],
                    ],
                ])
            try Data("mine".utf8).write(to: URL(fileURLWithPath: clashDir + "/c.bin"))
            let clash = try waitForGroup(daemon, "clash") { $0["group"]?["state"] == "completed" || $0["group"]?["error"] != .null }
            #expect(clash["group"]?["error"]?["code"] == "destination_exists", "\(clash.serializedString())")
            #expect(clash["group"]?["error"]?["message"]?.stringValue?.contains(clashDir + "/c.bin") == true)
            #expect(clash["group"]?["state"] != "completed")
            // The failed publish is an event, so that a client waiting on the group learns of it.
            let events = RPCClient(socketPath: daemon.socket)
            defer { events.close() }
            _ = try events.call("subscribe", ["group": "clash", "since": 0])
            try events.setReadTimeout(10)
            var failedEvent = false
            while let message = try? events.readMessage() {
                if message["method"] == "group.state", message["params"]?["state"] == "failed" {
                    failedEvent = true
                    break
                }
            }
            #expect(failedEvent)
            #expect(try daemon.dlctl(["wait", "--group", "clash", "--timeout", "30"]).status == 1)
            #expect(try String(contentsOfFile: clashDir + "/c.bin", encoding: .utf8) == "mine")
            #expect(!FileManager.default.fileExists(atPath: clashDir + "/d.bin"), "a file was moved before the clash was found")
            let staging = try stagingFolders(in: daemon.downloadDir)
            #expect(staging.count == 1)
            if let folder = staging.first {
                try expectOriginBytes(at: daemon.downloadDir + "/" + folder + "/d.bin", count: 4000)
            }

            try FileManager.default.removeItem(atPath: clashDir + "/c.bin")
            let resumed = try daemon.dlctl(["resume", "--group", "clash"])
            #expect(resumed.status == 0, "\(resumed.stderr)")
            try waitForGroup(daemon, "clash") { $0["group"]?["state"] == "completed" }
            try expectOriginBytes(at: clashDir + "/c.bin", count: 3000)
            try expectOriginBytes(at: clashDir + "/d.bin", count: 4000)
            #expect(try stagingFolders(in: daemon.downloadDir).isEmpty)
        }
    }

    /// Group `cancel` deletes the staging folder; `remove` keeps published files unless
    /// `delete_file`; commands on an unknown group get `group_not_found`.
    @Test func groupCancelRemoveAndNotFound() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: quickRetries)
            try daemon.start()
            defer { daemon.stop() }
            // One member done and staged, one still downloading (slowly).
            let slowDir = daemon.downloadDir + "/slow"
            _ = try daemon.call(
                "enqueue",
                [
                    "group": ["name": "slow", "dir": .string(slowDir)],
                    "jobs": [
                        ["url": .string("\(origin.baseURL)/bytes/1000"), "name": "fast.bin"],
                        ["url": .string("\(origin.baseURL)/bytes/\(4 << 20)?rate=500000"), "name": "slow.bin"],
                    ],
                ])
            try waitForGroup(daemon, "slow") { ($0["group"]?["members_done"]?.int64Value ?? 0) >= 1 }
            let staging = try stagingFolders(in: daemon.downloadDir)
            #expect(staging.count == 1)
            let stagingPath = daemon.downloadDir + "/" + (staging.first ?? "none")
            #expect(FileManager.default.fileExists(atPath: stagingPath + "/fast.bin"))
            let canceled = try daemon.dlctl(["cancel", "--group", "slow"])
            #expect(canceled.status == 0, "\(canceled.stderr)")
            #expect(!FileManager.default.fileExists(atPath: stagingPath), "the staging folder stayed")
            #expect(!FileManager.default.fileExists(atPath: slowDir))
            let slowStatus = try daemon.call("status", ["group": "slow"])
            #expect(slowStatus["group"]?["state"] == "canceled", "\(slowStatus.serializedString())")
            let members = slowStatus["jobs"]?.arrayValue ?? []
            #expect(members.count == 2)
            // The member that was still downloading is canceled (a completed one cannot be).
            #expect(members.contains { $0["name"] == "slow.bin" && $0["state"] == "canceled" }, "\(members)")

            // remove without delete_file: the published files stay; with it: they go.
            for name in ["keep", "drop"] {
                _ = try daemon.call(
                    "enqueue",
                    [
                        "group": ["name": .string(name), "dir": .string(daemon.downloadDir + "/" + name)],
                        "jobs": [
                            ["url": .string("\(origin.baseURL)/bytes/1000"), "name": "x.bin"],
                            ["url": .string("\(origin.baseURL)/bytes/2000"), "path": "sub/y.bin"],
                        ],
                    ])
                try waitForGroup(daemon, .string(name)) { $0["group"]?["state"] == "completed" }
            }
            _ = try daemon.call("remove", ["group": "keep"])
            try expectOriginBytes(at: daemon.downloadDir + "/keep/x.bin", count: 1000)
            try expectOriginBytes(at: daemon.downloadDir + "/keep/sub/y.bin", count: 2000)
            #expect(try daemon.callError("status", ["group": "keep"]).stableCode == "group_not_found")
            _ = try daemon.call("remove", ["group": "drop", "delete_file": true])
            #expect(!FileManager.default.fileExists(atPath: daemon.downloadDir + "/drop/x.bin"))
            #expect(!FileManager.default.fileExists(atPath: daemon.downloadDir + "/drop/sub/y.bin"))
            #expect(try daemon.callError("status", ["group": "drop"]).stableCode == "group_not_found")

            for method in ["status", "pause", "resume", "cancel", "remove"] {
                for reference: JSONValue in ["no-such-group", 9999] {
                    let error = try daemon.callError(method, ["group": reference])
                    #expect(error.stableCode == "group_not_found", "\(method) \(reference.serializedString()): \(error)")
                }
            }
            let cli = try daemon.dlctl(["pause", "--group", "no-such-group"])
            #expect(cli.status == 1)
            #expect(cli.stderr.contains("group_not_found"), "\(cli.stderr)")
        }
    }
}
