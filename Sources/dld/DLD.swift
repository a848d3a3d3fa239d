import ArgumentParser
import DLCore
import DLDaemon
import Foundation
import Logging

/// `dld`: parse flags, read the config, run the daemon (or `dld migrate`). Everything else is
/// in DLDaemon.
@main
struct DLD: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "dld",
        abstract: "The dld download daemon.",
        discussion:
            "Reads $XDG_CONFIG_HOME/dld/config.toml when it exists; flags override it. SIGHUP reads it again without stopping transfers. The keys are in dld.conf(5) and docs/configuration.md; running under systemd (Type=notify, dld.socket) in docs/operations.md.",
        version: "dld \(DLDVersion.current) (protocol \(DLDVersion.protocolVersion))",
        subcommands: [Serve.self, Migrate.self],
        defaultSubcommand: Serve.self)
}

/// The options every subcommand reads the configuration with.
struct ConfigOptions: ParsableArguments {
    @Option(help: "Control socket path.") var socket: String?
    @Option(name: .customLong("state-dir"), help: "Folder of the job table and lock.") var stateDir: String?
    @Option(name: .customLong("download-dir"), help: "Default folder for downloads.") var downloadDir: String?
    @Option(name: .customLong("max-active"), help: "Transfers at once (1 = strictly one at a time).") var maxActive: Int?
    @Option(help: "Config file (default: $XDG_CONFIG_HOME/dld/config.toml).") var config: String?
    @Option(name: .customLong("log-level"), help: "trace, debug, info, notice, warning, error or critical.") var logLevel: String?
    @Option(name: .customLong("http-listen"), help: "The HTTP listener's address, host:port; \"\" for none (default 127.0.0.1:6802).")
    var httpListen: String?

    /// Defaults, then the config file, then these flags.
    func effective() throws -> DaemonConfig {
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
            if let httpListen {
                if !httpListen.isEmpty {
                    do {
                        _ = try HTTPAddress.parse(httpListen)
                    } catch {
                        throw ValidationError("--http-listen: \(error)")
                    }
                }
                effective.httpListen = httpListen
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
        return effective
    }

    private func absolute(_ path: String) -> String {
        let expanded = (path as NSString).expandingTildeInPath
        if expanded.hasPrefix("/") { return expanded }
        return FileManager.default.currentDirectoryPath + "/" + expanded
    }
}

/// Log lines on stderr, with the journal's priority prefixes when stderr is the journal; the
/// level can change later (a reloaded `log_level`).
func bootstrapLogging(_ level: Logger.Level) -> Logger {
    DaemonLogHandler.level.withLock { $0 = level }
    LoggingSystem.bootstrap { DaemonLogHandler(label: $0) }
    return Logger(label: "dld")
}

/// `dld` (the default): runs the daemon until SIGTERM, SIGINT or a `shutdown` request.
struct Serve: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "serve", abstract: "Run the daemon (what `dld` does without a subcommand).")

    @OptionGroup var options: ConfigOptions
    @Flag(name: .customLong("print-config"), help: "Print the effective configuration and exit.") var printConfig = false

    func run() async throws {
        let effective = try options.effective()
        if printConfig {
            print(effective.rendered(), terminator: "")
            return
        }
        let logger = bootstrapLogging(effective.logLevel)
        do {
            let options = self.options
            try await Daemon.run(config: effective, logger: logger) {
                do {
                    return try options.effective()
                } catch let error as ValidationError {
                    throw DaemonError(error.message)
                }
            }
        } catch let error as DaemonError {
            FileHandle.standardError.write(Data("dld: \(error.description)\n".utf8))
            throw ExitCode(1)
        }
    }
}

/// `dld migrate --to postgresql://…`: the SQLite job table copied into PostgreSQL.
struct Migrate: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Copy the job table (<state_dir>/jobs.sqlite) into an empty PostgreSQL database.",
        discussion: """
            Stop dld first. Jobs, groups and events keep their ids; the SQLite file is left as it was. \
            Then set database = "postgresql://…" in the config and start dld. See docs/operations.md.
            """)

    @OptionGroup var options: ConfigOptions
    @Option(help: "The PostgreSQL connection string, postgresql://user[:password]@host[:port]/database.") var to: String

    func run() async throws {
        let effective = try options.effective()
        // Quiet unless asked: the summary is the output.
        let logger = bootstrapLogging(max(effective.logLevel, .warning))
        do {
            let summary = try await TableMigration.run(stateDir: effective.stateDir, to: to, logger: logger)
            print("copied \(summary.jobs) jobs, \(summary.groups) groups and \(summary.events) events to \(TableMigration.redacted(to))")
            print(
                "now set database = \"\(TableMigration.redacted(to))\" in \(effective.configFile ?? DaemonConfig.defaultConfigFile()) (with the password) and start dld"
            )
        } catch let error as DaemonError {
            FileHandle.standardError.write(Data("dld migrate: \(error.description)\n".utf8))
            throw ExitCode(1)
        }
    }
}
