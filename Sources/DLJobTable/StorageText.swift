/// An error of a job table that its backend words for a person (the `storage_error` message):
/// the database's short reason and what to do, never an SQL statement or a type name. Each
/// backend makes its own errors conform, so that the engine words them without knowing which
/// backend it runs on.
public protocol WordedStorageError: Error {
    var plainText: String { get }
}

public enum StorageText {
    /// The words of any error a job table threw; one that no backend words is named only in
    /// the log (where the whole error goes).
    public static func of(_ error: any Error) -> String {
        (error as? any WordedStorageError)?.plainText ?? "an unexpected error (see dld's log)"
    }
}
