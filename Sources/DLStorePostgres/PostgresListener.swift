import Foundation
import Logging
import PostgresNIO

/// LISTENs on `dld_jobs` and `dld_events` with postgres-nio, on one connection of its own (a
/// pooled connection goes back to the pool, and its LISTEN with it).
///
/// Lifetime: from `PostgresJobStore.open` until `close` cancels it. A lost connection is made
/// again after a second; each time it (re)connects it calls both handlers once, because
/// notifications sent while it was away are lost and the reader must catch up.
enum PostgresListener {
    static let jobsChannel = "dld_jobs"
    static let eventsChannel = "dld_events"
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
                    try await listen(on: connection, onJobs: onJobs, onEvents: onEvents)
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
        on connection: PostgresConnection, onJobs: @escaping @Sendable () -> Void, onEvents: @escaping @Sendable () -> Void
    ) async throws {
        try await connection.listen(on: jobsChannel) { jobs in
            try await connection.listen(on: eventsChannel) { events in
                // Listening now: whatever happened before is caught up once.
                onJobs()
                onEvents()
                try await withThrowingTaskGroup(of: Void.self) { group in
                    group.addTask { for try await _ in jobs { onJobs() } }
                    group.addTask { for try await _ in events { onEvents() } }
                    // Either sequence ending means the connection is gone: start again.
                    _ = try await group.next()
                    group.cancelAll()
                }
            }
        }
    }
}
