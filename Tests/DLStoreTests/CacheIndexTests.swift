import DLCore
import DLJobTable
import DLStore
import Foundation
import Testing

/// The URL cache's index: its own SQLite file (never the job table, so there is no PostgreSQL
/// side to test).
@Suite struct CacheIndexTests {
    /// Rows keep every field, headers included, across a reopen; touch, pin and delete change
    /// only what they name.
    @Test func rowsRoundTrip() async throws {
        let folder = try TempFolder()
        let path = folder.path + "/index.sqlite"
        let headers = CacheHeaders(
            cacheControl: "max-age=60", expires: nil, date: "Sun, 06 Nov 1994 08:49:37 GMT", etag: "W/\"x\"", lastModified: "lm")
        let a = CacheEntry(
            key: "aa", url: "https://example.com/a", path: "/c/files/aa", ready: true, bytes: 10, sha256: "ff",
            headers: headers, receivedAt: t0, lastUsed: t0, pinned: false, jobID: nil, generation: 1)
        let b = CacheEntry(
            key: "bb", url: "https://example.com/b", path: "/c/files/bb", receivedAt: t0, lastUsed: t0, jobID: 7, generation: 3)
        do {
            let index = try CacheIndex(path: path)
            try await index.save(a)
            try await index.save(b)
            #expect(try await index.entry("aa") == a)
            try await index.touch("aa", at: t0.addingTimeInterval(5))
            #expect(try await index.setPinned("aa", true))
            #expect(try await index.setPinned("zz", true) == false, "no such entry")
        }
        let reopened = try CacheIndex(path: path)
        var expected = a
        expected.lastUsed = t0.addingTimeInterval(5)
        expected.pinned = true
        #expect(try await reopened.all() == [expected, b])
        try await reopened.delete(["aa"])
        #expect(try await reopened.entry("aa") == nil)
        #expect(try await reopened.all() == [b])
    }
}
