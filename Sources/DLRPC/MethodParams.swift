import DLCore
import Foundation

/// Limits on what one request may ask for (docs/protocol.md, "Limits").
public struct RPCLimits: Sendable {
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

/// A method's params as a value. The daemon decodes a request into it once (`init(decoding:)`,
/// every check and error of the method there); a client builds one and sends `params`. Both
/// sides use the same type, so a param's name and meaning are written once.
public protocol MethodParams: Sendable, Equatable {
    /// The names this method takes; any other is refused.
    static var keys: Set<String> { get }
    /// The names these params may use: `keys`, unless the method has forms that each take
    /// some of them (`enqueue`: a job, a batch or a group), when an error names the form's.
    static func keys(of raw: [String: JSONValue]) -> Set<String>
    init(decoding params: Params, limits: RPCLimits) throws(DLError)
    /// The params as sent on the wire.
    var params: [String: JSONValue] { get }
    /// The params object as a JSON Schema: exactly `keys` as its properties, each with its
    /// type, range and meaning (docs/protocol.md's wording), for the OpenRPC document.
    static var schema: JSONValue { get }
}

extension Schema {
    /// The params of a method that takes exactly one of several: one `required` of each.
    static func exactlyOne(_ properties: [String: JSONValue], of names: [String], required: [String] = []) -> JSONValue {
        guard case .object(var schema) = object(properties, required: required) else { return object(properties) }
        schema["oneOf"] = .array(names.map { ["required": [.string($0)]] })
        return .object(schema)
    }
}

extension MethodParams {
    public static func keys(of raw: [String: JSONValue]) -> Set<String> { keys }

    /// Decodes a request's named params: unknown names first, then each param.
    public init(_ raw: [String: JSONValue], limits: RPCLimits = RPCLimits()) throws(DLError) {
        try self.init(decoding: Params(raw, allowed: Self.keys(of: raw)), limits: limits)
    }
}

/// `stats`, `version`, `shutdown`, `cache_list`: no params.
public struct NoParams: MethodParams {
    public static let keys: Set<String> = []
    public init() {}
    public init(decoding params: Params, limits: RPCLimits) throws(DLError) {}
    public var params: [String: JSONValue] { [:] }
    public static var schema: JSONValue { Schema.object([:]) }
}

/// `pause`, `resume`, `cancel`: which jobs.
public struct SelectionParams: MethodParams {
    public static let keys: Set<String> = ["id", "ids", "all", "group"]
    public var selection: JobSelection

    public init(_ selection: JobSelection) { self.selection = selection }

    public init(decoding params: Params, limits: RPCLimits) throws(DLError) {
        selection = try params.selection()
    }

    public var params: [String: JSONValue] { selection.params }

    public static var schema: JSONValue { Schema.exactlyOne(properties, of: ["id", "ids", "all", "group"]) }

    /// `id`, `ids`, `all`, `group`: exactly one of them.
    static var properties: [String: JSONValue] {
        [
            "id": Schema.jobID.described("One job."),
            "ids": Schema.array(Schema.jobID, minItems: 1).described("Several jobs."),
            "all": Schema.constant(true).described("Every job."),
            "group": Schema.groupReference.described("Every member of a group (id or name)."),
        ]
    }
}

extension JobSelection {
    /// One id as `id`, several as `ids`.
    var params: [String: JSONValue] {
        switch self {
        case .ids(let ids) where ids.count == 1: ["id": .int(ids[0])]
        case .ids(let ids): ["ids": .array(ids.map { .int($0) })]
        case .all: ["all": true]
        case .group(let reference): ["group": reference.json]
        }
    }
}

extension GroupReference {
    var json: JSONValue {
        switch self {
        case .id(let id): .int(id)
        case .name(let name): .string(name)
        }
    }

    /// A group argument as a person types it: a number is an id, anything else a name.
    public init(argument text: String) {
        self = Int64(text).map { .id($0) } ?? .name(text)
    }
}

/// `remove`: jobs by selection (with or without their files), or finished jobs by age.
public struct RemoveParams: MethodParams {
    public static let keys: Set<String> = ["id", "ids", "all", "group", "delete_file", "finished", "failed", "older_than"]

    public enum Target: Sendable, Equatable {
        case jobs(JobSelection, deleteFile: Bool)
        /// Standalone jobs in these states (`finished`: completed and canceled; `failed`),
        /// finished at least `olderThan` seconds ago when given.
        case finished(states: [JobState], olderThan: Int64?)
    }

    public var target: Target

    public init(_ target: Target) { self.target = target }

