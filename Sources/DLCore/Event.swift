import Foundation

/// A recorded change, numbered in commit order. State changes are kept in the table (bounded)
/// so that a client that was away can replay what it missed.
public struct StoredEvent: Sendable, Equatable {
    public enum Kind: String, Sendable {
        /// A job changed state (also when it is created).
        case jobState = "job.state"
        /// A job record was deleted.
        case jobRemoved = "job.removed"
        /// A group was published or closed.
        case groupState = "group.state"
    }

    public var seq: Int64
    public var at: Date
    public var kind: Kind
    public var jobID: JobID?
    public var groupID: GroupID?
    public var state: String
    public var waitReason: WaitReason?
    public var error: JobError?

    public init(
        seq: Int64, at: Date, kind: Kind, jobID: JobID?, groupID: GroupID?, state: String,
        waitReason: WaitReason? = nil, error: JobError? = nil
    ) {
        self.seq = seq
        self.at = at
        self.kind = kind
        self.jobID = jobID
        self.groupID = groupID
        self.state = state
        self.waitReason = waitReason
        self.error = error
    }
}
