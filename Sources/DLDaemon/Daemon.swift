import CDLSystem
import DLCore
import DLEngine
import DLRPC
import DLJobTable
import DLStore
import DLStorePostgres
import DLTransfer
import Foundation
import Logging
import NIOCore
import ServiceLifecycle
import Synchronization
import UnixSignals

/// Wires the daemon together and runs it until SIGTERM, SIGINT or a `shutdown` request.
public enum Daemon {
    /// - Parameter reload: reads the configuration again (the file, then the flags), for SIGHUP.
    public static func run(config: DaemonConfig, logger: Logger, reload: (@Sendable () throws -> DaemonConfig)? = nil) async throws {
        // glibc gives each thread that allocates an arena of its own; dld's thread pools then
        // keep a freed reply's memory several times over. Two arenas keep RSS near what is used.
        _ = dld_limit_malloc_arenas(2)
        // Large buffers (a request line, a page of `list`, a batch of inserts) come and go. Left
        // to itself glibc raises its mapping threshold after the first large free, so later
        // ones stay in the heap for good: blocks of 1 MiB and more are mapped on their own, and
        // the heap's top is given back past 4 MiB free. That lowered the peak RSS with 100 000
        // jobs, with enqueue and list as fast (docs/benchmarks.md, "What was tried": glibc's
        // thresholds). The MALLOC_*_THRESHOLD_ variables, when set, win.
        let environment = ProcessInfo.processInfo.environment
        if environment["MALLOC_MMAP_THRESHOLD_"] == nil && environment["MALLOC_TRIM_THRESHOLD_"] == nil {
            _ = dld_malloc_thresholds(1 << 20, 4 << 20)
        }
        if let old = try Folders.ensure(config.stateDir, mode: 0o700) {
            logger.warning("state folder had mode \(String(old, radix: 8)); set to 700", metadata: ["path": "\(config.stateDir)"])
        }
        let lock = try StateLock(stateDir: config.stateDir)
        let (store, databaseLock) = try await openStore(config, logger: logger)
        // A socket handed over by systemd (dld.socket) is served as it is: its folder and mode
        // are the unit's; the socket path of the configuration is then only a name.
        let adopted = try SocketActivation.adopt()
        if adopted.control == nil { try prepareSocketFolder(config.socket, logger: logger) }
        if !FileManager.default.fileExists(atPath: config.downloadDir) {
            try? FileManager.default.createDirectory(atPath: config.downloadDir, withIntermediateDirectories: true)
        }

        var downloaderConfig = DownloaderConfiguration()
        downloaderConfig.connectTimeout = .seconds(Int64(config.connectTimeout))
        downloaderConfig.readTimeout = .seconds(Int64(config.readTimeout))
        downloaderConfig.connectionsPerHost = config.maxPerHost
        downloaderConfig.http2 = config.http2
        downloaderConfig.tls = config.tls
        let (systemTrust, ignored) = SystemTrust.fromEnvironment(ProcessInfo.processInfo.environment)
        downloaderConfig.systemTrust = systemTrust
        for entry in ignored {
            logger.warning("\(entry) does not exist or is not the right kind of file; it is not used")
        }
        if let file = systemTrust.certFile { logger.info("trusted certificates from SSL_CERT_FILE", metadata: ["path": "\(file)"]) }
        if !systemTrust.certDirs.isEmpty {
            logger.info("trusted certificates from SSL_CERT_DIR", metadata: ["path": "\(systemTrust.certDirs.joined(separator: ":"))"])
        }
        let (proxies, proxySource, ignoredProxies) = try config.proxyRules()
        downloaderConfig.proxies = proxies
        for entry in ignoredProxies { logger.warning("\(entry); that variable is not used") }
        for line in proxies.summary {
            logger.info("proxy: \(line)", metadata: ["from": "\(proxySource == .config ? "config" : "environment")"])
        }
        let downloader = Downloader(configuration: downloaderConfig, logger: logger)
        let bootGuard = BootGuard(stateDir: config.stateDir)
        let failedStarts = bootGuard.starting()
        var queuePausedReason: String? = nil
        if failedStarts >= BootGuard.limit {
            queuePausedReason =
                "the last \(failedStarts) start-ups of dld did not finish; the queue is paused so that it does not crash again. Read the log, then run `dlctl queue resume`"
        }
        var engineConfiguration = EngineConfiguration(
            downloadDir: config.downloadDir, maxActive: config.maxActive,
            backoff: BackoffPolicy(
                base: config.retryBase, cap: config.retryMaxDelay, maxAttempts: config.maxAttempts,
                giveUpAfter: config.giveUpAfter, diskRecheck: config.diskRecheck),
            diskSpace: DiskSpacePolicy(minFree: config.minFree),
            checkpoints: CheckpointPolicy(interval: config.checkpointInterval),
            queuePausedReason: queuePausedReason)
        applyLive(config, policy: pathPolicy(config), to: &engineConfiguration)
        engineConfiguration.worker = config.workerID
        engineConfiguration.lease = config.lease
        // DLD_TEST_BOOT_ID_FILE: for tests only, a file that stands for the kernel's boot id, so
        // that a simulated power cut and reboot (tests' powercutfs) starts a new boot.
        let bootIDFile = ProcessInfo.processInfo.environment["DLD_TEST_BOOT_ID_FILE"].flatMap { $0.isEmpty ? nil : $0 }
        engineConfiguration.bootID = bootIDFile.map { Engine.currentBootID(path: $0) } ?? Engine.currentBootID()
        let clockOffset = testClockOffset(environment, logger: logger)
        let engine = Engine(
            store: store, downloader: downloader,
            configuration: engineConfiguration,
            logger: logger, now: { Date().addingTimeInterval(clockOffset) })
        let hub = EventHub()
        store.setEventSink(wanted: { hub.subscriberCount > 0 }) { hub.publish($0) }
        let hooks = Reloadable(
            HookRunner(
                onComplete: config.onComplete, onError: config.onError, timeout: .seconds(config.hookTimeout), logger: logger))
        let cache = URLCache.open(
            dir: config.cacheDir, policy: config.cachePolicy, engine: engine, hub: hub, downloader: downloader,
            sharedQueue: store.sharesQueue, logger: logger)
        // Counts from here on, before the queue starts (docs/operations.md, "Metrics").
        let metrics = Metrics(engine: engine, cache: cache)
        await engine.setOnFinished {
            hooks.value.finished($0)
            metrics.finished($0)
        }
        await engine.setOnCommit { metrics.committed($0) }
        let service = DaemonService(
            config: config, engine: engine, hub: hub, cache: cache, metrics: metrics, bootGuard: bootGuard, adoptedSocket: adopted.control,
            adoptedHTTP: adopted.http,
            notifier: SystemdNotifier(), hooks: hooks, current: Reloadable(config), reloadConfig: reload, logger: logger)
        // Services shut down in the reverse order of this list: `DaemonService` first (it stops
        // the transfers with their last checkpoints committed), then the loops, which would
        // otherwise find the engine shut down under them; the table closes after them all.
        let loops = LoopService("EngineLoops") {
            await engine.runLoops(progressEvery: .milliseconds(500)) { hub.publishProgress($0, $1) }
        }
        let sweeps = LoopService("CacheSweeps") { await cache.runSweeps() }
        // The worker lock of a shared table: lost with its connection, the worker is fenced
        // until it holds the lock again (a second daemon with its id may have taken it).
        let lockWatch = databaseLock.map { lock in
            LoopService("WorkerLock") {
                await lock.watch(lost: { await engine.workerLockLost() }, regained: { await engine.workerLockRegained() })
            }
        }
        let group = ServiceGroup(
            configuration: ServiceGroupConfiguration(
                services: (lockWatch.map { [ServiceGroupConfiguration.ServiceConfiguration(service: $0)] } ?? []) + [
                    .init(service: loops), .init(service: sweeps),
                    .init(service: service, successTerminationBehavior: .gracefullyShutdownGroup),
                ],
                gracefulShutdownSignals: [.sigterm, .sigint],
                logger: logger))
        do {
            try await group.run()
        } catch {
            // A start that failed half-way still has an HTTP client to close.
            await engine.shutdown()
            await store.close()
            await databaseLock?.release()
            throw error
        }
        await store.close()
        await databaseLock?.release()
        withExtendedLifetime(lock) {}
    }

