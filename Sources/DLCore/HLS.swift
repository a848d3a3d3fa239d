import Foundation

// HLS playlists (RFC 8216), read as hostile input: bounded in size, line length, variants and
// segments, and every error names the line it stopped at. Pure: the daemon fetches the text,
// this reads it, chooses a variant and plans the group (`HLSRecipe`).

/// Limits on a playlist: a real one is a few hundred KiB at most (a 10-hour VOD of 2 s segments
/// is 18 000 segments, about 2 MiB).
public enum HLSLimits {
    /// Bytes of one playlist.
    public static let maxPlaylistBytes = 4 << 20
    /// Segments of one media playlist.
    public static let maxSegments = 100_000
    /// Bytes of one line: a URI is at most `URLRules.maxLength` (8192) bytes, plus its tag.
    public static let maxLineBytes = 16 * 1024
    /// Variants of one master playlist.
    public static let maxVariants = 1000
    /// Distinct keys and init sections of one media playlist.
    public static let maxKeys = 10_000
}

/// A variant stream of a master playlist (`EXT-X-STREAM-INF` and the URI after it).
public struct HLSVariant: Sendable, Equatable, Codable {
    /// The media playlist's URL, resolved against the master's.
    public var url: String
    /// `BANDWIDTH`, bits per second (required by the RFC).
    public var bandwidth: Int64
    public var averageBandwidth: Int64?
    public var width: Int?
    public var height: Int?
    public var codecs: String?
    /// `AUDIO`: the group of alternative audio renditions it plays with, if any.
    public var audio: String?

    public init(url: String, bandwidth: Int64) {
        self.url = url
        self.bandwidth = bandwidth
    }
}

/// A master playlist: its variants in the order written.
public struct HLSMaster: Sendable, Equatable {
    public var variants: [HLSVariant]
    /// `GROUP-ID`s of `EXT-X-MEDIA TYPE=AUDIO` renditions that have a URI of their own (audio
    /// served apart from the video, which dld cannot join into one file).
    public var separateAudioGroups: Set<String>
}

/// `EXT-X-BYTERANGE`: `length` bytes from `offset` of the resource.
public struct HLSByteRange: Sendable, Equatable, Codable {
    public var offset: Int64
    public var length: Int64

    public init(offset: Int64, length: Int64) {
        self.offset = offset
        self.length = length
    }
}

/// An `EXT-X-KEY` with `METHOD=AES-128` (`NONE` is no key).
public struct HLSKey: Sendable, Equatable {
    /// The key's URL (16 bytes), resolved.
    public var url: String
    /// The explicit `IV`, 16 bytes; nil: the media sequence number of the segment.
    public var iv: [UInt8]?
}

/// An `EXT-X-MAP`: the media initialization section of the segments after it.
public struct HLSMap: Sendable, Equatable {
    public var url: String
    public var range: HLSByteRange?
    /// The key in effect at the tag (an encrypted init section; its IV must be explicit).
    public var key: HLSKey?

    public init(url: String, range: HLSByteRange? = nil, key: HLSKey? = nil) {
        self.url = url
        self.range = range
        self.key = key
    }
}

/// One media segment.
public struct HLSSegment: Sendable, Equatable {
    public var url: String
    /// `EXTINF`, seconds.
    public var duration: Double
    public var range: HLSByteRange?
    public var key: HLSKey?
    public var map: HLSMap?
    /// `EXT-X-DISCONTINUITY` before it.
    public var discontinuity: Bool
    /// Its media sequence number.
    public var sequence: Int64
}

/// A media playlist.
public struct HLSMedia: Sendable, Equatable {
    public var targetDuration: Int
    public var mediaSequence: Int64
    public var segments: [HLSSegment]
    /// `EXT-X-ENDLIST`: no segment will be added (else the playlist is live).
    public var endList: Bool
}

public enum HLSPlaylist: Sendable, Equatable {
    case master(HLSMaster)
    case media(HLSMedia)
}

