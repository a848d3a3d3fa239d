import DLCore
import Foundation

// MARK: - Metalink (enqueue's metalink form)

/// `enqueue` of a Metalink: given inline (`metalink`: the document's text, as `dlctl enqueue
/// --metalink FILE` sends it) or by a `url` whose path ends in `.meta4` or `.metalink` (the
/// daemon fetches it). One `<file>` becomes one job, several a group; see `resolved`.
public struct MetalinkEnqueue: Sendable, Equatable {
    /// Where the document comes from.
    public enum Source: Sendable, Equatable {
        /// Given inline and already read; the text is kept to say the params again.
        case document(Metalink, text: String)
        /// To be fetched by the daemon.
        case url(String)
    }

    static let keys: Set<String> = [
        "metalink", "url", "dir", "name", "priority", "key", "headers", "overwrite", "paused", "insecure", "ca_file", "ca_dir",
        "client_cert", "client_key", "segments", "metered", "encrypt_to",
    ]

    public var source: Source
    /// The folder the files land in (default: `download_dir`).
    public var dir: String?
    /// One file: its name in `dir` (default: the last part of the Metalink's name). Several:
    /// the group's name (default: the Metalink URL's file name without its suffix, else the
    /// first file's first path segment).
    public var name: String?
    public var priority = 0
    /// 1…1024 bytes: one file, its job's key; several, the group's (kept as its first member's
    /// key). A second enqueue with the key returns what the first made, with `created: false`.
    public var key: String?
    public var headers: [HeaderField] = []
    public var overwrite = false
    public var paused = false
    public var options = JobOptions()

    public init(source: Source) {
        self.source = source
    }

    /// Whether a request's params are this form: `metalink` is given, or `url` alone names a
    /// Metalink by its path (never `jobs` or `group`: their members are downloaded as named).
    static func applies(_ raw: [String: JSONValue]) -> Bool {
        if raw["metalink"] != nil { return true }
        guard raw["jobs"] == nil, raw["group"] == nil, let url = raw["url"]?.stringValue else { return false }
        return Metalink.isMetalinkURL(url)
    }

    init(_ params: Params, limits: RPCLimits) throws(DLError) {
        let text = try params.string("metalink")
        let url = try params.string("url")
        switch (text, url) {
        case (let text?, nil):
            source = .document(try MetalinkReader.parse(text), text: text)
        case (nil, let url?):
            if case .failure(let error) = URLRules.checked(url) { throw error }
            source = .url(url)
        default:
            throw .invalidParams("give \"metalink\" (the document's text) or a Metalink's \"url\", not both")
        }
        dir = try params.string("dir")
        name = try params.string("name")
        if let name, name.isEmpty || name.contains("/") || name == "." || name == ".." {
            throw .invalidParams("\"name\" must be a plain file name, not \(name.prefix(200))")
        }
        priority = try JobParamRules.priority(params)
        if let key = try params.string("key") {
            guard !key.isEmpty, key.utf8.count <= 1024 else { throw .invalidParams("\"key\" must be 1 to 1024 bytes") }
            self.key = key
        }
        headers = try JobParamRules.headers(params, limits: limits)
        overwrite = try params.bool("overwrite") ?? false
        paused = try params.bool("paused") ?? false
        options = try JobParamRules.options(params)
    }

    public var params: [String: JSONValue] {
        var params: [String: JSONValue] = [:]
        switch source {
        case .document(_, let text): params["metalink"] = .string(text)
        case .url(let url): params["url"] = .string(url)
        }
        if let dir { params["dir"] = .string(dir) }
        if let name { params["name"] = .string(name) }
        if priority != 0 { params["priority"] = .int(Int64(priority)) }
        if let key { params["key"] = .string(key) }
        if !headers.isEmpty { params["headers"] = JobParamRules.json(headers) }
        if overwrite { params["overwrite"] = true }
        if paused { params["paused"] = true }
        JobParamRules.add(options, to: &params)
        return params
    }

