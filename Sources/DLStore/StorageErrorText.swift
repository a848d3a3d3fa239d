import DLJobTable
import Foundation
import GRDB

/// A storage error in words for a person (the `storage_error` message): SQLite's own short
/// message and what to do, never the SQL statement or a type name. The whole error is logged.
/// (The PostgreSQL store's errors are worded by that store.)
public enum StorageErrorText {
    public static func plain(_ error: any Error) -> String {
        if let database = error as? DatabaseError {
            let message = database.message ?? "error \(database.resultCode.rawValue)"
            switch database.resultCode {
            case .SQLITE_FULL: return "SQLite: \(message); free some space on the state folder's disk"
            case .SQLITE_READONLY, .SQLITE_PERM, .SQLITE_CANTOPEN:
                return "SQLite: \(message); check the state folder's permissions"
            case .SQLITE_IOERR: return "SQLite: \(message); the state folder's disk reported an I/O error"
            case .SQLITE_CORRUPT, .SQLITE_NOTADB: return "SQLite: \(message); the job table file is damaged"
            default: return "SQLite: \(message)"
            }
        }
        return "an unexpected error (see dld's log)"
    }
}

extension DatabaseError: WordedStorageError {
    public var plainText: String { StorageErrorText.plain(self) }
}
