import DLCore
import DLRPC
import DLJobTable
import DLStore
import DLTransfer
import Foundation

/// Turns request lines into response lines: JSON-RPC framing rules, then one method each.
/// Holds no socket, so every rule here is tested without one.
public struct Dispatcher: Sendable {
    public struct Limits: Sendable {
        public var maxMetaBytes = 64 << 10
        /// Jobs in one `enqueue`. With the 4 MiB line limit this leaves about 400 bytes a job
        /// (docs/protocol.md); `dlctl` splits longer lists into several calls.
        public var maxJobsPerEnqueue = 10_000
        public var maxHeaders = 64
        public var maxHeaderBytes = 8 << 10
        public var maxListLimit = 10_000
        public var maxPage = 1000
        public init() {}
    }

    let engine: Engine
    /// The URL cache behind `get`; nil: `get` is refused (tests of other methods).
    let cache: URLCache?
    let limits: Limits

    public init(engine: Engine, cache: URLCache? = nil, limits: Limits = Limits()) {
        self.engine = engine
        self.cache = cache
        self.limits = limits
    }

    /// What to do with one request line.
    public struct Reply: Sendable {
        /// The response line, or nil when nothing is to be sent back (only notifications).
        public var data: Data?
        /// A `shutdown` request succeeded: stop once the reply is sent.
        public var shutdown = false
        /// A `subscribe` request: the connection becomes an event stream.
        public var subscription: Subscription?
    }

    public struct Subscription: Sendable {
        public var id: JSONValue
        public var filter: EventHub.Filter
        public var since: Int64?
    }

    public func handle(line: Data) async -> Reply {
        var reply = Reply()
        switch RPCIncoming.parse(line) {
        case .invalid(let response):
            reply.data = response.json.serialized()
        case .single(.success(let request)) where request.method == RPCMethod.subscribe.rawValue:
            do {
                reply.subscription = try await subscription(request)
            } catch {
                reply.data = RPCResponse(id: request.id ?? .null, result: .failure(RPCError(error))).json.serialized()
            }
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
            do throws(DLError) {
                if request.positional { throw DLError(.invalidParams, "params must be named (an object), not positional") }
                result = .success(try await call(request.method, request.params))
            } catch {
                result = .failure(RPCError(error))
            }
            if request.method == RPCMethod.shutdown.rawValue, case .success = result { shutdown = true }
            guard let id = request.id else { return nil }
            return RPCResponse(id: id, result: result)
        }
    }

    private func subscription(_ request: RPCRequest) async throws(DLError) -> Subscription {
        guard let id = request.id else { throw DLError(.invalidRequest, "subscribe must be a request with an id, not a notification") }
        let params = try Params(request.params, allowed: ["ids", "group", "since"])
        var filter = EventHub.Filter()
        if let ids = try params.array("ids") {
            var set: Set<JobID> = []
            for element in ids {
                guard let id = element.int64Value, id >= 1 else { throw .invalidParams("param \"ids\" must be an array of job ids") }
                set.insert(id)
            }
            filter.ids = set
        }
        if let reference = try params.groupReference() {
            filter.group = try await engine.groupID(reference)
        }
        return Subscription(id: id, filter: filter, since: try params.int("since", in: 0...Int64.max))
    }

