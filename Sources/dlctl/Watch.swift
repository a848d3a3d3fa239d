import ArgumentParser
import DLCore
import DLRPC
import Foundation

/// Follows jobs through the daemon's event stream: the jobs' last known rows, updated by
/// `job.state` and `job.progress` notifications.
final class Tracker {
    var jobs: [Int64: JSONValue] = [:]
    var order: [Int64] = []
    /// The jobs in `jobs` that are not finished, kept as rows change: asking every job after
    /// every event made `dlctl enqueue -i … --wait` of 2000 files quadratic (12 million checks
    /// on the cores the daemon downloads with).
    private(set) var unfinished: Set<Int64> = []
    /// Jobs waited for (by id), and how many of them are in `unfinished`.
    var watched: Set<Int64> = [] {
        didSet { unfinishedWatched = unfinished.intersection(watched).count }
    }
    private(set) var unfinishedWatched = 0
    let client: RPCClient
    let common: Common

    init(common: Common) {
        self.common = common
        client = RPCClient(socketPath: common.socketPath)
    }

    /// Subscribes first, then reads the current rows, so that no change falls in between.
    func start(ids: [Int64]?, group: String?) throws {
        let params = SubscribeParams(ids: ids.map(Set.init), group: group.map(GroupReference.init(argument:)))
        do {
            _ = try client.call(RPCMethod.subscribe.rawValue, params.params)
        } catch {
            _ = try common.call(.subscribe, params)  // prints the error and exits
        }
        let rows: [JSONValue]
        if let ids {
            rows = try common.call(.status, StatusParams(.jobs(ids)))["jobs"]?.arrayValue ?? []
        } else if let group {
            rows = try common.call(.list, ListParams(group: GroupReference(argument: group)))["jobs"]?.arrayValue ?? []
        } else {
            rows = try common.call(.list, ListParams(states: [.queued, .running, .waiting, .paused]))["jobs"]?.arrayValue ?? []
        }
        for row in rows { remember(row) }
    }

    func remember(_ row: JSONValue) {
        guard let id = row["id"]?.int64Value else { return }
        if jobs[id] == nil { order.append(id) }
        jobs[id] = row
        noteState(of: id)
    }

    private func noteState(of id: Int64) {
        let changed = Self.finished.contains(state(id)) ? unfinished.remove(id) != nil : unfinished.insert(id).inserted
        if changed, watched.contains(id) {
            unfinishedWatched += unfinished.contains(id) ? 1 : -1
        }
    }

    /// Applies one notification; returns it for printing.
    @discardableResult
    func apply(_ message: JSONValue) -> (method: String, params: JSONValue)? {
        guard let method = message["method"]?.stringValue, let params = message["params"] else { return nil }
        guard let id = params["id"]?.int64Value else { return (method, params) }
        var row = jobs[id] ?? ["id": .int(id), "name": .string("job \(id)")]
        guard case .object(var object) = row else { return (method, params) }
        switch method {
        case "job.progress":
            object["received"] = params["received"]
            object["size"] = params["size"]
            object["speed"] = params["speed"]
            if let received = params["received"]?.doubleValue, let size = params["size"]?.doubleValue, size > 0 {
                object["progress"] = .double(received / size)
            }
        case "job.state":
            object["state"] = params["state"]
            object["wait_reason"] = params["wait_reason"]
            object["error"] = params["error"]
            if params["state"] == "completed" { object["progress"] = .double(1) }
            if params["state"] != "running" { object["speed"] = 0 }
        case "job.removed":
            object["state"] = "removed"
        default:
            break
        }
        row = .object(object)
        if jobs[id] == nil { order.append(id) }
        jobs[id] = row
        noteState(of: id)
        return (method, params)
    }

    func state(_ id: Int64) -> String { jobs[id]?["state"]?.stringValue ?? "?" }

    static let finished: Set<String> = ["completed", "failed", "canceled", "removed"]
}

/// Live progress bars on a terminal; one plain line per event otherwise.
struct Watch: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Follow jobs live: progress bars with speed and ETA on a terminal, one line per event otherwise.")
    @Argument(help: "Job ids (default: every unfinished job and every new one).") var ids: [Int64] = []
    @Option(help: "Follow a group (id or name).") var group: String?
    @Flag(help: "Follow every job, also new ones.") var all = false
    @OptionGroup var common: Common

    func run() throws {
        let tracker = Tracker(common: common)
        try tracker.start(ids: ids.isEmpty ? nil : ids, group: group)
        let terminal = isatty(STDOUT_FILENO) == 1 && !common.json
        var renderer = Renderer()
        let stopWhenDone = !ids.isEmpty
        if terminal { renderer.draw(tracker) }
        while true {
            if stopWhenDone && ids.allSatisfy({ Tracker.finished.contains(tracker.state($0)) }) { break }
            let message: JSONValue
            do {
                message = try tracker.client.readMessage()
            } catch {
                if terminal { renderer.finish(tracker) }
                printError("the event stream ended: \(error)")
                throw ExitCode(1)
            }
            guard let (method, params) = tracker.apply(message) else { continue }
            if common.json {
                print(message.serializedString())
            } else if terminal {
                renderer.draw(tracker)
            } else {
                print(Format.eventLine(method, params))
            }
        }
        if terminal { renderer.finish(tracker) }
    }
}

