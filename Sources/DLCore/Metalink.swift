/// Metalink: a list of files, each with its size, its URLs (mirrors) by priority and location,
/// whole-file hashes and piece hashes. Version 4 is RFC 5854
/// (`urn:ietf:params:xml:ns:metalink`); version 3 is the older format of metalinker.org, read
/// as aria2 reads it. The XML itself is read elsewhere (DLRPC's `MetalinkReader`, with
/// FoundationXML) into a tree of `MetalinkElement`s; everything here is a value without I/O:
/// what the tree means, whether it is safe, and which mirrors, hash and pieces a job gets.

/// One element of the XML document, as the reader hands it over: its local name and namespace,
/// its attributes, its text (the character data directly inside it, trimmed) and its children.
public struct MetalinkElement: Sendable, Equatable {
    public var name: String
    public var namespace: String?
    public var attributes: [String: String]
    public var text: String
    public var children: [MetalinkElement]

    public init(name: String, namespace: String?, attributes: [String: String] = [:], text: String = "", children: [MetalinkElement] = []) {
        self.name = name
        self.namespace = namespace
        self.attributes = attributes
        self.text = text
        self.children = children
    }

    /// The children named `name` in `namespace` (elements of other namespaces are extensions,
    /// which a reader ignores).
    func children(_ name: String, in namespace: String) -> [MetalinkElement] {
        children.filter { $0.name == name && $0.namespace == namespace }
    }
}

/// What a Metalink may hold: a file past these limits is refused as a whole, with the limit
/// named, rather than read in part. They bound the daemon's memory and the job table's rows.
public struct MetalinkLimits: Sendable, Equatable {
    /// Bytes of the document (the fetched body, or the `metalink` param's text).
    public var maxBytes = 4 << 20
    /// Nesting of elements; Metalink needs 5 (v3: `metalink/files/file/verification/pieces/hash`).
    public var maxDepth = 16
    /// Elements in all: each costs a node in memory.
    public var maxElements = 200_000
    /// Bytes of text in one element (a URL is at most 8192).
    public var maxTextBytes = 16 * 1024
    /// `<file>`s: each becomes a job.
    public var maxFiles = 1000
    /// `<url>`s of one file that are read; a job uses the first 17 (its URL and 16 mirrors).
    public var maxURLsPerFile = 256
    /// Piece hashes of one file: the job keeps them all in its row.
    public var maxPieces = 65_536

    public init() {}
}

/// One URL of a file.
public struct MetalinkURL: Sendable, Equatable {
    public var url: String
    /// Lower is preferred (RFC 5854's 1…999999; v3's `preference` 100…0 maps to 1…101).
    /// A URL without one comes last.
    public var priority: Int
    /// ISO 3166-1 alpha-2 country code, lowercase, when given.
    public var location: String?

    public init(url: String, priority: Int = MetalinkURL.lowestPriority, location: String? = nil) {
        self.url = url
        self.priority = priority
        self.location = location
    }

    public static let lowestPriority = 999_999
}

/// Piece hashes: the file cut into pieces of `length` bytes (the last one shorter), each with
/// its digest. What a job keeps in its `pieces` column (JSON: `{"type","length","hashes"}`).
public struct PieceHashes: Sendable, Equatable, Codable {
    public var algorithm: DigestAlgorithm
    public var length: Int64
    /// Lowercase hex, one a piece, in file order.
    public var hashes: [String]

    enum CodingKeys: String, CodingKey {
        case algorithm = "type"
        case length, hashes
    }

    public init(algorithm: DigestAlgorithm, length: Int64, hashes: [String]) {
        self.algorithm = algorithm
        self.length = length
        self.hashes = hashes
    }

    /// The bytes of piece `index` in a file of `size` bytes.
    public func range(of index: Int, size: Int64) -> Range<Int64> {
        let start = Int64(index) * length
        return start..<min(size, start + length)
    }

