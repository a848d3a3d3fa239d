import DLCore
@testable import DLDaemon
import DLRPC
import DLTestSupport
import Foundation
import Testing

/// aria2's JSON-RPC through the translation layer over a real engine, without a socket.
extension DispatcherFixture {
    func aria2(secret: String = Aria2Tests.secret) -> Aria2RPC {
        let config = DaemonConfig.defaults()
        return Aria2RPC(dispatcher: dispatcher, secret: secret, config: { config })
    }
}

extension Aria2RPC {
    /// One call with the secret; its `result`, or its `error` as the whole response.
    func call(_ method: String, _ params: [JSONValue] = [], token: String? = Aria2Tests.secret) async -> JSONValue {
        let all: [JSONValue] = (token.map { [.string("token:" + $0)] } ?? []) + params
        let request: JSONValue = ["jsonrpc": "2.0", "id": "t", "method": .string(method), "params": .array(all)]
        let reply = await handle(body: request.serialized())
        return (try? JSONValue.parse(reply.data)) ?? .null
    }

    func result(_ method: String, _ params: [JSONValue] = []) async throws -> JSONValue {
        let response = await call(method, params)
        return try #require(response["result"], "\(method): \(response.serializedString())")
    }

    func errorMessage(_ method: String, _ params: [JSONValue] = [], token: String? = Aria2Tests.secret) async -> String? {
        let response = await call(method, params, token: token)
        #expect(response["error"]?["code"] == 1, "\(method): \(response.serializedString())")
        return response["error"]?["message"]?.stringValue
    }
}

@Suite struct Aria2Tests {
    static let secret = "s3cret-for-tests"

