/// The methods of the socket protocol: one table, which the daemon dispatches on, which its
/// error for an unknown method lists, and which docs/protocol.md's "Methods" section must
/// match (a test reads it). Each case's raw value is the method's name on the wire.
public enum RPCMethod: String, CaseIterable, Sendable {
    /// Creates jobs: one, a batch, or a group.
    case enqueue
    /// Pauses jobs (by `id`, `ids`, `group` or `all`).
    case pause
    /// Queues paused, waiting or failed jobs again.
    case resume
    /// Cancels jobs; their partial files are removed.
    case cancel
    /// Removes job records (and, with `delete_file`, their files).
    case remove
    /// One job, some jobs or a group, in full.
    case status
    /// Jobs a page at a time, by state or group.
    case list
    /// Counts by state, transfers, speed, workers and the cache.
    case stats
    /// Pauses or resumes the whole queue, or says whether it is paused.
    case queue
    /// Turns the connection into a stream of events.
    case subscribe
    /// dld's version and the protocol's.
    case version
    /// Stops dld once the reply is sent.
    case shutdown
    /// Sets or clears the global or a job's speed limit.
    case setSpeed = "set_speed"
    /// Changes a job's URL, headers or mirrors.
    case change
    /// A cached copy of a URL (downloaded or revalidated first).
    case get
    /// Lets the cache evict a URL again.
    case unpin
    /// The cache's entries.
    case cacheList = "cache_list"

    /// The type its params are decoded into, by the daemon, and built as, by clients.
    public var params: any MethodParams.Type {
        switch self {
        case .enqueue: EnqueueParams.self
        case .pause, .resume, .cancel: SelectionParams.self
        case .remove: RemoveParams.self
        case .status: StatusParams.self
        case .list: ListParams.self
        case .queue: QueueParams.self
        case .subscribe: SubscribeParams.self
        case .setSpeed: SetSpeedParams.self
        case .change: ChangeParams.self
        case .get: GetParams.self
        case .unpin: UnpinParams.self
        case .stats, .version, .shutdown, .cacheList: NoParams.self
        }
    }

    /// The names, in the table's order, for messages.
    public static var names: [String] { allCases.map(\.rawValue) }
}