    /// The stored form (the job table's `pieces` column): `ALGO:LENGTH:` and the hashes' hex
    /// joined, which is a third of JSON's size and read without a JSON parser.
    public var encoded: String {
        "\(algorithm.rawValue):\(length):" + hashes.joined()
    }

    /// Reads the stored form; nil when it is not one.
    public init?(encoded text: String) {
        guard let header = Self.header(text) else { return nil }
        let hex = text.utf8.dropFirst(header.prefixBytes)
        let width = header.algorithm.hexLength
        guard hex.count % width == 0 else { return nil }
        var hashes: [String] = []
        hashes.reserveCapacity(hex.count / width)
        var start = hex.startIndex
        while start != hex.endIndex {
            let end = hex.index(start, offsetBy: width)
            hashes.append(String(decoding: hex[start..<end], as: UTF8.self))
            start = end
        }
        self.init(algorithm: header.algorithm, length: header.length, hashes: hashes)
    }

    /// The algorithm, length and count of a stored form, without splitting its hashes (for the
    /// job object's `pieces`).
    public static func summary(encoded text: String) -> (algorithm: DigestAlgorithm, length: Int64, count: Int)? {
        guard let header = header(text) else { return nil }
        return (header.algorithm, header.length, (text.utf8.count - header.prefixBytes) / header.algorithm.hexLength)
    }

    private static func header(_ text: String) -> (algorithm: DigestAlgorithm, length: Int64, prefixBytes: Int)? {
        let parts = text.split(separator: ":", maxSplits: 2, omittingEmptySubsequences: false)
        guard parts.count == 3, let algorithm = DigestAlgorithm(rawValue: String(parts[0])), let length = Int64(parts[1]), length > 0 else {
            return nil
        }
        return (algorithm, length, parts[0].utf8.count + parts[1].utf8.count + 2)
    }

    /// The pieces that overlap `near` (the bytes a range just wrote) and whose every byte is
    /// written in `layout` (each range's bytes before its `done`): those that can be checked now.
    public func landed(near: Range<Int64>, layout: SegmentLayout) -> [Int] {
        let size = layout.size
        guard length > 0, !near.isEmpty, size > 0 else { return [] }
        let first = Int(max(0, near.lowerBound) / length)
        let last = min(hashes.count - 1, Int((min(near.upperBound, size) - 1) / length))
        guard first <= last else { return [] }
        return (first...last).filter { index in
            let piece = range(of: index, size: size)
            return layout.segments.allSatisfy { segment in
                // The piece's bytes inside this range must all be before its `done`.
                let end = min(piece.upperBound, segment.end)
                return end <= segment.start || piece.lowerBound >= segment.end || end <= segment.done
            }
        }
    }

    /// The pieces a file of `size` bytes has with this length.
    public static func count(size: Int64, length: Int64) -> Int {
        guard length > 0, size > 0 else { return 0 }
        return Int((size + length - 1) / length)
    }
}

/// One `<file>`: where it goes (relative to the destination folder) and how to get and check it.
public struct MetalinkFile: Sendable, Equatable {
    /// A relative path: no `..`, not absolute, no empty segments (checked).
    public var name: String
    public var size: Int64?
    /// The whole-file hashes of a known algorithm, as given.
    public var hashes: [Checksum]
    /// The strongest piece hashes given (nil when none, or when the size is unknown).
    public var pieces: PieceHashes?
    /// Its http and https URLs in document order (other schemes, such as ftp, are not used).
    public var urls: [MetalinkURL]

    public init(name: String, size: Int64? = nil, hashes: [Checksum] = [], pieces: PieceHashes? = nil, urls: [MetalinkURL] = []) {
        self.name = name
        self.size = size
        self.hashes = hashes
        self.pieces = pieces
        self.urls = urls
    }

    /// The hash the job verifies: the strongest given (sha-512, sha-256, sha-1, md5).
    public var checksum: Checksum? {
        hashes.min { MetalinkChoice.strength($0.algorithm) < MetalinkChoice.strength($1.algorithm) }
    }

