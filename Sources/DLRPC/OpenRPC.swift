import DLCore

/// The protocol as an OpenRPC 1.3 document (https://spec.open-rpc.org), built from the method
/// table: each `RPCMethod` with its summary, its params type's schema, its result's schema and
/// its errors. The daemon answers `rpc.discover` with it; any other transport may serve the
/// same value. Nothing here is written twice: a method, a param or a state added to the code
/// shows up in the document.
public enum OpenRPC {
    /// The OpenRPC version the document follows.
    public static let version = "1.3.2"

    public static var document: JSONValue {
        [
            "openrpc": .string(version),
            "info": [
                "title": "dld",
                "version": .string(String(DLDVersion.protocolVersion)),
                "description": .string(
                    "The control protocol of dld \(DLDVersion.current) (protocol \(DLDVersion.protocolVersion)): JSON-RPC 2.0, one "
                        + "JSON text a line, over a Unix stream socket; see docs/protocol.md. Params are named only; unknown "
                        + "params are refused. Every error carries data.code, a stable snake_case string. Errors any method can "
                        + "return: \(Self.anyMethodErrors.map(\.rawValue).joined(separator: ", "))."),
            ],
            "methods": .array(RPCMethod.allCases.map(method)),
            "components": [
                "schemas": .object(schemas),
                "errors": .object(Dictionary(uniqueKeysWithValues: DLError.Code.allCases.map { ($0.rawValue, error($0)) })),
            ],
        ]
    }

    /// Errors any method can return, besides its own (docs/protocol.md, "Methods").
    public static let anyMethodErrors: [DLError.Code] = [
        .parseError, .invalidRequest, .lineTooLong, .methodNotFound, .invalidParams, .storageError, .internalError,
    ]

    static func method(_ method: RPCMethod) -> JSONValue {
        let params = method.params.schema.objectValue ?? [:]
        let properties = params["properties"]?.objectValue ?? [:]
        let required = Set(params["required"]?.arrayValue?.compactMap(\.stringValue) ?? [])
        var object: [String: JSONValue] = [
            "name": .string(method.rawValue),
            "summary": .string(method.summary),
            "paramStructure": "by-name",
            "params": .array(
                properties.keys.sorted().map { name in
                    let schema = properties[name] ?? Schema.any
                    var descriptor: [String: JSONValue] = ["name": .string(name), "required": .bool(required.contains(name))]
                    descriptor["schema"] = schema
                    if let description = schema["description"] { descriptor["description"] = description }
                    return .object(descriptor)
                }),
            "result": ["name": .string(method.rawValue + "_result"), "schema": method.result],
            // The whole params object, with the rules between params (exactly one of `id`,
            // `ids`, …) that a list of params cannot say.
            "x-params-schema": method.params.schema,
        ]
        if method == .subscribe {
            // The notifications that follow its reply, by method name: their params' schemas.
            object["x-notifications"] = .object(notifications.mapValues { Schema.ref($0) })
        }
        let errors = method.errors
        if !errors.isEmpty { object["errors"] = .array(errors.map { ["$ref": .string("#/components/errors/\($0.rawValue)")] }) }
        return .object(object)
    }

    static func error(_ code: DLError.Code) -> JSONValue {
        [
            "code": .int(Int64(code.rpcCode)), "message": .string(code.rawValue.replacingOccurrences(of: "_", with: " ")),
            "data": ["code": .string(code.rawValue)],
        ]
    }

    /// The schemas results refer to by name.
    static var schemas: [String: JSONValue] {
        [
            "Job": job, "Group": group, "JobError": jobError, "Bulk": bulk, "Speed": speed, "Stats": stats,
            "JobStateEvent": event(states: JobState.allCases.map(\.rawValue)),
            "JobRemovedEvent": event(states: ["removed"]),
            "GroupStateEvent": event(states: GroupState.allCases.map(\.rawValue)),
            "JobProgressEvent": Schema.record([
                "id": Schema.jobID, "group": Schema.nullable(Schema.jobID), "received": Schema.integer(min: 0),
                "size": Schema.nullable(Schema.integer(min: 0)), "speed": Schema.integer(min: 0),
            ]).described("Params of job.progress: live counters of a running job, at most twice a second; not numbered."),
            "EventsOverflowEvent": Schema.record(["message": Schema.string()]).described(
                "Params of events.overflow: the subscriber fell 10000 events behind; the connection is then closed."),
        ]
    }

    /// The notifications `subscribe` sends, by method name, and their params' schema.
    public static let notifications: [String: String] = [
        "job.state": "JobStateEvent", "job.removed": "JobRemovedEvent", "group.state": "GroupStateEvent",
        "job.progress": "JobProgressEvent", "events.overflow": "EventsOverflowEvent",
    ]

