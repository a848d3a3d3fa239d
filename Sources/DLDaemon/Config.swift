import DLCore
import DLRPC
import DLStorePostgres
import DLTransfer
import Foundation
import Logging

/// The daemon's effective configuration: defaults from XDG, then the config file, then flags.
/// Every key is documented in docs/configuration.md.
public struct DaemonConfig: Sendable, Equatable {
    public var socket: String
    public var stateDir: String
    public var downloadDir: String
    public var maxActive: Int = 3
    public var logLevel: Logger.Level = .info
    public var maxAttempts: Int = 10
    public var retryBase: Double = 2
    public var retryMaxDelay: Double = 600
    public var connectTimeout: Int = 20
    public var readTimeout: Int = 60
    public var maxLineBytes: Int = 4 << 20
    public var maxConnections: Int = 64
    public var minFree: Int64 = 1 << 30
    public var giveUpAfter: Double = 86_400
    public var checkpointInterval: Double = 2
    public var diskRecheck: Double = 30
    public var groupParallel: Int = 4
    /// Transfers to one host (and port) at once over HTTP/1.1 (connections), as browsers
    /// limit theirs.
    public var maxPerHost: Int = 6
    /// Transfers to one host at once when it answers over HTTP/2 (streams of one connection).
    public var maxStreamsPerHost: Int = HostLimits.defaultMaxStreams
    /// Transfers bound by round trips (small files, first bytes) at once beside the
    /// `max_active` bulk ones; 0 turns that lane off (`Lanes`).
    public var maxLight: Int = Lanes.defaultMaxLight
    /// HTTP/2 where a server offers it over TLS.
    public var http2 = true
    /// Seconds completed and canceled records are kept; 0 keeps them forever.
    public var keepFinished: Double = RetentionPolicy.defaultKeepFinished
    /// Seconds failed records are kept; 0 keeps them forever.
    public var keepFailed: Double = RetentionPolicy.defaultKeepFailed
    /// Ranges one job fetches at once when its server takes ranges (segmented downloads); they
    /// count against `max_per_host`. 1 turns segmented downloads off.
    public var segments: Int = 4
    /// Files with less than this many bytes left to fetch are one stream.
    public var segmentMinSize: Int64 = 4 << 20
    /// Whether jobs that do not say (`metered` at enqueue) may download while NetworkManager
    /// says the connection is metered.
    public var metered = true
    /// Hook commands (argv lists, run without a shell) and their time limit in seconds.
    public var onComplete: [String]?
    public var onError: [String]?
    public var hookTimeout: Int = 30
    /// Folders downloads may be written into; nil: the download folder and $HOME.
    public var allowedRoots: [String]?
    public var maxQueued: Int = 1_000_000
    /// Seconds a connection may stay silent between requests (an event stream is not silent).
    public var idleTimeout: Int = 300
    /// `~/.netrc` by default; "" turns it off.
    public var netrc: String?
    /// `postgresql://…`: the job table in PostgreSQL instead of `<state_dir>/jobs.sqlite`.
    /// Checked when read (`PostgresURL`); its password is never printed.
    public var database: String?
    /// Connections to PostgreSQL at most.
    public var databasePoolSize: Int = 8
    /// This daemon's name among the workers of a shared queue; its worker id is
    /// `<host name>/<worker_name>`. Two daemons with the same id are refused.
    public var workerName: String = "dld"
    /// Seconds a worker's claim on a running job holds without being renewed: a worker that
    /// dies loses its jobs to the others after this long. Renewed every third of it.
    public var lease: Double = 30
    /// TLS trust added to the system store (or to `SSL_CERT_FILE`/`SSL_CERT_DIR`): a PEM
    /// bundle and a folder of PEM certificates.
    public var caFile: String?
    public var caDir: String?
    /// A client certificate (PEM chain) and its unencrypted PEM key, for servers that ask.
    public var clientCert: String?
    public var clientKey: String?
    /// A proxy URL for every request, instead of `http_proxy`, `https_proxy` and `all_proxy`
    /// from the environment; "" for none whatever the environment says; nil: the environment.
    public var proxy: String?
    /// Hosts reached directly (curl's `no_proxy` syntax), instead of the environment's `no_proxy`.
    public var noProxy: String?
    /// The global speed limit in bytes per second (0: none), and limits by time of day over it.
    public var maxSpeed: Int64 = 0
    public var speedSchedule = SpeedSchedule.empty
    /// The URL cache (`get`): its folder, byte budget, how long an unused entry stays, and how
    /// long a copy is fresh when the server says nothing.
    public var cacheDir: String
    public var cacheMaxBytes: Int64 = CachePolicy.defaultMaxBytes
    public var cacheMaxAge: Double = CachePolicy.defaultMaxAgeUnused
    public var cacheDefaultMaxAge: Double = CachePolicy.defaultDefaultMaxAge
    /// The file that was read, if any.
    public var configFile: String?

