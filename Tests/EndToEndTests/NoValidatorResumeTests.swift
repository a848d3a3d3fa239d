import DLCore
import DLRPC
import DLTestSupport
import Foundation
import Testing

/// Resume from a server that sends neither an ETag nor Last-Modified: the last 64 KiB on disk
/// are asked again in the same request (`Range: bytes=(offset - 64 KiB)-`) and compared with the
/// file; the resume goes on when they and the total agree, else the file starts over and the
/// job says why (`started_over`). Bytes and requests are asserted, never times.
@Suite(.serialized) struct NoValidatorResumeTests {
    static let size: Int64 = 1_500_000
    static let overlap: Int64 = 64 << 10

    /// The file's bytes equal the origin's stream from byte `variant` on.
    static func expectVariantBytes(at path: String, count: Int64, variant: Int64, sourceLocation: SourceLocation = #_sourceLocation) throws
    {
        let data = try Data(contentsOf: URL(fileURLWithPath: path))
        #expect(data.count == Int(count), sourceLocation: sourceLocation)
        #expect(data == Data(TestOrigin.bytes(from: variant, count: Int(count))), "content differs", sourceLocation: sourceLocation)
    }

    /// Enqueues `url` as `name`, and pauses it once more than 300 kB are in: its id and the
    /// committed bytes.
    static func pausedWithBytes(_ daemon: DaemonHarness, url: String, name: String) throws -> (id: Int64, kept: Int64) {
        let id = try daemon.enqueue(["url": .string(url), "name": .string(name)])
        try daemon.waitForJob(id) { ($0["received"]?.int64Value ?? 0) > 300_000 }
        _ = try daemon.call("pause", ["id": .int(id)])
        let kept = try #require(try daemon.job(id)["received"]?.int64Value)
        return (id, kept)
    }

    /// Waits until the running job says it started over (or stops running): its message.
    static func startedOver(_ daemon: DaemonHarness, _ id: Int64, sourceLocation: SourceLocation = #_sourceLocation) throws -> String {
        let over = try daemon.waitForJob(id) { $0["error"]?["code"] == "started_over" || $0["state"] != "running" }
        #expect(over["error"]?["code"] == "started_over", "\(over.serializedString())", sourceLocation: sourceLocation)
        return over["error"]?["message"]?.stringValue ?? ""
    }

    /// Paused after some bytes, then resumed: one request from 64 KiB before the kept offset,
    /// without If-Range; the bytes are kept and the file is byte-exact.
    @Test func resumesAfterComparingTheOverlap() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: quickRetries)
            try daemon.start()
            defer { daemon.stop() }
            let uri = "/bytes/\(Self.size)?novalidators&rate=400000"
            let (id, kept) = try Self.pausedWithBytes(daemon, url: origin.baseURL + uri, name: "plain.bin")
            #expect(kept > Self.overlap && kept < Self.size)
            let before = origin.requests.count
            _ = try daemon.call("resume", ["id": .int(id)])
            let done = try daemon.waitForState(id, ["completed", "failed"])
            #expect(done["state"] == "completed", "\(done.serializedString())")
            let path = daemon.downloadDir + "/plain.bin"
            try Self.expectVariantBytes(at: path, count: Self.size, variant: 0)
            #expect(done["sha256"]?.stringValue == (try sha256sum(path)))
            let resumed = Array(origin.requests.dropFirst(before))
            #expect(resumed.count == 1, "\(resumed.map { $0.header("range") ?? "-" })")
            #expect(resumed.first?.header("range") == "bytes=\(kept - Self.overlap)-")
            #expect(resumed.first?.header("if-range") == nil)
            #expect(!daemon.log.contains("starting over"), "\(daemon.log.suffix(2000))")
        }
    }

    /// The file changed on the server and kept its size: the bytes compared differ, so the
    /// download starts over, says why while it runs, and ends with the new file, byte-exact.
    /// (Trusting the bytes on disk would publish a mix of both files.)
    @Test func aFileChangedUnderTheSameSizeStartsOver() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: quickRetries)
            try daemon.start()
            defer { daemon.stop() }
            let uri = "/bytes/\(Self.size)?novalidators&rate=400000"
            let (id, kept) = try Self.pausedWithBytes(daemon, url: origin.baseURL + uri, name: "changed.bin")
            origin.setVariant(7)
            let servedBefore = origin.bytesServed(uri: uri)
            _ = try daemon.call("resume", ["id": .int(id)])
            let message = try Self.startedOver(daemon, id)
            #expect(message.contains("changed") && message.contains("\(kept) bytes dropped"), "\(message)")
            let done = try daemon.waitForState(id, ["completed", "failed"])
            #expect(done["state"] == "completed", "\(done.serializedString())")
            let path = daemon.downloadDir + "/changed.bin"
            try Self.expectVariantBytes(at: path, count: Self.size, variant: 7)
            #expect(done["sha256"]?.stringValue == (try sha256sum(path)))
            // The whole new file was fetched after the compared overlap.
            #expect(origin.bytesServed(uri: uri) - servedBefore >= Self.size)
            #expect(daemon.log.contains("starting over"))
        }
    }

    /// The file has another size now (a new URL by `change`): the total of the answer does
    /// not match the recorded size, so the download starts over and says so.
    @Test func anotherTotalStartsOver() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: quickRetries)
            try daemon.start()
            defer { daemon.stop() }
            let (id, _) = try Self.pausedWithBytes(
                daemon, url: "\(origin.baseURL)/bytes/\(Self.size)?novalidators&rate=400000", name: "resized.bin")
            let bigger = Self.size + 4096
            _ = try daemon.call("change", ["id": .int(id), "url": .string("\(origin.baseURL)/bytes/\(bigger)?novalidators&rate=400000")])
            _ = try daemon.call("resume", ["id": .int(id)])
            let message = try Self.startedOver(daemon, id)
            #expect(message.contains("\(bigger) bytes") && message.contains("\(Self.size)-byte"), "\(message)")
            let done = try daemon.waitForState(id, ["completed", "failed"])
            #expect(done["state"] == "completed", "\(done.serializedString())")
            try Self.expectVariantBytes(at: daemon.downloadDir + "/resized.bin", count: bigger, variant: 0)
        }
    }

    /// A 200 to the overlap request (the server ignores ranges now) still means start over,
    /// with the body that came.
    @Test func a200StillStartsOver() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: quickRetries)
            try daemon.start()
            defer { daemon.stop() }
            let uri = "/bytes/\(Self.size)?novalidators&rate=400000&ranges_for=0"
            let (id, _) = try Self.pausedWithBytes(daemon, url: origin.baseURL + uri, name: "whole.bin")
            let before = origin.requests.count
            _ = try daemon.call("resume", ["id": .int(id)])
            _ = try Self.startedOver(daemon, id)
            let done = try daemon.waitForState(id, ["completed", "failed"])
            #expect(done["state"] == "completed", "\(done.serializedString())")
            try Self.expectVariantBytes(at: daemon.downloadDir + "/whole.bin", count: Self.size, variant: 0)
            // One request: the 200's body was the new start, not asked for again.
            #expect(origin.requests.count - before == 1, "\(origin.requests.map { $0.header("range") ?? "-" })")
        }
    }

    /// A file over segment_min_size without validators stays one stream: its first request
    /// (a range with an end, as for any file that might be fetched in ranges) is continued by one
    /// request from 64 KiB before where it ended, checked the same way. Unchanged, the bytes
    /// are kept (two requests, the file plus 64 KiB served); changed between the two requests,
    /// the download starts over and ends with the new file.
    @Test func aLargerFileStaysOneStreamWithChecks() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: quickRetries + "\nsegments = 4\n")
            try daemon.start()
            defer { daemon.stop() }
            let size: Int64 = 6 << 20
            let first: Int64 = 4 << 20
            let uri = "/bytes/\(size)?novalidators"
            let kept = try daemon.enqueue(["url": .string(origin.baseURL + uri), "name": "kept.bin"])
            let done = try daemon.waitForState(kept, ["completed", "failed"])
            #expect(done["state"] == "completed", "\(done.serializedString())")
            try Self.expectVariantBytes(at: daemon.downloadDir + "/kept.bin", count: size, variant: 0)
            let asked = origin.requests.filter { $0.uri == uri }
            #expect(asked.map { $0.header("range") ?? "-" } == ["bytes=0-\(first - 1)", "bytes=\(first - Self.overlap)-\(size - 1)"])
            #expect(asked.allSatisfy { $0.header("if-range") == nil })
            #expect(origin.bytesServed(uri: uri) == size + Self.overlap)

            // Changed while the first range streams (its answer keeps the old bytes).
            let slow = "/bytes/\(size)?novalidators&rate=3000000"
            let changed = try daemon.enqueue(["url": .string(origin.baseURL + slow), "name": "changed.bin"])
            try daemon.waitForJob(changed) { ($0["received"]?.int64Value ?? 0) > 1 << 20 }
            origin.setVariant(3)
            let message = try Self.startedOver(daemon, changed)
            #expect(message.contains("changed"), "\(message)")
            let second = try daemon.waitForState(changed, ["completed", "failed"])
            #expect(second["state"] == "completed", "\(second.serializedString())")
            try Self.expectVariantBytes(at: daemon.downloadDir + "/changed.bin", count: size, variant: 3)
            let again = origin.requests.filter { $0.uri == slow }.map { $0.header("range") ?? "-" }
            #expect(again.prefix(2) == ["bytes=0-\(first - 1)", "bytes=\(first - Self.overlap)-\(size - 1)"], "\(again)")
            #expect(again.last == "-", "started over with the whole file: \(again)")
        }
    }
}