    /// A selection (with `delete_file`), or `finished`/`failed` (with `older_than`).
    public static var schema: JSONValue {
        var properties = SelectionParams.properties
        properties["delete_file"] = Schema.boolean.described("Also delete the file of a completed job (default false).")
        properties["finished"] = Schema.boolean.described("Completed and canceled standalone jobs (instead of a selection).")
        properties["failed"] = Schema.boolean.described("Failed standalone jobs (instead of a selection).")
        properties["older_than"] = Schema.integer(min: 0, max: Int64(Int32.max)).described(
            "Only jobs that finished at least this many seconds ago (with finished or failed).")
        let byAgeNames: [JSONValue] = ["finished", "failed", "older_than"]
        let selection: [JSONValue] = ["id", "ids", "all", "group"].map {
            ["required": [.string($0)], "not": ["anyOf": .array(byAgeNames.map { ["required": [$0]] })]]
        }
        let chosen: [JSONValue] = ["finished", "failed"].map { ["properties": [$0: ["const": true]], "required": [.string($0)]] }
        let byAge: JSONValue = [
            "anyOf": .array(chosen),
            "not": ["anyOf": .array(["delete_file", "id", "ids", "all", "group"].map { ["required": [.string($0)]] })],
        ]
        guard case .object(var schema) = Schema.object(properties) else { return Schema.object(properties) }
        schema["oneOf"] = .array(selection + [byAge])
        return .object(schema)
    }

    public init(decoding params: Params, limits: RPCLimits) throws(DLError) {
        guard params.has("finished") || params.has("failed") || params.has("older_than") else {
            target = .jobs(try params.selection(), deleteFile: try params.bool("delete_file") ?? false)
            return
        }
        for key in ["id", "ids", "all", "group", "delete_file"] where params.has(key) {
            throw .invalidParams("\"\(key)\" does not go with \"finished\", \"failed\" or \"older_than\"")
        }
        var states: [JobState] = []
        if try params.bool("finished") == true { states += [.completed, .canceled] }
        if try params.bool("failed") == true { states.append(.failed) }
        guard !states.isEmpty else { throw .invalidParams("give \"finished\": true and/or \"failed\": true") }
        target = .finished(states: states, olderThan: try params.int("older_than", in: 0...Int64(Int32.max)))
    }

    public var params: [String: JSONValue] {
        switch target {
        case .jobs(let selection, let deleteFile):
            var params = selection.params
            if deleteFile { params["delete_file"] = true }
            return params
        case .finished(let states, let olderThan):
            var params: [String: JSONValue] = [:]
            if states.contains(.completed) { params["finished"] = true }
            if states.contains(.failed) { params["failed"] = true }
            if let olderThan { params["older_than"] = .int(olderThan) }
            return params
        }
    }
}

/// `status`: one job, some jobs, or a group.
public struct StatusParams: MethodParams {
    public static let keys: Set<String> = ["id", "ids", "group"]

    public enum Target: Sendable, Equatable {
        /// `id`: answered with the job itself.
        case job(JobID)
        /// `ids`: answered with `{"jobs": […]}`.
        case jobs([JobID])
        case group(GroupReference)
    }

    public var target: Target

    public init(_ target: Target) { self.target = target }

    public static var schema: JSONValue {
        Schema.exactlyOne(
            [
                "id": Schema.jobID.described("One job; the result is the job object itself."),
                "ids": Schema.array(Schema.jobID, minItems: 1).described("Several jobs; the result is {jobs}, in the order given."),
                "group": Schema.groupReference.described("A group (id or name); the result is {group, jobs}."),
            ], of: ["id", "ids", "group"])
    }

    public init(decoding params: Params, limits: RPCLimits) throws(DLError) {
        switch try params.selection() {
        case .ids(let ids) where params.has("id"): target = .job(ids[0])
        case .ids(let ids): target = .jobs(ids)
        case .group(let reference): target = .group(reference)
        case .all: throw .invalidParams("status takes \"id\", \"ids\" or \"group\"; use list for all jobs")
        }
    }

    public var params: [String: JSONValue] {
        switch target {
        case .job(let id): ["id": .int(id)]
        case .jobs(let ids): ["ids": .array(ids.map { .int($0) })]
        case .group(let reference): ["group": reference.json]
        }
    }
}

/// `list`: a page of jobs after `after_id`, or a group's members, optionally by state.
public struct ListParams: MethodParams {
    public static let keys: Set<String> = ["state", "limit", "after_id", "group"]
    public var states: [JobState]?
    public var group: GroupReference?
    /// Jobs wanted; a page holds at most `RPCLimits.maxPage` whatever this says.
    public var limit: Int?
    public var afterID: JobID = 0

