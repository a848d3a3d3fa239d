import DLCore
import DLRPC
import DLTestSupport
import Foundation
import Testing

/// The HTTP listener's page, metrics and OpenRPC document, against the real `dld`; the page in
/// a real browser (Debian's chromium, driven by Selenium: scripts/browser_test.py).
@Suite(.serialized) struct DashboardTests {
    static var repository: URL {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    }

    /// The page and its two files, each with a policy that lets in nothing but dld's own
    /// files and connections; none of them without the token.
    @Test func thePageIsServedWithAStrictPolicy() throws {
        let web = try WebDaemon()
        defer { web.daemon.stop() }
        let page = try web.request("GET", "/")
        #expect(page.status == 200)
        #expect(page.header("content-type")?.hasPrefix("text/html") == true)
        let policy = try #require(page.header("content-security-policy"))
        for rule in ["default-src 'none'", "script-src 'self'", "style-src 'self'", "connect-src 'self'", "frame-ancestors 'none'"] {
            #expect(policy.contains(rule), "\(policy)")
        }
        let html = String(decoding: page.body, as: UTF8.self)
        #expect(html.contains("<script src=\"/app.js\" defer></script>"))
        // No inline script or style, which the policy would block, and nothing from elsewhere.
        #expect(!html.contains("<script>") && !html.contains("style="))
        #expect(html.range(of: #"(src|href)="(https?:)?//"#, options: .regularExpression) == nil)
        for (path, type) in [("/app.js", "text/javascript"), ("/app.css", "text/css")] {
            let file = try web.request("GET", path)
            #expect(file.status == 200 && file.header("content-type")?.hasPrefix(type) == true, "\(path)")
            #expect(file.header("content-security-policy") == policy, "\(path)")
            #expect(try web.request("GET", path, auth: false).status == 401, "\(path)")
        }
        #expect(try web.request("GET", "/", auth: false).status == 401)
    }

