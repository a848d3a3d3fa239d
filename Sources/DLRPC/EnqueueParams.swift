import DLCore
import Dispatch
import Foundation
import Synchronization

/// `enqueue`: one job, a batch (`jobs`), or a group (`group` and its `jobs`). Every form checks
/// a job's params with the same rules (`JobParamRules`); what needs the daemon's filesystem
/// (TLS files, age recipients' keys) is checked by the daemon after decoding.
public enum EnqueueParams: MethodParams {
    case job(EnqueueSpec)
    case jobs([EnqueueSpec])
    case group(GroupEnqueue)
    // Metalink: the document inline or a `.meta4`/`.metalink` URL (EnqueueParams+Metalink.swift).
    case metalink(MetalinkEnqueue)

    /// All names `enqueue` takes in one of its forms; each form refuses the others' names.
    public static let keys = jobKeys.union(GroupEnqueue.keys).union(MetalinkEnqueue.keys)

    /// The params of one job, alone or in `jobs`.
    public static let jobKeys: Set<String> = [
        "url", "path", "dir", "name", "priority", "key", "meta", "headers", "overwrite", "paused", "checksum", "size",
        "on_exists", "insecure", "ca_file", "ca_dir", "client_cert", "client_key", "max_speed", "segments", "metered",
        "mirrors", "encrypt_to", "kind", "max_height", "max_bandwidth", "variant", "hls_layout", "live",
    ]

    /// The params only an HLS download takes.
    static let hlsKeys: Set<String> = ["max_height", "max_bandwidth", "variant", "hls_layout", "live"]
    /// The params of a job that an HLS download does not take: it is a group of many files.
    static let notForHLS: [String] = ["key", "meta", "checksum", "size", "mirrors", "max_speed", "encrypt_to", "on_exists"]

    /// The form's names: `group` makes a group, `jobs` a batch, anything else one job.
    public static func keys(of raw: [String: JSONValue]) -> Set<String> {
        if MetalinkEnqueue.applies(raw) { return MetalinkEnqueue.keys }
        return raw["group"] != nil ? GroupEnqueue.keys : raw["jobs"] != nil ? ["jobs"] : jobKeys
    }

    public init(decoding params: Params, limits: RPCLimits) throws(DLError) {
        if MetalinkEnqueue.applies(params.values) {
            self = .metalink(try MetalinkEnqueue(params, limits: limits))
        } else if params.values["group"] != nil {
            self = .group(try GroupEnqueue(params, limits: limits))
        } else if params.values["jobs"] != nil {
            self = .jobs(try Self.jobs(try JobParamRules.list(params, limits: limits), limits: limits))
        } else {
            self = .job(try EnqueueSpec(params, limits: limits))
        }
    }

    public var params: [String: JSONValue] {
        switch self {
        case .job(let spec): spec.params
        case .jobs(let specs): ["jobs": .array(specs.map { .object($0.params) })]
        case .group(let group): group.params
        case .metalink(let metalink): metalink.params
        }
    }

    /// The jobs of a batch. A call of thousands checks its two halves at once (the checks were
    /// a large share of its time); the first job in error is named.
    static func jobs(_ list: [JSONValue], limits: RPCLimits) throws(DLError) -> [EnqueueSpec] {
        guard list.count >= 1000 else { return try jobs(list[...], limits: limits) }
        let middle = list.count / 2
        let halves = Mutex<[Result<[EnqueueSpec], DLError>?]>([nil, nil])
        DispatchQueue.concurrentPerform(iterations: 2) { half in
            let slice = half == 0 ? list[..<middle] : list[middle...]
            let result = Result { () throws(DLError) in try jobs(slice, limits: limits) }
            halves.withLock { $0[half] = result }
        }
        let (head, tail) = halves.withLock { ($0[0], $0[1]) }
        guard let head, let tail else { throw DLError(.internalError, "a half of the batch was not checked") }
        return try head.get() + tail.get()
    }