    public init(states: [JobState]? = nil, group: GroupReference? = nil, limit: Int? = nil, afterID: JobID = 0) {
        self.states = states
        self.group = group
        self.limit = limit
        self.afterID = afterID
    }

    public static var schema: JSONValue {
        let state = Schema.names(JobState.allCases.map(\.rawValue))
        return Schema.object([
            "state": Schema.anyOf(state, Schema.array(state)).described("Only jobs in these states (default: all states)."),
            "limit": Schema.integer(min: 1, max: Int64(RPCLimits().maxListLimit)).described(
                "Page size (default 1000); a page holds at most \(RPCLimits().maxPage) jobs whatever the limit."),
            "after_id": Schema.integer(min: 0).described("Only jobs with a larger id (default 0)."),
            "group": Schema.groupReference.described("Only the members of this group (one page, next_after_id null)."),
        ])
    }

    public init(decoding params: Params, limits: RPCLimits) throws(DLError) {
        states = try Self.states(params)
        group = try params.groupReference()
        limit = try params.int("limit", in: 1...Int64(limits.maxListLimit)).map(Int.init)
        afterID = try params.int("after_id", in: 0...Int64.max) ?? 0
    }

    public var params: [String: JSONValue] {
        var params: [String: JSONValue] = [:]
        if let states { params["state"] = .array(states.map { .string($0.rawValue) }) }
        if let group { params["group"] = group.json }
        if let limit { params["limit"] = .int(Int64(limit)) }
        if afterID != 0 { params["after_id"] = .int(afterID) }
        return params
    }

    /// `state`: a state's name or an array of them.
    private static func states(_ params: Params) throws(DLError) -> [JobState]? {
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
}

/// `queue`: pause or resume the queue; neither: only say whether it is paused.
public struct QueueParams: MethodParams {
    public static let keys: Set<String> = ["paused"]
    public var paused: Bool?

    public init(paused: Bool?) { self.paused = paused }

    public static var schema: JSONValue {
        Schema.object(["paused": Schema.boolean.described("true pauses, false restarts; omitted, only reports.")])
    }

    public init(decoding params: Params, limits: RPCLimits) throws(DLError) {
        paused = try params.bool("paused")
    }

    public var params: [String: JSONValue] { paused.map { ["paused": .bool($0)] } ?? [:] }
}

/// `subscribe`: events of some jobs or of a group (none: all), from `since` on.
public struct SubscribeParams: MethodParams {
    public static let keys: Set<String> = ["ids", "group", "since"]
    public var ids: Set<JobID>?
    public var group: GroupReference?
    public var since: Int64?

    public init(ids: Set<JobID>? = nil, group: GroupReference? = nil, since: Int64? = nil) {
        self.ids = ids
        self.group = group
        self.since = since
    }

    public static var schema: JSONValue {
        Schema.object([
            "ids": Schema.array(Schema.jobID).described("Only events of these jobs (default: all)."),
            "group": Schema.groupReference.described("Only events of this group and its members (default: all)."),
            "since": Schema.integer(min: 0).described(
                "First replay the numbered events after this one that are still kept (the last 10000), in order."),
        ])
    }

    public init(decoding params: Params, limits: RPCLimits) throws(DLError) {
        if let list = try params.array("ids") {
            var ids: Set<JobID> = []
            for element in list {
                guard let id = element.int64Value, id >= 1 else { throw .invalidParams("param \"ids\" must be an array of job ids") }
                ids.insert(id)
            }
            self.ids = ids
        }
        group = try params.groupReference()
        since = try params.int("since", in: 0...Int64.max)
    }

    public var params: [String: JSONValue] {
        var params: [String: JSONValue] = [:]
        if let ids { params["ids"] = .array(ids.sorted().map { .int($0) }) }
        if let group { params["group"] = group.json }
        if let since { params["since"] = .int(since) }
        return params
    }
}

/// `set_speed`: a job's own limit, or the global one.
public struct SetSpeedParams: MethodParams {
    public static let keys: Set<String> = ["id", "global", "max_speed"]

    public enum Target: Sendable, Equatable {
        case job(JobID)
        case global
    }

    public var target: Target
    /// Bytes per second; 0 or nil: no limit for a job, the config file's limit for `global`.
    public var maxSpeed: Int64?

    public init(_ target: Target, maxSpeed: Int64?) {
        self.target = target
        self.maxSpeed = maxSpeed
    }