    /// For tests only: `DLD_TEST_CLOCK_OFFSET=<seconds>` moves the engine's clock (what it
    /// records, schedules and leases by) that far from the system's, to show a
    /// `speed_schedule` boundary in seconds or a fleet worker whose clock is wrong. Not a
    /// setting: it is logged as a warning when set.
    static func testClockOffset(_ environment: [String: String], logger: Logger) -> TimeInterval {
        guard let text = environment["DLD_TEST_CLOCK_OFFSET"] else { return 0 }
        guard let offset = TimeInterval(text), offset.isFinite else {
            logger.warning("DLD_TEST_CLOCK_OFFSET is not a number of seconds; ignored", metadata: ["value": "\(text.prefix(40))"])
            return 0
        }
        logger.warning("test hook: the engine's clock is moved from the system's", metadata: ["seconds": "\(offset)"])
        return offset
    }

    /// The job table: `<state_dir>/jobs.sqlite`, or PostgreSQL when `database` is set (then
    /// with the lock that keeps a second daemon off the same table).
    static func openStore(_ config: DaemonConfig, logger: Logger) async throws -> (any JobTable, PostgresDaemonLock?) {
        guard let database = config.database else {
            let databasePath = config.stateDir + "/jobs.sqlite"
            let store: SQLiteJobStore
            do {
                store = try SQLiteJobStore(path: databasePath)
            } catch {
                throw DaemonError("cannot open the job table \(databasePath): \(StorageErrorText.plain(error))")
            }
            for suffix in ["", "-wal", "-shm"] { chmod(databasePath + suffix, 0o600) }
            return (store, nil)
        }
        let shown = PostgresURL.redacted(database)
        do {
            let url = try PostgresURL.parse(database, defaultUser: NSUserName())
            let lock = try await PostgresDaemonLock.acquire(url, worker: config.workerID, logger: logger)
            do {
                let store = try await PostgresJobStore.open(url, maxConnections: config.databasePoolSize, logger: logger)
                logger.info("job table in PostgreSQL", metadata: ["database": "\(shown)"])
                return (store, lock)
            } catch {
                await lock.release()
                throw error
            }
        } catch {
            throw DaemonError("cannot open the job table \(shown): \(error)")
        }
    }

