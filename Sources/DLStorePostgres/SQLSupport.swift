import DLCore
import DLJobTable
import Foundation
import PostgresNIO

/// Text as the SQLite store keeps it: up to the first NUL. GRDB binds strings as C strings, so
/// SQLite ends a text at a NUL; PostgreSQL refuses a NUL in text outright. Both backends keep
/// the same text, and a stray NUL never fails a write.
func storedText(_ text: String) -> String {
    guard text.utf8.contains(0) else { return text }
    return String(decoding: text.utf8.prefix { $0 != 0 }, as: UTF8.self)
}

extension PostgresQuery.StringInterpolation {
    /// A text parameter, cut at a NUL as `storedText` says.
    mutating func appendInterpolation(text value: String?) {
        appendInterpolation(value.map(storedText))
    }

    /// A `text[]` parameter, each element cut at a NUL.
    mutating func appendInterpolation(texts values: [String]) {
        appendInterpolation(values.map(storedText))
    }
}

/// The values of a statement built piece by piece, each appended with its `$n` placeholder.
/// Every value is a parameter: no text from a request ever becomes SQL.
struct Binds {
    private(set) var bindings = PostgresBindings()

    private mutating func next() -> String { "$\(bindings.count)" }

    mutating func text(_ value: String?) -> String {
        bindings.append(value.map(storedText))
        return next()
    }

    mutating func texts(_ values: [String]) -> String {
        bindings.append(values.map(storedText))
        return next()
    }

    mutating func int(_ value: Int64?) -> String {
        bindings.append(value)
        return next()
    }

    mutating func int(_ value: Int?) -> String { int(value.map(Int64.init)) }

    mutating func ints(_ values: [Int64]) -> String {
        bindings.append(values)
        return next()
    }

    mutating func double(_ value: Double?) -> String {
        bindings.append(value)
        return next()
    }

    mutating func bool(_ value: Bool?) -> String {
        bindings.append(value)
        return next()
    }

    /// A JSON text that `RecordSet` made (its strings already cut at a NUL).
    mutating func json(_ text: String) -> String {
        bindings.append(text)
        return next()
    }

    func query(_ sql: String) -> PostgresQuery { PostgresQuery(unsafeSQL: sql, binds: bindings) }
}

/// Many rows in one statement, as one parameter: a JSON array of objects that
/// `json_to_recordset` turns back into typed rows (a missing key is a NULL).
///
/// Why JSON: a `VALUES` list with one parameter a value cost PostgreSQL about 200 µs a row of
/// 19 columns to parse and plan, most of an insert; and `unnest` of one array a column cannot
/// carry NULLs, which postgres-nio does not bind inside arrays. Times are numbers written
/// shortest-exact, so they read back as the same `Double`.
struct RecordSet<Record: Encodable>: Sendable {
    /// The columns `json_to_recordset` declares, with their types, in the order of `names`.
    let columns: [(name: String, type: String)]

    /// Records a statement: each statement's JSON stays a few MB.
    static var recordsPerStatement: Int { 1000 }

    /// `a, b, c`
    var names: String { columns.map(\.name).joined(separator: ", ") }

    /// `json_to_recordset(<placeholder>::json) AS r(a bigint, b text, ...)`
    func source(_ placeholder: String) -> String {
        "json_to_recordset(\(placeholder)::json) AS r(" + columns.map { "\($0.name) \($0.type)" }.joined(separator: ", ") + ")"
    }

    /// The JSON texts for `records`, one a statement.
    func chunks(_ records: [Record]) throws -> [String] {
        let encoder = JSONEncoder()
        var chunks: [String] = []
        var start = 0
        while start < records.count {
            let end = min(records.count, start + Self.recordsPerStatement)
            chunks.append(String(decoding: try encoder.encode(Array(records[start..<end])), as: UTF8.self))
            start = end
        }
        return chunks
    }
}