    /// XDG defaults for this environment.
    public static func defaults(environment: [String: String] = ProcessInfo.processInfo.environment) -> DaemonConfig {
        let home = environment["HOME"].flatMap { $0.hasPrefix("/") ? $0 : nil } ?? NSHomeDirectory()
        func xdg(_ name: String, _ fallback: String) -> String {
            if let value = environment[name], value.hasPrefix("/") { return value }
            return home + "/" + fallback
        }
        let userDirs = xdg("XDG_CONFIG_HOME", ".config") + "/user-dirs.dirs"
        let fromUserDirs = (try? String(contentsOfFile: userDirs, encoding: .utf8)).flatMap { downloadDir(inUserDirs: $0, home: home) }
        return DaemonConfig(
            socket: SocketPath.defaultPath(environment: environment),
            stateDir: xdg("XDG_STATE_HOME", ".local/state") + "/dld",
            downloadDir: environment["XDG_DOWNLOAD_DIR"].flatMap { $0.hasPrefix("/") ? $0 : nil } ?? fromUserDirs ?? home + "/Downloads",
            cacheDir: xdg("XDG_CACHE_HOME", ".cache") + "/dld")
    }

    /// `XDG_DOWNLOAD_DIR="$HOME/Downloads"` from xdg-user-dirs' file (shell syntax, only
    /// `$HOME/…` or absolute paths, as that file is specified).
    static func downloadDir(inUserDirs text: String, home: String) -> String? {
        for line in text.split(separator: "\n") {
            let trimmed = line.trimmingCharacters(in: .whitespaces)
            guard trimmed.hasPrefix("XDG_DOWNLOAD_DIR=") else { continue }
            var value = String(trimmed.dropFirst("XDG_DOWNLOAD_DIR=".count))
            if value.hasPrefix("\""), value.hasSuffix("\""), value.count >= 2 { value = String(value.dropFirst().dropLast()) }
            if value.hasPrefix("$HOME") { value = home + value.dropFirst(5) }
            return value.hasPrefix("/") && value != home && value != home + "/" ? value : nil
        }
        return nil
    }

    public static func defaultConfigFile(environment: [String: String] = ProcessInfo.processInfo.environment) -> String {
        let home = environment["HOME"].flatMap { $0.hasPrefix("/") ? $0 : nil } ?? NSHomeDirectory()
        let base = environment["XDG_CONFIG_HOME"].flatMap { $0.hasPrefix("/") ? $0 : nil } ?? home + "/.config"
        return base + "/dld/config.toml"
    }

    /// Reads a config file over these values. Unknown keys and wrong types are errors that name
    /// the line: a typo must not be ignored.
    public mutating func apply(file path: String) throws {
        let text: String
        do {
            text = try String(contentsOfFile: path, encoding: .utf8)
        } catch {
            throw DaemonError("cannot read config file \(path): \(error.localizedDescription)")
        }
        let entries: [(key: String, value: TOMLLite.Value, line: Int)]
        do {
            entries = try TOMLLite.parse(text)
        } catch {
            throw DaemonError("\(path): \(error)")
        }
        for entry in entries {
            do {
                try set(entry.key, entry.value)
            } catch let error as DaemonError {
                throw DaemonError("\(path): line \(entry.line): \(error.description)")
            }
        }
        if (clientCert == nil) != (clientKey == nil) {
            throw DaemonError("\(path): client_cert and client_key go together; give both or neither")
        }
        configFile = path
    }