    public static var schema: JSONValue {
        Schema.exactlyOne(
            [
                "id": Schema.jobID.described("A job: its own limit, kept in its row. Not a completed or canceled job."),
                "global": Schema.constant(true).described("The limit shared by all transfers."),
                "max_speed": Schema.nullable(JobParamRules.rateSchema).described(
                    "Required. Bytes per second, 0 for no limit; with global, null goes back to the config file's max_speed "
                        + "and speed_schedule; with id, null is the same as 0."),
            ], of: ["id", "global"], required: ["max_speed"])
    }

    public init(decoding params: Params, limits: RPCLimits) throws(DLError) {
        guard params.values.keys.contains("max_speed") else {
            throw .invalidParams(
                "missing param \"max_speed\" (bytes per second; 0 for no limit; null with \"global\" to go back to the config file's)")
        }
        maxSpeed = try JobParamRules.rate(params)
        switch (try params.int("id", in: 1...Int64.max), try params.bool("global")) {
        case (let id?, nil): target = .job(id)
        case (nil, true?): target = .global
        case (nil, false?): throw .invalidParams("param \"global\" must be true when given")
        default: throw .invalidParams("give \"id\" (a job) or \"global\": true, not both")
        }
    }

    public var params: [String: JSONValue] {
        let rate: JSONValue = maxSpeed.map { .int($0) } ?? .null
        switch target {
        case .job(let id): return ["id": .int(id), "max_speed": rate]
        case .global: return ["global": true, "max_speed": rate]
        }
    }
}

/// `change`: a job's new URL and/or headers, checked as `enqueue` checks them.
public struct ChangeParams: MethodParams {
    public static let keys: Set<String> = ["id", "url", "headers"]
    public var id: JobID
    public var url: String?
    public var headers: [HeaderField]?

    public init(id: JobID, url: String? = nil, headers: [HeaderField]? = nil) {
        self.id = id
        self.url = url
        self.headers = headers
    }

    public static var schema: JSONValue {
        guard
            case .object(var schema) = Schema.object(
                [
                    "id": Schema.jobID.described("Required. A job that is not completed or canceled."),
                    "url": JobParamRules.urlSchema.described("The new URL; checked as at enqueue."),
                    "headers": JobParamRules.headersSchema.described(
                        "The new headers, name → value, checked as at enqueue; they replace all the job's headers ({} removes them)."),
                ], required: ["id"])
        else { return Schema.any }
        schema["anyOf"] = [["required": ["url"]], ["required": ["headers"]]]
        return .object(schema)
    }

    public init(decoding params: Params, limits: RPCLimits) throws(DLError) {
        guard let id = try params.int("id", in: 1...Int64.max) else { throw .invalidParams("missing param \"id\"") }
        self.id = id
        url = try params.string("url")
        if let url, case .failure(let error) = URLRules.checked(url) { throw error }
        headers = params.has("headers") ? try JobParamRules.headers(params, limits: limits) : nil
        guard url != nil || headers != nil else { throw .invalidParams("give \"url\", \"headers\" or both") }
    }

    public var params: [String: JSONValue] {
        var params: [String: JSONValue] = ["id": .int(id)]
        if let url { params["url"] = .string(url) }
        if let headers { params["headers"] = JobParamRules.json(headers) }
        return params
    }
}

/// `get`: a cached copy of a URL, kept until `unpin` when `pin`.
public struct GetParams: MethodParams {
    public static let keys: Set<String> = ["url", "pin"]
    public var url: String
    public var pin = false

    public init(url: String, pin: Bool = false) {
        self.url = url
        self.pin = pin
    }

    public static var schema: JSONValue {
        Schema.object(
            [
                "url": JobParamRules.urlSchema.described("Required. An absolute http or https URL (checked as at enqueue)."),
                "pin": Schema.boolean.described("Keep the copy whatever the cache's budgets, until unpin (default false)."),
            ], required: ["url"])
    }

    public init(decoding params: Params, limits: RPCLimits) throws(DLError) {
        url = try params.requiredString("url")
        pin = try params.bool("pin") ?? false
    }

    public var params: [String: JSONValue] { pin ? ["url": .string(url), "pin": true] : ["url": .string(url)] }
}

/// `unpin`: lets the cache evict a URL again.
public struct UnpinParams: MethodParams {
    public static let keys: Set<String> = ["url"]
    public var url: String

    public init(url: String) { self.url = url }

    public static var schema: JSONValue {
        Schema.object(
            ["url": Schema.string().described("Required. A URL given to get (any spelling with the same normalized form).")],
            required: ["url"])
    }

    public init(decoding params: Params, limits: RPCLimits) throws(DLError) {
        url = try params.requiredString("url")
    }

    public var params: [String: JSONValue] { ["url": .string(url)] }
}