    private static func jobs(_ list: ArraySlice<JSONValue>, limits: RPCLimits) throws(DLError) -> [EnqueueSpec] {
        var specs: [EnqueueSpec] = []
        specs.reserveCapacity(list.count)
        for (index, element) in zip(list.indices, list) {
            guard let object = element.objectValue else { throw .invalidParams("jobs[\(index)] must be an object") }
            do throws(DLError) {
                let spec = try EnqueueSpec(Params(object, allowed: jobKeys), limits: limits)
                if spec.isHLS {
                    throw DLError.invalidParams(
                        "an HLS playlist is enqueued alone, not in a batch (or with \"kind\": \"file\" to download the playlist itself)")
                }
                specs.append(spec)
            } catch {
                throw DLError(error.code, "jobs[\(index)]: \(error.message)")
            }
        }
        return specs
    }
}

extension EnqueueSpec {
    /// One job's params.
    init(_ params: Params, limits: RPCLimits) throws(DLError) {
        let url = try params.requiredString("url")
        self.init(url: url)
        switch URLRules.checked(url) {
        case .success(let checked): host = checked.host
        case .failure(let error): throw error
        }
        path = try params.string("path")
        dir = try params.string("dir")
        name = try params.string("name")
        priority = try JobParamRules.priority(params)
        if let key = try params.string("key") {
            guard !key.isEmpty, key.utf8.count <= 1024 else { throw .invalidParams("\"key\" must be 1 to 1024 bytes") }
            self.key = key
        }
        meta = try JobParamRules.meta(params, limits: limits)
        headers = try JobParamRules.headers(params, limits: limits)
        overwrite = try params.bool("overwrite") ?? false
        checksum = try JobParamRules.checksum(params)
        size = try JobParamRules.size(params)
        if let text = try params.string("on_exists") {
            guard let policy = ExistingFilePolicy(rawValue: text) else {
                throw .invalidParams("\"on_exists\" must be \"error\" or \"rename\", not \(text.prefix(40))")
            }
            onExists = policy
        }
        let options = try JobParamRules.options(params)
        insecure = options.insecure
        tls = options.tls
        segments = options.segments
        metered = options.metered
        encryptTo = options.encryptTo
        paused = try params.bool("paused") ?? false
        maxSpeed = try JobParamRules.rate(params)
        mirrors = try JobParamRules.mirrors(params, url: url)
        if let text = try params.string("kind") {
            guard let kind = DownloadKind(rawValue: text) else {
                throw .invalidParams("\"kind\" must be \"file\" or \"hls\", not \(text.prefix(40))")
            }
            self.kind = kind
        }
        try decodeHLS(params)
    }

    /// The HLS params, and the job params an HLS download refuses.
    private mutating func decodeHLS(_ params: Params) throws(DLError) {
        let given = EnqueueParams.hlsKeys.filter { params.value($0) != nil }
        guard isHLS else {
            if let name = given.sorted().first {
                throw .invalidParams("\"\(name)\" is for HLS playlists (kind \"hls\", or a URL ending in .m3u8)")
            }
            return
        }
        if let name = EnqueueParams.notForHLS.first(where: { params.value($0) != nil }) {
            throw .invalidParams("\"\(name)\" is not taken by an HLS download (a group of segments)")
        }
        hls.variant.maxHeight = try params.int("max_height", in: 1...1 << 20).map(Int.init)
        hls.variant.maxBandwidth = try params.int("max_bandwidth", in: 1...Int64.max)
        hls.variant.index = try params.int("variant", in: 0...Int64(HLSLimits.maxVariants - 1)).map(Int.init)
        if hls.variant.index != nil, hls.variant.maxHeight != nil || hls.variant.maxBandwidth != nil {
            throw .invalidParams("give \"variant\", or \"max_height\"/\"max_bandwidth\", not both")
        }
        if let text = try params.string("hls_layout") {
            guard let layout = HLSLayout(rawValue: text) else {
                throw .invalidParams("\"hls_layout\" must be \"file\" or \"folder\", not \(text.prefix(40))")
            }
            hls.layout = layout
        }
        hls.live = try params.bool("live") ?? false
    }

