import DLRPC
import DLTestSupport
import Foundation
import Testing

/// The real aria2c (Debian's `aria2`) with its RPC on a free loopback port, a secret and a
/// temp folder, stopped with the test.
final class Aria2c {
    let port: Int
    let folder: String
    let secret = "differential-secret"
    private let process = Process()

    init() throws {
        port = try freePort()
        folder = NSTemporaryDirectory() + "dld-aria2c-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        guard let program = ["/usr/bin/aria2c", "/usr/local/bin/aria2c"].first(where: FileManager.default.isExecutableFile(atPath:)) else {
            throw HarnessError("aria2c is not installed (Debian's aria2; scripts/deps.sh installs it)")
        }
        process.executableURL = URL(fileURLWithPath: program)
        process.arguments = [
            "--enable-rpc", "--rpc-listen-port=\(port)", "--rpc-secret=\(secret)", "--rpc-listen-all=false", "--dir=\(folder)",
            "--no-conf=true", "--quiet=true", "--max-tries=1", "--retry-wait=0", "--split=1", "--auto-save-interval=0",
        ]
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        let deadline = Date().addingTimeInterval(10)
        while (try? RawConnection(port: port, timeout: 1)) == nil {
            guard Date() < deadline, process.isRunning else { throw HarnessError("aria2c did not listen on \(port)") }
            usleep(50_000)
        }
    }

    func stop() {
        // SIGKILL: on SIGTERM aria2c shuts down "gracefully", which can wait for ever on a
        // download whose origin is gone.
        if process.isRunning {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
        try? FileManager.default.removeItem(atPath: folder)
    }

    /// One call; the whole response.
    func call(_ method: String, _ params: [JSONValue], secret: String? = nil) throws -> JSONValue {
        let request: JSONValue = [
            "jsonrpc": "2.0", "id": "e2e", "method": .string(method),
            "params": .array([.string("token:" + (secret ?? self.secret))] + params),
        ]
        return try post(request.serialized())
    }

    func post(_ body: Data) throws -> JSONValue {
        let connection = try RawConnection(port: port)
        var message = Data(
            "POST /jsonrpc HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nContent-Length: \(body.count)\r\nConnection: close\r\n\r\n".utf8)
        message.append(body)
        connection.send(message)
        return try JSONValue.parse(try RawResponse(connection.receiveAll()).body)
    }
}

/// The same calls to aria2c and to dld, against one loopback origin: the answers agree in
/// shape (keys, types) and meaning (statuses as downloads move, errors for bad GIDs, bad
/// options and a wrong secret). Where dld differs on purpose (docs/aria2.md) it is not asked.
@Suite(.serialized) struct Aria2DifferentialTests {
    /// The keys a status object has in both, with their types.
    static let statusKeys = [
        "gid", "status", "totalLength", "completedLength", "uploadLength", "downloadSpeed", "uploadSpeed", "connections", "dir",
        "pieceLength", "numPieces",
    ]

    /// The type of each member, recursively: what "the same shape" means here.
    static func shape(_ value: JSONValue, only keys: [String]? = nil) -> JSONValue {
        switch value {
        case .object(let object):
            var out: [String: JSONValue] = [:]
            for (key, member) in object where keys?.contains(key) ?? true { out[key] = shape(member) }
            return .object(out)
        case .array(let list): return .array(list.prefix(1).map { shape($0) })
        default: return .string(value.typeName)
        }
    }