    /// Which proxy each URL goes through: `proxy` and `no_proxy` of the config file, else the
    /// environment's variables (curl's rules).
    public func proxyRules(environment: [String: String] = ProcessInfo.processInfo.environment) throws -> (
        rules: ProxyRules, source: ProxyRules.Source, ignored: [String]
    ) {
        do {
            return try ProxyRules.resolve(configProxy: proxy, configNoProxy: noProxy, environment: environment)
        } catch {
            throw DaemonError("proxy: \(error.description)")
        }
    }

    /// The TLS settings of the config file, for the downloader.
    public var tls: TLSSettings {
        TLSSettings(caFiles: caFile.map { [$0] } ?? [], caDirs: caDir.map { [$0] } ?? [], clientCert: clientCert, clientKey: clientKey)
    }

    public static let keys = [
        "socket", "state_dir", "download_dir", "max_active", "log_level", "max_attempts", "retry_base",
        "retry_max_delay", "connect_timeout", "read_timeout", "max_line_bytes", "max_connections", "min_free",
        "give_up_after", "checkpoint_interval", "disk_recheck", "group_parallel", "max_per_host", "on_complete", "on_error", "hook_timeout",
        "allowed_roots", "max_queued", "idle_timeout", "netrc", "database", "database_pool_size", "worker_name", "lease",
        "ca_file", "ca_dir", "client_cert", "client_key", "proxy", "no_proxy", "keep_finished", "keep_failed", "max_speed",
        "speed_schedule", "segments", "segment_min_size", "metered", "cache_dir", "cache_max_bytes", "cache_max_age",
        "cache_default_max_age", "max_light", "max_streams_per_host", "http2",
    ]

