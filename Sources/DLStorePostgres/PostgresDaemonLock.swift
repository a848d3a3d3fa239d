import Foundation
import Logging
import PostgresNIO

/// One daemon per database, until the engine shares a queue with others (issue 12's claims and
/// leases): two daemons on one table would both start the same queued jobs. The lock is a
/// session-level advisory lock on a connection of its own, held for the daemon's life; the
/// server lets go of it when that connection ends, also when the daemon is killed.
public final class PostgresDaemonLock: Sendable {
    private let connection: PostgresConnection
    private let logger: Logger

    private init(connection: PostgresConnection, logger: Logger) {
        self.connection = connection
        self.logger = logger
    }

    public static func acquire(_ url: PostgresURL, logger: Logger) async throws -> PostgresDaemonLock {
        let connection: PostgresConnection
        do {
            connection = try await PostgresConnection.connect(configuration: try url.connectionConfiguration(), id: 1, logger: logger)
        } catch {
            throw PostgresStoreError(describing: error)
        }
        let taken: Bool
        do {
            taken = try await connection.rows("SELECT pg_try_advisory_lock(\(LockKey.daemon))", logger: logger).first?.decode(Bool.self) ?? false
        } catch {
            try? await connection.close().get()
            throw PostgresStoreError(describing: error)
        }
        guard taken else {
            try? await connection.close().get()
            throw PostgresStoreError(
                "another dld uses the database \(url.database ?? url.user) on \(url.host ?? url.socketFolder ?? "localhost"); this version runs one daemon per database (several daemons sharing one queue are not ready yet)")
        }
        return PostgresDaemonLock(connection: connection, logger: logger)
    }

    /// Lets go of the lock (by ending its connection).
    public func release() async {
        try? await connection.close().get()
    }
}