public enum HLSParser {
    /// Reads a playlist fetched from `base` (the URL after redirects: relative URIs resolve
    /// against it). Errors: `hls_invalid` (not a playlist, or one that breaks the RFC's rules),
    /// `hls_unsupported_encryption` (`SAMPLE-AES`, `SAMPLE-AES-CTR`, or a `KEYFORMAT` other than
    /// `identity`: DRM), each with the line it stopped at. Live playlists parse (see `endList`).
    public static func parse(_ data: [UInt8], base: String) -> Result<HLSPlaylist, DLError> {
        guard data.count <= HLSLimits.maxPlaylistBytes else {
            return .failure(DLError(.hlsInvalid, "the playlist is larger than \(HLSLimits.maxPlaylistBytes) bytes"))
        }
        guard let baseURL = URL(string: base) else { return .failure(DLError(.hlsInvalid, "the playlist's URL cannot be read")) }
        var reader = Reader(base: baseURL)
        do throws(DLError) {
            try reader.read(data)
            return .success(try reader.result())
        } catch {
            return .failure(error)
        }
    }

    /// The lines of the text: split on LF (a CR before it dropped), each at most
    /// `maxLineBytes`, decoded as UTF-8 (invalid bytes replaced: they can only be in titles and
    /// URIs, and a URI with them is refused later).
    fileprivate static func lines(_ data: [UInt8]) throws(DLError) -> [String] {
        var lines: [String] = []
        var start = 0
        // A UTF-8 byte order mark is allowed before #EXTM3U.
        if data.starts(with: [0xEF, 0xBB, 0xBF]) { start = 3 }
        var index = start
        while index <= data.count {
            if index == data.count || data[index] == 0x0A {
                var end = index
                if end > start, data[end - 1] == 0x0D { end -= 1 }
                guard end - start <= HLSLimits.maxLineBytes else {
                    throw DLError(.hlsInvalid, "line \(lines.count + 1) is longer than \(HLSLimits.maxLineBytes) bytes")
                }
                lines.append(String(decoding: data[start..<end], as: UTF8.self))
                start = index + 1
            }
            index += 1
        }
        return lines
    }

    /// An attribute list (`NAME=VALUE,…`): quoted strings lose their quotes; names are
    /// upper-case letters, digits and `-`. A name given twice is an error.
    public static func attributes(_ text: Substring, line: Int) throws(DLError) -> [String: String] {
        var result: [String: String] = [:]
        var scalars = Substring(text).unicodeScalars[...]
        while !scalars.isEmpty {
            guard let equals = scalars.firstIndex(of: "=") else {
                throw DLError(.hlsInvalid, "line \(line): an attribute without a value")
            }
            let name = String(String.UnicodeScalarView(scalars[..<equals])).trimmingCharacters(in: .whitespaces)
            guard !name.isEmpty, name.unicodeScalars.allSatisfy({ ("A"..."Z").contains($0) || ("0"..."9").contains($0) || $0 == "-" })
            else {
                throw DLError(.hlsInvalid, "line \(line): an invalid attribute name \"\(name.prefix(40))\"")
            }
            scalars = scalars[scalars.index(after: equals)...]
            var value: String
            if scalars.first == "\"" {
                let rest = scalars.dropFirst()
                guard let close = rest.firstIndex(of: "\"") else {
                    throw DLError(.hlsInvalid, "line \(line): attribute \(name) has no closing quote")
                }
                value = String(String.UnicodeScalarView(rest[..<close]))
                scalars = rest[rest.index(after: close)...]
                if let first = scalars.first, first != "," {
                    throw DLError(.hlsInvalid, "line \(line): text after the quoted value of \(name)")
                }
            } else {
                let end = scalars.firstIndex(of: ",") ?? scalars.endIndex
                value = String(String.UnicodeScalarView(scalars[..<end])).trimmingCharacters(in: .whitespaces)
                scalars = scalars[end...]
            }
            if scalars.first == "," { scalars = scalars.dropFirst() }
            guard result.updateValue(value, forKey: name) == nil else {
                throw DLError(.hlsInvalid, "line \(line): attribute \(name) is given twice")
            }
        }
        return result
    }