    /// The params that say this job: only what differs from the defaults.
    public var params: [String: JSONValue] {
        var params: [String: JSONValue] = ["url": .string(url)]
        if let path { params["path"] = .string(path) }
        if let dir { params["dir"] = .string(dir) }
        if let name { params["name"] = .string(name) }
        if priority != 0 { params["priority"] = .int(Int64(priority)) }
        if let key { params["key"] = .string(key) }
        if let meta, let value = try? JSONValue.parse(Data(meta.utf8)) { params["meta"] = value }
        if !headers.isEmpty { params["headers"] = JobParamRules.json(headers) }
        if overwrite { params["overwrite"] = true }
        if paused { params["paused"] = true }
        if let checksum { params["checksum"] = .string(checksum.description) }
        if let size { params["size"] = .int(size) }
        if onExists != .error { params["on_exists"] = .string(onExists.rawValue) }
        if let maxSpeed { params["max_speed"] = .int(maxSpeed) }
        if !mirrors.isEmpty { params["mirrors"] = .array(mirrors.map { .string($0.url) }) }
        JobParamRules.add(
            JobOptions(insecure: insecure, tls: tls, segments: segments, metered: metered, encryptTo: encryptTo), to: &params)
        if let kind { params["kind"] = .string(kind.rawValue) }
        if isHLS {
            if let index = hls.variant.index { params["variant"] = .int(Int64(index)) }
            if let height = hls.variant.maxHeight { params["max_height"] = .int(Int64(height)) }
            if let bandwidth = hls.variant.maxBandwidth { params["max_bandwidth"] = .int(bandwidth) }
            if hls.layout != .file { params["hls_layout"] = .string(hls.layout.rawValue) }
            if hls.live { params["live"] = true }
        }
        return params
    }
}

/// `enqueue` with `group`: a folder whose members appear together, once all are complete.
public struct GroupEnqueue: Sendable, Equatable {
    static let keys: Set<String> = [
        "group", "jobs", "priority", "headers", "overwrite", "paused", "insecure", "ca_file", "ca_dir", "client_cert", "client_key",
        "segments", "metered", "encrypt_to",
    ]
    /// A member's params: a subset of a job's, checked by the same rules.
    static let memberKeys: Set<String> = ["url", "name", "path", "checksum", "size", "meta", "mirrors"]

    public var name: String
    /// The group's folder, absolute.
    public var dir: String
    public var priority = 0
    public var headers: [HeaderField] = []
    public var overwrite = false
    public var paused = false
    /// Options every member has.
    public var options = JobOptions()
    public var members: [GroupMemberSpec]
    /// Set only by the Metalink form (the group form takes no `key`): the group's key, kept as
    /// its first member's; an enqueue with a key that exists returns that group.
    public var key: String?

    public init(name: String, dir: String, members: [GroupMemberSpec]) {
        self.name = name
        self.dir = dir
        self.members = members
    }

    init(_ params: Params, limits: RPCLimits) throws(DLError) {
        guard let groupObject = try params.object("group") else { throw .invalidParams("param \"group\" must be an object {name, dir}") }
        let group = try Params(groupObject, allowed: ["name", "dir"])
        name = try group.requiredString("name")
        guard !name.isEmpty, name.utf8.count <= 1024 else { throw .invalidParams("group \"name\" must be 1 to 1024 bytes") }
        dir = try group.requiredString("dir")
        members = []
        for (index, element) in try JobParamRules.list(params, limits: limits).enumerated() {
            do throws(DLError) {
                guard let object = element.objectValue else { throw .invalidParams("must be an object") }
                members.append(try Self.member(Params(object, allowed: Self.memberKeys), limits: limits))
            } catch {
                throw DLError(error.code, "jobs[\(index)]: \(error.message)")
            }
        }
        priority = try JobParamRules.priority(params)
        headers = try JobParamRules.headers(params, limits: limits)
        overwrite = try params.bool("overwrite") ?? false
        paused = try params.bool("paused") ?? false
        options = try JobParamRules.options(params)
    }

