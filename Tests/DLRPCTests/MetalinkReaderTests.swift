import DLCore
import DLRPC
import DLTestSupport
import Foundation
import Testing

/// Metalink documents read with FoundationXML: versions 4 and 3, and hostile ones, each refused
/// with `invalid_metalink` and its reason.
@Suite struct MetalinkReaderTests {
    static let sha256 = String(repeating: "ab", count: 32)
    static let sha1A = String(repeating: "1", count: 40)
    static let sha1B = String(repeating: "2", count: 40)

    static let v4 = """
        <?xml version="1.0" encoding="UTF-8"?>
        <metalink xmlns="urn:ietf:params:xml:ns:metalink" xmlns:x="urn:example:ext">
          <generator>test</generator>
          <file name="dir/example.iso">
            <x:ignored>extension</x:ignored>
            <size>10</size>
            <hash type="md5">\(String(repeating: "0", count: 32))</hash>
            <hash type="sha-256">\(sha256.uppercased())</hash>
            <hash type="tiger">whatever</hash>
            <pieces length="8" type="sha-1"><hash>\(sha1A)</hash><hash>\(sha1B)</hash></pieces>
            <url location="us" priority="2">http://us.example/example.iso</url>
            <url location="de" priority="1">https://de.example/example.iso</url>
            <url priority="1">ftp://ftp.example/example.iso</url>
            <url>http://last.example/example.iso</url>
            <metaurl mediatype="torrent">http://example/example.torrent</metaurl>
          </file>
          <file name="b.txt"><url>http://h.example/b.txt</url></file>
        </metalink>
        """

    static func doc(_ files: String) -> String { MetalinkFixture.document(files) }

    static func refusal(_ text: String, limits: MetalinkLimits = MetalinkLimits()) -> String? {
        do {
            _ = try MetalinkReader.parse(text, limits: limits)
            return nil
        } catch {
            #expect(error.code == .invalidMetalink)
            return error.message
        }
    }