    /// `n[@o]` of `EXT-X-BYTERANGE` and `EXT-X-MAP`'s `BYTERANGE`; `o` nil when absent.
    static func byteRange(_ text: String, line: Int) throws(DLError) -> (length: Int64, offset: Int64?) {
        let parts = text.split(separator: "@", maxSplits: 1, omittingEmptySubsequences: false)
        guard let first = parts.first, let length = decimal(first), length > 0,
            parts.count == 1 || decimal(parts[1]) != nil
        else {
            throw DLError(.hlsInvalid, "line \(line): a byte range must be LENGTH[@OFFSET], not \(text.prefix(40))")
        }
        let offset = parts.count == 2 ? decimal(parts[1]) : nil
        if let offset, offset > Int64.max - length {
            throw DLError(.hlsInvalid, "line \(line): the byte range \(text.prefix(40)) ends beyond any file")
        }
        return (length, offset)
    }

    /// A decimal-integer of the RFC: 0…2^63-1, digits only.
    static func decimal(_ text: some StringProtocol) -> Int64? {
        guard !text.isEmpty, text.utf8.count <= 19, text.utf8.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }) else { return nil }
        return Int64(text)
    }

    /// A 128-bit hexadecimal-sequence (`0x…`, 1…32 digits), as 16 bytes big-endian.
    static func iv(_ text: String, line: Int) throws(DLError) -> [UInt8] {
        let digits = text.dropFirst(2)
        guard text.hasPrefix("0x") || text.hasPrefix("0X"), !digits.isEmpty, digits.count <= 32,
            digits.unicodeScalars.allSatisfy({ $0.properties.isASCIIHexDigit })
        else {
            throw DLError(.hlsInvalid, "line \(line): IV must be 0x and up to 32 hex digits, not \(text.prefix(40))")
        }
        // Checked above: hex digits only, so it decodes.
        return Hex.decode(String(repeating: "0", count: 32 - digits.count) + digits) ?? []
    }

    /// The IV of a segment without an explicit one: its media sequence number, 16 bytes
    /// big-endian (RFC 8216, 5.2).
    public static func sequenceIV(_ sequence: Int64) -> [UInt8] {
        let value = UInt64(bitPattern: sequence)
        return [UInt8](repeating: 0, count: 8) + (0..<8).map { UInt8(truncatingIfNeeded: value >> (56 - 8 * $0)) }
    }
}

/// The state of one pass over a playlist's lines.
private struct Reader {
    let base: URL
    var isMaster = false
    var isMedia = false
    // Master.
    var variants: [HLSVariant] = []
    var pendingVariant: HLSVariant?
    var separateAudio: Set<String> = []
    // Media.
    var targetDuration: Int?
    var mediaSequence: Int64 = 0
    var sawSegment = false
    var segments: [HLSSegment] = []
    var pendingDuration: Double?
    var pendingRange: (length: Int64, offset: Int64?)?
    var pendingDiscontinuity = false
    var pendingGap = false
    var key: HLSKey?
    var map: HLSMap?
    var keysAndMaps = 0
    var endList = false
    /// Where the last segment's sub-range ended, and of which URL: an `EXT-X-BYTERANGE`
    /// without an offset continues there.
    var lastRangeEnd: (url: String, end: Int64)?
    var index: Int64 = 0

    init(base: URL) { self.base = base }

    mutating func read(_ data: [UInt8]) throws(DLError) {
        let lines = try HLSParser.lines(data)
        guard let header = lines.first(where: { !$0.trimmingCharacters(in: .whitespaces).isEmpty }),
            header.trimmingCharacters(in: .whitespaces) == "#EXTM3U"
        else {
            throw DLError(.hlsInvalid, "not an HLS playlist: it does not begin with #EXTM3U")
        }
        var seenHeader = false
        for (offset, raw) in lines.enumerated() {
            let number = offset + 1
            let line = raw.trimmingCharacters(in: .whitespaces)
            if line.isEmpty { continue }
            if !seenHeader {
                seenHeader = true
                continue
            }
            if line.hasPrefix("#EXT") {
                try tag(line, number)
            } else if line.hasPrefix("#") {
                continue
            } else {
                try uri(line, number)
            }
        }
        if pendingVariant != nil { throw DLError(.hlsInvalid, "the last EXT-X-STREAM-INF has no URI after it") }
        if pendingDuration != nil { throw DLError(.hlsInvalid, "the last EXTINF has no URI after it") }
    }

