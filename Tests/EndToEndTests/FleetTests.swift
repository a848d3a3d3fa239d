import DLCore
import DLRPC
import DLTestSupport
import Foundation
import Testing

/// Several real `dld` workers on one job table in a real PostgreSQL (started by the test run,
/// see PostgresServer), downloading into one shared folder from the test origin: each job runs
/// on one worker at a time, a worker that is killed loses its jobs to the others once its
/// lease ends, and a command sent to any worker reaches the transfer wherever it runs.
@Suite(.serialized) struct FleetTests {
    /// The workers' common config: the database, a short lease so that a dead worker's jobs
    /// come back within seconds, and the shared folder as an allowed root.
    private func workers(
        _ names: [String], database url: String, shared: String, maxActive: Int = 3, lease: Int = 3, checkpointInterval: Double = 2
    ) throws -> [DaemonHarness] {
        try names.map { name in
            let config = """
                database = "\(url)"
                worker_name = "\(name)"
                lease = \(lease)
                max_active = \(maxActive)
                allowed_roots = ["\(shared)"]
                checkpoint_interval = \(checkpointInterval)

                """
            return try DaemonHarness(extraArguments: ["--log-level", "info"], config: config)
        }
    }

    /// A fresh database on the shared PostgreSQL server (its name and URL), a shared download
    /// folder and the test origin, for `body`; the database and folder are removed after it.
    /// With `server`, on that one (a test that stops it has a server of its own).
    private func withFleet(on own: PostgresServer? = nil, _ body: (PostgresServer, String, String, String, TestOrigin) async throws -> Void)
        async throws
    {
        let server = try own ?? PostgresServer.shared()
        let name = try server.createDatabase()
        defer { server.dropDatabase(name) }
        let url = "postgresql://\(server.user)@/\(name)?host=\(server.socketFolder)&port=\(server.port)"
        let shared = NSTemporaryDirectory() + "dld-fleet-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: shared, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: shared) }
        try await withOrigin { origin in try await body(server, name, url, shared, origin) }
    }

