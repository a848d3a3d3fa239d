import DLCore
import DLRPC
import Foundation

/// aria2's JSON-RPC ("RPC INTERFACE" of aria2's manual) on `/jsonrpc`, for the front-ends,
/// browser extensions and scripts written for aria2. A translation layer only: each call
/// becomes one or more of dld's own methods, with their params built as dld's clients build
/// them and decoded by the same `Dispatcher.call` (its typed params, rules and limits), and
/// dld's answers are rewritten in aria2's shapes. What dld does not do is refused by name.
/// Holds no socket, so it is tested without one. docs/aria2.md is its page.
struct Aria2RPC: Sendable {
    let dispatcher: Dispatcher
    /// `token:SECRET` must be the first param: the HTTP token, or `aria2_secret`.
    let secret: String
    /// The live config (download_dir is reloaded), for getGlobalOption.
    let config: @Sendable () -> DaemonConfig
    /// aria2's session id: one per run of the daemon.
    let sessionID: String

    /// Calls of one system.multicall, and requests of one batch, at most.
    static let maxCalls = 1000

    init(dispatcher: Dispatcher, secret: String, config: @escaping @Sendable () -> DaemonConfig) {
        self.dispatcher = dispatcher
        self.secret = secret
        self.config = config
        var generator = SystemRandomNumberGenerator()
        sessionID = Hex.encode((0..<20).map { _ in UInt8.random(in: .min ... .max, using: &generator) })
    }

    struct Reply: Sendable {
        var data: Data
        /// shutdown or forceShutdown succeeded: stop once the reply is sent.
        var shutdown = false
        /// A call carried a wrong or no secret: the transport answers it after the delay of
        /// wrong tokens (`AuthThrottle`).
        var unauthorized = false
        /// A call carried the right secret: the connection may receive notifications.
        var authorized = false
    }

    /// One request or a batch, as the body of a POST or a WebSocket message.
    func handle(body: Data) async -> Reply {
        var reply = Reply(data: Data())
        guard let value = try? JSONValue.parse(body) else {
            reply.data = Self.response(id: .null, .failure(.parse)).serialized()
            return reply
        }
        if case .array(let requests) = value {
            guard requests.count <= Self.maxCalls else {
                reply.data = Self.response(id: .null, .failure(Aria2Error("at most \(Self.maxCalls) requests in a batch", code: -32600)))
                    .serialized()
                return reply
            }
            var responses: [JSONValue] = []
            for request in requests { responses.append(await respond(request, &reply)) }
            reply.data = JSONValue.array(responses).serialized()
        } else {
            reply.data = await respond(value, &reply).serialized()
        }
        return reply
    }

    /// `GET /jsonrpc?method=M&id=I&params=BASE64`: the params are a base64 JSON array.
    func handle(query items: [URLQueryItem]) async -> Reply {
        var request: [String: JSONValue] = ["jsonrpc": "2.0"]
        for item in items {
            guard let value = item.value else { continue }
            switch item.name {
            case "method": request["method"] = .string(value)
            case "id": request["id"] = .string(value)
            case "params":
                // `+` may have become a space on the way.
                guard let data = Data(base64Encoded: value.replacingOccurrences(of: " ", with: "+")),
                    let params = try? JSONValue.parse(data)
                else {
                    return Reply(data: Self.response(id: .null, .failure(.parse)).serialized())
                }
                request["params"] = params
            default:
                continue
            }
        }
        var reply = Reply(data: Data())
        reply.data = await respond(.object(request), &reply).serialized()
        return reply
    }

    static func response(id: JSONValue, _ result: Result<JSONValue, Aria2Error>) -> JSONValue {
        switch result {
        case .success(let value): ["id": id, "jsonrpc": "2.0", "result": value]
        case .failure(let error): ["id": id, "jsonrpc": "2.0", "error": error.json]
        }
    }

    private func respond(_ request: JSONValue, _ reply: inout Reply) async -> JSONValue {
        guard case .object(let object) = request, let id = object["id"] else {
            return Self.response(id: .null, .failure(.invalidRequest))
        }
        guard let method = object["method"]?.stringValue else { return Self.response(id: id, .failure(.invalidRequest)) }
        let params: [JSONValue]
        switch object["params"] {
        case nil, .null?: params = []
        case .array(let list)?: params = list
        default: return Self.response(id: id, .failure(.invalidRequest))
        }
        return Self.response(id: id, await call(method, params, &reply, nested: false))
    }

    /// One call: the secret first, then the method.
    func call(_ name: String, _ raw: [JSONValue], _ reply: inout Reply, nested: Bool) async -> Result<JSONValue, Aria2Error> {
        guard let method = Aria2Method(rawValue: name) else { return .failure(Aria2Error("No such method: \(name.prefix(100))")) }
        var params = raw
        if let first = params.first?.stringValue, first.hasPrefix("token:") {
            params.removeFirst()
            if method.needsToken, !HTTPToken.matches(first.dropFirst("token:".count), secret) {
                reply.unauthorized = true
                return .failure(.unauthorized)
            }
            if method.needsToken { reply.authorized = true }
        } else if method.needsToken {
            reply.unauthorized = true
            return .failure(.unauthorized)
        }
        do throws(Aria2Error) {
            if method == .multicall {
                guard !nested else { throw Aria2Error("system.multicall cannot be nested") }
                return .success(try await multicall(Aria2Params(values: params), &reply))
            }
            let result = try await perform(method, Aria2Params(values: params))
            if method == .shutdown || method == .forceShutdown { reply.shutdown = true }
            return .success(result)
        } catch {
            return .failure(error)
        }
    }

