import Foundation

/// The `Content-Disposition` response header (RFC 6266): the file name a server proposes.
///
/// The name is untrusted text from the network. This type only decodes it; callers must pass it
/// through `FileNames.sanitize` before it comes anywhere near a path.
public enum ContentDisposition {
    /// The file name a Content-Disposition header proposes, NOT yet sanitized: `filename*=`
    /// (RFC 5987, `UTF-8''percent-encoded`, also `ISO-8859-1''`) wins over `filename=`
    /// (quoted-string with backslash escapes, or a token). nil when there is none or it is
    /// malformed.
    ///
    /// A malformed `filename*` falls back to `filename`: RFC 6266 asks senders to give both so
    /// that a receiver which cannot read one still has the other. The first of a repeated
    /// parameter counts. Unquoted values are read up to the next `;` (spaces included), since
    /// servers send `filename=my file.zip` often enough.
    public static func filename(_ header: String) -> String? {
        let parameters = Self.parameters(header)
        if let extended = parameters.first(where: { $0.name == "filename*" }),
            let name = decodeExtended(extended.value), !name.isEmpty
        {
            return name
        }
        if let plain = parameters.first(where: { $0.name == "filename" }), !plain.value.isEmpty {
            return plain.value
        }
        return nil
    }

    struct Parameter: Equatable {
        /// Lowercased.
        var name: String
        /// Unquoted and unescaped, not percent-decoded.
        var value: String
    }

    /// The parameters of the header in order, the disposition type (`attachment`, `inline`)
    /// skipped. Parsing stops at an unterminated quoted-string: what follows it is inside it.
    static func parameters(_ header: String) -> [Parameter] {
        var scanner = Scanner(header)
        var result: [Parameter] = []
        // The disposition type; some servers leave it out and start with `filename=`.
        scanner.skipSpaces()
        let first = scanner.token()
        scanner.skipSpaces()
        var pendingName: String? = scanner.peek == "=" ? first : nil
        if pendingName == nil { scanner.skip(past: ";") }
        while true {
            let name: String
            if let pending = pendingName {
                name = pending
                pendingName = nil
            } else {
                scanner.skipSpaces()
                guard !scanner.atEnd else { break }
                name = scanner.token()
                scanner.skipSpaces()
            }
            guard scanner.peek == "=" else {
                // `; foo` or `; foo bar`: not a parameter; move on to the next one.
                scanner.skip(past: ";")
                continue
            }
            scanner.advance()
            scanner.skipSpaces()
            guard let value = scanner.value() else { break }
            if !name.isEmpty { result.append(Parameter(name: name.lowercased(), value: value)) }
            scanner.skip(past: ";")
        }
        return result
    }

    /// RFC 5987 `charset'[language]'value-chars`, percent-decoded; nil when malformed or in a
    /// charset other than UTF-8, ISO-8859-1 or US-ASCII.
    static func decodeExtended(_ text: String) -> String? {
        let parts = text.split(separator: "'", maxSplits: 2, omittingEmptySubsequences: false)
        guard parts.count == 3 else { return nil }
        let charset = parts[0].trimmingCharacters(in: .whitespaces).lowercased()
        let encoded = parts[2]
        var bytes: [UInt8] = []
        var scalars = encoded.unicodeScalars.makeIterator()
        while let scalar = scalars.next() {
            if scalar == "%" {
                guard let high = scalars.next().flatMap(hexValue), let low = scalars.next().flatMap(hexValue) else {
                    return nil
                }
                bytes.append(high << 4 | low)
            } else if charset == "utf-8" || scalar.isASCII {
                // Not allowed raw by the RFC, but seen in the wild (`UTF-8''my file.zip`).
                bytes.append(contentsOf: String(scalar).utf8)
            } else if scalar.value <= 0xFF {
                bytes.append(UInt8(scalar.value))
            } else {
                return nil
            }
        }
        switch charset {
        case "utf-8":
            // Foundation's decoder, not `String(validating:)`: that one needs macOS 15.
            return String(bytes: bytes, encoding: .utf8)
        case "iso-8859-1", "latin1":
            return String(String.UnicodeScalarView(bytes.map { Unicode.Scalar($0) }))
        case "us-ascii":
            guard bytes.allSatisfy({ $0 < 0x80 }) else { return nil }
            return String(String.UnicodeScalarView(bytes.map { Unicode.Scalar($0) }))
        default:
            return nil
        }
    }

    private static func hexValue(_ scalar: Unicode.Scalar) -> UInt8? {
        switch scalar.value {
        case 0x30...0x39: return UInt8(scalar.value - 0x30)
        case 0x41...0x46: return UInt8(scalar.value - 0x41 + 10)
        case 0x61...0x66: return UInt8(scalar.value - 0x61 + 10)
        default: return nil
        }
    }

    /// A cursor over the header's scalars (as Characters, a quote followed by a combining mark
    /// would be one grapheme and hide the quote).
    struct Scanner {
        private let scalars: [Unicode.Scalar]
        private var index = 0

        init(_ text: String) { scalars = Array(text.unicodeScalars) }

        var atEnd: Bool { index >= scalars.count }
        var peek: Unicode.Scalar? { atEnd ? nil : scalars[index] }

        mutating func advance() { index += 1 }

        mutating func skipSpaces() {
            while let scalar = peek, scalar == " " || scalar == "\t" { index += 1 }
        }

        /// Moves past the next `delimiter`, or to the end.
        mutating func skip(past delimiter: Unicode.Scalar) {
            while let scalar = peek {
                index += 1
                if scalar == delimiter { return }
            }
        }

        /// A name: up to `=`, `;` or a space.
        mutating func token() -> String {
            var word = String.UnicodeScalarView()
            while let scalar = peek, scalar != "=", scalar != ";", scalar != " ", scalar != "\t" {
                word.append(scalar)
                index += 1
            }
            return String(word)
        }

        /// A quoted-string, unescaped, or an unquoted value up to `;` with its trailing spaces
        /// trimmed; nil for a quoted-string that never closes.
        mutating func value() -> String? {
            var word = String.UnicodeScalarView()
            if peek == "\"" {
                index += 1
                while let scalar = peek {
                    index += 1
                    if scalar == "\"" { return String(word) }
                    if scalar == "\\" {
                        guard let escaped = peek else { return nil }
                        index += 1
                        word.append(escaped)
                    } else {
                        word.append(scalar)
                    }
                }
                return nil
            }
            while let scalar = peek, scalar != ";" {
                word.append(scalar)
                index += 1
            }
            while let last = word.last, last == " " || last == "\t" { word.removeLast() }
            return String(word)
        }
    }
}
