import DLCore
import Foundation

/// The cells of one row, by position, as a backend reads them: nil for NULL. Each backend
/// adapts its row to this (SQLite: its C API on the statement's current row; PostgreSQL: a
/// random-access `PostgresRow`), and the column sets below decode it, so that both backends
/// select the same columns and read them the same way.
///
/// A cell the backend cannot read as asked (PostgreSQL: a column of another type) throws: a
/// row that cannot be read is an error of the read, never a crash.
public protocol RowCells {
    func int64(_ position: Int) throws -> Int64?
    func double(_ position: Int) throws -> Double?
    func text(_ position: Int) throws -> String?
    /// A flag: SQLite keeps it as an integer, PostgreSQL as a boolean.
    func bool(_ position: Int) throws -> Bool?
}

/// The columns a `SELECT` (or `RETURNING`) of one kind of row lists, and how such a row is
/// decoded. Each case is a column; its `rawValue` is its position in `list`.
///
/// Rows are read by position, not by name: looking each column up by name cost more than the
/// rest of decoding a row (listing 100 000 jobs). A NULL where the table keeps a value (a table
/// edited by hand) reads as empty, and a value this dld does not know (a state of a newer one)
/// as the closest it knows: one odd row never fails a listing.
public protocol TableColumns: CaseIterable, Sendable, RawRepresentable where RawValue == Int {
    associatedtype Value
    /// The column's name in the table (the same in every backend).
    var name: String { get }
    /// `a, b, c`: every column, in position order.
    static var list: String { get }
    /// The value of a row of `SELECT \(list) …`.
    static func value(from cells: some RowCells) throws -> Value
}

extension TableColumns {
    /// `list`, worked out from the cases (each set keeps it in a `static let`).
    static func names() -> String { allCases.map(\.name).joined(separator: ", ") }
}

/// A row's cells named by the columns of one set.
///
/// Inlinable, as the job decoder that uses it: each backend's build specializes the decoder for
/// its own cells. Called through the generic protocol from another module, every cell cost a
/// witness call, and a `list` of the whole queue took more CPU than with each backend's own
/// decoder (docs/benchmarks.md, the layers pass).
@usableFromInline
struct ColumnCells<Column: TableColumns, Cells: RowCells> {
    @usableFromInline let cells: Cells

    @inlinable init(_ cells: Cells) { self.cells = cells }

    @inlinable func int64(_ column: Column) throws -> Int64? { try cells.int64(column.rawValue) }
    @inlinable func int(_ column: Column) throws -> Int? { try cells.int64(column.rawValue).map { Int(truncatingIfNeeded: $0) } }
    @inlinable func text(_ column: Column) throws -> String? { try cells.text(column.rawValue) }
    @inlinable func bool(_ column: Column) throws -> Bool? { try cells.bool(column.rawValue) }
    /// A time, kept as seconds since 1970.
    @inlinable func date(_ column: Column) throws -> Date? {
        try cells.double(column.rawValue).map(Date.init(timeIntervalSince1970:))
    }

    /// A `JobError` from its code and message columns: none without a code.
    @inlinable func error(code: Column, message: Column) throws -> JobError? {
        guard let code = try text(code) else { return nil }
        return JobError(code: code, message: try text(message) ?? "")
    }
}

// MARK: Jobs

/// The columns of a `Job`.
public enum JobColumn: Int, TableColumns {
    case id, url, path, state, waitReason, priority, size, received, errorCode, errorMessage, attempts
    case createdAt, updatedAt, finishedAt, nextAttemptAt, key, meta, headers, overwrite, finalURL, etag
    case lastModified, acceptsRanges, checksum, expectedSize, sha256, digest, progressAt, groupID
    case stagingPath, options, worker, leaseUntil, segments, unsynced, mirrors, pieces, epoch, stopRequest, partialTag