    func result() throws(DLError) -> HLSPlaylist {
        if isMaster {
            guard !variants.isEmpty else { throw DLError(.hlsInvalid, "the master playlist names no variant") }
            return .master(HLSMaster(variants: variants, separateAudioGroups: separateAudio))
        }
        guard let targetDuration else { throw DLError(.hlsInvalid, "the media playlist has no EXT-X-TARGETDURATION") }
        return .media(HLSMedia(targetDuration: targetDuration, mediaSequence: mediaSequence, segments: segments, endList: endList))
    }

    mutating func kind(master: Bool, _ number: Int) throws(DLError) {
        if master { isMaster = true } else { isMedia = true }
        if isMaster && isMedia {
            throw DLError(.hlsInvalid, "line \(number): a playlist is either a master or a media playlist, and this one has tags of both")
        }
    }

    func resolve(_ text: String, _ number: Int) throws(DLError) -> String {
        guard let url = URL(string: text, relativeTo: base)?.absoluteURL else {
            throw DLError(.hlsInvalid, "line \(number): the URI \(text.prefix(200)) cannot be read")
        }
        let absolute = url.absoluteString
        if case .failure(let error) = URLRules.validate(absolute) {
            throw DLError(.hlsInvalid, "line \(number): \(error.message)")
        }
        return absolute
    }