    static var jobError: JSONValue {
        Schema.record([
            "code": Schema.names(JobErrorCode.documented.map(\.rawValue)), "message": Schema.string(),
        ]).described("A job's last problem; code is one of docs/protocol.md's job error codes.")
    }

    /// The job object (`JobJSON`): every member, always.
    static var job: JSONValue {
        let nullableString = Schema.nullable(Schema.string())
        let hex = Schema.string(pattern: "^[0-9a-f]+$")
        return Schema.record([
            "id": Schema.jobID,
            "url": Schema.string().described("The URL as enqueued; a password in it is shown as ***."),
            "path": Schema.string().described("Absolute path of the destination file."),
            "name": Schema.string().described("Last component of path."),
            "state": Schema.names(JobState.allCases.map(\.rawValue)),
            "wait_reason": Schema.nullable(Schema.names(WaitReason.allCases.map(\.rawValue))).described("When waiting: why."),
            "worker": nullableString.described("When running: the worker id of the daemon that runs it."),
            "stop_request": Schema.nullable(Schema.names(["pause", "cancel", "remove"])).described(
                "When running under another worker: the command sent to it, which that worker carries out."),
            "priority": Schema.integer(min: -1000, max: 1000),
            "size": Schema.nullable(Schema.integer(min: 0)).described("Total bytes; null while unknown."),
            "received": Schema.integer(min: 0).described("Bytes downloaded."),
            "mirrors": Schema.nullable(
                Schema.array(Schema.record(["url": Schema.string(), "dropped": nullableString]), minItems: 2)
            ).described("Every URL of the file, the job's own first, each {url, dropped}; null without mirrors."),
            "pieces": Schema.nullable(
                Schema.record([
                    "type": Schema.names(DigestAlgorithm.allCases.map(\.rawValue)), "length": Schema.integer(min: 1),
                    "count": Schema.integer(min: 0),
                ])
            ).described("A Metalink's piece hashes: their type, piece length and count; each piece is checked as it lands."),
            "ranges": Schema.nullable(Schema.array(Schema.tuple(Array(repeating: Schema.integer(min: 0), count: 3)))).described(
                "A segmented download's committed ranges, [start, done, end] each."),
            "progress": Schema.nullable(Schema.number(min: 0)).described(
                "received / size rounded to 3 decimals; null while the size is unknown."),
            "speed": Schema.integer(min: 0).described("Bytes per second over about the last second; 0 unless running."),
            "attempts": Schema.integer(min: 0),
            "error": Schema.nullable(Schema.ref("JobError")),
            "created_at": Schema.timestamp,
            "updated_at": Schema.timestamp,
            "finished_at": Schema.nullable(Schema.timestamp),
            "next_attempt_at": Schema.nullable(Schema.timestamp),
            "key": nullableString,
            "meta": Schema.any.described("The client's meta value, returned as given; null without one."),
            "headers": Schema.array(Schema.record(["name": Schema.string(), "value": Schema.string()])).described(
                "The extra request headers; credentials' values are shown as <redacted>."),
            "group": Schema.nullable(Schema.jobID).described("The group this job is a member of."),
            "insecure": Schema.boolean,
            "metered": Schema.nullable(Schema.boolean),
            "tls": Schema.nullable(
                Schema.record([
                    "ca_file": nullableString, "ca_dir": nullableString, "client_cert": nullableString, "client_key": nullableString,
                ])),
            "overwrite": Schema.boolean,
            "max_speed": Schema.nullable(JobParamRules.rateSchema),
            "final_url": nullableString,
            "checksum": Schema.nullable(Schema.string(pattern: "^[a-z0-9]+:[0-9a-f]+$")),
            "sha256": Schema.nullable(Schema.string(pattern: "^[0-9a-f]{64}$")),
            "digest": Schema.nullable(hex),
            "encrypt_to": Schema.nullable(Schema.array(Schema.string(), minItems: 1)),
        ]).described("A job (docs/protocol.md, \"The job object\").")
    }