    /// The URLs in the order a job tries them: by priority, then those in `preferredLocation`
    /// (a country code; nil: none preferred) first, then as the document lists them. At most
    /// `limit` (a job's URL and its mirrors).
    public func orderedURLs(preferredLocation: String?, limit: Int = 17) -> [String] {
        let preferred = preferredLocation?.lowercased()
        let ranked = urls.enumerated().sorted { a, b in
            if a.element.priority != b.element.priority { return a.element.priority < b.element.priority }
            let aHere = preferred != nil && a.element.location == preferred
            let bHere = preferred != nil && b.element.location == preferred
            if aHere != bHere { return aHere }
            return a.offset < b.offset
        }
        return Array(ranked.prefix(max(1, limit)).map(\.element.url))
    }
}

/// A Metalink document, read and checked.
public struct Metalink: Sendable, Equatable {
    public enum Version: String, Sendable, Equatable {
        case v3 = "3"
        case v4 = "4"
    }

    public static let namespaceV4 = "urn:ietf:params:xml:ns:metalink"
    public static let namespaceV3 = "http://www.metalinker.org/"
    /// The media type of Metalink 4 (RFC 5854 section 6), and the older v3 one.
    public static let mediaTypes = ["application/metalink4+xml", "application/metalink+xml"]

    public var version: Version
    public var files: [MetalinkFile]

    public init(version: Version, files: [MetalinkFile]) {
        self.version = version
        self.files = files
    }

    /// Whether a URL names a Metalink by its path (`.meta4`, `.metalink`): `enqueue` then reads
    /// it as one. The query and fragment do not count.
    public static func isMetalinkURL(_ url: String) -> Bool {
        var path = Substring(url)
        if let cut = path.firstIndex(where: { $0 == "?" || $0 == "#" }) { path = path[..<cut] }
        let lower = path.lowercased()
        return lower.hasSuffix(".meta4") || lower.hasSuffix(".metalink")
    }

    /// The error of a file that cannot be used: `invalid_metalink` with the reason.
    public static func invalid(_ reason: String) -> DLError {
        DLError(.invalidMetalink, "invalid metalink: \(reason)")
    }

    /// Reads the document's root element. Refuses what is not a Metalink, a file that breaks a
    /// limit, an unsafe file name, a malformed size or hash, and a file with no usable URL.
    public static func read(_ root: MetalinkElement, limits: MetalinkLimits = MetalinkLimits()) throws(DLError) -> Metalink {
        guard root.name == "metalink" else {
            throw invalid("the root element is <\(root.name.prefix(40))>, not <metalink>")
        }
        let version: Version
        let fileElements: [MetalinkElement]
        switch root.namespace {
        case namespaceV4:
            version = .v4
            fileElements = root.children("file", in: namespaceV4)
        case namespaceV3:
            version = .v3
            fileElements = root.children("files", in: namespaceV3).flatMap { $0.children("file", in: namespaceV3) }
        default:
            throw invalid(
                "<metalink> is in namespace \"\((root.namespace ?? "").prefix(80))\", neither \(namespaceV4) (version 4) nor \(namespaceV3) (version 3)"
            )
        }
        guard !fileElements.isEmpty else { throw invalid("it lists no <file>") }
        guard fileElements.count <= limits.maxFiles else {
            throw invalid("\(fileElements.count) files; at most \(limits.maxFiles)")
        }
        var files: [MetalinkFile] = []
        var names: Set<String> = []
        for (index, element) in fileElements.enumerated() {
            let file = try readFile(element, version: version, limits: limits, index: index)
            guard names.insert(file.name).inserted else { throw invalid("the file name \"\(file.name.prefix(200))\" is given twice") }
            files.append(file)
        }
        return Metalink(version: version, files: files)
    }

