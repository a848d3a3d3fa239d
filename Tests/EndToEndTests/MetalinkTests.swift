import DLCore
import DLRPC
import DLTestSupport
import DLTransfer
import Foundation
import Testing

/// Metalink (issue 30) with the real dld and loopback origins: mirrors by priority, a dead and
/// a corrupt mirror, piece hashes, a group, dlctl --metalink, aria2c on the same document,
/// hostile documents.
@Suite(.serialized) struct MetalinkTests {
    static let pieceLength = 1 << 20

    /// The hex digest of `bytes`.
    static func hex(_ algorithm: DigestAlgorithm, _ bytes: ArraySlice<UInt8>) throws -> String {
        let digest = try #require(StreamingDigest(algorithm))
        bytes.withUnsafeBytes { digest.update($0) }
        return digest.finalize()
    }

    /// A `<file>` of `size` origin bytes with its sha-256, its sha-1 pieces and these URLs
    /// (`url`, `priority`).
    static func file(_ name: String, size: Int, urls: [(String, Int)]) throws -> String {
        let bytes = TestOrigin.bytes(count: size)
        var pieces = ""
        for start in stride(from: 0, to: size, by: pieceLength) {
            pieces += "<hash>\(try hex(.sha1, bytes[start..<min(size, start + pieceLength)]))</hash>"
        }
        let links = urls.map { "<url priority=\"\($0.1)\">\($0.0.replacingOccurrences(of: "&", with: "&amp;"))</url>" }.joined()
        return """
            <file name="\(name)"><size>\(size)</size><hash type="sha-256">\(try hex(.sha256, bytes[...]))</hash>\
            <pieces length="\(pieceLength)" type="sha-1">\(pieces)</pieces>\(links)</file>
            """
    }

    static func document(_ files: [String]) -> String {
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<metalink xmlns=\"urn:ietf:params:xml:ns:metalink\">\n"
            + files.joined(separator: "\n") + "\n</metalink>\n"
    }

    static let config = quickRetries + "\nsegments = 4\nsegment_min_size = 1048576\n"

