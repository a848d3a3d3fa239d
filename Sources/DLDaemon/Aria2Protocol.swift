import DLCore
import DLRPC
import Foundation

/// The methods of aria2's JSON-RPC that dld answers (docs/aria2.md lists each with what dld
/// does with it; a test checks that page against this table). Each raw value is the name on
/// the wire.
enum Aria2Method: String, CaseIterable, Sendable {
    case addUri = "aria2.addUri"
    case addTorrent = "aria2.addTorrent"
    case getPeers = "aria2.getPeers"
    case addMetalink = "aria2.addMetalink"
    case remove = "aria2.remove"
    case pause = "aria2.pause"
    case forcePause = "aria2.forcePause"
    case pauseAll = "aria2.pauseAll"
    case forcePauseAll = "aria2.forcePauseAll"
    case unpause = "aria2.unpause"
    case unpauseAll = "aria2.unpauseAll"
    case forceRemove = "aria2.forceRemove"
    case changePosition = "aria2.changePosition"
    case tellStatus = "aria2.tellStatus"
    case getUris = "aria2.getUris"
    case getFiles = "aria2.getFiles"
    case getServers = "aria2.getServers"
    case tellActive = "aria2.tellActive"
    case tellWaiting = "aria2.tellWaiting"
    case tellStopped = "aria2.tellStopped"
    case getOption = "aria2.getOption"
    case changeUri = "aria2.changeUri"
    case changeOption = "aria2.changeOption"
    case getGlobalOption = "aria2.getGlobalOption"
    case changeGlobalOption = "aria2.changeGlobalOption"
    case purgeDownloadResult = "aria2.purgeDownloadResult"
    case removeDownloadResult = "aria2.removeDownloadResult"
    case getVersion = "aria2.getVersion"
    case getSessionInfo = "aria2.getSessionInfo"
    case shutdown = "aria2.shutdown"
    case forceShutdown = "aria2.forceShutdown"
    case getGlobalStat = "aria2.getGlobalStat"
    case saveSession = "aria2.saveSession"
    case multicall = "system.multicall"
    case listMethods = "system.listMethods"
    case listNotifications = "system.listNotifications"

    /// The methods aria2 answers without the secret.
    var needsToken: Bool {
        switch self {
        case .multicall, .listMethods, .listNotifications: false
        default: true
        }
    }

    /// The notifications a WebSocket client receives (`system.listNotifications`).
    static let notifications = [
        "aria2.onDownloadStart", "aria2.onDownloadPause", "aria2.onDownloadStop", "aria2.onDownloadComplete",
        "aria2.onDownloadError",
    ]
}

/// An error in aria2's shape: `{"code": 1, "message": …}` for every refused call (aria2 uses 1
/// for all of them), the JSON-RPC codes for framing.
struct Aria2Error: Error, Sendable, Equatable {
    var code: Int64
    var message: String

    init(_ message: String, code: Int64 = 1) {
        self.code = code
        self.message = message
    }

    static let unauthorized = Aria2Error("Unauthorized")
    static let parse = Aria2Error("Parse error.", code: -32700)
    static let invalidRequest = Aria2Error("Invalid Request.", code: -32600)

    var json: JSONValue { ["code": .int(code), "message": .string(message)] }
}

/// aria2's GIDs for dld's jobs: the job id as 16 lowercase hex digits (job 26 is
/// `000000000000001a`). Deterministic, so a GID stays the same across restarts and on every
/// daemon of a fleet; a group's members are downloads of their own, as aria2 shows the files of
/// a Metalink.
enum Aria2GID {
    static func gid(_ id: JobID) -> String {
        let hex = String(UInt64(bitPattern: id), radix: 16)
        return String(repeating: "0", count: max(0, 16 - hex.count)) + hex
    }

    /// The job a GID names; aria2's messages for a GID that is not one, or names nothing.
    static func job(_ text: String) throws(Aria2Error) -> JobID {
        guard text.utf8.count == 16, let value = UInt64(text, radix: 16) else {
            throw Aria2Error("Invalid GID \(text.prefix(100))")
        }
        guard value >= 1, value <= UInt64(Int64.max) else { throw Aria2Error("GID \(text) is not found") }
        return Int64(value)
    }
}

/// The positional params of one aria2 call, after the token: aria2's messages for a missing or
/// mistyped one.
struct Aria2Params {
    let values: [JSONValue]

    func has(_ index: Int) -> Bool { index < values.count && !values[index].isNull }

    func required(_ index: Int) throws(Aria2Error) -> JSONValue {
        guard has(index) else { throw Aria2Error("The parameter at \(index) is required but missing.") }
        return values[index]
    }

    func string(_ index: Int) throws(Aria2Error) -> String {
        guard let text = try required(index).stringValue else { throw Aria2Error("The parameter at \(index) has wrong type.") }
        return text
    }

    func gid(_ index: Int) throws(Aria2Error) -> JobID { try Aria2GID.job(try string(index)) }