    private static func readFile(_ element: MetalinkElement, version: Version, limits: MetalinkLimits, index: Int) throws(DLError)
        -> MetalinkFile
    {
        let ns = version == .v4 ? namespaceV4 : namespaceV3
        guard let rawName = element.attributes["name"] else { throw invalid("file \(index + 1) has no name") }
        let name = try fileName(rawName)
        let label = "file \"\(name.prefix(200))\""
        var file = MetalinkFile(name: name)
        if let size = element.children("size", in: ns).first {
            guard let value = Int64(size.text), value >= 0 else {
                throw invalid("\(label): size \"\(size.text.prefix(40))\" is not a byte count")
            }
            file.size = value
        }
        // v3 keeps the hashes and pieces in <verification>, v4 directly in <file>.
        let verification = version == .v4 ? [element] : element.children("verification", in: ns)
        for hash in verification.flatMap({ $0.children("hash", in: ns) }) {
            guard let algorithm = algorithm(hash.attributes["type"]) else { continue }
            file.hashes.append(try checksum(algorithm, hash.text, label: label))
        }
        var candidates: [PieceHashes] = []
        for pieces in verification.flatMap({ $0.children("pieces", in: ns) }) {
            if let read = try readPieces(pieces, ns: ns, size: file.size, limits: limits, label: label) { candidates.append(read) }
        }
        file.pieces = candidates.min { MetalinkChoice.strength($0.algorithm) < MetalinkChoice.strength($1.algorithm) }
        let urlElements =
            version == .v4 ? element.children("url", in: ns) : element.children("resources", in: ns).flatMap { $0.children("url", in: ns) }
        guard urlElements.count <= limits.maxURLsPerFile else {
            throw invalid("\(label) has \(urlElements.count) URLs; at most \(limits.maxURLsPerFile)")
        }
        var seen: Set<String> = []
        for url in urlElements {
            let text = url.text
            let scheme = text.prefix { $0 != ":" }.lowercased()
            // ftp, bittorrent and the like are other protocols' mirrors: dld leaves them.
            guard scheme == "http" || scheme == "https" else { continue }
            if case .failure(let error) = URLRules.checked(text) {
                throw invalid("\(label): URL \(URLRules.redacted(text).prefix(200)): \(error.message)")
            }
            guard seen.insert(text).inserted else { continue }
            var entry = MetalinkURL(url: text, location: url.attributes["location"].map { $0.lowercased() })
            if version == .v4 {
                if let priority = url.attributes["priority"] {
                    guard let value = Int(priority), (1...MetalinkURL.lowestPriority).contains(value) else {
                        throw invalid("\(label): priority \"\(priority.prefix(20))\" is not 1…999999")
                    }
                    entry.priority = value
                }
            } else if let preference = url.attributes["preference"] {
                guard let value = Int(preference), (0...100).contains(value) else {
                    throw invalid("\(label): preference \"\(preference.prefix(20))\" is not 0…100")
                }
                entry.priority = 101 - value
            }
            file.urls.append(entry)
        }
        guard !file.urls.isEmpty else { throw invalid("\(label) has no http or https URL") }
        return file
    }

    /// `<pieces length type>` and its `<hash>`es; nil for an algorithm dld does not know, or
    /// when the file's size is unknown (the pieces cannot be placed then).
    private static func readPieces(
        _ element: MetalinkElement, ns: String, size: Int64?, limits: MetalinkLimits, label: String
    ) throws(DLError) -> PieceHashes? {
        guard let algorithm = algorithm(element.attributes["type"]) else { return nil }
        guard let text = element.attributes["length"], let length = Int64(text), length > 0 else {
            throw invalid("\(label): piece length \"\((element.attributes["length"] ?? "").prefix(40))\" is not a positive byte count")
        }
        let hashElements = element.children("hash", in: ns)
        guard hashElements.count <= limits.maxPieces else {
            throw invalid("\(label) has \(hashElements.count) piece hashes; at most \(limits.maxPieces)")
        }
        guard let size else { return nil }
        let expected = PieceHashes.count(size: size, length: length)
        guard hashElements.count == expected else {
            throw invalid("\(label): \(hashElements.count) piece hashes for \(expected) pieces of \(length) bytes")
        }
        var hashes: [String] = []
        hashes.reserveCapacity(hashElements.count)
        for (index, hash) in hashElements.enumerated() {
            // v3 numbers its pieces; they must be in order.
            if let piece = hash.attributes["piece"], Int(piece) != index {
                throw invalid("\(label): piece hash \(index) says piece=\"\(piece.prefix(20))\"")
            }
            hashes.append(try checksum(algorithm, hash.text, label: label).hex)
        }
        return PieceHashes(algorithm: algorithm, length: length, hashes: hashes)
    }

