import Foundation

public typealias JobID = Int64

/// A command that waits for the worker that runs the job: pause, cancel and remove of a job
/// `running` under another worker are recorded on its row; the owner stops its transfer,
/// syncs it, and commits the new state with its epoch. A lease that runs out applies it.
public enum StopRequest: String, Sendable, Codable, Comparable {
    case pause, cancel, remove

    /// The stronger of two requests wins: a cancel is not made a pause by a later pause.
    private var rank: Int {
        switch self {
        case .pause: return 0
        case .cancel: return 1
        case .remove: return 2
        }
    }

    public static func < (lhs: StopRequest, rhs: StopRequest) -> Bool { lhs.rank < rhs.rank }
}

/// Where a job is in its life. See docs/architecture.md for the diagram.
public enum JobState: String, Sendable, CaseIterable, Codable {
    /// Waiting for a free slot of the scheduler.
    case queued
    /// A transfer is under way and holds a slot.
    case running
    /// Not running for a reason the daemon will clear by itself (`WaitReason`), at `nextAttemptAt`.
    case waiting
    /// Stopped by the user; never holds a slot and never blocks the queue.
    case paused
    /// The file is under its final name, complete.
    case completed
    /// Stopped for a reason that retrying would not fix; `error` says which.
    case failed
    /// Stopped by the user for good; its partial data is removed.
    case canceled

    /// A job in one of these states will never run again unless the user asks.
    public var isFinished: Bool {
        switch self {
        case .completed, .failed, .canceled: return true
        case .queued, .running, .waiting, .paused: return false
        }
    }
}

/// Why a `waiting` job is not running.
public enum WaitReason: String, Sendable, CaseIterable, Codable {
    /// A transient server or protocol failure; retried with backoff.
    case retry
    /// The network or the server could not be reached; retried with backoff.
    case network
    /// The connection is metered and the job does not download on a metered connection
    /// (`metered: false`); queued again when the connection is no longer metered.
    case metered
    /// Not enough free space on the destination's filesystem.
    case diskSpace = "disk_space"
}

/// The last problem a job had, with a stable snake_case code for scripts.
public struct JobError: Sendable, Equatable, Codable {
    public var code: String
    public var message: String

    public init(code: String, message: String) {
        self.code = code
        self.message = message
    }
}

/// One header a client asked to be sent with a job's requests.
public struct HeaderField: Sendable, Equatable, Codable {
    /// Headers whose values are credentials: stored, sent only to the job's own host, never
    /// shown. Lowercase.
    public static let credentialNames: Set<String> = ["authorization", "cookie", "proxy-authorization"]

    public var isCredential: Bool { Self.credentialNames.contains(name.lowercased()) }

    public var name: String
    public var value: String

    public init(name: String, value: String) {
        self.name = name
        self.value = value
    }
}

/// What the origin told us about the resource, kept so that a resume can prove it is
/// continuing the same bytes (`If-Range`).
public struct Validators: Sendable, Equatable, Codable {
    /// A strong ETag, with its quotes. Weak ETags are not kept: they cannot validate a range.
    public var etag: String?
    public var lastModified: String?
    public var acceptsRanges: Bool

    public init(etag: String? = nil, lastModified: String? = nil, acceptsRanges: Bool = false) {
        self.etag = etag
        self.lastModified = lastModified
        self.acceptsRanges = acceptsRanges
    }

    /// The value for `If-Range`: the strong ETag, else Last-Modified.
    public var ifRange: String? { etag ?? lastModified }
}

/// Per-job choices that only the transfer needs.
public struct JobOptions: Sendable, Equatable, Codable {
    /// The file name came from the URL: a name the server proposes (Content-Disposition) may
    /// replace it, after sanitizing.
    public var automaticName = false
    /// A taken name becomes `name (N).ext` instead of failing with `destination_exists`.
    public var renameIfTaken = false
    /// TLS certificates are not verified (shown in status, logged as a warning).
    public var insecure = false
    /// The job's own TLS settings; nil: the daemon's. Optional, so that options stored by an
    /// older dld (without them) still decode.
    public var tls: JobTLS?
    /// The job's own speed limit in bytes per second (`max_speed`); nil: none. Inside the
    /// global one. Optional, like `tls`, so that older rows decode.
    public var maxSpeed: Int64?
    /// Ranges fetched at once (segmented downloads); nil: the daemon's `segments`.
    public var segments: Int?
    /// Whether the job may download on a metered connection (`metered` at enqueue); nil: the
    /// config's `metered` decides, as it is when the job would start.
    public var metered: Bool?
    /// The age recipients (`age1…`, checked at enqueue) the file is encrypted to before it
    /// touches the disk (`encrypt_to`); nil: stored as served. Optional, like `tls`, so that
    /// older rows decode; stored in the options JSON, so no column and no migration.
    public var encryptTo: [String]?