    /// `GET /metrics`: Prometheus's text, whose counters move with a real download; a group
    /// of three counts once in `dld_jobs_completed_total` (docs/operations.md, "Metrics"), and
    /// `get` counts a miss, then a hit.
    @Test func metricsMoveWithADownload() async throws {
        try await withOrigin { origin in
            let web = try WebDaemon()
            defer { web.daemon.stop() }
            #expect(try web.request("GET", "/metrics", auth: false).status == 401)
            let before = try Self.metrics(web)
            #expect(before["dld_downloaded_bytes_total"] == 0)
            let reply = try web.rpc(#"{"jsonrpc":"2.0","id":1,"method":"enqueue","params":{"url":"\#(origin.baseURL)/bytes/250000"}}"#)
            let id = try #require(try JSONValue.parse(reply.body)["result"]?["job"]?["id"]?.int64Value)
            try web.daemon.waitForState(id, ["completed"])
            let after = try Self.metrics(web)
            #expect(after["dld_downloaded_bytes_total"] == 250_000)
            #expect(after["dld_jobs_completed_total"] == 1)
            #expect(after["dld_jobs{state=\"completed\"}"] == 1)

            let members: [JSONValue] = (0..<3).map { ["url": .string("\(origin.baseURL)/bytes/\(1000 + $0)")] }
            let grouped = try web.daemon.call(
                "enqueue", ["group": ["name": "three", "dir": .string(web.daemon.downloadDir + "/three")], "jobs": .array(members)])
            let group = try #require(grouped["group"]?["id"])
            let deadline = Date().addingTimeInterval(120)
            while try web.daemon.call("status", ["group": group])["group"]?["state"] != "completed", Date() < deadline {
                usleep(50_000)
            }
            // The members' notices would have come with their own turns, before the group's.
            var counted = try Self.metrics(web)
            while counted["dld_jobs_completed_total"] ?? 0 < 2, Date() < deadline {
                usleep(50_000)
                counted = try Self.metrics(web)
            }
            #expect(counted["dld_jobs_completed_total"] == 2, "the group and its members: \(counted)")
            #expect(counted["dld_jobs{state=\"completed\"}"] == 4)
            #expect(counted["dld_downloaded_bytes_total"] == 253_003)

            #expect(counted["dld_cache_misses_total"] == 0 && counted["dld_cache_hits_total"] == 0)
            let url = JSONValue.string("\(origin.baseURL)/bytes/3000")
            #expect(try web.daemon.call("get", ["url": url])["source"] == "download")
            let missed = try Self.metrics(web)
            #expect(missed["dld_cache_misses_total"] == 1 && missed["dld_cache_hits_total"] == 0, "\(missed)")
            #expect(try web.daemon.call("get", ["url": url])["source"] == "hit")
            let hit = try Self.metrics(web)
            #expect(hit["dld_cache_misses_total"] == 1 && hit["dld_cache_hits_total"] == 1, "\(hit)")
        }
    }

    /// The samples of `GET /metrics`, by name and labels.
    static func metrics(_ web: WebDaemon) throws -> [String: Double] {
        let response = try web.request("GET", "/metrics")
        #expect(response.status == 200)
        #expect(response.header("content-type")?.hasPrefix("text/plain; version=0.0.4") == true)
        var samples: [String: Double] = [:]
        for line in String(decoding: response.body, as: UTF8.self).split(separator: "\n") where !line.hasPrefix("#") {
            guard let space = line.lastIndex(of: " "), let value = Double(line[line.index(after: space)...]) else { continue }
            samples[String(line[..<space])] = value
        }
        return samples
    }

    /// `GET /openrpc.json`: the document `rpc.discover` answers, with every method.
    @Test func theOpenRPCDocumentOverHTTP() throws {
        let web = try WebDaemon()
        defer { web.daemon.stop() }
        let response = try web.request("GET", "/openrpc.json")
        #expect(response.status == 200 && response.header("content-type") == "application/json")
        let document = try JSONValue.parse(response.body)
        #expect(document["openrpc"]?.stringValue?.hasPrefix("1.3") == true)
        let names = Set((document["methods"]?.arrayValue ?? []).compactMap { $0["name"]?.stringValue })
        #expect(names == Set(RPCMethod.allCases.map(\.rawValue)))
        #expect(document == (try web.daemon.call("rpc.discover")))
    }

    /// In chromium: log in with the token URL, add a URL and watch its bar reach 100 %, pause
    /// and resume a job, see a failed job's reason, add a group and see its line, no console
    /// errors; screenshots in light and dark in .build/dashboard-screenshots.
    @Test func theDashboardInARealBrowser() async throws {
        try await withOrigin { origin in
            let web = try WebDaemon()
            defer { web.daemon.stop() }
            let login = "http://127.0.0.1:\(web.port)/login?token=\(try web.token)"
            let shots = Self.repository.appendingPathComponent(".build/dashboard-screenshots").path
            try? FileManager.default.removeItem(atPath: shots)
            let script = Self.repository.appendingPathComponent("scripts/browser_test.py").path
            let run = try runProgram("/usr/bin/python3", [script, login, origin.baseURL, shots, web.daemon.downloadDir])
            #expect(run.status == 0, "\(run.stdout)\(run.stderr.suffix(3000))")
            for scheme in ["light", "dark", "phone"] {
                let png = try Data(contentsOf: URL(fileURLWithPath: "\(shots)/dashboard-\(scheme).png"))
                #expect(png.starts(with: [0x89, 0x50, 0x4E, 0x47]) && png.count > 10_000, "\(scheme): \(png.count) bytes")
            }
        }
    }
}

/// Every method of the table over `POST /rpc` and over `/ws`, with real params, each answered
/// without an error and with a result that says the method did what it is for (read back
/// through the other methods where it changes something); a client of either transport can do
/// all a socket client can.
@Suite(.serialized) struct EveryMethodOverHTTPTests {
    /// Calls `method` over one transport; its result, or the error's stable code.
    typealias Call = (_ method: String, _ params: [String: JSONValue]) throws -> JSONValue

