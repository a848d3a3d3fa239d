import DLCore
import DLRPC
import Foundation

// MARK: - aria2's methods as dld's

extension Aria2RPC {
    /// `addUri(uris, options, position)`: one file; its URIs after the first are its mirrors
    /// (a URI given twice counts once).
    func addUri(_ params: Aria2Params) async throws(Aria2Error) -> JSONValue {
        var uris: [String] = []
        for value in try params.array(0) {
            guard let uri = value.stringValue else { throw Aria2Error("The parameter at 0 has wrong type.") }
            if !uris.contains(uri) { uris.append(uri) }
        }
        guard let url = uris.first else { throw Aria2Error("URI is not provided.") }
        try Self.noPosition(params, 2)
        var request = try Aria2Options.enqueueParams(params.object(1) ?? [:], metalink: false)
        request["url"] = .string(url)
        // aria2's auto-file-renaming is true by default: a taken name gets a free one (dld's
        // own default is to refuse), unless allow-overwrite replaces the file. A front-end's
        // "restart" adds a finished download's URI again with its options. An HLS playlist
        // (a group of segments) takes no on_exists.
        if request["on_exists"] == nil, request["overwrite"] != true, !HLSRequest.looksLikePlaylist(url) {
            request["on_exists"] = "rename"
        }
        if uris.count > 1 { request["mirrors"] = .array(uris.dropFirst().map { .string($0) }) }
        guard let first = Self.jobIDs(try await dld(.enqueue, request)).first else { throw Aria2Error("dld created no download") }
        return .string(Aria2GID.gid(first))
    }

    /// `addMetalink(metalink, options, position)`: the document in base64; the GIDs of its files.
    func addMetalink(_ params: Aria2Params) async throws(Aria2Error) -> JSONValue {
        let encoded = try params.string(0)
        guard let data = Data(base64Encoded: encoded, options: .ignoreUnknownCharacters), let text = String(data: data, encoding: .utf8)
        else {
            throw Aria2Error("the Metalink must be given in base64 (of a UTF-8 document)")
        }
        try Self.noPosition(params, 2)
        var request = try Aria2Options.enqueueParams(params.object(1) ?? [:], metalink: true)
        request["metalink"] = .string(text)
        return .array(Self.jobIDs(try await dld(.enqueue, request)).map { .string(Aria2GID.gid($0)) })
    }

    /// dld orders its queue by priority then age: a position is refused rather than ignored.
    private static func noPosition(_ params: Aria2Params, _ index: Int) throws(Aria2Error) {
        if params.has(index) {
            throw Aria2Error("dld orders its queue by priority, then by age: a position cannot be given")
        }
    }

    /// The jobs an `enqueue` answered with: one job, or the members of a group.
    static func jobIDs(_ reply: JSONValue) -> [JobID] {
        if let id = reply["job"]?["id"]?.int64Value { return [id] }
        return reply["results"]?.arrayValue?.compactMap { $0["id"]?.int64Value } ?? []
    }

    /// `remove`: aria2 keeps the result as `removed`, as dld's `cancel` keeps a canceled job.
    func remove(_ id: JobID) async throws(Aria2Error) -> JSONValue {
        let state = try await job(id)["state"]?.stringValue ?? ""
        guard !["completed", "failed", "canceled"].contains(state) else {
            throw Aria2Error("Active Download not found for GID#\(Aria2GID.gid(id))")
        }
        _ = try await dld(.cancel, ["id": .int(id)], gid: id)
        return .string(Aria2GID.gid(id))
    }

    func pause(_ id: JobID) async throws(Aria2Error) -> JSONValue {
        let state = try await job(id)["state"]?.stringValue ?? ""
        guard ["queued", "running", "waiting"].contains(state) else {
            throw Aria2Error("GID#\(Aria2GID.gid(id)) cannot be paused now")
        }
        _ = try await dld(.pause, ["id": .int(id)], gid: id)
        return .string(Aria2GID.gid(id))
    }

    func unpause(_ id: JobID) async throws(Aria2Error) -> JSONValue {
        guard try await job(id)["state"]?.stringValue == "paused" else {
            throw Aria2Error("GID#\(Aria2GID.gid(id)) cannot be unpaused now")
        }
        _ = try await dld(.resume, ["id": .int(id)], gid: id)
        return .string(Aria2GID.gid(id))
    }