    /// `system.multicall([{methodName, params}, …])`: each result in an array of one, each
    /// error as its object, in order.
    private func multicall(_ params: Aria2Params, _ reply: inout Reply) async throws(Aria2Error) -> JSONValue {
        let calls = try params.array(0)
        guard calls.count <= Self.maxCalls else { throw Aria2Error("at most \(Self.maxCalls) calls in one system.multicall") }
        var results: [JSONValue] = []
        for entry in calls {
            guard let name = entry["methodName"]?.stringValue else {
                results.append(Aria2Error("Missing methodName.").json)
                continue
            }
            let inner: [JSONValue]
            switch entry["params"] {
            case nil, .null?: inner = []
            case .array(let list)?: inner = list
            default:
                results.append(Aria2Error("Missing params.").json)
                continue
            }
            switch await call(name, inner, &reply, nested: true) {
            case .success(let value): results.append([value])
            case .failure(let error): results.append(error.json)
            }
        }
        return .array(results)
    }

    /// dld's method `name` with `params`, through the dispatcher; its errors in aria2's shape
    /// (a job that is not there as aria2 says it for `gid`).
    func dld(_ name: RPCMethod, _ params: [String: JSONValue], gid: JobID? = nil) async throws(Aria2Error) -> JSONValue {
        do throws(DLError) {
            return try await dispatcher.call(name.rawValue, params)
        } catch {
            if error.code == .jobNotFound, let gid { throw Aria2Error("GID \(Aria2GID.gid(gid)) is not found") }
            throw Aria2Error(error.message)
        }
    }

    func job(_ id: JobID) async throws(Aria2Error) -> JSONValue {
        try await dld(.status, ["id": .int(id)], gid: id)
    }

    private func perform(_ method: Aria2Method, _ params: Aria2Params) async throws(Aria2Error) -> JSONValue {
        switch method {
        case .addUri: return try await addUri(params)
        case .addMetalink: return try await addMetalink(params)
        case .addTorrent:
            throw Aria2Error("dld does not do BitTorrent: addTorrent is refused (HTTP(S) and Metalink downloads only)")
        case .remove, .forceRemove: return try await remove(params.gid(0))
        case .pause, .forcePause: return try await pause(params.gid(0))
        case .unpause: return try await unpause(params.gid(0))
        case .pauseAll, .forcePauseAll:
            _ = try await dld(.pause, ["all": true])
            return "OK"
        case .unpauseAll: return try await unpauseAll()
        case .changePosition:
            _ = try params.gid(0)
            throw Aria2Error("dld orders its queue by priority, then by age: a download's position cannot be changed")
        case .tellStatus: return Aria2Status.encode(try await job(params.gid(0)), keys: try params.keys(1))
        case .getUris: return Aria2Status.uris(try await job(params.gid(0)))
        case .getFiles: return Aria2Status.files(try await job(params.gid(0)))
        case .getPeers:
            _ = try await job(params.gid(0))
            return []
        case .getServers: return try await servers(params.gid(0))
        case .tellActive: return try await tell(states: ["running"], offset: 0, count: Int64(Self.maxCalls), keys: params.keys(0))
        case .tellWaiting:
            return try await tell(
                states: ["queued", "waiting", "paused"], offset: params.int(0), count: params.int(1), keys: params.keys(2))
        case .tellStopped:
            return try await tell(
                states: ["completed", "failed", "canceled"], offset: params.int(0), count: params.int(1), keys: params.keys(2))
        case .getOption: return Self.options(try await job(params.gid(0)))
        case .changeUri: return try await changeUri(params)
        case .changeOption: return try await changeOption(params)
        case .getGlobalOption: return try await globalOptions()
        case .changeGlobalOption: return try await changeGlobalOption(params)
        case .purgeDownloadResult:
            _ = try await dld(.remove, ["finished": true, "failed": true])
            return "OK"
        case .removeDownloadResult: return try await removeResult(params.gid(0))
        case .getVersion:
            return ["version": .string(DLDVersion.current), "enabledFeatures": ["HTTPS", "Message Digest", "Metalink"]]
        case .getSessionInfo: return ["sessionId": .string(sessionID)]
        case .shutdown, .forceShutdown:
            _ = try await dld(.shutdown, [:])
            return "OK"
        case .getGlobalStat: return try await globalStat()
        case .saveSession:
            // Every answered command is committed already.
            return "OK"
        case .listMethods: return .array(Aria2Method.allCases.map { .string($0.rawValue) })
        case .listNotifications: return .array(Aria2Method.notifications.map { .string($0) })
        case .multicall: throw Aria2Error("system.multicall cannot be nested")
        }
    }
}