/// Blocks until jobs finish.
struct Wait: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Wait until jobs (or a group) finish.",
        discussion: "Exit status: 0 if all completed, 1 if any failed or was canceled, 124 on --timeout.")
    @Argument(help: "Job ids.") var ids: [Int64] = []
    @Option(help: "Wait for a group (id or name).") var group: String?
    @Option(help: "Give up after this many seconds (exit 124).") var timeout: Double?
    @OptionGroup var common: Common

    func validate() throws {
        if ids.isEmpty == (group == nil) { throw ValidationError("give job ids or --group") }
    }

    func run() throws {
        try waitFor(common: common, ids: ids, group: group, timeout: timeout, showProgress: false)
    }
}

/// Shared by `wait` and `enqueue --wait`: exits with 0, 1 or 124.
func waitFor(common: Common, ids: [Int64], group: String?, timeout: Double?, showProgress: Bool) throws {
    let tracker = Tracker(common: common)
    try tracker.start(ids: group == nil ? ids : nil, group: group)
    let deadline = timeout.map { Date().addingTimeInterval($0) }
    let terminal = showProgress && isatty(STDERR_FILENO) == 1 && !common.json
    var renderer = Renderer(output: .standardError)
    func groupDone() throws -> (Bool, Bool) {
        guard let group else { return (false, false) }
        let status = try common.call(.status, StatusParams(.group(GroupReference(argument: group))))
        let state = status["group"]?["state"]?.stringValue ?? ""
        return (["completed", "failed", "canceled"].contains(state), state == "completed")
    }
    // A group's state is derived by the daemon; it is asked again only after a state change
    // (progress notifications cannot finish it).
    var groupMayHaveChanged = true
    // A member that failed before the subscription is in the rows the tracker started from.
    var memberFailed = tracker.jobs.values.contains { ["failed", "canceled"].contains($0["state"]?.stringValue ?? "") }
    tracker.watched = Set(ids)
    while true {
        let watched = group == nil ? ids : tracker.order
        if group != nil {
            // A group is done when the daemon says so (its members may all be complete while
            // it is still being published): never judged from the members alone.
            if groupMayHaveChanged {
                groupMayHaveChanged = false
                let (done, ok) = try groupDone()
                if done {
                    if terminal { renderer.finish(tracker) }
                    throw ExitCode(ok ? 0 : 1)
                }
            }
        } else if tracker.unfinishedWatched == 0, watched.allSatisfy({ tracker.jobs[$0] != nil }) {
            if terminal { renderer.finish(tracker) }
            let ok = watched.allSatisfy { tracker.state($0) == "completed" }
            if !ok {
                for id in watched where tracker.state(id) != "completed" {
                    printError(
                        "job \(id) \(tracker.state(id))\(tracker.jobs[id]?["error"]?["message"]?.stringValue.map { ": \($0)" } ?? "")")
                }
            }
            throw ExitCode(ok ? 0 : 1)
        }
        if let deadline {
            let left = deadline.timeIntervalSinceNow
            if left <= 0 { throw ExitCode(124) }
            try? tracker.client.setReadTimeout(max(0.05, left))
        }
        do {
            let message = try tracker.client.readMessage()
            tracker.apply(message)
            // A group ends with its `group.state` event (published, canceled, removed), or, once
            // a member has failed, when the last member still running stops. Asking for the
            // group's status after every member's event made a 2000-file group quadratic.
            let state = message["params"]?["state"]?.stringValue ?? ""
            if message["method"] == "job.state", state == "failed" || state == "canceled" { memberFailed = true }
            if message["method"] == "group.state" || (memberFailed && message["method"] == "job.state" && Tracker.finished.contains(state))
            {
                groupMayHaveChanged = true
            }
            if terminal { renderer.draw(tracker) }
        } catch .timedOut {
            throw ExitCode(124)
        } catch {
            printError("the event stream ended: \(error)")
            throw ExitCode(1)
        }
    }
}

/// Redraws one line per job in place (ANSI cursor movement), at most 10 times a second.
struct Renderer {
    let output: FileHandle
    private var lines = 0
    private var last = Date.distantPast
    /// https://no-color.org: any non-empty NO_COLOR turns colour off.
    private let color = ProcessInfo.processInfo.environment["NO_COLOR"].map { $0.isEmpty } ?? true

    init(output: FileHandle = .standardOutput) { self.output = output }

    mutating func draw(_ tracker: Tracker) {
        let now = Date()
        guard now.timeIntervalSince(last) >= 0.1 else { return }
        last = now
        var text = lines > 0 ? "\u{1B}[\(lines)A" : ""
        for id in tracker.order {
            guard let job = tracker.jobs[id] else { continue }
            text += "\u{1B}[2K" + Format.progressLine(job, color: color) + "\n"
        }
        lines = tracker.order.count
        output.write(Data(text.utf8))
    }

    /// The last frame, drawn whatever the rate limit, so that it shows the final states.
    mutating func finish(_ tracker: Tracker) {
        last = .distantPast
        draw(tracker)
    }
}
