import DLCore
import DLRPC
import DLTestSupport
import Foundation
import Testing

/// Mirrors (issue 9): a job with several URLs of one file spreads its ranges across them; a
/// mirror that serves another file or refuses it is dropped with the reason shown, and the job
/// fails only when no URL is left. Two origins on two ports are two hosts.
@Suite(.serialized) struct MirrorTests {
    /// The job's `mirrors` entries by URL: `dropped` (null while used).
    static func dropped(_ job: JSONValue) -> [String: JSONValue] {
        var byURL: [String: JSONValue] = [:]
        for entry in job["mirrors"]?.arrayValue ?? [] {
            if let url = entry["url"]?.stringValue { byURL[url] = entry["dropped"] ?? .null }
        }
        return byURL
    }

    /// Two origins (two hosts), a daemon with four ranges, and one job of `size` bytes from
    /// `url(first)` with `mirror(second)` as its mirror, run to its end: it completed and the
    /// file is exact. `body` checks the rest (the daemon is still running).
    func mirrored(
        size: Int, name: String, url: (TestOrigin) -> String, mirror: (TestOrigin) -> String, extra: [String: JSONValue] = [:],
        _ body: (_ first: TestOrigin, _ second: TestOrigin, _ daemon: DaemonHarness, _ url: String, _ mirror: String, _ done: JSONValue)
            async throws -> Void
    ) async throws {
        try await withOrigin { first in
            try await withStarted(try await TestOrigin.start()) { second in
                let daemon = try DaemonHarness(config: quickRetries + "\nsegments = 4\n")
                try daemon.start()
                defer { daemon.stop() }
                let (url, mirror) = (url(first), mirror(second))
                var params: [String: JSONValue] = ["url": .string(url), "mirrors": [.string(mirror)], "name": .string(name)]
                params.merge(extra) { _, new in new }
                let id = try daemon.enqueue(params)
                let done = try daemon.waitForState(id, ["completed", "failed"], timeout: 120)
                #expect(done["state"] == "completed", "\(done.serializedString())")
                try expectOriginBytes(at: daemon.downloadDir + "/" + name, count: size)
                try await body(first, second, daemon, url, mirror, done)
            }
        }
    }

    /// Both mirrors serve ranges of the file; it is byte-exact and neither is dropped.
    @Test func rangesSpreadAcrossMirrors() async throws {
        let size = 24 << 20
        // Another host name for the same loopback: the job's credential header is for its own
        // URL's host and must not reach the mirror.
        try await mirrored(
            size: size, name: "mirrored.bin", url: { "\($0.baseURL)/bytes/\(size)?rate=6000000" },
            mirror: { "\($0.baseURL.replacingOccurrences(of: "127.0.0.1", with: "localhost"))/bytes/\(size)?rate=6000000" },
            extra: ["headers": ["Authorization": "Bearer job-token"]]
        ) { first, second, _, url, mirror, done in
            #expect(first.bytesServed > 0 && second.bytesServed > 0, "served \(first.bytesServed) and \(second.bytesServed)")
            #expect(!SegmentedTests.rangedRequests(second).isEmpty)
            #expect(SegmentedTests.rangedRequests(second).allSatisfy { $0.header("if-range") == "\"v1-\(size)\"" })
            #expect(Self.dropped(done) == [url: .null, mirror: .null], "\(done.serializedString())")
            #expect(first.requests.allSatisfy { $0.header("authorization") == "Bearer job-token" })
            #expect(second.requests.allSatisfy { $0.header("authorization") == nil })
        }
    }

    /// A mirror that serves another size is dropped with the reason in `status`; the job
    /// completes from the other URL, and the drop survives a restart (it is in the table).
    @Test func mirrorWithAnotherSizeIsDropped() async throws {
        let size = 16 << 20
        try await mirrored(
            size: size, name: "sized.bin", url: { "\($0.baseURL)/bytes/\(size)?rate=6000000" },
            mirror: { "\($0.baseURL)/bytes/\(size + 1)" }
        ) { _, second, daemon, url, liar, done in
            let reason = Self.dropped(done)[liar]?.stringValue ?? ""
            #expect(reason.contains("size differs: \(size + 1) vs \(size)"), "\(done.serializedString())")
            #expect(Self.dropped(done)[url] == .null)
            // The other file's answer is not read on: the liar never served a file's worth.
            #expect(second.bytesServed < Int64(size), "the liar served \(second.bytesServed)")
            daemon.stop()
            try daemon.start()
            let again = try daemon.job(try #require(done["id"]?.int64Value))
            #expect(Self.dropped(again)[liar]?.stringValue == reason)
        }
    }

    /// A mirror whose connections keep breaking loses its ranges to the other URL within the
    /// attempt: the job completes without waiting for a retry, and the mirror is only set aside
    /// (not dropped: a next attempt would ask it again).
    @Test func failedRangesMoveToAnotherMirror() async throws {
        let size = 16 << 20
        try await mirrored(
            size: size, name: "flaky.bin", url: { "\($0.baseURL)/bytes/\(size)?rate=6000000" },
            mirror: { "\($0.baseURL)/bytes/\(size)?drop_after=300000" }
        ) { first, second, daemon, url, flaky, done in
            #expect(!SegmentedTests.rangedRequests(second).isEmpty)
            #expect(daemon.log.contains("a source of the file failed"))
            // One attempt: the primary was asked from byte 0 once (its first range), never resumed.
            #expect(
                first.requests.filter { $0.header("range")?.hasPrefix("bytes=0-") ?? true }.count == 1,
                "\(first.requests.map { $0.header("range") ?? "-" })")
            #expect(!daemon.log.contains("waiting"), "\(daemon.log)")
            #expect(Self.dropped(done) == [url: .null, flaky: .null], "\(done.serializedString())")
        }
    }

