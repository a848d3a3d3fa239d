import DLCore
import DLJobTable
import Foundation
import GRDB

extension SQLiteJobStore {
    /// Creates jobs (one transaction's worth), with one `job.state` event each.
    ///
    /// Row by row as far as what it decides goes: a job whose key exists returns the existing
    /// job, a path that an unfinished job writes to is refused (and the caller's transaction is
    /// rolled back). Rows are written many to a statement: a statement a row paid its
    /// AUTOINCREMENT bookkeeping and the statement itself for every job, a statement of 256
    /// rows shares them (docs/benchmarks.md, "What was tried": `enqueue` and `list` on SQLite's
    /// C API). A job whose key or path repeats one still waiting to be written sends those
    /// first, so that the look-ups see them as they would have row by row.
    static func insert(_ jobs: [NewJob], groupID: GroupID?, now: Date, events: inout [StoredEvent], in db: Database) throws
        -> [InsertOutcome]
    {
        var batch = try InsertBatch(jobs, groupID: groupID, now: now, in: db)
        var outcomes: [InsertOutcome] = []
        outcomes.reserveCapacity(jobs.count)
        events.reserveCapacity(events.count + jobs.count)
        for (index, new) in jobs.enumerated() {
            if batch.repeats(new) {
                try batch.write(into: &outcomes, events: &events)
            }
            if let key = new.key,
                let job = try Self.jobs(db.cachedStatement(sql: "SELECT \(JobColumn.list) FROM jobs WHERE key = ?"), arguments: [key])
                    .first
            {
                outcomes.append(InsertOutcome(job: job, created: false))
                continue
            }
            if let other = try batch.pathUser(new.path) {
                throw StoreError.pathInUse(path: new.path, by: other)
            }
            batch.add(index, outcome: outcomes.count)
            // A placeholder, until `write` gives the row its id.
            outcomes.append(InsertOutcome(job: Job(url: new.url, path: new.path, createdAt: now, updatedAt: now), created: true))
        }
        try batch.write(into: &outcomes, events: &events)
        return outcomes
    }
}

/// Jobs of one insert waiting to be written, and the statements that write them.
private struct InsertBatch {
    /// Rows a statement, largest first: a batch of n rows takes ⌊n/256⌋ statements of 256 and
    /// the rest in smaller ones, so that only these few statements are prepared and cached.
    static let sizes = [256, 64, 16, 4, 1]
    private static let columns = """
        INSERT INTO jobs (url, path, state, priority, created_at, updated_at, key, meta, headers, overwrite,
            checksum, expected_size, size, progress_at, group_id, staging_path, options, host, mirrors, pieces) VALUES
        """
    private static let row = "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"

    private let db: Database
    /// The jobs of the insert; the waiting ones are named by their index (a `NewJob` is a few
    /// hundred bytes: 5000 copies were megabytes).
    private let jobs: [NewJob]
    private let groupID: GroupID?
    private let now: Date
    private var pathUser: RawStatement
    private var pending: [(job: Int, outcome: Int)] = []
    private var paths: Set<String> = []
    private var keys: Set<String> = []

    init(_ jobs: [NewJob], groupID: GroupID?, now: Date, in db: Database) throws {
        self.db = db
        self.jobs = jobs
        self.groupID = groupID
        self.now = now
        pathUser = try RawStatement(SQLiteJobStore.pathUserSQL, in: db)
    }

    /// Whether the job's key or path is one of a job waiting to be written.
    func repeats(_ new: NewJob) -> Bool {
        paths.contains(new.path) || new.key.map(keys.contains) == true
    }

    mutating func pathUser(_ path: String) throws -> JobID? {
        pathUser.bind(path)
        return try pathUser.fetchInt()
    }

    mutating func add(_ index: Int, outcome: Int) {
        let new = jobs[index]
        pending.append((index, outcome))
        paths.insert(new.path)
        if let key = new.key { keys.insert(key) }
    }

    /// Writes the waiting jobs and their events, and fills in their outcomes.
    mutating func write(into outcomes: inout [InsertOutcome], events: inout [StoredEvent]) throws {
        guard !pending.isEmpty else { return }
        var start = 0
        while start < pending.count {
            let left = pending.count - start
            let size = Self.sizes.first { $0 <= left } ?? 1
            try write(pending[start..<(start + size)], into: &outcomes, events: &events)
            start += size
        }
        pending.removeAll(keepingCapacity: true)
        paths.removeAll(keepingCapacity: true)
        keys.removeAll(keepingCapacity: true)
        if let first = events.first?.seq { try SQLiteJobStore.pruneEvents(through: first - 1, in: db) }
    }

    private func write(_ rows: ArraySlice<(job: Int, outcome: Int)>, into outcomes: inout [InsertOutcome], events: inout [StoredEvent])
        throws
    {
        var insert = try RawStatement(Self.columns + Array(repeating: Self.row, count: rows.count).joined(separator: ", "), in: db)
        let at = now.timeIntervalSince1970
        for (index, _) in rows {
            let new = jobs[index]
            insert.bind(new.url)
            insert.bind(new.path)
            insert.bind(new.state.rawValue)
            insert.bind(new.priority)
            insert.bind(at)
            insert.bind(at)
            insert.bind(new.key)
            insert.bind(new.meta)
            insert.bind(ColumnCoding.encodeHeaders(new.headers))
            insert.bind(new.overwrite)
            insert.bind(new.checksum?.description)
            insert.bind(new.expectedSize)
            insert.bind(new.expectedSize)
            insert.bind(at)
            insert.bind(groupID)
            insert.bind(new.stagingPath)
            insert.bind(ColumnCoding.encodeOptions(new.options))
            insert.bind(new.host ?? URLRules.hostKey(new.url))
            insert.bind(ColumnCoding.mirrors(new.mirrors, urlDropped: nil))
            insert.bind(new.pieces)
        }
        try insert.execute()
        // One statement's rows get consecutive ids in order: with AUTOINCREMENT each row's id
        // is one more than the largest the table ever had.
        let firstID = db.lastInsertedRowID - Int64(rows.count) + 1
        try db.cachedStatement(
            sql: """
                INSERT INTO events (at, kind, job_id, group_id, state)
                SELECT ?, 'job.state', id, group_id, state FROM jobs WHERE id >= ? ORDER BY id
                """
        ).execute(arguments: [at, firstID])
        let firstSeq = db.lastInsertedRowID - Int64(rows.count) + 1
        for (offset, (index, outcome)) in rows.enumerated() {
            let new = jobs[index]
            let job = new.created(id: firstID + Int64(offset), groupID: groupID, now: now)
            outcomes[outcome] = InsertOutcome(job: job, created: true)
            events.append(
                StoredEvent(
                    seq: firstSeq + Int64(offset), at: now, kind: .jobState, jobID: job.id, groupID: groupID, state: new.state.rawValue))
        }
    }
}
