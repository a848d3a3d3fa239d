import Foundation
import Logging
import PostgresNIO
import Synchronization

/// One daemon per worker id: several daemons share a table, each under its own id (its leases
/// and claims carry it), and a second daemon started with an id in use would renew and
/// release the first one's jobs as its own. The lock is a session-level advisory lock on the
/// id's hash, on a connection of its own, held for the daemon's life; the server lets go of it
/// when that connection ends, also when the daemon is killed.
///
/// The server also lets go when the connection ends for any other reason (the server
/// restarted, a partition cut it): then a second daemon with the same id could take the lock
/// and run beside this one. So the lock is watched (`watch`): a connection that no longer
/// answers means the lock is lost, and the daemon is told (it fences itself) until the lock is
/// taken again on a new connection.
public final class PostgresDaemonLock: Sendable {
    private let connection: Mutex<PostgresConnection>
    private let url: PostgresURL
    private let worker: String
    private let logger: Logger

    /// How often the lock's connection is asked whether it is alive, and how long it has to
    /// answer.
    static let checkEvery: Duration = .seconds(1)
    static let answerWithin: Duration = .seconds(3)

    private init(connection: PostgresConnection, url: PostgresURL, worker: String, logger: Logger) {
        self.connection = Mutex(connection)
        self.url = url
        self.worker = worker
        self.logger = logger
    }

    public static func acquire(_ url: PostgresURL, worker: String, logger: Logger) async throws -> PostgresDaemonLock {
        PostgresDaemonLock(connection: try await take(url, worker: worker, logger: logger), url: url, worker: worker, logger: logger)
    }

    /// A new connection holding the lock, or an error that says who holds it.
    private static func take(_ url: PostgresURL, worker: String, logger: Logger) async throws -> PostgresConnection {
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
        return connection
    }

    /// Watches the lock until cancelled: `lost` when its connection stops answering (the lock
    /// went with it), then tries to take it again every `checkEvery`, and `regained` once it
    /// holds it again.
    public func watch(lost: @escaping @Sendable () async -> Void, regained: @escaping @Sendable () async -> Void) async {
        while !Task.isCancelled {
            try? await Task.sleep(for: Self.checkEvery)
            guard !Task.isCancelled, await !alive() else { continue }
            logger.error("the worker lock's connection to the job table is lost: this worker is fenced until it holds the lock again")
            await lost()
            let old = connection.withLock { $0 }
            try? await old.close().get()
            while !Task.isCancelled {
                do {
                    let new = try await Self.take(url, worker: worker, logger: logger)
                    connection.withLock { $0 = new }
                    logger.notice("the worker lock is held again")
                    await regained()
                    break
                } catch {
                    logger.warning("cannot take the worker lock again", metadata: ["error": "\(error)"])
                    try? await Task.sleep(for: Self.checkEvery)
                }
            }
        }
    }

    /// Whether the lock's connection answers within `answerWithin` (a statement sent to a
    /// half-open connection never comes back: it counts as none).
    private func alive() async -> Bool {
        let connection = self.connection.withLock { $0 }
        guard !connection.isClosed else { return false }
        let logger = self.logger
        let answered = OneAnswer()
        let probe = Task {
            let ok = (try? await connection.rows("SELECT 1", logger: logger)) != nil
            answered.set(ok)
        }
        defer { probe.cancel() }
        let deadline = ContinuousClock.now + Self.answerWithin
        while ContinuousClock.now < deadline {
            if let ok = answered.value { return ok }
            try? await Task.sleep(for: .milliseconds(20))
        }
        return false
    }

    /// Lets go of the lock (by ending its connection).
    public func release() async {
        try? await connection.withLock { $0 }.close().get()
    }
}

/// The first answer of a probe, read by the caller that polls it.
private final class OneAnswer: Sendable {
    private let state = Mutex<Bool?>(nil)
    var value: Bool? { state.withLock { $0 } }
    func set(_ ok: Bool) { state.withLock { $0 = $0 ?? ok } }
}
