import Foundation

/// Reads one JSON text (RFC 8259) straight into a `JSONValue`.
///
/// Requests are parsed here and not by `JSONDecoder` because decoding into an enum through
/// `Codable` was slow (a thrown `DecodingError` for every kind tried before the right one;
/// docs/benchmarks.md, "What was tried": `enqueue` and `list` on SQLite's C API); this reads
/// each byte once. On UTF-8 input it accepts what `JSONDecoder` accepts and gives the same
/// values (a test compares the two on valid and mutated input; a byte-order mark, which
/// `JSONDecoder` skips, is refused), and it never traps: nesting deeper than `maxDepth`, bad
/// UTF-8, lone surrogates, control characters in strings, and trailing bytes are errors.
struct JSONParser {
    struct Failure: Error, Equatable {
        var offset: Int
        var reason: String
    }

    /// As deep as `JSONDecoder` goes (it refuses deeper nesting too).
    static let maxDepth = 512

    private let bytes: UnsafeRawBufferPointer
    private var at = 0

    private init(_ bytes: UnsafeRawBufferPointer) {
        self.bytes = bytes
    }

    static func parse(_ data: Data) throws(Failure) -> JSONValue {
        let result: Result<JSONValue, Failure> = data.withUnsafeBytes { buffer in
            var parser = JSONParser(buffer)
            do throws(Failure) {
                parser.skipSpace()
                let value = try parser.value(depth: 0)
                parser.skipSpace()
                guard parser.at == buffer.count else { throw parser.failure("unexpected bytes after the JSON value") }
                return .success(value)
            } catch {
                return .failure(error)
            }
        }
        return try result.get()
    }

    private func failure(_ reason: String) -> Failure { Failure(offset: at, reason: reason) }

    private var current: UInt8? { at < bytes.count ? bytes[at] : nil }

    private mutating func skipSpace() {
        while at < bytes.count {
            switch bytes[at] {
            case 0x20, 0x09, 0x0A, 0x0D: at += 1
            default: return
            }
        }
    }

    private mutating func value(depth: Int) throws(Failure) -> JSONValue {
        guard let byte = current else { throw failure("unexpected end of input") }
        switch byte {
        case UInt8(ascii: "\""): return .string(try string())
        case UInt8(ascii: "{"): return try object(depth: depth + 1)
        case UInt8(ascii: "["): return try array(depth: depth + 1)
        case UInt8(ascii: "t"):
            try literal("true")
            return .bool(true)
        case UInt8(ascii: "f"):
            try literal("false")
            return .bool(false)
        case UInt8(ascii: "n"):
            try literal("null")
            return .null
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return try number()
        default: throw failure("unexpected character")
        }
    }

    private mutating func literal(_ word: StaticString) throws(Failure) {
        let count = word.utf8CodeUnitCount
        guard bytes.count - at >= count else { throw failure("unexpected end of input") }
        let matches = word.withUTF8Buffer { expected in
            (0..<count).allSatisfy { bytes[at + $0] == expected[$0] }
        }
        guard matches else { throw failure("unexpected word") }
        at += count
    }

    private mutating func object(depth: Int) throws(Failure) -> JSONValue {
        guard depth <= Self.maxDepth else { throw failure("nested too deeply") }
        at += 1  // {
        var members: [String: JSONValue] = [:]
        skipSpace()
        if current == UInt8(ascii: "}") {
            at += 1
            return .object(members)
        }
        while true {
            skipSpace()
            guard current == UInt8(ascii: "\"") else { throw failure("expected a string key") }
            let key = try string()
            skipSpace()
            guard current == UInt8(ascii: ":") else { throw failure("expected \":\"") }
            at += 1
            skipSpace()
            let member = try value(depth: depth)
            // The first of duplicate keys counts, as with JSONDecoder.
            if members[key] == nil { members[key] = member }
            skipSpace()
            switch current {
            case UInt8(ascii: ","):
                at += 1
                // A trailing comma is accepted, as JSONDecoder (and so protocol 1) accepted it.
                skipSpace()
                if current == UInt8(ascii: "}") {
                    at += 1
                    return .object(members)
                }
            case UInt8(ascii: "}"):
                at += 1
                return .object(members)
            default: throw failure("expected \",\" or \"}\"")
            }
        }
    }

    private mutating func array(depth: Int) throws(Failure) -> JSONValue {
        guard depth <= Self.maxDepth else { throw failure("nested too deeply") }
        at += 1  // [
        var elements: [JSONValue] = []
        skipSpace()
        if current == UInt8(ascii: "]") {
            at += 1
            return .array(elements)
        }
        while true {
            skipSpace()
            elements.append(try value(depth: depth))
            skipSpace()
            switch current {
            case UInt8(ascii: ","):
                at += 1
                skipSpace()
                if current == UInt8(ascii: "]") {
                    at += 1
                    return .array(elements)
                }
            case UInt8(ascii: "]"):
                at += 1
                return .array(elements)
            default: throw failure("expected \",\" or \"]\"")
            }
        }
    }

