import DLCore
import Foundation
import Testing

@Suite struct HLSParserTests {
    static let base = "https://cdn.example.com/video/master.m3u8"

    static func parse(_ text: String, base: String = base) -> Result<HLSPlaylist, DLError> {
        HLSParser.parse(Array(text.utf8), base: base)
    }

    static func media(_ text: String) throws -> HLSMedia {
        guard case .media(let media) = try parse(text).get() else { throw DLError(.internalError, "not a media playlist") }
        return media
    }

    static func code(_ text: String) -> DLError.Code? {
        if case .failure(let error) = parse(text) { return error.code }
        return nil
    }

    /// A master playlist's variants, with their attributes and URIs resolved against it.
    @Test func masterVariants() throws {
        let text = """
            #EXTM3U
            #EXT-X-VERSION:3
            #EXT-X-STREAM-INF:BANDWIDTH=800000,AVERAGE-BANDWIDTH=700000,RESOLUTION=640x360,CODECS="avc1.4d401e,mp4a.40.2"
            low/index.m3u8
            #EXT-X-STREAM-INF:BANDWIDTH=2500000,RESOLUTION=1280x720,CODECS="avc1.4d401f,mp4a.40.2"
            /abs/hi.m3u8?token=1
            #EXT-X-STREAM-INF:BANDWIDTH=64000,CODECS="mp4a.40.2"
            https://other.example.org/audio.m3u8
            """
        guard case .master(let master) = try Self.parse(text).get() else {
            Issue.record("not a master")
            return
        }
        #expect(master.variants.count == 3)
        #expect(master.variants[0].url == "https://cdn.example.com/video/low/index.m3u8")
        #expect(master.variants[0].bandwidth == 800_000)
        #expect(master.variants[0].averageBandwidth == 700_000)
        #expect(master.variants[0].height == 360)
        #expect(master.variants[0].width == 640)
        #expect(master.variants[0].codecs == "avc1.4d401e,mp4a.40.2")
        #expect(master.variants[1].url == "https://cdn.example.com/abs/hi.m3u8?token=1")
        #expect(master.variants[2].url == "https://other.example.org/audio.m3u8")
        #expect(master.variants[2].height == nil)
    }

    /// The highest bandwidth by default; within max_height / max_bandwidth; an explicit index.
    @Test func variantChoice() throws {
        var variants = [HLSVariant(url: "https://a/1", bandwidth: 800_000), HLSVariant(url: "https://a/2", bandwidth: 2_500_000)]
        variants[0].height = 360
        variants[1].height = 720
        variants.append(HLSVariant(url: "https://a/3", bandwidth: 64_000))
        #expect(try HLSVariantRequest().choose(from: variants).get() == 1)
        #expect(try HLSVariantRequest(maxHeight: 480).choose(from: variants).get() == 0)
        #expect(try HLSVariantRequest(maxBandwidth: 1_000_000).choose(from: variants).get() == 0)
        #expect(try HLSVariantRequest(maxHeight: 100).choose(from: variants).get() == 2)
        #expect(try HLSVariantRequest(maxBandwidth: 100_000).choose(from: variants).get() == 2)
        #expect(try HLSVariantRequest(index: 2).choose(from: variants).get() == 2)
        if case .failure(let error) = HLSVariantRequest(index: 3).choose(from: variants) {
            #expect(error.code == .invalidParams)
        } else {
            Issue.record("variant 3 of 3 was accepted")
        }
        if case .failure(let error) = HLSVariantRequest(maxBandwidth: 10).choose(from: variants) {
            #expect(error.message.contains("max_bandwidth 10"))
        } else {
            Issue.record("a variant within 10 b/s was found")
        }
    }

