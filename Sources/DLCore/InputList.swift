/// One download read from an input file (`dlctl enqueue -i FILE`).
public struct InputEntry: Sendable, Equatable {
    /// The URL as written (already checked by `URLRules.validate`).
    public var url: String
    /// `out=`: the file name to save as.
    public var name: String?
    /// `dir=`: the folder to save into.
    public var dir: String?
    /// `checksum=`: the digest the file must match.
    public var checksum: Checksum?
    /// `size=`: the size in bytes the file must have.
    public var size: Int64?
    /// The 1-based line of the URL, for messages about this entry.
    public var line: Int

    public init(
        url: String, name: String? = nil, dir: String? = nil, checksum: Checksum? = nil,
        size: Int64? = nil, line: Int
    ) {
        self.url = url
        self.name = name
        self.dir = dir
        self.checksum = checksum
        self.size = size
        self.line = line
    }
}

extension InputEntry {
    /// The job this entry asks for, over `base` (the caller's defaults): its URL, and its own
    /// `out=`, `dir=` (made absolute by `absolute`), `checksum=` and `size=` where given. Both
    /// `dlctl enqueue -i` and the drop folder build their `enqueue` params this way.
    public func spec(over base: EnqueueSpec, absolute: (String) -> String) -> EnqueueSpec {
        var spec = base
        spec.url = url
        spec.name = name ?? spec.name
        spec.dir = dir.map(absolute) ?? spec.dir
        spec.checksum = checksum ?? spec.checksum
        spec.size = size ?? spec.size
        return spec
    }
}

/// Why an input file was refused, with the 1-based line at fault.
public struct InputListError: Error, Sendable, Equatable, CustomStringConvertible {
    public var line: Int
    public var message: String

    public init(line: Int, message: String) {
        self.line = line
        self.message = message
    }

    public var description: String { "line \(line): \(message)" }
}

/// The aria2-style input file: one URL per line, each followed by indented `key=value` option
/// lines that apply to it; blank lines and `#` comments are ignored.
///
/// ```
/// https://example.com/a.iso
///   out=a.iso
///   dir=/srv/isos
///   checksum=sha-256=9f86d0…
///   size=1048576
/// ```
///
/// Parsing is all or nothing: a file with one bad line enqueues nothing, so that a typo does not
/// leave the user guessing which half of a list is in the queue.
public enum InputList {
    /// The option names an indented line may set.
    public static let options = ["out", "dir", "checksum", "size"]

    public static func parse(_ text: String) -> Result<[InputEntry], InputListError> {
        var entries: [InputEntry] = []
        // Options already given for the last entry: a second `out=` is more likely a mistake
        // (two URL lines merged by an editor) than a wish for the last one to win.
        var seen: Set<String> = []
        for (index, rawLine) in lines(of: text).enumerated() {
            let number = index + 1
            let line = rawLine.trimmingTrailingBlanks()
            guard let first = line.unicodeScalars.first else { continue }
            let body = line.trimmingLeadingBlanks()
            if body.isEmpty || body.hasPrefix("#") { continue }

            guard isBlank(first) else {
                switch URLRules.validate(body) {
                case .success:
                    entries.append(InputEntry(url: body, line: number))
                    seen = []
                case .failure(let error):
                    return .failure(InputListError(line: number, message: error.message))
                }
                continue
            }

            guard var entry = entries.popLast() else {
                return .failure(
                    InputListError(
                        line: number, message: "option line \"\(body.prefix(40))\" has no URL line above it"))
            }
            guard let equals = body.firstIndex(of: "=") else {
                return .failure(
                    InputListError(
                        line: number, message: "option must be KEY=VALUE, not \"\(body.prefix(40))\""))
            }
            let key = String(body[..<equals]).trimmingTrailingBlanks()
            let value = String(body[body.index(after: equals)...]).trimmingLeadingBlanks()
            guard options.contains(key) else {
                return .failure(
                    InputListError(
                        line: number,
                        message: "unknown option \"\(key.prefix(40))\"; options are \(options.joined(separator: ", "))"))
            }
            guard !seen.contains(key) else {
                return .failure(InputListError(line: number, message: "option \(key) is given twice for one URL"))
            }
            seen.insert(key)
            guard !value.isEmpty else {
                return .failure(InputListError(line: number, message: "option \(key) has an empty value"))
            }
            switch apply(key: key, value: value, to: &entry) {
            case .some(let message):
                return .failure(InputListError(line: number, message: message))
            case .none:
                entries.append(entry)
            }
        }
        return .success(entries)
    }

    /// Sets one option on `entry`; a message when the value is not acceptable.
    private static func apply(key: String, value: String, to entry: inout InputEntry) -> String? {
        switch key {
        case "out":
            entry.name = value
        case "dir":
            entry.dir = value
        case "checksum":
            // aria2 writes `sha-256=HEX`; `Checksum.parse` reads `ALGO:HEX`. Both are accepted.
            var wire = value
            if !wire.contains(":"), let equals = wire.firstIndex(of: "=") {
                wire.replaceSubrange(equals...equals, with: ":")
            }
            switch Checksum.parse(wire) {
            case .success(let checksum): entry.checksum = checksum
            case .failure(let error): return error.message
            }
        case "size":
            // Digits only: `Int64("+5")` would pass, and "-1" or "1e6" are not sizes.
            guard value.utf8.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }),
                let size = Int64(value)
            else {
                return "size must be a whole number of bytes, not \"\(value.prefix(40))\""
            }
            entry.size = size
        default:
            return "unknown option \"\(key.prefix(40))\""
        }
        return nil
    }

    /// The lines of `text`, split at LF with a CR before it dropped, and a leading UTF-8 BOM
    /// removed. Done on scalars: as Characters, "\r\n" is one grapheme and never equals "\n".
    static func lines(of text: String) -> [String] {
        var scalars = Substring(text).unicodeScalars
        if scalars.first == "\u{FEFF}" { scalars.removeFirst() }
        return scalars.split(separator: "\n", omittingEmptySubsequences: false).map { line in
            var line = line
            if line.last == "\r" { line.removeLast() }
            return String(line)
        }
    }

    static func isBlank(_ scalar: Unicode.Scalar) -> Bool { scalar == " " || scalar == "\t" }
}

extension String {
    fileprivate func trimmingLeadingBlanks() -> String {
        String(unicodeScalars.drop(while: InputList.isBlank))
    }

    fileprivate func trimmingTrailingBlanks() -> String {
        var scalars = unicodeScalars[...]
        while let last = scalars.last, InputList.isBlank(last) || last == "\r" { scalars.removeLast() }
        return String(scalars)
    }
}
