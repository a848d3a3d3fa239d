import Foundation

/// How an HLS download is published: one joined file, or a folder that plays offline.
public enum HLSLayout: String, Sendable, Codable, CaseIterable {
    /// `NAME.ts` (MPEG-TS segments joined) or `NAME.mp4` (fMP4: init section, then segments).
    case file
    /// The segments, keys and init sections with a local playlist (`index.m3u8`).
    case folder
}

/// What an HLS group is made of and how its members become the published file: the ordered
/// segments, each naming its member (a staged file), the byte range in it, the key member
/// and IV, and the init section before it. Stored as JSON with the group's row, in the same
/// transaction that creates the group and its members, so that no crash leaves a group
/// without its recipe or a recipe without its group. Pure: planned from a parsed playlist.
public struct HLSRecipe: Sendable, Equatable, Codable {
    /// A file to fetch: each distinct URL once (segments that are ranges of one file share it).
    public struct Member: Sendable, Equatable, Codable {
        public var url: String
        /// Its name in the staging folder (and in the folder layout).
        public var name: String
    }

    /// An init section: a member, or a range of one, and its key.
    public struct Map: Sendable, Equatable, Codable {
        public var member: Int
        public var range: HLSByteRange?
        public var key: Int?
        /// 32 hex digits, when `key` is set.
        public var iv: String?
    }

    public struct Segment: Sendable, Equatable, Codable {
        public var member: Int
        public var range: HLSByteRange?
        public var duration: Double
        /// The member holding its AES-128 key.
        public var key: Int?
        /// Its IV as 32 hex digits (the explicit one, else its media sequence number).
        public var iv: String?
        /// The init section in effect (index into `maps`).
        public var map: Int?
        public var discontinuity: Bool
    }

    public var version = 1
    public var layout: HLSLayout
    /// The published file or folder, absolute (set by the engine once the destination is known).
    public var output: String
    /// The chosen variant, when the URL was a master playlist, and its index there.
    public var variant: HLSVariant?
    public var variantIndex: Int?
    public var targetDuration: Int
    public var mediaSequence: Int64
    public var members: [Member]
    public var maps: [Map]
    public var segments: [Segment]

    /// `ts` or `mp4`: fMP4 when the segments have an init section that is not MPEG-TS.
    public var container: String {
        let mp4 = maps.contains { !(members[safe: $0.member]?.name.hasSuffix(".ts") ?? true) }
        return mp4 ? "mp4" : "ts"
    }

    /// The name of the local playlist in the folder layout.
    public static let playlistName = "index.m3u8"

    /// While a live playlist is recorded (`live: true`): what the reloads need. Nil once the
    /// recipe is closed (the playlist's `EXT-X-ENDLIST`, a `cancel`, or the reload policy gave
    /// up): only a closed recipe is published. Absent in recipes stored before live recording.
    public var live: Live?

    public struct Live: Sendable, Equatable, Codable {
        /// The media playlist reloaded (the chosen variant's, for a master).
        public var url: String
        /// The media sequence number of the first segment not in the recipe yet.
        public var nextSequence: Int64

        public init(url: String, nextSequence: Int64) {
            self.url = url
            self.nextSequence = nextSequence
        }
    }

    /// Plans the members and the order of a media playlist. `output` is filled in later. With
    /// `liveURL`, a playlist without `EXT-X-ENDLIST` is recorded: the recipe stays open (`live`).
    public static func plan(
        _ media: HLSMedia, layout: HLSLayout, variant: HLSVariant? = nil, variantIndex: Int? = nil, liveURL: String? = nil
    ) -> Result<HLSRecipe, DLError> {
        guard !media.segments.isEmpty else { return .failure(DLError(.hlsInvalid, "the media playlist has no segment")) }
        var recipe = HLSRecipe(
            layout: layout, output: "", variant: variant, variantIndex: variantIndex, targetDuration: media.targetDuration,
            mediaSequence: media.mediaSequence, members: [], maps: [], segments: [])
        recipe.add(media.segments)
        if let liveURL, !media.endList {
            recipe.live = Live(url: liveURL, nextSequence: (media.segments.last?.sequence ?? media.mediaSequence) &+ 1)
        }
        return .success(recipe)
    }

