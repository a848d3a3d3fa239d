import ArgumentParser
import DLDaemon
import Foundation
import Logging

/// `dld`: parse flags, read the config, run the daemon. Everything else is in DLDaemon.
@main
struct DLD: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "dld",
        abstract: "The dld download daemon.",
        discussion: "Reads $XDG_CONFIG_HOME/dld/config.toml when it exists; flags override it. See docs/configuration.md.")

    @Option(help: "Control socket path.") var socket: String?
    @Option(name: .customLong("state-dir"), help: "Folder of the job table and lock.") var stateDir: String?
    @Option(name: .customLong("download-dir"), help: "Default folder for downloads.") var downloadDir: String?
    @Option(name: .customLong("max-active"), help: "Transfers at once (1 = strictly one at a time).") var maxActive: Int?
    @Option(help: "Config file (default: $XDG_CONFIG_HOME/dld/config.toml).") var config: String?
    @Option(name: .customLong("log-level"), help: "trace, debug, info, notice, warning, error or critical.") var logLevel: String?
    @Flag(name: .customLong("print-config"), help: "Print the effective configuration and exit.") var printConfig = false

    func run() async throws {
        var effective = DaemonConfig.defaults()
        do {
            if let config {
                try effective.apply(file: absolute(config))
            } else {
                let file = DaemonConfig.defaultConfigFile()
                if FileManager.default.fileExists(atPath: file) { try effective.apply(file: file) }
            }
            if let socket { effective.socket = absolute(socket) }
            if let stateDir { effective.stateDir = absolute(stateDir) }
            if let downloadDir { effective.downloadDir = absolute(downloadDir) }
            if let maxActive {
                guard (1...64).contains(maxActive) else { throw ValidationError("--max-active must be from 1 to 64") }
                effective.maxActive = maxActive
            }
            if let logLevel {
                guard let level = Logger.Level(rawValue: logLevel) else {
                    throw ValidationError("--log-level must be one of \(Logger.Level.allCases.map(\.rawValue).joined(separator: ", "))")
                }
                effective.logLevel = level
            }
        } catch let error as DaemonError {
            throw ValidationError(error.description)
        }
        if printConfig {
            print(effective.rendered(), terminator: "")
            return
        }
        let level = effective.logLevel
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = level
            return handler
        }
        let logger = Logger(label: "dld")
        do {
            try await Daemon.run(config: effective, logger: logger)
        } catch let error as DaemonError {
            FileHandle.standardError.write(Data("dld: \(error.description)\n".utf8))
            throw ExitCode(1)
        }
    }

    private func absolute(_ path: String) -> String {
        let expanded = (path as NSString).expandingTildeInPath
        if expanded.hasPrefix("/") { return expanded }
        return FileManager.default.currentDirectoryPath + "/" + expanded
    }
}