    private static func member(_ p: Params, limits: RPCLimits) throws(DLError) -> GroupMemberSpec {
        var member = GroupMemberSpec(url: try p.requiredString("url"))
        if case .failure(let error) = URLRules.validate(member.url) { throw error }
        let name = try p.string("name")
        let path = try p.string("path")
        if name != nil && path != nil { throw .invalidParams("give \"name\" or \"path\", not both") }
        if let name, name.contains("/") { throw .invalidParams("\"name\" must not contain \"/\"; use \"path\" for subfolders") }
        member.relativePath = path ?? name
        member.checksum = try JobParamRules.checksum(p)
        member.size = try JobParamRules.size(p)
        member.meta = try JobParamRules.meta(p, limits: limits)
        member.mirrors = try JobParamRules.mirrors(p, url: member.url)
        return member
    }

    public var params: [String: JSONValue] {
        var params: [String: JSONValue] = [
            "group": ["name": .string(name), "dir": .string(dir)],
            "jobs": .array(
                members.map { member in
                    var object: [String: JSONValue] = ["url": .string(member.url)]
                    if let path = member.relativePath { object[path.contains("/") ? "path" : "name"] = .string(path) }
                    if let checksum = member.checksum { object["checksum"] = .string(checksum.description) }
                    if let size = member.size { object["size"] = .int(size) }
                    if let meta = member.meta, let value = try? JSONValue.parse(Data(meta.utf8)) { object["meta"] = value }
                    if !member.mirrors.isEmpty { object["mirrors"] = .array(member.mirrors.map { .string($0.url) }) }
                    return .object(object)
                }),
        ]
        if priority != 0 { params["priority"] = .int(Int64(priority)) }
        if !headers.isEmpty { params["headers"] = JobParamRules.json(headers) }
        if overwrite { params["overwrite"] = true }
        if paused { params["paused"] = true }
        JobParamRules.add(options, to: &params)
        return params
    }
}

/// The rules for a job's params, one function a param, whichever form of `enqueue` (or
/// `change`, `set_speed`) gives it.
public enum JobParamRules {
    /// Mirrors a job may have: more would only be requests that compete for the same file.
    public static let maxMirrors = 16

    /// RFC 9110 token characters, the only ones allowed in a header name.
    static let tokenCharacters = CharacterSet(charactersIn: "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")

    /// `jobs`: a non-empty array of at most `maxJobsPerEnqueue`.
    static func list(_ params: Params, limits: RPCLimits) throws(DLError) -> [JSONValue] {
        guard let list = try params.array("jobs"), !list.isEmpty else { throw .invalidParams("param \"jobs\" must be a non-empty array") }
        guard list.count <= limits.maxJobsPerEnqueue else {
            throw .invalidParams("at most \(limits.maxJobsPerEnqueue) jobs per enqueue, got \(list.count)")
        }
        return list
    }

    static func priority(_ params: Params) throws(DLError) -> Int {
        Int(try params.int("priority", in: -1000...1000) ?? 0)
    }

    static func size(_ params: Params) throws(DLError) -> Int64? {
        try params.int("size", in: 0...Int64.max)
    }

    static func checksum(_ params: Params) throws(DLError) -> Checksum? {
        guard let text = try params.string("checksum") else { return nil }
        switch Checksum.parse(text) {
        case .success(let checksum): return checksum
        case .failure(let error): throw error
        }
    }

    /// `max_speed`: bytes per second, 0…1 TiB; 0 is no limit. Nil when absent or null.
    static func rate(_ params: Params) throws(DLError) -> Int64? {
        try params.int("max_speed", in: 0...(1 << 40))
    }

