import DLCore

/// How the text columns that hold JSON (`headers`, `options`) are written and read, the same
/// in every backend, so that a table moved from one to the other reads back the same jobs.
public enum ColumnCoding {
    public static func headers(_ headers: [HeaderField]) -> String { JobStore.encodeHeaders(headers) }
    public static func headers(from text: String) -> [HeaderField] { JobStore.decodeHeaders(text) }
    public static func options(_ options: JobOptions) -> String { JobStore.encodeOptions(options) }
    public static func options(from text: String?) -> JobOptions { JobStore.decodeOptions(text) }
}
