import DLCore
import Testing

/// The choices a Metalink's file makes for its job: URL order, the hash, the pieces' geometry.
@Suite struct MetalinkChoiceTests {
    /// URLs go by priority, then the preferred location among equals, then document order.
    @Test func urlOrderByPriorityThenLocation() {
        let file = MetalinkFile(
            name: "a.iso",
            urls: [
                MetalinkURL(url: "http://us.example/a.iso", priority: 2, location: "us"),
                MetalinkURL(url: "http://none.example/a.iso"),
                MetalinkURL(url: "http://fr.example/a.iso", priority: 1, location: "fr"),
                MetalinkURL(url: "http://de.example/a.iso", priority: 2, location: "de"),
                MetalinkURL(url: "http://de2.example/a.iso", priority: 1, location: "de"),
            ])
        #expect(
            file.orderedURLs(preferredLocation: nil) == [
                "http://fr.example/a.iso", "http://de2.example/a.iso", "http://us.example/a.iso", "http://de.example/a.iso",
                "http://none.example/a.iso",
            ])
        #expect(
            file.orderedURLs(preferredLocation: "DE") == [
                "http://de2.example/a.iso", "http://fr.example/a.iso", "http://de.example/a.iso", "http://us.example/a.iso",
                "http://none.example/a.iso",
            ])
        #expect(file.orderedURLs(preferredLocation: nil, limit: 2) == ["http://fr.example/a.iso", "http://de2.example/a.iso"])
    }

    /// The strongest whole-file hash wins: sha-512 > sha-256 > sha-1 > md5.
    @Test func strongestHash() {
        let md5 = Checksum(algorithm: .md5, hex: String(repeating: "a", count: 32))
        let sha1 = Checksum(algorithm: .sha1, hex: String(repeating: "b", count: 40))
        let sha256 = Checksum(algorithm: .sha256, hex: String(repeating: "c", count: 64))
        let sha512 = Checksum(algorithm: .sha512, hex: String(repeating: "d", count: 128))
        #expect(MetalinkFile(name: "x", hashes: [md5, sha256, sha1]).checksum == sha256)
        #expect(MetalinkFile(name: "x", hashes: [sha512, md5]).checksum == sha512)
        #expect(MetalinkFile(name: "x", hashes: [md5, sha1]).checksum == sha1)
        #expect(MetalinkFile(name: "x", hashes: []).checksum == nil)
    }

    /// Pieces cut the file in `length`-byte ranges, the last one shorter.
    @Test func pieceGeometry() {
        #expect(PieceHashes.count(size: 10, length: 4) == 3)
        #expect(PieceHashes.count(size: 8, length: 4) == 2)
        #expect(PieceHashes.count(size: 0, length: 4) == 0)
        let pieces = PieceHashes(algorithm: .sha1, length: 4, hashes: ["", "", ""])
        #expect(pieces.range(of: 0, size: 10) == 0..<4)
        #expect(pieces.range(of: 2, size: 10) == 8..<10)
    }

    /// A URL is read as a Metalink by its path's suffix only.
    @Test func metalinkURLs() {
        #expect(Metalink.isMetalinkURL("http://h/x.meta4"))
        #expect(Metalink.isMetalinkURL("https://h/dir/X.METALINK?sig=1"))
        #expect(!Metalink.isMetalinkURL("http://h/x.meta4.txt"))
        #expect(!Metalink.isMetalinkURL("http://h/x?f=a.meta4"))
        #expect(!Metalink.isMetalinkURL("http://h/x.iso"))
    }
}

extension MetalinkChoiceTests {
    /// The stored form reads back to the same hashes; its summary counts them without splitting.
    @Test func piecesStoredForm() {
        let pieces = PieceHashes(
            algorithm: .sha1, length: 262_144, hashes: [String(repeating: "a", count: 40), String(repeating: "b", count: 40)])
        #expect(pieces.encoded.hasPrefix("sha1:262144:aaaa"))
        #expect(PieceHashes(encoded: pieces.encoded) == pieces)
        #expect(PieceHashes.summary(encoded: pieces.encoded)?.count == 2)
        #expect(PieceHashes(encoded: "sha1:10:abc") == nil)
        #expect(PieceHashes(encoded: "tiger:10:") == nil)
        #expect(PieceHashes(encoded: "sha1:0:") == nil)
        #expect(PieceHashes(encoded: "garbage") == nil)
    }
}

