import DLRPC
import DLTestSupport
import Foundation
import Testing

extension WebDaemon {
    /// One aria2 call on POST /jsonrpc, as aria2's clients send it: no Authorization header,
    /// the secret as the first param; the whole response.
    func aria2(
        _ method: String, _ params: [JSONValue] = [], secret: String? = nil, port: Int? = nil, headers: [(String, String)] = []
    ) throws -> JSONValue {
        let all: [JSONValue] = [.string("token:" + (try secret ?? token))] + params
        let request: JSONValue = ["jsonrpc": "2.0", "id": "e2e", "method": .string(method), "params": .array(all)]
        let response = try rawRequest(
            "POST", "/jsonrpc", body: request.serialized(), headers: headers + [("Host", "127.0.0.1:\(port ?? self.port)")],
            port: port ?? self.port)
        guard response.status == 200 else { throw HarnessError("HTTP \(response.status): \(response.text)") }
        return try JSONValue.parse(response.body)
    }

    /// A request on `port` without the dld token.
    func rawRequest(_ method: String, _ path: String, body: Data = Data(), headers: [(String, String)], port: Int) throws -> RawResponse {
        let connection = try RawConnection(port: port)
        var message = Data("\(method) \(path) HTTP/1.1\r\n".utf8)
        for (name, value) in headers + [("Content-Length", "\(body.count)"), ("Connection", "close")] {
            message.append(Data("\(name): \(value)\r\n".utf8))
        }
        message.append(Data("\r\n".utf8))
        message.append(body)
        connection.send(message)
        return try RawResponse(connection.receiveAll())
    }

    /// Polls tellStatus until `status` is one of `wanted`.
    func aria2Wait(_ gid: String, for wanted: Set<String>, timeout: TimeInterval = 30) throws -> JSONValue {
        let deadline = Date().addingTimeInterval(timeout)
        while true {
            let status = try aria2("aria2.tellStatus", [.string(gid)])["result"] ?? .null
            if let state = status["status"]?.stringValue, wanted.contains(state) { return status }
            guard Date() < deadline else { throw HarnessError("\(gid) never reached \(wanted): \(status.serializedString())") }
            usleep(50_000)
        }
    }
}