    /// An integer; aria2 also takes one written as a string.
    func int(_ index: Int) throws(Aria2Error) -> Int64 {
        let value = try required(index)
        if let number = value.int64Value { return number }
        if let text = value.stringValue, let number = Int64(text) { return number }
        throw Aria2Error("The parameter at \(index) has wrong type.")
    }

    func array(_ index: Int) throws(Aria2Error) -> [JSONValue] {
        guard let list = try required(index).arrayValue else { throw Aria2Error("The parameter at \(index) has wrong type.") }
        return list
    }

    func object(_ index: Int) throws(Aria2Error) -> [String: JSONValue]? {
        guard has(index) else { return nil }
        guard let object = values[index].objectValue else { throw Aria2Error("The parameter at \(index) has wrong type.") }
        return object
    }

    /// `keys` of tellStatus and the tell* methods: which members of a status to return.
    func keys(_ index: Int) throws(Aria2Error) -> Set<String>? {
        guard has(index) else { return nil }
        let value = values[index]
        if let one = value.stringValue { return [one] }
        guard let list = value.arrayValue else { throw Aria2Error("The parameter at \(index) has wrong type.") }
        var keys: Set<String> = []
        for element in list {
            guard let key = element.stringValue else { throw Aria2Error("The parameter at \(index) has wrong type.") }
            keys.insert(key)
        }
        return keys.isEmpty ? nil : keys
    }
}

/// aria2's options, as dld reads them: those that become a param of `enqueue`, those whose
/// value is what dld does anyway, and the rest refused by name (docs/aria2.md, "Options").
enum Aria2Options {
    /// Options of addUri and addMetalink that dld applies.
    static let applied: [String] = [
        "dir", "out", "header", "referer", "user-agent", "max-download-limit", "split", "checksum", "pause", "allow-overwrite",
        "auto-file-renaming",
    ]
    /// Options accepted only with the value that says what dld always does.
    static let fixed: [String: String] = [
        "continue": "true", "always-resume": "true", "check-certificate": "true", "follow-metalink": "true",
        "http-accept-gzip": "false",
    ]

    /// The params of an `enqueue` of `url` (and `mirrors`) with these options.
    static func enqueueParams(_ options: [String: JSONValue], metalink: Bool) throws(Aria2Error) -> [String: JSONValue] {
        var params: [String: JSONValue] = [:]
        var headers: [String: JSONValue] = [:]
        for (name, value) in options.sorted(by: { $0.key < $1.key }) {
            if name == "header" {
                let lines: [JSONValue] = value.arrayValue ?? [value]
                for line in lines {
                    guard let text = line.stringValue, let colon = text.firstIndex(of: ":") else {
                        throw Aria2Error("option header: each header is \"Name: value\"")
                    }
                    headers[String(text[..<colon]).trimmingCharacters(in: .whitespaces)] = .string(
                        String(text[text.index(after: colon)...]).trimmingCharacters(in: .whitespaces))
                }
                continue
            }
            guard let text = value.stringValue ?? value.int64Value.map(String.init) ?? value.boolValue.map(String.init) else {
                throw Aria2Error("option \(name.prefix(100)): the value must be a string")
            }
            if let expected = fixed[name] {
                guard text == expected else {
                    throw Aria2Error(
                        "option \(name)=\(text.prefix(100)) is not supported by dld, which always behaves as \(name)=\(expected)")
                }
                continue
            }
            switch name {
            case "dir": params["dir"] = .string(text)
            case "out" where metalink: throw Aria2Error("option out is not used with a Metalink: its files are named by the document")
            case "out": params["name"] = .string(text)
            case "referer": headers["Referer"] = .string(text)
            case "user-agent": headers["User-Agent"] = .string(text)
            case "max-download-limit": params["max_speed"] = .int(try speed(text, option: name))
            case "split":
                guard let count = Int64(text), (1...16).contains(count) else {
                    throw Aria2Error("option split=\(text.prefix(100)): dld fetches 1 to 16 ranges of a file at once")
                }
                params["segments"] = .int(count)
            case "checksum":
                // aria2 writes `sha-256=HEX`, dld `sha256:HEX`.
                guard let equals = text.firstIndex(of: "=") else { throw Aria2Error("option checksum: TYPE=DIGEST, e.g. sha-256=…") }
                params["checksum"] = .string(String(text[..<equals]) + ":" + String(text[text.index(after: equals)...]))
            case "pause": params["paused"] = .bool(try bool(text, option: name))
            case "allow-overwrite": params["overwrite"] = .bool(try bool(text, option: name))
            case "auto-file-renaming" where metalink:
                guard try bool(text, option: name) == false else {
                    throw Aria2Error("option auto-file-renaming=true is not supported with a Metalink: its files are named by the document")
                }
            case "auto-file-renaming": params["on_exists"] = .string(try bool(text, option: name) ? "rename" : "error")
            default:
                throw Aria2Error("option \(name.prefix(100)) is not supported by dld (docs/aria2.md lists the options it takes)")
            }
        }
        if !headers.isEmpty { params["headers"] = .object(headers) }
        return params
    }

