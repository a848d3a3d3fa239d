import DLCore
import DLJobTable
import Foundation
import GRDB

/// One URL of the cache (`get`), as its index keeps it.
public struct CacheEntry: Sendable, Equatable {
    /// Hex SHA-256 of the normalized URL (`CacheURL.normalized`); also the file's name.
    public var key: String
    /// The URL as the first `get` gave it (shown by `cache_list`, redacted).
    public var url: String
    public var path: String
    /// A complete copy is at `path` (a new download may be under way beside it).
    public var ready: Bool
    public var bytes: Int64
    public var sha256: String?
    /// The response's freshness and validators, and when they arrived (download or 304).
    public var headers: CacheHeaders
    public var receivedAt: Date
    public var lastUsed: Date
    /// Kept whatever the budgets until `unpin`.
    public var pinned: Bool
    /// The job downloading this URL now; nil when none.
    public var jobID: JobID?
    /// Names the download started last for this URL (it grows, and is unique across
    /// evictions): the job's key holds it, so a download enqueued just before a crash is found
    /// again (`dld-cache:<key>:<generation>`).
    public var generation: Int64

    public init(
        key: String, url: String, path: String, ready: Bool = false, bytes: Int64 = 0, sha256: String? = nil,
        headers: CacheHeaders = CacheHeaders(), receivedAt: Date, lastUsed: Date, pinned: Bool = false,
        jobID: JobID? = nil, generation: Int64 = 0
    ) {
        self.key = key
        self.url = url
        self.path = path
        self.ready = ready
        self.bytes = bytes
        self.sha256 = sha256
        self.headers = headers
        self.receivedAt = receivedAt
        self.lastUsed = lastUsed
        self.pinned = pinned
        self.jobID = jobID
        self.generation = generation
    }
}

/// The cache's index: a small SQLite file in the cache folder (`index.sqlite`), apart from the
/// job table. The cache belongs to one machine's disk, so its index does too, whatever store
/// holds the jobs; it never needs a migration of the job table. At start-up the daemon drops
/// rows without files and removes files without rows, so a row lost to a power cut would cost
/// the copy itself, and an answered `get` its file and its pin: the index commits with
/// `synchronous = FULL`, as the job table does (durability rule 1; proven by the power-cut
/// `get` points). Set here rather than left to SQLite's build, whose WAL default may be NORMAL.
public final class CacheIndex: Sendable {
    let queue: DatabaseQueue
    public let path: String