    /// Media playlists: durations, sequence numbers, byte ranges with the implicit offset, keys
    /// with rotation and both IV rules, init sections, discontinuities, the end tag.
    @Test func mediaPlaylist() throws {
        let text = """
            #EXTM3U
            #EXT-X-VERSION:7
            #EXT-X-TARGETDURATION:2
            #EXT-X-MEDIA-SEQUENCE:10
            #EXT-X-MAP:URI="init.mp4",BYTERANGE="720@0"
            #EXTINF:2.000,
            #EXT-X-BYTERANGE:1000@720
            all.mp4
            #EXTINF:1.5,title
            #EXT-X-BYTERANGE:500
            all.mp4
            #EXT-X-KEY:METHOD=AES-128,URI="k1.bin",IV=0x000102030405060708090a0b0c0d0e0f
            #EXTINF:2,
            seg3.m4s
            #EXT-X-KEY:METHOD=AES-128,URI="https://keys.example.com/k2"
            #EXT-X-DISCONTINUITY
            #EXTINF:2,
            seg4.m4s
            #EXT-X-KEY:METHOD=NONE
            #EXT-X-MAP:URI="init2.mp4"
            #EXTINF:2,
            seg5.m4s
            #EXT-X-ENDLIST
            """
        let media = try Self.media(text)
        #expect(media.targetDuration == 2)
        #expect(media.mediaSequence == 10)
        #expect(media.endList)
        #expect(media.segments.count == 5)
        let segments = media.segments
        #expect(segments.map(\.sequence) == [10, 11, 12, 13, 14])
        #expect(segments[0].range == HLSByteRange(offset: 720, length: 1000))
        #expect(segments[1].range == HLSByteRange(offset: 1720, length: 500))
        #expect(segments[1].duration == 1.5)
        #expect(segments[0].map == HLSMap(url: "https://cdn.example.com/video/init.mp4", range: HLSByteRange(offset: 0, length: 720)))
        #expect(segments[0].key == nil)
        #expect(segments[2].key?.url == "https://cdn.example.com/video/k1.bin")
        #expect(segments[2].key?.iv == Array(0...15))
        #expect(segments[3].key?.url == "https://keys.example.com/k2")
        #expect(segments[3].key?.iv == nil)
        #expect(segments[3].discontinuity)
        #expect(!segments[2].discontinuity)
        #expect(segments[4].key == nil)
        #expect(segments[4].map?.url == "https://cdn.example.com/video/init2.mp4")
        #expect(HLSParser.sequenceIV(13) == [UInt8](repeating: 0, count: 15) + [13])
        #expect(HLSParser.sequenceIV(0x0102) == [UInt8](repeating: 0, count: 14) + [1, 2])
    }

    static let live = """
        #EXTM3U
        #EXT-X-TARGETDURATION:4
        #EXTINF:4,
        a.ts
        """

    /// A playlist without EXT-X-ENDLIST parses, and says it is live.
    @Test func liveIsSeen() throws {
        #expect(try !Self.media(Self.live).endList)
        #expect(try Self.media(Self.live + "\n#EXT-X-ENDLIST\n").endList)
    }