    @Test func sameAnswersAsAria2c() async throws {
        try await withOrigin { origin in
            let aria2c = try Aria2c()
            defer { aria2c.stop() }
            let web = try WebDaemon()
            defer { web.daemon.stop() }
            let both: [(name: String, call: (String, [JSONValue]) throws -> JSONValue)] = [
                ("aria2c", { try aria2c.call($0, $1) }), ("dld", { try web.aria2($0, $1) }),
            ]
            func each(_ method: String, _ params: [JSONValue] = []) throws -> [JSONValue] {
                try both.map { try $0.call(method, params) }
            }
            func same(_ answers: [JSONValue], _ what: String, sourceLocation: SourceLocation = #_sourceLocation) {
                #expect(
                    answers[0] == answers[1], "\(what): aria2c \(answers[0].serializedString()) dld \(answers[1].serializedString())",
                    sourceLocation: sourceLocation)
            }
            func wait(_ gids: [String], for status: String) throws -> [JSONValue] {
                let deadline = Date().addingTimeInterval(30)
                while true {
                    let answers = try zip(both, gids).map { try $0.0.call("aria2.tellStatus", [.string($0.1)])["result"] ?? .null }
                    if answers.allSatisfy({ $0["status"] == .string(status) }) { return answers }
                    guard Date() < deadline else { throw HarnessError("never \(status): \(answers.map { $0.serializedString() })") }
                    usleep(50_000)
                }
            }

            let version = try each("aria2.getVersion")
            same(version.map { Self.shape($0) }, "getVersion's shape")
            same(
                try each("system.listNotifications").map { $0["result"]?.arrayValue?.prefix(5).map { $0 } ?? [] }.map { .array($0) },
                "notifications")

            // A paused download: the same status, the same shape.
            let url = JSONValue.string("\(origin.baseURL)/bytes/250000")
            let added = try each("aria2.addUri", [[url], ["pause": "true"]])
            let gids = try added.map { try #require($0["result"]?.stringValue, "\($0.serializedString())") }
            #expect(gids.allSatisfy { $0.count == 16 && UInt64($0, radix: 16) != nil })
            let paused = try zip(both, gids).map { try $0.0.call("aria2.tellStatus", [.string($0.1)])["result"] ?? .null }
            same(paused.map { Self.shape($0, only: Self.statusKeys) }, "a paused status's shape")
            same(paused.map { $0["status"] ?? .null }, "paused")
            same(paused.map { $0["files"]?[0]?["uris"]?[0]?["uri"] ?? .null }, "the URI")
            same(paused.map { Self.shape($0["files"] ?? .null) }, "files' shape")
            let waiting = try zip(both, gids).map { try $0.0.call("aria2.tellWaiting", [0, 10, ["gid", "status"]])["result"] ?? .null }
            same(zip(waiting, gids).map { $0.0 == [["gid": .string($0.1), "status": "paused"]] ? true : $0.0 }, "tellWaiting")
            same(try each("aria2.tellActive", [["gid"]]), "tellActive")
            same(
                try zip(both, gids).map { try $0.0.call("aria2.pause", [.string($0.1)])["error"]?["message"] ?? .null }.map {
                    .string(
                        ($0.stringValue ?? "").replacingOccurrences(of: gids[0], with: "G").replacingOccurrences(of: gids[1], with: "G"))
                }, "pause of a paused download")

            // Unpaused: both download it to the end.
            same(
                try zip(both, gids).map { try $0.0.call("aria2.unpause", [.string($0.1)])["result"] == .string($0.1) ? true : false },
                "unpause")
            let complete = try wait(gids, for: "complete")
            same(complete.map { Self.shape($0, only: Self.statusKeys + ["errorCode", "errorMessage"]) }, "a complete status's shape")
            same(
                complete.map { [$0["completedLength"] ?? .null, $0["totalLength"] ?? .null, $0["errorCode"] ?? .null] },
                "complete's lengths")
            same(
                try zip(both, gids).map {
                    try $0.0.call("aria2.tellStopped", [0, 10, ["gid", "status"]])["result"] == [
                        ["gid": .string($0.1), "status": "complete"]
                    ] ? true : false
                }, "tellStopped")
            same(
                try zip(both, gids).map {
                    try $0.0.call("aria2.remove", [.string($0.1)])["error"]?["message"]?.stringValue?.replacingOccurrences(
                        of: $0.1, with: "G")
                }.map { $0.map { .string($0) } ?? .null }, "remove of a complete download")

            // The same URI again, its file there (a front-end's "restart"): both take it and
            // finish it under another name (aria2's auto-file-renaming, true by default).
            let again = try each("aria2.addUri", [[url]])
            let regids = try again.map { try #require($0["result"]?.stringValue, "\($0.serializedString())") }
            let redone = try wait(regids, for: "complete")
            same(
                zip(redone, complete).map { .bool($0.0["files"]?[0]?["path"] != $0.1["files"]?[0]?["path"]) },
                "a URI whose file exists, added again, finished under another name")

            // A 404: an error with aria2's code for it.
            let missing = try each("aria2.addUri", [[.string("\(origin.baseURL)/status/404")]])
            let failed = try wait(missing.compactMap { $0["result"]?.stringValue }, for: "error")
            same(failed.map { $0["errorCode"] ?? .null }, "the 404's errorCode")
            same(failed.map { Self.shape($0, only: Self.statusKeys + ["errorCode", "errorMessage"]) }, "an error status's shape")

            let stat = try each("aria2.getGlobalStat")
            same(stat.map { Self.shape($0) }, "getGlobalStat's shape")
            same(stat.map { [$0["result"]?["numStopped"] ?? .null, $0["result"]?["numActive"] ?? .null] }, "the counts")

            // Errors: the same code and message.
            same(try each("aria2.tellStatus", ["zz"]), "an invalid GID")
            same(try each("aria2.tellStatus", ["00000000000000ff"]), "a GID that is not there")
            same(try each("aria2.tellStatus"), "a missing param")
            same(try each("aria2.nope"), "an unknown method")
            same(
                try both.map {
                    try $0.name == "dld"
                        ? web.aria2("aria2.getVersion", secret: "nope") : aria2c.call("aria2.getVersion", [], secret: "nope")
                }, "a wrong secret")
            same(
                try [
                    aria2c.post(Data("{bad".utf8)),
                    JSONValue.parse(
                        web.rawRequest(
                            "POST", "/jsonrpc", body: Data("{bad".utf8), headers: [("Host", "127.0.0.1:\(web.port)")], port: web.port
                        ).body),
                ], "a parse error")
            same(try each("aria2.addUri", [[url], ["split": "x"]]).map { $0["error"]?["code"] ?? .null }, "a bad option's code")
            same(try each("aria2.addTorrent", ["AAAA"]).map { $0["error"]?["code"] ?? .null }, "addTorrent")
            func multicall(_ secret: String) -> String {
                let calls: JSONValue = [
                    ["methodName": "aria2.getGlobalStat", "params": [.string("token:" + secret)]],
                    ["methodName": "aria2.tellStatus", "params": [.string("token:" + secret), "zz"]],
                    ["methodName": "aria2.getGlobalStat", "params": ["token:nope"]],
                ]
                return #"{"jsonrpc":"2.0","id":1,"method":"system.multicall","params":[\#(calls.serializedString())]}"#
            }
            let multi = try [aria2c.post(Data(multicall(aria2c.secret).utf8)), web.aria2Raw(multicall(try web.token))]
            same(multi.map { Self.shape($0) }, "a multicall's shape")

            // Results removed.
            same(
                try zip(both, gids).map { try $0.0.call("aria2.removeDownloadResult", [.string($0.1)]) }.map { $0["result"] ?? .null },
                "removeDownloadResult")
            same(try each("aria2.purgeDownloadResult"), "purgeDownloadResult")
            same(try each("aria2.tellStopped", [0, 10]), "tellStopped after the purge")
        }
    }
}

extension WebDaemon {
    /// A body on POST /jsonrpc as it is.
    func aria2Raw(_ body: String) throws -> JSONValue {
        try JSONValue.parse(
            rawRequest("POST", "/jsonrpc", body: Data(body.utf8), headers: [("Host", "127.0.0.1:\(port)")], port: port).body)
    }
}
