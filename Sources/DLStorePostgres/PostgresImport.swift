import DLCore
import DLJobTable
import Foundation
import Logging
import PostgresNIO

/// `dld migrate --to postgresql://…`: a SQLite table copied into an empty PostgreSQL one, rows
/// with their ids and events with their numbers, so that clients see the same jobs after.
extension PostgresJobStore {
    /// Whether the table holds no job, group or event: a migration writes only into an empty
    /// table, so that it never mixes two queues.
    public func isEmpty() async throws -> Bool {
        let rows = try await rows(
            "SELECT (SELECT count(*) FROM jobs) + (SELECT count(*) FROM groups) + (SELECT count(*) FROM events)")
        return try rows.first?.decode(Int64.self) == 0
    }

    /// Writes groups, then jobs, then events, as they are (ids and `seq` kept), in one
    /// transaction. Groups must come before the jobs that belong to them.
    public func importRows(groups: [JobGroup], jobs: [Job], events: [StoredEvent]) async throws {
        try await transaction { connection in
            for chunk in try ImportedGroup.set.chunks(groups.map(ImportedGroup.init)) {
                var binds = Binds()
                let json = binds.json(chunk)
                try await connection.run(
                    binds.query(
                        "INSERT INTO groups (\(ImportedGroup.set.names)) SELECT \(ImportedGroup.set.names) FROM \(ImportedGroup.set.source(json))"
                    ),
                    logger: logger)
            }
            // The columns a new row needs, then every other column as `save` writes them.
            for chunk in try ImportedJob.set.chunks(jobs.map(ImportedJob.init)) {
                var binds = Binds()
                let json = binds.json(chunk)
                try await connection.run(
                    binds.query(
                        "INSERT INTO jobs (\(ImportedJob.set.names)) SELECT \(ImportedJob.set.names) FROM \(ImportedJob.set.source(json))"),
                    logger: logger)
            }
            try await Self.update(jobs, on: connection, logger: logger)
            for chunk in try EventRecord.set.chunks(events.map(EventRecord.init)) {
                var binds = Binds()
                let json = binds.json(chunk)
                try await connection.run(
                    binds.query(
                        "INSERT INTO events (\(EventRecord.set.names)) SELECT \(EventRecord.set.names) FROM \(EventRecord.set.source(json))"
                    ),
                    logger: logger)
            }
        }
    }

    /// After the last `importRows`: new ids continue after the largest imported one.
    public func finishImport() async throws {
        try await transaction { connection in
            for table in ["jobs", "groups"] {
                try await connection.run(
                    PostgresQuery(
                        unsafeSQL:
                            "SELECT setval(pg_get_serial_sequence('\(table)', 'id'), (SELECT COALESCE(max(id), 0) + 1 FROM \(table)), false)"
                    ),
                    logger: logger)
            }
        }
    }
}

/// The columns of a job row that `update` does not write.
private struct ImportedJob: Encodable {
    var id: JobID
    var url: String
    var path: String
    var state: String
    var createdAt: Double
    var updatedAt: Double
    var groupID: GroupID?
    var host: String
    /// Written once at enqueue, so `save` (the rest of the row) never writes it.
    var pieces: String?

    enum CodingKeys: String, CodingKey {
        case id, url, path, state, host, pieces
        case createdAt = "created_at"
        case updatedAt = "updated_at"
        case groupID = "group_id"
    }

    init(_ job: Job) {
        id = job.id
        url = storedText(job.url)
        path = storedText(job.path)
        state = job.state.rawValue
        createdAt = job.createdAt.timeIntervalSince1970
        updatedAt = job.updatedAt.timeIntervalSince1970
        groupID = job.groupID
        host = storedText(URLRules.hostKey(job.url))
        pieces = job.pieces.map(storedText)
    }

    static let set = RecordSet<ImportedJob>(columns: [
        ("id", "bigint"), ("url", "text"), ("path", "text"), ("state", "text"), ("created_at", "double precision"),
        ("updated_at", "double precision"), ("group_id", "bigint"), ("host", "text"), ("pieces", "text"),
    ])
}

private struct ImportedGroup: Encodable {
    var id: GroupID
    var name: String
    var dir: String
    var staging: String
    var priority: Int
    var closed: String?
    var errorCode: String?
    var errorMessage: String?
    var createdAt: Double
    var updatedAt: Double
    var finishedAt: Double?
    var hls: String?

    enum CodingKeys: String, CodingKey {
        case id, name, dir, staging, priority, closed, hls
        case errorCode = "error_code"
        case errorMessage = "error_message"
        case createdAt = "created_at"
        case updatedAt = "updated_at"
        case finishedAt = "finished_at"
    }

    init(_ group: JobGroup) {
        id = group.id
        name = storedText(group.name)
        dir = storedText(group.dir)
        staging = storedText(group.staging)
        priority = group.priority
        closed = group.closed?.rawValue
        errorCode = group.error.map { storedText($0.code) }
        errorMessage = group.error.map { storedText($0.message) }
        createdAt = group.createdAt.timeIntervalSince1970
        updatedAt = group.updatedAt.timeIntervalSince1970
        finishedAt = group.finishedAt?.timeIntervalSince1970
        hls = group.hls.map(storedText)
    }

    static let set = RecordSet<ImportedGroup>(columns: [
        ("id", "bigint"), ("name", "text"), ("dir", "text"), ("staging", "text"), ("priority", "bigint"), ("closed", "text"),
        ("error_code", "text"), ("error_message", "text"), ("created_at", "double precision"), ("updated_at", "double precision"),
        ("finished_at", "double precision"), ("hls", "text"),
    ])
}
