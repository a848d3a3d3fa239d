/// What of a job's row says which of its files are on disk, and which of them go when the
/// row is canceled or deleted: the one rule that `cancel`, `remove` and retention follow, in
/// every backend (each reads these columns back from its statement and asks this).
///
/// A job has at most two files: its partial file (`.part` beside the download path, which
/// holds every range of a segmented download too), and, once completed, the published file at
/// `path`.
public struct JobFiles: Sendable, Equatable {
    public var state: JobState
    public var path: String
    public var stagingPath: String?
    public var attempts: Int64
    public var received: Int64

    public init(state: JobState, path: String, stagingPath: String?, attempts: Int64, received: Int64) {
        self.state = state
        self.path = path
        self.stagingPath = stagingPath
        self.attempts = attempts
        self.received = received
    }

    /// The partial file, when the job ever started (an attempt, or bytes received): a job that
    /// never did has none, and nothing is deleted for it. Nor for a row without a path (a
    /// table edited by hand): ".part" alone would name a file of the daemon's own folder.
    public var partial: String? {
        guard attempts > 0 || received > 0, !path.isEmpty else { return nil }
        return Job.partialPath(path: path, stagingPath: stagingPath)
    }

    /// The file to delete once the row is deleted (`remove`, retention), if any:
    /// - completed: the published file, only when the user asked for it (`deleteFile`):
    ///   nothing the user owns goes silently;
    /// - canceled: none (its partial file went when it was canceled);
    /// - any other state: the partial file, if the job ever started.
    public func fileDeleted(onRemove deleteFile: Bool) -> String? {
        switch state {
        case .completed: return deleteFile && !path.isEmpty ? path : nil
        case .canceled: return nil
        case .queued, .running, .waiting, .paused, .failed: return partial
        }
    }

    /// The files to delete, in order, once the row is deleted: `fileDeleted`, and for a
    /// completed file that another worker may have committed but not linked yet (a fleet), its
    /// partial file and then the file again. Unlinked in this order, the file never appears
    /// after the answer: a link that comes before the second unlink of the file is undone by
    /// it, and one that comes after the partial file went finds nothing to link. `partialFree`
    /// says whether no unfinished job writes to the same path (its partial file is then its own).
    public func filesDeleted(onRemove deleteFile: Bool, partialFree: Bool) -> [String] {
        guard let file = fileDeleted(onRemove: deleteFile) else { return [] }
        guard state == .completed, partialFree, let partial else { return [file] }
        return [file, partial, file]
    }

    /// The file to delete once the job is canceled: its partial file, if it ever started.
    public var fileDeletedOnCancel: String? { partial }
}
