import Foundation

/// One job to create, as a client asked for it (already checked for types, not yet for the
/// filesystem).
public struct EnqueueSpec: Sendable, Equatable {
    public var url: String
    public var path: String?
    public var dir: String?
    public var name: String?
    public var priority: Int = 0
    public var key: String?
    public var meta: String?
    public var headers: [HeaderField] = []
    public var overwrite = false
    public var paused = false
    public var checksum: Checksum?
    public var size: Int64?
    public var onExists: ExistingFilePolicy = .error
    public var insecure = false
    /// The job's own TLS files (`ca_file`, `ca_dir`, `client_cert`, `client_key`), checked.
    public var tls: JobTLS?
    /// Ranges fetched at once for this job; nil: the config's `segments`.
    public var segments: Int?
    /// `metered` at enqueue: whether the job may download on a metered connection; nil: the
    /// config decides.
    public var metered: Bool?
    /// `encrypt_to`: the age recipients (checked) the file is encrypted to; `.age` is appended
    /// to its name.
    public var encryptTo: [String]?
    /// `URLRules.hostKey(url)` when the caller has checked the URL already.
    public var host: String?
    /// The job's own speed limit, bytes per second (`max_speed`; nil or 0: none).
    public var maxSpeed: Int64?
    /// More URLs of the same file (`mirrors`), checked.
    public var mirrors: [JobMirror] = []
    /// A download of the URL cache into its own folder (`get`): the destination is the
    /// daemon's choice, so `allowed_roots` do not apply (the cache folder is usually under
    /// `~/.cache`, a hidden entry of `$HOME`). Never set from a request's params.
    public var intoCache = false
    /// `kind`: nil when not given (an HLS playlist when the URL's path ends in `.m3u8`).
    public var kind: DownloadKind?
    /// What an HLS download asks for (`max_height`, `max_bandwidth`, `variant`, `hls_layout`,
    /// `live`); used when `isHLS`.
    public var hls = HLSRequest()
    /// The file's piece hashes (from a Metalink): each piece is verified as it lands.
    public var pieces: PieceHashes?

    public init(url: String) { self.url = url }

    /// Whether this is an HLS download: `kind: "hls"`, or no kind and a `.m3u8` path. Guessing
    /// from the answer's content type would cost a request at every enqueue.
    public var isHLS: Bool {
        switch kind {
        case .hls: true
        case .file: false
        case nil: HLSRequest.looksLikePlaylist(url)
        }
    }
}

/// `kind` of `enqueue`: a file as served, or an HLS playlist whose media is downloaded.
public enum DownloadKind: String, Sendable, Equatable, CaseIterable {
    case file, hls
}

/// The HLS params of `enqueue`.
public struct HLSRequest: Sendable, Equatable {
    public var variant = HLSVariantRequest()
    public var layout: HLSLayout = .file
    public var live = false

    public init() {}

    /// Whether the URL's path ends in `.m3u8` (any case).
    public static func looksLikePlaylist(_ url: String) -> Bool {
        (URLComponents(string: url)?.path ?? "").lowercased().hasSuffix(".m3u8")
    }
}

/// One member of a group to create: a URL and a path relative to the group's folder.
public struct GroupMemberSpec: Sendable, Equatable {
    public var url: String
    public var relativePath: String?
    public var checksum: Checksum?
    public var size: Int64?
    public var meta: String?
    /// More URLs of the same file (`mirrors`), checked.
    public var mirrors: [JobMirror] = []
    /// The file's piece hashes (from a Metalink).
    public var pieces: PieceHashes?
    public init(url: String) { self.url = url }
}
