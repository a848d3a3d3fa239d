import DLRPC
import Foundation
import Testing

/// `JSONValue.serialized()` writes JSON itself (for speed): it must give the bytes Foundation's
/// encoder gives, and parse back to the same value.
@Suite struct JSONWriterTests {
    private static let alphabet: [Unicode.Scalar] = (0..<0x30).compactMap(Unicode.Scalar.init)
        + ["\"", "\\", "/", "a", "Z", "é", "\u{7F}", "\u{80}", "\u{2028}", "\u{FEFF}", "日", "😀", "\u{202E}"]

    private func randomString(_ rng: inout SystemRandomNumberGenerator) -> String {
        var text = ""
        for _ in 0..<Int.random(in: 0...12, using: &rng) {
            text.unicodeScalars.append(Self.alphabet.randomElement(using: &rng) ?? "a")
        }
        return text
    }

    private func randomValue(_ depth: Int, _ rng: inout SystemRandomNumberGenerator) -> JSONValue {
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
        var rng = SystemRandomNumberGenerator()
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        for _ in 0..<2000 {
            let value = randomValue(0, &rng)
            let ours = value.serialized()
            #expect(ours == (try encoder.encode(value)), "\(String(decoding: ours, as: UTF8.self))")
            #expect(try JSONValue.parse(ours) == value)
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
        var rng = SystemRandomNumberGenerator()
        var dates = [Date(timeIntervalSince1970: 0), Date(timeIntervalSince1970: 1_800_000_000.999), Date(timeIntervalSince1970: 951_782_400)]
        for _ in 0..<2000 { dates.append(Date(timeIntervalSince1970: Double.random(in: 0..<4_102_444_800, using: &rng))) }
        for date in dates {
            #expect(JobJSON.timestamp(date) == .string(date.formatted(.iso8601)), "\(date.timeIntervalSince1970)")
        }
    }
}