    /// `pass`: 1 the first time on a daemon, 2 the second (the `get` is then a hit).
    static func run(_ call: Call, origin: TestOrigin, dir: String, pass: Int) throws -> Set<String> {
        var called: Set<String> = []
        func reply(_ method: String, _ params: [String: JSONValue] = [:]) throws -> JSONValue {
            called.insert(method)
            return try call(method, params)
        }
        func ok(_ method: String, _ params: [String: JSONValue] = [:]) throws -> JSONValue {
            let answer = try reply(method, params)
            #expect(answer["error"] == nil, "\(method): \(answer.serializedString())")
            return answer["result"] ?? .null
        }
        let methods = try ok("rpc.discover")["methods"]?.arrayValue?.compactMap { $0["name"]?.stringValue }
        #expect(Set(methods ?? []) == Set(RPCMethod.allCases.map(\.rawValue)))
        let version = try ok("version")
        #expect(version == ["protocol": .int(Int64(DLDVersion.protocolVersion)), "version": .string(DLDVersion.current)])
        #expect(try ok("queue", ["paused": true]) == ["paused": true, "reason": "paused by the user"])
        let url = "\(origin.baseURL)/bytes/1000"
        let enqueued = try ok("enqueue", ["url": .string(url), "dir": .string(dir)])
        let job = try #require(enqueued["job"]?["id"])
        #expect(enqueued["job"]?["state"] == "queued" && enqueued["job"]?["url"] == .string(url), "\(enqueued.serializedString())")
        let status = try ok("status", ["id": job])
        #expect(status["id"] == job && status["state"] == "queued" && status["url"] == .string(url), "\(status.serializedString())")
        // The `get` of the first pass left its cache job (completed) in the table.
        let list = try ok("list", ["limit": 10])
        let unfinished = list["jobs"]?.arrayValue?.filter { $0["state"] != "completed" }.compactMap { $0["id"] }
        #expect(unfinished == [job], "\(list.serializedString())")
        let stats = try ok("stats")
        #expect(stats["queue_paused"] == true && stats["counts"]?["queued"] == 1, "\(stats.serializedString())")
        #expect(try ok("pause", ["id": job]) == ["count": 1, "ids": [job], "more": false, "requested": 0])
        #expect(try ok("status", ["id": job])["state"] == "paused")
        let limited = try ok("set_speed", ["id": job, "max_speed": 1000])
        #expect(limited["id"] == job && limited["max_speed"] == 1000, "\(limited.serializedString())")
        let global = try ok("set_speed", ["global": true, "max_speed": 4096])
        #expect(global["limit"] == 4096 && global["source"] == "set_speed", "\(global.serializedString())")
        #expect(try ok("stats")["max_speed"] == global)
        let unlimited = try ok("set_speed", ["global": true, "max_speed": .null])
        #expect(unlimited["limit"] == 0 && unlimited["source"] == "max_speed", "\(unlimited.serializedString())")
        let changed = try ok("change", ["id": job, "headers": ["X-A": "1"]])
        #expect(changed["id"] == job && changed["headers"] == [["name": "X-A", "value": "1"]], "\(changed.serializedString())")
        #expect(try ok("status", ["id": job])["headers"] == changed["headers"])
        #expect(try ok("resume", ["id": job]) == ["count": 1, "ids": [job], "more": false, "requested": 0])
        #expect(try ok("status", ["id": job])["state"] == "queued")
        #expect(try ok("cancel", ["id": job]) == ["count": 1, "ids": [job], "more": false, "requested": 0])
        #expect(try ok("status", ["id": job])["state"] == "canceled")
        #expect(try ok("remove", ["id": job]) == ["count": 1, "ids": [job], "more": false, "removed": [job], "requested": 0])
        #expect(try reply("status", ["id": job])["error"]?["data"]?["code"] == "job_not_found")
        #expect(try ok("queue", ["paused": false]) == ["paused": false, "reason": .null])
        #expect(try ok("stats")["queue_paused"] == false)
        let cached = "\(origin.baseURL)/bytes/500"
        let got = try ok("get", ["url": .string(cached)])
        #expect(got["source"] == .string(pass == 1 ? "download" : "hit") && got["size"] == 500, "\(got.serializedString())")
        let path = try #require(got["path"]?.stringValue)
        try expectOriginBytes(at: path, count: 500)
        let entries = try ok("cache_list")["entries"]?.arrayValue ?? []
        #expect(entries.compactMap { $0["url"] } == [.string(cached)] && entries.first?["path"] == got["path"], "\(entries)")
        #expect(try ok("unpin", ["url": .string(cached)]) == ["cached": true])
        #expect(try ok("unpin", ["url": .string(cached + "?not-cached")]) == ["cached": false])
        return called
    }

    @Test func everyMethodOverRPCAndWebSocket() async throws {
        try await withOrigin { origin in
            let web = try WebDaemon()
            defer { web.daemon.stop() }
            var next: Int64 = 1
            let overRPC: Call = { method, params in
                next += 1
                let line = JSONValue.object(["jsonrpc": "2.0", "id": .int(next), "method": .string(method), "params": .object(params)])
                let reply = try JSONValue.parse(web.rpc(line.serializedString()).body)
                #expect(reply["id"] == .int(next), "\(method): \(reply.serializedString())")
                return reply
            }
            let socket = try RawWebSocket(port: web.port, token: try web.token)
            let overWebSocket: Call = { method, params in
                next += 1
                socket.send(
                    JSONValue.object(["jsonrpc": "2.0", "id": .int(next), "method": .string(method), "params": .object(params)])
                        .serializedString())
                let reply = try socket.receiveJSON()
                #expect(reply["id"] == .int(next), "\(method): \(reply.serializedString())")
                return reply
            }
            for (pass, call) in [overRPC, overWebSocket].enumerated() {
                let called = try Self.run(call, origin: origin, dir: web.daemon.downloadDir, pass: pass + 1)
                // All but the two that end or turn the connection: shutdown and subscribe have tests of their own.
                #expect(called.union(["shutdown", "subscribe"]) == Set(RPCMethod.allCases.map(\.rawValue)))
            }
        }
    }
}
