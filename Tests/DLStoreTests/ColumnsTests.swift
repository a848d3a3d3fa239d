import DLCore
import DLJobTable
import Foundation
import Testing

/// The column sets both backends select and decode rows with (`TableColumns`), on rows made
/// here: what a hand-edited or unreadable row gives.
@Suite struct ColumnsTests {
    /// A row whose every cell is NULL, but for `texts`, and `bad`, which cannot be read (as a
    /// PostgreSQL cell of another type).
    struct NullCells: RowCells {
        struct Unreadable: Error {}
        var bad: Int? = nil
        /// Texts that are not NULL, by position.
        var texts: [Int: String] = [:]

        func check(_ position: Int) throws { if position == bad { throw Unreadable() } }
        func int64(_ position: Int) throws -> Int64? {
            try check(position)
            return nil
        }
        func double(_ position: Int) throws -> Double? {
            try check(position)
            return nil
        }
        func text(_ position: Int) throws -> String? {
            try check(position)
            return texts[position]
        }
        func bool(_ position: Int) throws -> Bool? {
            try check(position)
            return nil
        }
    }

    /// Each set lists every column once, in the order of its positions.
    @Test func listsNameEveryColumnInPositionOrder() {
        func check<Columns: TableColumns>(_: Columns.Type) {
            let names = Columns.list.components(separatedBy: ", ")
            #expect(names == Columns.allCases.sorted { $0.rawValue < $1.rawValue }.map(\.name))
            #expect(Set(names).count == names.count)
            #expect(Columns.allCases.map(\.rawValue) == Array(0..<names.count))
        }
        check(JobColumn.self)
        check(GroupColumn.self)
        check(EventColumn.self)
        check(FilesColumn.self)
    }

    /// NULLs where the table keeps values (a table edited by hand) read as empty, never a crash:
    /// the job shows as failed, and names no file to delete.
    @Test func nullsReadAsEmpty() throws {
        let job = try JobColumn.value(from: NullCells())
        #expect(job.id == 0 && job.url == "" && job.state == .failed && job.headers.isEmpty && job.options == JobOptions())
        #expect(job.createdAt == Date(timeIntervalSince1970: 0) && job.error == nil && job.mirrors.isEmpty)
        let group = try GroupColumn.value(from: NullCells())
        #expect(group.closed == nil && group.name == "")
        let event = try EventColumn.value(from: NullCells())
        #expect(event.kind == .jobState && event.state == "")
        let files = try FilesColumn.value(from: NullCells()).files
        #expect(files.fileDeleted(onRemove: true) == nil && files.fileDeletedOnCancel == nil)
    }

    /// A cell the backend cannot read fails the read with its error.
    @Test func unreadableCellsFailTheRead() {
        // With an error code, so that its message is read too.
        let code = [JobColumn.errorCode.rawValue: "http_status"]
        for column in JobColumn.allCases {
            #expect(throws: NullCells.Unreadable.self, "\(column.name)") {
                try JobColumn.value(from: NullCells(bad: column.rawValue, texts: code))
            }
        }
        #expect(throws: NullCells.Unreadable.self) { try GroupColumn.value(from: NullCells(bad: GroupColumn.closed.rawValue)) }
        #expect(throws: NullCells.Unreadable.self) { try EventColumn.value(from: NullCells(bad: EventColumn.kind.rawValue)) }
        #expect(throws: NullCells.Unreadable.self) { try FilesColumn.value(from: NullCells(bad: FilesColumn.path.rawValue)) }
    }
}
