import DLCore
import DLRPC
import DLStore
import Foundation

/// Turns request lines into response lines: JSON-RPC framing rules, then one method each.
/// Holds no socket, so every rule here is tested without one.
public struct Dispatcher: Sendable {
    public struct Limits: Sendable {
        public var maxMetaBytes = 64 << 10
        public var maxJobsPerEnqueue = 100_000
        public var maxHeaders = 64
        public var maxHeaderBytes = 8 << 10
        public var maxListLimit = 10_000
        public init() {}
    }

    let engine: Engine
    let limits: Limits

    public init(engine: Engine, limits: Limits = Limits()) {
        self.engine = engine
        self.limits = limits
    }

    /// What to do with one request line.
    public struct Reply: Sendable {
        /// The response line, or nil when nothing is to be sent back (only notifications).
        public var data: Data?
        /// A `shutdown` request succeeded: stop once the reply is sent.
        public var shutdown = false
    }

    public func handle(line: Data) async -> Reply {
        var reply = Reply()
        switch RPCIncoming.parse(line) {
        case .invalid(let response):
            reply.data = response.json.serialized()
        case .single(let parsed):
            reply.data = await respond(parsed, &reply.shutdown)?.json.serialized()
        case .batch(let elements):
            var responses: [JSONValue] = []
            for element in elements {
                if let response = await respond(element, &reply.shutdown) { responses.append(response.json) }
            }
            reply.data = responses.isEmpty ? nil : JSONValue.array(responses).serialized()
        }
        return reply
    }

    private func respond(_ parsed: Result<RPCRequest, RPCResponse>, _ shutdown: inout Bool) async -> RPCResponse? {
        switch parsed {
        case .failure(let response):
            return response
        case .success(let request):
            let result: Result<JSONValue, RPCError>
            do {
                result = .success(try await call(request.method, request.params))
            } catch {
                result = .failure(RPCError(error))
            }
            if request.method == "shutdown", case .success = result { shutdown = true }
            guard let id = request.id else { return nil }
            return RPCResponse(id: id, result: result)
        }
    }

    public static let methods = ["enqueue", "pause", "resume", "cancel", "remove", "status", "list", "stats", "queue", "version", "shutdown"]

    func call(_ method: String, _ raw: [String: JSONValue]) async throws(DLError) -> JSONValue {
        switch method {
        case "enqueue":
            return try await enqueue(raw)
        case "pause", "resume", "cancel":
            let params = try Params(raw, allowed: ["id", "ids", "all"])
            let selection = try params.selection()
            let jobs: [Job]
            switch method {
            case "pause": jobs = try await engine.pause(selection)
            case "resume": jobs = try await engine.resume(selection)
            default: jobs = try await engine.cancel(selection)
            }
            return ["jobs": .array(jobs.map { JobJSON.encode($0) })]
        case "remove":
            let params = try Params(raw, allowed: ["id", "ids", "all", "delete_file"])
            let jobs = try await engine.remove(try params.selection(), deleteFile: try params.bool("delete_file") ?? false)
            return ["removed": .array(jobs.map { .int($0.id) })]
        case "status":
            let params = try Params(raw, allowed: ["id", "ids"])
            switch try params.selection() {
            case .ids(let ids) where params.has("id"):
                return try await engine.status(ids)[0]
            case .ids(let ids):
                return ["jobs": .array(try await engine.status(ids))]
            case .all:
                throw .invalidParams("status takes \"id\" or \"ids\"; use list for all jobs")
            }
        case "list":
            let params = try Params(raw, allowed: ["state", "limit", "after_id"])
            let states = try parseStates(params)
            let limit = Int(try params.int("limit", in: 1...Int64(limits.maxListLimit)) ?? 1000)
            let after = try params.int("after_id", in: 0...Int64.max) ?? 0
            let jobs = try await engine.list(states: states, afterID: after, limit: limit + 1)
            let page = Array(jobs.prefix(limit))
            let next: JSONValue = jobs.count > limit ? (page.last?["id"] ?? .null) : .null
            return ["jobs": .array(page), "next_after_id": next]
        case "stats":
            _ = try Params(raw, allowed: [])
            let stats = try await engine.stats()
            var counts: [String: JSONValue] = [:]
            for state in JobState.allCases { counts[state.rawValue] = .int(Int64(stats.counts[state] ?? 0)) }
            return [
                "counts": .object(counts),
                "total": .int(Int64(stats.counts.values.reduce(0, +))),
                "active": .int(Int64(stats.active)),
                "speed": .int(Int64(stats.speed.rounded())),
                "max_active": .int(Int64(stats.maxActive)),
                "accepting": .bool(stats.accepting),
                "uptime": .int(Int64(stats.uptime.rounded())),
                "queue_paused": .bool(stats.queuePausedReason != nil),
                "queue_paused_reason": stats.queuePausedReason.map { .string($0) } ?? .null,
            ]
        case "queue":
            let params = try Params(raw, allowed: ["paused"])
            let reason: String?
            if let paused = try params.bool("paused") {
                reason = try await engine.setQueuePaused(paused)
            } else {
                reason = try await engine.stats().queuePausedReason
            }
            return ["paused": .bool(reason != nil), "reason": reason.map { .string($0) } ?? .null]
        case "version":
            _ = try Params(raw, allowed: [])
            return ["version": .string(DLDVersion.current), "protocol": .int(Int64(DLDVersion.protocolVersion))]
        case "shutdown":
            _ = try Params(raw, allowed: [])
            return ["ok": true]
        default:
            throw DLError(.methodNotFound, "unknown method \"\(method.prefix(100))\"; methods: \(Self.methods.joined(separator: ", "))")
        }
    }