    /// The group object (`JobJSON.encodeGroup`).
    static var group: JSONValue {
        Schema.record([
            "id": Schema.integer(min: 1), "name": Schema.string(), "dir": Schema.string(),
            "state": Schema.names(GroupState.allCases.map(\.rawValue)),
            "members": Schema.integer(min: 0), "members_done": Schema.integer(min: 0),
            "bytes_done": Schema.integer(min: 0), "bytes_total": Schema.nullable(Schema.integer(min: 0)),
            "error": Schema.nullable(Schema.record(["code": Schema.string(), "message": Schema.string()])),
            "created_at": Schema.timestamp, "finished_at": Schema.nullable(Schema.timestamp),
            "hls": Schema.nullable(
                Schema.record([
                    "layout": Schema.names(HLSLayout.allCases.map(\.rawValue)), "container": Schema.names(["ts", "mp4"]),
                    "segments": Schema.integer(min: 1), "live": Schema.boolean,
                    "variant": Schema.nullable(
                        Schema.record([
                            "index": Schema.nullable(Schema.integer(min: 0)), "bandwidth": Schema.integer(min: 0),
                            "width": Schema.nullable(Schema.integer(min: 0)), "height": Schema.nullable(Schema.integer(min: 0)),
                            "codecs": Schema.nullable(Schema.string()),
                        ])),
                ])),
        ]).described("A group (docs/protocol.md, \"Groups\").")
    }

    /// The reply of `pause`, `resume`, `cancel`.
    static var bulk: JSONValue {
        Schema.record(bulkProperties).described(
            "How many jobs changed, the smallest of their ids (at most 1000), and whether there are others.")
    }

    static var bulkProperties: [String: JSONValue] {
        [
            "count": Schema.integer(min: 0), "ids": Schema.array(Schema.jobID, maxItems: 1000), "more": Schema.boolean,
            "requested": Schema.integer(min: 0).described(
                "Jobs running under other workers (a shared table): the command is sent to each, which carries it out within moments."),
        ]
    }

    /// The global speed limit (`stats.max_speed`, `set_speed` with `global`).
    static var speed: JSONValue {
        Schema.record([
            "limit": Schema.integer(min: 0).described("Bytes per second in force now; 0: none."),
            "source": Schema.names(["set_speed", "schedule", "max_speed"]).described("Which setting gives it."),
            "config": Schema.integer(min: 0).described("The config file's max_speed."),
            "schedule": Schema.nullable(Schema.string()).described("The config file's speed_schedule, normalized."),
            "next_change_at": Schema.nullable(Schema.timestamp),
        ])
    }

    static var stats: JSONValue {
        let count = Schema.integer(min: 0)
        let counts = Schema.record(Dictionary(uniqueKeysWithValues: JobState.allCases.map { ($0.rawValue, count) }))
        let lease = Schema.record([
            "seconds": Schema.number(min: 0), "renewed_at": Schema.nullable(Schema.timestamp), "fenced": Schema.boolean,
            "fenced_since": Schema.nullable(Schema.timestamp), "fences": count, "clock_skew": Schema.number(),
        ])
        let cache = Schema.record([
            "available": Schema.boolean, "hits": count, "misses": count, "revalidations": count, "bytes": count,
            "entries": count, "pinned": count, "max_bytes": count,
        ])
        return Schema.record([
            "counts": counts.described("Number of jobs in each state (every state is present)."),
            "total": count, "active": count, "speed": count, "max_active": count, "accepting": Schema.boolean,
            "uptime": count, "queue_paused": Schema.boolean, "queue_paused_reason": Schema.nullable(Schema.string()),
            "worker": Schema.string(), "database_bytes": count, "max_speed": Schema.ref("Speed"),
            "cache": Schema.nullable(cache).described("The URL cache; null when the daemon has none."),
            "workers": Schema.array(Schema.record(["id": Schema.string(), "seen_at": Schema.timestamp])),
            "lease": Schema.nullable(lease).described("With a shared PostgreSQL table, this worker's leases; null with SQLite."),
            "table_unreachable": Schema.nullable(Schema.string()),
        ])
    }

    /// A numbered event's params (`JobJSON.encodeEvent`).
    static func event(states: [String]) -> JSONValue {
        Schema.record([
            "seq": Schema.integer(min: 1), "at": Schema.timestamp, "id": Schema.nullable(Schema.jobID),
            "group": Schema.nullable(Schema.jobID), "state": Schema.names(states),
            "wait_reason": Schema.nullable(Schema.names(WaitReason.allCases.map(\.rawValue))),
            "error": Schema.nullable(Schema.record(["code": Schema.string(), "message": Schema.string()])),
        ])
    }
}

