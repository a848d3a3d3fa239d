import DLCore
@testable import DLDaemon
@testable import DLEngine
import DLRPC
import DLJobTable
import DLStore
import DLTransfer
import Foundation
import Logging
import Testing

/// A real engine on a temp database, driven through the dispatcher: every protocol rule
/// without a socket.
final class DispatcherFixture: Sendable {
    let folder: String
    let downloads: String
    let dispatcher: Dispatcher
    let engine: Engine
    let downloader: Downloader

    init() async throws {
        folder = NSTemporaryDirectory() + "dld-rpc-\(UUID().uuidString)"
        downloads = folder + "/dl"
        try FileManager.default.createDirectory(atPath: downloads, withIntermediateDirectories: true)
        let store = try SQLiteJobStore(path: folder + "/jobs.sqlite")
        let logger = Logger(label: "test")
        downloader = Downloader(logger: logger)
        engine = Engine(store: store, downloader: downloader, configuration: EngineConfiguration(downloadDir: downloads), logger: logger)
        try await engine.start()
        dispatcher = Dispatcher(engine: engine)
    }

    deinit { try? FileManager.default.removeItem(atPath: folder) }

    func close() async { await engine.shutdown() }

    /// Runs `body` with a fresh fixture and always shuts its engine down (the HTTP client must be
    /// shut down before it is released).
    static func with(_ body: (DispatcherFixture) async throws -> Void) async throws {
        let fixture = try await DispatcherFixture()
        do {
            try await body(fixture)
        } catch {
            await fixture.close()
            throw error
        }
        await fixture.close()
    }

    func send(_ line: String) async -> JSONValue? {
        guard let data = await dispatcher.handle(line: Data(line.utf8)).data else { return nil }
        return try? JSONValue.parse(data)
    }

    func request(_ method: String, _ params: JSONValue = [:], id: JSONValue = 1) async -> JSONValue? {
        await send(RPCRequest(method: method, params: params.objectValue ?? [:], id: id).json.serializedString())
    }
}

extension JSONValue {
    var errorCode: Int64? { self["error"]?["code"]?.int64Value }
    var stableCode: String? { self["error"]?["data"]?["code"]?.stringValue }
}

