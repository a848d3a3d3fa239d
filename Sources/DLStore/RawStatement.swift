import GRDB
import GRDBSQLite

/// A cached statement bound and stepped with SQLite's C API, for the few statements run once a
/// job in bulk (the inserts of an `enqueue` of thousands). Binding through GRDB's
/// `StatementArguments` boxed every value and cost most of an insert; these bind in place
/// (docs/benchmarks.md, "What was tried": `enqueue` and `list` on SQLite's C API). Runs inside
/// a GRDB write transaction only.
struct RawStatement {
    private let db: Database
    private let sql: String
    private let handle: OpaquePointer
    private var index: Int32 = 0

    /// SQLite copies what it is given (`SQLITE_TRANSIENT`).
    private static let transient = unsafeBitCast(OpaquePointer(bitPattern: -1), to: sqlite3_destructor_type.self)

    init(_ sql: String, in db: Database) throws {
        self.db = db
        self.sql = sql
        handle = try db.cachedStatement(sql: sql).sqliteStatement
        sqlite3_reset(handle)
        sqlite3_clear_bindings(handle)
    }

    mutating func bind(_ value: String?) {
        index += 1
        guard let value else {
            sqlite3_bind_null(handle, index)
            return
        }
        // As a C string, as GRDB binds and reads texts, so that both read the same (a NUL
        // ends the text either way).
        sqlite3_bind_text(handle, index, value, -1, Self.transient)
    }

    mutating func bind(_ value: Int64?) {
        index += 1
        guard let value else {
            sqlite3_bind_null(handle, index)
            return
        }
        sqlite3_bind_int64(handle, index, value)
    }

    mutating func bind(_ value: Int) { bind(Int64(value)) }

    mutating func bind(_ value: Bool) { bind(Int64(value ? 1 : 0)) }

    mutating func bind(_ value: Double) {
        index += 1
        sqlite3_bind_double(handle, index, value)
    }

    /// Runs a statement that returns no rows, and makes it ready for the next bindings.
    mutating func execute() throws {
        let code = sqlite3_step(handle)
        defer { rewind() }
        guard code == SQLITE_DONE else { throw error(code) }
    }

    /// Runs a statement whose first row's first column is an integer, or that returns no row.
    mutating func fetchInt() throws -> Int64? {
        let code = sqlite3_step(handle)
        defer { rewind() }
        switch code {
        case SQLITE_ROW: return sqlite3_column_type(handle, 0) == SQLITE_NULL ? nil : sqlite3_column_int64(handle, 0)
        case SQLITE_DONE: return nil
        default: throw error(code)
        }
    }

    private mutating func rewind() {
        sqlite3_reset(handle)
        sqlite3_clear_bindings(handle)
        index = 0
    }

    private func error(_ code: Int32) -> DatabaseError {
        let message = db.sqliteConnection.map { String(cString: sqlite3_errmsg($0)) }
        return DatabaseError(resultCode: ResultCode(rawValue: code), message: message, sql: sql)
    }
}