    /// A relative path that stays inside the destination folder.
    static func fileName(_ raw: String) throws(DLError) -> String {
        guard !raw.isEmpty, raw.utf8.count <= 1024 else { throw invalid("a file name must be 1 to 1024 bytes") }
        guard !raw.hasPrefix("/") else { throw invalid("the file name \"\(raw.prefix(200))\" is absolute") }
        guard !raw.unicodeScalars.contains(where: { $0.value < 0x20 || $0 == "\u{7F}" || $0 == "\\" }) else {
            throw invalid("the file name \"\(raw.prefix(200).debugDescription)\" holds a control character or a backslash")
        }
        switch RelativePath.validate(raw) {
        case .success(let path): return path
        case .failure:
            throw invalid("the file name \"\(raw.prefix(200))\" leaves the destination folder (\"..\", \".\" or an empty segment)")
        }
    }

    /// RFC 5854's hash names (IANA's: `sha-256`) and v3's (`sha256`); nil for others.
    static func algorithm(_ type: String?) -> DigestAlgorithm? {
        guard let type else { return nil }
        return DigestAlgorithm(rawValue: String(type.lowercased().filter { $0 != "-" }))
    }

    private static func checksum(_ algorithm: DigestAlgorithm, _ text: String, label: String) throws(DLError) -> Checksum {
        let hex = text.lowercased()
        guard hex.utf8.count == algorithm.hexLength, hex.utf8.allSatisfy({ ($0 >= 48 && $0 <= 57) || ($0 >= 97 && $0 <= 102) }) else {
            throw invalid("\(label): a \(algorithm.rawValue) hash has \(algorithm.hexLength) hex digits, not \"\(text.prefix(40))\"")
        }
        return Checksum(algorithm: algorithm, hex: hex)
    }
}

/// Which of several digests is the strongest.
public enum MetalinkChoice {
    /// Lower is stronger: sha-512, sha-256, sha-1, md5.
    public static func strength(_ algorithm: DigestAlgorithm) -> Int {
        switch algorithm {
        case .sha512: 0
        case .sha256: 1
        case .sha1: 2
        case .md5: 3
        }
    }
}

/// Which source a bad piece blames, and when a source has served too many: a pure tally for
/// the transfer's piece check (DLTransfer's `PieceCheck`).
public struct PieceBlame: Sendable, Equatable {
    /// Bad pieces after which a source is dropped for good (`bad_piece`): one could be a flipped
    /// bit in transit, three are a mirror that serves another file.
    public static let maxBadPieces = 3

    /// Bad pieces by source index.
    public private(set) var bad: [Int: Int] = [:]

    public init() {}

    /// Counts a bad piece against `source`; true when it has now served `maxBadPieces`.
    public mutating func blame(_ source: Int) -> Bool {
        bad[source, default: 0] += 1
        return bad[source, default: 0] == Self.maxBadPieces
    }

    /// The sources that served any byte of `range`, from the log of `(bytes, source)` served.
    public static func suspects(of range: Range<Int64>, in served: [(bytes: Range<Int64>, source: Int)]) -> Set<Int> {
        Set(served.filter { $0.bytes.overlaps(range) }.map(\.source))
    }

    /// The reason recorded for a dropped source.
    public static func reason(_ count: Int, _ algorithm: DigestAlgorithm) -> String {
        "bad_piece: \(count) pieces it served did not match their \(algorithm.rawValue) hashes"
    }
}
