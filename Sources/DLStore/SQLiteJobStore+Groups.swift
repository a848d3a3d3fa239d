import DLCore
import DLJobTable
import Foundation
import GRDB

extension SQLiteJobStore {
    /// Creates a group and its members in one transaction.
    public func insertGroup(
        name: String, dir: String, priority: Int, members: [NewJob], hls: String?, now: Date
    ) async throws -> (JobGroup, [Job]) {
        let (group, jobs, events) = try await pool.write { db in
            try db.execute(
                sql: "INSERT INTO groups (name, dir, staging, priority, created_at, updated_at, hls) VALUES (?, ?, '', ?, ?, ?, ?)",
                arguments: [name, dir, priority, now.timeIntervalSince1970, now.timeIntervalSince1970, hls])
            let id = db.lastInsertedRowID
            let staging = JobGroup.stagingFolder(for: dir, id: id)
            try db.execute(sql: "UPDATE groups SET staging = ? WHERE id = ?", arguments: [staging, id])
            let group = JobGroup(
                id: id, name: name, dir: dir, staging: staging, priority: priority, createdAt: now, updatedAt: now, hls: hls)
            let staged = NewJob.staged(members, dir: dir, staging: staging)
            var events: [StoredEvent] = []
            let outcomes = try Self.insert(staged, groupID: id, now: now, events: &events, in: db)
            return (group, outcomes.map(\.job), events)
        }
        sink.publish(events)
        return (group, jobs)
    }

    public func fetchGroup(_ id: GroupID) async throws -> JobGroup? {
        try await pool.read { db in
            try Self.rows(GroupColumn.self, db.cachedStatement(sql: "SELECT \(GroupColumn.list) FROM groups WHERE id = ?"), arguments: [id])
                .first
        }
    }

    public func hlsRecipe(of id: GroupID) async throws -> String? {
        try await pool.read { db in try String.fetchOne(db, sql: "SELECT hls FROM groups WHERE id = ?", arguments: [id]) }
    }

    public func extendGroup(_ group: JobGroup, members: [NewJob], hls: String, now: Date) async throws -> [Job]? {
        let (jobs, events) = try await pool.write { db -> ([Job]?, [StoredEvent]) in
            try db.execute(
                sql: "UPDATE groups SET hls = ?, updated_at = ? WHERE id = ? AND closed IS NULL",
                arguments: [hls, now.timeIntervalSince1970, group.id])
            guard db.changesCount > 0 else { return (nil, []) }
            var events: [StoredEvent] = []
            let staged = NewJob.staged(members, dir: group.dir, staging: group.staging)
            let outcomes = try Self.insert(staged, groupID: group.id, now: now, events: &events, in: db)
            return (outcomes.map(\.job), events)
        }
        sink.publish(events)
        return jobs
    }

    /// Groups with this name, newest first.
    public func fetchGroups(named name: String) async throws -> [JobGroup] {
        try await pool.read { db in
            try Self.rows(
                GroupColumn.self, db.cachedStatement(sql: "SELECT \(GroupColumn.list) FROM groups WHERE name = ? ORDER BY id DESC"),
                arguments: [name])
        }
    }

    public func members(of id: GroupID) async throws -> [Job] {
        try await pool.read { db in
            try Self.jobs(db.cachedStatement(sql: "SELECT \(JobColumn.list) FROM jobs WHERE group_id = ? ORDER BY id"), arguments: [id])
        }
    }

    /// Records a group's closing (published or canceled), with its event; `members` rows are
    /// written in the same transaction. With `publish: false` the event is returned instead of
    /// published, for a caller that must move the files first.
    @discardableResult
    public func saveGroup(_ group: JobGroup, members: [Job], publish: Bool) async throws -> [StoredEvent] {
        let events = try await pool.write { db in
            for member in members { try Self.update(member, in: db) }
            let row = try Row.fetchOne(db, sql: "SELECT closed, error_code FROM groups WHERE id = ?", arguments: [group.id])
            let before: String? = row?["closed"]
            let errorBefore: String? = row?["error_code"]
            try db.execute(
                sql: """
                    UPDATE groups SET name = ?, dir = ?, staging = ?, priority = ?, closed = ?, error_code = ?, error_message = ?,
                        updated_at = ?, finished_at = ? WHERE id = ?
                    """,
                arguments: [
                    group.name, group.dir, group.staging, group.priority, group.closed?.rawValue, group.error?.code,
                    group.error?.message, group.updatedAt.timeIntervalSince1970, group.finishedAt?.timeIntervalSince1970, group.id,
                ])
            if group.closed == nil, errorBefore == nil, group.error != nil {
                // Its publish failed (a file appeared in the folder): it is `failed` until resumed.
                return [try Self.record(.groupState, job: nil, groupID: group.id, state: "failed", at: group.updatedAt, in: db)]
            }
            guard let closed = group.closed, before != closed.rawValue else { return [StoredEvent]() }
            return [try Self.record(.groupState, job: nil, groupID: group.id, state: closed.rawValue, at: group.updatedAt, in: db)]
        }
        if publish { sink.publish(events) }
        return events
    }

    /// Deletes a group record (its members are deleted with `delete(.group(id), …)` in the
    /// same command), with its event.
    public func deleteGroup(_ id: GroupID, now: Date) async throws {
        let events = try await pool.write { db in
            try db.execute(sql: "DELETE FROM groups WHERE id = ?", arguments: [id])
            return [try Self.record(.groupState, job: nil, groupID: id, state: "removed", at: now, in: db)]
        }
        sink.publish(events)
    }

    /// Every group folder, with how the group was closed (nil while it is open).
    public func groupFolders() async throws -> [(id: GroupID, dir: String, closed: GroupState?)] {
        try await pool.read { db in
            try Row.fetchAll(db, sql: "SELECT id, dir, closed FROM groups").map { row in
                let closed: String? = row["closed"]
                return (row["id"], row["dir"], closed.flatMap(GroupState.init(rawValue:)))
            }
        }
    }

    /// Ids of groups that are neither published nor canceled.
    public func openGroups() async throws -> [GroupID] {
        try await pool.read { db in try GroupID.fetchAll(db, sql: "SELECT id FROM groups WHERE closed IS NULL ORDER BY id") }
    }
}
