import DLCore
import DLRPC
import DLStore
import DLTransfer
import Foundation
import Logging
import NIOCore
import ServiceLifecycle
import Synchronization

/// Wires the daemon together and runs it until SIGTERM, SIGINT or a `shutdown` request.
public enum Daemon {
    public static func run(config: DaemonConfig, logger: Logger) async throws {
        try Folders.ensure(config.stateDir, mode: 0o700)
        let lock = try StateLock(stateDir: config.stateDir)
        let databasePath = config.stateDir + "/jobs.sqlite"
        let store: JobStore
        do {
            store = try JobStore(path: databasePath)
        } catch {
            throw DaemonError("cannot open the job table \(databasePath): \(error)")
        }
        for suffix in ["", "-wal", "-shm"] { chmod(databasePath + suffix, 0o600) }
        try prepareSocketFolder(config.socket)
        if !FileManager.default.fileExists(atPath: config.downloadDir) {
            try? FileManager.default.createDirectory(atPath: config.downloadDir, withIntermediateDirectories: true)
        }

        var downloaderConfig = DownloaderConfiguration()
        downloaderConfig.connectTimeout = .seconds(Int64(config.connectTimeout))
        downloaderConfig.readTimeout = .seconds(Int64(config.readTimeout))
        let downloader = Downloader(configuration: downloaderConfig, logger: logger)
        let engine = Engine(
            store: store, downloader: downloader,
            configuration: EngineConfiguration(
                downloadDir: config.downloadDir, maxActive: config.maxActive,
                backoff: BackoffPolicy(base: config.retryBase, cap: config.retryMaxDelay, maxAttempts: config.maxAttempts)),
            logger: logger)
        let service = DaemonService(config: config, engine: engine, logger: logger)
        let group = ServiceGroup(configuration: ServiceGroupConfiguration(
            services: [.init(service: service, successTerminationBehavior: .gracefullyShutdownGroup)],
            gracefulShutdownSignals: [.sigterm, .sigint],
            logger: logger))
        do {
            try await group.run()
        } catch {
            // A start that failed half-way still has an HTTP client to close.
            await engine.shutdown()
            throw error
        }
        withExtendedLifetime(lock) {}
    }

    /// The socket's folder: created 0700 when missing; the default folders (which only dld
    /// uses) are also checked for their owner and tightened to 0700.
    static func prepareSocketFolder(_ socket: String) throws {
        let folder = (socket as NSString).deletingLastPathComponent
        let isDefault = folder == (SocketPath.defaultPath() as NSString).deletingLastPathComponent
        if isDefault || !FileManager.default.fileExists(atPath: folder) {
            try Folders.ensure(folder, mode: 0o700)
        }
    }
}

/// The daemon as a service: binds the socket, starts the engine, serves until asked to stop,
/// then stops the transfers with their progress committed.
struct DaemonService: Service {
    let config: DaemonConfig
    let engine: Engine
    let logger: Logger

    func run() async throws {
        let closer = Mutex<(any Channel)?>(nil)
        let dispatcher = Dispatcher(engine: engine)
        var limits = ControlServer.Limits()
        limits.maxLineBytes = config.maxLineBytes
        limits.maxConnections = config.maxConnections
        let server = ControlServer(path: config.socket, dispatcher: dispatcher, limits: limits, logger: logger) {
            closer.withLock { $0?.close(promise: nil) }
        }
        let channel = try await server.bind()
        closer.withLock { $0 = channel.channel }
        defer { unlink(config.socket) }
        do {
            try await engine.start()
        } catch {
            channel.channel.close(promise: nil)
            throw DaemonError("cannot start the queue: \(error)")
        }
        logger.info("dld \(DLDVersion.current) listening", metadata: ["socket": "\(config.socket)", "state_dir": "\(config.stateDir)"])
        try await withGracefulShutdownHandler {
            try await server.serve(channel)
        } onGracefulShutdown: {
            closer.withLock { $0?.close(promise: nil) }
        }
        logger.info("stopping: checkpointing transfers")
        await engine.shutdown()
        logger.info("stopped")
    }
}