    /// docs/aria2.md's table of methods names exactly the methods dld answers.
    @Test func theDocsListEveryMethod() throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let text = try String(contentsOf: root.appendingPathComponent("docs/aria2.md"), encoding: .utf8)
        let section = try #require(text.components(separatedBy: "\n## Methods\n").last?.components(separatedBy: "\n## ").first)
        var documented: [String] = []
        for line in section.split(separator: "\n") where line.hasPrefix("| `") {
            let name = line.dropFirst(3).prefix { $0 != "`" }
            documented.append(String(name))
            let verdict = line.split(separator: "|").dropFirst().first?.trimmingCharacters(in: .whitespaces)
            #expect(["complete", "partial", "refused"].contains(verdict ?? ""), "\(line)")
        }
        #expect(documented == Aria2Method.allCases.map(\.rawValue))
    }

    /// GIDs are the job id in 16 hex digits, both ways; what is not one is named as aria2 does.
    @Test func gids() throws {
        #expect(Aria2GID.gid(26) == "000000000000001a")
        #expect(try Aria2GID.job("000000000000001a") == 26)
        #expect(throws: Aria2Error("Invalid GID zz")) { try Aria2GID.job("zz") }
        #expect(throws: Aria2Error("Invalid GID 00000000000000001a")) { try Aria2GID.job("00000000000000001a") }
        #expect(throws: Aria2Error("GID 0000000000000000 is not found")) { try Aria2GID.job("0000000000000000") }
        #expect(throws: Aria2Error("GID ffffffffffffffff is not found")) { try Aria2GID.job("ffffffffffffffff") }
    }

    /// No secret, a wrong one: aria2's Unauthorized, marked for the transport's delay; the
    /// three system methods need none.
    @Test func theSecretIsRequired() async throws {
        try await DispatcherFixture.with { f in
            let aria2 = f.aria2()
            #expect(await aria2.errorMessage("aria2.getVersion", token: nil) == "Unauthorized")
            #expect(await aria2.errorMessage("aria2.getVersion", token: "wrong") == "Unauthorized")
            #expect(await aria2.call("aria2.tellActive", [.string("token:" + Self.secret)], token: nil)["result"] == [])
            let refused = await aria2.handle(body: Data(#"{"jsonrpc":"2.0","id":1,"method":"aria2.getVersion","params":["x"]}"#.utf8))
            #expect(refused.unauthorized && !refused.authorized)
            let listed = await aria2.call("system.listMethods", token: nil)
            #expect(listed["result"]?.arrayValue?.count == Aria2Method.allCases.count)
            #expect(await aria2.call("system.listNotifications", token: nil)["result"]?.arrayValue?.count == 5)
            // Inside a multicall each call carries its own.
            let calls: JSONValue = [
                ["methodName": "aria2.getVersion", "params": [.string("token:" + Self.secret)]],
                ["methodName": "aria2.getVersion", "params": ["token:nope"]],
            ]
            let results = try #require(await aria2.call("system.multicall", [calls], token: nil)["result"]?.arrayValue)
            #expect(results.count == 2)
            #expect(results[0][0]?["version"]?.stringValue == DLDVersion.current)
            #expect(results[1]["message"] == "Unauthorized")
        }
    }

    /// addUri makes a job (mirrors, options), and the tell* methods, tellStatus, getUris,
    /// getOption, pause/unpause/remove and the results follow it as aria2 shows downloads.
    @Test func downloadsMoveAsInAria2() async throws {
        try await DispatcherFixture.with { f in
            let aria2 = f.aria2()
            let options: JSONValue = [
                "pause": "true", "out": "a.bin", "max-download-limit": "1K", "split": "2", "header": ["X-A: b"],
                "checksum": .string("sha-256=" + String(repeating: "0", count: 64)),
            ]
            let gid = try #require(
                await aria2.result("aria2.addUri", [["http://127.0.0.1:9/a", "http://127.0.0.1:9/m", "http://127.0.0.1:9/a"], options])
                    .stringValue)
            #expect(gid.count == 16)
            let status = try await aria2.result("aria2.tellStatus", [.string(gid)])
            #expect(status["status"] == "paused")
            #expect(status["gid"] == .string(gid))
            #expect(status["totalLength"] == "0" && status["completedLength"] == "0" && status["connections"] == "0")
            #expect(status["files"]?[0]?["path"] == .string(f.downloads + "/a.bin"))
            #expect(status["dir"] == .string(f.downloads))
            let uris = try await aria2.result("aria2.getUris", [.string(gid)])
            #expect(uris.arrayValue?.compactMap { $0["uri"]?.stringValue } == ["http://127.0.0.1:9/a", "http://127.0.0.1:9/m"])
            let only = try await aria2.result("aria2.tellStatus", [.string(gid), ["gid", "status"]])
            #expect(only.objectValue?.keys.sorted() == ["gid", "status"])
            let option = try await aria2.result("aria2.getOption", [.string(gid)])
            #expect(option["max-download-limit"] == "1024" && option["out"] == "a.bin" && option["header"] == "X-A: b")
            #expect(option["checksum"] == .string("sha-256=" + String(repeating: "0", count: 64)))
            #expect(try await aria2.result("aria2.tellWaiting", [0, 10, ["gid"]]) == [["gid": .string(gid)]])
            #expect(try await aria2.result("aria2.tellActive") == [])
            #expect(await aria2.errorMessage("aria2.pause", [.string(gid)]) == "GID#\(gid) cannot be paused now")
            #expect(try await aria2.result("aria2.changeOption", [.string(gid), ["max-download-limit": "2048"]]) == "OK")
            #expect(try await aria2.result("aria2.getOption", [.string(gid)])["max-download-limit"] == "2048")
            #expect(await aria2.errorMessage("aria2.changeOption", [.string(gid), ["split": "3"]])?.contains("split") == true)
            #expect(await aria2.errorMessage("aria2.changePosition", [.string(gid), 0, "POS_SET"])?.contains("priority") == true)

            // A second one, paused by pauseAll; removed; results in tellStopped.
            let second = try #require(await aria2.result("aria2.addUri", [["http://127.0.0.1:9/b"], ["pause": "true"]]).stringValue)
            #expect(try await aria2.result("aria2.remove", [.string(second)]) == .string(second))
            #expect(try await aria2.result("aria2.tellStatus", [.string(second), ["status"]]) == ["status": "removed"])
            #expect(await aria2.errorMessage("aria2.remove", [.string(second)]) == "Active Download not found for GID#\(second)")
            #expect(await aria2.errorMessage("aria2.unpause", [.string(second)]) == "GID#\(second) cannot be unpaused now")
            let third = try #require(await aria2.result("aria2.addUri", [["http://127.0.0.1:9/c"], ["pause": "true"]]).stringValue)
            #expect(try await aria2.result("aria2.remove", [.string(third)]) == .string(third))
            // Negative offsets count from the end, backwards.
            #expect(try await aria2.result("aria2.tellStopped", [-1, 5, ["gid"]]) == [["gid": .string(third)], ["gid": .string(second)]])
            #expect(try await aria2.result("aria2.tellStopped", [-2, 5, ["gid"]]) == [["gid": .string(second)]])
            #expect(try await aria2.result("aria2.tellStopped", [1, 5, ["gid"]]) == [["gid": .string(third)]])
            #expect(try await aria2.result("aria2.tellStopped", [-3, 5, ["gid"]]) == [])
            let stat = try await aria2.result("aria2.getGlobalStat")
            #expect(stat["numWaiting"] == "1" && stat["numStopped"] == "2" && stat["numActive"] == "0")
            #expect(try await aria2.result("aria2.removeDownloadResult", [.string(second)]) == "OK")
            #expect(await aria2.errorMessage("aria2.tellStatus", [.string(second)]) == "GID \(second) is not found")
            #expect(try await aria2.result("aria2.purgeDownloadResult") == "OK")
            #expect(try await aria2.result("aria2.tellStopped", [0, 5]) == [])
            #expect(
                await aria2.errorMessage("aria2.removeDownloadResult", [.string(gid)]) == "Could not remove download result of GID#\(gid)")
            #expect(try await aria2.result("aria2.unpauseAll") == "OK")
            let resumed = try await aria2.result("aria2.tellStatus", [.string(gid), ["status"]])["status"]?.stringValue
            #expect(resumed != "paused")
        }
    }

    /// aria2's auto-file-renaming is true by default: a URI whose file exists already is added
    /// under a free name, not refused. webui-aria2's "restart" of a finished download removes
    /// its result, then adds its URI again with the options getOption gave (allow-overwrite
    /// false among them): refused, the download was gone. auto-file-renaming=false still
    /// refuses, allow-overwrite=true replaces.
    @Test func aTakenNameIsRenamedAsByAria2() async throws {
        try await DispatcherFixture.with { f in
            let aria2 = f.aria2()
            try Data("old".utf8).write(to: URL(fileURLWithPath: f.downloads + "/a.bin"))
            let restarted = try #require(
                await aria2.result("aria2.addUri", [["http://127.0.0.1:9/a.bin"], ["pause": "true", "allow-overwrite": "false"]])
                    .stringValue)
            let files = try await aria2.result("aria2.tellStatus", [.string(restarted), ["files"]])["files"]
            #expect(files?[0]?["path"] == .string(f.downloads + "/a (2).bin"), "\(files?.serializedString() ?? "")")
            let plain = try #require(await aria2.result("aria2.addUri", [["http://127.0.0.1:9/a.bin"], ["pause": "true"]]).stringValue)
            let next = try await aria2.result("aria2.tellStatus", [.string(plain), ["files"]])["files"]?[0]?["path"]
            #expect(next == .string(f.downloads + "/a (3).bin"), "a name another download will take is taken too")
            let refused = await aria2.errorMessage("aria2.addUri", [["http://127.0.0.1:9/a.bin"], ["auto-file-renaming": "false"]])
            #expect(refused?.contains("exists already") == true, "\(refused ?? "")")
            let replacing = try #require(
                await aria2.result("aria2.addUri", [["http://127.0.0.1:9/a.bin"], ["pause": "true", "allow-overwrite": "true"]])
                    .stringValue)
            let same = try await aria2.result("aria2.tellStatus", [.string(replacing), ["files"]])["files"]?[0]?["path"]
            #expect(same == .string(f.downloads + "/a.bin"))
        }
    }

    /// What dld does not do is refused by name, never pretended.
    @Test func refusals() async throws {
        try await DispatcherFixture.with { f in
            let aria2 = f.aria2()
            #expect(await aria2.errorMessage("aria2.addTorrent", ["AAAA"])?.contains("BitTorrent") == true)
            #expect(
                await aria2.errorMessage("aria2.addUri", [["http://127.0.0.1:9/a"], ["bt-max-peers": "3"]])?.contains("bt-max-peers")
                    == true)
            #expect(
                await aria2.errorMessage("aria2.addUri", [["http://127.0.0.1:9/a"], ["continue": "false"]])?.contains("continue") == true)
            #expect(await aria2.errorMessage("aria2.addUri", [["http://127.0.0.1:9/a"], ["split": "64"]])?.contains("16") == true)
            #expect(await aria2.errorMessage("aria2.addUri", [["http://127.0.0.1:9/a"], [:], 0])?.contains("position") == true)
            #expect(await aria2.errorMessage("aria2.addUri", [["magnet:?xt=urn:btih:00"]]) != nil)
            #expect(await aria2.errorMessage("aria2.addUri", []) == "The parameter at 0 is required but missing.")
            #expect(await aria2.errorMessage("aria2.addUri", ["http://x"]) == "The parameter at 0 has wrong type.")
            #expect(await aria2.errorMessage("aria2.tellStatus", ["zz"]) == "Invalid GID zz")
            #expect(await aria2.errorMessage("aria2.nope") == "No such method: aria2.nope")
            #expect(
                await aria2.errorMessage("aria2.changeGlobalOption", [["max-concurrent-downloads": "9"]])?.contains("max_active") == true)
            let changed = try await aria2.result("aria2.changeGlobalOption", [["max-overall-download-limit": "1M"]])
            #expect(changed == "OK")
            #expect(try await aria2.result("aria2.getGlobalOption")["max-overall-download-limit"] == "1048576")
        }
    }

    /// Framing as aria2: parse errors, requests without id, batches, the GET form.
    @Test func framing() async throws {
        try await DispatcherFixture.with { f in
            let aria2 = f.aria2()
            func send(_ text: String) async -> String { String(decoding: await aria2.handle(body: Data(text.utf8)).data, as: UTF8.self) }
            #expect(await send("{bad") == #"{"error":{"code":-32700,"message":"Parse error."},"id":null,"jsonrpc":"2.0"}"#)
            #expect(await send(#"{"id":1}"#) == #"{"error":{"code":-32600,"message":"Invalid Request."},"id":1,"jsonrpc":"2.0"}"#)
            #expect(
                await send(#"{"jsonrpc":"2.0","method":"system.listNotifications"}"#)
                    == #"{"error":{"code":-32600,"message":"Invalid Request."},"id":null,"jsonrpc":"2.0"}"#)
            #expect(await send("[]") == "[]")
            let batch = try JSONValue.parse(
                Data(await send(#"[{"jsonrpc":"2.0","id":1,"method":"system.listNotifications"},7]"#).utf8))
            #expect(batch[0]?["id"] == 1 && batch[1]?["error"]?["code"] == -32600)
            let many =
                "[" + Array(repeating: #"{"jsonrpc":"2.0","id":1,"method":"system.listMethods"}"#, count: 1001).joined(separator: ",") + "]"
            #expect(try JSONValue.parse(Data(await send(many).utf8))["error"]?["code"] == -32600)
            let params = Data(#"["token:\#(Self.secret)"]"#.utf8).base64EncodedString()
            let viaGet = await aria2.handle(query: [
                URLQueryItem(name: "method", value: "aria2.getGlobalStat"), URLQueryItem(name: "id", value: "g"),
                URLQueryItem(name: "params", value: params),
            ])
            let answer = try JSONValue.parse(viaGet.data)
            #expect(answer["id"] == "g" && answer["result"]?["numActive"] == "0")
        }
    }

    /// Hostile bodies: every answer is aria2's shape (a result or an error with a code and a
    /// message, or an array of them), whatever the mutation. The seed is in every failure.
    @Test func hostileBodies() async throws {
        try await DispatcherFixture.with { f in
            let aria2 = f.aria2()
            let token = "\"token:\(Self.secret)\""
            let seeds = [
                #"{"jsonrpc":"2.0","id":"q","method":"aria2.addUri","params":[\#(token),["http://127.0.0.1:9/x"],{"pause":"true","dir":"/nonexistent"}]}"#,
                #"{"jsonrpc":"2.0","id":1,"method":"aria2.tellStatus","params":[\#(token),"0000000000000001",["gid","status"]]}"#,
                #"{"jsonrpc":"2.0","id":2,"method":"aria2.tellStopped","params":[\#(token),-1,1000]}"#,
                #"{"jsonrpc":"2.0","id":3,"method":"system.multicall","params":[[{"methodName":"aria2.getGlobalStat","params":[\#(token)]},{"methodName":"aria2.pause","params":[\#(token),"0000000000000001"]}]]}"#,
                #"[{"jsonrpc":"2.0","id":4,"method":"aria2.changeOption","params":[\#(token),"0000000000000001",{"max-download-limit":"1M"}]},{"jsonrpc":"2.0","id":5,"method":"aria2.getVersion"}]"#,
                #"{"jsonrpc":"2.0","id":6,"method":"aria2.changeUri","params":[\#(token),"0000000000000001",1,[],["http://127.0.0.1:9/y"]]}"#,
            ]
            let interesting: [[UInt8]] = [
                Array("null".utf8), Array("1e400".utf8), Array("-1".utf8), Array("99999999999999999999".utf8), Array("[".utf8),
                Array("{".utf8), Array(String(repeating: "[", count: 600).utf8), Array("\"token:\"".utf8), [0xFF], Array("{}".utf8),
            ]
            let seed = SplitMix64.testSeed()
            var rng = SplitMix64(state: seed)
            for round in 0..<3000 {
                let input = Array(seeds[Int.random(in: 0..<seeds.count, using: &rng)].utf8)
                let bytes = Mutator.mutate(input, interesting: interesting, maxRepeat: 30, using: &rng)
                let reply = await aria2.handle(body: Data(bytes))
                guard let answer = try? JSONValue.parse(reply.data) else {
                    Issue.record("round \(round), seed \(seed): not JSON: \(String(decoding: reply.data.prefix(200), as: UTF8.self))")
                    return
                }
                for response in answer.arrayValue ?? [answer] {
                    let error = response["error"]
                    let fine =
                        response["jsonrpc"] == "2.0" && response.objectValue?.keys.contains("id") == true
                        && (response["result"] != nil || (error?["code"]?.int64Value != nil && error?["message"]?.stringValue != nil))
                    if !fine {
                        Issue.record("round \(round), seed \(seed): \(response.serializedString().prefix(300))")
                        return
                    }
                }
                #expect(!reply.shutdown)
            }
        }
    }

    /// http_origins: only the origins listed pass the Origin check and get CORS headers; the
    /// key takes origins as browsers write them and nothing else.
    @Test func crossOriginPolicy() {
        let policy = HostPolicy(
            address: HTTPAddress(host: "127.0.0.1", port: 6802), tls: false, extraHosts: [],
            origins: ["http://localhost:8080", "moz-extension://0f1e2d3c-aaaa-bbbb-cccc-000000000000"])
        #expect(policy.allows(origin: "http://localhost:8080", host: "127.0.0.1:6802"))
        #expect(policy.allows(origin: "MOZ-EXTENSION://0f1e2d3c-aaaa-bbbb-cccc-000000000000", host: "127.0.0.1:6802"))
        #expect(!policy.allows(origin: "http://localhost:8081", host: "127.0.0.1:6802"))
        #expect(!policy.allows(origin: "null", host: "127.0.0.1:6802"))
        #expect(policy.corsOrigin("http://localhost:8080") == "http://localhost:8080")
        #expect(policy.corsOrigin("http://127.0.0.1:6802") == nil)
        #expect(policy.corsOrigin(nil) == nil)
        #expect(ConfigValue.origin("chrome-extension://abcdefghijklmnop") == "chrome-extension://abcdefghijklmnop")
        #expect(ConfigValue.origin("HTTP://Localhost:8080") == "http://localhost:8080")
        for bad in ["*", "null", "http://x/path", "file://", "ftp://host", "http://a b", "localhost:8080"] {
            #expect(ConfigValue.origin(bad) == nil, "\(bad)")
        }
    }

    /// addMetalink: a document of two files becomes a group whose members are downloads of
    /// their own, as aria2 shows a Metalink's files; out is refused, a bad document too.
    @Test func addMetalink() async throws {
        try await DispatcherFixture.with { f in
            let aria2 = f.aria2()
            let document = MetalinkFixture.document(
                #"<file name="a.bin"><url>http://127.0.0.1:9/a.bin</url></file>"#
                    + #"<file name="b.bin"><url>http://127.0.0.1:9/b.bin</url><url>http://127.0.0.1:9/b2.bin</url></file>"#)
            let encoded = JSONValue.string(Data(document.utf8).base64EncodedString())
            let gids = try #require(await aria2.result("aria2.addMetalink", [encoded, ["pause": "true"]]).arrayValue)
            #expect(gids.count == 2)
            var names: [String] = []
            for gid in gids {
                let status = try await aria2.result("aria2.tellStatus", [gid])
                #expect(status["status"] == "paused")
                names.append(status["files"]?[0]?["path"]?.stringValue?.split(separator: "/").last.map(String.init) ?? "")
            }
            #expect(names == ["a.bin", "b.bin"])
            let uris = try await aria2.result("aria2.getUris", [gids[1]])
            #expect(uris.arrayValue?.count == 2)
            #expect(await aria2.errorMessage("aria2.addMetalink", [encoded, ["out": "x"]])?.contains("out") == true)
            #expect(await aria2.errorMessage("aria2.addMetalink", ["not base64 !"]) != nil)
            let hostile = Data(MetalinkFixture.document(#"<file name="../x"><url>http://h/x</url></file>"#).utf8).base64EncodedString()
            #expect(await aria2.errorMessage("aria2.addMetalink", [.string(hostile)]) != nil)
        }
    }
}
