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

    /// How `free` slots are shared between standalone jobs and groups: the first entries in the
    /// queue's order, where a group stands at its first queued member and takes a slot of its
    /// own; at most `standaloneLimit` standalone jobs and `groupLimit` groups (nil: `free`)
    /// take one, and an entry over its kind's limit is passed over (it does not block the
    /// others). Returns how many standalone jobs get a slot, and the groups that do, in order.
    public static func share<Group>(
        free: Int, standaloneLimit: Int? = nil, groupLimit: Int? = nil,
        standalone: [QueueEntry], groups: [(entry: QueueEntry, group: Group)]
    ) -> (standalone: Int, groups: [Group]) {
        var groupAt: [JobID: Group] = [:]
        for (entry, group) in groups where groupAt[entry.id] == nil { groupAt[entry.id] = group }
        let standaloneLimit = min(free, standaloneLimit ?? free)
        let groupLimit = min(free, groupLimit ?? free)
        var count = 0
        var chosen: [Group] = []
        for entry in (standalone + groups.map(\.entry)).sorted(by: order) {
            guard count + chosen.count < free else { break }
            if let group = groupAt[entry.id] {
                if chosen.count < groupLimit { chosen.append(group) }
            } else if count < standaloneLimit {
                count += 1
            }
        }
        return (count, chosen)
    }

    /// Which of the next queued jobs (`hosts`: each one's host, in the queue's order) a slot
    /// that just freed up starts at once, before the next turn: the first that `mayStart` lets
    /// start (the lanes, `Lanes.mayStart`) whose host has room (`load` counts the transfers
    /// that still run; `limit` is each host's limit), while a slot is free. Nil: the next turn
    /// decides. `hosts` may be lazy: it is read only up to the job chosen.
    public static func handOff<Hosts: Collection<String>>(
        hosts: Hosts, free: Int, load: [String: Int], limit: (String) -> Int,
        mayStart: (Hosts.Index) -> Bool = { _ in true }
    ) -> Hosts.Index? {
        guard free > 0 else { return nil }
        return hosts.indices.first { load[hosts[$0], default: 0] < limit(hosts[$0]) && mayStart($0) }
    }
}