extension MetalinkChoiceTests {
    /// A bad piece blames the sources that served any of its bytes; the third bad piece of one
    /// source drops it, once.
    @Test func pieceBlame() {
        let served: [(bytes: Range<Int64>, source: Int)] = [(0..<10, 0), (10..<20, 1), (20..<30, 0)]
        #expect(PieceBlame.suspects(of: 5..<15, in: served) == [0, 1])
        #expect(PieceBlame.suspects(of: 12..<18, in: served) == [1])
        #expect(PieceBlame.suspects(of: 30..<40, in: served).isEmpty)
        var blame = PieceBlame()
        let first = blame.blame(2)
        let second = blame.blame(2)
        let other = blame.blame(1)
        let third = blame.blame(2)
        let fourth = blame.blame(2)
        #expect(!first && !second && !other)
        #expect(third)
        #expect(!fourth)
        #expect(PieceBlame.reason(3, .sha1).hasPrefix("bad_piece: 3 pieces"))
    }
}

/// RFC 6249 `Link: rel=duplicate` and RFC 3230 `Digest` headers.
@Suite struct RFC6249Tests {
    /// Duplicates among several links and header values; other relations and bad URLs are left.
    @Test func duplicateLinks() {
        let values = [
            #"<http://a.example/f>; rel=duplicate; pri=1; geo=de, <http://m.example/f.meta4>; rel=describedby; type="application/metalink4+xml""#,
            #"<https://b.example/f>; rel="duplicate"; pri=2"#,
            #"<ftp://c.example/f>; rel=duplicate, <http://d.example/f>; rel="alternate duplicate""#,
            "garbage",
        ]
        #expect(RFC6249.duplicates(values) == ["http://a.example/f", "https://b.example/f", "http://d.example/f"])
    }

    /// SHA-256 from `Digest`, among others; a malformed one is none.
    @Test func digestHeader() {
        // sha256("abc")
        let abc = "ungWv48Bz+pBQUDeXa4iI7ADYaOWF3qctBD/YfIAFa0="
        #expect(
            RFC6249.sha256(digest: "MD5=kAFQmDzST7DWlj99KOF/cg==, SHA-256=\(abc)")?.hex
                == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        #expect(RFC6249.sha256(digest: "SHA-256=bm90IDMyIGJ5dGVz") == nil)
        #expect(RFC6249.sha256(digest: "MD5=kAFQmDzST7DWlj99KOF/cg==") == nil)
        #expect(RFC6249.sha256(digest: nil) == nil)
    }

    /// Found URLs join the mirrors once each, never the job's own, up to 16.
    @Test func mergedMirrors() {
        let merged = RFC6249.merged(
            [JobMirror(url: "http://b/f", dropped: "404")], url: "http://a/f",
            found: ["http://a/f", "http://b/f", "http://c/f", "http://c/f"])
        #expect(merged == [JobMirror(url: "http://b/f", dropped: "404"), JobMirror(url: "http://c/f")])
        let many = RFC6249.merged([], url: "http://a/f", found: (0..<30).map { "http://m\($0)/f" })
        #expect(many.count == 16)
    }
}

extension MetalinkChoiceTests {
    /// A piece can be checked once every one of its bytes is written, whichever ranges wrote
    /// them; only pieces near the bytes just written are looked at.
    @Test func landedPieces() {
        let pieces = PieceHashes(algorithm: .sha1, length: 10, hashes: Array(repeating: "", count: 4))
        var layout = SegmentLayout(size: 35)
        #expect(pieces.landed(near: 0..<35, layout: layout).isEmpty)
        // Two ranges: [0, 20) written up to 15, [20, 35) written up to 35.
        layout = SegmentLayout(size: 35, prefix: 15)
        guard let split = SegmentLayout(encoded: "0-15-20,20-35-35", size: 35) else {
            Issue.record("the layout does not read")
            return
        }
        #expect(pieces.landed(near: 0..<15, layout: layout) == [0])
        #expect(pieces.landed(near: 20..<35, layout: split) == [2, 3])
        #expect(pieces.landed(near: 0..<15, layout: split) == [0])
        #expect(pieces.landed(near: 5..<15, layout: split) == [0])
    }
}
