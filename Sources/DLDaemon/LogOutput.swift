import Foundation
import Logging
import Synchronization

/// dld's log lines on stderr. As swift-log's StreamLogHandler writes them, except when stderr
/// is the journal (systemd sets `$JOURNAL_STREAM` to its device and inode): then each line
/// starts with its syslog priority, `<3>` to `<7>` (sd-daemon(3)), so that
/// `journalctl -p warning` works, and without a timestamp, which the journal adds. The level
/// is shared by every logger and can change while dld runs (a reloaded `log_level`).
public struct DaemonLogHandler: LogHandler {
    /// The level every handler reads; `log_level` of the config.
    public static let level = Mutex(Logger.Level.info)
    /// Whether stderr is the journal; read once at start-up.
    public static let toJournal = DaemonLogHandler.stderrIsJournal(ProcessInfo.processInfo.environment)

    private let label: String
    public var metadata: Logger.Metadata = [:]
    public var metadataProvider: Logger.MetadataProvider?

    public init(label: String) {
        self.label = label
    }

    public var logLevel: Logger.Level {
        get { Self.level.withLock { $0 } }
        // One level for the whole daemon: a logger's own setting is not kept.
        set {}
    }

    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    public func log(event: LogEvent) {
        var all = metadata
        if let provided = metadataProvider?.get() { all.merge(provided) { _, new in new } }
        if let own = event.metadata { all.merge(own) { _, new in new } }
        let line = Self.format(
            level: event.level, label: label, metadata: all, source: event.source, message: "\(event.message)",
            journal: Self.toJournal, now: Date())
        FileHandle.standardError.write(Data(line.utf8))
    }

    /// One line (two or more if the message has line breaks, each with the prefix).
    static func format(
        level: Logger.Level, label: String, metadata: Logger.Metadata, source: String, message: String,
        journal: Bool, now: Date
    ) -> String {
        let pairs = metadata.isEmpty ? "" : metadata.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ") + " "
        let body = "\(level) \(label): \(pairs)[\(source)] \(message)"
        guard journal else { return "\(timestamp(now)) \(body)\n" }
        let prefix = "<\(priority(level))>"
        return body.split(separator: "\n", omittingEmptySubsequences: false).map { prefix + $0 }.joined(separator: "\n") + "\n"
    }

    /// syslog's priorities, as the journal reads them.
    static func priority(_ level: Logger.Level) -> Int {
        switch level {
        case .trace, .debug: return 7
        case .info: return 6
        case .notice: return 5
        case .warning: return 4
        case .error: return 3
        case .critical: return 2
        }
    }

    /// `$JOURNAL_STREAM` is `DEVICE:INODE` of the stream systemd connected; it names stderr
    /// only if stderr is still that stream (not redirected by a wrapper or a shell).
    static func stderrIsJournal(_ environment: [String: String]) -> Bool {
        guard let value = environment["JOURNAL_STREAM"] else { return false }
        let parts = value.split(separator: ":")
        guard parts.count == 2, let device = UInt64(parts[0]), let inode = UInt64(parts[1]) else { return false }
        var info = stat()
        guard fstat(STDERR_FILENO, &info) == 0 else { return false }
        return UInt64(info.st_dev) == device && UInt64(info.st_ino) == inode
    }

    private static func timestamp(_ date: Date) -> String {
        var seconds = time_t(date.timeIntervalSince1970)
        var parts = tm()
        localtime_r(&seconds, &parts)
        var buffer = [CChar](repeating: 0, count: 64)
        let count = strftime(&buffer, buffer.count, "%Y-%m-%dT%H:%M:%S%z", &parts)
        return String(decoding: buffer[..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}
