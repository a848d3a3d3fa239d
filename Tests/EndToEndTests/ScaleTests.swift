import DLCore
import DLRPC
import DLJobTable
import DLStore
import DLTestSupport
import Foundation
import Testing

/// Many jobs and many small files with the real `dld`: bulk commands checked row by row, small
/// replies, SIGTERM and SIGKILL in the middle of grouped commits. No timing is asserted.
@Suite(.serialized) struct ScaleTests {
    /// Every job, through `list` pages.
    private func allJobs(_ daemon: DaemonHarness) throws -> [JSONValue] {
        var jobs: [JSONValue] = []
        var after: Int64 = 0
        while true {
            let page = try daemon.call("list", ["limit": 10_000, "after_id": .int(after)])
            jobs += page["jobs"]?.arrayValue ?? []
            guard let next = page["next_after_id"]?.int64Value else { return jobs }
            after = next
        }
    }

    /// pause, resume, cancel and remove with `all`, `ids` and `group` on thousands of jobs:
    /// every row checked, replies small (count, at most 1000 ids), and `pause` all straight
    /// after `resume` all (which once crashed dld) answered.
    @Test func bulkCommandsOnThousandsOfJobs() throws {
        let daemon = try DaemonHarness()
        try daemon.start()
        defer { daemon.stop() }
        // Nothing may start: the rows stay where the commands put them.
        _ = try daemon.call("queue", ["paused": true])
        let count = 6000
        for part in 0..<2 {
            let jobs = JSONValue.array(
                (0..<count / 2).map { n in
                    ["url": .string("http://127.0.0.1:9/p\(part)-\(n)"), "paused": true]
                })
            let reply = try daemon.call("enqueue", ["jobs": jobs])
            #expect(reply["count"]?.int64Value == Int64(count / 2))
        }
        let client = RPCClient(socketPath: daemon.socket)
        defer { client.close() }
        let resumed = try client.call("resume", ["all": true])
        #expect(resumed["count"]?.int64Value == Int64(count))
        #expect(resumed["ids"]?.arrayValue?.count == 1000)
        #expect(resumed["ids"]?[0]?.int64Value == 1)
        #expect(resumed["more"] == true)
        #expect(resumed.serialized().count < 16 << 10, "a bulk reply stays small")
        let paused = try client.call("pause", ["all": true])
        #expect(paused["count"]?.int64Value == Int64(count))
        var jobs = try allJobs(daemon)
        #expect(jobs.count == count)
        #expect(jobs.allSatisfy { $0["state"] == "paused" })

        let some: [JSONValue] = (1...50).map { .int($0 * 7) }
        let canceled = try client.call("cancel", ["ids": .array(some)])
        #expect(canceled["count"]?.int64Value == 50)
        #expect(canceled["more"] == false)
        let again = try client.call("resume", ["all": true])
        #expect(again["count"]?.int64Value == Int64(count - 50))
        jobs = try allJobs(daemon)
        for job in jobs {
            let id = job["id"]?.int64Value ?? 0
            #expect(job["state"] == (id % 7 == 0 && id <= 350 ? "canceled" : "queued"), "job \(id)")
        }
        // A canceled job refuses resume when named; nothing changes then.
        #expect(try daemon.callError("pause", ["ids": [1, 7]]).stableCode == "invalid_state")
        #expect(try daemon.call("status", ["id": 1])["state"] == "queued")

        let removed = try client.call("remove", ["all": true])
        #expect(removed["count"]?.int64Value == Int64(count))
        #expect(try daemon.call("stats")["total"] == 0)
        #expect(daemon.stop() == 0)
    }

