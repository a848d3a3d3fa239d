import DLCore
import DLRPC
import DLTestSupport
import Foundation
import Testing

/// The URL cache (issue 11): `get` answers with the path of a local copy, downloads a miss as
/// an ordinary job, revalidates a stale copy with a conditional GET, and keeps within its byte
/// budget without evicting what a caller pinned.
@Suite struct CacheTests {
    func cacheStats(_ daemon: DaemonHarness) throws -> JSONValue {
        try #require(try daemon.call("stats")["cache"])
    }

    func get(_ daemon: DaemonHarness, _ url: String, _ extra: [String] = []) throws -> JSONValue {
        let run = try daemon.dlctl(["get", url, "--json"] + extra)
        #expect(run.status == 0, "\(run.stderr)\n\(daemon.log.split(separator: "\n").suffix(30).joined(separator: "\n"))")
        return try JSONValue.parse(Data(run.stdout.utf8))
    }

    /// Two `dlctl get` of one URL: one download (one request at the origin), then a hit with
    /// the same path; the download was an ordinary job into the cache folder.
    @Test func secondGetIsAHit() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness()
            try daemon.start()
            defer { daemon.stop() }
            let url = "\(origin.baseURL)/bytes/300000?cache_control=max-age=3600"
            let first = try daemon.dlctl(["get", url])
            #expect(first.status == 0, "\(first.stderr)")
            let path = first.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
            #expect(path.hasPrefix(daemon.root + "/cache/dld/files/"), "under XDG_CACHE_HOME/dld: \(path)")
            let name = (path as NSString).lastPathComponent
            #expect(name.count == 64 && name.allSatisfy(\.isHexDigit), "a hash, not a name from the server: \(name)")
            try expectOriginBytes(at: path, count: 300_000)

            let second = try get(daemon, url)
            #expect(second["path"]?.stringValue == path)
            #expect(second["source"] == "hit")
            #expect(origin.requests.filter { $0.path == "/bytes/300000" }.count == 1, "one download: \(origin.requests.map(\.uri))")