@Suite struct DispatcherTests {
    /// Framing errors: bad JSON, not a request, bad id, positional params, empty batch.
    @Test func malformedRequests() async throws {
        try await DispatcherFixture.with { f in
            let cases: [(String, Int64, String)] = [
                ("{not json", -32700, "parse_error"),
                ("\u{FF}\u{FE}", -32700, "parse_error"),
                ("42", -32600, "invalid_request"),
                (#"{"jsonrpc":"1.0","method":"version","id":1}"#, -32600, "invalid_request"),
                (#"{"jsonrpc":"2.0","method":7,"id":1}"#, -32600, "invalid_request"),
                (#"{"jsonrpc":"2.0","method":"version","id":{}}"#, -32600, "invalid_request"),
                (#"{"jsonrpc":"2.0","method":"version","id":1,"extra":true}"#, -32600, "invalid_request"),
                (#"{"jsonrpc":"2.0","method":"status","params":[1],"id":1}"#, -32602, "invalid_params"),
                (#"{"jsonrpc":"2.0","method":"status","params":"x","id":1}"#, -32600, "invalid_request"),
                ("[]", -32600, "invalid_request"),
                (#"{"jsonrpc":"2.0","method":"frobnicate","id":1}"#, -32601, "method_not_found"),
            ]
            for (line, code, stable) in cases {
                let response = try #require(await f.send(line), "no response to \(line)")
                #expect(response.errorCode == code, "\(line)")
                #expect(response.stableCode == stable, "\(line)")
                #expect(response["jsonrpc"] == "2.0")
            }
        }
    }

    /// The id is echoed; a notification gets no reply; a batch answers each request in order.
    @Test func idsNotificationsAndBatches() async throws {
        try await DispatcherFixture.with { f in
            #expect(await f.request("version", id: "abc")?["id"] == "abc")
            #expect(await f.send(#"{"jsonrpc":"2.0","method":"version"}"#) == nil)
            let batch = try #require(
                await f.send(
                    #"[{"jsonrpc":"2.0","method":"version","id":1},{"jsonrpc":"2.0","method":"stats"},5,{"jsonrpc":"2.0","method":"nope","id":2}]"#
                ))
            let items = try #require(batch.arrayValue)
            #expect(items.count == 3)
            #expect(items[0]["result"]?["version"] == .string(DLDVersion.current))
            #expect(items[1].stableCode == "invalid_request")
            #expect(items[2]["id"] == 2)
            #expect(items[2].stableCode == "method_not_found")
            #expect(await f.send(#"[{"jsonrpc":"2.0","method":"version"}]"#) == nil)
        }
    }

    /// Unknown or mistyped params are rejected, naming the param; nothing is created.
    @Test func paramsAreChecked() async throws {
        try await DispatcherFixture.with { f in
            let cases: [(String, JSONValue, String, String)] = [
                ("enqueue", ["url": "http://e.com/a", "priorty": 1], "invalid_params", "priorty"),
                ("enqueue", [:], "invalid_params", "url"),
                ("enqueue", ["url": 5], "invalid_params", "url"),
                ("enqueue", ["url": "ftp://e.com/a"], "invalid_url", "ftp"),
                ("enqueue", ["url": "not a url"], "invalid_url", "URL"),
                ("enqueue", ["url": "http://e.com/a", "path": "relative/file"], "invalid_params", "absolute"),
                ("enqueue", ["url": "http://e.com/a", "dir": "/nonexistent/dld/folder"], "destination_invalid", "does not exist"),
                ("enqueue", ["url": "http://e.com/a", "name": "a/b"], "invalid_params", "name"),
                ("enqueue", ["url": "http://e.com/a", "priority": 5000], "invalid_params", "priority"),
                ("enqueue", ["url": "http://e.com/a", "headers": ["Bad Name": "x"]], "invalid_params", "header"),
                ("enqueue", ["url": "http://e.com/a", "headers": ["X-A": "a\r\nHost: evil"]], "invalid_params", "line breaks"),
                ("enqueue", ["url": "http://e.com/a", "meta": .string(String(repeating: "m", count: 70_000))], "invalid_params", "meta"),
                ("enqueue", ["jobs": []], "invalid_params", "jobs"),
                ("enqueue", ["jobs": [["url": "http://e.com/a"], ["url": "gopher://x"]]], "invalid_url", "jobs[1]"),
                ("pause", [:], "invalid_params", "id"),
                ("pause", ["id": 1, "all": true], "invalid_params", "only one"),
                ("pause", ["id": "1"], "invalid_params", "integer"),
                ("pause", ["ids": []], "invalid_params", "empty"),
                ("pause", ["id": 99], "job_not_found", "99"),
                ("status", ["id": 0], "invalid_params", "between"),
                ("list", ["state": "sleeping"], "invalid_params", "sleeping"),
                ("list", ["limit": 0], "invalid_params", "limit"),
                ("stats", ["verbose": true], "invalid_params", "verbose"),
            ]
            for (method, params, stable, mention) in cases {
                let response = try #require(await f.request(method, params))
                #expect(response.stableCode == stable, "\(method) \(params.serializedString()) → \(response.serializedString())")
                let message = response["error"]?["message"]?.stringValue ?? ""
                #expect(message.contains(mention), "\(message) should mention \(mention)")
            }
            #expect(await f.request("list")?["result"]?["jobs"] == .array([]))
        }
    }

    /// A call of thousands is checked in two halves at once: the error names the first job in
    /// error, in either half or both, and nothing is created.
    @Test func largeEnqueueNamesTheFirstJobInError() async throws {
        try await DispatcherFixture.with { f in
            func jobs(badAt bad: Set<Int>) -> JSONValue {
                .array(
                    (0..<1500).map { n in
                        bad.contains(n) ? ["url": "gopher://x"] : ["url": .string("http://127.0.0.1:9/\(n)"), "paused": true]
                    })
            }
            for (bad, named) in [([1200, 1400], 1200), ([10, 1200], 10), ([749], 749), ([750], 750), ([1499], 1499)] {
                let response = try #require(await f.request("enqueue", ["jobs": jobs(badAt: Set(bad))]))
                #expect(response.stableCode == "invalid_url", "\(response.serializedString())")
                let message = response["error"]?["message"]?.stringValue ?? ""
                #expect(message.hasPrefix("jobs[\(named)]:"), "\(bad): \(message)")
            }
            #expect(await f.request("list")?["result"]?["jobs"] == .array([]))
            let created = try #require(await f.request("enqueue", ["jobs": jobs(badAt: [])])?["result"])
            #expect(created["created"] == 1500)
            #expect(created["results"]?.arrayValue?.compactMap { $0["path"]?.stringValue }.last == .some(f.downloads + "/1499"))
        }
    }

    /// An existing file is never replaced unless asked; the key returns the existing job.
    @Test func destinationsAndKeys() async throws {
        try await DispatcherFixture.with { f in
            let existing = f.downloads + "/have.bin"
            try Data("mine".utf8).write(to: URL(fileURLWithPath: existing))
            let refused = try #require(await f.request("enqueue", ["url": "http://127.0.0.1:9/have.bin", "paused": true]))
            #expect(refused.stableCode == "destination_exists")
            #expect(try String(contentsOfFile: existing, encoding: .utf8) == "mine")

            let first = try #require(
                await f.request("enqueue", ["url": "http://127.0.0.1:9/a%20b.bin", "key": "k", "paused": true, "meta": ["page": 1]]))
            #expect(first["result"]?["created"] == true)
            #expect(first["result"]?["job"]?["path"] == .string(f.downloads + "/a b.bin"))
            #expect(first["result"]?["job"]?["meta"] == ["page": 1])
            #expect(first["result"]?["job"]?["state"] == "paused")
            let again = try #require(await f.request("enqueue", ["url": "http://127.0.0.1:9/other", "key": "k"]))
            #expect(again["result"]?["created"] == false)
            #expect(again["result"]?["job"]?["id"] == first["result"]?["job"]?["id"])

            let clash = try #require(
                await f.request("enqueue", ["url": "http://127.0.0.1:9/x", "path": .string(f.downloads + "/a b.bin")]))
            #expect(clash.stableCode == "destination_exists")

            let many = try #require(
                await f.request(
                    "enqueue",
                    [
                        "jobs": [
                            ["url": "http://127.0.0.1:9/1", "paused": true],
                            ["url": "http://127.0.0.1:9/2", "dir": .string(f.downloads), "name": "two", "paused": true],
                        ]
                    ]))
            let results = try #require(many["result"]?["results"]?.arrayValue)
            #expect(results.map { $0["path"] } == [.string(f.downloads + "/1"), .string(f.downloads + "/two")])
            #expect(results.map { $0["created"] } == [true, true])
            let ids = results.compactMap { $0["id"]?.int64Value }
            #expect(ids.count == 2 && ids[1] == ids[0] + 1)
            #expect(many["result"]?["count"] == 2)
            #expect(await f.request("stats")?["result"]?["counts"]?["paused"] == 3)
        }
    }

    /// pause/resume/cancel/remove on ids and all, with invalid_state where a job cannot.
    @Test func commandsOnSelections() async throws {
        try await DispatcherFixture.with { f in
            for n in 1...3 { _ = await f.request("enqueue", ["url": .string("http://127.0.0.1:9/\(n)"), "paused": true]) }
            let canceled = try #require(await f.request("cancel", ["id": 2]))
            #expect(canceled["result"] == ["count": 1, "ids": [2], "more": false, "requested": 0])
            #expect(await f.request("status", ["id": 2])?["result"]?["state"] == "canceled")
            #expect(await f.request("pause", ["ids": [1, 2]])?.stableCode == "invalid_state")
            #expect(await f.request("pause", ["ids": [1, 99]])?.stableCode == "job_not_found")
            // Pausing a paused job is not an error: it is already what was asked.
            #expect(await f.request("pause", ["id": 1])?["result"] == ["count": 0, "ids": [], "more": false, "requested": 0])
            #expect(await f.request("status", ["id": 1])?["result"]?["state"] == "paused")
            let removed = try #require(await f.request("remove", ["ids": [2, 3]]))
            #expect(removed["result"]?["removed"] == [2, 3])
            #expect(removed["result"]?["count"] == 2)
            #expect(await f.request("status", ["id": 3])?.stableCode == "job_not_found")
            #expect(await f.request("status", ["ids": [1]])?["result"]?["jobs"]?.arrayValue?.count == 1)
        }
    }

    /// list pages with limit and after_id.
    @Test func listPaging() async throws {
        try await DispatcherFixture.with { f in
            for n in 1...5 { _ = await f.request("enqueue", ["url": .string("http://127.0.0.1:9/\(n)"), "paused": true]) }
            let page1 = try #require(await f.request("list", ["limit": 2])?["result"])
            #expect(page1["jobs"]?.arrayValue?.compactMap { $0["id"]?.int64Value } == [1, 2])
            #expect(page1["next_after_id"] == 2)
            let page3 = try #require(await f.request("list", ["limit": 2, "after_id": 4])?["result"])
            #expect(page3["jobs"]?.arrayValue?.compactMap { $0["id"]?.int64Value } == [5])
            #expect(page3["next_after_id"] == .null)
            #expect(await f.request("list", ["state": ["paused", "queued"]])?["result"]?["jobs"]?.arrayValue?.count == 5)
        }
    }

    /// A group's members in `status` and `list` (filtered by state), and `subscribe` by the
    /// group's name: the members as `status` of each shows them.
    @Test func groupMembersInStatusAndList() async throws {
        try await DispatcherFixture.with { f in
            let jobs: [JSONValue] = (1...3).map { n in ["url": .string("http://127.0.0.1:9/\(n)"), "name": .string("p\(n).jpg")] }
            let created = try #require(
                await f.request(
                    "enqueue",
                    [
                        "group": ["name": "book", "dir": .string(f.downloads + "/book")], "jobs": .array(jobs), "paused": true,
                    ])?["result"])
            let ids = try #require(created["results"]?.arrayValue?.compactMap { $0["id"]?.int64Value ?? $0["job"]?["id"]?.int64Value })
            #expect(ids.count == 3)
            _ = try #require(await f.request("cancel", ["id": .int(ids[1])])?["result"])

            let status = try #require(await f.request("status", ["group": "book"])?["result"])
            let members = try #require(status["jobs"]?.arrayValue)
            #expect(members.compactMap { $0["id"]?.int64Value } == ids)
            for member in members {
                let id = try #require(member["id"]?.int64Value)
                #expect(member == (await f.request("status", ["id": .int(id)])?["result"]), "\(id)")
            }
            let paused = try #require(await f.request("list", ["group": "book", "state": ["paused"]])?["result"])
            #expect(paused["jobs"]?.arrayValue?.compactMap { $0["id"]?.int64Value } == [ids[0], ids[2]])
            #expect(paused["next_after_id"] == .null)
            let all = try #require(await f.request("list", ["group": "book"])?["result"])
            #expect(all["jobs"]?.arrayValue?.map { $0["state"] } == ["paused", "canceled", "paused"])

            let subscribe = await f.dispatcher.handle(
                line: Data(#"{"jsonrpc":"2.0","id":5,"method":"subscribe","params":{"group":"book"}}"#.utf8))
            let group = try #require(status["group"]?["id"]?.int64Value)
            #expect(subscribe.subscription?.filter.group == group)
        }
    }

    /// Credentials in headers and URLs are stored but shown redacted: in the enqueue reply,
    /// `status`, `list`, and the events `subscribe` streams (replayed from the table and encoded
    /// as the control server sends them).
    @Test func secretsAreRedacted() async throws {
        try await DispatcherFixture.with { f in
            let response = try #require(
                await f.request(
                    "enqueue",
                    [
                        "url": "http://user:hunter2@127.0.0.1:9/f", "paused": true,
                        "headers": ["Authorization": "Bearer s3cret", "X-Trace": "visible"],
                    ]))
            let id = try #require(response["result"]?["job"]?["id"]?.int64Value)
            // A change of state, so that there are events beyond the creation.
            _ = try #require(await f.request("cancel", ["id": .int(id)])?["result"])
            let status = try #require(await f.request("status", ["id": .int(id)])?["result"])
            let list = try #require(await f.request("list")?["result"])
            #expect(list["jobs"]?.arrayValue?.count == 1)

            let subscribe = await f.dispatcher.handle(
                line: Data(#"{"jsonrpc":"2.0","id":5,"method":"subscribe","params":{"since":0}}"#.utf8))
            #expect(subscribe.subscription?.since == 0)
            let events = try await f.engine.events(after: 0)
            #expect(events.map(\.state) == ["paused", "canceled"], "\(events)")
            let streamed = events.map { JobJSON.encodeEvent($0).serializedString() }.joined(separator: "\n")

            for (name, text) in [
                ("enqueue", response.serializedString()), ("status", status.serializedString()),
                ("list", list.serializedString()), ("events", streamed),
            ] {
                #expect(!text.contains("hunter2"), "\(name): \(text)")
                #expect(!text.contains("s3cret"), "\(name): \(text)")
            }
            // What is checked is there: the job, its URL (redacted) and its harmless header.
            for text in [response.serializedString(), status.serializedString(), list.serializedString()] {
                #expect(text.contains("user:***@127.0.0.1:9/f"), "\(text)")
                #expect(text.contains("visible"), "\(text)")
            }
        }
    }

    /// insecure is kept and shown; on_exists takes only its two values.
    @Test func insecureAndOnExists() async throws {
        try await DispatcherFixture.with { f in
            let job = try #require(await f.request("enqueue", ["url": "https://127.0.0.1:9/i", "paused": true, "insecure": true]))
            #expect(job["result"]?["job"]?["insecure"] == true)
            #expect(await f.request("enqueue", ["url": "https://127.0.0.1:9/j", "on_exists": "clobber"])?.stableCode == "invalid_params")
        }
    }

    /// `metered` is stored with the job and shown; a job that does not say shows
    /// null; it must be a boolean.
    @Test func meteredIsKeptAndShown() async throws {
        try await DispatcherFixture.with { f in
            let held = try #require(await f.request("enqueue", ["url": "https://127.0.0.1:9/m", "paused": true, "metered": false]))
            #expect(held["result"]?["job"]?["metered"] == false)
            let id = try #require(held["result"]?["job"]?["id"]?.int64Value)
            let status = try #require(await f.request("status", ["id": .int(id)]))
            #expect(status["result"]?["metered"] == false, "\(status.serializedString())")
            let plain = try #require(await f.request("enqueue", ["url": "https://127.0.0.1:9/n", "paused": true]))
            #expect(plain["result"]?["job"]?["metered"] == .null)
            #expect(await f.request("enqueue", ["url": "https://127.0.0.1:9/o", "metered": "no"])?.stableCode == "invalid_params")
        }
    }
}

@Suite struct ConfigTests {
    /// The TOML subset: strings, numbers, booleans, arrays, comments; errors name the line.
    @Test func tomlSubset() throws {
        let entries = try TOMLLite.parse(
            """
            # comment
            a = "x\\ty" # trailing
            b = 'raw\\n'
            c = 1_000
            d = 2.5
            e = true
            f = ["p", 'q']
            """)
        #expect(entries.map(\.key) == ["a", "b", "c", "d", "e", "f"])
        #expect(entries[0].value == .string("x\ty"))
        #expect(entries[1].value == .string("raw\\n"))
        #expect(entries[2].value == .integer(1000))
        #expect(entries[3].value == .float(2.5))
        #expect(entries[4].value == .bool(true))
        #expect(entries[5].value == .array([.string("p"), .string("q")]))
        for (bad, line) in [("x = ", 1), ("a = 1\n[table]", 2), ("a = 1\na = 2", 2), ("a = unquoted", 1), ("a = \"open", 1)] {
            #expect(throws: (any Error).self) { try TOMLLite.parse(bad) }
            do {
                _ = try TOMLLite.parse(bad)
            } catch let error as TOMLLite.ParseError {
                #expect(error.line == line, "\(bad)")
            }
        }
    }

    /// A config file overrides defaults; unknown keys and wrong types are refused with the line.
    @Test func configFile() throws {
        let folder = NSTemporaryDirectory() + "dld-cfg-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let file = folder + "/config.toml"
        try "max_active = 1\ndownload_dir = \"/srv/dl\"\nlog_level = \"debug\"\n".write(toFile: file, atomically: true, encoding: .utf8)
        var config = DaemonConfig.defaults(environment: ["HOME": "/home/u", "XDG_RUNTIME_DIR": "/run/user/7"])
        #expect(config.socket == "/run/user/7/dld/dld.sock")
        #expect(config.stateDir == "/home/u/.local/state/dld")
        #expect(config.downloadDir == "/home/u/Downloads")
        try config.apply(file: file)
        #expect(config.maxActive == 1)
        #expect(config.downloadDir == "/srv/dl")
        #expect(config.logLevel == .debug)
        #expect(config.rendered().contains("max_active = 1"))

        try "max_active = 1\nmax_actve = 2\n".write(toFile: file, atomically: true, encoding: .utf8)
        var other = DaemonConfig.defaults()
        #expect { try other.apply(file: file) } throws: { "\($0)".contains("line 2") && "\($0)".contains("max_actve") }
        try "max_active = \"three\"\n".write(toFile: file, atomically: true, encoding: .utf8)
        #expect { try other.apply(file: file) } throws: { "\($0)".contains("max_active must be an integer") }
    }

    /// The download folder from xdg-user-dirs' file; a folder equal to $HOME is not taken
    /// (xdg-user-dirs writes that when the folder was disabled).
    @Test func userDirs() {
        #expect(
            DaemonConfig.downloadDir(inUserDirs: "# c\nXDG_DOWNLOAD_DIR=\"$HOME/Téléchargements\"\n", home: "/home/u")
                == "/home/u/Téléchargements")
        #expect(DaemonConfig.downloadDir(inUserDirs: "XDG_DOWNLOAD_DIR=\"/srv/dl\"", home: "/home/u") == "/srv/dl")
        #expect(DaemonConfig.downloadDir(inUserDirs: "XDG_DOWNLOAD_DIR=\"$HOME/\"", home: "/home/u") == nil)
        #expect(DaemonConfig.downloadDir(inUserDirs: "XDG_MUSIC_DIR=\"$HOME/Music\"", home: "/home/u") == nil)
    }

    /// Without XDG_RUNTIME_DIR the socket goes to /tmp/dld-UID; DLD_SOCKET wins for clients.
    @Test func socketPaths() {
        #expect(SocketPath.defaultPath(environment: [:]) == "/tmp/dld-\(getuid())/dld.sock")
        #expect(SocketPath.clientPath(environment: ["DLD_SOCKET": "/x/s", "XDG_RUNTIME_DIR": "/run/user/1"]) == "/x/s")
    }
}

@Suite struct GroupRecoveryTests {
    /// A two-member group `book` whose members completed into its staging folder (each file
    /// holds its own name), as a crash would leave it; not yet saved.
    private func stagedGroup(_ store: SQLiteJobStore, dir: String, now: Date) async throws -> (JobGroup, [Job]) {
        let (group, members) = try await store.insertGroup(
            name: "book", dir: dir, priority: 0,
            members: [
                NewJob(url: "http://127.0.0.1:9/a", path: dir + "/a.txt", state: .paused),
                NewJob(url: "http://127.0.0.1:9/b", path: dir + "/sub/b.txt", state: .paused),
            ],
            now: now)
        var done: [Job] = []
        for var member in members {
            let staged = try #require(member.stagingPath)
            try FileManager.default.createDirectory(
                atPath: (staged as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
            try Data(member.name.utf8).write(to: URL(fileURLWithPath: staged))
            member.state = .completed
            member.received = Int64(member.name.utf8.count)
            done.append(member)
        }
        return (group, done)
    }

    /// A group whose members all completed, but that was not published before the daemon died,
    /// is published at the next start.
    @Test func unpublishedCompleteGroupIsPublishedAtStart() async throws {
        let folder = NSTemporaryDirectory() + "dld-grp-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: folder + "/dl", withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let store = try SQLiteJobStore(path: folder + "/jobs.sqlite")
        let dir = folder + "/dl/book"
        // As if both transfers had completed into the staging folder, and then dld died.
        let (group, done) = try await stagedGroup(store, dir: dir, now: Date())
        try await store.save(done)
        let logger = Logger(label: "test")
        let downloader = Downloader(logger: logger)
        let engine = Engine(
            store: store, downloader: downloader, configuration: EngineConfiguration(downloadDir: folder + "/dl"), logger: logger)
        try await engine.start()
        let (after, summary, _) = try await engine.groupStatus(.id(group.id))
        #expect(summary.state == .completed)
        #expect(after.closed == .completed)
        #expect(try String(contentsOfFile: dir + "/a.txt", encoding: .utf8) == "a.txt")
        #expect(try String(contentsOfFile: dir + "/sub/b.txt", encoding: .utf8) == "b.txt")
        #expect(!FileManager.default.fileExists(atPath: group.staging))
        await engine.shutdown()
    }

    /// A group recorded as published whose files were not moved yet when dld died (it records
    /// first, then moves): the next start moves them into place, and no member is reported
    /// missing. Also a job recorded completed whose `.part` was not linked yet is linked.
    @Test func recordedButNotMovedIsFinishedAtStart() async throws {
        let folder = NSTemporaryDirectory() + "dld-grp-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: folder + "/dl", withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let store = try SQLiteJobStore(path: folder + "/jobs.sqlite")
        let dir = folder + "/dl/book"
        let now = Date()
        var (group, members) = try await stagedGroup(store, dir: dir, now: now)
        for index in members.indices { members[index].stagingPath = nil }
        group.closed = .completed
        try await store.saveGroup(group, members: members)
        // A standalone job recorded completed, its complete bytes still in `.part`.
        var single = try await store.insert([NewJob(url: "http://127.0.0.1:9/c", path: folder + "/dl/c.bin", state: .paused)], now: now)[0]
            .job
        try Data("ccc".utf8).write(to: URL(fileURLWithPath: single.partialPath))
        single.state = .completed
        single.received = 3
        try await store.save(single)

        let logger = Logger(label: "test")
        let engine = Engine(
            store: store, downloader: Downloader(logger: logger), configuration: EngineConfiguration(downloadDir: folder + "/dl"),
            logger: logger)
        // Nothing below throws before the shutdown (a client left running would abort the run):
        // each failure is caught and recorded, so that it fails the test instead of passing it.
        do { try await engine.start() } catch { Issue.record(error, "the engine did not start") }
        #expect((try? String(contentsOfFile: dir + "/a.txt", encoding: .utf8)) == "a.txt")
        #expect((try? String(contentsOfFile: dir + "/sub/b.txt", encoding: .utf8)) == "b.txt")
        #expect(!FileManager.default.fileExists(atPath: group.staging))
        do {
            let after = try await store.members(of: group.id)
            #expect(after.map(\.id).sorted() == members.map(\.id).sorted())
            for member in after {
                #expect(member.state == .completed, "\(member.id)")
                #expect(member.error == nil, "\(member.id)")
            }
        } catch { Issue.record(error, "the group's members could not be read") }
        #expect((try? String(contentsOfFile: folder + "/dl/c.bin", encoding: .utf8)) == "ccc")
        #expect(!FileManager.default.fileExists(atPath: single.partialPath))
        do {
            let after = try await store.fetch(single.id)
            #expect(after?.state == .completed)
            #expect(after != nil && after?.error == nil)
        } catch { Issue.record(error, "the single job could not be read") }
        await engine.shutdown()
    }
}