    /// Only paused downloads, as aria2 (dld's `resume` with `all` also retries failed ones).
    func unpauseAll() async throws(Aria2Error) -> JSONValue {
        var ids: [JobID] = []
        try await each(states: ["paused"]) { job in
            if let id = job["id"]?.int64Value { ids.append(id) }
            return true
        }
        for start in stride(from: 0, to: ids.count, by: Self.maxCalls) {
            let chunk = ids[start..<min(ids.count, start + Self.maxCalls)]
            _ = try await dld(.resume, ["ids": .array(chunk.map { .int($0) })])
        }
        return "OK"
    }

    func removeResult(_ id: JobID) async throws(Aria2Error) -> JSONValue {
        let state = try await job(id)["state"]?.stringValue ?? ""
        guard ["completed", "failed", "canceled"].contains(state) else {
            throw Aria2Error("Could not remove download result of GID#\(Aria2GID.gid(id))")
        }
        _ = try await dld(.remove, ["id": .int(id)], gid: id)
        return "OK"
    }

    /// `getServers`: the URI a running download is fetched from.
    func servers(_ id: JobID) async throws(Aria2Error) -> JSONValue {
        let job = try await job(id)
        guard job["state"]?.stringValue == "running" else { throw Aria2Error("No active download for GID#\(Aria2GID.gid(id))") }
        let uri = job["url"] ?? ""
        let speed = JSONValue.string(String(job["speed"]?.int64Value ?? 0))
        return [["index": "1", "servers": [["uri": uri, "currentUri": job["final_url"] ?? uri, "downloadSpeed": speed]]]]
    }

    /// Every job in `states`, a page of `list` at a time, in id order, until `body` says stop.
    func each(states: [String], _ body: (JSONValue) throws(Aria2Error) -> Bool) async throws(Aria2Error) {
        var after: JSONValue = .int(0)
        while case .int(let last) = after {
            let page = try await dld(
                .list, ["state": .array(states.map { .string($0) }), "limit": .int(Int64(Self.maxCalls)), "after_id": .int(last)])
            for raw in page["jobs"]?.arrayValue ?? [] {
                guard try body(Self.parsed(raw)) else { return }
            }
            after = page["next_after_id"] ?? .null
        }
    }

    /// A job of a `list` page, written as text by dld, as a value.
    static func parsed(_ value: JSONValue) -> JSONValue {
        guard case .raw(let text) = value else { return value }
        return (try? JSONValue.parse(Data(text.bytes))) ?? .null
    }

    /// The offsets farthest from the end that tellWaiting and tellStopped take: a negative
    /// offset keeps the jobs behind it while the list is read.
    static let maxBackOffset: Int64 = 10_000

    /// tellActive, tellWaiting and tellStopped: `count` jobs from `offset` in id order; a
    /// negative offset counts from the end and goes backwards, as aria2 reads it.
    func tell(states: [String], offset: Int64, count: Int64, keys: Set<String>?) async throws(Aria2Error) -> JSONValue {
        guard count >= 0 else {
            throw Aria2Error("The integer parameter at 1 has invalid value: the value must be greater than or equal to 0.")
        }
        guard count > 0 else { return [] }
        let count = Int(min(count, Int64(Self.maxCalls)))
        var picked: [JSONValue] = []
        if offset >= 0 {
            var skipped: Int64 = 0
            try await each(states: states) { job in
                if skipped < offset {
                    skipped += 1
                    return true
                }
                picked.append(job)
                return picked.count < count
            }
        } else {
            guard -offset <= Self.maxBackOffset else {
                throw Aria2Error("dld reads offsets back to -\(Self.maxBackOffset) from the end, not \(offset)")
            }
            let keep = Int(-offset) + count - 1
            var window: [JSONValue] = []
            try await each(states: states) { job in
                window.append(job)
                if window.count > 2 * keep { window.removeFirst(window.count - keep) }
                return true
            }
            if window.count > keep { window.removeFirst(window.count - keep) }
            let start = window.count + Int(offset)
            if start >= 0 {
                picked = Array(window[max(0, start - count + 1)...start].reversed())
            }
        }
        return .array(picked.map { Aria2Status.encode($0, keys: keys) })
    }

