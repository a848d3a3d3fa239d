import DLCore
import DLEngine
import Foundation
import Logging

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
        environment["DLD_URL"] = URLRules.redacted(notice.url)
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
