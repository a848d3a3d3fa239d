import DLCore
import Foundation

/// The protocol's view of a job (see docs/protocol.md, "The job object").
public enum JobJSON {

    public static func encode(_ view: JobView) -> JSONValue { encode(view.job, live: view.live) }

    /// Each job as text (`raw`), with its live counters.
    public static func raw(_ views: JobViews) -> [JSONValue] {
        views.jobs.map { raw($0, live: views.live[$0.id]) }
    }

    public static func encode(_ job: Job, live: LiveProgress? = nil) -> JSONValue {
        var object: [String: JSONValue] = [:]
        object.reserveCapacity(keys.count)
        for (key, value) in zip(keys, values(job, live: live)) { object[key] = value }
        return .object(object)
    }

    /// The same job as JSON text, written without building an object: the bytes that
    /// `encode(job, live:).serialized()` gives (a test checks it), for `list` pages, where
    /// building and sorting each job's object took most of the time.
    public static func raw(_ job: Job, live: LiveProgress? = nil) -> JSONValue {
        var out: [UInt8] = []
        out.reserveCapacity(512)
        JSONValue.writeObject(zip(keys, values(job, live: live)), into: &out)
        return .raw(RawJSON(out))
    }

    /// The job object's keys, sorted as `serialized()` sorts them; `values` gives their values
    /// in this order.
    static let keys = [
        "attempts", "checksum", "created_at", "digest", "encrypt_to", "error", "final_url", "finished_at", "group", "headers", "id",
        "insecure", "key", "max_speed", "meta", "metered", "mirrors", "name", "next_attempt_at", "overwrite", "path", "pieces",
        "priority", "progress", "ranges",
        "received",
        "sha256", "size", "speed", "state", "stop_request", "tls", "updated_at", "url", "wait_reason", "worker",
    ]

    private static func values(_ job: Job, live: LiveProgress?) -> [JSONValue] {
        // A transfer that started over has fewer bytes than the row's committed offset.
        let received = live?.startedOver != nil ? (live?.received ?? 0) : max(live?.received ?? job.received, job.received)
        let error = live?.startedOver ?? job.error
        let size = live?.size ?? job.size
        let progress: JSONValue
        if let size, size > 0 {
            progress = .double((Double(received) / Double(size) * 1000).rounded() / 1000)
        } else {
            progress = job.state == .completed ? .double(1) : .null
        }
        return [
            .int(Int64(job.attempts)),
            job.checksum.map { .string($0.description) } ?? .null,
            timestamp(job.createdAt),
            job.digest.map { .string($0) } ?? .null,
            job.options.encryptTo.map { .array($0.map { .string($0) }) } ?? .null,
            error.map { ["code": .string($0.code), "message": .string($0.message)] } ?? .null,
            job.finalURL.map { .string(URLRules.redacted($0)) } ?? .null,
            job.finishedAt.map(timestamp) ?? .null,
            job.groupID.map { .int($0) } ?? .null,
            .array(
                job.headers.map { header in
                    let shown = header.isCredential ? "<redacted>" : header.value
                    return ["name": .string(header.name), "value": .string(shown)]
                }),
            .int(job.id),
            .bool(job.options.insecure),
            job.key.map { .string($0) } ?? .null,
            job.options.maxSpeed.map { .int($0) } ?? .null,
            job.meta.flatMap { try? JSONValue.parse(Data($0.utf8)) } ?? .null,
            job.options.metered.map { .bool($0) } ?? .null,
            mirrors(job),
            .string(job.name),
            job.nextAttemptAt.map(timestamp) ?? .null,
            .bool(job.overwrite),
            .string(job.path),
            pieces(job),
            .int(Int64(job.priority)),
            progress,
            ranges(job),
            .int(received),
            job.sha256.map { .string($0) } ?? .null,
            size.map { .int($0) } ?? .null,
            live.map { .int(Int64($0.speed.rounded())) } ?? .int(0),
            .string(job.state.rawValue),
            job.state == .running ? job.stopRequest.map { .string($0.rawValue) } ?? .null : .null,
            job.options.tls.map(tls) ?? .null,
            timestamp(job.updatedAt),
            .string(URLRules.redacted(job.url)),
            job.waitReason.map { .string($0.rawValue) } ?? .null,
            job.state == .running ? job.worker.map { .string($0) } ?? .null : .null,
        ]
    }

    /// A segmented download's committed ranges, `[start, done, end]` each; null for one stream.
    private static func ranges(_ job: Job) -> JSONValue {
        guard let stored = job.segments, let size = job.size, let layout = SegmentLayout(encoded: stored, size: size) else { return .null }
        return .array(layout.segments.map { .array([.int($0.start), .int($0.done), .int($0.end)]) })
    }

    /// The job's mirrors with their state, null without any: the job's own URL first, then the
    /// others, each `{url, dropped}` (`dropped`: why dld stopped using it, else null).
    private static func mirrors(_ job: Job) -> JSONValue {
        guard !job.mirrors.isEmpty else { return .null }
        let all = [JobMirror(url: job.url, dropped: job.urlDropped)] + job.mirrors
        return .array(all.map { ["url": .string(URLRules.redacted($0.url)), "dropped": $0.dropped.map { .string($0) } ?? .null] })
    }