            let stats = try cacheStats(daemon)
            #expect(stats["hits"] == 1 && stats["misses"] == 1 && stats["revalidations"] == 0, "\(stats)")
            #expect(stats["entries"] == 1 && stats["bytes"] == 300_000, "\(stats)")
            let jobs = try #require(try daemon.call("list")["jobs"]?.arrayValue)
            #expect(jobs.count == 1 && jobs.first?["state"] == "completed" && jobs.first?["path"]?.stringValue == path, "\(jobs)")
        }
    }

    /// A stale copy is revalidated: the request carries If-None-Match, the origin answers 304
    /// and sends no body; when the server's version changes, the next `get` downloads it again.
    @Test func staleCopyIsRevalidated() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness()
            try daemon.start()
            defer { daemon.stop() }
            let uri = "/bytes/200000?cache_control=max-age=0"
            let url = origin.baseURL + uri
            let first = try get(daemon, url)
            #expect(first["source"] == "download")
            #expect(origin.bytesServed(uri: uri) == 200_000)

            let second = try get(daemon, url)
            #expect(second["source"] == "revalidated", "\(second)")
            #expect(second["path"] == first["path"])
            let requests = origin.requests.filter { $0.path == "/bytes/200000" }
            #expect(requests.count == 2)
            #expect(requests.last?.header("if-none-match") == "\"v1-200000\"", "\(requests.last?.headers ?? [])")
            #expect(origin.bytesServed(uri: uri) == 200_000, "a 304 transfers no body")
            let path = try #require(second["path"]?.stringValue)
            try expectOriginBytes(at: path, count: 200_000)
            #expect(try cacheStats(daemon)["revalidations"] == 1)

            origin.setETag("v2")
            let third = try get(daemon, url)
            #expect(third["source"] == "download", "a new version is downloaded: \(third)")
            #expect(origin.bytesServed(uri: uri) >= 400_000)
            let stats = try cacheStats(daemon)
            #expect(stats["misses"] == 2 && stats["revalidations"] == 1 && stats["entries"] == 1, "\(stats)")
        }
    }

    /// The origin is down when a stale copy is asked for: `dlctl get` still answers, with the
    /// copy it has (`source: stale`, the same path, the same bytes), and says why in the log.
    @Test func staleCopyIsServedWhenTheOriginIsDown() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness()
            try daemon.start()
            defer { daemon.stop() }
            let url = origin.baseURL + "/bytes/150000?cache_control=max-age=0"
            let first = try get(daemon, url)
            #expect(first["source"] == "download", "\(first)")
            let path = try #require(first["path"]?.stringValue)

            try await origin.shutdown()
            let offline = try get(daemon, url)
            #expect(offline["source"] == "stale", "\(offline)")
            #expect(offline["path"]?.stringValue == path)
            try expectOriginBytes(at: path, count: 150_000)
            #expect(daemon.waitForLog("serving the stale copy"), "\(daemon.log)")
            #expect(try cacheStats(daemon)["hits"] == 1)
        }
    }

    /// With `cache_max_bytes` for two files, the least recently used entry goes as others come,
    /// never the pinned one; after `unpin` it may go too.
    @Test func budgetKeepsPinnedEntries() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: "cache_max_bytes = 250000\n")
            try daemon.start()
            defer { daemon.stop() }
            func url(_ n: Int) -> String { "\(origin.baseURL)/bytes/\(100_000 + n)?cache_control=max-age=3600" }
            let pinned = try get(daemon, url(0), ["--pin"])
            #expect(pinned["pinned"] == true)
            var paths: [Int: String] = [0: try #require(pinned["path"]?.stringValue)]
            for n in 1...3 {
                paths[n] = try #require(try get(daemon, url(n))["path"]?.stringValue)
                let stats = try cacheStats(daemon)
                #expect((stats["bytes"]?.int64Value ?? .max) <= 250_000, "within the budget after get \(n): \(stats)")
                #expect(FileManager.default.fileExists(atPath: paths[0] ?? ""), "the pinned entry stays")
            }
            // 0 (pinned) and 3 (the newest) are left; 1 and 2 were evicted in turn.
            for n in [1, 2] { #expect(!FileManager.default.fileExists(atPath: paths[n] ?? ""), "entry \(n) evicted") }
            #expect(FileManager.default.fileExists(atPath: paths[3] ?? ""))
            #expect(try cacheStats(daemon)["pinned"] == 1)
            let listed = try #require(try daemon.call("cache_list")["entries"]?.arrayValue)
            #expect(listed.count == 2 && listed.contains { $0["pinned"] == true }, "\(listed)")

            let unpin = try daemon.dlctl(["unpin", url(0)])
            #expect(unpin.status == 0 && unpin.stdout.contains("unpinned"), "\(unpin.stdout)\(unpin.stderr)")
            _ = try get(daemon, url(4))
            #expect(!FileManager.default.fileExists(atPath: paths[0] ?? ""), "unpinned, it was the least recently used")
            #expect(FileManager.default.fileExists(atPath: paths[3] ?? ""))
            // An evicted URL is downloaded again.
            #expect(try get(daemon, url(1))["source"] == "download")
            #expect(origin.requests.filter { $0.path == "/bytes/100001" }.count == 2)
        }
    }

    /// Concurrent `get`s of one URL share one download; a URL that fails is an error naming
    /// the job's reason.
    @Test func concurrentGetsShareOneDownload() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: "max_attempts = 1\n")
            try daemon.start()
            defer { daemon.stop() }
            let url = "\(origin.baseURL)/bytes/400000?rate=400000"
            async let a = Task.detached { try daemon.dlctl(["get", url]) }.value
            async let b = Task.detached { try daemon.dlctl(["get", url]) }.value
            let (first, second) = try await (a, b)
            #expect(first.status == 0 && second.status == 0, "\(first.stderr)\(second.stderr)")
            #expect(first.stdout == second.stdout)
            #expect(origin.requests.filter { $0.path == "/bytes/400000" }.count == 1, "\(origin.requests.map(\.uri))")

            let failed = try daemon.callError("get", ["url": .string("\(origin.baseURL)/status/404")])
            #expect(failed.stableCode == "download_failed" && failed.message.contains("404"), "\(failed.message)")
            #expect(try daemon.callError("get", ["url": "ftp://example.com/x"]).stableCode == "invalid_url")
            #expect(try daemon.callError("get", ["url": .string(url), "pinned": true]).stableCode == "invalid_params")
        }
    }
}

