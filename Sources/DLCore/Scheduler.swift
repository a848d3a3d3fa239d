/// A queued job as the scheduler sees it.
public struct QueueEntry: Sendable, Equatable {
    public var id: JobID
    public var priority: Int

    public init(id: JobID, priority: Int) {
        self.id = id
        self.priority = priority
    }
}

/// The scheduling policy: which queued jobs get the free slots. Pure, so that ordering is
/// tested without a daemon. Higher priority first, then first in, first out (lower id).
public enum SchedulerPolicy {
    /// The order in which queued jobs are served.
    public static func order(_ lhs: QueueEntry, _ rhs: QueueEntry) -> Bool {
        if lhs.priority != rhs.priority { return lhs.priority > rhs.priority }
        return lhs.id < rhs.id
    }

    /// The jobs to start now, in order. Paused and waiting jobs are never in `queued`, so they
    /// cannot hold a slot or block the ones behind them.
    public static func jobsToStart(queued: [QueueEntry], active: Int, maxActive: Int) -> [JobID] {
        let free = max(0, maxActive - active)
        guard free > 0 else { return [] }
        return queued.sorted(by: order).prefix(free).map(\.id)
    }
}
