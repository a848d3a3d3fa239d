import DLCore
import Foundation

/// How the text columns that hold JSON (`headers`, `options`) are written and read, the same
/// in every backend, so that a table moved from one to the other reads back the same jobs.
public enum ColumnCoding {
    public static func headers(_ headers: [HeaderField]) -> String { JobStore.encodeHeaders(headers) }
    public static func headers(from text: String) -> [HeaderField] { JobStore.decodeHeaders(text) }
    public static func options(_ options: JobOptions) -> String { JobStore.encodeOptions(options) }
    public static func options(from text: String?) -> JobOptions { JobStore.decodeOptions(text) }

    /// The `mirrors` column: NULL for a job without mirrors (almost all), else
    /// `{"mirrors": [{"url", "dropped"}], "url_dropped"}`.
    public static func mirrors(_ job: Job) -> String? { mirrors(job.mirrors, urlDropped: job.urlDropped) }

    public static func mirrors(_ mirrors: [JobMirror], urlDropped: String?) -> String? {
        guard !mirrors.isEmpty else { return nil }
        let column = MirrorColumn(mirrors: mirrors, urlDropped: urlDropped)
        return (try? JSONEncoder().encode(column)).map { String(decoding: $0, as: UTF8.self) }
    }

    /// Reads the `mirrors` column into `job`; a text that cannot be read leaves no mirrors.
    public static func mirrors(from text: String?, into job: inout Job) {
        guard let text, let column = try? JSONDecoder().decode(MirrorColumn.self, from: Data(text.utf8)) else { return }
        job.mirrors = column.mirrors
        job.urlDropped = column.urlDropped
    }
}
