import Foundation

/// What a running transfer adds to a job's row: live counters that are not in the table yet.
public struct LiveProgress: Sendable, Equatable {
    public var received: Int64
    public var size: Int64?
    /// Bytes per second over the last second or so.
    public var speed: Double
    /// The transfer dropped the job's bytes and started over: shown as the job's `error`.
    public var startedOver: JobError?

    public init(received: Int64, size: Int64?, speed: Double, startedOver: JobError? = nil) {
        self.startedOver = startedOver
        self.received = received
        self.size = size
        self.speed = speed
    }
}

/// A job as a reader sees it: its row, and the live counters of its transfer when it runs.
public struct JobView: Sendable, Equatable {
    public var job: Job
    public var live: LiveProgress?

    public init(_ job: Job, live: LiveProgress? = nil) {
        self.job = job
        self.live = live
    }
}

/// Jobs as a reader sees them, many at once (a page of `list`, a group's members): their rows
/// as read, and the live counters of those whose transfers run here. The rows are not copied
/// into `JobView`s: a page of a thousand jobs would retain and release every string twice more.
public struct JobViews: Sendable {
    public var jobs: [Job]
    public var live: [JobID: LiveProgress]

    public init(_ jobs: [Job], live: [JobID: LiveProgress] = [:]) {
        self.jobs = jobs
        self.live = live
    }
}

/// Which jobs a command applies to.
public enum JobSelection: Sendable, Equatable {
    case ids([JobID])
    case all
    case group(GroupReference)
}

/// A group, by id or by name (the newest group of that name).
public enum GroupReference: Sendable, Equatable {
    case id(GroupID)
    case name(String)
}
