import DLCore
import Foundation

/// A job to create; the store gives it an id and timestamps.
public struct NewJob: Sendable, Equatable {
    public var url: String
    public var path: String
    public var priority: Int
    public var key: String?
    public var meta: String?
    public var headers: [HeaderField]
    public var overwrite: Bool
    public var state: JobState
    public var checksum: Checksum?
    public var expectedSize: Int64?
    public var stagingPath: String?
    public var options = JobOptions()
    /// `URLRules.hostKey(url)`, when the caller knows it already; else the store works it out.
    public var host: String?
    /// More URLs of the same file.
    public var mirrors: [JobMirror] = []
    /// Piece hashes (`PieceHashes.encoded`), from a Metalink.
    public var pieces: String?

    public init(
        url: String, path: String, priority: Int = 0, key: String? = nil, meta: String? = nil,
        headers: [HeaderField] = [], overwrite: Bool = false, state: JobState = .queued,
        checksum: Checksum? = nil, expectedSize: Int64? = nil
    ) {
        self.checksum = checksum
        self.expectedSize = expectedSize
        self.url = url
        self.path = path
        self.priority = priority
        self.key = key
        self.meta = meta
        self.headers = headers
        self.overwrite = overwrite
        self.state = state
    }
}

extension NewJob {
    /// The row as created: both backends' inserts return it.
    public func created(id: JobID, groupID: GroupID?, now: Date) -> Job {
        var job = Job(
            url: url, path: path, state: state, priority: priority,
            createdAt: now, updatedAt: now, key: key, meta: meta,
            headers: headers, overwrite: overwrite, checksum: checksum,
            expectedSize: expectedSize, progressAt: now, groupID: groupID, stagingPath: stagingPath)
        job.options = options
        job.mirrors = mirrors
        job.pieces = pieces
        job.size = expectedSize
        job.id = id
        return job
    }

    /// Group members as staged: under the group's staging folder, at their path relative to
    /// the group's `dir`.
    public static func staged(_ members: [NewJob], dir: String, staging: String) -> [NewJob] {
        members.map { member in
            var member = member
            member.stagingPath = staging + "/" + String(member.path.dropFirst(dir.count + 1))
            return member
        }
    }
}

/// What `insert` did for one requested job.
public struct InsertOutcome: Sendable, Equatable {
    public var job: Job
    /// False when a job with the same `key` already existed and was returned instead.
    public var created: Bool

    public init(job: Job, created: Bool) {
        self.job = job
        self.created = created
    }
}

/// Why a write was refused for a reason of the data (not of SQLite).
public enum StoreError: Error, Sendable, Equatable {
    /// Another unfinished job already writes to this path.
    case pathInUse(path: String, by: JobID)
    /// A job named by id no longer accepts a bulk command (`verb`): another worker moved it
    /// after the engine's check (it completed there, say). The transaction is rolled back.
    case refused(id: JobID, state: JobState, verb: String)
}
