import DLCore
import Foundation

/// The jobs a command names: every job, a list of ids, or a group's members.
public enum RowSelection: Sendable, Equatable {
    case all
    case ids([JobID])
    case group(GroupID)
    /// Standalone jobs (not group members: a group goes whole) in one of `states`, and with
    /// `before`, finished (else last changed) at or before it. Retention and `remove` with
    /// `finished`/`failed`.
    case finished([JobState], before: Date?)
}

/// A user command applied to many rows at once.
public enum BulkCommand: Sendable, CaseIterable {
    case pause, resume, cancel

    public var event: JobEvent {
        switch self {
        case .pause: return .pause
        case .resume: return .resume
        case .cancel: return .cancel
        }
    }

    /// States the command changes. Derived from the state machine, so that a bulk command and
    /// a single transition can never disagree on where they apply.
    public var sources: [JobState] { JobState.allCases.filter { StateMachine.allows(event, from: $0) } }

    /// States the command leaves alone without refusing: the job is already as wanted.
    public var noOpStates: Set<JobState> {
        switch self {
        case .pause: return [.paused]
        case .resume: return [.queued, .running]
        case .cancel: return [.canceled]
        }
    }

    /// States in which a job named by id refuses the command (`invalid_state`): nothing changes.
    public var refusedStates: Set<JobState> { Set(JobState.allCases).subtracting(sources).subtracting(noOpStates) }

    /// Failures after which the partial file cannot be trusted: a resume starts over from zero
    /// (`JobErrorCode.startOver`, which `StateMachine` applies too), in a stable order for SQL.
    public static let startOverCodes = JobErrorCode.startOver.map(\.rawValue).sorted()
}

/// What a bulk change did: how many rows, and the first of their ids (a reply stays small
/// whatever the count).
public struct BulkOutcome: Sendable, Equatable {
    public var count: Int
    /// The smallest changed ids, at most `BulkOutcome.idsShown`.
    public var ids: [JobID]
    /// Files to delete after the commit (partial files of removed or canceled jobs, and
    /// finished files that `delete_file` asked for). Only jobs that ever started have any.
    public var files: [String] = []
    /// Jobs running under other workers whose command waits for them, their owners
    /// (`StopRequest`): counted here, not in `count`, until they carry it out.
    public var requested = 0

    public static let idsShown = 1000

    public init(count: Int, ids: [JobID], files: [String] = [], requested: Int = 0) {
        self.count = count
        self.ids = ids
        self.files = files
        self.requested = requested
    }
}

extension BulkCommand {
    /// The columns the command sets, in both backends: the same result as `StateMachine.apply`
    /// on each row (a store test checks that they agree, on both). SQLite and PostgreSQL both
    /// evaluate every expression on the old row. What differs is the dialect: how the
    /// command's time is written (`now`), how "the row's error code is one of
    /// `JobErrorCode.startOver`" is (`startsOver`), and the false of a boolean column.
    public func assignments(now: String, startsOver over: String, falseValue: String) -> String {
        switch self {
        case .pause:
            return """
                state = 'paused', worker = NULL, lease_until = NULL, stop_request = NULL, wait_reason = NULL, \
                next_attempt_at = NULL, updated_at = \(now)
                """
        case .cancel:
            return """
                state = 'canceled', worker = NULL, lease_until = NULL, stop_request = NULL, wait_reason = NULL, \
                next_attempt_at = NULL, finished_at = \(now), updated_at = \(now)
                """
        case .resume:
            // A failure after which the partial file cannot be trusted: start over from zero.
            return """
                state = 'queued', wait_reason = NULL, next_attempt_at = NULL, finished_at = NULL, attempts = 0,
                updated_at = \(now),
                error_code = CASE WHEN state = 'failed' THEN NULL ELSE error_code END,
                error_message = CASE WHEN state = 'failed' THEN NULL ELSE error_message END,
                received = CASE WHEN \(over) THEN 0 ELSE received END,
                segments = CASE WHEN \(over) THEN NULL ELSE segments END,
                unsynced = CASE WHEN \(over) THEN NULL ELSE unsynced END,
                etag = CASE WHEN \(over) THEN NULL ELSE etag END,
                last_modified = CASE WHEN \(over) THEN NULL ELSE last_modified END,
                accepts_ranges = CASE WHEN \(over) THEN \(falseValue) ELSE accepts_ranges END,
                sha256 = CASE WHEN \(over) THEN NULL ELSE sha256 END,
                digest = CASE WHEN \(over) THEN NULL ELSE digest END
                """
        }
    }
}

extension BulkCommand {
    /// The request a command leaves for the worker that runs a job (nil: resume, which
    /// withdraws a pending pause instead).
    public var stopRequest: StopRequest? {
        switch self {
        case .pause: return .pause
        case .cancel: return .cancel
        case .resume: return nil
        }
    }
}

/// The SQL both backends use for commands that go to the owner (the same text in both
/// dialects). `owner` is the placeholder of the commanding worker's id.
public enum OwnerRequests {
    /// A row that another worker runs: a command leaves it a request.
    public static func elsewhere(owner: String) -> String {
        "(state = 'running' AND worker IS NOT NULL AND worker <> \(owner))"
    }

    /// The assignment that records `request`, keeping a stronger one already pending.
    public static func assignment(_ request: StopRequest) -> String {
        let stronger = StopRequest.allStronger(than: request).map { "'\($0.rawValue)'" }
        guard !stronger.isEmpty else { return "stop_request = '\(request.rawValue)'" }
        return
            "stop_request = CASE WHEN stop_request IN (\(stronger.joined(separator: ", "))) THEN stop_request ELSE '\(request.rawValue)' END"
    }

    /// The state a pending request gives a row whose lease ran out ('remove' rows are
    /// deleted by a statement of their own first).
    public static let expiredState =
        "CASE stop_request WHEN 'pause' THEN 'paused' WHEN 'cancel' THEN 'canceled' ELSE 'queued' END"
}

extension StopRequest {
    /// The requests that win over `request`.
    static func allStronger(than request: StopRequest) -> [StopRequest] {
        [StopRequest.pause, .cancel, .remove].filter { $0 > request }
    }
}