    public init(path: String) throws {
        self.path = path
        var configuration = Configuration()
        configuration.label = "dld.cache"
        configuration.busyMode = .timeout(5)
        queue = try DatabaseQueue(path: path, configuration: configuration)
        try queue.writeWithoutTransaction { db in
            try db.execute(sql: "PRAGMA journal_mode = WAL")
            try db.execute(sql: "PRAGMA synchronous = FULL")
        }
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1-cache-entries") { db in
            try db.execute(
                sql: """
                    CREATE TABLE cache_entries (
                        key TEXT PRIMARY KEY NOT NULL,
                        url TEXT NOT NULL,
                        path TEXT NOT NULL,
                        ready INTEGER NOT NULL,
                        bytes INTEGER NOT NULL,
                        sha256 TEXT,
                        headers TEXT NOT NULL,
                        received_at REAL NOT NULL,
                        last_used REAL NOT NULL,
                        pinned INTEGER NOT NULL,
                        job_id INTEGER,
                        generation INTEGER NOT NULL
                    )
                    """)
        }
        try migrator.migrate(queue)
    }

    static let columns = "key, url, path, ready, bytes, sha256, headers, received_at, last_used, pinned, job_id, generation"

    static func entry(_ row: Row) -> CacheEntry {
        let headersText: String = row["headers"] ?? "{}"
        let headers = (try? JSONDecoder().decode(CacheHeaders.self, from: Data(headersText.utf8))) ?? CacheHeaders()
        return CacheEntry(
            key: row["key"] ?? "", url: row["url"] ?? "", path: row["path"] ?? "", ready: row["ready"] ?? false,
            bytes: row["bytes"] ?? 0, sha256: row["sha256"], headers: headers,
            receivedAt: Date(timeIntervalSince1970: row["received_at"] ?? 0),
            lastUsed: Date(timeIntervalSince1970: row["last_used"] ?? 0), pinned: row["pinned"] ?? false,
            jobID: row["job_id"], generation: row["generation"] ?? 0)
    }

    public func entry(_ key: String) async throws -> CacheEntry? {
        try await queue.read { db in
            try Row.fetchOne(db, sql: "SELECT \(Self.columns) FROM cache_entries WHERE key = ?", arguments: [key]).map(Self.entry)
        }
    }

    /// Every entry, by key. The cache holds files, so its entries are few (thousands at most).
    public func all() async throws -> [CacheEntry] {
        try await queue.read { db in
            try Row.fetchAll(db, sql: "SELECT \(Self.columns) FROM cache_entries ORDER BY key").map(Self.entry)
        }
    }

    /// What eviction weighs of an entry (`CacheIndex.uses`).
    public struct Use: Sendable {
        public var key: String
        public var path: String
        public var ready: Bool
        public var bytes: Int64
        public var lastUsed: Date
        public var pinned: Bool
        public var jobID: JobID?
    }

    /// Every entry as eviction weighs it: no headers, so no JSON is decoded per entry (an
    /// eviction runs after every download).
    public func uses() async throws -> [Use] {
        try await queue.read { db in
            try Row.fetchAll(db, sql: "SELECT key, path, ready, bytes, last_used, pinned, job_id FROM cache_entries").map { row in
                Use(
                    key: row["key"] ?? "", path: row["path"] ?? "", ready: row["ready"] ?? false, bytes: row["bytes"] ?? 0,
                    lastUsed: Date(timeIntervalSince1970: row["last_used"] ?? 0), pinned: row["pinned"] ?? false, jobID: row["job_id"])
            }
        }
    }

    /// The complete copies: how many, their bytes, how many are pinned; one query (`stats`).
    public func totals() async throws -> (entries: Int, bytes: Int64, pinned: Int) {
        try await queue.read { db in
            let row = try Row.fetchOne(
                db, sql: "SELECT COUNT(*), COALESCE(SUM(bytes), 0), COALESCE(SUM(pinned), 0) FROM cache_entries WHERE ready")
            return (row?[0] ?? 0, row?[1] ?? 0, row?[2] ?? 0)
        }
    }

    public func save(_ entry: CacheEntry) async throws {
        let headers = String(decoding: (try? JSONEncoder().encode(entry.headers)) ?? Data("{}".utf8), as: UTF8.self)
        try await queue.write { db in
            try db.execute(
                sql: "INSERT OR REPLACE INTO cache_entries (\(Self.columns)) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                arguments: [
                    entry.key, entry.url, entry.path, entry.ready, entry.bytes, entry.sha256, headers,
                    entry.receivedAt.timeIntervalSince1970, entry.lastUsed.timeIntervalSince1970, entry.pinned, entry.jobID,
                    entry.generation,
                ])
        }
    }

    public func touch(_ key: String, at date: Date) async throws {
        try await queue.write { db in
            try db.execute(sql: "UPDATE cache_entries SET last_used = ? WHERE key = ?", arguments: [date.timeIntervalSince1970, key])
        }
    }

    /// Sets or clears the pin; returns whether the entry exists.
    public func setPinned(_ key: String, _ pinned: Bool) async throws -> Bool {
        try await queue.write { db in
            try db.execute(sql: "UPDATE cache_entries SET pinned = ? WHERE key = ?", arguments: [pinned, key])
            return db.changesCount > 0
        }
    }

    public func delete(_ keys: [String]) async throws {
        guard !keys.isEmpty else { return }
        try await queue.write { db in
            for key in keys { try db.execute(sql: "DELETE FROM cache_entries WHERE key = ?", arguments: [key]) }
        }
    }
}
