/// Mirrors: more URLs of the same file. The ranges of a segmented download spread across them;
/// one that disagrees with the file, refuses it, or keeps failing is set aside with the reason
/// recorded, and the job fails only when none is left. Everything here is a value without
/// I/O; the Downloader carries out what it decides (docs/architecture.md, "Mirrors").

/// One more URL of a job's file (`mirrors` at enqueue), and whether dld still uses it.
public struct JobMirror: Sendable, Equatable, Codable {
    public var url: String
    /// Why dld stopped using this URL for the job (it disagreed on the file, or refused it);
    /// nil while it is used.
    public var dropped: String?

    public init(url: String, dropped: String? = nil) {
        self.url = url
        self.dropped = dropped
    }
}

/// The job's mirrors as the job table keeps them (the `mirrors` column, JSON): the other URLs
/// with their state, and why the job's own URL was dropped, if it was.
public struct MirrorColumn: Sendable, Equatable, Codable {
    public var mirrors: [JobMirror]
    public var urlDropped: String?

    enum CodingKeys: String, CodingKey {
        case mirrors
        case urlDropped = "url_dropped"
    }

    public init(mirrors: [JobMirror], urlDropped: String?) {
        self.mirrors = mirrors
        self.urlDropped = urlDropped
    }
}

/// What a source's answer says about the file: checked against the first answer of the
/// attempt (or the validators the bytes on disk came with) before its bytes are used.
public struct FileIdentity: Sendable, Equatable {
    /// The file's total size (`Content-Range`'s, or `Content-Length` of a 200).
    public var size: Int64?
    /// A strong ETag, with its quotes.
    public var etag: String?
    public var lastModified: String?

    public init(size: Int64?, etag: String?, lastModified: String?) {
        self.size = size
        self.etag = etag
        self.lastModified = lastModified
    }

    /// Why `other` is not the same file as `self`, or nil when it agrees: the same size when
    /// both know it; then the strong ETag when both have one, else Last-Modified when both
    /// have it. Servers that give neither cannot be told apart: the size has to do.
    public func disagreement(_ other: FileIdentity) -> String? {
        if let size, let theirs = other.size, size != theirs {
            return "size differs: \(theirs) vs \(size)"
        }
        if let etag, let theirs = other.etag {
            return etag == theirs ? nil : "validator differs: ETag \(theirs.prefix(80)) vs \(etag.prefix(80))"
        }
        if let lastModified, let theirs = other.lastModified, lastModified != theirs {
            return "validator differs: Last-Modified \(theirs.prefix(60)) vs \(lastModified.prefix(60))"
        }
        return nil
    }
}

/// The sources of one attempt: the job's URL (index 0) and its mirrors, which of them are
/// used, how many requests each has open, and which have shown that they serve the file.
public struct MirrorSet: Sendable, Equatable {
    public struct Source: Sendable, Equatable {
        public var url: String
        /// `URLRules.hostKey(url)`: what the per-host limit counts.
        public var host: String
        /// Dropped for good (recorded in the job): why.
        public var dropped: String?
        /// Set aside for the rest of this attempt after transient failures in a row; tried
        /// again by the next attempt.
        public var benched: String?
        /// Transient failures in a row (a request that delivers bytes resets it).
        public var failures = 0
        /// Requests open now.
        public var active = 0
        /// Its first answer agreed with the file (or it answered the first request).
        public var verified = false

        public var isLive: Bool { dropped == nil && benched == nil }
    }

    public private(set) var sources: [Source]
    /// Transient failures in a row after which a source is set aside for the attempt.
    public let maxFailures: Int
    /// Where the last `pick` looked first: sources take turns.
    private var turn = 0
    /// The source whose answers define the file for this attempt (the one that answered the
    /// first request; on a resume of ranges, the first live one): its own answers follow the
    /// rules of one server (a 200 to a range starts the file over), the others' first answers
    /// must agree with it.
    public var reference: Int?

    public init(url: String, urlDropped: String?, mirrors: [JobMirror], maxFailures: Int = 3) {
        var sources = [Source(url: url, host: URLRules.hostKey(url), dropped: urlDropped)]
        sources += mirrors.map { Source(url: $0.url, host: URLRules.hostKey($0.url), dropped: $0.dropped) }
        // A job runs again after every source was dropped only when someone asked (`resume`,
        // `change`): then every source is tried again.
        if sources.allSatisfy({ $0.dropped != nil }) {
            for i in sources.indices { sources[i].dropped = nil }
        }
        self.sources = sources
        self.maxFailures = max(1, maxFailures)
    }

    /// More than one URL: failures move work to another source instead of ending the attempt.
    public var hasMirrors: Bool { sources.count > 1 }
    public var live: [Int] { sources.indices.filter { sources[$0].isLive } }
    public var anyLive: Bool { sources.contains(where: \.isLive) }

    /// The first source to ask (the first live one, in the client's order).
    public var first: Int? { sources.indices.first { sources[$0].isLive } }