    /// SAMPLE-AES, SAMPLE-AES-CTR and DRM key formats are refused as such; broken playlists as invalid.
    @Test func refusals() {
        let head = "#EXTM3U\n#EXT-X-TARGETDURATION:4\n"
        let tail = "\n#EXTINF:4,\na.ts\n#EXT-X-ENDLIST\n"
        #expect(Self.code(head + "#EXT-X-KEY:METHOD=SAMPLE-AES,URI=\"k\"" + tail) == .hlsUnsupportedEncryption)
        #expect(Self.code(head + "#EXT-X-KEY:METHOD=SAMPLE-AES-CTR,URI=\"k\"" + tail) == .hlsUnsupportedEncryption)
        #expect(
            Self.code(head + "#EXT-X-KEY:METHOD=AES-128,URI=\"skd://x\",KEYFORMAT=\"com.apple.streamingkeydelivery\"" + tail)
                == .hlsUnsupportedEncryption)
        #expect(Self.code(head + "#EXT-X-KEY:METHOD=AES-128,URI=\"k\",KEYFORMAT=\"identity\"" + tail) == nil)
        #expect(Self.code(head + "#EXT-X-KEY:METHOD=AES-128" + tail) == .hlsInvalid)
        #expect(Self.code(head + "#EXT-X-KEY:METHOD=AES-128,URI=\"k\",IV=0xZZ" + tail) == .hlsInvalid)
        #expect(Self.code("<html>not a playlist</html>") == .hlsInvalid)
        #expect(Self.code("") == .hlsInvalid)
        #expect(Self.code("#EXTM3U\n#EXTINF:4,\na.ts\n") == .hlsInvalid, "no target duration")
        #expect(Self.code(head + "a.ts\n") == .hlsInvalid, "a URI without EXTINF")
        #expect(Self.code(head + "#EXTINF:4,\n#EXT-X-BYTERANGE:100\na.ts\n") == .hlsInvalid, "an implicit offset with nothing before")
        #expect(Self.code(head + "#EXTINF:4,\n#EXT-X-BYTERANGE:100@0\na.ts\n#EXTINF:4,\n#EXT-X-BYTERANGE:100\nb.ts\n") == .hlsInvalid)
        #expect(Self.code(head + "#EXT-X-STREAM-INF:BANDWIDTH=1\nv.m3u8\n") == .hlsInvalid, "master and media tags")
        #expect(Self.code("#EXTM3U\n#EXT-X-STREAM-INF:RESOLUTION=1x1\nv.m3u8\n") == .hlsInvalid, "no BANDWIDTH")
        #expect(Self.code("#EXTM3U\n#EXT-X-STREAM-INF:BANDWIDTH=1\n") == .hlsInvalid, "no URI after it")
        #expect(Self.code(head + "#EXTINF:4,\nftp://x/a.ts\n") == .hlsInvalid, "a segment that is not http(s)")
        #expect(Self.code(head + "#EXTINF:abc,\na.ts\n") == .hlsInvalid)
        #expect(Self.code(head + "#EXT-X-MAP:URI=\"i.mp4\",BYTERANGE=\"0@0\"" + tail) == .hlsInvalid, "an empty range")
        #expect(
            Self.code(head + "#EXT-X-KEY:METHOD=AES-128,URI=\"k\"\n#EXT-X-MAP:URI=\"i.mp4\"" + tail) == .hlsInvalid,
            "an encrypted init section without IV")
    }

    /// The limits: bytes, line length, segments.
    @Test func limits() {
        let long = "#EXTM3U\n#" + String(repeating: "x", count: HLSLimits.maxLineBytes + 1) + "\n"
        #expect(Self.code(long) == .hlsInvalid)
        let big = [UInt8](repeating: 0x23, count: HLSLimits.maxPlaylistBytes + 1)
        if case .failure(let error) = HLSParser.parse(big, base: Self.base) {
            #expect(error.code == .hlsInvalid)
        } else {
            Issue.record("accepted")
        }
        var many = "#EXTM3U\n#EXT-X-TARGETDURATION:1\n"
        many += String(repeating: "#EXTINF:1,\na.ts\n", count: HLSLimits.maxSegments + 1)
        if case .failure(let error) = Self.parse(many) {
            #expect(error.message.contains("more than \(HLSLimits.maxSegments) segments"))
        } else {
            Issue.record("accepted \(HLSLimits.maxSegments + 1) segments")
        }
    }

    /// CRLF line ends, a byte order mark, blank lines, comments and unknown tags are fine.
    @Test func tolerant() throws {
        let text =
            "\u{FEFF}#EXTM3U\r\n\r\n# a comment\r\n#EXT-X-UNKNOWN:1\r\n#EXT-X-TARGETDURATION:4\r\n#EXTINF:4,\r\na.ts\r\n#EXT-X-ENDLIST\r\n"
        let media = try Self.media(text)
        #expect(media.segments.map(\.url) == ["https://cdn.example.com/video/a.ts"])
    }

    /// Attribute lists: quoted commas, duplicates refused.
    @Test func attributeLists() throws {
        let attributes = try HLSParser.attributes(#"BANDWIDTH=1,CODECS="a,b",RESOLUTION=2x3"#, line: 1)
        #expect(attributes == ["BANDWIDTH": "1", "CODECS": "a,b", "RESOLUTION": "2x3"])
        #expect(throws: DLError.self) { try HLSParser.attributes("A=1,A=2", line: 1) }
        #expect(throws: DLError.self) { try HLSParser.attributes(#"A="open"#, line: 1) }
        #expect(throws: DLError.self) { try HLSParser.attributes("a=1", line: 1) }
    }
}

@Suite struct HLSRecipeTests {
    static let text = """
        #EXTM3U
        #EXT-X-TARGETDURATION:2
        #EXT-X-MEDIA-SEQUENCE:5
        #EXT-X-MAP:URI="init.mp4"
        #EXTINF:2,
        #EXT-X-BYTERANGE:100@0
        all.mp4?x=1
        #EXTINF:2,
        #EXT-X-BYTERANGE:50
        all.mp4?x=1
        #EXT-X-KEY:METHOD=AES-128,URI="k1"
        #EXTINF:2,
        s3.m4s
        #EXT-X-KEY:METHOD=AES-128,URI="k2",IV=0x1
        #EXT-X-DISCONTINUITY
        #EXT-X-MAP:URI="init2.mp4"
        #EXTINF:1,
        s4.weird
        #EXT-X-ENDLIST
        """