    /// A Metalink's piece hashes: `{type, length, count}` (not the hashes); null without them.
    private static func pieces(_ job: Job) -> JSONValue {
        guard let stored = job.pieces, let summary = PieceHashes.summary(encoded: stored) else { return .null }
        return ["type": .string(summary.algorithm.rawValue), "length": .int(summary.length), "count": .int(Int64(summary.count))]
    }

    /// A job's own TLS files; the ones it did not give are null.
    private static func tls(_ tls: JobTLS) -> JSONValue {
        func path(_ value: String?) -> JSONValue { value.map { .string($0) } ?? .null }
        return [
            "ca_file": path(tls.caFile), "ca_dir": path(tls.caDir), "client_cert": path(tls.clientCert), "client_key": path(tls.clientKey),
        ]
    }

    /// The protocol's view of a group (docs/protocol.md, "The group object").
    public static func encodeGroup(_ group: JobGroup, _ summary: GroupSummary) -> JSONValue {
        [
            "id": .int(group.id),
            "name": .string(group.name),
            "dir": .string(group.dir),
            "state": .string(summary.state.rawValue),
            "members": .int(Int64(summary.total)),
            "members_done": .int(Int64(summary.done)),
            "bytes_done": .int(summary.bytesDone),
            "bytes_total": summary.bytesTotal.map { .int($0) } ?? .null,
            "error": summary.error.map { ["code": .string($0.code), "message": .string($0.message)] } ?? .null,
            "created_at": timestamp(group.createdAt),
            "finished_at": group.finishedAt.map(timestamp) ?? .null,
            "hls": group.hls.flatMap(HLSRecipe.decode).map(encodeHLS) ?? .null,
        ]
    }

    /// What an HLS group downloads: the layout, the container, its segments, the variant
    /// chosen from a master playlist (null when the URL was a media playlist), and whether a
    /// live playlist is still being recorded.
    static func encodeHLS(_ recipe: HLSRecipe) -> JSONValue {
        let variant: JSONValue =
            recipe.variant.map { variant in
                [
                    "index": recipe.variantIndex.map { .int(Int64($0)) } ?? .null, "bandwidth": .int(variant.bandwidth),
                    "width": variant.width.map { .int(Int64($0)) } ?? .null, "height": variant.height.map { .int(Int64($0)) } ?? .null,
                    "codecs": variant.codecs.map { .string($0) } ?? .null,
                ]
            } ?? .null
        return [
            "layout": .string(recipe.layout.rawValue), "container": .string(recipe.container),
            "segments": .int(Int64(recipe.segments.count)), "variant": variant, "live": .bool(recipe.live != nil),
        ]
    }

    /// An event as a JSON-RPC notification's params.
    public static func encodeEvent(_ event: StoredEvent) -> JSONValue {
        var object: [String: JSONValue] = [
            "seq": .int(event.seq),
            "at": timestamp(event.at),
            "state": .string(event.state),
        ]
        object["id"] = event.jobID.map { .int($0) } ?? .null
        object["group"] = event.groupID.map { .int($0) } ?? .null
        object["wait_reason"] = event.waitReason.map { .string($0.rawValue) } ?? .null
        object["error"] = event.error.map { ["code": .string($0.code), "message": .string($0.message)] } ?? .null
        return .object(object)
    }

    /// `2026-11-22T16:30:08Z`: what `date.formatted(.iso8601)` gives (a test checks it),
    /// written from `gmtime_r`, because the format style cost more than the rest of a job.
    public static func timestamp(_ date: Date) -> JSONValue {
        var seconds = time_t(date.timeIntervalSince1970.rounded(.down))
        var parts = tm()
        guard gmtime_r(&seconds, &parts) != nil, parts.tm_year + 1900 >= 0, parts.tm_year + 1900 <= 9999 else {
            return .string(date.formatted(.iso8601))
        }
        var text: [UInt8] = []
        text.reserveCapacity(20)
        func digits(_ value: Int32, _ count: Int) {
            var divisor: Int32 = 1
            for _ in 1..<count { divisor *= 10 }
            var rest = value
            while divisor > 0 {
                text.append(UInt8(ascii: "0") + UInt8(rest / divisor))
                rest %= divisor
                divisor /= 10
            }
        }
        digits(parts.tm_year + 1900, 4)
        text.append(UInt8(ascii: "-"))
        digits(parts.tm_mon + 1, 2)
        text.append(UInt8(ascii: "-"))
        digits(parts.tm_mday, 2)
        text.append(UInt8(ascii: "T"))
        digits(parts.tm_hour, 2)
        text.append(UInt8(ascii: ":"))
        digits(parts.tm_min, 2)
        text.append(UInt8(ascii: ":"))
        digits(parts.tm_sec, 2)
        text.append(UInt8(ascii: "Z"))
        return .string(String(decoding: text, as: UTF8.self))
    }

}
