import DLCore
import DLJobTable
import DLStore
import DLStorePostgres
import Foundation
import Logging

/// `dld migrate --to postgresql://…`: copies `<state_dir>/jobs.sqlite` into an empty
/// PostgreSQL table, ids and event numbers kept, so that `database = "postgresql://…"` then
/// serves the same queue. The daemon must be stopped (the state folder's lock says so); the
/// SQLite file is left as it was.
public enum TableMigration {
    public struct Summary: Sendable, Equatable {
        public var jobs = 0
        public var groups = 0
        public var events = 0
    }

    /// Rows a transaction.
    static let page = 1000

    /// A connection string with its password as `***`, for what is printed.
    public static func redacted(_ database: String) -> String { PostgresURL.redacted(database) }

    public static func run(stateDir: String, to database: String, logger: Logger) async throws -> Summary {
        let shown = PostgresURL.redacted(database)
        let path = stateDir + "/jobs.sqlite"
        let lock: StateLock
        do {
            lock = try StateLock(stateDir: stateDir)
        } catch {
            throw DaemonError("stop dld before migrating its table: \(error)")
        }
        defer { withExtendedLifetime(lock) {} }
        guard FileManager.default.fileExists(atPath: path) else {
            throw DaemonError("there is no job table at \(path) to migrate")
        }
        let source: SQLiteJobStore
        do {
            source = try SQLiteJobStore(path: path)
        } catch {
            throw DaemonError("cannot open the job table \(path): \(StorageErrorText.plain(error))")
        }
        let url: PostgresURL
        do {
            url = try PostgresURL.parse(database, defaultUser: NSUserName())
        } catch {
            throw DaemonError("--to: \(error)")
        }
        let daemonLock: PostgresDaemonLock
        let target: PostgresJobStore
        do {
            // Under a worker id of its own: the import refuses a table that is not empty.
            daemonLock = try await PostgresDaemonLock.acquire(url, worker: "dld migrate", logger: logger)
        } catch {
            throw DaemonError("cannot use \(shown): \(error)")
        }
        do {
            target = try await PostgresJobStore.open(url, maxConnections: 2, logger: logger)
        } catch {
            await daemonLock.release()
            throw DaemonError("cannot open \(shown): \(error)")
        }
        do {
            let summary = try await copy(from: source, to: target, shown: shown)
            await target.close()
            await daemonLock.release()
            await source.close()
            return summary
        } catch {
            await target.close()
            await daemonLock.release()
            await source.close()
            throw error
        }
    }

    static func copy(from source: SQLiteJobStore, to target: PostgresJobStore, shown: String) async throws -> Summary {
        guard try await target.isEmpty() else {
            throw DaemonError("the job table in \(shown) is not empty; dld migrate copies only into an empty one")
        }
        var summary = Summary()
        // Groups first: jobs refer to them.
        var groups: [JobGroup] = []
        for folder in try await source.groupFolders() {
            if var group = try await source.fetchGroup(folder.id) {
                group.hls = try await source.hlsRecipe(of: folder.id)
                groups.append(group)
            }
        }
        try await target.importRows(groups: groups, jobs: [], events: [])
        summary.groups = groups.count
        var after: JobID = 0
        while true {
            let jobs = try await source.list(afterID: after, limit: page)
            guard let last = jobs.last else { break }
            try await target.importRows(groups: [], jobs: jobs, events: [])
            summary.jobs += jobs.count
            after = last.id
        }
        var seq: Int64 = 0
        while true {
            let events = try await source.events(after: seq, limit: page)
            guard let last = events.last else { break }
            try await target.importRows(groups: [], jobs: [], events: events)
            summary.events += events.count
            seq = last.seq
        }
        try await target.finishImport()
        return summary
    }
}