    /// The engine's settings that follow the config file, at start and at a reload. At a
    /// reload the keys marked `.restart` in `DaemonConfig.table` hold their running values
    /// already (`keepingRestartKeys`), so only the live ones change here.
    static func applyLive(_ config: DaemonConfig, policy: PathPolicy, to configuration: inout EngineConfiguration) {
        configuration.downloadDir = config.downloadDir
        configuration.maxActive = config.maxActive
        configuration.backoff = BackoffPolicy(
            base: config.retryBase, cap: config.retryMaxDelay, maxAttempts: config.maxAttempts,
            giveUpAfter: config.giveUpAfter, diskRecheck: config.diskRecheck)
        configuration.diskSpace = DiskSpacePolicy(minFree: config.minFree)
        configuration.checkpoints = CheckpointPolicy(interval: config.checkpointInterval)
        configuration.groupParallel = config.groupParallel
        configuration.pathPolicy = policy
        configuration.maxQueued = config.maxQueued
        configuration.netrcPath = config.effectiveNetrc
        configuration.maxPerHost = config.maxPerHost
        configuration.maxStreamsPerHost = config.maxStreamsPerHost
        configuration.maxLight = config.maxLight
        configuration.retention = RetentionPolicy(keepFinished: config.keepFinished, keepFailed: config.keepFailed)
        configuration.speed.maxSpeed = config.maxSpeed
        configuration.speed.schedule = config.speedSchedule
        configuration.segments = config.segments
        configuration.segmentMinSize = config.segmentMinSize
        configuration.meteredByDefault = config.metered
        configuration.metalinkLocation = config.metalinkLocation.isEmpty ? nil : config.metalinkLocation.lowercased()
    }

    /// The allowed roots, resolved (symlinks followed) as destinations are; roots that do not
    /// exist are left out until they do (at the next start).
    static func pathPolicy(_ config: DaemonConfig) -> PathPolicy {
        PathPolicy(
            allowedRoots: config.effectiveAllowedRoots.compactMap(Destination.realPath),
            home: Destination.realPath(config.home))
    }

