import Foundation

/// What a running transfer has written to its partial file but not yet `fdatasync`ed: recorded
/// about four times a second (cheaply, without a sync) so that a resume after `dld` alone died
/// (SIGKILL, a crash; the machine kept running, so the page cache still holds the bytes) loses
/// a fraction of a second of transfer instead of everything since the last checkpoint.
///
/// Such bytes are only as durable as the page cache: a power loss or a reboot may lose them
/// (or keep some and not others), so the record carries the kernel's boot id and is trusted
/// only in the same boot (`ResumePoint`). It also carries what the bytes came with (size,
/// validators, final URL): the first checkpoint of a download may not have been committed yet.
public struct UnsyncedProgress: Sendable, Equatable, Codable {
    /// `/proc/sys/kernel/random/boot_id` when the bytes were written.
    public var bootID: String
    /// Bytes written (with `segments`, in all ranges together).
    public var received: Int64
    /// A segmented download's ranges (`SegmentLayout.encoded`), each written up to its `done`;
    /// nil for one stream of `received` bytes from the start.
    public var segments: String?
    public var size: Int64?
    public var validators: Validators
    public var finalURL: String?

    public init(
        bootID: String, received: Int64, segments: String? = nil, size: Int64? = nil,
        validators: Validators = Validators(), finalURL: String? = nil
    ) {
        self.bootID = bootID
        self.received = received
        self.segments = segments
        self.size = size
        self.validators = validators
        self.finalURL = finalURL
    }

    enum CodingKeys: String, CodingKey {
        case bootID = "boot"
        case received, segments, size, etag
        case lastModified = "last_modified"
        case acceptsRanges = "ranges"
        case finalURL = "final_url"
    }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        bootID = try c.decode(String.self, forKey: .bootID)
        received = try c.decode(Int64.self, forKey: .received)
        segments = try c.decodeIfPresent(String.self, forKey: .segments)
        size = try c.decodeIfPresent(Int64.self, forKey: .size)
        validators = Validators(
            etag: try c.decodeIfPresent(String.self, forKey: .etag),
            lastModified: try c.decodeIfPresent(String.self, forKey: .lastModified),
            acceptsRanges: try c.decodeIfPresent(Bool.self, forKey: .acceptsRanges) ?? false)
        finalURL = try c.decodeIfPresent(String.self, forKey: .finalURL)
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(bootID, forKey: .bootID)
        try c.encode(received, forKey: .received)
        try c.encodeIfPresent(segments, forKey: .segments)
        try c.encodeIfPresent(size, forKey: .size)
        try c.encodeIfPresent(validators.etag, forKey: .etag)
        try c.encodeIfPresent(validators.lastModified, forKey: .lastModified)
        try c.encode(validators.acceptsRanges, forKey: .acceptsRanges)
        try c.encodeIfPresent(finalURL, forKey: .finalURL)
    }

    /// The stored form (the `unsynced` column): a small JSON object.
    public var encoded: String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = .sortedKeys
        return (try? encoder.encode(self)).map { String(decoding: $0, as: UTF8.self) } ?? ""
    }

    /// Parses the stored form; nil for anything else (then only the synced offset counts).
    public init?(encoded text: String) {
        guard let value = try? JSONDecoder().decode(UnsyncedProgress.self, from: Data(text.utf8)) else { return nil }
        self = value
    }

    /// The length the partial file must have at least for these bytes to be there.
    /// Nil when the record describes no usable file (ranges that cannot be read back).
    public var requiredLength: Int64? {
        guard let segments else { return received }
        guard let size, let layout = SegmentLayout(encoded: segments, size: size), layout.written == received else { return nil }
        // The end of the last range with bytes written (an untouched range needs none).
        return layout.segments.filter { $0.done > $0.start }.map(\.done).max() ?? 0
    }
}

/// Where a resume continues: the last synced and committed progress, or the unsynced progress
/// recorded after it. Pure: the caller reads the boot id and the partial file's length.
public enum ResumePoint {
    /// Why the synced progress is used.
    public enum Reason: Sendable, Equatable {
        /// No unsynced progress was recorded.
        case none
        /// The boot id is unknown now, or the bytes were written in another boot (a reboot or
        /// a power loss since): the page cache that held them is gone.
        case otherBoot
        /// The record is not ahead of what is synced (an older record; nothing to gain).
        case notAhead
        /// The partial file is shorter than the record says (or gone): the bytes are not there.
        case fileShorter
        /// The record cannot be used: ranges that do not read back, no byte ranges, or neither
        /// a validator nor the size that a resume without one checks (such a resume starts
        /// over anyway).
        case unusable
    }

    public enum Choice: Sendable, Equatable {
        case synced(Reason)
        case unsynced(UnsyncedProgress)
    }

    /// Trusts `unsynced` only when it was written in this boot (`bootID`, the current one),
    /// is ahead of the `synced` bytes, can be resumed (byte ranges, and a validator or a known
    /// size: without a validator the resume compares the bytes before it with the server's,
    /// `OverlapResume`, as from a committed offset), and the partial file (`fileLength`, nil
    /// when there is none) is at least as long as it says.
    public static func choose(synced: Int64, unsynced: UnsyncedProgress?, bootID: String?, fileLength: Int64?) -> Choice {
        guard let unsynced else { return .synced(.none) }
        guard let bootID, !bootID.isEmpty, unsynced.bootID == bootID else { return .synced(.otherBoot) }
        guard unsynced.received > synced else { return .synced(.notAhead) }
        guard unsynced.validators.acceptsRanges, unsynced.validators.ifRange != nil || unsynced.size != nil,
            let required = unsynced.requiredLength
        else {
            return .synced(.unusable)
        }
        guard let fileLength, fileLength >= required else { return .synced(.fileShorter) }
        return .unsynced(unsynced)
    }
}
