import Foundation

public typealias GroupID = Int64

/// A download group: files that are complete only together (all pages of a chapter, all files
/// of a lesson). Members download into `staging` and are moved into `dir` only when every one
/// of them is complete and verified.
public struct JobGroup: Sendable, Equatable {
    public var id: GroupID
    public var name: String
    /// Where the members end up.
    public var dir: String
    /// Where they download until then: a hidden folder beside `dir`, on the same filesystem.
    public var staging: String
    public var priority: Int
    /// Set once the group is published (`completed`) or given up (`canceled`).
    public var closed: GroupState?
    public var error: JobError?
    public var createdAt: Date
    public var updatedAt: Date
    public var finishedAt: Date?
    /// An HLS download's recipe (`HLSRecipe`'s JSON): set when the group is created, in the
    /// same transaction, and never changed. Its publish joins the members into `dir` (a file)
    /// or writes a local playlist beside them, instead of moving the staging folder. Read only
    /// by `JobTable.hlsRecipe(of:)` (the generic group reads leave it nil): a recipe can be
    /// megabytes, and a group's turns must not read it each time.
    public var hls: String?

    public init(
        id: GroupID = 0, name: String, dir: String, staging: String, priority: Int = 0,
        closed: GroupState? = nil, error: JobError? = nil, createdAt: Date, updatedAt: Date,
        finishedAt: Date? = nil, hls: String? = nil
    ) {
        self.hls = hls
        self.id = id
        self.name = name
        self.dir = dir
        self.staging = staging
        self.priority = priority
        self.closed = closed
        self.error = error
        self.createdAt = createdAt
        self.updatedAt = updatedAt
        self.finishedAt = finishedAt
    }

    /// Where a member whose final path is `path` is staged.
    public static func stagedPath(of path: String, dir: String, staging: String) -> String {
        staging + path.dropFirst(dir.count)
    }

    /// The staging folder for a group folder: `.<name>.dld-staging-<id>` beside it.
    public static func stagingFolder(for dir: String, id: GroupID) -> String {
        let parent = (dir as NSString).deletingLastPathComponent
        let name = (dir as NSString).lastPathComponent
        return (parent == "/" ? "" : parent) + "/.\(name).dld-staging-\(id)"
    }
}

/// What a group is doing, derived from its members (never stored twice).
public enum GroupState: String, Sendable, CaseIterable {
    case queued, running, waiting, paused, completed, failed, canceled
}

/// Counters of a group for status: members done of total, bytes done of total.
public struct GroupSummary: Sendable, Equatable {
    public var state: GroupState
    public var total: Int
    public var done: Int
    public var bytesDone: Int64
    /// nil while some member's size is unknown.
    public var bytesTotal: Int64?
    /// The first failed member's error, when the group failed.
    public var error: JobError?

    /// Pure: the group's state from its members' states.
    ///  - closed groups are what they were closed as;
    ///  - any member queued or running: running when the group holds a slot, else queued
    ///    (the other members go on after one fails);
    ///  - then any failed member (or a failed publish) fails the group; the rest stay staged;
    ///  - else any waiting: waiting; else all left are paused: paused;
    ///  - all members complete but not yet published: running (publishing is next).
    public static func summarize(_ group: JobGroup, members: [Job], active: Bool) -> GroupSummary {
        let done = members.filter { $0.state == .completed }.count
        let bytesDone = members.reduce(Int64(0)) { $0 + $1.received }
        let sizes = members.map(\.size)
        let bytesTotal: Int64? = sizes.contains(where: { $0 == nil }) ? nil : sizes.reduce(Int64(0)) { $0 + ($1 ?? 0) }
        let failed = members.first { $0.state == .failed }
        let state: GroupState
        if let closed = group.closed {
            state = closed
        } else if members.contains(where: { $0.state == .queued || $0.state == .running }) {
            // The other members go on after one fails, so that a resume needs only the missing.
            state = active ? .running : .queued
        } else if failed != nil || group.error != nil {
            state = .failed
        } else if members.contains(where: { $0.state == .waiting }) {
            state = .waiting
        } else if members.contains(where: { $0.state == .paused }) {
            state = .paused
        } else if members.allSatisfy({ $0.state == .completed }) {
            state = .running
        } else {
            state = .canceled
        }
        var error = group.error
        if error == nil, let failed, let cause = failed.error {
            error = JobError(code: cause.code, message: "member \(failed.id) (\(failed.name)): \(cause.message)")
        }
        return GroupSummary(state: state, total: members.count, done: done, bytesDone: bytesDone, bytesTotal: bytesTotal, error: error)
    }
}

/// A relative path inside a group folder: no `..`, not absolute, no empty segments.
public enum RelativePath {
    public static func validate(_ path: String) -> Result<String, DLError> {
        let parts = path.split(separator: "/", omittingEmptySubsequences: false)
        guard !path.hasPrefix("/"), !parts.isEmpty,
            parts.allSatisfy({ !$0.isEmpty && $0 != "." && $0 != ".." && !$0.contains("\0") })
        else {
            return .failure(.invalidParams("a member path must be relative to the group folder, without \"..\": \(path.prefix(200))"))
        }
        return .success(parts.joined(separator: "/"))
    }
}