    mutating func tag(_ line: String, _ number: Int) throws(DLError) {
        let colon = line.firstIndex(of: ":")
        let name = colon.map { String(line[..<$0]) } ?? line
        let value: Substring = colon.map { line[line.index(after: $0)...] } ?? ""
        switch name {
        case "#EXT-X-STREAM-INF":
            try kind(master: true, number)
            let attributes = try HLSParser.attributes(value, line: number)
            guard let text = attributes["BANDWIDTH"], let bandwidth = HLSParser.decimal(text) else {
                throw DLError(.hlsInvalid, "line \(number): EXT-X-STREAM-INF needs a BANDWIDTH")
            }
            var variant = HLSVariant(url: "", bandwidth: bandwidth)
            variant.averageBandwidth = attributes["AVERAGE-BANDWIDTH"].flatMap(HLSParser.decimal)
            if let resolution = attributes["RESOLUTION"] {
                let parts = resolution.lowercased().split(separator: "x")
                guard parts.count == 2, let width = HLSParser.decimal(parts[0]), let height = HLSParser.decimal(parts[1]),
                    width <= 1 << 20, height <= 1 << 20
                else {
                    throw DLError(.hlsInvalid, "line \(number): RESOLUTION must be WIDTHxHEIGHT, not \(resolution.prefix(40))")
                }
                variant.width = Int(width)
                variant.height = Int(height)
            }
            variant.codecs = attributes["CODECS"]
            variant.audio = attributes["AUDIO"]
            pendingVariant = variant
        case "#EXT-X-MEDIA":
            try kind(master: true, number)
            let attributes = try HLSParser.attributes(value, line: number)
            if attributes["TYPE"] == "AUDIO", attributes["URI"] != nil, let group = attributes["GROUP-ID"] {
                separateAudio.insert(group)
            }
        case "#EXT-X-I-FRAME-STREAM-INF", "#EXT-X-SESSION-DATA", "#EXT-X-SESSION-KEY", "#EXT-X-CONTENT-STEERING":
            try kind(master: true, number)
        case "#EXT-X-TARGETDURATION":
            try kind(master: false, number)
            guard let seconds = HLSParser.decimal(value), seconds <= 86_400 else {
                throw DLError(.hlsInvalid, "line \(number): EXT-X-TARGETDURATION must be whole seconds, not \(value.prefix(40))")
            }
            targetDuration = Int(seconds)
        case "#EXT-X-MEDIA-SEQUENCE":
            try kind(master: false, number)
            guard !sawSegment, let sequence = HLSParser.decimal(value) else {
                throw DLError(.hlsInvalid, "line \(number): EXT-X-MEDIA-SEQUENCE must be a number before the first segment")
            }
            mediaSequence = sequence
        case "#EXTINF":
            try kind(master: false, number)
            let text = value.split(separator: ",", maxSplits: 1, omittingEmptySubsequences: false).first ?? ""
            guard let seconds = Double(text.trimmingCharacters(in: .whitespaces)), seconds.isFinite, seconds >= 0, seconds <= 86_400
            else {
                throw DLError(.hlsInvalid, "line \(number): EXTINF must give the segment's duration in seconds, not \(text.prefix(40))")
            }
            pendingDuration = seconds
        case "#EXT-X-BYTERANGE":
            try kind(master: false, number)
            pendingRange = try HLSParser.byteRange(String(value), line: number)
        case "#EXT-X-DISCONTINUITY":
            try kind(master: false, number)
            pendingDiscontinuity = true
        case "#EXT-X-GAP":
            try kind(master: false, number)
            pendingGap = true
        case "#EXT-X-ENDLIST":
            try kind(master: false, number)
            endList = true
        case "#EXT-X-KEY":
            try kind(master: false, number)
            key = try self.key(HLSParser.attributes(value, line: number), number)
        case "#EXT-X-MAP":
            try kind(master: false, number)
            let attributes = try HLSParser.attributes(value, line: number)
            guard let uri = attributes["URI"] else { throw DLError(.hlsInvalid, "line \(number): EXT-X-MAP needs a URI") }
            var map = HLSMap(url: try resolve(uri, number), range: nil, key: key)
            if let text = attributes["BYTERANGE"] {
                let range = try HLSParser.byteRange(text, line: number)
                map.range = HLSByteRange(offset: range.offset ?? 0, length: range.length)
            }
            if key != nil, key?.iv == nil {
                throw DLError(
                    .hlsInvalid,
                    "line \(number): an init section encrypted with AES-128 needs an explicit IV on its EXT-X-KEY (RFC 8216, 4.3.2.5)")
            }
            try count(number)
            self.map = map
        case "#EXT-X-PART", "#EXT-X-PART-INF", "#EXT-X-PRELOAD-HINT", "#EXT-X-RENDITION-REPORT", "#EXT-X-SERVER-CONTROL",
            "#EXT-X-SKIP", "#EXT-X-PLAYLIST-TYPE", "#EXT-X-DISCONTINUITY-SEQUENCE", "#EXT-X-PROGRAM-DATE-TIME",
            "#EXT-X-DATERANGE", "#EXT-X-BITRATE", "#EXT-X-I-FRAMES-ONLY":
            try kind(master: false, number)
        default:
            // EXT-X-VERSION, EXT-X-INDEPENDENT-SEGMENTS, EXT-X-START, EXT-X-DEFINE and tags this
            // reader does not know: a client ignores what it does not know (RFC 8216, 6.3.1).
            break
        }
    }

    mutating func count(_ number: Int) throws(DLError) {
        keysAndMaps += 1
        guard keysAndMaps <= HLSLimits.maxKeys else {
            throw DLError(.hlsInvalid, "line \(number): more than \(HLSLimits.maxKeys) keys and init sections")
        }
    }

    mutating func key(_ attributes: [String: String], _ number: Int) throws(DLError) -> HLSKey? {
        guard let method = attributes["METHOD"] else { throw DLError(.hlsInvalid, "line \(number): EXT-X-KEY needs a METHOD") }
        if let format = attributes["KEYFORMAT"], format != "identity" {
            throw DLError(
                .hlsUnsupportedEncryption,
                "line \(number): the key format \(format.prefix(100)) is DRM, which dld does not decrypt (only AES-128 with KEYFORMAT \"identity\")"
            )
        }
        switch method {
        case "NONE":
            return nil
        case "AES-128":
            guard let uri = attributes["URI"] else { throw DLError(.hlsInvalid, "line \(number): an AES-128 EXT-X-KEY needs a URI") }
            try count(number)
            return HLSKey(
                url: try resolve(uri, number), iv: try attributes["IV"].map { text throws(DLError) in try HLSParser.iv(text, line: number) }
            )
        case "SAMPLE-AES", "SAMPLE-AES-CTR":
            throw DLError(
                .hlsUnsupportedEncryption,
                "line \(number): METHOD=\(method) encrypts samples inside the media (as DRM does); dld decrypts only whole segments (AES-128)"
            )
        default:
            throw DLError(.hlsUnsupportedEncryption, "line \(number): the encryption method \(method.prefix(40)) is not known")
        }
    }

