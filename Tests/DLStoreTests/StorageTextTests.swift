import DLJobTable
import DLStore
import GRDB
import Testing

/// The engine words a job table's errors through `StorageText`, whichever backend threw them:
/// SQLite's errors with what to do, anything else only in the log.
@Suite struct StorageTextTests {
    @Test func sqliteErrorsAreWordedForAPerson() {
        let full = DatabaseError(resultCode: .SQLITE_FULL, message: "database or disk is full")
        #expect(StorageText.of(full) == "SQLite: database or disk is full; free some space on the state folder's disk")
        let damaged = DatabaseError(resultCode: .SQLITE_NOTADB, message: "file is not a database")
        #expect(StorageText.of(damaged) == "SQLite: file is not a database; the job table file is damaged")
        struct Other: Error {}
        #expect(StorageText.of(Other()) == "an unexpected error (see dld's log)")
    }
}
