import DLCore
import DLJobTable
import Foundation

// Rows written many a statement, as `RecordSet` JSON. Texts are cut at a NUL here, as every
// text the store writes (`storedText`). A nil is left out of the JSON, which reads as NULL.

/// A new job's row (`insert`).
struct InsertRecord: Encodable {
    var id: JobID
    var url: String
    var path: String
    var state: String
    var priority: Int
    var createdAt: Double
    var updatedAt: Double
    var key: String?
    var meta: String?
    var headers: String
    var overwrite: Bool
    var checksum: String?
    var expectedSize: Int64?
    var size: Int64?
    var progressAt: Double
    var groupID: GroupID?
    var stagingPath: String?
    var options: String
    var host: String
    var mirrors: String?
    var pieces: String?

    enum CodingKeys: String, CodingKey {
        case id, url, path, state, priority, key, meta, headers, overwrite, checksum, size, options, host, mirrors, pieces
        case createdAt = "created_at"
        case updatedAt = "updated_at"
        case expectedSize = "expected_size"
        case progressAt = "progress_at"
        case groupID = "group_id"
        case stagingPath = "staging_path"
    }

    init(id: JobID, _ new: NewJob, groupID: GroupID?, at: Double) {
        self.id = id
        url = storedText(new.url)
        path = storedText(new.path)
        state = new.state.rawValue
        priority = new.priority
        createdAt = at
        updatedAt = at
        key = new.key.map(storedText)
        meta = new.meta.map(storedText)
        headers = storedText(ColumnCoding.headers(new.headers))
        overwrite = new.overwrite
        checksum = new.checksum.map { storedText($0.description) }
        expectedSize = new.expectedSize
        size = new.expectedSize
        progressAt = at
        self.groupID = groupID
        stagingPath = new.stagingPath.map(storedText)
        options = ColumnCoding.options(new.options)
        host = storedText(new.host ?? URLRules.hostKey(new.url))
        mirrors = ColumnCoding.mirrors(new.mirrors, urlDropped: nil).map(storedText)
        pieces = new.pieces.map(storedText)
    }

    static let set = RecordSet<InsertRecord>(columns: [
        ("id", "bigint"), ("url", "text"), ("path", "text"), ("state", "text"), ("priority", "bigint"),
        ("created_at", "double precision"), ("updated_at", "double precision"), ("key", "text"), ("meta", "text"),
        ("headers", "text"), ("overwrite", "boolean"), ("checksum", "text"), ("expected_size", "bigint"), ("size", "bigint"),
        ("progress_at", "double precision"), ("group_id", "bigint"), ("staging_path", "text"), ("options", "text"), ("host", "text"),
        ("mirrors", "text"), ("pieces", "text"),
    ])
}

/// A whole row as `save` writes it: every column but created_at, group_id, host, epoch and the
/// worker's (worker, lease_until, stop_request: kept while the row is `running`, cleared
/// otherwise), as the SQLite store's `update`.
struct UpdateRecord: Encodable {
    var id: JobID
    var url: String
    var path: String
    var state: String
    var waitReason: String?
    var priority: Int
    var size: Int64?
    var received: Int64
    var errorCode: String?
    var errorMessage: String?
    var attempts: Int
    var updatedAt: Double
    var finishedAt: Double?
    var nextAttemptAt: Double?
    var key: String?
    var meta: String?
    var headers: String
    var overwrite: Bool
    var finalURL: String?
    var etag: String?
    var lastModified: String?
    var acceptsRanges: Bool
    var checksum: String?
    var expectedSize: Int64?
    var sha256: String?
    var digest: String?
    var progressAt: Double?
    var stagingPath: String?
    var options: String
    var segments: String?
    var unsynced: String?
    var mirrors: String?

    enum CodingKeys: String, CodingKey {
        case id, url, path, state, priority, size, received, attempts, key, meta, headers, overwrite, etag, checksum, sha256, digest,
            options
        case segments, unsynced, mirrors
        case waitReason = "wait_reason"
        case errorCode = "error_code"
        case errorMessage = "error_message"
        case updatedAt = "updated_at"
        case finishedAt = "finished_at"
        case nextAttemptAt = "next_attempt_at"
        case finalURL = "final_url"
        case lastModified = "last_modified"
        case acceptsRanges = "accepts_ranges"
        case expectedSize = "expected_size"
        case progressAt = "progress_at"
        case stagingPath = "staging_path"
    }