    mutating func uri(_ line: String, _ number: Int) throws(DLError) {
        if var variant = pendingVariant {
            variant.url = try resolve(line, number)
            variants.append(variant)
            pendingVariant = nil
            guard variants.count <= HLSLimits.maxVariants else {
                throw DLError(.hlsInvalid, "line \(number): more than \(HLSLimits.maxVariants) variants")
            }
            return
        }
        if isMaster { throw DLError(.hlsInvalid, "line \(number): a URI without EXT-X-STREAM-INF before it") }
        guard let duration = pendingDuration else { throw DLError(.hlsInvalid, "line \(number): a segment URI without EXTINF before it") }
        let url = try resolve(line, number)
        var range: HLSByteRange?
        if let pending = pendingRange {
            let offset: Int64
            if let given = pending.offset {
                offset = given
            } else if let last = lastRangeEnd, last.url == url {
                offset = last.end
            } else {
                throw DLError(
                    .hlsInvalid,
                    "line \(number): EXT-X-BYTERANGE without an offset must follow a sub-range of the same resource (RFC 8216, 4.3.2.2)")
            }
            guard offset <= Int64.max - pending.length else {
                throw DLError(.hlsInvalid, "line \(number): the byte range ends beyond any file")
            }
            range = HLSByteRange(offset: offset, length: pending.length)
            lastRangeEnd = (url, offset + pending.length)
        } else {
            lastRangeEnd = nil
        }
        let sequence = mediaSequence.addingReportingOverflow(index)
        guard !sequence.overflow else { throw DLError(.hlsInvalid, "line \(number): the media sequence number overflows") }
        index += 1
        sawSegment = true
        if !pendingGap {
            segments.append(
                HLSSegment(
                    url: url, duration: duration, range: range, key: key, map: map,
                    discontinuity: pendingDiscontinuity, sequence: sequence.partialValue))
            pendingDiscontinuity = false
        }
        guard segments.count <= HLSLimits.maxSegments else {
            throw DLError(.hlsInvalid, "line \(number): more than \(HLSLimits.maxSegments) segments")
        }
        pendingDuration = nil
        pendingRange = nil
        pendingGap = false
    }
}

// MARK: - Choosing a variant

/// What the user asked of a master playlist: an explicit `variant` (index), or the highest
/// bandwidth within `max_height` and `max_bandwidth` (the highest of all by default).
public struct HLSVariantRequest: Sendable, Equatable {
    public var index: Int?
    public var maxHeight: Int?
    public var maxBandwidth: Int64?

    public init(index: Int? = nil, maxHeight: Int? = nil, maxBandwidth: Int64? = nil) {
        self.index = index
        self.maxHeight = maxHeight
        self.maxBandwidth = maxBandwidth
    }

    /// The index of the variant to fetch. A variant without `RESOLUTION` fits any `max_height`
    /// (it is often audio only). Ties go to the first written.
    public func choose(from variants: [HLSVariant]) -> Result<Int, DLError> {
        if let index {
            guard variants.indices.contains(index) else {
                return .failure(
                    .invalidParams(
                        "\"variant\" is \(index), but the master playlist has \(variants.count) variants (0…\(variants.count - 1))"))
            }
            return .success(index)
        }
        var best: Int?
        for (position, variant) in variants.enumerated() {
            if let maxHeight, let height = variant.height, height > maxHeight { continue }
            if let maxBandwidth, variant.bandwidth > maxBandwidth { continue }
            if let current = best, variants[current].bandwidth >= variant.bandwidth { continue }
            best = position
        }
        guard let best else {
            let limits = [maxHeight.map { "max_height \($0)" }, maxBandwidth.map { "max_bandwidth \($0)" }].compactMap { $0 }
            return .failure(.invalidParams("no variant of the master playlist is within \(limits.joined(separator: " and "))"))
        }
        return .success(best)
    }
}
