import DLCore
import Foundation

/// Where an enqueued job's file goes: `path`, or `dir` (+ `name`), or the download folder with
/// a name from the URL. Checks what the filesystem says, so it lives here and not in the core.
///
/// The folder is resolved (symlinks followed) before the path policy is asked, so that a link
/// inside an allowed folder cannot lead out of it, and the job records the resolved path.
struct Destination {
    var downloadDir: String
    var policy: PathPolicy?
    /// Folders resolved during one request: an enqueue of 10 000 jobs into one folder asks
    /// the filesystem once, not 10 000 times.
    private let resolved = FolderCache()

    init(downloadDir: String, policy: PathPolicy?) {
        self.downloadDir = downloadDir
        self.policy = policy
    }

    private final class FolderCache {
        var folders: [String: String] = [:]
    }

    struct Resolved: Equatable {
        var path: String
        /// The name came from the URL (no `path` or `name` given): a name the server proposes
        /// may replace it.
        var automatic: Bool
    }

    func resolve(
        url: String, path: String?, dir: String?, name: String?, overwrite: Bool, onExists: ExistingFilePolicy,
        taken: (String) -> Bool = { _ in false }
    ) throws(DLError) -> Resolved {
        let target: String
        if let path {
            guard dir == nil, name == nil else {
                throw .invalidParams("give either \"path\", or \"dir\" and \"name\", not both")
            }
            guard path.hasPrefix("/") else { throw .invalidParams("\"path\" must be absolute, got \(path)") }
            target = Self.normalized(path)
        } else {
            let folder = dir ?? downloadDir
            guard folder.hasPrefix("/") else { throw .invalidParams("\"dir\" must be absolute, got \(folder)") }
            let fileName: String
            if let name {
                guard !name.isEmpty, !name.contains("/"), name != ".", name != "..", !name.contains("\0") else {
                    throw .invalidParams("\"name\" must be a file name without \"/\", got \(name)")
                }
                fileName = name
            } else {
                fileName = FileNames.fromURL(url)
            }
            target = Self.normalized(folder + "/" + fileName)
        }
        let parent = (target as NSString).deletingLastPathComponent
        let fileName = (target as NSString).lastPathComponent
        guard !fileName.isEmpty, fileName != "/" else { throw DLError(.destinationInvalid, "\(target) is not a file path") }
        guard !fileName.lowercased().hasSuffix(".part") else {
            throw DLError(.destinationInvalid, "\(fileName): names ending in .part are kept for partial files")
        }
        // Asked twice: of the path as written (so `..` out of a root is refused as such), and of
        // the path with the folder's symlinks resolved (so a link cannot lead out).
        try check(target)
        let folder = try resolvedFolder(parent)
        var candidate = folder + "/" + fileName
        try check(candidate)
        var n = 1
        while try occupied(candidate, overwrite: overwrite) || taken(candidate) {
            guard onExists == .rename, n < 10_000 else {
                throw DLError(.destinationExists, "\(candidate) exists already; pass overwrite to replace it, or on_exists \"rename\"")
            }
            n += 1
            candidate = folder + "/" + FileNames.numbered(fileName, n)
        }
        return Resolved(path: candidate, automatic: path == nil && name == nil)
    }

    /// The folder with symlinks resolved; it must exist.
    func resolvedFolder(_ folder: String) throws(DLError) -> String {
        if let real = resolved.folders[folder] { return real }
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: folder, isDirectory: &isDirectory), isDirectory.boolValue,
            let real = Self.realPath(folder)
        else {
            throw DLError(.destinationInvalid, "the folder \(folder) does not exist")
        }
        resolved.folders[folder] = real
        return real
    }

    /// `realpath(3)`: absolute, symlinks resolved; nil when the path does not exist.
    static func realPath(_ path: String) -> String? {
        guard let real = realpath(path, nil) else { return nil }
        defer { free(real) }
        return String(cString: real)
    }

    /// The path policy's verdict, as an error.
    func check(_ path: String) throws(DLError) {
        if let refusal = policy?.refusal(for: path) {
            throw DLError(.destinationNotAllowed, refusal)
        }
    }

    /// Whether the name is taken: by a file (a symlink counts, it is not followed), or by a
    /// partial file that is not ours (a browser's `.part`, say).
    private func occupied(_ path: String, overwrite: Bool) throws(DLError) -> Bool {
        var info = stat()
        if lstat(path, &info) == 0 {
            if (info.st_mode & S_IFMT) == S_IFDIR { throw DLError(.destinationInvalid, "\(path) is a folder") }
            if !overwrite { return true }
        }
        if lstat(path + ".part", &info) == 0 { return true }
        return false
    }

    /// Removes `.` and `..` segments and doubled slashes, without touching the filesystem.
    static func normalized(_ path: String) -> String {
        var parts: [Substring] = []
        for part in path.split(separator: "/", omittingEmptySubsequences: true) {
            if part == "." { continue }
            if part == ".." {
                if !parts.isEmpty { parts.removeLast() }
                continue
            }
            parts.append(part)
        }
        return "/" + parts.joined(separator: "/")
    }
}
