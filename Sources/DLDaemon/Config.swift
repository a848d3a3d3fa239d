import DLCore
import DLEngine
import DLRPC
import DLStorePostgres
import DLTransfer
import Foundation
import Logging

/// The daemon's effective configuration: defaults from XDG, then the config file, then flags.
/// Every key is an entry of `table` below and a row of docs/configuration.md.
public struct DaemonConfig: Sendable, Equatable {
    public var socket: String
    public var stateDir: String
    public var downloadDir: String
    public var maxActive: Int = EngineConfiguration.Default.maxActive
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
    public var groupParallel: Int = EngineConfiguration.Default.groupParallel
    /// Transfers to one host (and port) at once over HTTP/1.1 (connections), as browsers
    /// limit theirs.
    public var maxPerHost: Int = EngineConfiguration.Default.maxPerHost
    /// Transfers to one host at once when it answers over HTTP/2 (streams of one connection).
    public var maxStreamsPerHost: Int = HostLimits.defaultMaxStreams
    /// Transfers bound by round trips (small files, first bytes) at once beside the
    /// `max_active` bulk ones; 0 turns that lane off (`Lanes`).
    public var maxLight: Int = Lanes.defaultMaxLight
    /// HTTP/2 where a server offers it over TLS.
    public var http2 = true
    /// `metalink_location`: a country code whose Metalink mirrors go first; "" for none.
    public var metalinkLocation = ""
    /// Seconds completed and canceled records are kept; 0 keeps them forever.
    public var keepFinished: Double = RetentionPolicy.defaultKeepFinished
    /// Seconds failed records are kept; 0 keeps them forever.
    public var keepFailed: Double = RetentionPolicy.defaultKeepFailed
    /// Ranges one job fetches at once when its server takes ranges (segmented downloads); they
    /// count against `max_per_host`. 1 turns segmented downloads off.
    public var segments: Int = EngineConfiguration.Default.segments
    /// Files with less than this many bytes left to fetch are one stream.
    public var segmentMinSize: Int64 = EngineConfiguration.Default.segmentMinSize
    /// Whether jobs that do not say (`metered` at enqueue) may download while NetworkManager
    /// says the connection is metered.
    public var metered = true
    /// Hook commands (argv lists, run without a shell) and their time limit in seconds.
    public var onComplete: [String]?
    public var onError: [String]?
    public var hookTimeout: Int = 30
    /// Folders downloads may be written into; nil: the download folder and $HOME.
    public var allowedRoots: [String]?
    public var maxQueued: Int = EngineConfiguration.Default.maxQueued
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
    public var lease: Double = EngineConfiguration.Default.lease
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
    /// The HTTP listener (POST /rpc, GET /ws): an address `host:port`, "" for none; nil: the
    /// default, 127.0.0.1:6802 or the next free port up to 6811 (`HTTPListenerSettings`).
    public var httpListen: String?
    /// Host names besides the listener's own that requests may name (a reverse proxy's).
    public var httpHosts: [String]?
    /// Origins besides the listener's own that may call /rpc, /jsonrpc and /ws with the token
    /// (a page elsewhere, a browser extension), lowercased; they get CORS headers.
    public var httpOrigins: [String]?
    /// TLS for the listener: a PEM certificate chain and its unencrypted PEM key.
    public var httpCert: String?
    public var httpKey: String?
    /// Whether the listener may serve beyond loopback without TLS (behind a TLS proxy, say).
    public var httpAllowInsecure = false
    /// aria2's JSON-RPC on a listener of its own (`host:port`, aria2's 6800 say); nil: only
    /// on `/jsonrpc` of the HTTP listener (docs/aria2.md).
    public var aria2Listen: String?
    /// The secret of aria2's calls (`token:SECRET`); nil: the HTTP token.
    public var aria2Secret: String?
    /// The drop folder: input lists dropped there are enqueued (`DropFolderWatch`); "" for none.
    public var watchDir = ""
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
        if (httpCert == nil) != (httpKey == nil) {
            throw DaemonError("\(path): http_cert and http_key go together; give both or neither")
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

    /// Every key of the config file, in the order `--print-config` writes them. The parser,
    /// `--print-config`, a reload (which keeps the `.restart` keys as they were) and the test
    /// of docs/configuration.md all read this table: a new key is one entry here, a property
    /// above (with its default), and a row in the docs.
    public static let table: [ConfigKey] = [
        .path("socket", \.socket, .restart, "The control socket."),
        .path("state_dir", \.stateDir, .restart, "The folder of the job table and the lock."),
        .path("download_dir", \.downloadDir, .live, "Where a job goes that names no folder."),
        .int("max_active", \.maxActive, 1...64, .live, "Bulk transfers at once (more than 2 MiB left)."),
        ConfigKey(
            "log_level", \.logLevel, .live, "trace, debug, info, notice, warning, error or critical.", parse: { try $0.logLevel() },
            render: { TOMLText.quote($0.logLevel.rawValue) }),
        .int("max_attempts", \.maxAttempts, 1...1_000_000, .live, "Attempts in a row without progress before a job fails."),
        .seconds("retry_base", \.retryBase, .live, "The backoff's base delay."),
        .seconds("retry_max_delay", \.retryMaxDelay, .live, "The backoff's longest delay, and Retry-After's."),
        .int("connect_timeout", \.connectTimeout, 1...3600, .restart, "Seconds to connect to a server."),
        .int("read_timeout", \.readTimeout, 1...86400, .restart, "Seconds without a byte before a transfer fails."),
        .int("max_line_bytes", \.maxLineBytes, 1024...(64 << 20), .live, "The longest request line on the socket."),
        .int("max_connections", \.maxConnections, 1...10_000, .live, "Socket connections open at once."),
        .int("min_free", \.minFree, 0...Int64.max, .live, "Bytes a transfer leaves free on its filesystem."),
        .seconds("give_up_after", \.giveUpAfter, .live, "Seconds without progress before a job fails."),
        .seconds("checkpoint_interval", \.checkpointInterval, atLeast: 0.05, .live, "How often a transfer syncs and records its offset."),
        .seconds("disk_recheck", \.diskRecheck, atLeast: 0.1, .live, "How often a job waiting for disk space looks again."),
        .int("group_parallel", \.groupParallel, 1...64, .live, "Bulk members of one group at once."),
        .int("max_per_host", \.maxPerHost, 1...64, .live, "Connections to one host at once over HTTP/1.1."),
        .int("max_streams_per_host", \.maxStreamsPerHost, 1...256, .live, "Transfers to one host at once over HTTP/2."),
        .int("max_light", \.maxLight, 0...256, .live, "Small transfers at once beside the bulk ones; 0: no light lane."),
        .bool("http2", \.http2, .restart, "HTTP/2 where a server offers it over TLS."),
        ConfigKey(
            "metalink_location", \.metalinkLocation, .live, "Country code (ISO 3166, e.g. \"de\") whose Metalink mirrors go first.",
            parse: { try $0.metalinkLocation() }, render: { $0.metalinkLocation.isEmpty ? nil : TOMLText.quote($0.metalinkLocation) }),
        .duration("keep_finished", \.keepFinished, .live, "How long records of completed and canceled jobs stay; 0: forever."),
        .duration("keep_failed", \.keepFailed, .live, "How long records of failed jobs stay; 0: forever."),
        .int("segments", \.segments, 1...16, .live, "Byte ranges one job fetches at once; 1: not segmented."),
        .int("segment_min_size", \.segmentMinSize, 1...Int64.max, .live, "Bytes left under which a file is one stream."),
        .bool("metered", \.metered, .live, "Whether jobs that do not say may download on a metered connection."),
        .int("hook_timeout", \.hookTimeout, 1...86400, .live, "Seconds a hook may run."),
        .command("on_complete", \.onComplete, .live, "A command run when a job or a group completes."),
        .command("on_error", \.onError, .live, "A command run when a job or a group fails."),
        ConfigKey(
            "allowed_roots", \.allowedRoots, .live, "Folders downloads may be written into.", parse: { try $0.absolutePaths() },
            render: { TOMLText.array($0.effectiveAllowedRoots) }),
        .int("max_queued", \.maxQueued, 1...100_000_000, .live, "Unfinished jobs at most."),
        .int("idle_timeout", \.idleTimeout, 1...86_400, .live, "Seconds a silent socket connection stays open."),
        ConfigKey(
            "netrc", \.netrc, .live, "The netrc file of credentials by host; \"\" for none.", parse: { try $0.netrc() },
            render: { TOMLText.quote($0.effectiveNetrc ?? "") }),
        // The password stays out of what is printed (it is often pasted into bug reports).
        ConfigKey(
            "database", \.database, .restart, "postgresql://…: the job table in PostgreSQL.", parse: { try $0.database() },
            render: { TOMLText.quote($0.database.map(PostgresURL.redacted) ?? "") }),
        .int("database_pool_size", \.databasePoolSize, 1...256, .restart, "Connections to PostgreSQL at most."),
        ConfigKey(
            "worker_name", \.workerName, .restart, "This daemon's name among the workers of a shared queue.",
            parse: { try $0.workerName() }, render: { TOMLText.quote($0.workerName) }),
        .seconds("lease", \.lease, atLeast: 3, atMost: 3600, .restart, "Seconds a worker's claim on a job holds unrenewed."),
        ConfigKey(
            "max_speed", \.maxSpeed, .live, "The global speed limit in bytes per second; 0: none.",
            parse: { try $0.bytes(atMost: 1 << 40, "bytes per second: an integer, or a string such as \"2M\" or \"512K\" (0: no limit)") },
            render: { $0.maxSpeed == 0 ? "0" : TOMLText.quote(ByteRate.format($0.maxSpeed)) }),
        .path("cache_dir", \.cacheDir, .restart, "The URL cache's folder."),
        ConfigKey(
            "cache_max_bytes", \.cacheMaxBytes, .live, "The URL cache's byte budget; 0: none.",
            parse: { try $0.bytes(atMost: Int64.max, "bytes: an integer, or a string such as \"2G\" or \"512M\" (0: no limit)") },
            render: { "\($0.cacheMaxBytes)" }),
        .duration("cache_max_age", \.cacheMaxAge, .live, "How long an unused cache entry stays; 0: forever."),
        .duration("cache_default_max_age", \.cacheDefaultMaxAge, .live, "How long a copy is fresh when the server says nothing."),
        ConfigKey(
            "speed_schedule", \.speedSchedule, .live, "Global speed limits by time of day.", parse: { try $0.speedSchedule() },
            render: { $0.speedSchedule.isEmpty ? nil : TOMLText.quote($0.speedSchedule.text) }),
        .tlsPath("ca_file", \.caFile, .restart, "PEM certificates trusted beside the system's.") {
            TLSFileCheck.certificates($0, what: "CA file")
        },
        .tlsPath("ca_dir", \.caDir, .restart, "A folder of PEM certificates trusted beside the system's.") {
            TLSFileCheck.folder($0, what: "CA folder")
        },
        .tlsPath("client_cert", \.clientCert, .restart, "A client certificate for servers that ask.") {
            TLSFileCheck.certificates($0, what: "client certificate")
        },
        .tlsPath("client_key", \.clientKey, .restart, "The client certificate's unencrypted key.") {
            TLSFileCheck.privateKey($0, what: "client key")
        },
        // Credentials in a proxy URL are shown as ***, as the database's password.
        ConfigKey(
            "proxy", \.proxy, .restart, "A proxy for every URL instead of the environment's; \"\" for none.", parse: { try $0.proxy() },
            render: { $0.proxy.map { TOMLText.quote(ProxyServer.redacted($0)) } }),
        ConfigKey(
            "no_proxy", \.noProxy, .restart, "Hosts reached directly, instead of the environment's no_proxy.", parse: { try $0.string() },
            render: { $0.noProxy.map(TOMLText.quote) }),
        // Printed only when set: unset, a busy default port moves on to the next free one.
        ConfigKey(
            "http_listen", \.httpListen, .restart, "The HTTP listener's address, host:port; \"\" for none.",
            parse: { try $0.httpListen() }, render: { $0.httpListen.map(TOMLText.quote) }),
        ConfigKey(
            "http_hosts", \.httpHosts, .restart, "Host names besides the listener's own that requests may name.",
            parse: { try $0.hostNames() }, render: { $0.httpHosts.map(TOMLText.array) }),
        ConfigKey(
            "http_origins", \.httpOrigins, .restart, "Origins besides the listener's own that may call with the token (CORS).",
            parse: { try $0.origins() }, render: { $0.httpOrigins.map(TOMLText.array) }),
        .tlsPath("http_cert", \.httpCert, .restart, "The HTTP listener's TLS certificate chain (PEM).") {
            TLSFileCheck.certificates($0, what: "HTTP certificate")
        },
        .tlsPath("http_key", \.httpKey, .restart, "The HTTP listener's unencrypted TLS key (PEM).") {
            TLSFileCheck.privateKey($0, what: "HTTP key")
        },
        .bool("http_allow_insecure", \.httpAllowInsecure, .restart, "Whether HTTP may listen beyond loopback without TLS."),
        // Printed only when set: aria2's protocol is served on /jsonrpc of the HTTP listener anyway.
        ConfigKey(
            "aria2_listen", \.aria2Listen, .restart, "A listener of its own for aria2's JSON-RPC, host:port (off by default).",
            parse: { try $0.aria2Listen() }, render: { $0.aria2Listen.map(TOMLText.quote) }),
        ConfigKey(
            "aria2_secret", \.aria2Secret, .restart, "The secret of aria2's calls (token:SECRET) instead of the HTTP token.",
            parse: { try $0.aria2Secret() }, render: { $0.aria2Secret.map { _ in TOMLText.quote("***") } }),
        // Printed only when set, as the other folders that are off by default.
        ConfigKey(
            "watch_dir", \.watchDir, .restart, "A drop folder: input lists put there are enqueued; \"\" for none.",
            parse: { try $0.watchDir() }, render: { $0.watchDir.isEmpty ? nil : TOMLText.quote($0.watchDir) }),
    ]

    /// The names, in the table's order, for messages.
    public static var keys: [String] { table.map(\.name) }

    mutating func set(_ key: String, _ value: TOMLLite.Value) throws {
        guard let entry = Self.table.first(where: { $0.name == key }) else {
            throw DaemonError("unknown key \(key); keys: \(Self.keys.joined(separator: ", "))")
        }
        try entry.parse(ConfigValue(key: key, value: value), &self)
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
        var lines = ["# effective dld configuration" + (configFile.map { " (file: \($0))" } ?? " (no config file)")]
        for key in Self.table {
            if let value = key.render(self) { lines.append("\(key.name) = \(value)") }
        }
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

// The readers of the keys that are their own type, for `DaemonConfig.table`.
extension ConfigValue {
    func logLevel() throws -> Logger.Level {
        guard let level = Logger.Level(rawValue: try string()) else {
            throw DaemonError("\(key) must be one of \(Logger.Level.allCases.map(\.rawValue).joined(separator: ", "))")
        }
        return level
    }

    /// An absolute folder, or "" for none; not "/" (its sub-folders would be dld's).
    func watchDir() throws -> String {
        let s = try string()
        guard s.isEmpty || (s.hasPrefix("/") && s != "/") else {
            throw DaemonError("\(key) must be an absolute path of a folder, or \"\" for none")
        }
        return s
    }

    func netrc() throws -> String {
        let s = try string()
        guard s.isEmpty || s.hasPrefix("/") else { throw DaemonError("\(key) must be an absolute path, or \"\" for none") }
        return s
    }

    /// A PostgreSQL URL, checked now so that a typo stops dld before it starts; "": SQLite.
    func database() throws -> String? {
        let text = try string()
        if text.isEmpty { return nil }
        do {
            _ = try PostgresURL.parse(text, defaultUser: NSUserName())
        } catch {
            throw DaemonError("\(key): \(error)")
        }
        return text
    }

    /// Part of the worker id `<host name>/<worker_name>`, so no '/' and nothing a log would garble.
    func workerName() throws -> String {
        let name = try string()
        guard (1...64).contains(name.utf8.count),
            name.unicodeScalars.allSatisfy({
                $0.isASCII && (CharacterSet.alphanumerics.contains($0) || "-_.".unicodeScalars.contains($0))
            })
        else {
            throw DaemonError("\(key) must be 1 to 64 characters of letters, digits, '-', '_' and '.'")
        }
        return name
    }

    /// Two ASCII letters (ISO 3166-1 alpha-2, as Metalink's `location`), or "" for none.
    func metalinkLocation() throws -> String {
        let code = try string()
        guard code.isEmpty || (code.utf8.count == 2 && code.unicodeScalars.allSatisfy({ $0.isASCII && CharacterSet.letters.contains($0) }))
        else {
            throw DaemonError("\(key) must be a two-letter country code such as \"de\", or \"\" for none")
        }
        return code.lowercased()
    }

    func speedSchedule() throws -> SpeedSchedule {
        switch SpeedSchedule.parse(try string()) {
        case .success(let schedule): return schedule
        case .failure(let error): throw DaemonError("\(key): \(error.description)")
        }
    }

    /// `host:port` with an IP address (or localhost), checked now; "" turns the listener off.
    func httpListen() throws -> String {
        let text = try string()
        if text.isEmpty { return text }
        do {
            _ = try HTTPAddress.parse(text)
        } catch {
            throw DaemonError("\(key): \(error)")
        }
        return text
    }

    /// Origins as a browser writes them: `http(s)://host[:port]` without a path, or an
    /// extension's `chrome-extension://ID` / `moz-extension://ID`; `null` and `*` are refused.
    func origins() throws -> [String] {
        guard case .array(let items) = value else { throw DaemonError("\(key) must be an array of origins") }
        return try items.map {
            guard case .string(let s) = $0, let origin = Self.origin(s) else {
                throw DaemonError(
                    "\(key) must be an array of origins: http(s)://host[:port], chrome-extension://ID or moz-extension://ID (no path, no *)"
                )
            }
            return origin
        }
    }

    /// The origin, lowercased, or nil when it is not one.
    static func origin(_ text: String) -> String? {
        let value = text.lowercased()
        guard value.utf8.count <= 300, let separator = value.range(of: "://") else { return nil }
        let scheme = value[..<separator.lowerBound]
        let authority = value[separator.upperBound...]
        guard ["http", "https", "chrome-extension", "moz-extension"].contains(scheme), !authority.isEmpty,
            authority.unicodeScalars.allSatisfy({
                $0.isASCII && (CharacterSet.alphanumerics.contains($0) || "-.:[]".unicodeScalars.contains($0))
            })
        else { return nil }
        return value
    }

    /// `host:port` as `http_listen`, but not "": leave the key out for none.
    func aria2Listen() throws -> String {
        let text = try string()
        do {
            _ = try HTTPAddress.parse(text)
        } catch {
            throw DaemonError("\(key): \(error)")
        }
        return text
    }

    /// A secret of at least 8 characters, printable ASCII without spaces, as clients type it.
    func aria2Secret() throws -> String {
        let text = try string()
        guard (8...256).contains(text.utf8.count), text.utf8.allSatisfy({ (33...126).contains($0) }) else {
            throw DaemonError("\(key) must be 8 to 256 printable ASCII characters without spaces")
        }
        return text
    }

    /// Names a Host header may carry: a DNS name or an address, with or without `:port`.
    func hostNames() throws -> [String] {
        guard case .array(let items) = value else { throw DaemonError("\(key) must be an array of host names") }
        return try items.map {
            guard case .string(let s) = $0, (1...255).contains(s.utf8.count),
                s.unicodeScalars.allSatisfy({
                    $0.isASCII && (CharacterSet.alphanumerics.contains($0) || "-.:[]".unicodeScalars.contains($0))
                })
            else { throw DaemonError("\(key) must be an array of host names (letters, digits, '-', '.', and :port)") }
            return s.lowercased()
        }
    }

    /// A proxy URL, checked now; "" stays "" (no proxy whatever the environment says).
    func proxy() throws -> String {
        let text = try string()
        if !text.isEmpty {
            do {
                _ = try ProxyServer.parse(text)
            } catch {
                throw DaemonError("\(key): \(error.description)")
            }
        }
        return text
    }
}