    /// A string: the plain runs are copied as they are (checked as UTF-8 at the end), escapes
    /// are decoded, and control characters are refused.
    private mutating func string() throws(Failure) -> String {
        at += 1  // opening quote
        let start = at
        // The common case: no escapes. Find the closing quote.
        while at < bytes.count {
            let byte = bytes[at]
            if byte == UInt8(ascii: "\"") {
                let text = try utf8(start..<at)
                at += 1
                return text
            }
            if byte == UInt8(ascii: "\\") { break }
            guard byte >= 0x20 else { throw failure("control character in a string") }
            at += 1
        }
        guard at < bytes.count else { throw failure("unterminated string") }
        var scratch: [UInt8] = Array(bytes[start..<at])
        while at < bytes.count {
            let byte = bytes[at]
            switch byte {
            case UInt8(ascii: "\""):
                at += 1
                guard let text = String(validating: scratch, as: UTF8.self) else { throw failure("invalid UTF-8 in a string") }
                return text
            case UInt8(ascii: "\\"):
                at += 1
                guard let escape = current else { throw failure("unterminated string") }
                at += 1
                switch escape {
                case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): scratch.append(escape)
                case UInt8(ascii: "b"): scratch.append(0x08)
                case UInt8(ascii: "f"): scratch.append(0x0C)
                case UInt8(ascii: "n"): scratch.append(0x0A)
                case UInt8(ascii: "r"): scratch.append(0x0D)
                case UInt8(ascii: "t"): scratch.append(0x09)
                case UInt8(ascii: "u"): try unicodeEscape(into: &scratch)
                default: throw failure("invalid escape in a string")
                }
            default:
                guard byte >= 0x20 else { throw failure("control character in a string") }
                scratch.append(byte)
                at += 1
            }
        }
        throw failure("unterminated string")
    }

    private func utf8(_ range: Range<Int>) throws(Failure) -> String {
        guard let text = String(validating: UnsafeRawBufferPointer(rebasing: bytes[range]), as: UTF8.self) else {
            throw failure("invalid UTF-8 in a string")
        }
        return text
    }

    /// After `\u`: four hex digits, and a second `\uXXXX` for a surrogate pair.
    private mutating func unicodeEscape(into scratch: inout [UInt8]) throws(Failure) {
        let first = try hex4()
        var scalarValue = UInt32(first)
        if (0xD800...0xDBFF).contains(first) {
            guard bytes.count - at >= 6, bytes[at] == UInt8(ascii: "\\"), bytes[at + 1] == UInt8(ascii: "u") else {
                throw failure("unpaired surrogate in a string")
            }
            at += 2
            let second = try hex4()
            guard (0xDC00...0xDFFF).contains(second) else { throw failure("unpaired surrogate in a string") }
            scalarValue = 0x10000 + ((UInt32(first) - 0xD800) << 10) + (UInt32(second) - 0xDC00)
        } else if (0xDC00...0xDFFF).contains(first) {
            throw failure("unpaired surrogate in a string")
        }
        guard let scalar = Unicode.Scalar(scalarValue) else { throw failure("invalid \\u escape") }
        scratch.append(contentsOf: String(Character(scalar)).utf8)
    }

    private mutating func hex4() throws(Failure) -> UInt16 {
        guard bytes.count - at >= 4 else { throw failure("unterminated \\u escape") }
        var value: UInt16 = 0
        for _ in 0..<4 {
            let byte = bytes[at]
            let digit: UInt8
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = byte - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = byte - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = byte - UInt8(ascii: "A") + 10
            default: throw failure("invalid \\u escape")
            }
            value = value << 4 | UInt16(digit)
            at += 1
        }
        return value
    }

    /// `-?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?`: an integer that fits in Int64 is an
    /// int, anything else a finite double (1e400 is refused, as `JSONDecoder` refuses it).
    private mutating func number() throws(Failure) -> JSONValue {
        let start = at
        if current == UInt8(ascii: "-") { at += 1 }
        guard let lead = current, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(lead) else {
            throw failure("invalid number")
        }
        at += 1
        if lead != UInt8(ascii: "0") { skipDigits() }
        var integral = true
        if current == UInt8(ascii: ".") {
            integral = false
            at += 1
            guard try digitsFollow() else { throw failure("invalid number") }
        }
        if current == UInt8(ascii: "e") || current == UInt8(ascii: "E") {
            integral = false
            at += 1
            if current == UInt8(ascii: "+") || current == UInt8(ascii: "-") { at += 1 }
            guard try digitsFollow() else { throw failure("invalid number") }
        }
        let text = String(decoding: UnsafeRawBufferPointer(rebasing: bytes[start..<at]), as: UTF8.self)
        if integral, let int = Int64(text) { return .int(int) }
        guard let double = Double(text), double.isFinite else { throw failure("number out of range") }
        // An integer too large for Int64 stays a double; 1e2 or 1.0 is an int, as JSONDecoder
        // reads a number whose value is whole.
        if integral { return .double(double) }
        return Int64(exactly: double).map(JSONValue.int) ?? .double(double)
    }

    private mutating func skipDigits() {
        while let byte = current, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte) { at += 1 }
    }

    private mutating func digitsFollow() throws(Failure) -> Bool {
        guard let byte = current, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte) else { return false }
        skipDigits()
        return true
    }
}