    /// SIGTERM with a large queue while transfers run: dld exits 0, and the transfers it
    /// stopped are queued with their bytes kept; the queue is intact after a restart.
    @Test func sigtermWithALargeQueue() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: "checkpoint_interval = 0.2\n")
            try daemon.start()
            // Slow enough never to finish during the test, however slow the machine.
            let size = 64 << 20
            let slow = (0..<3).map { n -> JSONValue in
                // One stream each: the partial file's size is then its committed bytes.
                ["url": .string("\(origin.baseURL)/bytes/\(size)?rate=200000"), "name": .string("slow\(n)"), "segments": 1]
            }
            _ = try daemon.call("enqueue", ["jobs": .array(slow)])
            for part in 0..<2 {
                let jobs = JSONValue.array(
                    (0..<5000).map { n in
                        ["url": .string("http://127.0.0.1:9/q\(part)-\(n)"), "paused": true]
                    })
                _ = try daemon.call("enqueue", ["jobs": jobs])
            }
            for id: Int64 in 1...3 {
                _ = try daemon.waitForJob(id) { $0["state"] == "running" && ($0["received"]?.int64Value ?? 0) > 0 }
            }
            // The sequence that once crashed dld, with transfers running.
            _ = try daemon.call("resume", ["all": true])
            _ = try daemon.call("pause", ["all": true])
            _ = try daemon.call("resume", ["ids": [1, 2, 3]])
            for id: Int64 in 1...3 {
                _ = try daemon.waitForJob(id) { $0["state"] == "running" && ($0["received"]?.int64Value ?? 0) > 0 }
            }
            #expect(daemon.stop() == 0, "\(daemon.log.suffix(2000))")
            var kept: [Int64] = []
            for id: Int64 in 1...3 {
                let partial = daemon.downloadDir + "/slow\(id - 1).part"
                kept.append((try? FileManager.default.attributesOfItem(atPath: partial)[.size] as? NSNumber)?.int64Value ?? 0)
            }

            try daemon.start()
            defer { daemon.stop() }
            let stats = try daemon.call("stats")
            #expect(stats["total"]?.int64Value == 10_003)
            #expect(stats["counts"]?["paused"]?.int64Value == 10_000)
            for id: Int64 in 1...3 {
                // Queued again with the bytes it had at SIGTERM committed, and running on.
                let job = try daemon.job(id)
                #expect(job["state"] == "queued" || job["state"] == "running", "\(job.serializedString())")
                #expect((job["received"]?.int64Value ?? 0) >= kept[Int(id) - 1] && kept[Int(id) - 1] > 0)
            }
            _ = try daemon.call("cancel", ["ids": [1, 2, 3]])
        }
    }

    /// SIGKILL while hundreds of small files and a group complete in grouped commits: after
    /// each kill, every file under its final name belongs to a completed job, and every
    /// completed job has its file (or its complete `.part`, which start-up links). After the
    /// restarts every file is byte-exact.
    @Test func sigkillDuringGroupedCommits() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: "max_active = 8\n")
            try daemon.start()
            let files = 400
            let jobs = JSONValue.array(
                (0..<files).map { n in
                    ["url": .string("\(origin.baseURL)/bytes/\(1000 + n)"), "name": .string("f\(n)")]
                })
            _ = try daemon.call("enqueue", ["jobs": jobs])
            let groupDir = daemon.downloadDir + "/chapter"
            let members = JSONValue.array(
                (0..<100).map { n in
                    ["url": .string("\(origin.baseURL)/bytes/\(3000 + n)"), "name": .string("p\(n)")]
                })
            _ = try daemon.call("enqueue", ["group": ["name": "chapter", "dir": .string(groupDir)], "jobs": members])

            for threshold in [60, 200, 330] {
                let deadline = Date().addingTimeInterval(120)
                while Date() < deadline {
                    let done = try daemon.call("stats")["counts"]?["completed"]?.int64Value ?? 0
                    if done >= threshold { break }
                    usleep(2000)
                }
                daemon.crash()
                try await checkAfterCrash(daemon, groupDir: groupDir)
                try daemon.start()
            }
            defer { daemon.stop() }
            for id in Int64(1)...Int64(files + 100) {
                let job = try daemon.waitForState(id, ["completed", "failed"], timeout: 120)
                #expect(job["state"] == "completed", "\(job.serializedString())")
            }
            for n in 0..<files { try expectOriginBytes(at: daemon.downloadDir + "/f\(n)", count: 1000 + n) }
            for n in 0..<100 { try expectOriginBytes(at: groupDir + "/p\(n)", count: 3000 + n) }
            let left = try FileManager.default.contentsOfDirectory(atPath: daemon.downloadDir)
            #expect(!left.contains { $0.hasSuffix(".part") || $0.contains(".dld-staging-") }, "\(left.filter { $0.hasSuffix(".part") })")
        }
    }

    /// A small file's slot goes straight to the next queued job, before a turn of the queue
    /// claims it: still never more transfers at once than the host limits allow (small files
    /// run in the light lane, beside `max_active`; the origin counts the bodies it streams at
    /// once), each job started once, and a `pause` of all in the middle
    /// leaves every job paused or completed, and no file under the name of a job that is not
    /// completed. `resume` then completes every file byte-exact.
    @Test func handedOffSlotsKeepTheLimitAndObeyPause() async throws {
        try await withOrigin { origin in
            // Two names of the origin, each allowed fewer transfers than there are slots: the
            // slots are handed over across hosts.
            let daemon = try DaemonHarness(config: "max_active = 3\nmax_per_host = 2\n")
            try daemon.start()
            defer { daemon.stop() }
            let other = origin.baseURL.replacingOccurrences(of: "127.0.0.1", with: "localhost")
            let files = 120
            // Each body takes about 30 ms (a burst of 800 bytes, then 40 000 bytes/s): more
            // transfers than the slots would overlap at the origin.
            // The first four bodies (two on each host) wait for each other at the origin
            // (`gate=4`): the limit is reached for certain, not by the luck of overlapping bodies.
            let jobs = JSONValue.array(
                (0..<files).map { n in
                    [
                        "url": .string("\(n % 3 == 0 ? other : origin.baseURL)/bytes/\(2000 + n)?rate=40000\(n < 4 ? "&gate=4" : "")"),
                        "name": .string("f\(n)"),
                    ]
                })
            _ = try daemon.call("enqueue", ["jobs": jobs])
            let deadline = Date().addingTimeInterval(120)
            while Date() < deadline, (try daemon.call("stats")["counts"]?["completed"]?.int64Value ?? 0) < 30 {
                usleep(2000)
            }
            let paused = try daemon.call("pause", ["all": true])
            #expect((paused["count"]?.int64Value ?? 0) > 0)
            var rows = try allJobs(daemon)
            let settle = Date().addingTimeInterval(30)
            while Date() < settle, rows.contains(where: { $0["state"] != "paused" && $0["state"] != "completed" }) {
                usleep(20_000)
                rows = try allJobs(daemon)
            }
            for job in rows {
                let name = daemon.downloadDir + "/f\((job["id"]?.int64Value ?? 1) - 1)"
                if job["state"] == "completed" {
                    #expect(job["attempts"]?.int64Value == 1, "\(job.serializedString())")
                } else {
                    #expect(job["state"] == "paused", "\(job.serializedString())")
                    #expect(!FileManager.default.fileExists(atPath: name), "\(name) exists for a paused job")
                }
            }
            let completed = rows.filter { $0["state"] == "completed" }.count
            #expect(completed >= 30 && completed < files, "paused in the middle: \(completed) completed")

            _ = try daemon.call("resume", ["all": true])
            for id in Int64(1)...Int64(files) {
                let job = try daemon.waitForState(id, ["completed", "failed"], timeout: 120)
                #expect(job["state"] == "completed", "\(job.serializedString())")
            }
            for n in 0..<files { try expectOriginBytes(at: daemon.downloadDir + "/f\(n)", count: 2000 + n) }
            // Two hosts of two transfers each.
            #expect(origin.mostConcurrentBodies == 4, "bodies streamed at once: \(origin.mostConcurrentBodies)")
            #expect(!daemon.log.contains("transfers stop here"), "a job was started twice: \(daemon.log.suffix(2000))")
        }
    }

    /// The same for a group: a member's place goes straight to the next member, never more at
    /// once than `group_parallel`, each member started once, and the group is published whole
    /// and byte-exact.
    @Test func handedOffPlacesKeepTheGroupLimit() async throws {
        try await withOrigin { origin in
            // The first two members' bodies wait for each other (`gate=2`): the group's limit
            // is reached for certain.
            try groupRunsWhole(origin, config: "max_active = 1\ngroup_parallel = 2\n", files: 60, query: "?rate=40000", gated: 2)
            #expect(origin.mostConcurrentBodies == 2, "bodies streamed at once: \(origin.mostConcurrentBodies)")
        }
    }

    /// Hundreds of small members at full speed, so that places are handed over while the
    /// group also claims members: each member starts once, and the group is published whole.
    @Test func fastGroupMembersStartOnce() async throws {
        try await withOrigin { origin in
            try groupRunsWhole(origin, config: "", files: 600, query: "")
        }
    }

    /// A transfer started straight from the ready list may have its claim left for a later
    /// commit (small files' slots cost no transaction each): the claim is still committed
    /// long before the transfer's first checkpoint, which is written only for this worker's
    /// `running` job. A slow file handed a slot by a small one shows `running`, checkpoints,
    /// and completes after one attempt, byte-exact, as do the small files around it.
    @Test func handedOffLongTransferIsClaimedBeforeItsCheckpoints() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: "max_active = 1\ncheckpoint_interval = 0.25\n")
            try daemon.start()
            defer { daemon.stop() }
            // About 1.5 s at 200 000 bytes/s: several checkpoints.
            let slow = 300_000
            let sizes = [2000, slow, 2001, 2002, 2003, 2004, 2005]
            let jobs = JSONValue.array(
                sizes.enumerated().map { n, size in
                    let rate = size == slow ? "?rate=200000" : ""
                    return ["url": .string("\(origin.baseURL)/bytes/\(size)\(rate)"), "name": .string("f\(n)")]
                })
            _ = try daemon.call("enqueue", ["jobs": jobs])
            var sawRunning = false
            let deadline = Date().addingTimeInterval(60)
            while Date() < deadline {
                let job = try daemon.call("status", ["id": 2])
                if job["state"] == "running" { sawRunning = true }
                if job["state"] == "completed" || job["state"] == "failed" { break }
                usleep(20_000)
            }
            #expect(sawRunning, "the slow job's claim was committed while it ran")
            for (n, size) in sizes.enumerated() {
                let job = try daemon.waitForState(Int64(n + 1), ["completed", "failed"], timeout: 60)
                #expect(job["state"] == "completed" && job["attempts"]?.int64Value == 1, "\(job.serializedString())")
                try expectOriginBytes(at: daemon.downloadDir + "/f\(n)", count: size)
            }
            #expect(!daemon.log.contains("lease_lost"), "a checkpoint found the job not running: \(daemon.log.suffix(2000))")
        }
    }

    /// Runs one group of `files` members (`/bytes/<2000 + n><query>`) in a fresh daemon and
    /// checks that it completed, every member after one start, every file byte-exact, and that
    /// no transfer was stopped as lost (what a job started twice leads to).
    private func groupRunsWhole(_ origin: TestOrigin, config: String, files: Int, query: String, gated: Int = 0) throws {
        let daemon = try DaemonHarness(config: config)
        try daemon.start()
        defer { daemon.stop() }
        let dir = daemon.downloadDir + "/chapter"
        let members = JSONValue.array(
            (0..<files).map { n in
                [
                    "url": .string("\(origin.baseURL)/bytes/\(2000 + n)\(query)\(n < gated ? "&gate=\(gated)" : "")"),
                    "name": .string("p\(n)"),
                ]
            })
        _ = try daemon.call("enqueue", ["group": ["name": "chapter", "dir": .string(dir)], "jobs": members])
        var state: String? = nil
        let deadline = Date().addingTimeInterval(120)
        while Date() < deadline {
            state = try daemon.call("status", ["group": "chapter"])["group"]?["state"]?.stringValue
            if state == "completed" || state == "failed" { break }
            usleep(20_000)
        }
        #expect(state == "completed")
        let jobs = try allJobs(daemon)
        #expect(jobs.count == files)
        for job in jobs {
            #expect(job["state"] == "completed" && job["attempts"]?.int64Value == 1, "\(job.serializedString())")
        }
        for n in 0..<files { try expectOriginBytes(at: dir + "/p\(n)", count: 2000 + n) }
        #expect(!daemon.log.contains("transfers stop here"), "a member was started twice: \(daemon.log.suffix(2000))")
    }

    /// Reads the job table of a killed daemon and checks that no change was half made.
    private func checkAfterCrash(_ daemon: DaemonHarness, groupDir: String) async throws {
        let store = try SQLiteJobStore(path: daemon.stateDir + "/jobs.sqlite")
        let fm = FileManager.default
        func size(_ path: String) -> Int64? {
            (try? fm.attributesOfItem(atPath: path)[.size] as? NSNumber)?.int64Value
        }
        for job in try await store.list() {
            let published = size(job.path) != nil
            if job.state == .completed {
                let staged = job.stagingPath.map { size($0) != nil || size($0 + ".part") == job.received } ?? false
                let pending = size(job.path + ".part") == job.received
                #expect(published || staged || pending, "completed job \(job.id) has no file")
            } else {
                #expect(!published, "job \(job.id) is \(job.state.rawValue) but \(job.path) exists")
            }
        }
        if fm.fileExists(atPath: groupDir) {
            #expect(try await store.list().filter { $0.groupID != nil }.allSatisfy { $0.state == .completed })
        }
    }
}