    /// Three workers, 2000 small jobs enqueued through one of them; one worker SIGKILLed while
    /// it runs jobs. Every job completes exactly once, byte-exact: one `completed` event per
    /// job, no URL fetched whole more than twice, and a second whole fetch only for the jobs the
    /// killed worker was running (their bytes were not committed, so they start from 0).
    @Test func threeWorkersShareOneQueue() async throws {
        try await withFleet { server, name, url, shared, origin in
            // A lease of 6 s: a worker fences itself after 4.8 s without a renewal, which a
            // loaded machine (the whole suite on two cores) reached with 3 s.
            let fleet = try workers(["w1", "w2", "w3"], database: url, shared: shared, lease: 6)
            for worker in fleet { try worker.start() }
            defer { for worker in fleet { worker.stop() } }
            let count = 2000
            let size = 4096
            for part in 0..<4 {
                let jobs = JSONValue.array(
                    (0..<count / 4).map { n in
                        let index = part * count / 4 + n
                        return [
                            "url": .string("\(origin.baseURL)/bytes/\(size)?file=\(index)"), "dir": .string(shared),
                            "name": .string("f\(index).bin"),
                        ]
                    })
                let reply = try fleet[0].call("enqueue", ["jobs": jobs])
                #expect(reply["count"]?.int64Value == Int64(count / 4))
            }
            // Every worker is alive and seen by the others.
            let stats = try fleet[1].call("stats")
            let seen = Set((stats["workers"]?.arrayValue ?? []).compactMap { $0["id"]?.stringValue })
            #expect(seen.count == 3 && seen.allSatisfy { $0.hasSuffix("/w1") || $0.hasSuffix("/w2") || $0.hasSuffix("/w3") }, "\(seen)")
            let shown = try fleet[1].dlctl(["stats"]).stdout
            #expect(shown.contains("workers ") && shown.contains("/w2 (this one)") && shown.contains("/w3"), "\(shown)")

            // Kill w3 once it runs jobs and some are done: what it ran is taken over later.
            let victim = fleet[2]
            let victimID = try #require(try victim.call("stats")["worker"]?.stringValue)
            let runningOnVictim = "SELECT url FROM jobs WHERE state = 'running' AND worker = '\(victimID)'"
            let deadline = Date().addingTimeInterval(120)
            while Date() < deadline {
                let rows = try server.psql(database: name, runningOnVictim)
                let done = try server.psql(database: name, "SELECT count(*) FROM jobs WHERE state = 'completed'")
                if !rows.isEmpty, Int(done.trimmingCharacters(in: .whitespacesAndNewlines)) ?? 0 >= 100 {
                    victim.crash()
                    break
                }
                usleep(2000)
            }
            #expect(!victim.isRunning, "w3 never ran jobs")
            // Its rows stay as they were until its lease runs out (seconds from now).
            let orphaned = Set(
                try server.psql(database: name, runningOnVictim).split(separator: "\n").map {
                    String($0.dropFirst(origin.baseURL.count))
                })
            #expect(!orphaned.isEmpty)

            // Everything completes on the two that are left.
            let allDone = Date().addingTimeInterval(300)
            var counts = ""
            while Date() < allDone {
                counts = try server.psql(database: name, "SELECT state || ':' || count(*) FROM jobs GROUP BY state ORDER BY state")
                if counts.trimmingCharacters(in: .whitespacesAndNewlines) == "completed:\(count)" { break }
                usleep(100_000)
            }
            #expect(counts.trimmingCharacters(in: .whitespacesAndNewlines) == "completed:\(count)", "\(counts)")

            // Once each: one `completed` event per job, in the one numbered stream.
            let events = try server.psql(
                database: name,
                "SELECT count(*) || ':' || count(DISTINCT job_id) FROM events WHERE kind = 'job.state' AND state = 'completed'")
            #expect(events.trimmingCharacters(in: .whitespacesAndNewlines) == "\(count):\(count)")
            let expected = TestOrigin.bytes(count: size)
            for index in 0..<count {
                // A completed job has its file, whichever worker completed it, also when the
                // victim died between its commit and its link (the survivors link it when its
                // lease runs out). A live worker links right after its commit: a moment's wait.
                let file = shared + "/f\(index).bin"
                let linkedBy = Date().addingTimeInterval(10)
                while !FileManager.default.fileExists(atPath: file), Date() < linkedBy { usleep(20_000) }
                guard let data = try? Data(contentsOf: URL(fileURLWithPath: file)) else {
                    Issue.record("f\(index).bin is missing, but its job is completed")
                    break
                }
                if Array(data) != expected {
                    Issue.record("f\(index).bin is not the origin's bytes (\(data.count) bytes)")
                    break
                }
            }
            // The origin's view: fetches from byte 0 per file (a first request may have an end).
            var whole: [String: Int] = [:]
            for request in origin.requests where request.header("range")?.hasPrefix("bytes=0-") ?? true {
                whole[request.uri, default: 0] += 1
            }
            #expect(whole.count == count)
            let twice = whole.filter { $0.value > 1 }
            #expect(twice.values.allSatisfy { $0 == 2 }, "\(twice)")
            // Fetched whole twice only where an attempt ended without its bytes committed: the
            // jobs the killed worker ran, and those whose transfers a worker stopped as lost (a
            // fence, a job taken over, an older attempt ended before a re-claim), each named in
            // that worker's log. Exact, whether or not a worker fenced itself.
            var stopped: Set<String> = orphaned
            for worker in fleet {
                for line in worker.log.split(separator: "\n") {
                    var ids: [Int] = []
                    if line.contains("their transfers stop here"), let list = line.firstMatch(of: /jobs=\[([0-9, ]+)\]/) {
                        ids = list.1.split(separator: ",").compactMap { Int($0.trimmingCharacters(in: .whitespaces)) }
                    } else if line.contains("older attempt runs here"), let one = line.firstMatch(of: /\bjob=([0-9]+)/) {
                        ids = [Int(one.1) ?? 0]
                    }
                    // Job k is file k - 1: one fresh table, enqueued in order.
                    for id in ids { stopped.insert("/bytes/\(size)?file=\(id - 1)") }
                }
            }
            #expect(
                Set(twice.keys).isSubset(of: stopped),
                "fetched whole twice: \(twice.keys.sorted()); the victim ran \(orphaned.sorted()); stopped as lost: \(stopped.count)")
            // The survivors took the victim's jobs once its lease ran out.
            #expect(fleet[0].log.contains("leases ran out") || fleet[1].log.contains("leases ran out"))
        }
    }

    /// A pause sent to one worker stops the transfer that another runs, and a resume sent to
    /// the first continues the file from its committed offset, on whichever worker claims it.
    /// The lease is long (renewed every 30 s), so only the change signal can stop it in time.
    @Test func pauseReachesTheWorkerThatRunsTheJob() async throws {
        try await withFleet { server, name, url, shared, origin in
            let fleet = try workers(["a", "b"], database: url, shared: shared, maxActive: 1, lease: 90)
            for worker in fleet { try worker.start() }
            defer { for worker in fleet { worker.stop() } }
            let size = 8 << 20
            let id = try fleet[0].enqueue([
                "url": .string("\(origin.baseURL)/bytes/\(size)?rate=1000000"), "dir": .string(shared), "name": "slow.bin",
                // One connection: ranges would finish it before the pause can be seen.
                "segments": 1,
            ])
            let running = try fleet[0].waitForJob(id) { $0["state"] == "running" && $0["worker"]?.stringValue != nil }
            let runner = try #require(running["worker"]?.stringValue)
            let (runs, other) = runner.hasSuffix("/a") ? (fleet[0], fleet[1]) : (fleet[1], fleet[0])
            // `other` sees the committed offset (the runner's checkpoints), not live counters.
            _ = try other.waitForJob(id) { ($0["received"]?.int64Value ?? 0) > 0 }
            #expect(try runs.call("stats")["worker"]?.stringValue == runner)

            // The pause goes to the worker that runs the job, which carries it out: until then
            // the job is still running, with the command shown.
            let paused = try other.call("pause", ["id": .int(id)])
            #expect(paused["count"] == 0 && paused["requested"] == 1, "\(paused.serializedString())")
            _ = try runs.waitForState(id, ["paused"], timeout: 15)
            #expect(runs.waitForLog("carried out a command sent to another worker", timeout: 15), "\(runs.log)")
            let deadline = Date().addingTimeInterval(15)
            while origin.bodiesStreaming > 0, Date() < deadline { usleep(20_000) }
            #expect(origin.bodiesStreaming == 0, "the origin still sends after the pause")
            #expect(origin.requests.count == 1, "\(origin.requests.map(\.uri))")
            let kept = try other.job(id)["received"]?.int64Value ?? 0

            _ = try other.call("resume", ["id": .int(id)])
            let done = try other.waitForState(id, ["completed", "failed"], timeout: 120)
            #expect(done["state"] == "completed", "\(done.serializedString())")
            try expectOriginBytes(at: shared + "/slow.bin", count: size)
            // The second request asked for the rest only: from the committed offset, or from
            // further on where the runner's unsynced progress (this boot's, in the file) was
            // recorded after the last checkpoint.
            let ranges = origin.requests.compactMap { $0.header("range") }
            let starts = ranges.compactMap { Int64($0.dropFirst("bytes=".count).dropLast()) }
            #expect(kept > 0 && !ranges.isEmpty && starts.count == ranges.count, "kept \(kept), ranges \(ranges)")
            #expect(starts.allSatisfy { $0 >= kept && $0 < Int64(size) }, "kept \(kept), ranges \(ranges)")
        }
    }

    /// A worker that dies between recording files as completed and linking them leaves them
    /// as `.part`: another worker links them, at its start, or when the dead worker's lease
    /// runs out (a worker that never comes back), without downloading them again.
    @Test func filesADeadWorkerDidNotLinkAreLinked() async throws {
        try await withFleet { server, name, url, shared, origin in
            let fleet = try workers(["one", "two"], database: url, shared: shared)
            let (first, second) = (fleet[0], fleet[1])
            try first.start()
            let x = try first.enqueue(["url": .string("\(origin.baseURL)/bytes/1000"), "dir": .string(shared), "name": "x.bin"])
            try first.waitForState(x, ["completed"])
            #expect(first.stop() == 0)
            // As if it had died after the commit, before the link.
            #expect(rename(shared + "/x.bin", shared + "/x.bin.part") == 0)

            try second.start()
            defer { second.stop() }
            try expectOriginBytes(at: shared + "/x.bin", count: 1000)
            #expect(!FileManager.default.fileExists(atPath: shared + "/x.bin.part"))
            #expect(second.log.contains("published a file recorded as completed by a daemon that stopped"), "\(second.log)")

            // While it runs: a completed file left as `.part`, and a job running under a worker
            // whose lease has run out.
            let y = try second.enqueue(["url": .string("\(origin.baseURL)/bytes/2000"), "dir": .string(shared), "name": "y.bin"])
            try second.waitForState(y, ["completed"])
            #expect(rename(shared + "/y.bin", shared + "/y.bin.part") == 0)
            let z = try second.enqueue([
                "url": .string("\(origin.baseURL)/bytes/3000"), "dir": .string(shared), "name": "z.bin", "paused": true,
            ])
            _ = try server.psql(database: name, "UPDATE jobs SET state = 'running', worker = 'gone/dead', lease_until = 1 WHERE id = \(z)")
            let deadline = Date().addingTimeInterval(30)
            while !FileManager.default.fileExists(atPath: shared + "/y.bin"), Date() < deadline { usleep(50_000) }
            try expectOriginBytes(at: shared + "/y.bin", count: 2000)
            // Logged once the turn has linked them all.
            while !second.log.contains("linked files that a worker recorded as completed"), Date() < deadline { usleep(50_000) }
            #expect(second.log.contains("linked files that a worker recorded as completed"), "\(second.log)")
            #expect(try second.waitForState(z, ["completed", "failed"])["state"] == "completed")
            // Neither was fetched again.
            let fetched = origin.requests.filter { $0.uri.hasPrefix("/bytes/1000") || $0.uri.hasPrefix("/bytes/2000") }
            #expect(fetched.count == 2, "\(fetched.map(\.uri))")
        }
    }

    // MARK: PostgreSQL goes away

    /// `stats.lease` of each worker until `condition` holds for every one (each asked in
    /// turn, a bounded wait); returns the last replies.
    private func waitForLeases(_ fleet: [DaemonHarness], timeout: TimeInterval = 60, _ condition: (JSONValue) -> Bool) throws -> [JSONValue]
    {
        let deadline = Date().addingTimeInterval(timeout)
        var last: [JSONValue] = []
        repeat {
            last = try fleet.map { try $0.call("stats") }
            if last.allSatisfy(condition) { return last }
            usleep(100_000)
        } while Date() < deadline
        // What each worker said lately, without the lines of a server that is away.
        let logs = fleet.map { worker in
            worker.log.split(separator: "\n").filter {
                !$0.contains("cannot connect") && !$0.contains("creation failed") && !$0.contains("requestCancelled")
            }
            .suffix(40).joined(separator: "\n")
        }
        throw HarnessError(
            "the workers' stats did not come to the expected state within \(timeout) s: \(last.map { $0.serializedString() })\n"
                + logs.joined(separator: "\n----\n"))
    }

    /// The answer of `sql` (trimmed), asked every 20 ms until `done` holds of it or `timeout`
    /// has passed; the last answer either way.
    private func poll(_ server: PostgresServer, _ name: String, _ sql: String, timeout: TimeInterval = 60, until done: (String) -> Bool)
        throws -> String
    {
        let deadline = Date().addingTimeInterval(timeout)
        var answer = ""
        repeat {
            answer = try server.psql(database: name, sql).trimmingCharacters(in: .whitespacesAndNewlines)
            if done(answer) { break }
            usleep(20_000)
        } while Date() < deadline
        return answer
    }

    /// Enqueues `count` files of `size` bytes at `rate` (one stream each) through `worker`,
    /// into `shared`; returns their URIs.
    private func enqueueFiles(_ worker: DaemonHarness, origin: TestOrigin, shared: String, prefix: String, count: Int, size: Int, rate: Int)
        throws -> [String]
    {
        let uris = (0..<count).map { "/bytes/\(size)?rate=\(rate)&file=\(prefix)\($0)" }
        let jobs = JSONValue.array(
            uris.enumerated().map { n, uri in
                ["url": .string(origin.baseURL + uri), "dir": .string(shared), "name": .string("\(prefix)\(n).bin"), "segments": 1]
            })
        let reply = try worker.call("enqueue", ["jobs": jobs])
        guard reply["count"]?.int64Value == Int64(count) else { throw HarnessError("enqueue: \(reply.serializedString())") }
        return uris
    }

    /// Every job of the table completes (bounded wait), once: one `completed` event each; no
    /// file was streamed by two transfers at once; every file is the origin's bytes.
    private func expectAllCompleteOnce(
        _ server: PostgresServer, _ name: String, origin: TestOrigin, shared: String, files: [(name: String, size: Int)],
        sourceLocation: SourceLocation = #_sourceLocation
    ) throws {
        let counts = try poll(server, name, "SELECT state || ':' || count(*) FROM jobs GROUP BY state ORDER BY state", timeout: 300) {
            $0 == "completed:\(files.count)"
        }
        #expect(counts == "completed:\(files.count)", "\(counts)", sourceLocation: sourceLocation)
        let events = try server.psql(
            database: name, "SELECT count(*) || ':' || count(DISTINCT job_id) FROM events WHERE kind = 'job.state' AND state = 'completed'")
        #expect(
            events.trimmingCharacters(in: .whitespacesAndNewlines) == "\(files.count):\(files.count)", "completed events",
            sourceLocation: sourceLocation)
        let twice = origin.mostConcurrentBodiesByURI.filter { $0.value > 1 }
        #expect(twice.isEmpty, "streamed by two transfers at once: \(twice)", sourceLocation: sourceLocation)
        for file in files {
            let path = shared + "/" + file.name
            let linkedBy = Date().addingTimeInterval(10)
            while !FileManager.default.fileExists(atPath: path), Date() < linkedBy { usleep(20_000) }
            guard let data = try? Data(contentsOf: URL(fileURLWithPath: path)), data == Data(TestOrigin.bytes(count: file.size)) else {
                Issue.record("\(file.name) is missing or not the origin's bytes", sourceLocation: sourceLocation)
                return
            }
        }
    }

    /// PostgreSQL goes away under three running workers, stays away past a lease, and comes
    /// back. Each worker that cannot renew is fenced at 80 % of the lease: its transfers stop
    /// (the origin streams nothing), `stats` says so (`lease.fenced`, `table_unreachable`)
    /// while the table is away, and the log too. Once the server is back, the listener
    /// connects again, the workers renew and take jobs again, an `enqueue` answered before
    /// the outage and one sent during it (answered after) are both there, and every job
    /// completes once, never fetched by two transfers at once.
    @Test func postgresOutageFencesTheWorkersAndEveryJobCompletes() async throws {
        let server = try PostgresServer.start()
        defer { server.stop() }
        try await withFleet(on: server) { server, name, url, shared, origin in
            let lease = 4
            let fleet = try workers(["p1", "p2", "p3"], database: url, shared: shared, maxActive: 2, lease: lease)
            for worker in fleet { try worker.start() }
            defer { for worker in fleet { worker.stop() } }
            // 12 files of 3 MiB at 500 kB/s: each runs for seconds, long past the fence.
            let size = 3 << 20
            var uris = try enqueueFiles(fleet[0], origin: origin, shared: shared, prefix: "a", count: 12, size: size, rate: 500_000)
            // Every worker runs transfers when the server goes away.
            _ = try waitForLeases(fleet) { ($0["active"]?.int64Value ?? 0) > 0 }
            // Answered before the outage: committed, so it survives it.
            uris += try enqueueFiles(fleet[1], origin: origin, shared: shared, prefix: "b", count: 2, size: 1000, rate: 0)

            server.halt()
            let halted = Date()
            // Sent while the server is away: answered (if at all) only once it is committed.
            let jobs: JSONValue = [["url": .string(origin.baseURL + "/bytes/2000?file=c0"), "dir": .string(shared), "name": "c0.bin"]]
            let during = Background { try fleet[2].call("enqueue", ["jobs": jobs]) }

            // Fenced: each worker's stats says so while the table is away, and its transfers
            // have stopped (`active` goes to 0 once they have ended).
            let fenced = try waitForLeases(fleet, timeout: Double(lease) * 5) { $0["lease"]?["fenced"] == true && $0["active"] == 0 }
            for stats in fenced {
                #expect(stats["table_unreachable"]?.stringValue != nil, "\(stats.serializedString())")
                #expect(
                    stats["lease"]?["fences"] == 1 && stats["lease"]?["fenced_since"]?.stringValue != nil, "\(stats.serializedString())")
            }
            for worker in fleet {
                #expect(worker.waitForLog("this worker is fenced"), "\(worker.log.suffix(3000))")
            }
            // Their transfers stopped: nothing streams from the origin.
            let quiet = Date().addingTimeInterval(30)
            while origin.bodiesStreaming > 0, Date() < quiet { usleep(20_000) }
            #expect(origin.bodiesStreaming == 0, "transfers still stream while the workers are fenced")
            // Away past a lease (and the fence) before it comes back.
            let away = Double(lease) * 2 - Date().timeIntervalSince(halted)
            if away > 0 { usleep(UInt32(away * 1_000_000)) }
            try server.restart()
            // Every worker takes jobs again: none is left waiting on a statement that its
            // connection, cut by the halt, will never answer (issue 31).
            _ = try waitForLeases(fleet) { $0["lease"]?["fenced"] == false && $0["table_unreachable"] == .null }
            for worker in fleet {
                #expect(worker.waitForLog("PostgreSQL listener connected again"), "\(worker.log.suffix(3000))")
                #expect(worker.waitForLog("this worker takes jobs again"), "\(worker.log.suffix(3000))")
            }
            var files = uris.enumerated().map { n, _ in (name: n < 12 ? "a\(n).bin" : "b\(n - 12).bin", size: n < 12 ? size : 1000) }
            switch during.wait() {
            case .success(let reply):
                #expect(reply["count"] == 1, "\(reply.serializedString())")
                files.append((name: "c0.bin", size: 2000))
            case .failure(let error):
                // Refused while the table was away: then it is not there either.
                #expect(try server.psql(database: name, "SELECT count(*) FROM jobs WHERE path LIKE '%/c0.bin'").hasPrefix("0"), "\(error)")
            }
            try expectAllCompleteOnce(server, name, origin: origin, shared: shared, files: files)
        }
    }

    /// PostgreSQL restarts while a bulk command runs: the `pause` of every job either is
    /// answered (then every job that was not finished is paused) or fails with the reason,
    /// never half done; after a `resume` of all, every job completes once.
    /// One worker cut off from PostgreSQL while the others go on (issue 40: in the outage test
    /// the server went away for every worker, so a fence that came too late could never be seen
    /// beside another worker's attempt). Its connections go through a relay that is then
    /// stopped: nothing is closed and nothing answers, as in a network cut. Its leases run out on
    /// the server's clock and the other worker takes its jobs; the cut worker must have stopped
    /// every transfer before (`fenceAt` of the lease): no file is streamed by two transfers at
    /// once, and every job completes once with the origin's bytes once the cut heals.
    @Test func aWorkerCutOffAloneStopsBeforeItsJobsAreTaken() async throws {
        try await withFleet { server, name, url, shared, origin in
            let relay = try PostgresRelay(socket: "\(server.socketFolder)/.s.PGSQL.\(server.port)")
            defer { relay.stop() }
            let lease = 4
            let through = "postgresql://\(server.user)@127.0.0.1:\(relay.port)/\(name)?sslmode=disable"
            // The kept worker has free slots when the cut one's leases run out: it takes their
            // jobs at once, so a cut worker still streaming then (a fence after the lease) would
            // show as a file streamed twice.
            let fleet =
                try workers(["cut"], database: through, shared: shared, maxActive: 2, lease: lease)
                + workers(["kept"], database: url, shared: shared, maxActive: 4, lease: lease)
            defer { for worker in fleet { worker.stop() } }
            try fleet[0].start()
            let size = 3 << 20
            let uris = try enqueueFiles(fleet[0], origin: origin, shared: shared, prefix: "r", count: 4, size: size, rate: 400_000)
            _ = try waitForLeases([fleet[0]]) { $0["active"] == 2 }
            try fleet[1].start()
            _ = try waitForLeases([fleet[1]]) { $0["active"] == 2 }
            relay.cut()
            #expect(fleet[0].waitForLog("this worker is fenced", timeout: Double(lease) * 5), "\(fleet[0].log.suffix(3000))")
            // The kept worker takes the cut one's jobs once their leases have run out, and runs
            // them beside its own while the cut lasts.
            let taken = try poll(server, name, "SELECT count(*) FROM jobs WHERE worker LIKE '%/cut' AND state = 'running'") { $0 == "0" }
            #expect(taken == "0", "the cut worker still holds running jobs")
            _ = try waitForLeases([fleet[1]]) { $0["active"] == 4 }
            relay.heal()
            try expectAllCompleteOnce(
                server, name, origin: origin, shared: shared, files: uris.indices.map { (name: "r\($0).bin", size: size) })
        }
    }

    /// Item 7 of issue 36: a completion whose COMMIT reached the server but whose answer was
    /// lost (the relay drops it and closes the connection, as a restart or a cut at that moment
    /// does). The worker was told the commit failed; the row says completed. It must read the
    /// row again once the table answers and link the file: it was left a complete `.part` under
    /// a completed row for good. The file appears with the origin's bytes, the job completes
    /// once, and nothing is fetched again.
    @Test func aCompletionWhoseCommitAnswerWasLostIsLinked() async throws {
        try await withFleet { server, name, url, shared, origin in
            let relay = try PostgresRelay(socket: "\(server.socketFolder)/.s.PGSQL.\(server.port)", word: "completed")
            defer { relay.stop() }
            let through = "postgresql://\(server.user)@127.0.0.1:\(relay.port)/\(name)?sslmode=disable"
            let worker = try workers(["doubt"], database: through, shared: shared, maxActive: 1, lease: 4)[0]
            try worker.start()
            defer { worker.stop() }
            let size = 1 << 20
            let id = try worker.enqueue([
                "url": .string("\(origin.baseURL)/bytes/\(size)?rate=250000"), "dir": .string(shared), "name": "doubt.bin", "segments": 1,
            ])
            _ = try worker.waitForJob(id) { $0["state"] == "running" }
            relay.cutCommitAnswer()
            #expect(worker.waitForLog("may have been made", timeout: 60), "the commit's answer was never cut: \(worker.log.suffix(3000))")
            #expect(worker.waitForLog("completions whose commit was cut off had committed", timeout: 60), "\(worker.log.suffix(3000))")
            let path = shared + "/doubt.bin"
            let deadline = Date().addingTimeInterval(30)
            while !FileManager.default.fileExists(atPath: path), Date() < deadline { usleep(50_000) }
            try expectOriginBytes(at: path, count: size)
            #expect(!FileManager.default.fileExists(atPath: path + ".part"))
            let events = try poll(
                server, name, "SELECT count(*) FROM events WHERE kind = 'job.state' AND state = 'completed' AND job_id = \(id)"
            ) { $0 == "1" }
            #expect(events == "1")
            #expect(try server.psql(database: name, "SELECT state FROM jobs WHERE id = \(id)").hasPrefix("completed"))
            #expect(origin.requests.count == 1, "\(origin.requests.map(\.uri))")
        }
    }

    @Test func postgresRestartDuringABulkCommand() async throws {
        let server = try PostgresServer.start()
        defer { server.stop() }
        try await withFleet(on: server) { server, name, url, shared, origin in
            let fleet = try workers(["q1", "q2"], database: url, shared: shared, maxActive: 2, lease: 4)
            for worker in fleet { try worker.start() }
            defer { for worker in fleet { worker.stop() } }
            let size = 1 << 20
            _ = try enqueueFiles(fleet[0], origin: origin, shared: shared, prefix: "d", count: 300, size: size, rate: 2_000_000)
            _ = try waitForLeases(fleet) { ($0["active"]?.int64Value ?? 0) > 0 }

            // A session holds a queued row locked: the pause (one statement over every row)
            // waits for it inside its transaction, and the server is halted while it waits. The
            // restart then cuts the command off mid-way, which a halt before it was sent or
            // after it was answered would not (issue 40: nothing showed the two overlapped).
            let holder = try PostgresSession(server, database: name)
            defer { holder.close() }
            holder.send("BEGIN; SELECT id FROM jobs WHERE state = 'queued' ORDER BY id LIMIT 1 FOR UPDATE;")
            let held = try poll(
                server, name,
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'dld-test-holder' AND state = 'idle in transaction'"
            ) { $0 == "1" }
            #expect(held == "1", "the row was never held")
            let pause = Background { try fleet[1].call("pause", ["all": true]) }
            let waiting = try poll(
                server, name, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%state = ''paused''%'"
            ) { $0 != "0" }
            #expect(waiting != "0", "the pause never waited on the held row")
            server.halt()
            try server.restart()
            let outcome = pause.wait()
            let states = try server.psql(database: name, "SELECT state || ':' || count(*) FROM jobs GROUP BY state ORDER BY state")
            switch outcome {
            case .success(let reply):
                // Answered: committed whole. No job is left queued (running ones were paused
                // or were finishing).
                #expect((reply["count"]?.int64Value ?? 0) > 0, "\(reply.serializedString())")
                #expect(!states.contains("queued:"), "\(states)")
            case .failure(let error):
                // Not done at all: nothing was paused.
                #expect(!states.contains("paused:"), "\(error): \(states)")
                #expect("\(error)".contains("storage_error") || "\(error)".contains("job table"), "\(error)")
            }
            _ = try waitForLeases(fleet) { $0["lease"]?["fenced"] == false && $0["table_unreachable"] == .null }
            _ = try fleet[0].call("resume", ["all": true])
            try expectAllCompleteOnce(
                server, name, origin: origin, shared: shared, files: (0..<300).map { (name: "d\($0).bin", size: size) })
        }
    }

    /// `set_speed` of a running job, sent again and again to the worker that runs it for three
    /// leases, never moves the job's lease back: no other worker takes the job, and the origin
    /// sees one request and never two bodies at once (item 2 of issue 36: the claim-time row
    /// written back put the lease in the past, another worker requeued the job, and the file
    /// streamed twice at once).
    @Test func setSpeedOfARunningJobKeepsItsLease() async throws {
        try await withFleet { server, name, url, shared, origin in
            let lease = 4
            let fleet = try workers(["s1", "s2"], database: url, shared: shared, maxActive: 1, lease: lease)
            for worker in fleet { try worker.start() }
            defer { for worker in fleet { worker.stop() } }
            let size = 14 << 20
            let id = try fleet[0].enqueue([
                "url": .string("\(origin.baseURL)/bytes/\(size)?rate=1000000"), "dir": .string(shared), "name": "speed.bin", "segments": 1,
            ])
            let running = try fleet[0].waitForJob(id) { $0["state"] == "running" && $0["worker"]?.stringValue != nil }
            let runner = try #require(running["worker"]?.stringValue)
            let runs = runner.hasSuffix("/s1") ? fleet[0] : fleet[1]
            let until = Date().addingTimeInterval(Double(3 * lease))
            var rate: Int64 = 4_000_000
            while Date() < until {
                let reply = try runs.call("set_speed", ["id": .int(id), "max_speed": .int(rate)])
                #expect(reply["max_speed"]?.int64Value == rate, "\(reply.serializedString())")
                rate = rate == 4_000_000 ? 5_000_000 : 4_000_000
                usleep(250_000)
            }
            let done = try runs.waitForState(id, ["completed", "failed"], timeout: 120)
            #expect(done["state"] == "completed", "\(done.serializedString())")
            try expectOriginBytes(at: shared + "/speed.bin", count: size)
            #expect(origin.requests.count == 1, "\(origin.requests.map(\.uri))")
            #expect(origin.mostConcurrentBodies == 1)
        }
    }

    /// A worker whose listener connection went silent (its server process stopped: nothing
    /// closes the socket, as after a failover or a NAT timeout) still hears a pause sent to
    /// another worker within seconds, not at its next checkpoint, a minute away: the listener's
    /// own NOTIFY does not come back, so it connects again and catches up (item 5 of issue 36:
    /// such a listener stayed deaf for good).
    @Test func aSilentListenerConnectsAgainAndHearsThePause() async throws {
        try await withFleet { server, name, url, shared, origin in
            let fleet = try workers(["l1", "l2"], database: url, shared: shared, maxActive: 1, lease: 300, checkpointInterval: 60)
            for worker in fleet { try worker.start() }
            defer { for worker in fleet { worker.stop() } }
            let size = 64 << 20
            let id = try fleet[0].enqueue([
                "url": .string("\(origin.baseURL)/bytes/\(size)?rate=1000000"), "dir": .string(shared), "name": "deaf.bin", "segments": 1,
            ])
            let running = try fleet[0].waitForJob(id) { $0["state"] == "running" && $0["worker"]?.stringValue != nil }
            let runner = try #require(running["worker"]?.stringValue)
            let (runs, other) = runner.hasSuffix("/l1") ? (fleet[0], fleet[1]) : (fleet[1], fleet[0])
            // Every listener of the fleet goes silent: the server processes that serve them stop.
            let listeners = try server.psql(
                database: name,
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND (query LIKE 'LISTEN%' OR query LIKE '%dld_ping%')"
            ).split(separator: "\n").compactMap { Int32($0.trimmingCharacters(in: .whitespaces)) }
            try #require(listeners.count >= 2, "listeners: \(listeners)")
            for pid in listeners { kill(pid, SIGSTOP) }
            defer {
                for pid in listeners {
                    kill(pid, SIGCONT)
                    kill(pid, SIGTERM)
                }
            }
            let sent = Date()
            let paused = try other.call("pause", ["id": .int(id)])
            #expect(paused["requested"] == 1, "\(paused.serializedString())")
            let deadline = Date().addingTimeInterval(20)
            while origin.bodiesStreaming > 0, Date() < deadline { usleep(50_000) }
            #expect(origin.bodiesStreaming == 0, "the origin still sends \(Date().timeIntervalSince(sent)) s after the pause")
            _ = try runs.waitForState(id, ["paused"], timeout: 20)
            #expect(runs.waitForLog("PostgreSQL listener lost its connection", timeout: 5), "\(runs.log)")
        }
    }

    /// After a restart of PostgreSQL the worker lock (an advisory lock on its connection) is
    /// gone; a second daemon with the same worker id that starts then never runs beside the
    /// first: either the first took its lock again and the second is refused, or the second
    /// has it and the first is fenced (item 7 of issue 36: both ran, each requeuing the
    /// other's jobs).
    @Test func aSecondDaemonWithTheSameIDAfterARestartNeverRunsBesideTheFirst() async throws {
        let server = try PostgresServer.start()
        defer { server.stop() }
        try await withFleet(on: server) { server, name, url, shared, origin in
            let first = try workers(["twin"], database: url, shared: shared, maxActive: 1, lease: 6)[0]
            try first.start()
            defer { first.stop() }
            server.halt()
            try server.restart()
            let second = try workers(["twin"], database: url, shared: shared, maxActive: 1, lease: 6)[0]
            let started = (try? second.start()) != nil
            defer { second.stop() }
            if started {
                let deadline = Date().addingTimeInterval(20)
                var fenced = false
                while !fenced, Date() < deadline {
                    fenced = (try? first.call("stats")["lease"]?["fenced"]) == .bool(true)
                    if !fenced { usleep(100_000) }
                }
                #expect(fenced, "both daemons run as one worker: \(first.log.suffix(2000))")
            } else {
                #expect(second.log.contains("another dld runs as worker"), "\(second.log.suffix(2000))")
            }
        }
    }

    /// A worker whose clock is an hour ahead (`DLD_TEST_CLOCK_OFFSET`, a test hook) shares the
    /// queue with one whose clock is right: leases are reckoned on PostgreSQL's clock, so it
    /// does not see the other's leases as run out and takes none of its running jobs; its
    /// `stats` shows the difference. Every job completes once, none fetched twice at once.
    /// Item 9 of issue 36: a worker whose folder holds a leftover `.part` of a job (its own
    /// folder, not the one the job's committed bytes went to) never trusts it up to an offset
    /// that another machine committed: it starts over, and the file is the origin's bytes. Both
    /// workers run on one machine here: the other machine's folder is a file of other bytes put
    /// at the same path once the first worker is gone.
    @Test func aLeftoverPartialOfAnotherFolderIsNeverTrusted() async throws {
        try await withFleet { server, name, url, shared, origin in
            let fleet = try workers(["m1", "m2"], database: url, shared: shared, maxActive: 1, lease: 3, checkpointInterval: 1)
            try fleet[0].start()
            let size = 3 << 20
            let id = try fleet[0].enqueue([
                "url": .string("\(origin.baseURL)/bytes/\(size)?rate=1000000"), "dir": .string(shared), "name": "left.bin", "segments": 1,
            ])
            let committed = try poll(server, name, "SELECT received FROM jobs WHERE id = \(id)") { (Int64($0) ?? 0) >= 512 << 10 }
            #expect((Int64(committed) ?? 0) >= 512 << 10, "committed: \(committed)")
            fleet[0].crash()
            // The other machine's folder: a leftover of its own under the name, longer than the
            // committed offset.
            let part = shared + "/left.bin.part"
            unlink(part)
            #expect(FileManager.default.createFile(atPath: part, contents: Data(repeating: 0x58, count: size)))
            try fleet[1].start()
            defer { fleet[1].stop() }
            let done = try fleet[1].waitForState(id, ["completed", "failed"], timeout: 120)
            #expect(done["state"] == "completed", "\(done.serializedString())")
            try expectOriginBytes(at: shared + "/left.bin", count: size)
            #expect(fleet[1].log.contains("is not the one the job table counts"), "\(fleet[1].log.suffix(3000))")
        }
    }

    @Test func aWorkerWhoseClockIsAheadTakesNoRunningJob() async throws {
        try await withFleet { server, name, url, shared, origin in
            let fleet = try workers(["right", "ahead"], database: url, shared: shared, maxActive: 2, lease: 4)
            fleet[1].extraEnvironment["DLD_TEST_CLOCK_OFFSET"] = "3600"
            try fleet[0].start()
            defer { for worker in fleet { worker.stop() } }
            let size = 2 << 20
            var files = try enqueueFiles(fleet[0], origin: origin, shared: shared, prefix: "e", count: 2, size: size, rate: 400_000)
                .indices.map { (name: "e\($0).bin", size: size) }
            _ = try waitForLeases([fleet[0]]) { $0["active"] == 2 }
            // Started once the right worker runs jobs whose leases it renews: many lease
            // turns of the ahead worker pass while they run.
            try fleet[1].start()
            let ahead = try fleet[1].call("stats")
            let skew = ahead["lease"]?["clock_skew"]?.doubleValue ?? 0
            #expect(abs(skew + 3600) < 5, "\(ahead.serializedString())")
            files += try enqueueFiles(fleet[1], origin: origin, shared: shared, prefix: "f", count: 4, size: 4000, rate: 0)
                .indices.map { (name: "f\($0).bin", size: 4000) }
            try expectAllCompleteOnce(server, name, origin: origin, shared: shared, files: files)
            #expect(!fleet[1].log.contains("leases ran out"), "\(fleet[1].log.suffix(3000))")
            #expect(!fleet[0].log.contains("transfers stop here"), "\(fleet[0].log.suffix(3000))")
            let whole = origin.requests.filter { $0.uri.contains("file=e") && $0.header("range") == nil }.count
            #expect(whole == 2, "\(origin.requests.map(\.uri))")
        }
    }
}

