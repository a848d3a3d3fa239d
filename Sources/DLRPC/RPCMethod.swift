/// The methods of the socket protocol: one table, which the daemon dispatches on, which its
/// error for an unknown method lists, and which docs/protocol.md's "Methods" section must
/// match (a test reads it), and which the OpenRPC document (`OpenRPC.document`, answered to
/// `rpc.discover`) is built from. Each case's raw value is the method's name on the wire.
public enum RPCMethod: String, CaseIterable, Sendable {
    case enqueue, pause, resume, cancel, remove, status, list, stats, queue, subscribe, version, shutdown
    case setSpeed = "set_speed"
    case change, get, unpin
    case cacheList = "cache_list"
    /// The OpenRPC document of this protocol (`OpenRPC.document`).
    case discover = "rpc.discover"

    /// What the method does, in a line: the OpenRPC document's `summary`.
    public var summary: String {
        switch self {
        case .enqueue: "Creates jobs: one, a batch, or a group."
        case .pause: "Pauses jobs (by id, ids, group or all)."
        case .resume: "Queues paused, waiting or failed jobs again."
        case .cancel: "Cancels jobs; their partial files are removed."
        case .remove: "Removes job records (and, with delete_file, their files)."
        case .status: "One job, some jobs or a group, in full."
        case .list: "Jobs a page at a time, by state or group."
        case .stats: "Counts by state, transfers, speed, workers and the cache."
        case .queue: "Pauses or resumes the whole queue, or says whether it is paused."
        case .subscribe: "Turns the connection into a stream of events."
        case .version: "dld's version and the protocol's."
        case .shutdown: "Stops dld once the reply is sent."
        case .setSpeed: "Sets or clears the global or a job's speed limit."
        case .change: "Changes a job's URL or headers."
        case .get: "A cached copy of a URL (downloaded or revalidated first)."
        case .unpin: "Lets the cache evict a URL again."
        case .cacheList: "The cache's entries."
        case .discover: "This protocol as an OpenRPC 1.3 document: every method, its params, result and errors."
        }
    }

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
        case .stats, .version, .shutdown, .cacheList, .discover: NoParams.self
        }
    }

    /// The names, in the table's order, for messages.
    public static var names: [String] { allCases.map(\.rawValue) }
}