    /// The socket's folder: created 0700 when missing; the default folders (which only dld
    /// uses) are also checked for their owner and tightened to 0700.
    static func prepareSocketFolder(_ socket: String, logger: Logger) throws {
        let folder = (socket as NSString).deletingLastPathComponent
        let isDefault = folder == (SocketPath.defaultPath() as NSString).deletingLastPathComponent
        if isDefault || !FileManager.default.fileExists(atPath: folder) {
            if let old = try Folders.ensure(folder, mode: 0o700) {
                logger.warning("socket folder had mode \(String(old, radix: 8)); set to 700", metadata: ["path": "\(folder)"])
            }
        }
    }
}

/// A loop of the daemon as a service of its group: it runs from the start and is cancelled when
/// the group shuts it down, after the services listed after it (`DaemonService`, which stops
/// the transfers), and before the job table closes.
struct LoopService: Service, CustomStringConvertible {
    let description: String
    let body: @Sendable () async -> Void

    init(_ name: String, _ body: @escaping @Sendable () async -> Void) {
        description = name
        self.body = body
    }

    func run() async {
        await cancelWhenGracefulShutdown(body)
    }
}

/// The daemon as a service: binds the socket, starts the engine, serves until asked to stop,
/// then stops the transfers with their progress committed.
struct DaemonService: Service, CustomStringConvertible {
    /// What ServiceLifecycle logs for the service: its name, never its configuration (which
    /// holds the database's connection string).
    var description: String { "DaemonService" }

    let config: DaemonConfig
    let engine: Engine
    let hub: EventHub
    /// The URL cache (`get`).
    let cache: URLCache
    /// What `GET /metrics` renders.
    let metrics: Metrics
    let bootGuard: BootGuard
    /// The listening socket passed by systemd, if any (else dld binds `config.socket`).
    let adoptedSocket: Int32?
    /// The HTTP listener's TCP socket passed by systemd (dld-http.socket), if any: served
    /// instead of `http_listen`.
    let adoptedHTTP: Int32?
    let notifier: SystemdNotifier
    /// The hook commands, replaced by a reload.
    let hooks: Reloadable<HookRunner>
    /// The settings in force (a reload changes the live ones).
    let current: Reloadable<DaemonConfig>
    let reloadConfig: (@Sendable () throws -> DaemonConfig)?
    let logger: Logger

    static func limits(_ config: DaemonConfig) -> ControlServer.Limits {
        var limits = ControlServer.Limits()
        limits.maxLineBytes = config.maxLineBytes
        limits.maxConnections = config.maxConnections
        limits.idleTimeout = .seconds(Int64(config.idleTimeout))
        return limits
    }