    mutating func set(_ key: String, _ value: TOMLLite.Value) throws {
        func string() throws -> String {
            guard case .string(let s) = value else { throw DaemonError("\(key) must be a string") }
            return s
        }
        func path() throws -> String {
            let s = try string()
            guard s.hasPrefix("/") else { throw DaemonError("\(key) must be an absolute path") }
            return s
        }
        func int(_ range: ClosedRange<Int64>) throws -> Int {
            guard case .integer(let i) = value, range.contains(i) else {
                throw DaemonError("\(key) must be an integer from \(range.lowerBound) to \(range.upperBound)")
            }
            return Int(i)
        }
        func seconds() throws -> Double {
            switch value {
            case .integer(let i) where i >= 0: return Double(i)
            case .float(let d) where d >= 0: return d
            default: throw DaemonError("\(key) must be a number of seconds ≥ 0")
            }
        }
        /// Seconds, as a number or as text with a unit ("30d", "12h").
        func duration() throws -> Double {
            switch value {
            case .integer(let i) where i >= 0: return Double(i)
            case .string(let text):
                if let seconds = DurationText.seconds(text) { return seconds }
            default: break
            }
            throw DaemonError("\(key) must be a duration: seconds, or a number with s, m, h, d or w (\"30d\"); 0 keeps forever")
        }
        switch key {
        case "socket": socket = try path()
        case "state_dir": stateDir = try path()
        case "download_dir": downloadDir = try path()
        case "max_active": maxActive = try int(1...64)
        case "log_level":
            guard let level = Logger.Level(rawValue: try string()) else {
                throw DaemonError("log_level must be one of \(Logger.Level.allCases.map(\.rawValue).joined(separator: ", "))")
            }
            logLevel = level
        case "max_attempts": maxAttempts = try int(1...1_000_000)
        case "retry_base": retryBase = try seconds()
        case "retry_max_delay": retryMaxDelay = try seconds()
        case "connect_timeout": connectTimeout = try int(1...3600)
        case "read_timeout": readTimeout = try int(1...86400)
        case "max_line_bytes": maxLineBytes = try int(1024...(64 << 20))
        case "max_connections": maxConnections = try int(1...10_000)
        case "group_parallel": groupParallel = try int(1...64)
        case "max_per_host": maxPerHost = try int(1...64)
        case "max_streams_per_host": maxStreamsPerHost = try int(1...256)
        case "max_light": maxLight = try int(0...256)
        case "http2":
            guard case .bool(let allowed) = value else { throw DaemonError("http2 must be true or false") }
            http2 = allowed
        case "keep_finished": keepFinished = try duration()
        case "keep_failed": keepFailed = try duration()
        case "segments": segments = try int(1...16)
        case "segment_min_size": segmentMinSize = Int64(try int(1...Int64.max))
        case "metered":
            guard case .bool(let allowed) = value else { throw DaemonError("metered must be true or false") }
            metered = allowed
        case "max_queued": maxQueued = try int(1...100_000_000)
        case "idle_timeout": idleTimeout = try int(1...86_400)
        case "netrc":
            let s = try string()
            guard s.isEmpty || s.hasPrefix("/") else { throw DaemonError("netrc must be an absolute path, or \"\" for none") }
            netrc = s
        case "allowed_roots":
            guard case .array(let items) = value else { throw DaemonError("allowed_roots must be an array of absolute paths") }
            var roots: [String] = []
            for item in items {
                guard case .string(let s) = item, s.hasPrefix("/") else {
                    throw DaemonError("allowed_roots must be an array of absolute paths")
                }
                roots.append(s)
            }
            allowedRoots = roots
        case "hook_timeout": hookTimeout = try int(1...86400)
        case "database":
            let text = try string()
            if text.isEmpty {
                database = nil
            } else {
                do {
                    _ = try PostgresURL.parse(text, defaultUser: NSUserName())
                } catch {
                    throw DaemonError("database: \(error)")
                }
                database = text
            }
        case "database_pool_size": databasePoolSize = try int(1...256)
        case "ca_file":
            let file = try path()
            if let problem = TLSFileCheck.certificates(file, what: "CA file") { throw DaemonError("ca_file: \(problem)") }
            caFile = file
        case "ca_dir":
            let dir = try path()
            if let problem = TLSFileCheck.folder(dir, what: "CA folder") { throw DaemonError("ca_dir: \(problem)") }
            caDir = dir
        case "client_cert":
            let file = try path()
            if let problem = TLSFileCheck.certificates(file, what: "client certificate") { throw DaemonError("client_cert: \(problem)") }
            clientCert = file
        case "client_key":
            let file = try path()
            if let problem = TLSFileCheck.privateKey(file, what: "client key") { throw DaemonError("client_key: \(problem)") }
            clientKey = file
        case "proxy":
            let text = try string()
            if !text.isEmpty {
                do {
                    _ = try ProxyServer.parse(text)
                } catch {
                    throw DaemonError("proxy: \(error.description)")
                }
            }
            proxy = text
        case "no_proxy": noProxy = try string()
        case "worker_name":
            let name = try string()
            guard (1...64).contains(name.utf8.count),
                name.unicodeScalars.allSatisfy({
                    $0.isASCII && (CharacterSet.alphanumerics.contains($0) || "-_.".unicodeScalars.contains($0))
                })
            else {
                throw DaemonError("worker_name must be 1 to 64 characters of letters, digits, '-', '_' and '.'")
            }
            workerName = name
        case "lease":
            lease = try seconds()
            guard (3...3600).contains(lease) else { throw DaemonError("lease must be from 3 to 3600 seconds") }
        case "on_complete", "on_error":
            guard case .array(let items) = value, !items.isEmpty else {
                throw DaemonError("\(key) must be a non-empty array of strings: the command and its arguments")
            }
            var argv: [String] = []
            for item in items {
                guard case .string(let s) = item else { throw DaemonError("\(key) must be an array of strings") }
                argv.append(s)
            }
            if key == "on_complete" { onComplete = argv } else { onError = argv }
        case "min_free": minFree = Int64(try int(0...Int64.max))
        case "give_up_after": giveUpAfter = try seconds()
        case "checkpoint_interval":
            checkpointInterval = try seconds()
            guard checkpointInterval >= 0.05 else { throw DaemonError("checkpoint_interval must be at least 0.05 seconds") }
        case "cache_dir": cacheDir = try path()
        case "cache_max_bytes":
            switch value {
            case .integer(let i) where i >= 0: cacheMaxBytes = i
            case .string(let s) where ByteRate.parse(s) != nil: cacheMaxBytes = ByteRate.parse(s) ?? 0
            default: throw DaemonError("cache_max_bytes must be bytes: an integer, or a string such as \"2G\" or \"512M\" (0: no limit)")
            }
        case "cache_max_age": cacheMaxAge = try duration()
        case "cache_default_max_age": cacheDefaultMaxAge = try duration()
        case "max_speed":
            switch value {
            case .integer(let i) where (0...(1 << 40)).contains(i): maxSpeed = i
            case .string(let s) where ByteRate.parse(s) != nil: maxSpeed = ByteRate.parse(s) ?? 0
            default:
                throw DaemonError("max_speed must be bytes per second: an integer, or a string such as \"2M\" or \"512K\" (0: no limit)")
            }
        case "speed_schedule":
            switch SpeedSchedule.parse(try string()) {
            case .success(let schedule): speedSchedule = schedule
            case .failure(let error): throw DaemonError("speed_schedule: \(error.description)")
            }
        case "disk_recheck":
            diskRecheck = try seconds()
            guard diskRecheck >= 0.1 else { throw DaemonError("disk_recheck must be at least 0.1 seconds") }
        default:
            throw DaemonError("unknown key \(key); keys: \(Self.keys.joined(separator: ", "))")
        }
    }