    /// Connections this attempt holds by host (the engine counts them against `max_per_host`).
    public var connectionsByHost: [String: Int] {
        var load: [String: Int] = [:]
        for source in sources where source.active > 0 { load[source.host, default: 0] += source.active }
        return load
    }

    /// The source for the next request, which is then counted as open: a live one whose host
    /// has a connection left in `allowance` (by host; a host it does not name has none), the
    /// one with the fewest open requests, sources taking turns among equals. Nil when none may.
    public mutating func pick(allowance: [String: Int]) -> Int? {
        let used = connectionsByHost
        var best: Int? = nil
        for step in 0..<sources.count {
            let i = (turn + step) % sources.count
            let source = sources[i]
            guard source.isLive, used[source.host, default: 0] < allowance[source.host, default: 0] else { continue }
            if let chosen = best, sources[chosen].active <= source.active { continue }
            best = i
        }
        guard let best else { return nil }
        sources[best].active += 1
        turn = (best + 1) % sources.count
        return best
    }

    /// Counts a request to `index` that is opened outside `pick` (the attempt's first).
    public mutating func opened(_ index: Int) {
        sources[index].active += 1
    }

    /// A request to `index` ended (whatever way).
    public mutating func closed(_ index: Int) {
        sources[index].active = max(0, sources[index].active - 1)
    }

    /// `index` answered with the file: its failures in a row start again from zero. The first
    /// source to answer is the attempt's reference.
    public mutating func delivered(_ index: Int) {
        sources[index].failures = 0
        sources[index].verified = true
        if reference == nil { reference = index }
    }

    /// Checks the first answer of `index` against the file; a source that disagrees is
    /// dropped for good (a mirror of another version is no mirror). Returns the reason.
    public mutating func check(_ index: Int, answer: FileIdentity, reference: FileIdentity) -> String? {
        if sources[index].verified { return nil }
        if let reason = reference.disagreement(answer) {
            sources[index].dropped = reason
            return reason
        }
        sources[index].verified = true
        return nil
    }

    /// What a failure of a source means for the attempt.
    public enum Outcome: Sendable, Equatable {
        /// Another source takes the work over.
        case elsewhere
        /// No source is left for this attempt: it fails. `permanent` when every source was
        /// dropped for good (nothing will change by retrying), else a transient failure.
        case exhausted(permanent: Bool)
    }

    /// A request to `index` failed. A permanent failure (a refusal such as 404, an answer
    /// that is not the file) drops the source for good; a transient one sets it aside for the
    /// attempt after `maxFailures` in a row. With one source nothing is recorded: the attempt
    /// fails as any download's does.
    public mutating func failed(_ index: Int, reason: String, permanent: Bool) -> Outcome {
        guard hasMirrors else { return .exhausted(permanent: permanent) }
        if permanent {
            sources[index].dropped = reason
        } else {
            sources[index].failures += 1
            if sources[index].failures >= maxFailures {
                sources[index].benched = "\(reason) (\(sources[index].failures) failures in a row)"
            }
        }
        if anyLive { return .elsewhere }
        return .exhausted(permanent: sources.allSatisfy { $0.dropped != nil })
    }

    /// Why each source is out, for the error of an attempt that has none left:
    /// `URL: reason; URL: reason`. URLs are redacted.
    public var reasons: String {
        sources.compactMap { source in
            (source.dropped ?? source.benched).map { "\(URLRules.redacted(source.url)): \($0)" }
        }.joined(separator: "; ")
    }

    /// The drops to record in the job (benched sources are not: the next attempt tries them).
    public var column: MirrorColumn {
        MirrorColumn(mirrors: sources.dropFirst().map { JobMirror(url: $0.url, dropped: $0.dropped) }, urlDropped: sources.first?.dropped)
    }
}

/// How many connections a job with mirrors may open to each host of its sources: the
/// transfer's `segments` at most in all, within each host's free slots (`max_per_host` minus
/// what runs there), and always the one slot its claim counted on its own URL's host.
public enum MirrorAllowance {
    /// `hosts`: the live sources' hosts, the job's own first; `free`: free slots by host.
    public static func slots(wanted: Int, hosts: [String], free: [String: Int]) -> [String: Int] {
        var allowance: [String: Int] = [:]
        guard let own = hosts.first else { return allowance }
        var left = max(1, wanted)
        var distinct: [String] = []
        for host in hosts where !distinct.contains(host) { distinct.append(host) }
        allowance[own] = 1
        left -= 1
        var room = Dictionary(uniqueKeysWithValues: distinct.map { ($0, max(0, free[$0, default: 0])) })
        room[own, default: 0] -= 1
        // Round robin over the hosts, one connection at a time, the job's own host last (it
        // has its one already): ranges spread across mirrors.
        let order = distinct.dropFirst() + [own]
        var progressed = true
        while left > 0, progressed {
            progressed = false
            for host in order where left > 0 && room[host, default: 0] > 0 {
                allowance[host, default: 0] += 1
                room[host, default: 0] -= 1
                left -= 1
                progressed = true
            }
        }
        return allowance
    }
}
