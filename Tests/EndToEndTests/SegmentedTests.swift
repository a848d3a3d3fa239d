import DLCore
import DLRPC
import DLTestSupport
import Foundation
import Testing

/// Segmented downloads (issue 9): one file fetched as several ranges at once, each written in
/// place; resumed range by range after a crash; safe when the server stops honouring ranges or
/// the file changes. Bytes served by the origin are asserted, never times.
@Suite(.serialized) struct SegmentedTests {
    /// The ranged requests of a segmented download: `Range: bytes=a-b` with both ends.
    static func rangedRequests(_ origin: TestOrigin) -> [RecordedRequest] {
        origin.requests.filter { request in
            guard let range = request.header("range") else { return false }
            return !range.hasSuffix("-")
        }
    }

    /// A file over the threshold is fetched in several ranges, each guarded by If-Range; the
    /// file is byte-exact and its SHA-256 right; no byte is fetched twice.
    @Test func segmentedDownloadIsByteExact() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: quickRetries + "\nsegments = 4\n")
            try daemon.start()
            defer { daemon.stop() }
            let size = 24 << 20
            let id = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/\(size)?rate=8000000"), "name": "seg.bin"])
            let done = try daemon.waitForState(id, ["completed", "failed"], timeout: 120)
            #expect(done["state"] == "completed", "\(done.serializedString())")
            let path = daemon.downloadDir + "/seg.bin"
            try expectOriginBytes(at: path, count: size)
            #expect(done["sha256"]?.stringValue == (try sha256sum(path)))
            #expect(done["ranges"] == .null)
            let ranged = Self.rangedRequests(origin)
            #expect(ranged.count >= 3, "\(origin.requests.map { $0.header("range") ?? "-" })")
            // The first range had no validator to send yet; every later one is guarded.
            #expect(ranged.first?.header("range")?.hasPrefix("bytes=0-") == true)
            #expect(ranged.dropFirst().allSatisfy { $0.header("if-range") == "\"v1-\(size)\"" })
            // Ranges are split, never fetched twice: what the origin served is the file, plus
            // at most the tail of a stream cut where a split lowered its end.
            #expect(origin.bytesServed < Int64(size) + 8 << 20, "served \(origin.bytesServed) for \(size)")
            #expect(!FileManager.default.fileExists(atPath: path + ".part"))
        }
    }

    /// `segments = 1` (config) or a job's own `"segments": 1` fetches one stream.
    @Test func oneSegmentIsOneStream() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: quickRetries + "\nsegments = 4\n")
            try daemon.start()
            defer { daemon.stop() }
            let size = 8 << 20
            let id = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/\(size)"), "name": "one.bin", "segments": 1])
            let done = try daemon.waitForState(id, ["completed", "failed"], timeout: 60)
            #expect(done["state"] == "completed", "\(done.serializedString())")
            try expectOriginBytes(at: daemon.downloadDir + "/one.bin", count: size)
            #expect(origin.requests.count == 1)
            let refused = try daemon.callError("enqueue", ["url": .string("\(origin.baseURL)/bytes/1"), "segments": 0])
            #expect(refused.code == -32602)
            #expect(refused.message.contains("segments"), "\(refused.message)")
        }
    }

    /// Pause keeps every range's committed bytes (shown as `ranges`); resume asks each range
    /// for its rest and completes byte-exact, fetching little more than the file once.
    @Test func pauseAndResumeKeepEveryRange() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: quickRetries + "\nsegments = 4\n")
            try daemon.start()
            defer { daemon.stop() }
            let size: Int64 = 16 << 20
            let id = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/\(size)?rate=1500000"), "name": "paused.bin"])
            try daemon.waitForJob(id) { ($0["received"]?.int64Value ?? 0) > 4 << 20 }
            _ = try daemon.call("pause", ["id": .int(id)])
            let paused = try daemon.job(id)
            #expect(paused["state"] == "paused")
            let kept = try #require(paused["received"]?.int64Value)
            let ranges = try #require(paused["ranges"]?.arrayValue, "\(paused.serializedString())")
            let committed = ranges.reduce(Int64(0)) { sum, range in
                sum + (range.arrayValue?[1].int64Value ?? 0) - (range.arrayValue?[0].int64Value ?? 0)
            }
            #expect(committed == kept)
            let requestsBefore = origin.requests.count
            _ = try daemon.call("resume", ["id": .int(id)])
            let done = try daemon.waitForState(id, ["completed", "failed"], timeout: 120)
            #expect(done["state"] == "completed", "\(done.serializedString())")
            let path = daemon.downloadDir + "/paused.bin"
            try expectOriginBytes(at: path, count: Int(size))
            #expect(done["sha256"]?.stringValue == (try sha256sum(path)))
            let after = origin.requests.dropFirst(requestsBefore)
            #expect(after.allSatisfy { $0.header("if-range") == "\"v1-\(size)\"" })
            #expect(origin.bytesServed < size + 8 << 20, "served \(origin.bytesServed) for \(size)")
        }
    }

    /// SIGKILL in the middle of a segmented download, then a restart: every range continues
    /// from its own committed offset (If-Range), the file is byte-exact with the right SHA-256,
    /// and the origin serves little more than what was not committed.
    @Test func killedSegmentsResumeEveryRange() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: quickRetries + "\nsegments = 4\ncheckpoint_interval = 0.25\n")
            try daemon.start()
            let size: Int64 = 32 << 20
            let id = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/\(size)?rate=1500000"), "name": "killed.bin"])
            // Wait for committed ranges with bytes in more than one of them.
            let committed = try daemon.waitForJob(id, timeout: 60) { job in
                guard let ranges = job["ranges"]?.arrayValue else { return false }
                let started = ranges.filter { ($0.arrayValue?[1].int64Value ?? 0) > ($0.arrayValue?[0].int64Value ?? 0) }
                return started.count >= 3 && (job["received"]?.int64Value ?? 0) > size / 2
            }
            #expect(committed["state"] == "running")
            daemon.crash()
            let servedBefore = origin.bytesServed
            let requestsBefore = origin.requests.count
            try daemon.start()
            let resumed = try daemon.job(id)
            let kept = try #require(resumed["received"]?.int64Value)
            let ranges = try #require(resumed["ranges"]?.arrayValue)
            #expect(ranges.count >= 2, "\(resumed.serializedString())")
            #expect(kept > size / 4 && kept < size, "\(kept)")
            let done = try daemon.waitForState(id, ["completed", "failed"], timeout: 120)
            #expect(done["state"] == "completed", "\(done.serializedString())")
            let path = daemon.downloadDir + "/killed.bin"
            try expectOriginBytes(at: path, count: Int(size))
            #expect(done["sha256"]?.stringValue == (try sha256sum(path)))
            // Every request after the restart asks for a range, guarded by the validator.
            let after = origin.requests.dropFirst(requestsBefore)
            #expect(
                !after.isEmpty && after.allSatisfy { $0.header("range") != nil && $0.header("if-range") == "\"v1-\(size)\"" },
                "\(after.map { $0.header("range") ?? "-" })")
            // Far less than the whole file again: what was not committed, plus the tails of
            // streams cut by splits.
            let servedAfter = origin.bytesServed - servedBefore
            #expect(servedAfter < size - kept + 8 << 20, "served \(servedAfter) after the restart; \(kept) of \(size) were kept")
            #expect(servedAfter < size * 3 / 4, "served \(servedAfter) after the restart")
            daemon.stop()
        }
    }

    /// The server honours the first two ranged requests, then answers 200 with the whole file:
    /// the download falls back to one stream from the start and the file is right.
    @Test func rangesRefusedMidwayFallBackToOneStream() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: quickRetries + "\nsegments = 4\n")
            try daemon.start()
            defer { daemon.stop() }
            let size = 16 << 20
            let id = try daemon.enqueue([
                "url": .string("\(origin.baseURL)/bytes/\(size)?ranges_for=2&rate=8000000"), "name": "refused.bin",
            ])
            let done = try daemon.waitForState(id, ["completed", "failed"], timeout: 120)
            #expect(done["state"] == "completed", "\(done.serializedString())")
            let path = daemon.downloadDir + "/refused.bin"
            try expectOriginBytes(at: path, count: size)
            #expect(done["sha256"]?.stringValue == (try sha256sum(path)))
            #expect(daemon.waitForLog("stopped honouring ranges"), "\(daemon.log.suffix(3000))")
            #expect(Self.rangedRequests(origin).count >= 3)
        }
    }

    /// The file changes on the server while the download is stopped between its ranges: the
    /// resumed ranges' If-Range no longer matches, so the download starts over (the reason is
    /// logged) and ends with the new file, byte-exact.
    @Test func validatorChangeStartsOver() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: quickRetries + "\nsegments = 4\ncheckpoint_interval = 0.25\n")
            try daemon.start()
            let size: Int64 = 24 << 20
            let id = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/\(size)?rate=1500000"), "name": "changed.bin"])
            _ = try daemon.waitForJob(id, timeout: 60) { job in
                (job["ranges"]?.arrayValue?.count ?? 0) >= 2 && (job["received"]?.int64Value ?? 0) > 2 << 20
            }
            daemon.crash()
            origin.setETag("v2")
            let servedBefore = origin.bytesServed
            try daemon.start()
            let done = try daemon.waitForState(id, ["completed", "failed"], timeout: 120)
            #expect(done["state"] == "completed", "\(done.serializedString())")
            let path = daemon.downloadDir + "/changed.bin"
            try expectOriginBytes(at: path, count: Int(size))
            #expect(done["sha256"]?.stringValue == (try sha256sum(path)))
            #expect(daemon.waitForLog("changed (its validators differ)"), "\(daemon.log.suffix(3000))")
            // Started over: the whole file was served again after the restart.
            #expect(origin.bytesServed - servedBefore >= size)
            daemon.stop()
        }
    }
}