    public var name: String {
        switch self {
        case .id: return "id"
        case .url: return "url"
        case .path: return "path"
        case .state: return "state"
        case .waitReason: return "wait_reason"
        case .priority: return "priority"
        case .size: return "size"
        case .received: return "received"
        case .errorCode: return "error_code"
        case .errorMessage: return "error_message"
        case .attempts: return "attempts"
        case .createdAt: return "created_at"
        case .updatedAt: return "updated_at"
        case .finishedAt: return "finished_at"
        case .nextAttemptAt: return "next_attempt_at"
        case .key: return "key"
        case .meta: return "meta"
        case .headers: return "headers"
        case .overwrite: return "overwrite"
        case .finalURL: return "final_url"
        case .etag: return "etag"
        case .lastModified: return "last_modified"
        case .acceptsRanges: return "accepts_ranges"
        case .checksum: return "checksum"
        case .expectedSize: return "expected_size"
        case .sha256: return "sha256"
        case .digest: return "digest"
        case .progressAt: return "progress_at"
        case .groupID: return "group_id"
        case .stagingPath: return "staging_path"
        case .options: return "options"
        case .worker: return "worker"
        case .leaseUntil: return "lease_until"
        case .segments: return "segments"
        case .unsynced: return "unsynced"
        case .mirrors: return "mirrors"
        case .pieces: return "pieces"
        case .epoch: return "epoch"
        case .stopRequest: return "stop_request"
        case .partialTag: return "partial_tag"
        }
    }

    public static let list = names()

    @inlinable public static func value(from cells: some RowCells) throws -> Job {
        let row = ColumnCells<Self, _>(cells)
        let origin = Date(timeIntervalSince1970: 0)
        var job = Job(
            id: try row.int64(.id) ?? 0, url: try row.text(.url) ?? "", path: try row.text(.path) ?? "",
            // An unknown state can only come from a newer dld; show it as failed, never crash.
            state: try row.text(.state).flatMap(JobState.init(rawValue:)) ?? .failed,
            waitReason: try row.text(.waitReason).flatMap(WaitReason.init(rawValue:)),
            priority: try row.int(.priority) ?? 0, size: try row.int64(.size), received: try row.int64(.received) ?? 0,
            error: try row.error(code: .errorCode, message: .errorMessage), attempts: try row.int(.attempts) ?? 0,
            createdAt: try row.date(.createdAt) ?? origin, updatedAt: try row.date(.updatedAt) ?? origin,
            finishedAt: try row.date(.finishedAt), nextAttemptAt: try row.date(.nextAttemptAt),
            key: try row.text(.key), meta: try row.text(.meta), headers: ColumnCoding.headers(from: try row.text(.headers) ?? "[]"),
            overwrite: try row.bool(.overwrite) ?? false, finalURL: try row.text(.finalURL),
            validators: Validators(
                etag: try row.text(.etag), lastModified: try row.text(.lastModified), acceptsRanges: try row.bool(.acceptsRanges) ?? false),
            checksum: try row.text(.checksum).flatMap { try? Checksum.parse($0).get() }, expectedSize: try row.int64(.expectedSize),
            sha256: try row.text(.sha256), digest: try row.text(.digest), progressAt: try row.date(.progressAt),
            groupID: try row.int64(.groupID), stagingPath: try row.text(.stagingPath),
            options: ColumnCoding.options(from: try row.text(.options)), worker: try row.text(.worker),
            leaseUntil: try row.date(.leaseUntil), segments: try row.text(.segments),
            unsynced: try row.text(.unsynced).flatMap(UnsyncedProgress.init(encoded:)))
        ColumnCoding.mirrors(from: try row.text(.mirrors), into: &job)
        job.pieces = try row.text(.pieces)
        job.epoch = try row.int64(.epoch) ?? 0
        job.stopRequest = try row.text(.stopRequest).flatMap(StopRequest.init(rawValue:))
        job.partialTag = try row.text(.partialTag)
        return job
    }
}

// MARK: Groups

/// The columns of a `JobGroup`.
public enum GroupColumn: Int, TableColumns {
    case id, name, dir, staging, priority, closed, errorCode, errorMessage, createdAt, updatedAt, finishedAt

    public var name: String {
        switch self {
        case .id: return "id"
        case .name: return "name"
        case .dir: return "dir"
        case .staging: return "staging"
        case .priority: return "priority"
        case .closed: return "closed"
        case .errorCode: return "error_code"
        case .errorMessage: return "error_message"
        case .createdAt: return "created_at"
        case .updatedAt: return "updated_at"
        case .finishedAt: return "finished_at"
        }
    }

