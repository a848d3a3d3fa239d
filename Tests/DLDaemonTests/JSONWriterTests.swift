import DLCore
import DLRPC
import DLTestSupport
import Foundation
import Testing

/// `JSONValue.serialized()` writes JSON itself (for speed): it must give the bytes Foundation's
/// encoder gives, and parse back to the same value.
@Suite struct JSONWriterTests {
    private static let alphabet: [Unicode.Scalar] =
        (0..<0x30).compactMap(Unicode.Scalar.init)
        + ["\"", "\\", "/", "a", "Z", "é", "\u{7F}", "\u{80}", "\u{2028}", "\u{FEFF}", "日", "😀", "\u{202E}"]

    private func randomString(_ rng: inout SplitMix64) -> String {
        var text = ""
        for _ in 0..<Int.random(in: 0...12, using: &rng) {
            text.unicodeScalars.append(Self.alphabet.randomElement(using: &rng) ?? "a")
        }
        return text
    }

    private func randomValue(_ depth: Int, _ rng: inout SplitMix64) -> JSONValue {
        switch Int.random(in: 0...(depth > 3 ? 3 : 5), using: &rng) {
        case 0: return .null
        case 1: return .bool(Bool.random(using: &rng))
        case 2: return .int(Int64.random(in: Int64.min...Int64.max, using: &rng))
        case 3: return .string(randomString(&rng))
        case 4: return .array((0..<Int.random(in: 0...4, using: &rng)).map { _ in randomValue(depth + 1, &rng) })
        default:
            var object: [String: JSONValue] = [:]
            for _ in 0..<Int.random(in: 0...4, using: &rng) { object[randomString(&rng)] = randomValue(depth + 1, &rng) }
            return .object(object)
        }
    }

    @Test func sameBytesAsFoundation() throws {
        let seed = SplitMix64.testSeed()
        var rng = SplitMix64(state: seed)
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        for _ in 0..<2000 {
            let value = randomValue(0, &rng)
            let ours = value.serialized()
            #expect(ours == (try encoder.encode(value)), "seed \(seed): \(String(decoding: ours, as: UTF8.self))")
            #expect(try JSONValue.parse(ours) == value, "seed \(seed)")
        }
    }

    /// Integers are written digit by digit: the edges of their range and of each digit count.
    @Test func integersAsFoundation() throws {
        let encoder = JSONEncoder()
        for i: Int64 in [0, -0, 1, -1, 9, 10, -10, 99, 100, 1_000_000_007, Int64.max, Int64.min, Int64.min + 1] {
            #expect(JSONValue.int(i).serialized() == (try encoder.encode(i)), "\(i)")
        }
    }

    @Test func doublesRoundTrip() throws {
        for d in [0.5, -1.25, 1e300, Double.leastNonzeroMagnitude, 123456.789, 7.0, -0.0, 1e15 + 0.5] {
            #expect(try JSONValue.parse(JSONValue.double(d).serialized()).doubleValue == d)
        }
        #expect(JSONValue.double(.nan).serialized() == Data("null".utf8))
        #expect(JSONValue.double(.infinity).serialized() == Data("null".utf8))
    }

    /// Job timestamps are written by hand: the same text as Foundation's ISO 8601 style.
    @Test func timestampsAsFoundation() {
        let seed = SplitMix64.testSeed()
        var rng = SplitMix64(state: seed)
        var dates = [
            Date(timeIntervalSince1970: 0), Date(timeIntervalSince1970: 1_800_000_000.999), Date(timeIntervalSince1970: 951_782_400),
        ]
        for _ in 0..<2000 { dates.append(Date(timeIntervalSince1970: Double.random(in: 0..<4_102_444_800, using: &rng))) }
        for date in dates {
            #expect(JobJSON.timestamp(date) == .string(date.formatted(.iso8601)), "seed \(seed): \(date.timeIntervalSince1970)")
        }
    }
}

/// `JSONValue.parse` reads requests itself (for speed): on UTF-8 input it must accept what
/// Foundation's `JSONDecoder` accepts, refuse what it refuses, and give the same values.
@Suite struct JSONParserTests {
    private func foundation(_ bytes: [UInt8]) -> JSONValue? {
        try? JSONDecoder().decode(JSONValue.self, from: Data(bytes))
    }

    private func ours(_ bytes: [UInt8]) -> JSONValue? {
        try? JSONValue.parse(Data(bytes))
    }

    /// JSONDecoder guesses UTF-16 or UTF-32 from NUL bytes at the start and skips a byte-order
    /// mark; requests are UTF-8, so such input is outside the comparison.
    private func comparable(_ bytes: [UInt8]) -> Bool {
        !bytes.prefix(4).contains(0) && !bytes.starts(with: [0xEF, 0xBB, 0xBF])
    }

    @Test func sameVerdictsAsFoundationOnMutatedRequests() {
        var rng = SplitMix64(state: 0x5EED_0F_1A5)
        var accepted = 0, refused = 0
        for round in 0..<20_000 {
            let seed = Array(FuzzTests.seeds[round % FuzzTests.seeds.count].utf8)
            let input = FuzzTests.mutate(seed, &rng)
            guard comparable(input) else { continue }
            // JSONDecoder only checks the strings it decodes (not the value of a duplicate
            // key it ignores); requests with bad UTF-8 anywhere are refused here.
            guard String(validating: input, as: UTF8.self) != nil else {
                #expect(ours(input) == nil, "\(input)")
                continue
            }
            let expected = foundation(input)
            #expect(ours(input) == expected, "\(input)")
            if expected == nil { refused += 1 } else { accepted += 1 }
        }
        // Both verdicts must have been exercised, or the comparison proves little.
        #expect(accepted > 1000 && refused > 1000, "accepted \(accepted), refused \(refused)")
    }