    private func parseStates(_ params: Params) throws(DLError) -> [JobState]? {
        guard let value = params.values["state"], !value.isNull else { return nil }
        let names: [JSONValue]
        switch value {
        case .string: names = [value]
        case .array(let list): names = list
        default: throw .invalidParams("param \"state\" must be a state name or an array of them")
        }
        var states: [JobState] = []
        for name in names {
            guard let text = name.stringValue, let state = JobState(rawValue: text) else {
                throw .invalidParams("unknown state \(name.serializedString()); states: \(JobState.allCases.map(\.rawValue).joined(separator: ", "))")
            }
            states.append(state)
        }
        return states
    }

    // MARK: enqueue

    static let jobKeys: Set<String> = ["url", "path", "dir", "name", "priority", "key", "meta", "headers", "overwrite", "paused", "checksum", "size"]

    private func enqueue(_ raw: [String: JSONValue]) async throws(DLError) -> JSONValue {
        if raw["jobs"] != nil {
            let params = try Params(raw, allowed: ["jobs"])
            guard let list = try params.array("jobs"), !list.isEmpty else { throw .invalidParams("param \"jobs\" must be a non-empty array") }
            guard list.count <= limits.maxJobsPerEnqueue else {
                throw .invalidParams("at most \(limits.maxJobsPerEnqueue) jobs per enqueue, got \(list.count)")
            }
            var specs: [EnqueueSpec] = []
            for (index, element) in list.enumerated() {
                guard let object = element.objectValue else { throw .invalidParams("jobs[\(index)] must be an object") }
                do throws(DLError) {
                    specs.append(try spec(Params(object, allowed: Self.jobKeys)))
                } catch {
                    throw DLError(error.code, "jobs[\(index)]: \(error.message)")
                }
            }
            let outcomes = try await engine.enqueue(specs)
            return ["results": .array(outcomes.map { ["job": JobJSON.encode($0.job), "created": .bool($0.created)] })]
        }
        let spec = try spec(Params(raw, allowed: Self.jobKeys))
        let outcomes = try await engine.enqueue([spec])
        guard let outcome = outcomes.first else { throw DLError(.internalError, "enqueue returned nothing") }
        return ["job": JobJSON.encode(outcome.job), "created": .bool(outcome.created)]
    }

    private func spec(_ params: Params) throws(DLError) -> EnqueueSpec {
        let url = try params.requiredString("url")
        if case .failure(let error) = URLRules.validate(url) { throw error }
        var spec = EnqueueSpec(url: url)
        spec.path = try params.string("path")
        spec.dir = try params.string("dir")
        spec.name = try params.string("name")
        spec.priority = Int(try params.int("priority", in: -1000...1000) ?? 0)
        if let key = try params.string("key") {
            guard !key.isEmpty, key.utf8.count <= 1024 else { throw .invalidParams("\"key\" must be 1 to 1024 bytes") }
            spec.key = key
        }
        if let meta = params.values["meta"], !meta.isNull {
            let text = meta.serializedString()
            guard text.utf8.count <= limits.maxMetaBytes else {
                throw .invalidParams("\"meta\" is \(text.utf8.count) bytes; at most \(limits.maxMetaBytes)")
            }
            spec.meta = text
        }
        spec.headers = try headers(params)
        spec.overwrite = try params.bool("overwrite") ?? false
        if let text = try params.string("checksum") {
            switch Checksum.parse(text) {
            case .success(let checksum): spec.checksum = checksum
            case .failure(let error): throw error
            }
        }
        spec.size = try params.int("size", in: 0...Int64.max)
        spec.paused = try params.bool("paused") ?? false
        return spec
    }

    /// `headers`: an object of name → value. Names must be HTTP tokens and values one line, so
    /// that a header cannot smuggle another request.
    private func headers(_ params: Params) throws(DLError) -> [HeaderField] {
        guard let object = try params.object("headers") else { return [] }
        guard object.count <= limits.maxHeaders else { throw .invalidParams("at most \(limits.maxHeaders) headers") }
        var fields: [HeaderField] = []
        var total = 0
        for (name, value) in object.sorted(by: { $0.key < $1.key }) {
            guard let text = value.stringValue else { throw .invalidParams("header \"\(name)\" must be a string") }
            let tokenChars = CharacterSet(charactersIn: "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
            guard !name.isEmpty, name.unicodeScalars.allSatisfy(tokenChars.contains) else {
                throw .invalidParams("invalid header name \"\(name.prefix(100))\"")
            }
            // By scalars: "\r\n" is one Character, equal to neither "\r" nor "\n".
            guard !text.unicodeScalars.contains(where: { $0 == "\r" || $0 == "\n" || $0 == "\0" }) else {
                throw .invalidParams("header \"\(name)\" must not contain line breaks")
            }
            let lower = name.lowercased()
            guard !["host", "range", "if-range", "content-length", "transfer-encoding", "connection"].contains(lower) else {
                throw .invalidParams("header \"\(name)\" is set by dld and cannot be given")
            }
            total += name.utf8.count + text.utf8.count
            fields.append(HeaderField(name: name, value: text))
        }
        guard total <= limits.maxHeaderBytes else { throw .invalidParams("headers are larger than \(limits.maxHeaderBytes) bytes") }
        return fields
    }
}
