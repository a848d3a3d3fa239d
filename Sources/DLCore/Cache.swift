import Foundation

/// The response headers that decide how long a cached copy is fresh and how it is revalidated,
/// as the server sent them (kept with the entry; the policy reads them again at each `get`, so
/// a changed `cache_default_max_age` applies to copies already cached).
public struct CacheHeaders: Sendable, Equatable, Codable {
    public var cacheControl: String?
    public var expires: String?
    public var date: String?
    public var age: String?
    /// The ETag as sent, weak or strong: `If-None-Match` takes both.
    public var etag: String?
    public var lastModified: String?

    public init(
        cacheControl: String? = nil, expires: String? = nil, date: String? = nil, age: String? = nil,
        etag: String? = nil, lastModified: String? = nil
    ) {
        self.cacheControl = cacheControl
        self.expires = expires
        self.date = date
        self.age = age
        self.etag = etag
        self.lastModified = lastModified
    }

    /// The stored headers updated by a `304 Not Modified`: a header the 304 carries replaces the
    /// stored one (RFC 9111 §4.3.4); the others stay.
    public func updated(by notModified: CacheHeaders) -> CacheHeaders {
        CacheHeaders(
            cacheControl: notModified.cacheControl ?? cacheControl, expires: notModified.expires ?? expires,
            date: notModified.date ?? date, age: notModified.age, etag: notModified.etag ?? etag,
            lastModified: notModified.lastModified ?? lastModified)
    }
}

/// The `Cache-Control` directives a private cache of whole files uses. Unknown directives are
/// ignored; `s-maxage` is for shared caches, not this one.
public struct CacheControl: Sendable, Equatable {
    public var maxAge: TimeInterval?
    public var noCache = false
    public var noStore = false
    public var mustRevalidate = false

    public init(maxAge: TimeInterval? = nil, noCache: Bool = false, noStore: Bool = false, mustRevalidate: Bool = false) {
        self.maxAge = maxAge
        self.noCache = noCache
        self.noStore = noStore
        self.mustRevalidate = mustRevalidate
    }

    public static func parse(_ value: String?) -> CacheControl {
        var result = CacheControl()
        guard let value else { return result }
        for part in value.split(separator: ",") {
            let directive = part.trimmingCharacters(in: .whitespaces)
            let pieces = directive.split(separator: "=", maxSplits: 1)
            guard let first = pieces.first else { continue }
            let name = first.trimmingCharacters(in: .whitespaces).lowercased()
            let argument = pieces.count > 1 ? pieces[1].trimmingCharacters(in: CharacterSet(charactersIn: " \"")) : nil
            switch name {
            case "max-age":
                // A malformed max-age makes the response stale (RFC 9111 §4.2.1): 0.
                if let argument, let seconds = Int64(argument), seconds >= 0 {
                    result.maxAge = min(result.maxAge ?? .infinity, TimeInterval(seconds))
                } else {
                    result.maxAge = 0
                }
            case "no-cache": result.noCache = true
            case "no-store": result.noStore = true
            case "must-revalidate": result.mustRevalidate = true
            default: continue
            }
        }
        return result
    }
}

/// HTTP dates (RFC 9110 §5.6.7): the IMF-fixdate every server sends, and the two obsolete
/// forms a recipient must read.
public enum HTTPDate {
    public static func parse(_ text: String?) -> Date? {
        guard let raw = text, raw.utf8.count <= 64 else { return nil }
        // An HTTP-date is printable ASCII. Anything else never reaches the formatter:
        // Foundation's DateFormatter traps ("Incorrect range") on some text with combining
        // marks (found by fuzz-http-response), and these headers are the server's to choose.
        guard raw.unicodeScalars.allSatisfy({ (0x20..<0x7F).contains($0.value) }) else { return nil }
        // asctime pads the day with a space ("Nov  6"): one space between fields.
        let text = raw.split(separator: " ", omittingEmptySubsequences: true).joined(separator: " ")
        guard !text.isEmpty else { return nil }
        for format in ["EEE, dd MMM yyyy HH:mm:ss zzz", "EEEE, dd-MMM-yy HH:mm:ss zzz", "EEE MMM d HH:mm:ss yyyy"] {
            let formatter = DateFormatter()
            formatter.locale = Locale(identifier: "en_US_POSIX")
            formatter.timeZone = TimeZone(identifier: "GMT")
            formatter.dateFormat = format
            if let date = formatter.date(from: text) { return date }
        }
        return nil
    }
}

/// The key of a URL in the cache: its normalized form, so that spellings of one resource that
/// every server treats alike share one entry. The cache's file names are a hash of it, never a
/// name from the server.
public enum CacheURL {
    /// Scheme and host in lower case, the default port dropped, an empty path as `/`, the
    /// fragment dropped (it is never sent). User info, path and query stay as written: servers
    /// may tell `%2F` from `/` and the order of query parameters apart. Nil for what is not an
    /// absolute http(s) URL with a host.
    public static func normalized(_ url: String) -> String? {
        guard var components = URLComponents(string: url),
            let scheme = components.scheme?.lowercased(), scheme == "http" || scheme == "https",
            let host = components.host, !host.isEmpty
        else { return nil }
        components.scheme = scheme
        components.host = host.lowercased()
        if let port = components.port, (scheme == "http" && port == 80) || (scheme == "https" && port == 443) {
            components.port = nil
        }
        if components.percentEncodedPath.isEmpty { components.percentEncodedPath = "/" }
        components.fragment = nil
        return components.string
    }
}

/// One entry of the cache as eviction sees it.
public struct CacheEntryUse: Sendable, Equatable {
    public var key: String
    public var bytes: Int64
    public var lastUsed: Date
    /// Pinned by a caller, used by a running `get`, or being downloaded: never evicted.
    public var held: Bool

