import DLCore
import Foundation
import Testing

/// The URL cache's pure decisions: freshness from the response's headers, and which entries
/// eviction takes.
@Suite struct CachePolicyTests {
    let t0 = Date(timeIntervalSince1970: 1_700_000_000)
    let policy = CachePolicy(defaultMaxAge: 600, maxBytes: 1000, maxAge: 86_400)

    static func httpDate(_ date: Date) -> String {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "GMT")
        formatter.dateFormat = "EEE, dd MMM yyyy HH:mm:ss 'GMT'"
        return formatter.string(from: date)
    }

    /// `max-age` wins over `Expires`; `no-cache` and `no-store` make every use a revalidation.
    @Test func cacheControlDecides() {
        let expires = Self.httpDate(t0.addingTimeInterval(5000))
        let both = CacheHeaders(cacheControl: "public, max-age=60", expires: expires)
        #expect(policy.freshnessLifetime(both, receivedAt: t0) == 60)
        #expect(policy.isFresh(both, receivedAt: t0, now: t0.addingTimeInterval(59)))
        #expect(!policy.isFresh(both, receivedAt: t0, now: t0.addingTimeInterval(60)))
        #expect(policy.freshnessLifetime(CacheHeaders(cacheControl: "no-cache, max-age=60"), receivedAt: t0) == 0)
        #expect(policy.freshnessLifetime(CacheHeaders(cacheControl: "No-Store"), receivedAt: t0) == 0)
        #expect(!policy.isFresh(CacheHeaders(cacheControl: "no-cache"), receivedAt: t0, now: t0))
        // A malformed max-age is stale at once; the smaller of two counts.
        #expect(policy.freshnessLifetime(CacheHeaders(cacheControl: "max-age=soon"), receivedAt: t0) == 0)
        #expect(policy.freshnessLifetime(CacheHeaders(cacheControl: "max-age=100, max-age=\"20\""), receivedAt: t0) == 20)
        // s-maxage is for shared caches: ignored, the default applies.
        #expect(policy.freshnessLifetime(CacheHeaders(cacheControl: "s-maxage=5"), receivedAt: t0) == 600)
    }

    /// `Expires` counts from the server's `Date` (clocks may differ); an unreadable one has
    /// expired; without either header the configured default applies.
    @Test func expiresAndTheDefault() {
        let serverNow = t0.addingTimeInterval(-3600)  // the server's clock is an hour behind
        let headers = CacheHeaders(expires: Self.httpDate(serverNow.addingTimeInterval(120)), date: Self.httpDate(serverNow))
        #expect(policy.freshnessLifetime(headers, receivedAt: t0) == 120)
        #expect(
            policy.isFresh(headers, receivedAt: t0, now: t0.addingTimeInterval(100)) == false,
            "the apparent age counts: Date is an hour before the arrival")
        let sameClock = CacheHeaders(expires: Self.httpDate(t0.addingTimeInterval(120)), date: Self.httpDate(t0))
        #expect(policy.isFresh(sameClock, receivedAt: t0, now: t0.addingTimeInterval(100)))
        #expect(!policy.isFresh(sameClock, receivedAt: t0, now: t0.addingTimeInterval(121)))
        #expect(policy.freshnessLifetime(CacheHeaders(expires: "0"), receivedAt: t0) == 0)
        #expect(policy.freshnessLifetime(CacheHeaders(expires: Self.httpDate(t0.addingTimeInterval(-10))), receivedAt: t0) == 0)
        #expect(policy.freshnessLifetime(CacheHeaders(etag: "\"x\""), receivedAt: t0) == 600)
        #expect(policy.freshUntil(CacheHeaders(), receivedAt: t0) == t0.addingTimeInterval(600))
    }

    /// The `Age` header makes a copy older than its arrival.
    @Test func ageHeader() {
        let headers = CacheHeaders(cacheControl: "max-age=100", age: "90")
        #expect(policy.isFresh(headers, receivedAt: t0, now: t0.addingTimeInterval(9)))
        #expect(!policy.isFresh(headers, receivedAt: t0, now: t0.addingTimeInterval(10)))
        #expect(policy.freshUntil(headers, receivedAt: t0) == t0.addingTimeInterval(10))
    }

    /// The three date forms a recipient must read.
    @Test func httpDates() {
        let expected = Date(timeIntervalSince1970: 784_111_777)  // Sun, 06 Nov 1994 08:49:37 GMT
        #expect(HTTPDate.parse("Sun, 06 Nov 1994 08:49:37 GMT") == expected)
        #expect(HTTPDate.parse("Sunday, 06-Nov-94 08:49:37 GMT") == expected)
        #expect(HTTPDate.parse("Sun Nov  6 08:49:37 1994") == expected)
        #expect(HTTPDate.parse("yesterday") == nil)
        #expect(HTTPDate.parse(nil) == nil)
    }

    /// A 304's headers replace the stored ones they name; the others stay.
    @Test func notModifiedUpdatesHeaders() {
        let stored = CacheHeaders(cacheControl: "max-age=10", date: "old", age: "5", etag: "\"a\"", lastModified: "lm")
        let updated = stored.updated(by: CacheHeaders(cacheControl: "max-age=99", date: "new"))
        #expect(updated == CacheHeaders(cacheControl: "max-age=99", date: "new", age: nil, etag: "\"a\"", lastModified: "lm"))
        #expect(
            CachePolicy.conditionalHeaders(updated) == [
                HeaderField(name: "If-None-Match", value: "\"a\""), HeaderField(name: "If-Modified-Since", value: "lm"),
            ])
        #expect(CachePolicy.conditionalHeaders(CacheHeaders(cacheControl: "max-age=1")).isEmpty)
    }

    /// Spellings of one resource share a key; what servers may tell apart does not.
    @Test func normalizedURLs() {
        #expect(CacheURL.normalized("HTTP://Example.COM:80") == "http://example.com/")
        #expect(CacheURL.normalized("https://example.com:443/a?b=1#frag") == "https://example.com/a?b=1")
        #expect(CacheURL.normalized("https://example.com:8443/A") == "https://example.com:8443/A")
        #expect(CacheURL.normalized("https://example.com/a%2Fb") != CacheURL.normalized("https://example.com/a/b"))
        #expect(CacheURL.normalized("https://example.com/?b=1&a=2") != CacheURL.normalized("https://example.com/?a=2&b=1"))
        #expect(CacheURL.normalized("ftp://example.com/x") == nil)
        #expect(CacheURL.normalized("/relative") == nil)
    }

    /// Over the byte budget, the least recently used go first; pinned and in-use entries
    /// never go, even when the cache stays over budget because of them.
    @Test func evictionByBytesSkipsHeld() {
        let entries = [
            CacheEntryUse(key: "a", bytes: 400, lastUsed: t0, held: true),
            CacheEntryUse(key: "b", bytes: 400, lastUsed: t0.addingTimeInterval(1), held: false),
            CacheEntryUse(key: "c", bytes: 400, lastUsed: t0.addingTimeInterval(2), held: false),
            CacheEntryUse(key: "d", bytes: 300, lastUsed: t0.addingTimeInterval(3), held: false),
        ]
        #expect(policy.evictions(entries, now: t0.addingTimeInterval(10)) == ["b", "c"], "1500 bytes: b leaves 1100, then c 700")
        let allHeld = entries.map { CacheEntryUse(key: $0.key, bytes: $0.bytes, lastUsed: $0.lastUsed, held: true) }
        #expect(policy.evictions(allHeld, now: t0.addingTimeInterval(10)).isEmpty)
        let unlimited = CachePolicy(defaultMaxAge: 600, maxBytes: 0, maxAge: 0)
        #expect(unlimited.evictions(entries, now: t0.addingTimeInterval(1e9)).isEmpty)
        #expect(policy.evictions(Array(entries.suffix(2)), now: t0.addingTimeInterval(10)).isEmpty, "700 bytes fit")
    }

    /// Entries unused for `maxAge` go whatever the bytes, unless held; the timer's next
    /// deadline is the oldest unheld entry's.
    @Test func evictionByAge() {
        let entries = [
            CacheEntryUse(key: "old", bytes: 1, lastUsed: t0, held: false),
            CacheEntryUse(key: "pinned", bytes: 1, lastUsed: t0, held: true),
            CacheEntryUse(key: "recent", bytes: 1, lastUsed: t0.addingTimeInterval(50_000), held: false),
        ]
        #expect(policy.evictions(entries, now: t0.addingTimeInterval(86_399)).isEmpty)
        #expect(policy.evictions(entries, now: t0.addingTimeInterval(86_400)) == ["old"])
        #expect(policy.nextAgeEviction(entries) == t0.addingTimeInterval(86_400))
        #expect(CachePolicy(maxAge: 0).nextAgeEviction(entries) == nil)
    }
}
