import Foundation
import Logging
import PostgresNIO
import Synchronization

/// LISTENs on `dld_jobs` and `dld_events` with postgres-nio, on one connection of its own (a
/// pooled connection goes back to the pool, and its LISTEN with it).
///
/// Lifetime: from `PostgresJobStore.open` until `close` cancels it. A lost connection is made
/// again after a second; each time it (re)connects it calls both handlers once, because
/// notifications sent while it was away are lost and the reader must catch up.
///
/// A connection can die without a word (a server that failed over, a NAT that forgot it, a
/// partition: nothing closes the socket, and a LISTEN never writes, so nothing notices). So
/// every `pingInterval` the listener sends a NOTIFY to itself on `pingChannel`, with a payload
/// of its own, and the connection counts as dead when that notification has not come back
/// within `pingTimeout`: it is closed and made again (and the handlers catch up).
enum PostgresListener {
    static let jobsChannel = "dld_jobs"
    static let eventsChannel = "dld_events"
    static let pingChannel = "dld_ping"
    static let pingInterval: Duration = .seconds(2)
    static let pingTimeout: Duration = .seconds(3)
    /// Wait before connecting again after a failure: long enough not to spin against a server
    /// that is down, short enough that a pause still reaches a transfer within seconds.
    static let retryDelay: Duration = .seconds(1)

    static func run(
        configuration: PostgresConnection.Configuration, logger: Logger,
        onJobs: @escaping @Sendable () -> Void, onEvents: @escaping @Sendable () -> Void
    ) async {
        var id = 1
        while !Task.isCancelled {
            do {
                let connection = try await PostgresConnection.connect(configuration: configuration, id: id, logger: logger)
                if id > 1 { logger.notice("PostgreSQL listener connected again: changes and events are caught up") }
                id += 1
                do {
                    try await listen(on: connection, logger: logger, onJobs: onJobs, onEvents: onEvents)
                } catch {
                    if !Task.isCancelled {
                        logger.warning(
                            "PostgreSQL listener lost its connection", metadata: ["error": "\(PostgresStoreError(describing: error))"])
                    }
                }
                try? await connection.close().get()
            } catch {
                if !Task.isCancelled {
                    logger.warning("PostgreSQL listener cannot connect", metadata: ["error": "\(PostgresStoreError(describing: error))"])
                }
            }
            try? await Task.sleep(for: retryDelay)
        }
    }

    private static func listen(
        on connection: PostgresConnection, logger: Logger, onJobs: @escaping @Sendable () -> Void,
        onEvents: @escaping @Sendable () -> Void
    ) async throws {
        let token = UUID().uuidString
        let lastPong = Pongs()
        try await connection.listen(on: jobsChannel) { jobs in
            try await connection.listen(on: eventsChannel) { events in
                try await connection.listen(on: pingChannel) { pings in
                    // Listening now: whatever happened before is caught up once.
                    onJobs()
                    onEvents()
                    try await withThrowingTaskGroup(of: Void.self) { group in
                        group.addTask { for try await _ in jobs { onJobs() } }
                        group.addTask { for try await _ in events { onEvents() } }
                        group.addTask {
                            for try await ping in pings where ping.payload == token { lastPong.heard() }
                        }
                        group.addTask { try await ping(connection, token: token, lastPong: lastPong, logger: logger) }
                        // Either sequence ending, or a ping unanswered, means the connection is
                        // gone: start again.
                        _ = try await group.next()
                        group.cancelAll()
                    }
                }
            }
        }
    }

    /// Sends a NOTIFY to this listener every `pingInterval` and waits for it to come back;
    /// throws when it does not within `pingTimeout` (a statement that hangs counts as none).
    private static func ping(
        _ connection: PostgresConnection, token: String, lastPong: Pongs, logger: Logger
    ) async throws {
        while !Task.isCancelled {
            try await Task.sleep(for: pingInterval)
            let sent = ContinuousClock.now
            let deadline = sent + pingTimeout
            let notify = Task {
                _ = try await connection.query("SELECT pg_notify(\(pingChannel), \(token))", logger: logger)
            }
            defer { notify.cancel() }
            while !lastPong.heard(since: sent) {
                guard ContinuousClock.now < deadline else { throw ListenerDeaf() }
                try await Task.sleep(for: .milliseconds(50))
            }
        }
    }

    /// The listener's own NOTIFY did not come back in time: its connection is dead.
    struct ListenerDeaf: Error, CustomStringConvertible {
        var description: String { "the listener's own notification did not come back within \(pingTimeout): the connection is dead" }
    }
}

/// When the listener last heard its own ping.
private final class Pongs: Sendable {
    private let last = Mutex<ContinuousClock.Instant?>(nil)

    func heard() { last.withLock { $0 = .now } }

    func heard(since instant: ContinuousClock.Instant) -> Bool {
        last.withLock { $0.map { $0 >= instant } ?? false }
    }
}