    public init(key: String, bytes: Int64, lastUsed: Date, held: Bool) {
        self.key = key
        self.bytes = bytes
        self.lastUsed = lastUsed
        self.held = held
    }
}

/// Freshness and eviction of the URL cache (`get`), pure: callers pass `now`.
public struct CachePolicy: Sendable, Equatable {
    /// How long a copy is fresh when the server says nothing about it (`cache_default_max_age`).
    public var defaultMaxAge: TimeInterval
    /// Bytes the cache keeps at most (`cache_max_bytes`); 0: no limit.
    public var maxBytes: Int64
    /// An entry not used for this long is evicted (`cache_max_age`); 0: no limit.
    public var maxAge: TimeInterval

    public static let defaultDefaultMaxAge: TimeInterval = 3600
    public static let defaultMaxBytes: Int64 = 1 << 30
    public static let defaultMaxAgeUnused: TimeInterval = 30 * 86_400

    public init(
        defaultMaxAge: TimeInterval = Self.defaultDefaultMaxAge, maxBytes: Int64 = Self.defaultMaxBytes,
        maxAge: TimeInterval = Self.defaultMaxAgeUnused
    ) {
        self.defaultMaxAge = defaultMaxAge
        self.maxBytes = maxBytes
        self.maxAge = maxAge
    }

    /// How long a response stays fresh after it was generated (RFC 9111 §4.2.1, for a private
    /// cache): 0 with `no-cache` or `no-store` (kept, but revalidated at every use), else
    /// `max-age`, else `Expires` minus `Date` (or minus when it arrived; an `Expires` that
    /// cannot be read means already expired), else `defaultMaxAge`. No heuristic from
    /// `Last-Modified`: a predictable default is easier to reason about.
    public func freshnessLifetime(_ headers: CacheHeaders, receivedAt: Date) -> TimeInterval {
        let control = CacheControl.parse(headers.cacheControl)
        if control.noCache || control.noStore { return 0 }
        if let maxAge = control.maxAge { return maxAge }
        if let expires = headers.expires {
            guard let expiry = HTTPDate.parse(expires) else { return 0 }
            let base = HTTPDate.parse(headers.date) ?? receivedAt
            return max(0, expiry.timeIntervalSince(base))
        }
        return defaultMaxAge
    }

    /// The response's age at `now` (RFC 9111 §4.2.3, without the request's round trip): the
    /// larger of the `Age` header and how far the server's `Date` lies before the arrival,
    /// plus the time since the arrival.
    public func currentAge(_ headers: CacheHeaders, receivedAt: Date, now: Date) -> TimeInterval {
        let apparent = HTTPDate.parse(headers.date).map { max(0, receivedAt.timeIntervalSince($0)) } ?? 0
        let stated = headers.age.flatMap { Int64($0.trimmingCharacters(in: .whitespaces)) }.map { TimeInterval(max(0, $0)) } ?? 0
        return max(apparent, stated) + max(0, now.timeIntervalSince(receivedAt))
    }

    public func isFresh(_ headers: CacheHeaders, receivedAt: Date, now: Date) -> Bool {
        freshnessLifetime(headers, receivedAt: receivedAt) > currentAge(headers, receivedAt: receivedAt, now: now)
    }

    /// When the copy stops being fresh.
    public func freshUntil(_ headers: CacheHeaders, receivedAt: Date) -> Date {
        let left = freshnessLifetime(headers, receivedAt: receivedAt) - currentAge(headers, receivedAt: receivedAt, now: receivedAt)
        return receivedAt.addingTimeInterval(max(0, left))
    }

    /// The request headers that ask the server whether a stale copy is still good: the ETag as
    /// `If-None-Match`, `Last-Modified` as `If-Modified-Since`. Empty when the copy has neither:
    /// then it can only be downloaded again.
    public static func conditionalHeaders(_ headers: CacheHeaders) -> [HeaderField] {
        var fields: [HeaderField] = []
        if let etag = headers.etag, !etag.isEmpty { fields.append(HeaderField(name: "If-None-Match", value: etag)) }
        if let lastModified = headers.lastModified, !lastModified.isEmpty {
            fields.append(HeaderField(name: "If-Modified-Since", value: lastModified))
        }
        return fields
    }

    /// The entries to evict at `now`, in order: first every entry not used for `maxAge`, then
    /// the least recently used until the bytes left fit `maxBytes`. Held entries (pinned, in
    /// use, downloading) are never chosen, but their bytes count, so a cache whose held
    /// entries alone pass the budget evicts every other entry and stays over it.
    public func evictions(_ entries: [CacheEntryUse], now: Date) -> [String] {
        var chosen: [String] = []
        var total = entries.reduce(Int64(0)) { $0 + max(0, $1.bytes) }
        // Oldest use first; the key breaks ties so that the choice is the same every time.
        let candidates = entries.filter { !$0.held }.sorted { ($0.lastUsed, $0.key) < ($1.lastUsed, $1.key) }
        for entry in candidates {
            let tooOld = maxAge > 0 && now.timeIntervalSince(entry.lastUsed) >= maxAge
            let overBudget = maxBytes > 0 && total > maxBytes
            guard tooOld || overBudget else { continue }
            chosen.append(entry.key)
            total -= max(0, entry.bytes)
        }
        return chosen
    }

    /// When the next entry reaches `maxAge` unused, for the eviction timer; nil without a
    /// `maxAge` or without an entry that could go.
    public func nextAgeEviction(_ entries: [CacheEntryUse]) -> Date? {
        guard maxAge > 0 else { return nil }
        return entries.filter { !$0.held }.map { $0.lastUsed.addingTimeInterval(maxAge) }.min()
    }
}
