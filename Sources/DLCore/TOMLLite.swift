import Foundation

/// The part of TOML that dld's configuration uses: `key = value` lines with strings, integers,
/// floats, booleans and one-line arrays of those; `#` comments. No tables: every key of dld's
/// configuration is top-level. A hand-written reader because the TOML package on these
/// machines (TOMLKit) needs a dependency that is not available here; this subset is small and
/// its errors name the line. In DLCore, with the other parsers of untrusted text, so that a
/// fuzz target can reach it without linking the daemon.
public enum TOMLLite {
    public indirect enum Value: Sendable, Equatable {
        case string(String)
        case integer(Int64)
        case float(Double)
        case bool(Bool)
        case array([Value])
    }

    public struct ParseError: Error, CustomStringConvertible {
        public let line: Int
        public let message: String
        public var description: String { "line \(line): \(message)" }
    }

    /// Arrays nested deeper than this are an error, not a stack overflow: dld's keys take flat
    /// arrays, and a line of `[[[[…` must not crash the daemon reading it.
    public static let maxDepth = 32

    public static func parse(_ text: String) throws -> [(key: String, value: Value, line: Int)] {
        var entries: [(key: String, value: Value, line: Int)] = []
        var seen: Set<String> = []
        for (index, rawLine) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let lineNumber = index + 1
            var scanner = Scanner(Array(rawLine.unicodeScalars), line: lineNumber)
            scanner.skipSpace()
            if scanner.atEndOrComment { continue }
            if scanner.peek == "[" {
                throw ParseError(line: lineNumber, message: "tables ([section]) are not used by dld; write keys at the top level")
            }
            let key = try scanner.key()
            scanner.skipSpace()
            guard scanner.take("=") else { throw ParseError(line: lineNumber, message: "expected '=' after \(key)") }
            scanner.skipSpace()
            let value = try scanner.value(depth: 0)
            scanner.skipSpace()
            guard scanner.atEndOrComment else { throw ParseError(line: lineNumber, message: "unexpected text after the value of \(key)") }
            guard seen.insert(key).inserted else { throw ParseError(line: lineNumber, message: "\(key) is set twice") }
            entries.append((key, value, lineNumber))
        }
        return entries
    }

    private struct Scanner {
        let chars: [Unicode.Scalar]
        let line: Int
        var i = 0

        init(_ chars: [Unicode.Scalar], line: Int) {
            self.chars = chars
            self.line = line
        }

        var peek: Unicode.Scalar? { i < chars.count ? chars[i] : nil }
        var atEndOrComment: Bool { peek == nil || peek == "#" || (peek == "\r" && i == chars.count - 1) }

        mutating func skipSpace() {
            while let c = peek, c == " " || c == "\t" { i += 1 }
        }

        mutating func take(_ c: Unicode.Scalar) -> Bool {
            if peek == c {
                i += 1
                return true
            }
            return false
        }

        func error(_ message: String) -> ParseError { ParseError(line: line, message: message) }

        mutating func key() throws -> String {
            if peek == "\"" { return try basicString() }
            var out = String.UnicodeScalarView()
            while let c = peek, c.properties.isAlphabetic || ("0"..."9").contains(c) || c == "_" || c == "-" {
                out.append(c)
                i += 1
            }
            guard !out.isEmpty else { throw error("expected a key") }
            return String(out)
        }

        mutating func value(depth: Int) throws -> Value {
            guard let c = peek else { throw error("expected a value") }
            switch c {
            case "\"": return .string(try basicString())
            case "'": return .string(try literalString())
            case "[": return try array(depth: depth + 1)
            case "t", "f": return try boolean()
            default: return try number()
            }
        }

        mutating func basicString() throws -> String {
            i += 1
            var out = String.UnicodeScalarView()
            while let c = peek {
                i += 1
                if c == "\"" { return String(out) }
                if c == "\\" {
                    guard let e = peek else { break }
                    i += 1
                    switch e {
                    case "n": out.append("\n")
                    case "t": out.append("\t")
                    case "r": out.append("\r")
                    case "\"": out.append("\"")
                    case "\\": out.append("\\")
                    case "u", "U":
                        let count = e == "u" ? 4 : 8
                        // Hex digits only: UInt32(_:radix:) would also take a sign ("\u-000").
                        guard i + count <= chars.count, chars[i..<i + count].allSatisfy(\.properties.isASCIIHexDigit),
                            let code = UInt32(String(String.UnicodeScalarView(chars[i..<i + count])), radix: 16),
                            let scalar = Unicode.Scalar(code)
                        else { throw error("invalid \\\(e) escape") }
                        out.append(scalar)
                        i += count
                    default: throw error("invalid escape \\\(e)")
                    }
                } else {
                    out.append(c)
                }
            }
            throw error("unterminated string")
        }

        mutating func literalString() throws -> String {
            i += 1
            var out = String.UnicodeScalarView()
            while let c = peek {
                i += 1
                if c == "'" { return String(out) }
                out.append(c)
            }
            throw error("unterminated string")
        }

        mutating func array(depth: Int) throws -> Value {
            guard depth <= TOMLLite.maxDepth else { throw error("arrays nested deeper than \(TOMLLite.maxDepth)") }
            i += 1
            var values: [Value] = []
            while true {
                skipSpace()
                if take("]") { return .array(values) }
                values.append(try value(depth: depth))
                skipSpace()
                if take(",") { continue }
                guard take("]") else { throw error("expected ',' or ']' in array (arrays must be on one line)") }
                return .array(values)
            }
        }

        mutating func boolean() throws -> Value {
            let rest = String(String.UnicodeScalarView(chars[i...]))
            if rest.hasPrefix("true") {
                i += 4
                return .bool(true)
            }
            if rest.hasPrefix("false") {
                i += 5
                return .bool(false)
            }
            throw error("expected a value")
        }

        mutating func number() throws -> Value {
            var text = ""
            while let c = peek, !(c == " " || c == "\t" || c == "," || c == "]" || c == "#" || c == "\r") {
                text.unicodeScalars.append(c)
                i += 1
            }
            let plain = text.replacingOccurrences(of: "_", with: "")
            if let int = Int64(plain) { return .integer(int) }
            if let double = Double(plain), double.isFinite { return .float(double) }
            throw error("invalid value \(text.isEmpty ? "(nothing)" : text); strings need quotes")
        }
    }
}