    /// Adds segments after the recipe's last: new members for URLs it does not have yet
    /// (named on from the ones it has), a new init section where `EXT-X-MAP` changes.
    mutating func add(_ segments: [HLSSegment]) {
        var byURL: [String: Int] = [:]
        var counts = (segments: 0, keys: 0, maps: 0)
        for (index, member) in members.enumerated() {
            byURL[member.url] = index
            if member.name.hasPrefix("key-") {
                counts.keys += 1
            } else if member.name.hasPrefix("init-") {
                counts.maps += 1
            } else {
                counts.segments += 1
            }
        }
        func member(_ url: String, role: String) -> Int {
            if let known = byURL[url] { return known }
            let name: String
            switch role {
            case "key":
                name = String(format: "key-%04d.key", counts.keys)
                counts.keys += 1
            case "map":
                name = String(format: "init-%04d.%@", counts.maps, Self.extensionOf(url, fallback: "mp4"))
                counts.maps += 1
            default:
                name = String(format: "seg-%06d.%@", counts.segments, Self.extensionOf(url, fallback: "ts"))
                counts.segments += 1
            }
            members.append(Member(url: url, name: name))
            byURL[url] = members.count - 1
            return members.count - 1
        }
        var lastMap = self.segments.last?.map
        for segment in segments {
            var mapIndex: Int?
            if let map = segment.map {
                let mapMember = member(map.url, role: "map")
                let key = map.key.map { member($0.url, role: "key") }
                let planned = Map(member: mapMember, range: map.range, key: key, iv: map.key?.iv.map { Hex.encode($0) })
                if let lastMap, maps.indices.contains(lastMap), maps[lastMap] == planned {
                    mapIndex = lastMap
                } else {
                    maps.append(planned)
                    mapIndex = maps.count - 1
                }
                lastMap = mapIndex
            }
            let segmentMember = member(segment.url, role: "segment")
            let key = segment.key.map { member($0.url, role: "key") }
            let iv = segment.key.map { Hex.encode($0.iv ?? HLSParser.sequenceIV(segment.sequence)) }
            self.segments.append(
                Segment(
                    member: segmentMember, range: segment.range, duration: segment.duration, key: key, iv: iv, map: mapIndex,
                    discontinuity: segment.discontinuity))
        }
    }

    /// A reload of the live playlist: its segments from `live.nextSequence` on are added (the
    /// first of them after a discontinuity when the window slid past segments never seen).
    /// Returns the indices of the new members; with `EXT-X-ENDLIST` the recipe is closed. A
    /// closed recipe takes nothing.
    public mutating func reloaded(_ media: HLSMedia) -> Range<Int> {
        let before = members.count
        guard let live else { return before..<before }
        var fresh = media.segments.filter { $0.sequence >= live.nextSequence }
        if let first = fresh.first, first.sequence > live.nextSequence || media.mediaSequence > live.nextSequence {
            fresh[0].discontinuity = true
        }
        add(fresh)
        if media.targetDuration > 0 { targetDuration = media.targetDuration }
        let next = max(live.nextSequence, (fresh.last?.sequence ?? live.nextSequence - 1) &+ 1)
        self.live = media.endList ? nil : Live(url: live.url, nextSequence: next)
        return before..<members.count
    }

    /// The recording stopped before its end (`cancel`, or the reload policy gave up): closed,
    /// with only the segments whose members (the segment's, its key's, its init section's and
    /// that one's key) are all in `complete`; the one after a dropped one starts a
    /// discontinuity. Members stay (indices do not change); the ones no segment uses are not
    /// read when publishing.
    public func stopped(complete: Set<Int>) -> HLSRecipe {
        var result = self
        result.live = nil
        result.segments = []
        var dropped = false
        for segment in segments {
            var needed = [segment.member] + [segment.key].compactMap { $0 }
            if let map = segment.map {
                guard let init_ = maps[safe: map] else { continue }
                needed += [init_.member] + [init_.key].compactMap { $0 }
            }
            guard needed.allSatisfy(complete.contains) else {
                dropped = true
                continue
            }
            var kept = segment
            if dropped, !result.segments.isEmpty { kept.discontinuity = true }
            dropped = false
            result.segments.append(kept)
        }
        return result
    }

    /// A short, safe extension from the URL's path (`ts`, `m4s`, `mp4`, `aac`…), else the fallback:
    /// players pick a demuxer by it, and names must never come from a stranger as they are.
    static func extensionOf(_ url: String, fallback: String) -> String {
        let path = URLComponents(string: url)?.path ?? ""
        let ext = (path as NSString).pathExtension.lowercased()
        let known: Set<String> = ["ts", "m4s", "mp4", "m4a", "m4v", "aac", "ac3", "ec3", "mp3", "vtt", "webvtt", "cmfv", "cmfa"]
        return known.contains(ext) ? ext : fallback
    }

    /// A 16-byte IV as stored in the recipe (32 hex digits), or nil.
    public static func bytes(hex text: String) -> [UInt8]? {
        Hex.decode(text).flatMap { $0.count == 16 ? $0 : nil }
    }