    /// A version 4 document: names, size, the hashes of known types, the pieces, the http(s)
    /// URLs with their priorities and locations; extensions and ftp are left.
    @Test func readsVersion4() throws {
        let metalink = try MetalinkReader.parse(Self.v4)
        #expect(metalink.version == .v4)
        #expect(metalink.files.map(\.name) == ["dir/example.iso", "b.txt"])
        let file = try #require(metalink.files.first)
        #expect(file.size == 10)
        #expect(file.hashes.map(\.algorithm) == [.md5, .sha256])
        #expect(file.checksum == Checksum(algorithm: .sha256, hex: Self.sha256))
        #expect(file.pieces == PieceHashes(algorithm: .sha1, length: 8, hashes: [Self.sha1A, Self.sha1B]))
        #expect(
            file.urls == [
                MetalinkURL(url: "http://us.example/example.iso", priority: 2, location: "us"),
                MetalinkURL(url: "https://de.example/example.iso", priority: 1, location: "de"),
                MetalinkURL(url: "http://last.example/example.iso"),
            ])
        #expect(
            file.orderedURLs(preferredLocation: nil) == [
                "https://de.example/example.iso", "http://us.example/example.iso", "http://last.example/example.iso",
            ])
        #expect(metalink.files[1].size == nil && metalink.files[1].checksum == nil && metalink.files[1].pieces == nil)
    }

    /// A version 3 document as aria2 reads it: files in <files>, hashes and pieces in
    /// <verification>, URLs in <resources> with `preference` (higher first).
    @Test func readsVersion3() throws {
        let text = """
            <?xml version="1.0" encoding="utf-8"?>
            <metalink version="3.0" xmlns="http://www.metalinker.org/">
              <files>
                <file name="v3.bin">
                  <size>9</size>
                  <verification>
                    <hash type="sha1">\(Self.sha1A)</hash>
                    <hash type="sha256">\(Self.sha256)</hash>
                    <pieces length="5" type="sha1"><hash piece="0">\(Self.sha1A)</hash><hash piece="1">\(Self.sha1B)</hash></pieces>
                  </verification>
                  <resources>
                    <url type="http" location="jp" preference="10">http://low.example/v3.bin</url>
                    <url type="http" preference="100">http://high.example/v3.bin</url>
                    <url type="ftp" preference="100">ftp://ftp.example/v3.bin</url>
                  </resources>
                </file>
              </files>
            </metalink>
            """
        let metalink = try MetalinkReader.parse(text)
        #expect(metalink.version == .v3)
        let file = try #require(metalink.files.first)
        #expect(file.size == 9)
        #expect(file.checksum?.algorithm == .sha256)
        #expect(file.pieces?.hashes == [Self.sha1A, Self.sha1B])
        #expect(file.orderedURLs(preferredLocation: "jp") == ["http://high.example/v3.bin", "http://low.example/v3.bin"])
    }

    /// Pieces of several types: the strongest is kept. Without a size they are left.
    @Test func strongestPieces() throws {
        let sha256Pieces = "<pieces length=\"4\" type=\"sha-256\"><hash>\(Self.sha256)</hash></pieces>"
        let sha1Pieces = "<pieces length=\"4\" type=\"sha-1\"><hash>\(Self.sha1A)</hash></pieces>"
        let file = try #require(
            try MetalinkReader.parse(Self.doc("<file name=\"a\"><size>4</size>\(sha1Pieces)\(sha256Pieces)<url>http://h/a</url></file>"))
                .files.first)
        #expect(file.pieces?.algorithm == .sha256)
        let unsized = try #require(
            try MetalinkReader.parse(Self.doc("<file name=\"a\">\(sha1Pieces)<url>http://h/a</url></file>")).files.first)
        #expect(unsized.pieces == nil)
    }

    /// Each hostile or broken document is refused with a reason that names the problem.
    @Test func refusesHostileDocuments() {
        let url = "<url>http://h/a</url>"
        let cases: [(String, String)] = [
            (Self.doc("<file name=\"../x\">\(url)</file>"), "leaves the destination folder"),
            (Self.doc("<file name=\"a/../../x\">\(url)</file>"), "leaves the destination folder"),
            (Self.doc("<file name=\"/etc/passwd\">\(url)</file>"), "is absolute"),
            (Self.doc("<file name=\"a&#10;b\">\(url)</file>"), "control character"),
            (Self.doc("<file name=\"\">\(url)</file>"), "1 to 1024 bytes"),
            (Self.doc("<file>\(url)</file>"), "has no name"),
            (Self.doc("<file name=\"a\">\(url)</file><file name=\"a\">\(url)</file>"), "given twice"),
            (Self.doc("<file name=\"a\"><url>ftp://h/a</url></file>"), "no http or https URL"),
            (Self.doc("<file name=\"a\"><url>http://</url></file>"), "URL"),
            (Self.doc("<file name=\"a\"><size>-1</size>\(url)</file>"), "not a byte count"),
            (Self.doc("<file name=\"a\"><size>99999999999999999999</size>\(url)</file>"), "not a byte count"),
            (Self.doc("<file name=\"a\"><hash type=\"sha-256\">abc</hash>\(url)</file>"), "64 hex digits"),
            (Self.doc("<file name=\"a\"><url priority=\"0\">http://h/a</url></file>"), "priority"),
            (
                Self.doc(
                    "<file name=\"a\"><size>9</size><pieces length=\"4\" type=\"sha-1\"><hash>\(Self.sha1A)</hash></pieces>\(url)</file>"),
                "1 piece hashes for 3 pieces"
            ),
            (Self.doc("<file name=\"a\"><size>9</size><pieces length=\"0\" type=\"sha-1\"></pieces>\(url)</file>"), "piece length"),
            (Self.doc(""), "lists no <file>"),
            ("<metalink xmlns=\"urn:other\"><file name=\"a\">\(url)</file></metalink>", "namespace"),
            ("<html><body/></html>", "not <metalink>"),
            ("<metalink xmlns=\"urn:ietf:params:xml:ns:metalink\"><file name=\"a\">", "not well-formed XML"),
            ("", "empty"),
            ("not xml at all", "not well-formed XML"),
            (
                """
                <?xml version="1.0"?>
                <!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">]>
                <metalink xmlns="urn:ietf:params:xml:ns:metalink"><file name="&lol2;">\(url)</file></metalink>
                """, "document type declaration"
            ),
            (
                "<!DOCTYPE m SYSTEM \"file:///etc/passwd\"><metalink xmlns=\"urn:ietf:params:xml:ns:metalink\"/>",
                "document type declaration"
            ),
            ("<?xml version=\"1.0\" encoding=\"ISO-8859-7\"?>" + Self.doc("<file name=\"a\">\(url)</file>"), "encoding"),
            (Self.doc(String(repeating: "<x>", count: 40) + String(repeating: "</x>", count: 40)), "nested deeper than 16"),
        ]
        for (text, reason) in cases {
            let message = Self.refusal(text)
            #expect(message?.contains(reason) == true, "\(text.prefix(120)): \(message ?? "accepted")")
            #expect(message?.hasPrefix("invalid metalink: ") == true)
        }
        // UTF-16: libxml2 would read it, and the scan for a DTD would not see one.
        var utf16 = Data([0xFF, 0xFE])
        utf16.append(Self.doc("<file name=\"a\">\(url)</file>").data(using: .utf16LittleEndian) ?? Data())
        #expect(throws: DLError.self) { try MetalinkReader.parse(utf16) }
    }

    /// Found by fuzz-metalink: `<?xmlurn:…?>` is a processing instruction without data, which
    /// FoundationXML read with strlen(NULL), and the process died (SIGSEGV). Processing
    /// instructions are refused before parsing now; the XML declaration still reads.
    @Test func processingInstructionWithoutDataIsRefused() {
        let crashing =
            "<?xmlurn:ietf:params:xml:ns:metlaink?>\n<metalink xmlns=\"urn:ietf:params:xml:ns:metalink\">\n  <file name=\"diml:ns:metalink\"><file name=\"../x\"><url>http://h/pab</has2</hash></piehttp://h.example/b.txt</url></file>\n</metalink>\n"
        #expect(Self.refusal(crashing)?.contains("processing instruction") == true)
        #expect(
            Self.refusal("<?pi?>" + Self.doc("<file name=\"a\"><url>http://h/a</url></file>"))?.contains("processing instruction") == true)
        #expect(Self.refusal(Self.doc("<file name=\"a\"><?x?><url>http://h/a</url></file>"))?.contains("processing instruction") == true)
        #expect(Self.refusal("\u{FEFF}<?xml version=\"1.0\"?>" + Self.doc("<file name=\"a\"><url>http://h/a</url></file>")) == nil)
    }

    /// The limits: bytes, elements, files, URLs and pieces, each named when broken.
    @Test func limits() {
        var limits = MetalinkLimits()
        limits.maxBytes = 100
        #expect(Self.refusal(Self.v4, limits: limits)?.contains("at most 100") == true)
        limits = MetalinkLimits()
        limits.maxFiles = 1
        #expect(Self.refusal(Self.v4, limits: limits)?.contains("2 files; at most 1") == true)
        limits = MetalinkLimits()
        limits.maxElements = 10
        #expect(Self.refusal(Self.v4, limits: limits)?.contains("more than 10 elements") == true)
        limits = MetalinkLimits()
        limits.maxURLsPerFile = 2
        #expect(Self.refusal(Self.v4, limits: limits)?.contains("URLs; at most 2") == true)
        limits = MetalinkLimits()
        limits.maxPieces = 1
        #expect(Self.refusal(Self.v4, limits: limits)?.contains("piece hashes; at most 1") == true)
        limits = MetalinkLimits()
        limits.maxTextBytes = 20
        #expect(Self.refusal(Self.v4, limits: limits)?.contains("more than 20 bytes of text") == true)
        #expect(Self.refusal(Self.v4) == nil)
    }

    static func mutate(_ input: [UInt8], _ rng: inout SplitMix64) -> [UInt8] {
        let interesting: [[UInt8]] = [
            Array("<".utf8), Array(">".utf8), Array("</file>".utf8), Array("<file name=\"../a\">".utf8), Array("&amp;".utf8),
            Array("&#0;".utf8), Array("<![CDATA[x]]>".utf8), Array("<size>".utf8), Array("99999999999999999999".utf8),
            Array("<pieces length=\"1\" type=\"sha-1\">".utf8), Array("xmlns=\"http://www.metalinker.org/\"".utf8), [0xFF],
            [0xC0, 0x80], Array(String(repeating: "<a>", count: 30).utf8), Array("\"".utf8),
        ]
        return Mutator.mutate(input, interesting: interesting, maxRepeat: 40, using: &rng)
    }

    /// 20 000 mutated documents (replay with DLD_TEST_SEED): each is a Metalink that keeps the
    /// promises (safe relative names, at least one http(s) URL a file, hashes of the right
    /// length, pieces that cover the size) or an `invalid_metalink` error; nothing traps.
    @Test func mutatedDocuments() {
        let seed = SplitMix64.testSeed()
        var rng = SplitMix64(state: seed)
        let seeds = [Array(Self.v4.utf8), Array(Self.doc("<file name=\"a\"><size>3</size><url>http://h/a</url></file>").utf8)]
        for round in 0..<20_000 {
            let input = Self.mutate(seeds[round % seeds.count], &rng)
            do {
                let metalink = try MetalinkReader.parse(Data(input))
                for file in metalink.files {
                    #expect(!file.name.hasPrefix("/") && !file.name.split(separator: "/").contains(".."), "seed \(seed) round \(round)")
                    #expect(!file.urls.isEmpty, "seed \(seed) round \(round)")
                    #expect(file.hashes.allSatisfy { $0.hex.count == $0.algorithm.hexLength }, "seed \(seed) round \(round)")
                    if let pieces = file.pieces, let size = file.size {
                        #expect(pieces.hashes.count == PieceHashes.count(size: size, length: pieces.length), "seed \(seed) round \(round)")
                    }
                }
            } catch {
                #expect(error.code == .invalidMetalink, "seed \(seed) round \(round)")
            }
        }
    }
}
