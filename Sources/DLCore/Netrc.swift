/// One `machine` (or `default`) block of a `.netrc` file.
public struct NetrcEntry: Sendable, Equatable {
    /// The host name as written; nil for the `default` block.
    public var machine: String?
    public var login: String?
    public var password: String?

    public init(machine: String?, login: String? = nil, password: String? = nil) {
        self.machine = machine
        self.login = login
        self.password = password
    }
}

/// `~/.netrc`, read the way curl and wget read it: whitespace-separated tokens `machine HOST`,
/// `default`, `login L`, `password P`, `account A` (ignored) and `macdef NAME` (its body, up to
/// the next empty line, skipped); `#` starts a comment when it starts a token; any token may be
/// double-quoted, with backslash escapes, to hold spaces or a leading `#`.
///
/// Parsing never fails: a user's netrc is shared with other programs, and one line dld cannot
/// read must not cost the credentials of every other host. What cannot be read is skipped.
public enum Netrc {
    public static func parse(_ text: String) -> [NetrcEntry] {
        var reader = Reader(text)
        var entries: [NetrcEntry] = []
        var current: NetrcEntry?
        while let token = reader.next() {
            guard case .ok(let word, let quoted) = token else {
                // An unterminated quote: the value it was meant to be is unknown, so the block it
                // belongs to is dropped rather than kept with half its credentials.
                current = nil
                break
            }
            // A quoted token is always a value: `"machine"` can be somebody's password.
            let keyword = quoted ? "" : word
            switch keyword {
            case "machine", "default":
                if let current { entries.append(current) }
                if keyword == "default" {
                    current = NetrcEntry(machine: nil)
                } else if case .ok(let host, _) = reader.next() {
                    current = NetrcEntry(machine: host)
                } else {
                    current = nil
                }
            case "login", "password", "account":
                guard case .ok(let value, _) = reader.next() else {
                    current = nil
                    break
                }
                if keyword == "login" { current?.login = value }
                if keyword == "password" { current?.password = value }
            case "macdef":
                // A macro belongs to no host, and its body is free text: ends the block.
                if let current { entries.append(current) }
                current = nil
                reader.skipMacro()
            default:
                // Unknown words, and tokens before the first `machine`, are skipped.
                break
            }
        }
        if let current { entries.append(current) }
        return entries
    }

    /// The credentials for `host` (case-insensitive match of machine; the `default` entry only
    /// if no machine matches). The first matching block wins, as in curl. A block without both a
    /// login and a password gives nil: dld has no one to ask for the missing half, and falling
    /// through to `default` would send another account's password to this host.
    public static func credentials(for host: String, in entries: [NetrcEntry]) -> (login: String, password: String)? {
        let wanted = normalize(host)
        let entry =
            entries.first { $0.machine.map(normalize) == wanted }
            ?? entries.first { $0.machine == nil }
        guard let entry, let login = entry.login, let password = entry.password else { return nil }
        return (login, password)
    }

    /// Host names compare without case and without a final dot (`example.com.` is fully qualified).
    private static func normalize(_ host: String) -> String {
        var host = host.lowercased()
        if host.hasSuffix(".") && host.count > 1 { host.removeLast() }
        return host
    }

    enum Token: Equatable {
        case ok(String, quoted: Bool)
        /// A quote that never closes.
        case broken
    }

    /// Splits netrc text into tokens, scalar by scalar (as Characters "\r\n" would be one).
    struct Reader {
        private let scalars: [Unicode.Scalar]
        private var index = 0

        init(_ text: String) { scalars = Array(text.unicodeScalars) }

        private static func isSpace(_ scalar: Unicode.Scalar) -> Bool {
            scalar == " " || scalar == "\t" || scalar == "\n" || scalar == "\r" || scalar == "\u{0B}"
                || scalar == "\u{0C}"
        }

        /// The next token, or nil at the end.
        mutating func next() -> Token? {
            while index < scalars.count {
                let scalar = scalars[index]
                if Self.isSpace(scalar) {
                    index += 1
                } else if scalar == "#" {
                    while index < scalars.count && scalars[index] != "\n" { index += 1 }
                } else {
                    break
                }
            }
            guard index < scalars.count else { return nil }
            var word = String.UnicodeScalarView()
            if scalars[index] == "\"" {
                index += 1
                while index < scalars.count {
                    let scalar = scalars[index]
                    index += 1
                    if scalar == "\"" { return .ok(String(word), quoted: true) }
                    if scalar == "\\" {
                        guard index < scalars.count else { break }
                        let escaped = scalars[index]
                        index += 1
                        switch escaped {
                        case "n": word.append("\n")
                        case "r": word.append("\r")
                        case "t": word.append("\t")
                        default: word.append(escaped)
                        }
                    } else {
                        word.append(scalar)
                    }
                }
                return .broken
            }
            while index < scalars.count && !Self.isSpace(scalars[index]) {
                word.append(scalars[index])
                index += 1
            }
            return .ok(String(word), quoted: false)
        }

        /// Skips the rest of the `macdef` line and the macro body: every line up to and
        /// including the next empty (or blank) one.
        mutating func skipMacro() {
            skipLine()
            while index < scalars.count {
                var end = index
                while end < scalars.count && scalars[end] != "\n" { end += 1 }
                let blank = scalars[index..<end].allSatisfy(Self.isSpace)
                index = min(end + 1, scalars.count)
                if blank { return }
            }
        }

        private mutating func skipLine() {
            while index < scalars.count && scalars[index] != "\n" { index += 1 }
            if index < scalars.count { index += 1 }
        }
    }
}