    static func recipe() throws -> HLSRecipe {
        let media = try HLSParserTests.media(text)
        return try HLSRecipe.plan(media, layout: .file).get()
    }

    /// Each distinct URL is one member; ranges of one file share it; names are safe and local.
    @Test func members() throws {
        let recipe = try Self.recipe()
        #expect(
            recipe.members.map(\.name) == [
                "init-0000.mp4", "seg-000000.mp4", "seg-000001.m4s", "key-0000.key", "init-0001.mp4", "key-0001.key", "seg-000002.ts",
            ])
        #expect(recipe.segments.count == 4)
        #expect(recipe.segments[0].member == recipe.segments[1].member)
        #expect(recipe.segments[1].range == HLSByteRange(offset: 100, length: 50))
        #expect(recipe.container == "mp4")
        // The IV: the sequence number (5 + 2) without an explicit one.
        #expect(recipe.segments[2].iv == "00000000000000000000000000000007")
        #expect(recipe.segments[3].iv == "00000000000000000000000000000001")
        #expect(HLSRecipe.decode(recipe.encoded()) == recipe)
    }

    /// The joined order: the init section first and again where it changes, keys and IVs.
    @Test func pieces() throws {
        let pieces = try #require(try Self.recipe().pieces())
        #expect(
            pieces.map(\.name) == ["init-0000.mp4", "seg-000000.mp4", "seg-000000.mp4", "seg-000001.m4s", "init-0001.mp4", "seg-000002.ts"])
        #expect(pieces[3].keyName == "key-0000.key")
        #expect(pieces[3].iv == [UInt8](repeating: 0, count: 15) + [7])
        #expect(pieces[5].keyName == "key-0001.key")
        #expect(pieces[2].range == HLSByteRange(offset: 100, length: 50))
        // The init section after the key tag is encrypted with it (RFC 8216, 4.3.2.5), with its IV.
        #expect(pieces[4].keyName == "key-0001.key")
        #expect(pieces[4].iv == [UInt8](repeating: 0, count: 15) + [1])
    }

    /// The folder layout's playlist reads back as the same segments, with local names.
    @Test func localPlaylist() throws {
        let recipe = try Self.recipe()
        let text = recipe.localPlaylist()
        let media = try #require(
            try { () throws -> HLSMedia? in
                guard case .media(let m) = try HLSParser.parse(Array(text.utf8), base: "https://local/x/index.m3u8").get() else {
                    return nil
                }
                return m
            }())
        #expect(media.endList)
        #expect(media.segments.count == 4)
        #expect(
            media.segments.map(\.url.lastPathComponentOfURL) == ["seg-000000.mp4", "seg-000000.mp4", "seg-000001.m4s", "seg-000002.ts"])
        #expect(media.segments[1].range == HLSByteRange(offset: 100, length: 50))
        #expect(media.segments[2].key?.url == "https://local/x/key-0000.key")
        #expect(media.segments[2].key?.iv == [UInt8](repeating: 0, count: 15) + [7])
        #expect(media.segments[3].discontinuity)
        #expect(media.segments[3].map?.url == "https://local/x/init-0001.mp4")
        #expect(media.mediaSequence == 5)
    }

    /// MPEG-TS without init sections is `ts`.
    @Test func tsContainer() throws {
        let media = try HLSParserTests.media("#EXTM3U\n#EXT-X-TARGETDURATION:1\n#EXTINF:1,\na.ts\n#EXT-X-ENDLIST\n")
        #expect(try HLSRecipe.plan(media, layout: .file).get().container == "ts")
    }
}

/// Seeded, replayable: mutated playlists never crash the parser or the planner, and what
/// parses plans, joins and round-trips. Replay a failure with DLD_TEST_SEED=<seed>.
@Suite struct HLSFuzzTests {
    struct SplitMix: RandomNumberGenerator {
        var state: UInt64
        mutating func next() -> UInt64 {
            state &+= 0x9E37_79B9_7F4A_7C15
            var z = state
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return z ^ (z >> 31)
        }
    }