    /// Every URL refusing the file fails the job, with why each was dropped; a mirror that
    /// works when the job's own URL refuses completes it.
    @Test func jobFailsOnlyWhenNoMirrorIsLeft() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: quickRetries + "\nsegments = 4\n")
            try daemon.start()
            defer { daemon.stop() }
            let gone = "\(origin.baseURL)/status/404"
            let refused = "\(origin.baseURL)/status/403"
            let id = try daemon.enqueue(["url": .string(gone), "mirrors": [.string(refused)], "name": "nowhere.bin"])
            let failed = try daemon.waitForState(id, ["completed", "failed"], timeout: 60)
            #expect(failed["state"] == "failed", "\(failed.serializedString())")
            #expect(failed["error"]?["code"] == "no_mirror_left")
            let message = failed["error"]?["message"]?.stringValue ?? ""
            #expect(message.contains(gone) && message.contains("404"), "\(message)")
            #expect(message.contains(refused) && message.contains("403"), "\(message)")
            #expect(Self.dropped(failed)[gone]?.stringValue?.contains("404") == true, "\(failed.serializedString())")
            #expect(Self.dropped(failed)[refused]?.stringValue?.contains("403") == true)

            let size = 1 << 20
            let good = "\(origin.baseURL)/bytes/\(size)"
            let saved = try daemon.enqueue(["url": .string(gone), "mirrors": [.string(good)], "name": "saved.bin"])
            let done = try daemon.waitForState(saved, ["completed", "failed"], timeout: 60)
            #expect(done["state"] == "completed", "\(done.serializedString())")
            try expectOriginBytes(at: daemon.downloadDir + "/saved.bin", count: size)
            #expect(Self.dropped(done)[gone]?.stringValue?.contains("404") == true, "\(done.serializedString())")
        }
    }

    /// `mirrors` is checked as `url` is: a bad scheme or a repeated URL is refused, and a
    /// password in a mirror's URL is never shown.
    @Test func mirrorsAreValidatedAndRedacted() async throws {
        let daemon = try DaemonHarness(config: quickRetries)
        try daemon.start()
        defer { daemon.stop() }
        let scheme = try daemon.callError("enqueue", ["url": "http://127.0.0.1:9/a", "mirrors": ["ftp://127.0.0.1/a"], "paused": true])
        // The same error as the same scheme in `url`.
        let asURL = try daemon.callError("enqueue", ["url": "ftp://127.0.0.1/a", "paused": true])
        #expect(scheme.code == asURL.code && scheme.stableCode == asURL.stableCode, "\(scheme.code) \(scheme.message); url: \(asURL.code)")
        #expect(scheme.message.contains("mirrors[0]"), "\(scheme.message)")
        let twice = try daemon.callError("enqueue", ["url": "http://127.0.0.1:9/a", "mirrors": ["http://127.0.0.1:9/a"], "paused": true])
        #expect(twice.message.contains("twice"), "\(twice.message)")
        let id = try daemon.enqueue(["url": "http://127.0.0.1:9/a", "mirrors": ["http://user:secret@127.0.0.1:9/b"], "paused": true])
        let job = try daemon.job(id)
        #expect(!job.serializedString().contains("secret"), "\(job.serializedString())")
        #expect(job["mirrors"]?.arrayValue?.count == 2)
        // A group's member takes mirrors too.
        let group = try daemon.call(
            "enqueue",
            [
                "group": ["name": "g", "dir": .string(daemon.downloadDir + "/g")], "paused": true,
                "jobs": [["url": "http://127.0.0.1:9/m", "mirrors": ["http://127.0.0.1:9/n"]]],
            ])
        let member = try daemon.job(try #require(group["results"]?[0]?["id"]?.int64Value))
        #expect(member["mirrors"]?.arrayValue?.compactMap { $0["url"]?.stringValue } == ["http://127.0.0.1:9/m", "http://127.0.0.1:9/n"])
        // dlctl: --mirror, repeatable.
        let out = try daemon.dlctl([
            "enqueue", "--paused", "--name", "cli.bin", "http://127.0.0.1:9/c", "--mirror", "http://127.0.0.1:9/d", "--mirror",
            "http://127.0.0.1:9/e",
        ])
        #expect(out.status == 0, "\(out.stderr)")
        let cli = try daemon.job(try #require(Int64(out.stdout.trimmingCharacters(in: .whitespacesAndNewlines))))
        #expect(
            cli["mirrors"]?.arrayValue?.compactMap { $0["url"]?.stringValue } == [
                "http://127.0.0.1:9/c", "http://127.0.0.1:9/d", "http://127.0.0.1:9/e",
            ])
    }
}