    /// The jobs of a read Metalink: one `<file>` is one job (`.job`), several a group in `dir`
    /// (`.group`). Each file's URLs in the order `MetalinkFile.orderedURLs` gives
    /// (`preferredLocation` is the config's `metalink_location`): the first is the job's `url`,
    /// the next 16 its `mirrors`; its strongest hash is its `checksum`, its `size` its size, and
    /// its piece hashes its `pieces`. `downloadDir` is the group's folder when `dir` is not
    /// given; `sourceURL` the Metalink's URL, for the group's default name.
    public func resolved(_ metalink: Metalink, preferredLocation: String?, downloadDir: String, sourceURL: String? = nil) -> EnqueueParams {
        func urls(_ file: MetalinkFile) -> (url: String, mirrors: [JobMirror]) {
            let ordered = file.orderedURLs(preferredLocation: preferredLocation, limit: 1 + JobParamRules.maxMirrors)
            return (ordered.first ?? "", ordered.dropFirst().map { JobMirror(url: $0) })
        }
        if metalink.files.count == 1, let file = metalink.files.first {
            let (url, mirrors) = urls(file)
            var spec = EnqueueSpec(url: url)
            spec.host = URLRules.hostKey(url)
            spec.dir = dir
            spec.name = name ?? file.name.split(separator: "/").last.map(String.init)
            spec.priority = priority
            spec.key = key
            spec.headers = headers
            spec.overwrite = overwrite
            spec.paused = paused
            spec.checksum = file.checksum
            spec.size = file.size
            spec.mirrors = mirrors
            spec.pieces = file.pieces
            spec.insecure = options.insecure
            spec.tls = options.tls
            spec.segments = options.segments
            spec.metered = options.metered
            spec.encryptTo = options.encryptTo
            return .job(spec)
        }
        let members = metalink.files.map { file in
            let (url, mirrors) = urls(file)
            var member = GroupMemberSpec(url: url)
            member.relativePath = file.name
            member.checksum = file.checksum
            member.size = file.size
            member.mirrors = mirrors
            member.pieces = file.pieces
            return member
        }
        var group = GroupEnqueue(name: name ?? Self.defaultName(metalink, sourceURL: sourceURL), dir: dir ?? downloadDir, members: members)
        group.priority = priority
        group.key = key
        group.headers = headers
        group.overwrite = overwrite
        group.paused = paused
        group.options = options
        return .group(group)
    }

    /// A group's name when the request gives none.
    static func defaultName(_ metalink: Metalink, sourceURL: String?) -> String {
        if let sourceURL {
            var name = FileNames.fromURL(sourceURL)
            for suffix in [".meta4", ".metalink"] where name.lowercased().hasSuffix(suffix) { name.removeLast(suffix.count) }
            if !name.isEmpty { return name }
        }
        return metalink.files.first.flatMap { $0.name.split(separator: "/").first.map(String.init) } ?? "metalink"
    }

    /// The form's schema: `metalink` required (a `url` alone is the job form's, read as a
    /// Metalink by its suffix).
    static func schema(_ limits: RPCLimits) -> JSONValue {
        var properties = JobParamRules.optionProperties
        let more: [String: JSONValue] = [
            "metalink": Schema.string(minLength: 1).described(
                "Metalink form: the text of a Metalink 4 (RFC 5854) or 3 document. One <file> becomes a job, several a group in dir."),
            "dir": Schema.string().described("Absolute folder the files land in (default: download_dir)."),
            "name": Schema.string(minLength: 1).described("One file: its name in dir; several: the group's name."),
            "priority": JobParamRules.prioritySchema,
            "key": Schema.string(minLength: 1).described(
                "1…1024 bytes: the job's key (one file) or the group's (several); an enqueue with a key that exists returns what it made, created: false."
            ),
            "headers": JobParamRules.headersSchema,
            "overwrite": JobParamRules.overwriteSchema,
            "paused": JobParamRules.pausedSchema,
        ]
        properties.merge(more) { _, new in new }
        return Schema.object(properties, required: ["metalink"])
    }
}
