import DLCore
import Foundation

/// How the text columns that hold JSON (`headers`, `options`) are written and read, the same
/// in every backend, so that a table moved from one to the other reads back the same jobs.
public enum ColumnCoding {
    public static func headers(_ headers: [HeaderField]) -> String { encodeHeaders(headers) }
    public static func headers(from text: String) -> [HeaderField] { decodeHeaders(text) }
    public static func options(_ options: JobOptions) -> String { encodeOptions(options) }
    public static func options(from text: String?) -> JobOptions { decodeOptions(text) }

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

    // The JSON columns hold their empty values for almost every job: those skip the coder,
    // which costs more than the rest of the row.

    public static func encodeOptions(_ options: JobOptions) -> String {
        if options == JobOptions() { return "{}" }
        if options.tls != nil || options.maxSpeed != nil || options.segments != nil || options.metered != nil || options.encryptTo != nil {
            // Rare (a job with its own TLS files, speed limit, `segments`, `metered` or
            // `encrypt_to`): the coder
            // writes it, and an older dld that reads the row ignores the key it does not know.
            return (try? JSONEncoder().encode(options)).map { String(decoding: $0, as: UTF8.self) } ?? "{}"
        }
        return "{\"automaticName\":\(options.automaticName),\"renameIfTaken\":\(options.renameIfTaken),\"insecure\":\(options.insecure)}"
    }

    /// The texts `encodeOptions` writes, read without the coder; anything else (an older or
    /// newer dld's) goes through it.
    private static let knownOptions: [String: JobOptions] = {
        var known: [String: JobOptions] = ["{}": JobOptions()]
        for bits in 0..<8 {
            let options = JobOptions(automaticName: bits & 1 != 0, renameIfTaken: bits & 2 != 0, insecure: bits & 4 != 0)
            known[encodeOptions(options)] = options
        }
        return known
    }()

    public static func decodeOptions(_ text: String?) -> JobOptions {
        guard let text else { return JobOptions() }
        if let known = knownOptions[text] { return known }
        return (try? JSONDecoder().decode(JobOptions.self, from: Data(text.utf8))) ?? JobOptions()
    }

    public static func encodeHeaders(_ headers: [HeaderField]) -> String {
        if headers.isEmpty { return "[]" }
        return (try? JSONEncoder().encode(headers)).map { String(decoding: $0, as: UTF8.self) } ?? "[]"
    }

    public static func decodeHeaders(_ text: String) -> [HeaderField] {
        if text == "[]" { return [] }
        return (try? JSONDecoder().decode([HeaderField].self, from: Data(text.utf8))) ?? []
    }
}