/// scripts/pg_relay.py: a TCP port relayed to PostgreSQL's socket, which `cut` stops (SIGSTOP:
/// nothing closed, nothing answered) and `heal` lets go on; with `word`, `cutCommitAnswer`
/// arms the loss of one COMMIT's answer (of the next transaction that sends `word`).
final class PostgresRelay: @unchecked Sendable {
    let process = Process()
    let port: Int

    init(socket: String, word: String? = nil) throws {
        let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("scripts/pg_relay.py").path
        process.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
        process.arguments = [script, socket] + (word.map { [$0] } ?? [])
        let output = Pipe()
        process.standardOutput = output
        try process.run()
        var line = Data()
        while !line.contains(UInt8(ascii: "\n")) {
            let more = output.fileHandleForReading.availableData
            guard !more.isEmpty else { break }
            line += more
        }
        let words = String(decoding: line, as: UTF8.self).split(whereSeparator: \.isWhitespace)
        guard words.count == 2, words[0] == "ready", let port = Int(words[1]) else {
            process.terminate()
            throw HarnessError("pg_relay.py did not start: \(String(decoding: line, as: UTF8.self))")
        }
        self.port = port
    }

    func cut() { kill(process.processIdentifier, SIGSTOP) }
    func cutCommitAnswer() { kill(process.processIdentifier, SIGUSR1) }
    func heal() { kill(process.processIdentifier, SIGCONT) }

    /// SIGKILL: the test process passes an ignored SIGTERM on to its children, and the relay
    /// then stayed (the test hung in `waitUntilExit`).
    func stop() {
        kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
    }
}

/// A blocking call (an RPC that waits for the table) on a thread of its own, so that it does
/// not hold one of the few threads that async tasks share; `wait` gives its outcome.
final class Background<T: Sendable>: @unchecked Sendable {
    private let lock = NSLock()
    private var outcome: Result<T, any Error>?
    private let done = DispatchSemaphore(value: 0)

    init(_ body: @escaping @Sendable () throws -> T) {
        Thread.detachNewThread {
            let result: Result<T, any Error>
            do { result = .success(try body()) } catch { result = .failure(error) }
            self.lock.withLock { self.outcome = result }
            self.done.signal()
        }
    }

    func wait() -> Result<T, any Error> {
        done.wait()
        done.signal()
        return lock.withLock { outcome } ?? .failure(HarnessError("no outcome"))
    }
}
