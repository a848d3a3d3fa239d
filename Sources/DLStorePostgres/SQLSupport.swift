import DLCore
import DLJobTable
import Foundation
import PostgresNIO

/// Text as the SQLite store keeps it: up to the first NUL. GRDB binds strings as C strings, so
/// SQLite ends a text at a NUL; PostgreSQL refuses a NUL in text outright. Both backends keep
/// the same text, and a stray NUL never fails a write.
func storedText(_ text: String) -> String {
    guard text.utf8.contains(0) else { return text }
    return String(decoding: text.utf8.prefix { $0 != 0 }, as: UTF8.self)
}

extension PostgresQuery.StringInterpolation {
    /// A text parameter, cut at a NUL as `storedText` says.
    mutating func appendInterpolation(text value: String?) {
        appendInterpolation(value.map(storedText))
    }

    /// A `text[]` parameter, each element cut at a NUL.
    mutating func appendInterpolation(texts values: [String]) {
        appendInterpolation(values.map(storedText))
    }
}

/// The values of a statement built piece by piece, each appended with its `$n` placeholder.
/// Every value is a parameter: no text from a request ever becomes SQL.
struct Binds {
    private(set) var bindings = PostgresBindings()

    private mutating func next() -> String { "$\(bindings.count)" }

    mutating func text(_ value: String?) -> String {
        bindings.append(value.map(storedText))
        return next()
    }

    mutating func texts(_ values: [String]) -> String {
        bindings.append(values.map(storedText))
        return next()
    }

    mutating func int(_ value: Int64?) -> String {
        bindings.append(value)
        return next()
    }

    mutating func int(_ value: Int?) -> String { int(value.map(Int64.init)) }

    mutating func ints(_ values: [Int64]) -> String {
        bindings.append(values)
        return next()
    }

    mutating func double(_ value: Double?) -> String {
        bindings.append(value)
        return next()
    }

    mutating func bool(_ value: Bool?) -> String {
        bindings.append(value)
        return next()
    }

    /// A JSON text that `RecordSet` made (its strings already cut at a NUL).
    mutating func json(_ text: String) -> String {
        bindings.append(text)
        return next()
    }

    func query(_ sql: String) -> PostgresQuery { PostgresQuery(unsafeSQL: sql, binds: bindings) }
}

/// Many rows in one statement, as one parameter: a JSON array of objects that
/// `json_to_recordset` turns back into typed rows (a missing key is a NULL).
///
/// Why JSON: with a `VALUES` list of one parameter a value, PostgreSQL spent most of an insert
/// parsing and planning each row of 19 columns; and `unnest` of one array a column cannot
/// carry NULLs, which postgres-nio does not bind inside arrays. Times are numbers written
/// shortest-exact, so they read back as the same `Double`.
struct RecordSet<Record: Encodable>: Sendable {
    /// The columns `json_to_recordset` declares, with their types, in the order of `names`.
    let columns: [(name: String, type: String)]

    /// Records a statement: each statement's JSON stays a few MB.
    static var recordsPerStatement: Int { 1000 }

    /// `a, b, c`
    var names: String { columns.map(\.name).joined(separator: ", ") }

    /// `json_to_recordset(<placeholder>::json) AS r(a bigint, b text, ...)`
    func source(_ placeholder: String) -> String {
        "json_to_recordset(\(placeholder)::json) AS r(" + columns.map { "\($0.name) \($0.type)" }.joined(separator: ", ") + ")"
    }

    /// The JSON texts for `records`, one a statement.
    func chunks(_ records: [Record]) throws -> [String] {
        let encoder = JSONEncoder()
        var chunks: [String] = []
        var start = 0
        while start < records.count {
            let end = min(records.count, start + Self.recordsPerStatement)
            chunks.append(String(decoding: try encoder.encode(Array(records[start..<end])), as: UTF8.self))
            start = end
        }
        return chunks
    }
}

/// Why a PostgreSQL operation failed, in words that are safe to log: the server's SQLSTATE
/// and message, or the kind of connection failure. postgres-nio's own errors print a generic
/// text on purpose; this keeps the useful part and never the query's values or the password.
public struct PostgresStoreError: Error, Sendable, CustomStringConvertible, WordedStorageError {
    public let description: String
    /// What `storage_error` messages say: the same words.
    public var plainText: String { description }
    /// The SQLSTATE, when the server answered with an error.
    public let sqlState: String?

    init(_ error: PSQLError) {
        if let message = error.serverInfo?[.message] {
            let state = error.serverInfo?[.sqlState]
            sqlState = state
            description = "PostgreSQL: \(message)" + (state.map { " (SQLSTATE \($0))" } ?? "")
        } else {
            sqlState = nil
            var text = "PostgreSQL: \(error.code)"
            if let underlying = error.underlying { text += ": \(underlying)" }
            description = text
        }
    }

    init(_ description: String) {
        self.description = description
        sqlState = nil
    }

    /// Any error of postgres-nio (or one of ours, kept as it is).
    init(describing error: any Error) {
        if let error = error as? PostgresStoreError {
            self = error
        } else if let error = error as? PSQLError {
            self.init(error)
        } else if "\(error)".contains("CircuitBreakerTripped") {
            // The pool's own error: it tried to connect for a minute and gave up.
            self.init("PostgreSQL: no connection to the server could be made for a minute")
        } else {
            self.init("PostgreSQL: \(error)")
        }
    }
}

// MARK: Rows

/// A row's cells by position, for the column sets of `DLJobTable` (`TableColumns`), which
/// decode rows the same in both backends. A cell of another type than asked throws.
struct Cells: RowCells {
    let cells: PostgresRandomAccessRow

    init(_ row: PostgresRow) { cells = row.makeRandomAccess() }

    func int64(_ position: Int) throws -> Int64? { try cells[position].decode(Int64?.self) }
    func double(_ position: Int) throws -> Double? { try cells[position].decode(Double?.self) }
    func text(_ position: Int) throws -> String? { try cells[position].decode(String?.self) }
    func bool(_ position: Int) throws -> Bool? { try cells[position].decode(Bool?.self) }
}

extension TableColumns {
    /// A row of `SELECT \(list) …`.
    static func decode(_ row: PostgresRow) throws -> Value { try value(from: Cells(row)) }
}

enum Columns {
    /// Counts by state from `state, count` rows.
    static func counts(_ rows: [PostgresRow]) throws -> [JobState: Int] {
        var counts: [JobState: Int] = [:]
        for row in rows {
            let (state, n) = try row.decode((String, Int64).self)
            if let state = JobState(rawValue: state) { counts[state, default: 0] += Int(n) }
        }
        return counts
    }
}

extension PostgresConnection {
    /// Runs a statement and collects its rows; fails when the connection closes before the
    /// answer (`answered`: postgres-nio would wait forever then).
    func rows(_ query: PostgresQuery, logger: Logger) async throws -> [PostgresRow] {
        try await answered { connection in
            var rows: [PostgresRow] = []
            for try await row in try await connection.query(query, logger: logger) { rows.append(row) }
            return rows
        }
    }

    /// Runs a statement that returns no rows (or whose rows do not matter), as `rows` does.
    func run(_ query: PostgresQuery, logger: Logger) async throws {
        try await answered { connection in
            for try await _ in try await connection.query(query, logger: logger) {}
        }
    }
}