    /// Three mirrors: the first (by priority) serves piece 0 with a flipped byte, the second
    /// answers 404, the third is good. The file ends exact: the bad piece was fetched again
    /// from the good mirror, the dead one is dropped with its reason, and the corrupt one
    /// (one bad piece) stays.
    @Test func deadAndCorruptMirrors() async throws {
        let size = 6 << 20
        try await withOrigin { good in
            try await withStarted(try await TestOrigin.start()) { corrupt in
                let corruptURL = "\(corrupt.baseURL)/bytes/\(size)?corrupt=1000&rate=8000000"
                let deadURL = "\(good.baseURL)/status/404"
                let goodURL = "\(good.baseURL)/bytes/\(size)?rate=8000000"
                let xml = Self.document([try Self.file("mirrored.bin", size: size, urls: [(corruptURL, 1), (deadURL, 2), (goodURL, 3)])])
                let daemon = try DaemonHarness(config: Self.config)
                try daemon.start()
                defer { daemon.stop() }
                let reply = try daemon.call("enqueue", ["metalink": .string(xml)])
                let id = try #require(reply["job"]?["id"]?.int64Value)
                #expect(reply["job"]?["url"]?.stringValue == corruptURL)
                #expect(reply["job"]?["pieces"] == ["type": "sha1", "length": .int(Int64(Self.pieceLength)), "count": 6])
                #expect(reply["job"]?["checksum"]?.stringValue?.hasPrefix("sha256:") == true)
                let done = try daemon.waitForState(id, ["completed", "failed"], timeout: 120)
                #expect(done["state"] == "completed", "\(done.serializedString())")
                try expectOriginBytes(at: daemon.downloadDir + "/mirrored.bin", count: size)
                // Piece 0 came again from the good mirror.
                #expect(
                    good.requests.contains { $0.uri.hasPrefix("/bytes/") && $0.header("range") == "bytes=0-\(Self.pieceLength - 1)" },
                    "\(good.requests.map { "\($0.uri) \($0.header("range") ?? "-")" })")
                let dropped = MirrorTests.dropped(done)
                #expect(dropped[deadURL]?.stringValue?.contains("404") == true, "\(done.serializedString())")
                #expect(dropped[corruptURL] == .null && dropped[goodURL] == .null, "\(done.serializedString())")
            }
        }
    }

    /// A mirror that serves every piece bad is dropped with `bad_piece` after three; the file
    /// ends exact from the good one.
    @Test func mirrorWithBadPiecesIsDropped() async throws {
        let size = 6 << 20
        try await withOrigin { good in
            try await withStarted(try await TestOrigin.start()) { corrupt in
                let corruptURL = "\(corrupt.baseURL)/bytes/\(size)?corrupt=7&corrupt_every=\(Self.pieceLength)&rate=8000000"
                let goodURL = "\(good.baseURL)/bytes/\(size)?rate=8000000"
                let xml = Self.document([try Self.file("worse.bin", size: size, urls: [(corruptURL, 1), (goodURL, 2)])])
                let daemon = try DaemonHarness(config: Self.config)
                try daemon.start()
                defer { daemon.stop() }
                let id = try #require(try daemon.call("enqueue", ["metalink": .string(xml)])["job"]?["id"]?.int64Value)
                let done = try daemon.waitForState(id, ["completed", "failed"], timeout: 120)
                #expect(done["state"] == "completed", "\(done.serializedString())")
                try expectOriginBytes(at: daemon.downloadDir + "/worse.bin", count: size)
                let reason = MirrorTests.dropped(done)[corruptURL]?.stringValue ?? ""
                #expect(reason.hasPrefix("bad_piece: 3 pieces"), "\(done.serializedString())")
                #expect(MirrorTests.dropped(done)[goodURL] == .null)
                // Found as the pieces landed, not only once the file was whole.
                #expect(daemon.log.contains("a piece does not match its hash"), "\(daemon.log.suffix(2000))")
            }
        }
    }

    /// One URL that serves a bad piece: it is asked once more, serves it bad again, and the
    /// job fails with `bad_piece`, naming the piece; the file never appears.
    @Test func badPieceFromEveryMirrorFails() async throws {
        let size = 3 << 20
        try await withOrigin { origin in
            let url = "\(origin.baseURL)/bytes/\(size)?corrupt=\(Self.pieceLength + 5)"
            let xml = Self.document([try Self.file("bad.bin", size: size, urls: [(url, 1)])])
            let daemon = try DaemonHarness(config: Self.config)
            try daemon.start()
            defer { daemon.stop() }
            let id = try #require(try daemon.call("enqueue", ["metalink": .string(xml)])["job"]?["id"]?.int64Value)
            let done = try daemon.waitForState(id, ["completed", "failed"], timeout: 120)
            #expect(done["state"] == "failed" && done["error"]?["code"] == "bad_piece", "\(done.serializedString())")
            #expect(done["error"]?["message"]?.stringValue?.contains("piece 1 (bytes \(Self.pieceLength)-") == true)
            #expect(origin.requests.contains { $0.header("range") == "bytes=\(Self.pieceLength)-\(2 * Self.pieceLength - 1)" })
            #expect(!FileManager.default.fileExists(atPath: daemon.downloadDir + "/bad.bin"))
        }
    }

    /// A Metalink URL (`.meta4`) of two files, one in a subfolder: the daemon fetches it and
    /// the files land together as a group named after it; aria2c given the same document gets
    /// the same bytes.
    @Test func multiFileGroupAndAria2() async throws {
        try await withOrigin { origin in
            let sizes = [3 << 20, 200_000]
            let xml = Self.document([
                try Self.file("a.bin", size: sizes[0], urls: [("\(origin.baseURL)/bytes/\(sizes[0])", 1)]),
                try Self.file("sub/b.bin", size: sizes[1], urls: [("\(origin.baseURL)/bytes/\(sizes[1])", 1)]),
            ])
            origin.setDocument("set.meta4", xml)
            let daemon = try DaemonHarness(config: Self.config)
            try daemon.start()
            defer { daemon.stop() }
            let reply = try daemon.call(
                "enqueue", ["url": .string("\(origin.baseURL)/doc/set.meta4"), "dir": .string(daemon.downloadDir + "/set")])
            let groupID = try #require(reply["group"]?["id"]?.int64Value, "\(reply.serializedString())")
            #expect(reply["group"]?["name"] == "set" && reply["count"] == 2)
            let status = try waitForGroup(daemon, .int(groupID), timeout: 120) {
                ["completed", "failed"].contains($0["group"]?["state"]?.stringValue ?? "")
            }
            #expect(status["group"]?["state"] == "completed", "\(status.serializedString())")
            try expectOriginBytes(at: daemon.downloadDir + "/set/a.bin", count: sizes[0])
            try expectOriginBytes(at: daemon.downloadDir + "/set/sub/b.bin", count: sizes[1])

            let folder = try makeTemporaryFolder("/tmp/dld-aria2-XXXXXX")
            defer { try? FileManager.default.removeItem(atPath: folder) }
            try Data(xml.utf8).write(to: URL(fileURLWithPath: folder + "/set.meta4"))
            let aria = try runProgram(
                "/usr/bin/aria2c", ["--metalink-file=\(folder)/set.meta4", "-d", folder + "/out", "--quiet=true", "--file-allocation=none"])
            #expect(aria.status == 0, "\(aria.stdout) \(aria.stderr)")
            for name in ["a.bin", "sub/b.bin"] {
                let ours = try Data(contentsOf: URL(fileURLWithPath: daemon.downloadDir + "/set/" + name))
                let theirs = try Data(contentsOf: URL(fileURLWithPath: folder + "/out/" + name))
                #expect(ours == theirs, "\(name) differs from aria2c's")
            }
        }
    }

    /// `dlctl enqueue --metalink FILE --wait` reads the file, sends it, and waits for the job.
    @Test func dlctlMetalink() async throws {
        try await withOrigin { origin in
            let size = 500_000
            let daemon = try DaemonHarness(config: Self.config)
            try daemon.start()
            defer { daemon.stop() }
            let file = daemon.root + "/one.meta4"
            let xml = Self.document([try Self.file("one.bin", size: size, urls: [("\(origin.baseURL)/bytes/\(size)", 1)])])
            try Data(xml.utf8).write(to: URL(fileURLWithPath: file))
            let result = try daemon.dlctl(["enqueue", "--metalink", file, "--name", "renamed.bin", "--wait"])
            #expect(result.status == 0, "\(result.stdout) \(result.stderr)")
            try expectOriginBytes(at: daemon.downloadDir + "/renamed.bin", count: size)
            let refused = try daemon.dlctl(["enqueue", "--metalink", file, "--checksum", "md5:\(String(repeating: "0", count: 32))"])
            #expect(refused.status != 0)
            // A .meta4 URL of two files, as any URL: the group is waited for.
            origin.setDocument(
                "two.meta4",
                Self.document([
                    try Self.file("x.bin", size: 1000, urls: [("\(origin.baseURL)/bytes/1000", 1)]),
                    try Self.file("y.bin", size: 2000, urls: [("\(origin.baseURL)/bytes/2000", 1)]),
                ]))
            let group = try daemon.dlctl(["enqueue", "\(origin.baseURL)/doc/two.meta4", "-d", daemon.downloadDir + "/two", "--wait"])
            #expect(group.status == 0 && group.stdout.contains("group"), "\(group.stdout) \(group.stderr)")
            try expectOriginBytes(at: daemon.downloadDir + "/two/y.bin", count: 2000)
        }
    }

    /// Hostile documents, inline and by URL, and a Metalink URL that cannot be fetched: each is
    /// `invalid_metalink` with its reason, and no job is created.
    @Test func hostileDocuments() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: Self.config)
            try daemon.start()
            defer { daemon.stop() }
            let escape = Self.document(["<file name=\"../../escape.bin\"><url>\(origin.baseURL)/bytes/10</url></file>"])
            let laughs = """
                <?xml version="1.0"?><!DOCTYPE m [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">]>
                <metalink xmlns="urn:ietf:params:xml:ns:metalink"><file name="&b;"><url>\(origin.baseURL)/bytes/10</url></file></metalink>
                """
            origin.setDocument("evil.meta4", escape)
            let cases: [([String: JSONValue], String)] = [
                (["metalink": .string(escape)], "leaves the destination folder"),
                (["metalink": .string(laughs)], "document type declaration"),
                (
                    ["metalink": .string(Self.document(["<file name=\"/etc/x\"><url>\(origin.baseURL)/bytes/10</url></file>"]))],
                    "is absolute"
                ),
                (["url": .string("\(origin.baseURL)/doc/evil.meta4")], "leaves the destination folder"),
                (["url": .string("\(origin.baseURL)/doc/missing.meta4")], "could not be fetched"),
            ]
            for (params, reason) in cases {
                let error = try daemon.callError("enqueue", params)
                #expect(error.code == -32011 && error.stableCode == "invalid_metalink", "\(error)")
                #expect(error.message.contains(reason), "\(error.message)")
            }
            #expect(try daemon.call("list")["jobs"]?.arrayValue?.isEmpty == true)
        }
    }

    /// RFC 6249 and RFC 3230: an answer with `Link: <URL>; rel=duplicate` and `Digest:
    /// SHA-256=…` gives a job without mirrors or checksum that mirror and that checksum; a job
    /// whose own checksum the server's Digest contradicts fails with checksum_mismatch.
    @Test func linkAndDigestHeaders() async throws {
        let size = 300_000
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: Self.config)
            try daemon.start()
            defer { daemon.stop() }
            let hex = try Self.hex(.sha256, TestOrigin.bytes(count: size)[...])
            let digest = try #require(Hex.decode(hex))
            func encoded(_ text: String) -> String { text.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? text }
            let mirror = "\(origin.baseURL)/bytes/\(size)?copy=2"
            let base64 = Data(digest).base64EncodedString()
            let url = "\(origin.baseURL)/bytes/\(size)?duplicate=\(encoded(mirror))&sha256=\(encoded(base64))"
            let id = try daemon.enqueue(["url": .string(url), "name": "announced.bin"])
            let done = try daemon.waitForState(id, ["completed", "failed"], timeout: 60)
            #expect(done["state"] == "completed", "\(done.serializedString())")
            #expect(done["checksum"]?.stringValue == "sha256:\(hex)", "\(done.serializedString())")
            #expect(MirrorTests.dropped(done) == [url: .null, mirror: .null], "\(done.serializedString())")
            try expectOriginBytes(at: daemon.downloadDir + "/announced.bin", count: size)

            // The client's checksum and the server's Digest disagree: neither is taken.
            let other = String(repeating: "0", count: 64)
            let contradicted = try daemon.enqueue(["url": .string(url), "name": "contradicted.bin", "checksum": .string("sha256:\(other)")])
            let failed = try daemon.waitForState(contradicted, ["completed", "failed"], timeout: 60)
            #expect(failed["error"]?["code"] == "checksum_mismatch", "\(failed.serializedString())")
            #expect(failed["error"]?["message"]?.stringValue?.contains("Digest header") == true, "\(failed.serializedString())")

            // A Digest that the bytes do not match fails the job that had no checksum.
            let wrong = Data(repeating: 7, count: 32).base64EncodedString()
            let lying = try daemon.enqueue([
                "url": .string("\(origin.baseURL)/bytes/\(size)?sha256=\(encoded(wrong))"), "name": "lying.bin",
            ])
            let lied = try daemon.waitForState(lying, ["completed", "failed"], timeout: 60)
            #expect(lied["error"]?["code"] == "checksum_mismatch", "\(lied.serializedString())")
            #expect(!FileManager.default.fileExists(atPath: daemon.downloadDir + "/lying.bin"))
        }
    }
}