    static let seeds = [
        HLSRecipeTests.text,
        "#EXTM3U\n#EXT-X-STREAM-INF:BANDWIDTH=1,RESOLUTION=1x2,CODECS=\"a,b\"\nv.m3u8\n#EXT-X-MEDIA:TYPE=AUDIO,GROUP-ID=\"a\",URI=\"x\"\n",
        HLSParserTests.live,
    ]

    @Test func mutatedPlaylists() {
        let seed = ProcessInfo.processInfo.environment["DLD_TEST_SEED"].flatMap(UInt64.init) ?? 0x4C5_2026
        var rng = SplitMix(state: seed)
        let interesting: [[UInt8]] = [
            Array("#EXT-X-BYTERANGE:".utf8), Array("@".utf8), Array("#EXT-X-KEY:METHOD=AES-128,URI=\"".utf8), Array("\"".utf8),
            Array(",".utf8), Array("\n#EXTINF:".utf8), Array("99999999999999999999".utf8), Array("#EXT-X-MAP:URI=".utf8),
            Array("\n".utf8), [0xFF], Array("0x".utf8), Array("#EXT-X-STREAM-INF:BANDWIDTH=".utf8), Array("../".utf8),
        ]
        var parsed = 0
        for round in 0..<20_000 {
            var bytes = Array(Self.seeds[round % Self.seeds.count].utf8)
            for _ in 0..<Int.random(in: 1...6, using: &rng) {
                let position = bytes.isEmpty ? 0 : Int.random(in: 0..<bytes.count, using: &rng)
                switch Int.random(in: 0..<5, using: &rng) {
                case 0 where !bytes.isEmpty: bytes[position] = UInt8.random(in: 0...255, using: &rng)
                case 1: bytes.insert(contentsOf: interesting[Int.random(in: 0..<interesting.count, using: &rng)], at: position)
                case 2 where !bytes.isEmpty:
                    bytes.removeSubrange(position..<min(bytes.count, position + Int.random(in: 1...12, using: &rng)))
                case 3 where !bytes.isEmpty:
                    let end = min(bytes.count, position + Int.random(in: 1...40, using: &rng))
                    bytes.insert(contentsOf: bytes[position..<end], at: position)
                default: bytes = Array(bytes.prefix(position))
                }
            }
            switch HLSParser.parse(bytes, base: "https://h.example/p/x.m3u8") {
            case .failure(let error):
                #expect(error.code.rawValue.hasPrefix("hls_"), "seed \(seed) round \(round): \(error)")
                #expect(!error.message.isEmpty)
            case .success(.master(let master)):
                parsed += 1
                _ = HLSVariantRequest(maxHeight: 720).choose(from: master.variants)
            case .success(.media(let media)):
                parsed += 1
                guard case .success(let recipe) = HLSRecipe.plan(media, layout: .folder) else { continue }
                #expect(recipe.pieces() != nil, "seed \(seed) round \(round)")
                #expect(HLSRecipe.decode(recipe.encoded()) == recipe, "seed \(seed) round \(round)")
                let again = HLSParser.parse(Array(recipe.localPlaylist().utf8), base: "https://l/x/index.m3u8")
                if case .success(.media(let local)) = again {
                    #expect(local.segments.count == media.segments.count, "seed \(seed) round \(round)")
                } else {
                    Issue.record("seed \(seed) round \(round): the local playlist does not parse: \(again)")
                }
                // Recorded live: a reload of the same playlist adds nothing; the end tag closes it;
                // a cancel keeps a recipe that still joins.
                guard case .success(var live) = HLSRecipe.plan(media, layout: .file, liveURL: "https://h.example/p/x.m3u8") else {
                    continue
                }
                var ended = media
                ended.endList = false
                #expect(live.reloaded(ended).isEmpty && live.segments.count == recipe.segments.count, "seed \(seed) round \(round)")
                ended.endList = true
                _ = live.reloaded(ended)
                #expect(live.live == nil && live.segments.count == recipe.segments.count, "seed \(seed) round \(round)")
                #expect(recipe.stopped(complete: Set(recipe.members.indices.filter { $0 % 2 == 0 })).pieces() != nil)
            }
        }
        #expect(parsed > 100, "seed \(seed): mutations left too few playlists to look at")
    }
}

extension String {
    fileprivate var lastPathComponentOfURL: String { URL(string: self)?.lastPathComponent ?? self }
}