    // MARK: Assembly

    /// One stretch of the joined file: a member (or a range of it), decrypted with a key
    /// member and IV when set.
    public struct Piece: Sendable, Equatable {
        public var name: String
        public var range: HLSByteRange?
        public var keyName: String?
        public var iv: [UInt8]?

        public init(name: String, range: HLSByteRange? = nil, keyName: String? = nil, iv: [UInt8]? = nil) {
            self.name = name
            self.range = range
            self.keyName = keyName
            self.iv = iv
        }
    }

    /// The joined file in order: the init section first and again wherever it changes, each
    /// segment after. Nil when the recipe names a member it does not have (a stored recipe
    /// that was damaged).
    public func pieces() -> [Piece]? {
        var pieces: [Piece] = []
        var lastMap: Int?
        for segment in segments {
            if let map = segment.map, map != lastMap {
                guard let init_ = maps[safe: map], let name = members[safe: init_.member]?.name else { return nil }
                let key = init_.key.flatMap { members[safe: $0]?.name }
                pieces.append(Piece(name: name, range: init_.range, keyName: key, iv: init_.iv.flatMap(Self.bytes(hex:))))
                lastMap = map
            }
            guard let name = members[safe: segment.member]?.name else { return nil }
            let key = segment.key.flatMap { members[safe: $0]?.name }
            if segment.key != nil, key == nil || segment.iv.flatMap(Self.bytes(hex:)) == nil { return nil }
            pieces.append(Piece(name: name, range: segment.range, keyName: key, iv: segment.iv.flatMap(Self.bytes(hex:))))
        }
        return pieces
    }

    /// The playlist of the folder layout: the same segments, ranges, keys, init sections and
    /// discontinuities, with the members' local names, so that it plays from disk.
    public func localPlaylist() -> String {
        var lines = ["#EXTM3U", "#EXT-X-VERSION:\(maps.isEmpty ? 4 : 6)", "#EXT-X-TARGETDURATION:\(targetDuration)"]
        lines.append("#EXT-X-MEDIA-SEQUENCE:\(mediaSequence)")
        lines.append("#EXT-X-PLAYLIST-TYPE:VOD")
        var lastKey: (Int?, String?) = (nil, nil)
        var lastMap: Int?
        func keyLine(_ key: Int?, _ iv: String?) -> String {
            guard let key, let name = members[safe: key]?.name else { return "#EXT-X-KEY:METHOD=NONE" }
            return "#EXT-X-KEY:METHOD=AES-128,URI=\"\(name)\"" + (iv.map { ",IV=0x\($0)" } ?? "")
        }
        func range(_ range: HLSByteRange) -> String { "\(range.length)@\(range.offset)" }
        for segment in segments {
            if segment.discontinuity { lines.append("#EXT-X-DISCONTINUITY") }
            if let map = segment.map, map != lastMap, let init_ = maps[safe: map], let name = members[safe: init_.member]?.name {
                if init_.key != lastKey.0 || (init_.key != nil && init_.iv != lastKey.1) {
                    lines.append(keyLine(init_.key, init_.iv))
                    lastKey = (init_.key, init_.iv)
                }
                lines.append("#EXT-X-MAP:URI=\"\(name)\"" + (init_.range.map { ",BYTERANGE=\"\(range($0))\"" } ?? ""))
                lastMap = map
            }
            if segment.key != lastKey.0 || (segment.key != nil && segment.iv != lastKey.1) {
                lines.append(keyLine(segment.key, segment.iv))
                lastKey = (segment.key, segment.iv)
            }
            lines.append("#EXTINF:\(String(format: "%.6f", segment.duration)),")
            if let byteRange = segment.range { lines.append("#EXT-X-BYTERANGE:\(range(byteRange))") }
            lines.append(members[safe: segment.member]?.name ?? "")
        }
        lines.append("#EXT-X-ENDLIST")
        return lines.joined(separator: "\n") + "\n"
    }

    // MARK: Storage

    /// The recipe as the JSON text stored with the group.
    public func encoded() -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        guard let data = try? encoder.encode(self) else { return "" }
        return String(decoding: data, as: UTF8.self)
    }

    /// A stored recipe; nil when the text is not one (the caller fails the group with
    /// `hls_assembly` rather than publish its parts).
    public static func decode(_ text: String) -> HLSRecipe? {
        try? JSONDecoder().decode(HLSRecipe.self, from: Data(text.utf8))
    }
}

extension Array {
    fileprivate subscript(safe index: Int) -> Element? {
        indices.contains(index) ? self[index] : nil
    }
}