/// Why a PostgreSQL operation failed, in words that are safe to log: the server's SQLSTATE
/// and message, or the kind of connection failure. postgres-nio's own errors print a generic
/// text on purpose; this keeps the useful part and never the query's values or the password.
public struct PostgresStoreError: Error, Sendable, CustomStringConvertible, WordedStorageError {
    public let description: String
    /// What `storage_error` messages say: the same words.
    public var plainText: String { description }
    /// The SQLSTATE, when the server answered with an error.
    public let sqlState: String?

    init(_ error: PSQLError) {
        if let message = error.serverInfo?[.message] {
            let state = error.serverInfo?[.sqlState]
            sqlState = state
            description = "PostgreSQL: \(message)" + (state.map { " (SQLSTATE \($0))" } ?? "")
        } else {
            sqlState = nil
            var text = "PostgreSQL: \(error.code)"
            if let underlying = error.underlying { text += ": \(underlying)" }
            description = text
        }
    }

    init(_ description: String) {
        self.description = description
        sqlState = nil
    }

    /// Any error of postgres-nio (or one of ours, kept as it is).
    init(describing error: any Error) {
        if let error = error as? PostgresStoreError {
            self = error
        } else if let error = error as? PSQLError {
            self.init(error)
        } else if "\(error)".contains("CircuitBreakerTripped") {
            // The pool's own error: it tried to connect for a minute and gave up.
            self.init("PostgreSQL: no connection to the server could be made for a minute")
        } else {
            self.init("PostgreSQL: \(error)")
        }
    }
}

// MARK: Rows

enum Columns {
    /// The columns `job(_:)` reads, in its order (the SQLite store's list).
    static let job = """
        id, url, path, state, wait_reason, priority, size, received, error_code, error_message, attempts, \
        created_at, updated_at, finished_at, next_attempt_at, key, meta, headers, overwrite, final_url, etag, \
        last_modified, accepts_ranges, checksum, expected_size, sha256, digest, progress_at, group_id, \
        staging_path, options, worker, lease_until, segments, unsynced, mirrors
        """

    static let group = "id, name, dir, staging, priority, closed, error_code, error_message, created_at, updated_at, finished_at"

    static let event = "seq, at, kind, job_id, group_id, state, wait_reason, error_code, error_message"

    static func job(_ row: PostgresRow) throws -> Job {
        let cells = row.makeRandomAccess()
        let errorCode = try cells[8].decode(String?.self)
        let errorMessage = try cells[9].decode(String?.self)
        let checksum = try cells[23].decode(String?.self)
        var job = Job(
            id: try cells[0].decode(Int64.self), url: try cells[1].decode(String.self), path: try cells[2].decode(String.self),
            // An unknown state can only come from a newer dld; show it as failed, never crash.
            state: JobState(rawValue: try cells[3].decode(String.self)) ?? .failed,
            waitReason: try cells[4].decode(String?.self).flatMap(WaitReason.init(rawValue:)),
            priority: try cells[5].decode(Int.self), size: try cells[6].decode(Int64?.self), received: try cells[7].decode(Int64.self),
            error: errorCode.map { JobError(code: $0, message: errorMessage ?? "") },
            attempts: try cells[10].decode(Int.self),
            createdAt: Date(timeIntervalSince1970: try cells[11].decode(Double.self)),
            updatedAt: Date(timeIntervalSince1970: try cells[12].decode(Double.self)),
            finishedAt: try cells[13].decode(Double?.self).map(Date.init(timeIntervalSince1970:)),
            nextAttemptAt: try cells[14].decode(Double?.self).map(Date.init(timeIntervalSince1970:)),
            key: try cells[15].decode(String?.self), meta: try cells[16].decode(String?.self),
            headers: ColumnCoding.headers(from: try cells[17].decode(String.self)),
            overwrite: try cells[18].decode(Bool.self), finalURL: try cells[19].decode(String?.self),
            validators: Validators(
                etag: try cells[20].decode(String?.self), lastModified: try cells[21].decode(String?.self),
                acceptsRanges: try cells[22].decode(Bool.self)),
            checksum: checksum.flatMap { try? Checksum.parse($0).get() }, expectedSize: try cells[24].decode(Int64?.self),
            sha256: try cells[25].decode(String?.self), digest: try cells[26].decode(String?.self),
            progressAt: try cells[27].decode(Double?.self).map(Date.init(timeIntervalSince1970:)),
            groupID: try cells[28].decode(Int64?.self), stagingPath: try cells[29].decode(String?.self),
            options: ColumnCoding.options(from: try cells[30].decode(String.self)),
            worker: try cells[31].decode(String?.self),
            leaseUntil: try cells[32].decode(Double?.self).map(Date.init(timeIntervalSince1970:)),
            segments: try cells[33].decode(String?.self),
            unsynced: try cells[34].decode(String?.self).flatMap(UnsyncedProgress.init(encoded:)))
        ColumnCoding.mirrors(from: try cells[35].decode(String?.self), into: &job)
        return job
    }