    /// getOption: the options of a download that dld knows.
    static func options(_ job: JSONValue) -> JSONValue {
        let path = job["path"]?.stringValue ?? ""
        let dir = path.split(separator: "/", omittingEmptySubsequences: false).dropLast().joined(separator: "/")
        var options: [String: JSONValue] = [
            "dir": .string(dir.isEmpty ? "/" : dir),
            "out": job["name"] ?? "",
            "max-download-limit": .string(String(job["max_speed"]?.int64Value ?? 0)),
            "allow-overwrite": .string(job["overwrite"]?.boolValue == true ? "true" : "false"),
            "pause": .string(job["state"]?.stringValue == "paused" ? "true" : "false"),
        ]
        if let checksum = job["checksum"]?.stringValue, let colon = checksum.firstIndex(of: ":") {
            let name = String(checksum[..<colon]).replacingOccurrences(of: "sha", with: "sha-")
            options["checksum"] = .string(name + "=" + checksum[checksum.index(after: colon)...])
        }
        let headers = (job["headers"]?.arrayValue ?? []).compactMap { header -> String? in
            guard let name = header["name"]?.stringValue, let value = header["value"]?.stringValue else { return nil }
            return "\(name): \(value)"
        }
        if !headers.isEmpty { options["header"] = .string(headers.joined(separator: "\n")) }
        return .object(options)
    }

    /// changeUri(gid, fileIndex, delUris, addUris): dld changes a download's URL, one for another.
    func changeUri(_ params: Aria2Params) async throws(Aria2Error) -> JSONValue {
        let id = try params.gid(0)
        guard try params.int(1) == 1 else { throw Aria2Error("fileIndex is out of range: a dld download has one file, index 1") }
        let deleted = try params.array(2).compactMap(\.stringValue)
        let added = try params.array(3).compactMap(\.stringValue)
        if deleted.isEmpty && added.isEmpty { return [0, 0] }
        let current = try await job(id)["url"]?.stringValue
        guard added.count == 1, deleted.isEmpty || deleted == [current] else {
            throw Aria2Error(
                "dld changes a download's URL, one for another: give one URI to add, and none or the current one to delete")
        }
        _ = try await dld(.change, ["id": .int(id), "url": .string(added[0])], gid: id)
        return [.int(Int64(deleted.count)), 1]
    }

    /// changeOption: a download's own speed limit only.
    func changeOption(_ params: Aria2Params) async throws(Aria2Error) -> JSONValue {
        let id = try params.gid(0)
        for (name, value) in try params.object(1) ?? [:] {
            guard name == "max-download-limit" else {
                throw Aria2Error("option \(name.prefix(100)) cannot be changed by dld (only max-download-limit)")
            }
            let text = value.stringValue ?? value.int64Value.map(String.init) ?? ""
            _ = try await dld(.setSpeed, ["id": .int(id), "max_speed": .int(try Aria2Options.speed(text, option: name))], gid: id)
        }
        return "OK"
    }

    func globalOptions() async throws(Aria2Error) -> JSONValue {
        let stats = try await dld(.stats, [:])
        return [
            "dir": .string(config().downloadDir),
            "max-concurrent-downloads": .string(String(stats["max_active"]?.int64Value ?? 0)),
            "max-overall-download-limit": .string(String(stats["max_speed"]?["limit"]?.int64Value ?? 0)),
            "max-overall-upload-limit": "0",
        ]
    }

    /// changeGlobalOption: the global speed limit, live as `set_speed` does it; the options
    /// that dld reads from its config file are refused with the key to change.
    func changeGlobalOption(_ params: Aria2Params) async throws(Aria2Error) -> JSONValue {
        let options = try params.object(0) ?? [:]
        for (name, value) in options.sorted(by: { $0.key < $1.key }) {
            switch name {
            case "max-overall-download-limit":
                let text = value.stringValue ?? value.int64Value.map(String.init) ?? ""
                _ = try await dld(.setSpeed, ["global": true, "max_speed": .int(try Aria2Options.speed(text, option: name))])
            case "max-concurrent-downloads":
                throw Aria2Error("dld reads max_active from its config file: change it there and reload dld (SIGHUP)")
            case "dir":
                throw Aria2Error("dld reads download_dir from its config file: change it there and reload dld (SIGHUP)")
            default:
                throw Aria2Error("option \(name.prefix(100)) cannot be changed by dld (only max-overall-download-limit)")
            }
        }
        return "OK"
    }

    func globalStat() async throws(Aria2Error) -> JSONValue {
        let stats = try await dld(.stats, [:])
        func count(_ states: [String]) -> JSONValue {
            .string(String(states.reduce(Int64(0)) { $0 + (stats["counts"]?[$1]?.int64Value ?? 0) }))
        }
        let stopped = count(["completed", "failed", "canceled"])
        return [
            "downloadSpeed": .string(String(stats["speed"]?.int64Value ?? 0)), "uploadSpeed": "0",
            "numActive": count(["running"]), "numWaiting": count(["queued", "waiting", "paused"]),
            "numStopped": stopped, "numStoppedTotal": stopped,
        ]
    }
}
