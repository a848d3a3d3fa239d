import DLCore
import DLRPC
import DLTestSupport
import Foundation
import Testing

/// Few bytes wasted on the wire: a segmented download asks for every range with an end, the
/// first one too, and never asks again for bytes another connection has in flight; so with a
/// server that honours range ends, the bytes served stay within 1.05 × the file (1.1 × when the
/// first answer is a 429 or 503 with Retry-After). Loopback at full speed is where a stream
/// cut short wastes the most (its socket buffers are full). Bytes are asserted, never times.
@Suite(.serialized) struct WireBytesTests {
    /// `bytes=a-b`, both ends given.
    static func hasEnd(_ range: String?) -> Bool {
        guard let range, range.hasPrefix("bytes="), let dash = range.firstIndex(of: "-") else { return false }
        let first = range[range.index(range.startIndex, offsetBy: 6)..<dash]
        let last = range[range.index(after: dash)...]
        guard let a = Int64(first), let b = Int64(last) else { return false }
        return a <= b
    }

    /// Downloads `uri` as `name` with the running daemon, checks the file is the origin's
    /// `size` bytes, and returns what the origin served for it and the ranges it was asked for.
    static func download(
        _ uri: String, name: String, size: Int64, daemon: DaemonHarness, origin: TestOrigin,
        sourceLocation: SourceLocation = #_sourceLocation
    ) throws -> (served: Int64, ranges: [String?]) {
        let id = try daemon.enqueue(["url": .string(origin.baseURL + uri), "name": .string(name)])
        let done = try daemon.waitForState(id, ["completed", "failed"], timeout: 120)
        #expect(done["state"] == "completed", "\(done.serializedString())", sourceLocation: sourceLocation)
        try expectOriginBytes(at: daemon.downloadDir + "/" + name, count: Int(size), sourceLocation: sourceLocation)
        return (origin.bytesServed(uri: uri), origin.requests.filter { $0.uri == uri }.map { $0.header("range") })
    }

    /// Downloads of 5, 12 and 20 MiB in ranges (default segments): the origin serves at most
    /// 1.05 × each file, every request of each carries a range with an end, and each file is
    /// byte-exact.
    @Test func segmentedDownloadsSendLittleMoreThanTheFile() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: quickRetries + "\nsegments = 4\n")
            try daemon.start()
            defer { daemon.stop() }
            for mib in [5, 12, 20] {
                let size = Int64(mib) << 20
                let (served, ranges) = try Self.download(
                    "/bytes/\(size)", name: "wire-\(mib).bin", size: size, daemon: daemon, origin: origin)
                #expect(Double(served) <= 1.05 * Double(size), "\(mib) MiB: served \(served) (\(Double(served) / Double(size)) ×)")
                #expect(ranges.count >= 2, "\(mib) MiB was fetched in ranges: \(ranges)")
                #expect(ranges.allSatisfy(Self.hasEnd), "\(ranges)")
            }
        }
    }

    /// The first answer is a 503, then a 429, with Retry-After: the download waits, starts
    /// again, and the origin serves at most 1.1 × the file.
    @Test func aFirstRefusalWastesLittle() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: quickRetries + "\nsegments = 4\n")
            try daemon.start()
            defer { daemon.stop() }
            let size: Int64 = 8 << 20
            for status in ["503", "429"] {
                let (served, ranges) = try Self.download(
                    "/fail_first/1/bytes/\(size)?fail_status=\(status)", name: "refused-\(status).bin", size: size, daemon: daemon,
                    origin: origin)
                #expect(Double(served) <= 1.1 * Double(size), "after a \(status): served \(served) (\(Double(served) / Double(size)) ×)")
                #expect(ranges.count >= 3, "\(ranges)")
                #expect(ranges.allSatisfy(Self.hasEnd), "\(ranges)")
            }
        }
    }
}