    init(_ job: Job) {
        id = job.id
        url = storedText(job.url)
        path = storedText(job.path)
        state = job.state.rawValue
        waitReason = job.waitReason?.rawValue
        priority = job.priority
        size = job.size
        received = job.received
        errorCode = job.error.map { storedText($0.code) }
        errorMessage = job.error.map { storedText($0.message) }
        attempts = job.attempts
        updatedAt = job.updatedAt.timeIntervalSince1970
        finishedAt = job.finishedAt?.timeIntervalSince1970
        nextAttemptAt = job.nextAttemptAt?.timeIntervalSince1970
        key = job.key.map(storedText)
        meta = job.meta.map(storedText)
        headers = storedText(ColumnCoding.headers(job.headers))
        overwrite = job.overwrite
        finalURL = job.finalURL.map(storedText)
        etag = job.validators.etag.map(storedText)
        lastModified = job.validators.lastModified.map(storedText)
        acceptsRanges = job.validators.acceptsRanges
        checksum = job.checksum.map { storedText($0.description) }
        expectedSize = job.expectedSize
        sha256 = job.sha256.map(storedText)
        digest = job.digest.map(storedText)
        progressAt = job.progressAt?.timeIntervalSince1970
        stagingPath = job.stagingPath.map(storedText)
        options = ColumnCoding.options(job.options)
        segments = job.segments.map(storedText)
        unsynced = job.unsynced.map { storedText($0.encoded) }
        mirrors = ColumnCoding.mirrors(job).map(storedText)
    }

    static let set = RecordSet<UpdateRecord>(columns: [
        ("id", "bigint"), ("url", "text"), ("path", "text"), ("state", "text"), ("wait_reason", "text"), ("priority", "bigint"),
        ("size", "bigint"), ("received", "bigint"), ("error_code", "text"), ("error_message", "text"), ("attempts", "bigint"),
        ("updated_at", "double precision"), ("finished_at", "double precision"), ("next_attempt_at", "double precision"),
        ("key", "text"), ("meta", "text"), ("headers", "text"), ("overwrite", "boolean"), ("final_url", "text"), ("etag", "text"),
        ("last_modified", "text"), ("accepts_ranges", "boolean"), ("checksum", "text"), ("expected_size", "bigint"),
        ("sha256", "text"), ("digest", "text"), ("progress_at", "double precision"), ("staging_path", "text"), ("options", "text"),
        ("segments", "text"), ("unsynced", "text"), ("mirrors", "text"),
    ])
}

/// An event given as a value (`record`), numbered.
struct EventRecord: Encodable {
    var seq: Int64
    var at: Double
    var kind: String
    var jobID: JobID?
    var groupID: GroupID?
    var state: String
    var waitReason: String?
    var errorCode: String?
    var errorMessage: String?

    enum CodingKeys: String, CodingKey {
        case seq, at, kind, state
        case jobID = "job_id"
        case groupID = "group_id"
        case waitReason = "wait_reason"
        case errorCode = "error_code"
        case errorMessage = "error_message"
    }

    init(_ event: StoredEvent) {
        seq = event.seq
        at = event.at.timeIntervalSince1970
        kind = event.kind.rawValue
        jobID = event.jobID
        groupID = event.groupID
        state = storedText(event.state)
        waitReason = event.waitReason?.rawValue
        errorCode = event.error.map { storedText($0.code) }
        errorMessage = event.error.map { storedText($0.message) }
    }

    static let set = RecordSet<EventRecord>(columns: [
        ("seq", "bigint"), ("at", "double precision"), ("kind", "text"), ("job_id", "bigint"), ("group_id", "bigint"),
        ("state", "text"), ("wait_reason", "text"), ("error_code", "text"), ("error_message", "text"),
    ])
}