    @Test func edgeCasesAsFoundation() {
        let cases = [
            "0", "-0", "-0.0", "1.0", "1e2", "1E+2", "2.5e-3", "9223372036854775807", "9223372036854775808",
            "-9223372036854775808", "9.21e18", "1e400", "-1e400", "01", "1.", ".5", "-", "+1", "1e", "1e+",
            #""\ud83d\ude00""#, #""\ud83d""#, #""\ude00""#, #""\ud83dx""#, #""\u00e9\u0000""#, #""\x""#, "\"a\tb\"",
            "[1,]", "{\"a\":1,}", "[1 2]", "{\"a\" 1}", "{1:2}", "[] x", " [ ] ", "\t{\"a\":[true,false,null]}\r\n",
            "tru", "nul", "nulls", "\"\u{7F}\"", "{\"a\":1,\"a\":2}", "", " ", "[\"\\/\"]", "[,]", "{,}", "[1,,]", "[1,,2]", "{\"a\":1,,}",
        ]
        for text in cases {
            #expect(ours(Array(text.utf8)) == foundation(Array(text.utf8)), "\(text)")
        }
        for bytes: [UInt8] in [[0x22, 0xFF, 0x22], [0x22, 0xC0, 0x80, 0x22], [0x22, 0xED, 0xA0, 0x80, 0x22], [0x22, 0xE2, 0x82, 0x22]] {
            #expect(ours(bytes) == nil && foundation(bytes) == nil, "\(bytes)")
        }
    }

    /// Nesting is bounded (the parser recurses): deep input is an error, never a crash.
    @Test func deepNestingIsRefused() {
        let deep = Array((String(repeating: "[", count: 100_000) + String(repeating: "]", count: 100_000)).utf8)
        #expect(ours(deep) == nil)
        let fine = Array((String(repeating: "[", count: 500) + String(repeating: "]", count: 500)).utf8)
        #expect(ours(fine) != nil)
    }
}

/// `list` pages write each job straight to text: the bytes must be those of the job object.
@Suite struct JobTextTests {
    @Test func rawJobIsTheSerializedObject() throws {
        let seed = SplitMix64.testSeed()
        var rng = SplitMix64(state: seed)
        func maybe<T>(_ value: T) -> T? { Bool.random(using: &rng) ? value : nil }
        for n in 0..<500 {
            var job = Job(
                url: maybe("https://u:p@h/a\"b") ?? "http://h/é/\(n)", path: "/tmp/x/\(n) \\ \"q\"",
                state: JobState.allCases.randomElement(using: &rng) ?? .queued,
                createdAt: Date(timeIntervalSince1970: Double(n) * 1000.5), updatedAt: Date(timeIntervalSince1970: 1_800_000_000))
            job.id = Int64(n + 1)
            job.priority = Int.random(in: -1000...1000, using: &rng)
            job.size = maybe(Int64.random(in: 0...1 << 40, using: &rng))
            job.received = Int64.random(in: 0...1 << 30, using: &rng)
            job.error = maybe(JobError(code: "http_404", message: "not\nfound"))
            job.key = maybe("k\(n)")
            job.meta = maybe(#"{"b":[1,2.5,null],"a":"\u0001"}"#)
            job.headers = maybe([HeaderField(name: "Authorization", value: "secret"), HeaderField(name: "X", value: "y")]) ?? []
            job.finishedAt = maybe(Date(timeIntervalSince1970: 1_900_000_000))
            job.nextAttemptAt = maybe(Date(timeIntervalSince1970: 1_900_000_001))
            job.groupID = maybe(7)
            job.waitReason = maybe(.diskSpace)
            job.sha256 = maybe(String(repeating: "a", count: 64))
            job.finalURL = maybe("https://cdn/x")
            job.overwrite = Bool.random(using: &rng)
            let live = maybe(LiveProgress(received: 12_345, size: maybe(99_999), speed: 1234.6))
            guard case .raw(let text) = JobJSON.raw(job, live: live) else {
                Issue.record("seed \(seed): not raw text")
                continue
            }
            let expected = JobJSON.encode(job, live: live).serialized()
            #expect(Data(text.bytes) == expected, "seed \(seed): \(String(decoding: text.bytes, as: UTF8.self))")
            // Spliced into a reply as it is.
            #expect(
                JSONValue.array([.raw(text), .raw(text)]).serialized() == Data("[".utf8) + expected + Data(",".utf8) + expected
                    + Data("]".utf8))
        }
    }

    /// A job's `name` is the last part of its path, as NSString gives it.
    @Test func nameIsLastPathComponent() {
        for path in ["/a/b.txt", "/a/b c/é.bin", "/x", "/a/", "/", "", "b", "/a/b/", "//a//b"] {
            #expect(
                Job(url: "http://h/", path: path, createdAt: Date(), updatedAt: Date()).name == (path as NSString).lastPathComponent,
                "\(path)")
        }
    }
}