/// aria2's JSON-RPC served by the real dld: /jsonrpc over HTTP and WebSocket, on the HTTP
/// listener and on aria2_listen, with the listener's rules.
@Suite(.serialized) struct Aria2EndToEndTests {
    /// A download from a loopback origin through POST /jsonrpc, followed to `complete`; the
    /// GET form; the secret; the Host and Origin checks of the listener.
    @Test func jsonrpcOverHTTP() async throws {
        try await withOrigin { origin in
            let web = try WebDaemon()
            defer { web.daemon.stop() }
            let added = try web.aria2("aria2.addUri", [[.string("\(origin.baseURL)/bytes/300000")], ["out": "a.bin"]])
            let gid = try #require(added["result"]?.stringValue, "\(added.serializedString())")
            let done = try web.aria2Wait(gid, for: ["complete", "error"])
            #expect(done["status"] == "complete" && done["completedLength"] == "300000" && done["totalLength"] == "300000")
            try expectOriginBytes(at: web.daemon.downloadDir + "/a.bin", count: 300000)
            // The same job through dld's own protocol.
            #expect(try web.daemon.job(Int64(gid, radix: 16) ?? 0)["state"] == "completed")

            let params = Data(#"["token:\#(try web.token)",0,10,["gid","status"]]"#.utf8).base64EncodedString()
            let query =
                "/jsonrpc?method=aria2.tellStopped&id=7&params="
                + (params.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? "")
            let viaGet = try web.rawRequest("GET", query, headers: [("Host", "127.0.0.1:\(web.port)")], port: web.port)
            #expect(try JSONValue.parse(viaGet.body)["result"] == [["gid": .string(gid), "status": "complete"]], "\(viaGet.text)")

            let wrong = try web.aria2("aria2.getGlobalStat", secret: "wrong")
            #expect(wrong["error"] == ["code": 1, "message": "Unauthorized"])
            #expect(web.daemon.log.contains("aria2 call with a wrong secret refused"))
            let version = JSONValue.array([.string("token:" + (try web.token))]).serialized()
            let body = #"{"jsonrpc":"2.0","id":1,"method":"aria2.getVersion","params":\#(String(decoding: version, as: UTF8.self))}"#
            let rebinding = try web.rawRequest(
                "POST", "/jsonrpc", body: Data(body.utf8), headers: [("Host", "evil.example:\(web.port)")], port: web.port)
            #expect(rebinding.status == 421)
            let crossSite = try web.rawRequest(
                "POST", "/jsonrpc", body: Data(body.utf8),
                headers: [("Host", "127.0.0.1:\(web.port)"), ("Origin", "http://evil.example")], port: web.port)
            #expect(crossSite.status == 403)
            // The other paths still want the token.
            #expect(try web.rawRequest("GET", "/openrpc.json", headers: [("Host", "127.0.0.1:\(web.port)")], port: web.port).status == 401)
        }
    }

    /// A WebSocket on /jsonrpc (no Authorization header) answers calls and, after a call with
    /// the secret, pushes aria2's notifications of a download as it starts and completes.
    @Test func notificationsOverWebSocket() async throws {
        try await withOrigin { origin in
            let web = try WebDaemon()
            defer { web.daemon.stop() }
            let socket = try RawWebSocket(port: web.port, token: nil, path: "/jsonrpc")
            let token = JSONValue.string("token:" + (try web.token))
            socket.send(#"{"jsonrpc":"2.0","id":"v","method":"aria2.getVersion","params":[\#(token.serializedString())]}"#)
            #expect(try socket.receiveJSON()["result"]?["version"] != nil)
            socket.send(
                #"{"jsonrpc":"2.0","id":"a","method":"aria2.addUri","params":[\#(token.serializedString()),["\#(origin.baseURL)/bytes/200000?rate=400000"]]}"#
            )
            var gid: String?
            var seen: [String] = []
            while !seen.contains("aria2.onDownloadComplete") {
                let message = try socket.receiveJSON()
                if message["id"] == "a" {
                    gid = message["result"]?.stringValue
                    continue
                }
                guard let method = message["method"]?.stringValue else { continue }
                #expect(message["params"]?[0]?["gid"]?.stringValue?.count == 16)
                if message["params"]?[0]?["gid"]?.stringValue == gid || gid == nil { seen.append(method) }
            }
            #expect(gid != nil)
            #expect(seen == ["aria2.onDownloadStart", "aria2.onDownloadComplete"])
            // A bad message is answered in aria2's shape and the connection stays.
            socket.send("{nope")
            #expect(try socket.receiveJSON()["error"]?["code"] == -32700)
        }
    }

    /// aria2_listen: a listener of its own that serves /jsonrpc only, with the same secret.
    @Test func aria2Listen() throws {
        let port = try freePort()
        let web = try WebDaemon(config: "aria2_listen = \"127.0.0.1:\(port)\"\naria2_secret = \"a-secret-of-ours\"\n")
        defer { web.daemon.stop() }
        let stat = try web.aria2("aria2.getGlobalStat", secret: "a-secret-of-ours", port: port)
        #expect(stat["result"]?["numActive"] == "0", "\(stat.serializedString())")
        #expect(try web.aria2("aria2.getGlobalStat", secret: "a-secret-of-ours")["result"] != nil)
        #expect(try web.aria2("aria2.getGlobalStat", port: port)["error"]?["message"] == "Unauthorized")
        let host = [("Host", "127.0.0.1:\(port)"), ("Authorization", "Bearer \(try web.token)")]
        #expect(try web.rawRequest("GET", "/", headers: host, port: port).status == 404)
        #expect(
            try web.rawRequest("POST", "/rpc", body: Data("{}".utf8), headers: host + [("Content-Type", "application/json")], port: port)
                .status == 404)
        #expect(try web.rawRequest("GET", "/jsonrpc", headers: [("Host", "evil.example:\(port)")], port: port).status == 421)
        _ = try RawWebSocket(port: port, token: nil, path: "/jsonrpc")
        #expect(throws: HarnessError.self) { try RawWebSocket(port: port, token: try web.token, path: "/ws") }
    }

    /// http_origins: a listed origin's preflight gets CORS headers and its calls pass; another
    /// origin's gets none and is refused; DNS rebinding is still refused by the Host check.
    @Test func crossOriginAccess() throws {
        let extensionOrigin = "chrome-extension://abcdefghijklmnopabcdefghijklmnop"
        let web = try WebDaemon(config: "http_origins = [\"http://localhost:8080\", \"\(extensionOrigin)\"]\n")
        defer { web.daemon.stop() }
        let host = ("Host", "127.0.0.1:\(web.port)")
        func preflight(_ origin: String, _ path: String) throws -> RawResponse {
            try web.rawRequest(
                "OPTIONS", path,
                headers: [
                    host, ("Origin", origin), ("Access-Control-Request-Method", "POST"),
                    ("Access-Control-Request-Headers", "authorization, content-type"),
                ], port: web.port)
        }
        for path in ["/rpc", "/jsonrpc", "/ws"] {
            let foreign = try preflight("http://evil.example", path)
            #expect(foreign.status != 204 && foreign.header("access-control-allow-origin") == nil, "\(path)")
            let allowed = try preflight(extensionOrigin, path)
            #expect(allowed.status == 204, "\(path)")
            #expect(allowed.header("access-control-allow-origin") == extensionOrigin)
            #expect(allowed.header("access-control-allow-headers")?.contains("Authorization") == true)
        }
        #expect(try preflight("http://localhost:8080", "/jsonrpc").header("access-control-allow-origin") == "http://localhost:8080")
        let version = Data(#"{"jsonrpc":"2.0","id":1,"method":"version"}"#.utf8)
        let bearer = ("Authorization", "Bearer \(try web.token)")
        let json = ("Content-Type", "application/json")
        let call = try web.rawRequest(
            "POST", "/rpc", body: version, headers: [host, bearer, json, ("Origin", extensionOrigin)], port: web.port)
        #expect(call.status == 200 && call.header("access-control-allow-origin") == extensionOrigin)
        #expect(call.header("access-control-allow-credentials") == nil)
        let aria2 = try web.aria2("aria2.getGlobalStat", headers: [("Origin", "http://localhost:8080")])
        #expect(aria2["result"]?["numActive"] == "0")
        let refused = try web.rawRequest(
            "POST", "/rpc", body: version, headers: [host, bearer, json, ("Origin", "http://evil.example")], port: web.port)
        #expect(refused.status == 403 && refused.header("access-control-allow-origin") == nil)
        // Without the token an allowed origin is refused too (and can read why).
        let noToken = try web.rawRequest("POST", "/rpc", body: version, headers: [host, json, ("Origin", extensionOrigin)], port: web.port)
        #expect(noToken.status == 401)
        // DNS rebinding: a page whose name points here names itself in Host.
        let rebinding = try web.rawRequest(
            "POST", "/rpc", body: version, headers: [("Host", "evil.example:\(web.port)"), bearer, json, ("Origin", extensionOrigin)],
            port: web.port)
        #expect(rebinding.status == 421 && rebinding.header("access-control-allow-origin") == nil)
        _ = try RawWebSocket(port: web.port, token: nil, origin: extensionOrigin, path: "/jsonrpc")
    }

    /// aria2p, a client library written for aria2 (from PyPI, scripts/deps.sh), drives dld
    /// through /jsonrpc: scripts/check-aria2p.py adds, follows, pauses, resumes, lists and purges
    /// downloads, reads the stats, and is refused with a wrong secret.
    @Test func aria2pDrivesDld() async throws {
        try await withOrigin { origin in
            let web = try WebDaemon()
            defer { web.daemon.stop() }
            let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
                .deletingLastPathComponent()
            let script = repository.appendingPathComponent("scripts/check-aria2p.py").path
            let run = try runProgram("/usr/bin/env", ["python3", script, "\(web.port)", try web.token, origin.baseURL])
            #expect(run.status == 0 && run.stdout.contains("ok"), "\(run.stdout)\(run.stderr)")
        }
    }

    /// Hostile input on /jsonrpc gets aria2's error shapes or a close, with /rpc's limits, and
    /// dld answers afterwards: a body over max_line_bytes, deep nesting, wrong types, a batch
    /// and a multicall of too many calls, a WebSocket message too large and a flood.
    @Test func hostileInputOnJsonrpc() throws {
        let web = try WebDaemon(config: "max_line_bytes = 65536\n")
        defer { web.daemon.stop() }
        let host = ("Host", "127.0.0.1:\(web.port)")
        let big = try web.rawRequest(
            "POST", "/jsonrpc", body: Data(String(repeating: " ", count: 70000).utf8), headers: [host], port: web.port)
        #expect(big.status == 413)
        let deep = String(repeating: "[", count: 5000) + String(repeating: "]", count: 5000)
        #expect(try web.aria2Raw(deep)["error"]?["code"] == -32700)
        let token = JSONValue.string("token:" + (try web.token)).serializedString()
        let mistyped = try web.aria2Raw(#"{"jsonrpc":"2.0","id":1,"method":"aria2.tellWaiting","params":[\#(token),{},[]]}"#)
        #expect(mistyped["error"]?["code"] == 1 && mistyped["error"]?["message"] == "The parameter at 0 has wrong type.")
        let oneCall = #"{"methodName":"system.listMethods"}"#
        let calls = "[" + Array(repeating: oneCall, count: 1001).joined(separator: ",") + "]"
        let multicall = try web.aria2Raw(#"{"jsonrpc":"2.0","id":2,"method":"system.multicall","params":[\#(calls)]}"#)
        #expect(multicall["error"]?["code"] == 1, "\(multicall.serializedString().prefix(300))")
        let request = #"{"jsonrpc":"2.0","id":3,"method":"system.listNotifications"}"#
        let batch = try web.aria2Raw("[" + Array(repeating: request, count: 1001).joined(separator: ",") + "]")
        #expect(batch["error"]?["code"] == -32600)

        let large = try RawWebSocket(port: web.port, token: nil, path: "/jsonrpc")
        large.send(String(repeating: " ", count: 70000))
        #expect(try large.closeCode() == 1009)
        let flood = try RawWebSocket(port: web.port, token: nil, path: "/jsonrpc")
        // Calls with a wrong secret are answered slowly: they pile up past the 64 allowed.
        let wrong = #"{"jsonrpc":"2.0","id":4,"method":"aria2.getVersion","params":["token:wrong"]}"#
        for _ in 0..<80 { flood.send(wrong) }
        #expect(try flood.closeCode() == 1008)
        #expect(try web.aria2("aria2.getGlobalStat")["result"] != nil)
        #expect(try web.daemon.call("version")["protocol"] != nil)
    }
}