    public static let list = names()

    public static func value(from cells: some RowCells) throws -> JobGroup {
        let row = ColumnCells<Self, _>(cells)
        let epoch = Date(timeIntervalSince1970: 0)
        return JobGroup(
            id: try row.int64(.id) ?? 0, name: try row.text(.name) ?? "", dir: try row.text(.dir) ?? "",
            staging: try row.text(.staging) ?? "", priority: try row.int(.priority) ?? 0,
            closed: try row.text(.closed).flatMap(GroupState.init(rawValue:)),
            error: try row.error(code: .errorCode, message: .errorMessage),
            createdAt: try row.date(.createdAt) ?? epoch, updatedAt: try row.date(.updatedAt) ?? epoch,
            finishedAt: try row.date(.finishedAt))
    }
}

// MARK: Events

/// The columns of a `StoredEvent`.
public enum EventColumn: Int, TableColumns {
    case seq, at, kind, jobID, groupID, state, waitReason, errorCode, errorMessage

    public var name: String {
        switch self {
        case .seq: return "seq"
        case .at: return "at"
        case .kind: return "kind"
        case .jobID: return "job_id"
        case .groupID: return "group_id"
        case .state: return "state"
        case .waitReason: return "wait_reason"
        case .errorCode: return "error_code"
        case .errorMessage: return "error_message"
        }
    }

    public static let list = names()

    public static func value(from cells: some RowCells) throws -> StoredEvent {
        let row = ColumnCells<Self, _>(cells)
        return StoredEvent(
            seq: try row.int64(.seq) ?? 0, at: try row.date(.at) ?? Date(timeIntervalSince1970: 0),
            kind: try row.text(.kind).flatMap(StoredEvent.Kind.init(rawValue:)) ?? .jobState,
            jobID: try row.int64(.jobID), groupID: try row.int64(.groupID), state: try row.text(.state) ?? "",
            waitReason: try row.text(.waitReason).flatMap(WaitReason.init(rawValue:)),
            error: try row.error(code: .errorCode, message: .errorMessage))
    }
}

// MARK: Files of canceled and deleted rows

/// What `cancel` and `delete` read back of each row they change (`RETURNING \(list)`): its id
/// and group, for its event, and what `JobFiles` needs to tell which of its files go.
public enum FilesColumn: Int, TableColumns {
    case id, groupID, state, path, stagingPath, attempts, received

    public struct Row: Sendable, Equatable {
        public var id: JobID
        public var groupID: GroupID?
        public var files: JobFiles
    }

    public var name: String {
        switch self {
        case .id: return "id"
        case .groupID: return "group_id"
        case .state: return "state"
        case .path: return "path"
        case .stagingPath: return "staging_path"
        case .attempts: return "attempts"
        case .received: return "received"
        }
    }

    public static let list = names()

    public static func value(from cells: some RowCells) throws -> Row {
        let row = ColumnCells<Self, _>(cells)
        return Row(
            id: try row.int64(.id) ?? 0, groupID: try row.int64(.groupID),
            files: JobFiles(
                state: try row.text(.state).flatMap(JobState.init(rawValue:)) ?? .failed, path: try row.text(.path) ?? "",
                stagingPath: try row.text(.stagingPath), attempts: try row.int64(.attempts) ?? 0,
                received: try row.int64(.received) ?? 0))
    }
}

extension FilesColumn {
    /// The rows a cancel changed, taken one at a time as `RETURNING \(list)` gives them (in any
    /// order): their ids, and the files the cancel deletes. Only those are kept, not the rows:
    /// a cancel of 100 000 jobs must not hold 100 000 paths at once.
    public struct Canceled {
        private var ids: [JobID] = []
        private var files: [(id: JobID, path: String)] = []

        public init() {}

        public mutating func add(_ row: Row) {
            ids.append(row.id)
            if let file = row.files.fileDeletedOnCancel { files.append((row.id, file)) }
        }

        /// The ids in order, and the files in the same order.
        public var result: (ids: [JobID], files: [String]) {
            (ids.sorted(), files.sorted { $0.id < $1.id }.map(\.path))
        }
    }
}
