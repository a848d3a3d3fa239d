import Foundation
import Logging
import PostgresNIO

/// One daemon per worker id: several daemons share a table, each under its own id (its leases
/// and claims carry it), and a second daemon started with an id in use would renew and
/// release the first one's jobs as its own. The lock is a session-level advisory lock on the
/// id's hash, on a connection of its own, held for the daemon's life; the server lets go of it
/// when that connection ends, also when the daemon is killed.
public final class PostgresDaemonLock: Sendable {
    private let connection: PostgresConnection
    private let logger: Logger

    private init(connection: PostgresConnection, logger: Logger) {
        self.connection = connection
        self.logger = logger
    }

    public static func acquire(_ url: PostgresURL, worker: String, logger: Logger) async throws -> PostgresDaemonLock {
        let connection: PostgresConnection
        do {
            connection = try await PostgresConnection.connect(configuration: try url.connectionConfiguration(), id: 1, logger: logger)
        } catch {
            throw PostgresStoreError(describing: error)
        }
        let taken: Bool
        do {
            taken =
                try await connection.rows(
                    "SELECT pg_try_advisory_lock(\(LockKey.workerSpace), hashtext(\(worker)))", logger: logger
                ).first?.decode(Bool.self) ?? false
        } catch {
            try? await connection.close().get()
            throw PostgresStoreError(describing: error)
        }
        guard taken else {
            try? await connection.close().get()
            throw PostgresStoreError(
                "another dld runs as worker \(worker) on the database \(url.database ?? url.user) on \(url.host ?? url.socketFolder ?? "localhost"); give each daemon of a shared queue its own worker_name"
            )
        }
        return PostgresDaemonLock(connection: connection, logger: logger)
    }

    /// Lets go of the lock (by ending its connection).
    public func release() async {
        try? await connection.close().get()
    }
}
