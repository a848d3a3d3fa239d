import DLCore
import DLRPC
import DLTransfer
import Foundation
import Logging
import Synchronization

/// Fans committed events out to subscribed connections. State events come from the job
/// table's commits, in commit order, and are never dropped: a subscriber that falls
/// `bufferLimit` events behind is disconnected (it can resubscribe with `since` and replay).
/// Progress events are live only.
public final class EventHub: Sendable {
    /// Which events a subscriber wants; empty means all.
    public struct Filter: Sendable, Equatable {
        public var ids: Set<JobID>?
        public var group: GroupID?

        public init(ids: Set<JobID>? = nil, group: GroupID? = nil) {
            self.ids = ids
            self.group = group
        }

        func matches(job: JobID?, group: GroupID?) -> Bool {
            if ids == nil && self.group == nil { return true }
            if let job, ids?.contains(job) == true { return true }
            if let group, self.group == group { return true }
            return false
        }
    }

    /// What a subscriber receives.
    public enum Item: Sendable {
        case stored(StoredEvent)
        case progress(JSONValue)
    }

    private struct Subscriber {
        let filter: Filter
        let continuation: AsyncStream<Item>.Continuation
    }

    public static let bufferLimit = 10_000
    private let subscribers = Mutex<[UInt64: Subscriber]>([:])
    private let overflowed = Mutex<Set<UInt64>>([])
    private let counter = Mutex<UInt64>(0)

    public init() {}

    public func subscribe(_ filter: Filter) -> (token: UInt64, stream: AsyncStream<Item>) {
        let token = counter.withLock { value -> UInt64 in
            value += 1
            return value
        }
        let (stream, continuation) = AsyncStream<Item>.makeStream(bufferingPolicy: .bufferingOldest(Self.bufferLimit))
        subscribers.withLock { $0[token] = Subscriber(filter: filter, continuation: continuation) }
        return (token, stream)
    }

    public func unsubscribe(_ token: UInt64) {
        let subscriber = subscribers.withLock { $0.removeValue(forKey: token) }
        subscriber?.continuation.finish()
    }

    /// Whether the subscriber was cut off for falling behind.
    public func didOverflow(_ token: UInt64) -> Bool {
        overflowed.withLock { $0.remove(token) != nil }
    }

    public var subscriberCount: Int { subscribers.withLock { $0.count } }

    public func publish(_ events: [StoredEvent]) {
        let current = subscribers.withLock { $0 }
        for (token, subscriber) in current {
            for event in events where subscriber.filter.matches(job: event.jobID, group: event.groupID) {
                if case .dropped = subscriber.continuation.yield(.stored(event)) {
                    overflowed.withLock { _ = $0.insert(token) }
                    unsubscribe(token)
                    break
                }
            }
        }
    }

    /// Live progress of running jobs (called at most twice a second).
    public func publishProgress(_ jobs: [Job], _ snapshots: [TransferProgress.Snapshot]) {
        let current = subscribers.withLock { $0 }
        guard !current.isEmpty else { return }
        for (job, snapshot) in zip(jobs, snapshots) {
            let params: JSONValue = [
                "id": .int(job.id), "group": job.groupID.map { .int($0) } ?? .null,
                "received": .int(snapshot.received), "size": snapshot.size.map { .int($0) } ?? .null,
                "speed": .int(Int64(snapshot.speed.rounded())),
            ]
            for (_, subscriber) in current where subscriber.filter.matches(job: job.id, group: job.groupID) {
                // Progress is coalesced anyway: when a buffer is full it is simply not added.
                _ = subscriber.continuation.yield(.progress(params))
            }
        }
    }
}

/// Runs the configured hook commands: no shell, an argv list, the job in environment
/// variables, a timeout; output goes to the log; a hook never changes the job.
public struct HookRunner: Sendable {
    public var onComplete: [String]?
    public var onError: [String]?
    public var timeout: Duration
    let logger: Logging.Logger

    public init(onComplete: [String]?, onError: [String]?, timeout: Duration, logger: Logging.Logger) {
        self.onComplete = onComplete
        self.onError = onError
        self.timeout = timeout
        self.logger = logger
    }

    public func finished(_ notice: Engine.FinishedNotice) {
        let argv = notice.state == "completed" ? onComplete : onError
        guard let argv, let command = argv.first else { return }
        var environment = ProcessInfo.processInfo.environment
        environment["DLD_JOB_ID"] = notice.jobID.map(String.init) ?? ""
        environment["DLD_GROUP"] = notice.group.map { String($0.id) } ?? ""
        environment["DLD_GROUP_NAME"] = notice.group?.name ?? ""
        environment["DLD_PATH"] = notice.path
        environment["DLD_URL"] = JobJSON.redactURL(notice.url)
        environment["DLD_STATE"] = notice.state
        environment["DLD_ERROR_CODE"] = notice.error?.code ?? ""
        environment["DLD_ERROR"] = notice.error?.message ?? ""
        let arguments = Array(argv.dropFirst())
        let timeout = self.timeout
        let logger = self.logger
        Task.detached {
            await Self.run(command: command, arguments: arguments, environment: environment, timeout: timeout, logger: logger)
        }
    }

    static func run(command: String, arguments: [String], environment: [String: String], timeout: Duration, logger: Logging.Logger) async {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: resolve(command, path: environment["PATH"]))
        process.arguments = arguments
        process.environment = environment
        let output = Pipe()
        process.standardOutput = output
        process.standardError = output
        process.standardInput = FileHandle.nullDevice
        do {
            try process.run()
        } catch {
            logger.warning("hook could not start", metadata: ["command": "\(command)", "error": "\(error)"])
            return
        }
        let pid = process.processIdentifier
        let killer = Task {
            try? await Task.sleep(for: timeout)
            guard !Task.isCancelled else { return }
            logger.warning("hook timed out; killing it", metadata: ["command": "\(command)", "pid": "\(pid)"])
            kill(pid, SIGTERM)
            try? await Task.sleep(for: .seconds(2))
            kill(pid, SIGKILL)
        }
        let data = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        killer.cancel()
        let text = String(decoding: data.prefix(64 << 10), as: UTF8.self)
        for line in text.split(separator: "\n") {
            logger.info("hook: \(line)", metadata: ["command": "\(command)"])
        }
        if process.terminationStatus != 0 {
            logger.warning("hook failed", metadata: ["command": "\(command)", "status": "\(process.terminationStatus)"])
        }
    }

    /// An absolute path, or the first match on PATH.
    static func resolve(_ command: String, path: String?) -> String {
        if command.contains("/") { return command }
        for folder in (path ?? "/usr/local/bin:/usr/bin:/bin").split(separator: ":") {
            let candidate = "\(folder)/\(command)"
            if FileManager.default.isExecutableFile(atPath: candidate) { return candidate }
        }
        return command
    }
}