    func run() async throws {
        let closer = Mutex<(any Channel)?>(nil)
        // Trapped before READY=1: from then on `systemctl reload` may send it (its default
        // action would end dld).
        let hangups = await UnixSignalsSequence(trapping: .sighup)
        let dispatcher = Dispatcher(engine: engine, cache: cache)
        let cache = self.cache
        // A `shutdown` request, on the socket or over HTTP.
        let shutdown: @Sendable () -> Void = {
            // A `get` waiting for its download holds its connection open: it must end, or
            // serving (which waits for every connection) would never end. A hop: this handler
            // cannot wait, and the same call after serving makes sure it has happened.
            Task { await cache.shutdown() }
            closer.withLock { $0?.close(promise: nil) }
        }
        // The drop folder: made and watched now, before the socket is bound, so that a folder
        // that cannot be made or watched stops the start-up with its reason and nothing to
        // undo; its files are taken once the queue runs (the kernel keeps the events till then).
        let current = self.current
        let dropFolder =
            config.watchDir.isEmpty
            ? nil
            : try DropFolderWatch(
                folder: config.watchDir, dispatcher: dispatcher, downloadDir: { current.value.downloadDir }, logger: logger)
        let server = ControlServer(
            path: config.socket, dispatcher: dispatcher, hub: hub, limits: Self.limits(config), logger: logger, onShutdown: shutdown)
        let channel = try await server.bind(adopting: adoptedSocket)
        closer.withLock { $0 = channel.channel }
        // The socket file of an adopted socket is systemd's: it stays for the next start.
        defer { if adoptedSocket == nil { unlink(config.socket) } }
        let http: HTTPListener?
        do {
            http = try await HTTPListener.start(
                config: config, adopting: adoptedHTTP, dispatcher: dispatcher, hub: hub, metrics: metrics, logger: logger,
                liveConfig: { current.value }, onShutdown: shutdown)
        } catch {
            await abandon(channel)
            throw error
        }
        defer { http?.close() }
        // Read before the queue starts, so that no job starts on a metered connection that it
        // may not use; changes are reported once the queue runs.
        let metered = MeteredMonitor(logger: logger)
        defer { metered.cancel() }
        await engine.setConnectionMetered(metered.initiallyMetered)
        do {
            try await engine.start()
        } catch {
            await abandon(channel)
            throw DaemonError("cannot start the queue: \(error)")
        }
        await cache.start()
        // Jobs that failed for want of a network start again as soon as a route is back. The
        // engine reads the route tables itself, so reports that come while it looks are one.
        let engine = self.engine
        let (routeChanges, routeReports) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        let routes = RouteMonitor(logger: logger) { _ in routeReports.yield() }
        defer {
            routes?.cancel()
            routeReports.finish()
        }
        // One consumer, so that the engine sees the changes in the order they happened.
        let (meteredChanges, meteredReports) = AsyncStream.makeStream(of: Bool.self)
        metered.start { meteredReports.yield($0) }
        defer { meteredReports.finish() }
        let socketPath = adoptedSocket.flatMap(SocketActivation.path(of:)) ?? config.socket
        logger.info(
            "dld \(DLDVersion.current) listening",
            metadata: [
                "socket": "\(socketPath)", "state_dir": "\(config.stateDir)", "socket_from": "\(adoptedSocket == nil ? "dld" : "systemd")",
            ])
        // The start-up is done: the job table is reconciled, the queue runs, and the socket
        // (bound above, its backlog already accepting) is served from the next line on.
        bootGuard.healthy()
        notifier.notify("READY=1", "STATUS=started")
        let notifier = self.notifier
        let stopping = Atomic(false)
        try await withGracefulShutdownHandler {
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask { try await server.serve(channel) }
                if notifier.isActive { group.addTask { await self.heartbeat() } }
                group.addTask {
                    for await _ in hangups { await self.reload(server: server) }
                }
                // Those sequences end only when cancelled: the first child to end is serving.
                group.addTask {
                    for await _ in routeChanges { await engine.networkChanged() }
                }
                group.addTask {
                    for await isMetered in meteredChanges { await engine.meteredChanged(isMetered) }
                }
                if let dropFolder { group.addTask { await dropFolder.run() } }
                // Serving ends when the socket is closed (SIGTERM, or a `shutdown` request).
                try await group.next()
                group.cancelAll()
            }
        } onGracefulShutdown: {
            // A hop, as above.
            Task { await cache.shutdown() }
            // At once on SIGTERM: systemd shows the unit as deactivating from here.
            if stopping.exchange(true, ordering: .relaxed) == false {
                notifier.notify("STOPPING=1", "STATUS=stopping: checkpointing transfers")
            }
            closer.withLock { $0?.close(promise: nil) }
        }
        // Also after a `shutdown` request, which ends serving without a signal.
        if stopping.exchange(true, ordering: .relaxed) == false {
            notifier.notify("STOPPING=1", "STATUS=stopping: checkpointing transfers")
        }
        // Serving has ended: the HTTP clients go now too, not after the transfers are synced.
        http?.close()
        logger.info("stopping: checkpointing transfers")
        await cache.shutdown()
        // Syncing the transfers' bytes can outlast TimeoutStopSec on a slow disk: systemd is
        // asked for more time while it goes on, rather than killing dld in the middle.
        let extend = "EXTEND_TIMEOUT_USEC=\(Self.stopExtension.components.seconds * 1_000_000)"
        notifier.notify(extend)
        await withTaskGroup(of: Void.self) { group in
            group.addTask { await engine.shutdown() }
            if notifier.isActive {
                group.addTask {
                    while !Task.isCancelled {
                        try? await Task.sleep(for: Self.stopExtension / 2)
                        if !Task.isCancelled { notifier.notify(extend) }
                    }
                }
            }
            await group.next()
            group.cancelAll()
        }
        bootGuard.healthy()
        logger.info("stopped")
    }

    /// How much more time each `EXTEND_TIMEOUT_USEC` asks for while transfers are synced.
    static let stopExtension: Duration = .seconds(20)

    /// While dld serves: `WATCHDOG=1` when systemd asks for it, and `STATUS=` for
    /// `systemctl --user status dld`. Both come from an answer of the engine (its serial queue)
    /// and the job table, so a stuck engine stops the pings and systemd restarts dld; a live
    /// process alone is not enough. The status follows the queue: after a turn of it, at most
    /// every `statusInterval`, and an idle queue is not woken for it, except by the watchdog,
    /// which is pinged at least every half `WatchdogSec=`: a stuck turn is caught within it.
    func heartbeat() async {
        let watchdog = notifier.watchdogInterval
        let activity = engine.activity
        while !Task.isCancelled {
            let sentAt = ContinuousClock.now
            if let stats = try? await engine.statsFromTheQueue() {
                let status = "STATUS=" + Self.statusLine(stats)
                if watchdog != nil { notifier.notify("WATCHDOG=1", status) } else { notifier.notify(status) }
            }
            // An idle queue is not woken for the status line: with the watchdog, the next ping
            // comes at its interval (half of `WatchdogSec=`) unless the queue ran before.
            if let watchdog {
                _ = await activity.wait(until: sentAt + watchdog)
            } else {
                await activity.wait()
            }
            try? await Task.sleep(until: sentAt + min(watchdog ?? Self.statusInterval, Self.statusInterval), clock: .continuous)
        }
    }

    static let statusInterval: Duration = .seconds(5)

    /// Closes the control socket's channel when start-up fails after it was bound. Connections
    /// it accepted already (a client waiting for dld to come up) close as they are dropped
    /// (`AcceptedConnection`).
    private func abandon(_ channel: ControlServer.Listening) async {
        try? await channel.channel.close()
        try? await channel.executeThenClose { inbound in
            for try await _ in inbound {}
        }
    }

    /// "2 running, 10 queued, 1 waiting, 3.4 MB/s" (and why the queue is paused, if it is).
    static func statusLine(_ stats: Engine.Stats) -> String {
        var parts = ["\(stats.active) running", "\(stats.counts[.queued] ?? 0) queued"]
        if let waiting = stats.counts[.waiting], waiting > 0 { parts.append("\(waiting) waiting") }
        if let failed = stats.counts[.failed], failed > 0 { parts.append("\(failed) failed") }
        parts.append(byteRate(stats.speed))
        var line = parts.joined(separator: ", ")
        if stats.queuePausedReason != nil { line += " (queue paused)" }
        return line
    }

    static func byteRate(_ bytesPerSecond: Double) -> String {
        let units = ["B/s", "kB/s", "MB/s", "GB/s"]
        var value = max(0, bytesPerSecond)
        var unit = 0
        while value >= 1000, unit < units.count - 1 {
            value /= 1000
            unit += 1
        }
        return unit == 0 ? "\(Int(value)) B/s" : String(format: "%.1f %@", value, units[unit])
    }
}

/// The boot-loop guard: a counter of start-ups that did not finish, in the state folder. After
/// `limit` in a row, dld starts with its queue paused instead of dying again on whatever made
/// it die (a job whose reconciliation crashes, a full disk, a broken table). A start-up that
/// gets as far as serving its socket resets it; a crash later, during transfers, is not a
/// failed start-up (SIGKILL in the middle of a download must simply resume).
struct BootGuard: Sendable {
    static let limit = 3
    let path: String

    init(stateDir: String) { path = stateDir + "/failed-starts" }

    /// Counts this start as failed until proven otherwise; returns the failures before it.
    func starting() -> Int {
        let before =
            (try? String(contentsOfFile: path, encoding: .utf8)).flatMap { Int($0.trimmingCharacters(in: .whitespacesAndNewlines)) } ?? 0
        write(before + 1)
        return before
    }

    func healthy() { write(0) }

    private func write(_ value: Int) {
        let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { return }
        let text = "\(value)\n"
        _ = text.withCString { Glibc.write(fd, $0, strlen($0)) }
        fsync(fd)
        close(fd)
    }
}