    /// Whether the file is encrypted at rest: one stream, started over after any stop.
    public var isEncrypted: Bool { encryptTo.map { !$0.isEmpty } ?? false }

    public init(
        automaticName: Bool = false, renameIfTaken: Bool = false, insecure: Bool = false, tls: JobTLS? = nil,
        maxSpeed: Int64? = nil, segments: Int? = nil, metered: Bool? = nil, encryptTo: [String]? = nil
    ) {
        self.encryptTo = encryptTo
        self.maxSpeed = maxSpeed
        self.segments = segments
        self.automaticName = automaticName
        self.renameIfTaken = renameIfTaken
        self.insecure = insecure
        self.tls = tls
        self.metered = metered
    }
}

/// TLS settings a job brings with it (`ca_file`, `ca_dir`, `client_cert`, `client_key` at
/// enqueue): absolute paths, checked when the job is enqueued and read when a transfer starts.
public struct JobTLS: Sendable, Hashable, Codable {
    /// PEM certificates trusted in addition to the daemon's trust store.
    public var caFile: String?
    /// A folder of PEM certificates, trusted in addition to the daemon's trust store.
    public var caDir: String?
    /// A PEM client certificate (chain) and its unencrypted PEM private key, sent to servers
    /// that ask for one; both or neither.
    public var clientCert: String?
    public var clientKey: String?

    public init(caFile: String? = nil, caDir: String? = nil, clientCert: String? = nil, clientKey: String? = nil) {
        self.caFile = caFile
        self.caDir = caDir
        self.clientCert = clientCert
        self.clientKey = clientKey
    }

    /// Nothing set: the daemon's settings apply unchanged.
    public var isEmpty: Bool { caFile == nil && caDir == nil && clientCert == nil && clientKey == nil }
}

/// A row of the job table, as a value.
public struct Job: Sendable, Equatable {
    public var id: JobID
    public var url: String
    public var path: String
    public var state: JobState
    public var waitReason: WaitReason?
    public var priority: Int
    /// Total size in bytes; nil while unknown.
    public var size: Int64?
    /// Bytes committed: on disk, synced, and recorded. Without `segments`, the resume offset;
    /// with them, the sum of the ranges' written bytes.
    public var received: Int64
    /// The ranges of a segmented download (`SegmentLayout.encoded`), each synced up to its own
    /// offset; nil when the file is one stream of `received` bytes from the start.
    public var segments: String?
    public var error: JobError?
    /// Attempts since the last progress (reset whenever bytes arrive).
    public var attempts: Int
    public var createdAt: Date
    public var updatedAt: Date
    public var finishedAt: Date?
    public var nextAttemptAt: Date?
    public var key: String?
    /// The client's JSON text, kept as given (already validated as JSON).
    public var meta: String?
    public var headers: [HeaderField]
    public var overwrite: Bool
    /// The URL the last transfer ended up at after redirects.
    public var finalURL: String?
    public var validators: Validators
    /// A digest the file must match, given by the client.
    public var checksum: Checksum?
    /// The size the client said the file has; the server must agree.
    public var expectedSize: Int64?
    /// Recorded when complete: the file's SHA-256, and the requested checksum's digest.
    public var sha256: String?
    public var digest: String?
    /// When bytes last arrived (or when the job was created): the clock of `give_up_after`.
    public var progressAt: Date?
    /// The group this job is a member of.
    public var groupID: GroupID?
    /// For group members: where the file is downloaded and verified before the group is
    /// published to `path`.
    public var stagingPath: String?
    public var options = JobOptions()
    /// The daemon (worker id) whose transfer runs this job; nil unless `running` under a
    /// worker that claimed it (a fleet sharing one table).
    public var worker: String?
    /// Until when the worker's claim holds: past it, the job is queued again for another
    /// worker unless the lease was renewed.
    public var leaseUntil: Date?
    /// The fencing token: every claim (and every hand-over of a running job: an expired lease,
    /// a release) increments it, so each attempt at the job has its own. A worker's writes for
    /// an attempt (checkpoints, its outcome) apply only while the row still carries the epoch
    /// its claim returned: a stale attempt, on this machine or another, can never write.
    public var epoch: Int64 = 0
    /// A command for a job that another worker runs (a fleet sharing one table): that worker,
    /// the owner, carries it out with its own epoch; nil for most rows (`StopRequest`).
    public var stopRequest: StopRequest?
    /// The attempt whose bytes the committed offset counts (`worker/epoch`), written by each
    /// owned checkpoint; on a shared table a partial file is trusted only when it carries the
    /// same tag (`PartialFile.isolate`). Nil before the first checkpoint.
    public var partialTag: String?
    /// More URLs of the same file, with their state (`mirrors` at enqueue); empty for most.
    public var mirrors: [JobMirror] = []
    /// Why the job's own URL is no longer used (only with mirrors: the others serve the file).
    public var urlDropped: String?
    /// The file's piece hashes (from a Metalink) in their stored form (`PieceHashes.encoded`);
    /// nil for most jobs. Kept as text: only a transfer that starts reads the hashes.
    public var pieces: String?
    /// Progress written but not yet synced, recorded while the job runs (see
    /// `UnsyncedProgress`); trusted only in the boot that wrote it. Nil once the transfer's
    /// outcome is recorded: its bytes are synced then.
    public var unsynced: UnsyncedProgress? {
        get { unsyncedBox?.value }
        set { unsyncedBox = newValue.map(UnsyncedBox.init) }
    }
    /// `unsynced`, held by reference: almost every row has none, and rows are copied by the
    /// thousand (an `enqueue` of thousands of jobs peaked higher with it held inline).
    private var unsyncedBox: UnsyncedBox?