    func call(_ name: String, _ raw: [String: JSONValue]) async throws(DLError) -> JSONValue {
        guard let method = RPCMethod(rawValue: name) else {
            throw DLError(.methodNotFound, "unknown method \"\(name.prefix(100))\"; methods: \(RPCMethod.names.joined(separator: ", "))")
        }
        switch method {
        case .enqueue:
            return try await enqueue(raw)
        case .pause, .resume, .cancel:
            let params = try Params(raw, allowed: ["id", "ids", "all", "group"])
            let selection = try params.selection()
            switch method {
            case .pause: return Self.bulkReply(try await engine.pause(selection))
            case .resume: return Self.bulkReply(try await engine.resume(selection))
            default: return Self.bulkReply(try await engine.cancel(selection))
            }
        case .remove:
            let params = try Params(raw, allowed: ["id", "ids", "all", "group", "delete_file", "finished", "failed", "older_than"])
            if params.has("finished") || params.has("failed") || params.has("older_than") {
                return Self.bulkReply(try await removeFinished(params), alsoAs: "removed")
            }
            let outcome = try await engine.remove(try params.selection(), deleteFile: try params.bool("delete_file") ?? false)
            // `removed`, the list protocol 1 answered with, stays: the same ids.
            return Self.bulkReply(outcome, alsoAs: "removed")
        case .status:
            let params = try Params(raw, allowed: ["id", "ids", "group"])
            switch try params.selection() {
            case .ids(let ids) where params.has("id"):
                return JobJSON.encode(try await engine.status(ids)[0])
            case .ids(let ids):
                return ["jobs": .array(try await engine.status(ids).map(JobJSON.encode))]
            case .group(let reference):
                let (group, summary, jobs) = try await engine.groupStatus(reference)
                // Members as JSON text, not objects: a group of 2000 small files took 5 MB of
                // dictionaries for one `status`, the daemon's peak.
                return ["group": JobJSON.encodeGroup(group, summary), "jobs": .array(jobs.map(JobJSON.raw))]
            case .all:
                throw .invalidParams("status takes \"id\", \"ids\" or \"group\"; use list for all jobs")
            }
        case .list:
            let params = try Params(raw, allowed: ["state", "limit", "after_id", "group"])
            let states = try parseStates(params)
            if let reference = try params.groupReference() {
                let (_, _, jobs) = try await engine.groupStatus(reference, states: states)
                return ["jobs": .array(jobs.map(JobJSON.raw)), "next_after_id": .null]
            }
            // A page holds at most `maxPage` jobs whatever the limit: a page of 10 000 whole jobs
            // cost over 100 MiB to build; `next_after_id` continues where it stopped.
            let limit = min(limits.maxPage, Int(try params.int("limit", in: 1...Int64(limits.maxListLimit)) ?? 1000))
            let after = try params.int("after_id", in: 0...Int64.max) ?? 0
            let jobs = try await engine.list(states: states, afterID: after, limit: limit + 1)
            let page = jobs.prefix(limit)
            let next: JSONValue = jobs.count > limit ? (page.last.map { .int($0.job.id) } ?? .null) : .null
            // Each job as JSON text: building and sorting each job's object took most of a page's time.
            return ["jobs": .array(page.map(JobJSON.raw)), "next_after_id": next]
        case .stats:
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
                "worker": .string(stats.worker),
                "workers": .array(stats.workers.map { ["id": .string($0.id), "seen_at": JobJSON.timestamp($0.seenAt)] }),
                "database_bytes": .int(stats.databaseBytes),
                "table_unreachable": stats.tableUnreachable.map { .string($0) } ?? .null,
                "lease": stats.lease.map(Self.leaseReply) ?? .null,
                "max_speed": Self.speedReply(await engine.speedView),
                "cache": await cacheStats(),
            ]
        case .setSpeed:
            return try await setSpeed(raw)
        case .change:
            return try await change(raw)
        case .get, .unpin, .cacheList:
            return try await cacheCall(method, raw)
        case .queue:
            let params = try Params(raw, allowed: ["paused"])
            let reason: String?
            if let paused = try params.bool("paused") {
                reason = try await engine.setQueuePaused(paused)
            } else {
                reason = try await engine.stats().queuePausedReason
            }
            return ["paused": .bool(reason != nil), "reason": reason.map { .string($0) } ?? .null]
        case .subscribe:
            throw DLError(.invalidRequest, "subscribe must be sent alone, not in a batch")
        case .version:
            _ = try Params(raw, allowed: [])
            return ["version": .string(DLDVersion.current), "protocol": .int(Int64(DLDVersion.protocolVersion))]
        case .shutdown:
            _ = try Params(raw, allowed: [])
            return ["ok": true]
        }
    }

    /// The reply of a bulk command: how many jobs changed and the first of their ids, so that
    /// it stays small whatever the count (docs/protocol.md, "Bulk commands").
    static func bulkReply(_ outcome: BulkOutcome, alsoAs alias: String? = nil) -> JSONValue {
        let ids = JSONValue.array(outcome.ids.map { .int($0) })
        var reply: [String: JSONValue] = [
            "count": .int(Int64(outcome.count)), "ids": ids, "more": .bool(outcome.count > outcome.ids.count),
        ]
        if let alias { reply[alias] = ids }
        return .object(reply)
    }

    private func parseStates(_ params: Params) throws(DLError) -> [JobState]? {
        guard let value = params.value("state") else { return nil }
        let names: [JSONValue]
        switch value {
        case .string: names = [value]
        case .array(let list): names = list
        default: throw .invalidParams("param \"state\" must be a state name or an array of them")
        }
        var states: [JobState] = []
        for name in names {
            guard let text = name.stringValue, let state = JobState(rawValue: text) else {
                throw .invalidParams(
                    "unknown state \(name.serializedString()); states: \(JobState.allCases.map(\.rawValue).joined(separator: ", "))")
            }
            states.append(state)
        }
        return states
    }

    // MARK: enqueue

    static let jobKeys: Set<String> = [
        "url", "path", "dir", "name", "priority", "key", "meta", "headers", "overwrite", "paused", "checksum", "size",
        "on_exists", "insecure", "ca_file", "ca_dir", "client_cert", "client_key", "max_speed", "segments", "metered",
        "mirrors",
        "encrypt_to",
    ]

    /// RFC 9110 token characters, the only ones allowed in a header name.
    static let tokenCharacters = CharacterSet(charactersIn: "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")

    static let groupKeys: Set<String> = [
        "group", "jobs", "priority", "headers", "overwrite", "paused", "insecure", "ca_file", "ca_dir", "client_cert", "client_key",
        "segments", "metered", "encrypt_to",
    ]
    static let memberKeys: Set<String> = ["url", "name", "path", "checksum", "size", "meta", "mirrors"]

    private func enqueueGroup(_ raw: [String: JSONValue]) async throws(DLError) -> JSONValue {
        let params = try Params(raw, allowed: Self.groupKeys)
        guard let groupObject = try params.object("group") else { throw .invalidParams("param \"group\" must be an object {name, dir}") }
        let group = try Params(groupObject, allowed: ["name", "dir"])
        let name = try group.requiredString("name")
        guard !name.isEmpty, name.utf8.count <= 1024 else { throw .invalidParams("group \"name\" must be 1 to 1024 bytes") }
        let dir = try group.requiredString("dir")
        guard let list = try params.array("jobs"), !list.isEmpty else { throw .invalidParams("param \"jobs\" must be a non-empty array") }
        guard list.count <= limits.maxJobsPerEnqueue else {
            throw .invalidParams("at most \(limits.maxJobsPerEnqueue) jobs per enqueue, got \(list.count)")
        }
        var members: [Engine.MemberSpec] = []
        for (index, element) in list.enumerated() {
            do throws(DLError) {
                guard let object = element.objectValue else { throw .invalidParams("must be an object") }
                let p = try Params(object, allowed: Self.memberKeys)
                var member = Engine.MemberSpec(url: try p.requiredString("url"))
                if case .failure(let error) = URLRules.validate(member.url) { throw error }
                let name = try p.string("name")
                let path = try p.string("path")
                if name != nil && path != nil { throw .invalidParams("give \"name\" or \"path\", not both") }
                if let name, name.contains("/") { throw .invalidParams("\"name\" must not contain \"/\"; use \"path\" for subfolders") }
                member.relativePath = path ?? name
                if let text = try p.string("checksum") { member.checksum = try Checksum.parse(text).get() }
                member.size = try p.int("size", in: 0...Int64.max)
                member.meta = try meta(p)
                member.mirrors = try Self.mirrors(p, url: member.url)
                members.append(member)
            } catch {
                throw DLError(error.code, "jobs[\(index)]: \(error.message)")
            }
        }
        let (created, jobs) = try await engine.enqueueGroup(
            name: name, dir: dir, priority: Int(try params.int("priority", in: -1000...1000) ?? 0),
            headers: try headers(params), overwrite: try params.bool("overwrite") ?? false,
            paused: try params.bool("paused") ?? false,
            options: JobOptions(
                insecure: try params.bool("insecure") ?? false, tls: try jobTLS(params), segments: try segments(params),
                metered: try params.bool("metered"), encryptTo: try Self.encryptTo(params)),
            members: members)
        let summary = GroupSummary.summarize(created, members: jobs, active: false)
        return [
            "group": JobJSON.encodeGroup(created, summary), "count": .int(Int64(jobs.count)),
            "results": .array(jobs.map { ["id": .int($0.id), "created": true, "path": .string($0.path)] }),
        ]
    }

    private func meta(_ params: Params) throws(DLError) -> String? {
        guard let meta = params.value("meta") else { return nil }
        let text = meta.serializedString()
        guard text.utf8.count <= limits.maxMetaBytes else {
            throw .invalidParams("\"meta\" is \(text.utf8.count) bytes; at most \(limits.maxMetaBytes)")
        }
        return text
    }

    /// `remove` by state and age: `finished` (completed and canceled) and/or `failed`,
    /// optionally `older_than` seconds; standalone jobs only, files of completed jobs stay.
    private func removeFinished(_ params: Params) async throws(DLError) -> BulkOutcome {
        for key in ["id", "ids", "all", "group", "delete_file"] where params.has(key) {
            throw .invalidParams("\"\(key)\" does not go with \"finished\", \"failed\" or \"older_than\"")
        }
        var states: [JobState] = []
        if try params.bool("finished") == true { states += [.completed, .canceled] }
        if try params.bool("failed") == true { states.append(.failed) }
        guard !states.isEmpty else { throw .invalidParams("give \"finished\": true and/or \"failed\": true") }
        let olderThan = try params.int("older_than", in: 0...Int64(Int32.max)).map(TimeInterval.init)
        return try await engine.removeFinished(states, olderThan: olderThan)
    }

    private func enqueue(_ raw: [String: JSONValue]) async throws(DLError) -> JSONValue {
        if raw["group"] != nil { return try await enqueueGroup(raw) }
        if raw["jobs"] != nil {
            let params = try Params(raw, allowed: ["jobs"])
            guard let list = try params.array("jobs"), !list.isEmpty else {
                throw .invalidParams("param \"jobs\" must be a non-empty array")
            }
            guard list.count <= limits.maxJobsPerEnqueue else {
                throw .invalidParams("at most \(limits.maxJobsPerEnqueue) jobs per enqueue, got \(list.count)")
            }
            let outcomes = try await engine.enqueue(try await specs(list))
            // One short entry a job, not the whole job: 10 000 of them stay well under the
            // line limit (a client asks `status` for more). Written as text at once: an object
            // a job cost megabytes for a call of thousands (the daemon's budget is 64 MiB).
            var results: [UInt8] = [UInt8(ascii: "[")]
            results.reserveCapacity(outcomes.count * 96)
            for (index, outcome) in outcomes.enumerated() {
                if index > 0 { results.append(UInt8(ascii: ",")) }
                JSONValue.writeObject(
                    [("created", .bool(outcome.created)), ("id", .int(outcome.job.id)), ("path", .string(outcome.job.path))],
                    into: &results)
            }
            results.append(UInt8(ascii: "]"))
            return [
                "count": .int(Int64(outcomes.count)),
                "created": .int(Int64(outcomes.reduce(0) { $1.created ? $0 + 1 : $0 })),
                "results": .raw(RawJSON(results)),
            ]
        }
        let spec = try spec(Params(raw, allowed: Self.jobKeys))
        let outcomes = try await engine.enqueue([spec])
        guard let outcome = outcomes.first else { throw DLError(.internalError, "enqueue returned nothing") }
        return ["job": JobJSON.encode(outcome.job), "created": .bool(outcome.created)]
    }

    /// The jobs of an `enqueue`, checked. A call of thousands checks its two halves at once
    /// (on two cores, the half of its time it spent here); the first job in error is named.
    private func specs(_ list: [JSONValue]) async throws(DLError) -> [EnqueueSpec] {
        guard list.count >= 1000 else { return try specs(list[...]) }
        let middle = list.count / 2
        async let tail = Result { () throws(DLError) in try specs(list[middle...]) }
        let head = Result { () throws(DLError) in try specs(list[..<middle]) }
        let rest = await tail
        return try head.get() + rest.get()
    }

    private func specs(_ list: ArraySlice<JSONValue>) throws(DLError) -> [EnqueueSpec] {
        var specs: [EnqueueSpec] = []
        specs.reserveCapacity(list.count)
        for (index, element) in zip(list.indices, list) {
            guard let object = element.objectValue else { throw .invalidParams("jobs[\(index)] must be an object") }
            do throws(DLError) {
                specs.append(try spec(Params(object, allowed: Self.jobKeys)))
            } catch {
                throw DLError(error.code, "jobs[\(index)]: \(error.message)")
            }
        }
        return specs
    }

    private func spec(_ params: Params) throws(DLError) -> EnqueueSpec {
        let url = try params.requiredString("url")
        var spec = EnqueueSpec(url: url)
        switch URLRules.checked(url) {
        case .success(let checked): spec.host = checked.host
        case .failure(let error): throw error
        }
        spec.path = try params.string("path")
        spec.dir = try params.string("dir")
        spec.name = try params.string("name")
        spec.priority = Int(try params.int("priority", in: -1000...1000) ?? 0)
        if let key = try params.string("key") {
            guard !key.isEmpty, key.utf8.count <= 1024 else { throw .invalidParams("\"key\" must be 1 to 1024 bytes") }
            spec.key = key
        }
        spec.meta = try meta(params)
        spec.headers = try headers(params)
        spec.overwrite = try params.bool("overwrite") ?? false
        if let text = try params.string("checksum") {
            switch Checksum.parse(text) {
            case .success(let checksum): spec.checksum = checksum
            case .failure(let error): throw error
            }
        }
        spec.size = try params.int("size", in: 0...Int64.max)
        if let text = try params.string("on_exists") {
            guard let policy = ExistingFilePolicy(rawValue: text) else {
                throw .invalidParams("\"on_exists\" must be \"error\" or \"rename\", not \(text.prefix(40))")
            }
            spec.onExists = policy
        }
        spec.insecure = try params.bool("insecure") ?? false
        spec.tls = try jobTLS(params)
        spec.segments = try segments(params)
        spec.metered = try params.bool("metered")
        spec.encryptTo = try Self.encryptTo(params)
        spec.paused = try params.bool("paused") ?? false
        spec.maxSpeed = try Self.rate(params)
        spec.mirrors = try Self.mirrors(params, url: url)
        return spec
    }

    /// Mirrors a job may have: more would only be requests that compete for the same file.
    static let maxMirrors = 16

    /// `mirrors`: more URLs of the same file, each checked as `url` is, none given twice.
    static func mirrors(_ params: Params, url: String) throws(DLError) -> [JobMirror] {
        guard let list = try params.array("mirrors") else { return [] }
        guard list.count <= maxMirrors else { throw .invalidParams("at most \(maxMirrors) mirrors, got \(list.count)") }
        var seen: Set<String> = [url]
        var mirrors: [JobMirror] = []
        for (index, value) in list.enumerated() {
            guard let text = value.stringValue else { throw .invalidParams("mirrors[\(index)] must be a URL string") }
            if case .failure(let error) = URLRules.checked(text) { throw DLError(error.code, "mirrors[\(index)]: \(error.message)") }
            guard seen.insert(text).inserted else {
                throw .invalidParams("mirrors[\(index)]: \(URLRules.redacted(text).prefix(200)) is given twice")
            }
            mirrors.append(JobMirror(url: text))
        }
        return mirrors
    }

    /// `encrypt_to`: one age recipient (`age1…`) or an array of them, each checked now (Bech32
    /// checksum, an X25519 key that works), so that a typo fails the `enqueue`, not the job.
    static func encryptTo(_ params: Params) throws(DLError) -> [String]? {
        guard let value = params.value("encrypt_to") else { return nil }
        var texts: [String] = []
        if let one = value.stringValue {
            texts = [one]
        } else if let list = value.arrayValue {
            for element in list {
                guard let text = element.stringValue else {
                    throw .invalidParams(
                        "\"encrypt_to\" must be an age recipient (\"age1…\") or an array of them, not an array holding \(element.typeName)")
                }
                texts.append(text)
            }
        } else {
            throw .invalidParams("\"encrypt_to\" must be an age recipient (\"age1…\") or an array of them, not \(value.typeName)")
        }
        let recipients: [AgeRecipient]
        switch AgeRecipient.parseList(texts) {
        case .success(let parsed): recipients = parsed
        case .failure(let error): throw error
        }
        for recipient in recipients {
            if let problem = AgeEncryptor.check(recipient) {
                throw .invalidParams("\"encrypt_to\": \(recipient.text) cannot be encrypted to: \(problem.error.message)")
            }
        }
        return recipients.map(\.text)
    }

    /// `segments`: ranges fetched at once for this job (1 turns segmented downloads off).
    private func segments(_ params: Params) throws(DLError) -> Int? {
        try params.int("segments", in: 1...16).map(Int.init)
    }

    /// `ca_file`, `ca_dir`, `client_cert`, `client_key`: absolute paths to files dld can read
    /// and that hold what they should, checked now so that a typo fails the `enqueue` and not
    /// the job hours later. They are read again when a transfer starts.
    private func jobTLS(_ params: Params) throws(DLError) -> JobTLS? {
        let tls = JobTLS(
            caFile: try params.string("ca_file"), caDir: try params.string("ca_dir"),
            clientCert: try params.string("client_cert"), clientKey: try params.string("client_key"))
        if tls.isEmpty { return nil }
        if (tls.clientCert == nil) != (tls.clientKey == nil) {
            throw .invalidParams("give \"client_cert\" and \"client_key\" together")
        }
        let problems = [
            tls.caFile.flatMap { TLSFileCheck.certificates($0, what: "ca_file") },
            tls.caDir.flatMap { TLSFileCheck.folder($0, what: "ca_dir") },
            tls.clientCert.flatMap { TLSFileCheck.certificates($0, what: "client_cert") },
            tls.clientKey.flatMap { TLSFileCheck.privateKey($0, what: "client_key") },
        ]
        if let problem = problems.compactMap({ $0 }).first { throw .invalidParams(problem) }
        return tls
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
            guard !name.isEmpty, name.unicodeScalars.allSatisfy(Self.tokenCharacters.contains) else {
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

// MARK: set_speed, change

extension Dispatcher {
    /// `max_speed`: bytes per second, 0…1 TiB; 0 is no limit. Nil when absent or null.
    static func rate(_ params: Params) throws(DLError) -> Int64? {
        try params.int("max_speed", in: 0...(1 << 40))
    }

    /// The global limit as `stats` and `set_speed` show it.
    /// `stats.lease`: a worker of a shared table's leases and fence.
    static func leaseReply(_ lease: Engine.LeaseView) -> JSONValue {
        [
            "seconds": .double(lease.seconds),
            "renewed_at": lease.renewedAt.map(JobJSON.timestamp) ?? .null,
            "fenced": .bool(lease.fencedSince != nil),
            "fenced_since": lease.fencedSince.map(JobJSON.timestamp) ?? .null,
            "fences": .int(Int64(lease.fences)),
            "clock_skew": .double((lease.clockSkew * 1000).rounded() / 1000),
        ]
    }

    static func speedReply(_ view: Engine.SpeedView) -> JSONValue {
        [
            "limit": .int(view.limit),
            "source": .string(view.source),
            "config": .int(view.maxSpeed),
            "schedule": view.schedule.isEmpty ? .null : .string(view.schedule),
            "next_change_at": view.nextChange.map(JobJSON.timestamp) ?? .null,
        ]
    }

    func setSpeed(_ raw: [String: JSONValue]) async throws(DLError) -> JSONValue {
        let params = try Params(raw, allowed: ["id", "global", "max_speed"])
        guard params.values.keys.contains("max_speed") else {
            throw .invalidParams(
                "missing param \"max_speed\" (bytes per second; 0 for no limit; null with \"global\" to go back to the config file's)")
        }
        let rate = try Self.rate(params)
        let global = try params.bool("global")
        let id = try params.int("id", in: 1...Int64.max)
        switch (id, global) {
        case (let id?, nil):
            return JobJSON.encode(try await engine.setJobSpeed(id, rate))
        case (nil, true?):
            return Self.speedReply(await engine.setGlobalSpeed(rate))
        case (nil, false?):
            throw .invalidParams("param \"global\" must be true when given")
        default:
            throw .invalidParams("give \"id\" (a job) or \"global\": true, not both")
        }
    }

    /// `change`: `url` and `headers` are checked as `enqueue` checks them, with its errors.
    func change(_ raw: [String: JSONValue]) async throws(DLError) -> JSONValue {
        let params = try Params(raw, allowed: ["id", "url", "headers"])
        guard let id = try params.int("id", in: 1...Int64.max) else { throw .invalidParams("missing param \"id\"") }
        let url = try params.string("url")
        if let url, case .failure(let error) = URLRules.checked(url) { throw error }
        let headers = params.has("headers") ? try headers(params) : nil
        guard url != nil || headers != nil else { throw .invalidParams("give \"url\", \"headers\" or both") }
        return JobJSON.encode(try await engine.change(id, url: url, headers: headers))
    }
}

// MARK: get, unpin, cache_list

extension Dispatcher {
    func requireCache() throws(DLError) -> URLCache {
        guard let cache else { throw DLError(.invalidState, "the URL cache is not available") }
        return cache
    }

    func cacheCall(_ method: RPCMethod, _ raw: [String: JSONValue]) async throws(DLError) -> JSONValue {
        switch method {
        case .get:
            let params = try Params(raw, allowed: ["url", "pin"])
            let url = try params.requiredString("url")
            let answer = try await requireCache().get(url, pin: try params.bool("pin") ?? false)
            return [
                "path": .string(answer.path), "size": .int(answer.bytes), "sha256": answer.sha256.map { .string($0) } ?? .null,
                "source": .string(answer.source.rawValue), "job": answer.jobID.map { .int($0) } ?? .null,
                "pinned": .bool(answer.pinned), "fresh_until": JobJSON.timestamp(answer.freshUntil),
            ]
        case .unpin:
            let params = try Params(raw, allowed: ["url"])
            let found = try await requireCache().unpin(try params.requiredString("url"))
            return ["cached": .bool(found)]
        default:
            _ = try Params(raw, allowed: [])
            let entries = try await requireCache().list()
            return [
                "entries": .array(
                    entries.map { item -> JSONValue in
                        [
                            "url": .string(URLRules.redacted(item.entry.url)), "path": .string(item.entry.path),
                            "size": .int(item.entry.bytes), "pinned": .bool(item.entry.pinned), "in_use": .bool(item.held),
                            "last_used": JobJSON.timestamp(item.entry.lastUsed), "fresh_until": JobJSON.timestamp(item.freshUntil),
                        ]
                    })
            ]
        }
    }

    /// `stats.cache`: counters since dld started, and what the cache holds now.
    func cacheStats() async -> JSONValue {
        guard let cache else { return .null }
        let stats = await cache.stats()
        return [
            "available": .bool(stats.available), "hits": .int(Int64(stats.hits)), "misses": .int(Int64(stats.misses)),
            "revalidations": .int(Int64(stats.revalidations)), "bytes": .int(stats.bytes), "entries": .int(Int64(stats.entries)),
            "pinned": .int(Int64(stats.pinned)), "max_bytes": .int(stats.maxBytes),
        ]
    }
}
