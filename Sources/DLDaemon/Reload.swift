import DLCore
import Foundation
import Logging
import Synchronization

/// A value shared by the services and changed by a reload.
final class Reloadable<Value: Sendable>: Sendable {
    private let box: Mutex<Value>
    init(_ value: Value) { box = Mutex(value) }
    var value: Value { box.withLock { $0 } }
    func set(_ value: Value) { box.withLock { $0 = value } }
}

extension DaemonConfig {
    /// The keys marked `.restart` in `table`: a reload names them in the log and leaves them as
    /// they were.
    public static var restartKeys: Set<String> { Set(table.filter { $0.reload == .restart }.map(\.name)) }

    /// The keys whose values differ, as `--print-config` shows them.
    public static func changedKeys(_ old: DaemonConfig, _ new: DaemonConfig) -> [String] {
        table.filter { $0.render(old) != $0.render(new) }.map(\.name).sorted()
    }

    /// These settings with the restart-only ones taken from `running`.
    func keepingRestartKeys(of running: DaemonConfig) -> DaemonConfig {
        var out = self
        for key in Self.table where key.reload == .restart { key.copy(running, &out) }
        return out
    }
}

extension DaemonService {
    /// SIGHUP (`systemctl --user reload dld`): the config file is read again, with the flags
    /// dld was started with still on top. A file with an error is refused whole and logged
    /// with its line; the settings in force stay. Otherwise every setting that can change
    /// live does, without stopping a transfer, and the others are named in the log.
    func reload(server: ControlServer) async {
        notifier.notify("RELOADING=1", "MONOTONIC_USEC=\(SystemdNotifier.monotonicMicroseconds)", "STATUS=reloading the configuration")
        defer { notifier.notify("READY=1", "STATUS=configuration reloaded") }
        guard let load = reloadConfig else {
            logger.warning("SIGHUP: nothing to reload")
            return
        }
        let running = current.value
        let read: DaemonConfig
        do {
            read = try load()
        } catch {
            logger.error("the config file was not reloaded; the settings in force stay as they were: \(error)")
            return
        }
        let changed = DaemonConfig.changedKeys(running, read)
        let later = changed.filter { DaemonConfig.restartKeys.contains($0) }
        for key in later {
            logger.warning("\(key) changed in the config file; it applies at the next start of dld, not now")
        }
        let applied = read.keepingRestartKeys(of: running)
        if !FileManager.default.fileExists(atPath: applied.downloadDir) {
            try? FileManager.default.createDirectory(atPath: applied.downloadDir, withIntermediateDirectories: true)
        }
        DaemonLogHandler.level.withLock { $0 = applied.logLevel }
        hooks.set(
            HookRunner(onComplete: applied.onComplete, onError: applied.onError, timeout: .seconds(applied.hookTimeout), logger: logger))
        server.setLimits(Self.limits(applied))
        let policy = Daemon.pathPolicy(applied)
        do {
            try await engine.reconfigure { configuration in
                Daemon.applyLive(applied, policy: policy, to: &configuration)
            }
        } catch {
            logger.error("the reloaded settings could not be applied to the queue: \(error)")
            return
        }
        await cache.setPolicy(applied.cachePolicy)
        current.set(applied)
        let live = changed.filter { !DaemonConfig.restartKeys.contains($0) }
        logger.notice(
            "configuration reloaded",
            metadata: [
                "changed": "\(live.isEmpty ? "nothing" : live.joined(separator: ","))",
                "at_next_start": "\(later.isEmpty ? "nothing" : later.joined(separator: ","))",
            ])
    }
}