/// A `get` that waits for its download when dld stops, by SIGTERM or by a `shutdown`
/// request: dld still stops at once, the download's bytes are kept, and the next `get` after
/// the restart continues the same job from them.
@Suite(.serialized) struct CacheRestartTests {
    @Test(arguments: ["signal", "request"])
    func stoppingDuringAGetKeepsTheDownload(_ how: String) async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: "min_free = 0\n")
            try daemon.start()
            defer { daemon.stop() }
            let uri = "/bytes/3000000?rate=1000000&cache_control=max-age=3600"
            let url = origin.baseURL + uri
            // A process of its own, not a task: a task that blocks on a child process can wait
            // long for a thread of the two-core test machine's pool.
            let waiting = Process()
            waiting.executableURL = URL(fileURLWithPath: try BuiltProducts.path("dlctl"))
            waiting.arguments = ["get", url]
            waiting.environment = daemon.environment
            let output = Pipe()
            waiting.standardOutput = output
            waiting.standardError = output
            try waiting.run()
            var job: JSONValue = .null
            let deadline = Date().addingTimeInterval(90)
            while Date() < deadline {
                if let first = (try? daemon.call("list"))?["jobs"]?.arrayValue?.first { job = first }
                if (job["received"]?.int64Value ?? 0) > 0 { break }
                usleep(50_000)
            }
            guard let id = job["id"]?.int64Value else {
                waiting.waitUntilExit()
                let early = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
                Issue.record("the get's job never ran: \(job); get: \(waiting.terminationStatus) \(early)\n\(daemon.log.suffix(3000))")
                return
            }
            if how == "signal" {
                #expect(daemon.stop() == 0)
            } else {
                _ = try daemon.call("shutdown")
                let stopped = Date().addingTimeInterval(20)
                while daemon.isRunning && Date() < stopped { usleep(20_000) }
                #expect(!daemon.isRunning, "dld stopped while a get waited")
            }
            waiting.waitUntilExit()
            let said = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
            #expect(waiting.terminationStatus != 0, "the waiting get did not get a path: \(said)")

            try daemon.start()
            let run = try daemon.dlctl(["get", url, "--json"])
            #expect(run.status == 0, "\(run.stderr)")
            let answer = try JSONValue.parse(Data(run.stdout.utf8))
            #expect(answer["source"] == "download" && answer["job"]?.int64Value == id, "the same job went on: \(answer)")
            try expectOriginBytes(at: try #require(answer["path"]?.stringValue), count: 3_000_000)
            #expect(try daemon.call("list")["jobs"]?.arrayValue?.count == 1)
            #expect(origin.requests.contains { $0.path == "/bytes/3000000" && $0.header("range") != nil }, "resumed with a range")
        }
    }
}

/// Entries unused for `cache_max_age` go on the timer, without another `get`; with a shared
/// PostgreSQL table `get` is refused with a reason, and `stats` says the cache is unavailable.
@Suite(.serialized) struct CacheAgeAndFleetTests {
    @Test func unusedEntriesGoOnTheTimer() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: "cache_max_age = \"1s\"\n")
            try daemon.start()
            defer { daemon.stop() }
            let run = try daemon.dlctl(["get", "\(origin.baseURL)/bytes/1000?cache_control=max-age=3600"])
            #expect(run.status == 0, "\(run.stderr)")
            let path = run.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
            #expect(daemon.waitForLog("cache: evicted"), "the sweep evicts the entry")
            #expect(!FileManager.default.fileExists(atPath: path))
            #expect(try daemon.call("stats")["cache"]?["entries"] == 0)
        }
    }

    @Test func getIsRefusedOnASharedTable() throws {
        let server = try PostgresServer.shared()
        let name = try server.createDatabase()
        defer { server.dropDatabase(name) }
        let url = "postgresql://\(server.user)@/\(name)?host=\(server.socketFolder)&port=\(server.port)"
        let daemon = try DaemonHarness(config: "database = \"\(url)\"\n")
        try daemon.start()
        defer { daemon.stop() }
        let refused = try daemon.callError("get", ["url": "http://127.0.0.1:9/x"])
        #expect(refused.stableCode == "invalid_state" && refused.message.contains("shared PostgreSQL"), "\(refused.message)")
        #expect(try daemon.call("stats")["cache"]?["available"] == false)
    }
}
