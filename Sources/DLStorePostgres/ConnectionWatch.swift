import DLCore
import Foundation
import PostgresNIO
import NIOConcurrencyHelpers

/// Ends the wait for a statement's answer when its connection closes.
///
/// Why: postgres-nio (1.33.2) writes a statement to its channel without a promise of its own.
/// Once the channel has closed and NIO has taken its handlers down, that write is dropped, and
/// the statement's answer never comes, nor an error. A statement meets such a connection when
/// the server goes away (or restarts) as it is sent: the first statement on a connection the
/// pool leased just before the close was noticed, or the `ROLLBACK` after a statement that the
/// close failed (issue 31, seen in about 1 of 7 outage runs). Its caller, and the engine's serial
/// queue behind it, then waited forever, and the worker stayed fenced after the table was back.
///
/// So each statement runs in a task of its own, and its caller waits for whichever comes
/// first: the answer, or the end of the connection. A statement that was dropped stays
/// suspended, abandoned, with the closed connection it holds (a few kilobytes a lost
/// connection). Nothing is cancelled: cancelling the caller reaches the statement as before
/// (postgres-nio then stops reading its rows).
///
/// One close callback a connection, not one a statement: a connection's `closeFuture` keeps
/// its callbacks until it closes, and a busy connection lives for hours.
final class ConnectionWatch: Sendable {
    static let shared = ConnectionWatch()

    private struct Watched {
        /// Held so that no other connection takes its identifier before its close is handled.
        let connection: PostgresConnection
        var waiting: [Int: @Sendable () -> Void] = [:]
    }

    private struct State {
        var next = 0
        var connections: [ObjectIdentifier: Watched] = [:]
    }

    // A pthread mutex (NIO's lock), not `Synchronization.Mutex`: `make sanitize` runs the
    // store tests under ThreadSanitizer, which sees through the first and not the second
    // (futex calls), so a lock it can check is worth more than one it must be told to ignore.
    private let state = NIOLockedValueBox(State())

    /// Registers `lost`, called if `connection` closes before `done(_:on:)`; returns its number.
    func watch(_ connection: PostgresConnection, lost: @escaping @Sendable () -> Void) -> Int {
        let key = ObjectIdentifier(connection)
        let (number, first) = state.withLockedValue { state -> (Int, Bool) in
            state.next += 1
            let first = state.connections[key] == nil
            if first { state.connections[key] = Watched(connection: connection) }
            state.connections[key]?.waiting[state.next] = lost
            return (state.next, first)
        }
        // A connection that is closed already completes the callback at once.
        if first { connection.closeFuture.whenComplete { _ in self.closed(key) } }
        return number
    }

    func done(_ number: Int, on connection: PostgresConnection) {
        _ = state.withLockedValue { $0.connections[ObjectIdentifier(connection)]?.waiting.removeValue(forKey: number) }
    }

    private func closed(_ key: ObjectIdentifier) {
        let lost = state.withLockedValue { $0.connections.removeValue(forKey: key)?.waiting.values.map { $0 } ?? [] }
        for call in lost { call() }
    }

    /// Whether `connection` is watched (for tests: it is forgotten once it closes).
    func watches(_ connection: PostgresConnection) -> Bool {
        state.withLockedValue { $0.connections[ObjectIdentifier(connection)] != nil }
    }
}

/// The connection of a statement closed before the server answered it.
struct ConnectionLost: Error, CustomStringConvertible {
    var description: String { "the connection closed before the server answered" }
}

extension PostgresConnection {
    /// `statement`'s outcome, or `ConnectionLost` as soon as this connection closes (see
    /// `ConnectionWatch`).
    func answered<T: Sendable>(_ statement: @escaping @Sendable (PostgresConnection) async throws -> T) async throws -> T {
        let outcome = OneShot<Result<T, any Error>>()
        let watch = ConnectionWatch.shared
        let number = watch.watch(self) { outcome.resume(.failure(ConnectionLost())) }
        let work = Task {
            let result: Result<T, any Error>
            do {
                result = .success(try await statement(self))
            } catch {
                result = .failure(error)
            }
            watch.done(number, on: self)
            outcome.resume(result)
        }
        return try await withTaskCancellationHandler {
            await outcome.wait()
        } onCancel: {
            work.cancel()
        }.get()
    }
}