    static func group(_ row: PostgresRow) throws -> JobGroup {
        let cells = row.makeRandomAccess()
        let code = try cells[6].decode(String?.self)
        let message = try cells[7].decode(String?.self)
        return JobGroup(
            id: try cells[0].decode(Int64.self), name: try cells[1].decode(String.self), dir: try cells[2].decode(String.self),
            staging: try cells[3].decode(String.self), priority: try cells[4].decode(Int.self),
            closed: try cells[5].decode(String?.self).flatMap(GroupState.init(rawValue:)),
            error: code.map { JobError(code: $0, message: message ?? "") },
            createdAt: Date(timeIntervalSince1970: try cells[8].decode(Double.self)),
            updatedAt: Date(timeIntervalSince1970: try cells[9].decode(Double.self)),
            finishedAt: try cells[10].decode(Double?.self).map(Date.init(timeIntervalSince1970:)))
    }

    static func event(_ row: PostgresRow) throws -> StoredEvent {
        let cells = row.makeRandomAccess()
        let code = try cells[7].decode(String?.self)
        let message = try cells[8].decode(String?.self)
        return StoredEvent(
            seq: try cells[0].decode(Int64.self), at: Date(timeIntervalSince1970: try cells[1].decode(Double.self)),
            kind: StoredEvent.Kind(rawValue: try cells[2].decode(String.self)) ?? .jobState,
            jobID: try cells[3].decode(Int64?.self), groupID: try cells[4].decode(Int64?.self),
            state: try cells[5].decode(String.self),
            waitReason: try cells[6].decode(String?.self).flatMap(WaitReason.init(rawValue:)),
            error: code.map { JobError(code: $0, message: message ?? "") })
    }

    /// Counts by state from `state, count` rows.
    static func counts(_ rows: [PostgresRow]) throws -> [JobState: Int] {
        var counts: [JobState: Int] = [:]
        for row in rows {
            let (state, n) = try row.decode((String, Int64).self)
            if let state = JobState(rawValue: state) { counts[state, default: 0] += Int(n) }
        }
        return counts
    }
}

extension PostgresConnection {
    /// Runs a statement and collects its rows; fails when the connection closes before the
    /// answer (`answered`: postgres-nio would wait forever then).
    func rows(_ query: PostgresQuery, logger: Logger) async throws -> [PostgresRow] {
        try await answered { connection in
            var rows: [PostgresRow] = []
            for try await row in try await connection.query(query, logger: logger) { rows.append(row) }
            return rows
        }
    }

    /// Runs a statement that returns no rows (or whose rows do not matter), as `rows` does.
    func run(_ query: PostgresQuery, logger: Logger) async throws {
        try await answered { connection in
            for try await _ in try await connection.query(query, logger: logger) {}
        }
    }
}