    static func bool(_ text: String, option: String) throws(Aria2Error) -> Bool {
        switch text {
        case "true": return true
        case "false": return false
        default: throw Aria2Error("option \(option) must be true or false, not \(text.prefix(100))")
        }
    }

    /// aria2's speeds: bytes per second, or with K or M (1024, 1048576).
    static func speed(_ text: String, option: String) throws(Aria2Error) -> Int64 {
        var digits = Substring(text)
        var factor: Int64 = 1
        switch digits.last {
        case "K", "k":
            factor = 1024
            digits.removeLast()
        case "M", "m":
            factor = 1 << 20
            digits.removeLast()
        default: break
        }
        guard let number = Int64(digits), number >= 0, number <= Int64.max / factor else {
            throw Aria2Error("option \(option) must be a number of bytes per second (K and M allowed), not \(text.prefix(100))")
        }
        return number * factor
    }
}

/// aria2's view of a dld job, from dld's job object (docs/protocol.md, "The job object").
enum Aria2Status {
    /// aria2's status of a dld state: a job waiting to retry is not transferring, so it is
    /// `waiting` as a queued one is.
    static func status(_ state: String) -> String {
        switch state {
        case "running": "active"
        case "queued", "waiting": "waiting"
        case "paused": "paused"
        case "completed": "complete"
        case "failed": "error"
        case "canceled": "removed"
        default: "error"
        }
    }

    /// aria2's exit status for dld's error code, where one fits (1: unknown).
    static func errorCode(_ code: String, message: String) -> Int {
        switch code {
        case "timeout": return 2
        case "connection_closed", "connection_refused", "network_error", "proxy_error": return 6
        case "dns_error": return 19
        case "disk_full", "disk_space": return 9
        case "destination_exists": return 13
        case "checksum_mismatch": return 32
        case "too_many_redirects": return 23
        case "file_error": return 17
        case "retries_exhausted": return 6
        case "http_status":
            if message.contains("404") || message.contains("410") { return 3 }
            if message.contains("401") || message.contains("403") { return 24 }
            if message.contains("503") { return 29 }
            return 22
        default: return 1
        }
    }

    /// The job's URIs: its own first (`used` while it is fetched), then its mirrors.
    static func uris(_ job: JSONValue) -> JSONValue {
        let own = job["url"]?.stringValue ?? ""
        let used = job["state"]?.stringValue != "queued"
        var list: [JSONValue] = [["uri": .string(own), "status": .string(used ? "used" : "waiting")]]
        for mirror in job["mirrors"]?.arrayValue?.dropFirst() ?? [] {
            list.append(["uri": mirror["url"] ?? .string(""), "status": "waiting"])
        }
        return .array(list)
    }

    static func files(_ job: JSONValue) -> JSONValue {
        let received = job["received"]?.int64Value ?? 0
        return [
            [
                "index": "1", "path": job["path"] ?? "", "length": .string(String(job["size"]?.int64Value ?? 0)),
                "completedLength": .string(String(received)), "selected": "true", "uris": uris(job),
            ]
        ]
    }

    /// tellStatus's object, only `keys` when given.
    static func encode(_ job: JSONValue, keys: Set<String>?) -> JSONValue {
        let id = job["id"]?.int64Value ?? 0
        let state = job["state"]?.stringValue ?? ""
        let size = job["size"]?.int64Value ?? 0
        let path = job["path"]?.stringValue ?? ""
        let dir = path.split(separator: "/", omittingEmptySubsequences: false).dropLast().joined(separator: "/")
        let pieceLength = job["pieces"]?["length"]?.int64Value ?? 1 << 20
        let pieces = job["pieces"]?["count"]?.int64Value ?? (size + pieceLength - 1) / pieceLength
        let running = state == "running"
        let connections = running ? max(1, job["ranges"]?.arrayValue?.count ?? 1) : 0
        var object: [String: JSONValue] = [
            "gid": .string(Aria2GID.gid(id)),
            "status": .string(status(state)),
            "totalLength": .string(String(size)),
            "completedLength": .string(String(job["received"]?.int64Value ?? 0)),
            "uploadLength": "0",
            "downloadSpeed": .string(String(running ? job["speed"]?.int64Value ?? 0 : 0)),
            "uploadSpeed": "0",
            "connections": .string(String(connections)),
            "pieceLength": .string(String(pieceLength)),
            "numPieces": .string(String(pieces)),
            "dir": .string(dir.isEmpty ? "/" : dir),
            "files": files(job),
        ]
        switch state {
        case "completed":
            object["errorCode"] = "0"
            object["errorMessage"] = ""
        case "failed":
            let code = job["error"]?["code"]?.stringValue ?? ""
            let message = job["error"]?["message"]?.stringValue ?? ""
            object["errorCode"] = .string(String(errorCode(code, message: message)))
            object["errorMessage"] = .string(message)
        default:
            break
        }
        guard let keys else { return .object(object) }
        return .object(object.filter { keys.contains($0.key) })
    }
}