extension RPCMethod {
    /// The schema of the method's result.
    public var result: JSONValue {
        let created = Schema.record(["id": Schema.jobID, "created": Schema.boolean, "path": Schema.string()])
        switch self {
        case .enqueue:
            return Schema.anyOf(
                Schema.record(["job": Schema.ref("Job"), "created": Schema.boolean]),
                Schema.record(["count": Schema.integer(min: 1), "created": Schema.integer(min: 0), "results": Schema.array(created)]),
                Schema.record(["group": Schema.ref("Group"), "count": Schema.integer(min: 1), "results": Schema.array(created)]))
        case .pause, .resume, .cancel: return Schema.ref("Bulk")
        case .remove:
            var properties = OpenRPC.bulkProperties
            properties["removed"] = Schema.array(Schema.jobID, maxItems: 1000).described("The same ids (protocol 1 answered with it).")
            return Schema.record(properties)
        case .status:
            return Schema.anyOf(
                Schema.ref("Job"), Schema.record(["jobs": Schema.array(Schema.ref("Job"))]),
                Schema.record(["group": Schema.ref("Group"), "jobs": Schema.array(Schema.ref("Job"))]))
        case .list:
            return Schema.record([
                "jobs": Schema.array(Schema.ref("Job"), maxItems: RPCLimits().maxPage),
                "next_after_id": Schema.nullable(Schema.jobID).described("Null on the last page; else pass it as after_id."),
            ])
        case .stats: return Schema.ref("Stats")
        case .queue: return Schema.record(["paused": Schema.boolean, "reason": Schema.nullable(Schema.string())])
        case .subscribe:
            return Schema.record(["seq": Schema.integer(min: 0)]).described(
                "The number of the last event committed before the stream starts; then notifications follow "
                    + "(x-notifications: each method's params).")
        case .version: return Schema.record(["version": Schema.string(), "protocol": Schema.integer(min: 1)])
        case .shutdown: return Schema.record(["ok": Schema.constant(true)])
        case .setSpeed: return Schema.anyOf(Schema.ref("Job"), Schema.ref("Speed"))
        case .change: return Schema.ref("Job")
        case .get:
            return Schema.record([
                "path": Schema.string(), "size": Schema.integer(min: 0),
                "sha256": Schema.nullable(Schema.string(pattern: "^[0-9a-f]{64}$")),
                "source": Schema.names(["hit", "download", "revalidated", "stale"]),
                "job": Schema.nullable(Schema.jobID).described("The job that downloaded it, for download."),
                "pinned": Schema.boolean, "fresh_until": Schema.timestamp,
            ])
        case .unpin: return Schema.record(["cached": Schema.boolean])
        case .cacheList:
            let entry = Schema.record([
                "url": Schema.string(), "path": Schema.string(), "size": Schema.integer(min: 0), "pinned": Schema.boolean,
                "in_use": Schema.boolean, "last_used": Schema.timestamp, "fresh_until": Schema.timestamp,
            ])
            return Schema.record(["entries": Schema.array(entry)]).described("Least recently used first.")
        case .discover:
            let versionPattern = "^" + OpenRPC.version.split(separator: ".").prefix(2).joined(separator: "\\.") + "\\.[0-9]+$"
            return Schema.object(
                [
                    "openrpc": Schema.string(pattern: versionPattern), "info": Schema.record([:]).opened(),
                    "methods": Schema.array(Schema.object([:]).opened()), "components": Schema.object([:]).opened(),
                ], required: ["openrpc", "info", "methods"]
            ).opened().described("An OpenRPC document.")
        }
    }

    /// The method's own errors, besides `OpenRPC.anyMethodErrors` (docs/protocol.md, each
    /// method's "Errors"), with `invalid_params` for every method that takes params.
    public var errors: [DLError.Code] {
        switch self {
        case .enqueue:
            [
                .invalidParams, .invalidURL, .destinationInvalid, .destinationExists, .destinationNotAllowed, .queueFull, .shuttingDown,
                .hlsInvalid, .hlsUnsupportedEncryption, .hlsLive, .hlsUnsupported, .hlsFetchFailed,
                .invalidMetalink,
            ]
        case .pause, .resume, .cancel: [.invalidParams, .jobNotFound, .invalidState, .groupNotFound, .shuttingDown]
        case .remove: [.invalidParams, .jobNotFound, .groupNotFound, .shuttingDown]
        case .status: [.invalidParams, .jobNotFound, .groupNotFound]
        case .list: [.invalidParams, .groupNotFound]
        case .subscribe: [.invalidParams, .invalidRequest, .groupNotFound]
        case .queue: [.invalidParams]
        case .setSpeed: [.invalidParams, .jobNotFound, .invalidState, .shuttingDown]
        case .change: [.invalidParams, .invalidURL, .jobNotFound, .invalidState, .shuttingDown]
        case .get:
            [.invalidParams, .invalidURL, .downloadFailed, .invalidState, .shuttingDown, .storageError, .queueFull, .destinationInvalid]
        case .unpin: [.invalidParams, .invalidURL, .invalidState]
        case .cacheList: [.invalidState]
        case .stats, .version, .shutdown, .discover: []
        }
    }
}

extension JSONValue {
    /// An object schema that allows members it does not name (`additionalProperties` dropped).
    func opened() -> JSONValue {
        guard case .object(var object) = self else { return self }
        object["additionalProperties"] = nil
        return .object(object)
    }
}