    /// The download folder and $HOME unless configured.
    public var effectiveAllowedRoots: [String] {
        allowedRoots ?? [downloadDir, home]
    }

    /// `<host name>/<worker_name>`: stable across restarts, different on each machine.
    public var workerID: String {
        var buffer = [CChar](repeating: 0, count: 256)
        let host =
            gethostname(&buffer, buffer.count) == 0
            ? String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self) : ""
        return (host.isEmpty ? "localhost" : host) + "/" + workerName
    }

    public var effectiveNetrc: String? {
        if let netrc { return netrc.isEmpty ? nil : netrc }
        return home + "/.netrc"
    }

    var home: String {
        ProcessInfo.processInfo.environment["HOME"].flatMap { $0.hasPrefix("/") ? $0 : nil } ?? NSHomeDirectory()
    }

    /// The configuration as a TOML file that would reproduce it (`dld --print-config`).
    public func rendered() -> String {
        func quote(_ s: String) -> String {
            "\"" + s.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "\"", with: "\\\"") + "\""
        }
        func number(_ d: Double) -> String { d.rounded() == d ? String(Int64(d)) : String(d) }
        var lines = ["# effective dld configuration" + (configFile.map { " (file: \($0))" } ?? " (no config file)")]
        lines.append("socket = \(quote(socket))")
        lines.append("state_dir = \(quote(stateDir))")
        lines.append("download_dir = \(quote(downloadDir))")
        lines.append("max_active = \(maxActive)")
        lines.append("log_level = \(quote(logLevel.rawValue))")
        lines.append("max_attempts = \(maxAttempts)")
        lines.append("retry_base = \(number(retryBase))")
        lines.append("retry_max_delay = \(number(retryMaxDelay))")
        lines.append("connect_timeout = \(connectTimeout)")
        lines.append("read_timeout = \(readTimeout)")
        lines.append("max_line_bytes = \(maxLineBytes)")
        lines.append("max_connections = \(maxConnections)")
        lines.append("min_free = \(minFree)")
        lines.append("give_up_after = \(number(giveUpAfter))")
        lines.append("checkpoint_interval = \(number(checkpointInterval))")
        lines.append("disk_recheck = \(number(diskRecheck))")
        lines.append("group_parallel = \(groupParallel)")
        lines.append("max_per_host = \(maxPerHost)")
        lines.append("max_streams_per_host = \(maxStreamsPerHost)")
        lines.append("max_light = \(maxLight)")
        lines.append("http2 = \(http2)")
        lines.append("keep_finished = \"\(DurationText.describe(keepFinished))\"")
        lines.append("keep_failed = \"\(DurationText.describe(keepFailed))\"")
        lines.append("segments = \(segments)")
        lines.append("segment_min_size = \(segmentMinSize)")
        lines.append("metered = \(metered)")
        lines.append("hook_timeout = \(hookTimeout)")
        if let onComplete { lines.append("on_complete = [\(onComplete.map(quote).joined(separator: ", "))]") }
        if let onError { lines.append("on_error = [\(onError.map(quote).joined(separator: ", "))]") }
        lines.append("allowed_roots = [\(effectiveAllowedRoots.map(quote).joined(separator: ", "))]")
        lines.append("max_queued = \(maxQueued)")
        lines.append("idle_timeout = \(idleTimeout)")
        lines.append("netrc = \(quote(effectiveNetrc ?? ""))")
        // The password stays out of what is printed (it is often pasted into bug reports).
        lines.append("database = \(quote(database.map(PostgresURL.redacted) ?? ""))")
        lines.append("database_pool_size = \(databasePoolSize)")
        lines.append("worker_name = \(quote(workerName))")
        lines.append("lease = \(number(lease))")
        lines.append("max_speed = \(maxSpeed == 0 ? "0" : quote(ByteRate.format(maxSpeed)))")
        lines.append("cache_dir = \(quote(cacheDir))")
        lines.append("cache_max_bytes = \(cacheMaxBytes)")
        lines.append("cache_max_age = \"\(DurationText.describe(cacheMaxAge))\"")
        lines.append("cache_default_max_age = \"\(DurationText.describe(cacheDefaultMaxAge))\"")
        if !speedSchedule.isEmpty { lines.append("speed_schedule = \(quote(speedSchedule.text))") }
        if let caFile { lines.append("ca_file = \(quote(caFile))") }
        if let caDir { lines.append("ca_dir = \(quote(caDir))") }
        if let clientCert { lines.append("client_cert = \(quote(clientCert))") }
        if let clientKey { lines.append("client_key = \(quote(clientKey))") }
        // Credentials in a proxy URL are shown as ***, as the database's password.
        if let proxy { lines.append("proxy = \(quote(ProxyServer.redacted(proxy)))") }
        if let noProxy { lines.append("no_proxy = \(quote(noProxy))") }
        if let (rules, source, ignored) = try? proxyRules(), source == .environment || !ignored.isEmpty {
            for line in rules.summary { lines.append("# from the environment: \(line)") }
            for line in ignored { lines.append("# ignored: \(line)") }
        }
        return lines.joined(separator: "\n") + "\n"
    }
}

/// A configuration printed or logged whole (by a library's debug log, say) shows the
/// database's connection string without its password.
extension DaemonConfig: CustomStringConvertible, CustomDebugStringConvertible {
    public var description: String {
        var shown = self
        shown.database = database.map(PostgresURL.redacted)
        shown.proxy = proxy.map(ProxyServer.redacted)
        return "DaemonConfig("
            + Mirror(reflecting: shown).children.map { "\($0.label ?? ""): \(String(reflecting: $0.value))" }.joined(separator: ", ") + ")"
    }

    public var debugDescription: String { description }
}

extension DaemonConfig {
    /// The URL cache's policy from these settings.
    public var cachePolicy: CachePolicy {
        CachePolicy(defaultMaxAge: cacheDefaultMaxAge, maxBytes: cacheMaxBytes, maxAge: cacheMaxAge)
    }
}