    public init(
        id: JobID = 0, url: String, path: String, state: JobState = .queued,
        waitReason: WaitReason? = nil, priority: Int = 0, size: Int64? = nil,
        received: Int64 = 0, error: JobError? = nil, attempts: Int = 0,
        createdAt: Date, updatedAt: Date, finishedAt: Date? = nil, nextAttemptAt: Date? = nil,
        key: String? = nil, meta: String? = nil, headers: [HeaderField] = [],
        overwrite: Bool = false, finalURL: String? = nil, validators: Validators = Validators(),
        checksum: Checksum? = nil, expectedSize: Int64? = nil, sha256: String? = nil, digest: String? = nil,
        progressAt: Date? = nil, groupID: GroupID? = nil, stagingPath: String? = nil, options: JobOptions = JobOptions(),
        worker: String? = nil, leaseUntil: Date? = nil, segments: String? = nil, unsynced: UnsyncedProgress? = nil
    ) {
        self.segments = segments
        self.unsyncedBox = unsynced.map(UnsyncedBox.init)
        self.options = options
        self.worker = worker
        self.leaseUntil = leaseUntil
        self.id = id
        self.url = url
        self.path = path
        self.state = state
        self.waitReason = waitReason
        self.priority = priority
        self.size = size
        self.received = received
        self.error = error
        self.attempts = attempts
        self.createdAt = createdAt
        self.updatedAt = updatedAt
        self.finishedAt = finishedAt
        self.nextAttemptAt = nextAttemptAt
        self.key = key
        self.meta = meta
        self.headers = headers
        self.overwrite = overwrite
        self.finalURL = finalURL
        self.validators = validators
        self.checksum = checksum
        self.expectedSize = expectedSize
        self.sha256 = sha256
        self.digest = digest
        self.progressAt = progressAt
        self.groupID = groupID
        self.stagingPath = stagingPath
    }

    /// Where the transfer publishes the complete file: the staging path for group members.
    public var downloadPath: String { stagingPath ?? path }

    /// Where the bytes go until the file is complete: beside the download path, so that the
    /// final rename never crosses a filesystem.
    public var partialPath: String { Self.partialPath(path: path, stagingPath: stagingPath) }

    /// `partialPath` of a job with this path and staging path (a store that has only these
    /// columns of a row).
    public static func partialPath(path: String, stagingPath: String?) -> String { (stagingPath ?? path) + ".part" }

    /// The file name shown to people.
    public var name: String {
        // After the last "/", without NSString for the usual path (it showed in `list` pages).
        // Scanned as bytes ("/" is ASCII, so its index is a character boundary too).
        guard let slash = path.utf8.lastIndex(of: UInt8(ascii: "/")), path.index(after: slash) != path.endIndex else {
            return (path as NSString).lastPathComponent
        }
        return String(path[path.index(after: slash)...])
    }
}

/// A job's `UnsyncedProgress`, boxed so that the row stays small.
final class UnsyncedBox: Sendable, Equatable {
    let value: UnsyncedProgress
    init(_ value: UnsyncedProgress) { self.value = value }
    static func == (a: UnsyncedBox, b: UnsyncedBox) -> Bool { a.value == b.value }
}