    /// `meta`: any JSON, kept as its text.
    static func meta(_ params: Params, limits: RPCLimits) throws(DLError) -> String? {
        guard let meta = params.value("meta") else { return nil }
        let text = meta.serializedString()
        guard text.utf8.count <= limits.maxMetaBytes else {
            throw .invalidParams("\"meta\" is \(text.utf8.count) bytes; at most \(limits.maxMetaBytes)")
        }
        return text
    }

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

    /// `headers`: an object of name → value. Names must be HTTP tokens and values one line, so
    /// that a header cannot smuggle another request.
    public static func headers(_ params: Params, limits: RPCLimits) throws(DLError) -> [HeaderField] {
        guard let object = try params.object("headers") else { return [] }
        guard object.count <= limits.maxHeaders else { throw .invalidParams("at most \(limits.maxHeaders) headers") }
        var fields: [HeaderField] = []
        var total = 0
        for (name, value) in object.sorted(by: { $0.key < $1.key }) {
            guard let text = value.stringValue else { throw .invalidParams("header \"\(name)\" must be a string") }
            guard !name.isEmpty, name.unicodeScalars.allSatisfy(tokenCharacters.contains) else {
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

    static func json(_ headers: [HeaderField]) -> JSONValue {
        var object: [String: JSONValue] = [:]
        for field in headers { object[field.name] = .string(field.value) }
        return .object(object)
    }

    /// `insecure`, the TLS files, `segments`, `metered`, `encrypt_to`: what a job and a group
    /// both take. TLS paths must come as a pair for a client certificate; whether the files
    /// hold what they should, and whether an age key works, the daemon checks.
    static func options(_ params: Params) throws(DLError) -> JobOptions {
        let tls = JobTLS(
            caFile: try params.string("ca_file"), caDir: try params.string("ca_dir"),
            clientCert: try params.string("client_cert"), clientKey: try params.string("client_key"))
        if (tls.clientCert == nil) != (tls.clientKey == nil) {
            throw .invalidParams("give \"client_cert\" and \"client_key\" together")
        }
        return JobOptions(
            insecure: try params.bool("insecure") ?? false, tls: tls.isEmpty ? nil : tls,
            segments: try params.int("segments", in: 1...16).map(Int.init), metered: try params.bool("metered"),
            encryptTo: try encryptTo(params))
    }

    public static func add(_ options: JobOptions, to params: inout [String: JSONValue]) {
        if options.insecure { params["insecure"] = true }
        if let tls = options.tls {
            for (key, value) in [
                ("ca_file", tls.caFile), ("ca_dir", tls.caDir), ("client_cert", tls.clientCert), ("client_key", tls.clientKey),
            ] {
                if let value { params[key] = .string(value) }
            }
        }
        if let segments = options.segments { params["segments"] = .int(Int64(segments)) }
        if let metered = options.metered { params["metered"] = .bool(metered) }
        if let encryptTo = options.encryptTo { params["encrypt_to"] = .array(encryptTo.map { .string($0) }) }
    }

    /// `encrypt_to`: one age recipient (`age1…`) or an array of them, each a well-formed
    /// recipient (Bech32 checksum); the daemon also checks that each key works.
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
        switch AgeRecipient.parseList(texts) {
        case .success(let recipients): return recipients.map(\.text)
        case .failure(let error): throw error
        }
    }
}

// MARK: - Schemas

extension EnqueueParams {
    /// The three forms: one job (its params), a batch (`jobs` alone), a group (`group` and `jobs`).
    public static var schema: JSONValue {
        let limits = RPCLimits()
        let group = GroupEnqueue.schema(limits)
        var properties = jobSchema(limits).objectValue?["properties"]?.objectValue ?? [:]
        for (name, value) in group.objectValue?["properties"]?.objectValue ?? [:] where properties[name] == nil {
            properties[name] = value
        }
        properties["jobs"] = Schema.array(Schema.any, minItems: 1, maxItems: limits.maxJobsPerEnqueue).described(
            "Batch form: 1…\(limits.maxJobsPerEnqueue) objects, each with a job's params (jobs takes no other param); "
                + "group form: the members {url, name or path, checksum, size, meta, mirrors}. All or nothing.")
        let batch = Schema.object(
            ["jobs": Schema.array(jobSchema(limits), minItems: 1, maxItems: limits.maxJobsPerEnqueue)], required: ["jobs"])
        let metalink = MetalinkEnqueue.schema(limits)
        let metalinkProperties: [String: JSONValue] = metalink.objectValue?["properties"]?.objectValue ?? [:]
        for (name, value) in metalinkProperties where properties[name] == nil {
            properties[name] = value
        }
        guard case .object(var schema) = Schema.object(properties) else { return Schema.any }
        schema["oneOf"] = [jobSchema(limits), batch, group, metalink]
        return .object(schema)
    }

    /// One job's params, alone or in `jobs`.
    static func jobSchema(_ limits: RPCLimits) -> JSONValue {
        var properties = JobParamRules.optionProperties
        let more: [String: JSONValue] = [
            "url": JobParamRules.urlSchema.described("Required. Absolute http or https URL with a host, at most 8192 bytes."),
            "path": Schema.string().described("Absolute destination file. Not together with dir or name."),
            "dir": Schema.string().described("Absolute destination folder (default: download_dir)."),
            "name": Schema.string(minLength: 1).described("File name in dir: not empty, no /, not . or .. (default: from the URL)."),
            "priority": JobParamRules.prioritySchema,
            "key": Schema.string(minLength: 1).described(
                "1…1024 bytes, unique among all jobs. If a job with this key exists it is returned with created: false."),
            "meta": Schema.any.described("Kept with the job and returned as given; at most \(limits.maxMetaBytes) bytes once serialized."),
            "headers": JobParamRules.headersSchema,
            "overwrite": JobParamRules.overwriteSchema,
            "paused": JobParamRules.pausedSchema,
            "checksum": JobParamRules.checksumSchema,
            "size": JobParamRules.sizeSchema,
            "on_exists": Schema.names([ExistingFilePolicy.error.rawValue, ExistingFilePolicy.rename.rawValue]).described(
                "What a taken name does: error (destination_exists) or rename (the first free `name (2).ext`, …); default error."),
            "max_speed": JobParamRules.rateSchema.described("The job's own speed limit in bytes per second; 0: none (default)."),
            "mirrors": JobParamRules.mirrorsSchema,
            "kind": Schema.names(DownloadKind.allCases.map(\.rawValue)).described(
                "file: the URL's bytes; hls: an HLS playlist whose media is downloaded and joined (default: hls when the URL's path ends in .m3u8, else file)."
            ),
            "max_height": Schema.integer(min: 1, max: 1 << 20).described("HLS: the highest variant at most this many pixels high."),
            "max_bandwidth": Schema.integer(min: 1).described("HLS: the highest variant of at most this BANDWIDTH (bits per second)."),
            "variant": Schema.integer(min: 0, max: Int64(HLSLimits.maxVariants - 1)).described(
                "HLS: this variant of the master playlist (0-based, in the playlist's order)."),
            "hls_layout": Schema.names(HLSLayout.allCases.map(\.rawValue)).described(
                "HLS: file (one NAME.ts or NAME.mp4, default) or folder (the segments and a local index.m3u8)."),
            "live": Schema.boolean.described(
                "HLS: record a live playlist (no EXT-X-ENDLIST): reloaded every target duration until its end tag; cancel publishes what was fetched."
            ),
        ]
        properties.merge(more) { _, new in new }
        return Schema.object(properties, required: ["url"])
    }
}

extension GroupEnqueue {
    /// `group`, its members as `jobs`, and the options every member has.
    static func schema(_ limits: RPCLimits) -> JSONValue {
        let member = Schema.object(
            [
                "url": JobParamRules.urlSchema.described("Required. The member's URL."),
                "name": Schema.string(minLength: 1).described("A plain file name in the group's dir."),
                "path": Schema.string(minLength: 1).described("A path relative to the group's dir (subfolders allowed, no ..)."),
                "checksum": JobParamRules.checksumSchema,
                "size": JobParamRules.sizeSchema,
                "meta": Schema.any.described("Kept with the member and returned as given."),
                "mirrors": JobParamRules.mirrorsSchema,
            ], required: ["url"])
        var properties = JobParamRules.optionProperties
        let more: [String: JSONValue] = [
            "group": Schema.object(
                [
                    "name": Schema.string(minLength: 1).described("1…1024 bytes."),
                    "dir": Schema.string().described("Absolute folder; need not exist yet, its parent must."),
                ], required: ["name", "dir"]
            ).described("Group form: the group to create, {name, dir}."),
            "jobs": Schema.array(member, minItems: 1, maxItems: limits.maxJobsPerEnqueue),
            "priority": JobParamRules.prioritySchema,
            "headers": JobParamRules.headersSchema,
            "overwrite": JobParamRules.overwriteSchema,
            "paused": JobParamRules.pausedSchema,
        ]
        properties.merge(more) { _, new in new }
        return Schema.object(properties, required: ["group", "jobs"])
    }
}

extension JobParamRules {
    static let urlSchema = Schema.string(minLength: 1, maxLength: URLRules.maxLength)
    static let rateSchema = Schema.integer(min: 0, max: 1 << 40)
    static let prioritySchema = Schema.integer(min: -1000, max: 1000).described("−1000…1000; higher starts first (default 0).")
    static let overwriteSchema = Schema.boolean.described("Replace an existing file at the destination (default false).")
    static let pausedSchema = Schema.boolean.described("Create the job paused (default false).")
    static let sizeSchema = Schema.integer(min: 0).described(
        "The expected size: the server must announce it and the file must end there, else size_mismatch.")
    static let checksumSchema = Schema.string(pattern: "^[A-Za-z0-9-]+:[0-9a-fA-F]+$").described(
        "ALGO:HEX with ALGO sha256, sha512, sha1 or md5 and the right number of hex digits; the file must match.")
    static let headersSchema = JSONValue.object([
        "type": "object", "maxProperties": .int(Int64(RPCLimits().maxHeaders)),
        "propertyNames": ["pattern": "^[!#$%&'*+.^_`|~0-9A-Za-z-]+$"],
        "additionalProperties": ["type": "string", "pattern": #"^[^\r\n\x00]*$"#],
    ]).described(
        "Extra request headers, name → string value: at most 64, 8192 bytes in all; Host, Range, If-Range, "
            + "Content-Length, Transfer-Encoding and Connection are refused (default {}).")
    static let mirrorsSchema = Schema.array(urlSchema, maxItems: maxMirrors).described(
        "Up to \(maxMirrors) more URLs of the same file, each checked as url is; none given twice.")

    /// What a job and a group both take: TLS, `insecure`, `segments`, `metered`, `encrypt_to`.
    static var optionProperties: [String: JSONValue] {
        let recipient = Schema.string(pattern: "^age1[02-9ac-hj-np-z]+$")
        return [
            "insecure": Schema.boolean.described("Do not verify TLS certificates (default false)."),
            "segments": Schema.integer(min: 1, max: 16).described(
                "1…16: byte ranges of the file fetched at once when the server allows it (default: the config's segments)."),
            "ca_file": Schema.string().described("Absolute path of a PEM file of certificates trusted for this job in addition to dld's."),
            "ca_dir": Schema.string().described("The same with a folder of PEM certificate files."),
            "client_cert": Schema.string().described("Absolute path of a PEM client certificate (chain); with client_key."),
            "client_key": Schema.string().described("Absolute path of its unencrypted PEM private key; with client_cert."),
            "metered": Schema.boolean.described("false: do not download while the connection is metered (default: the config's metered)."),
            "encrypt_to": Schema.anyOf(recipient, Schema.array(recipient, minItems: 1, maxItems: 16)).described(
                "One age X25519 recipient (age1…) or an array of 1…16: the file is encrypted to them and published as <name>.age."),
        ]
    }
}
