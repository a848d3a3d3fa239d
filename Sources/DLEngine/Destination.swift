import DLCore
import Foundation

/// Where an enqueued job's file goes: `path`, or `dir` (+ `name`), or the download folder with
/// a name from the URL. Checks what the filesystem says, so it lives here and not in the core.
///
/// The folder is resolved (symlinks followed) before the path policy is asked, so that a link
/// inside an allowed folder cannot lead out of it, and the job records the resolved path.
public struct Destination {
    var downloadDir: String
    var policy: PathPolicy?
    /// Folders resolved during one request: an enqueue of 10 000 jobs into one folder asks
    /// the filesystem once, not 10 000 times.
    private let resolved = FolderCache()
    /// The jobs of the request: from `Listing.minimumJobs` on, a folder's names are read once
    /// instead of two `lstat` calls a job.
    private let jobs: Int

    init(downloadDir: String, policy: PathPolicy?, jobs: Int = 1) {
        self.downloadDir = downloadDir
        self.policy = policy
        self.jobs = jobs
    }

    private final class FolderCache {
        var folders: [String: String] = [:]
        /// Per resolved folder: its names, or nil when it was too large to list (then each
        /// name is asked with `lstat`).
        var listings: [String: Listing?] = [:]
        var policyMemo = PathPolicy.Memo()
    }

    /// The names in one folder, read with `readdir` when a request puts many jobs into it: 5000
    /// jobs cost one pass over the folder instead of 10 000 `lstat` calls. A name that appears
    /// after the listing is caught where it is caught anyway: the file is published with
    /// `renameat2(RENAME_NOREPLACE)`.
    struct Listing {
        static let minimumJobs = 64
        /// The names and whether each is a folder (nil: the folder did not say).
        var entries: [String: Bool?] = [:]

        /// nil when the folder cannot be read or holds more than `limit` names.
        init?(folder: String, limit: Int) {
            guard let dir = opendir(folder) else { return nil }
            defer { closedir(dir) }
            while let entry = readdir(dir) {
                guard entries.count < limit else { return nil }
                let type = entry.pointee.d_type
                let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                    String(decoding: raw.prefix(while: { $0 != 0 }), as: UTF8.self)
                }
                entries[name] = type == UInt8(DT_UNKNOWN) ? nil : type == UInt8(DT_DIR)
            }
        }
    }

    struct Resolved: Equatable {
        var path: String
        /// The name came from the URL (no `path` or `name` given): a name the server proposes
        /// may replace it.
        var automatic: Bool
    }

    func resolve(
        url: String, path: String?, dir: String?, name: String?, overwrite: Bool, onExists: ExistingFilePolicy,
        encrypted: Bool = false, taken: (String) -> Bool = { _ in false }
    ) throws(DLError) -> Resolved {
        var target: String
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
                guard !name.isEmpty, !name.utf8.contains(UInt8(ascii: "/")), name != ".", name != "..", !name.utf8.contains(0) else {
                    throw .invalidParams("\"name\" must be a file name without \"/\", got \(name)")
                }
                fileName = name
            } else {
                fileName = FileNames.fromURL(url)
            }
            target = Self.normalized(folder + "/" + fileName)
        }
        // An encrypted file is published as `<name>.age`: that is the name checked and kept.
        if encrypted { target = AgeLayout.encryptedName(target) }
        // `target` is normalized: absolute, no empty, "." or ".." segments.
        // Scanned as bytes: "/" is ASCII, so its index is a character boundary too.
        let slash = target.utf8.lastIndex(of: UInt8(ascii: "/")) ?? target.startIndex
        let parent = slash == target.startIndex ? "/" : String(target[..<slash])
        let fileName = String(target[target.index(after: slash)...])
        guard !fileName.isEmpty else { throw DLError(.destinationInvalid, "\(target) is not a file path") }
        guard !Self.hasPartSuffix(fileName) else {
            throw DLError(.destinationInvalid, "\(fileName): names ending in .part are kept for partial files")
        }
        // Asked twice: of the path as written (so `..` out of a root is refused as such), and of
        // the path with the folder's symlinks resolved (so a link cannot lead out).
        try check(fileName, in: parent)
        let folder = try resolvedFolder(parent)
        var candidate = (folder == "/" ? "" : folder) + "/" + fileName
        if candidate != target { try check(fileName, in: folder) }
        var n = 1
        var candidateName = fileName
        while try occupied(candidateName, in: folder, overwrite: overwrite) || taken(candidate) {
            guard onExists == .rename, n < 10_000 else {
                throw DLError(.destinationExists, "\(candidate) exists already; pass overwrite to replace it, or on_exists \"rename\"")
            }
            n += 1
            candidateName = FileNames.numbered(fileName, n)
            candidate = (folder == "/" ? "" : folder) + "/" + candidateName
        }
        return Resolved(path: candidate, automatic: path == nil && name == nil)
    }

    /// Whether a name ends in ".part", in any case (the suffix is ASCII: compared as bytes,
    /// without lowercasing the whole name).
    static func hasPartSuffix(_ name: String) -> Bool {
        let suffix = Array(name.utf8.suffix(5))
        // Only "P", "A", "R", "T" lowercase to these letters; "." has no case.
        return suffix.count == 5 && suffix[0] == UInt8(ascii: ".")
            && zip(suffix.dropFirst(), "part".utf8).allSatisfy { ($0 | 0x20) == $1 }
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
    public static func realPath(_ path: String) -> String? {
        guard let real = realpath(path, nil) else { return nil }
        defer { free(real) }
        return String(cString: real)
    }

    /// The path policy's verdict on a name in a folder, as an error.
    func check(_ name: String, in folder: String) throws(DLError) {
        guard let policy else { return }
        if let refusal = policy.refusal(forName: name, in: folder, memo: &resolved.policyMemo) {
            throw DLError(.destinationNotAllowed, refusal)
        }
    }

    /// Whether the name is taken: by a file (a symlink counts, it is not followed), or by a
    /// partial file that is not ours (a browser's `.part`, say).
    private func occupied(_ name: String, in folder: String, overwrite: Bool) throws(DLError) -> Bool {
        let path = (folder == "/" ? "" : folder) + "/" + name
        if let listing = listing(of: folder) {
            switch listing.entries[name] {
            case .none: break
            case .some(.some(true)): throw DLError(.destinationInvalid, "\(path) is a folder")
            case .some(.some(false)): if !overwrite { return true }
            case .some(.none): if try exists(path, overwrite: overwrite) { return true }
            }
            return listing.entries[name + ".part"] != nil
        }
        if try exists(path, overwrite: overwrite) { return true }
        var info = stat()
        return lstat(path + ".part", &info) == 0
    }

    /// `lstat`: a folder is an error, a file counts unless it may be overwritten.
    private func exists(_ path: String, overwrite: Bool) throws(DLError) -> Bool {
        var info = stat()
        guard lstat(path, &info) == 0 else { return false }
        if (info.st_mode & S_IFMT) == S_IFDIR { throw DLError(.destinationInvalid, "\(path) is a folder") }
        return !overwrite
    }

    /// The folder's listing when this request is large enough to want one.
    private func listing(of folder: String) -> Listing? {
        guard jobs >= Listing.minimumJobs else { return nil }
        if let known = resolved.listings[folder] { return known }
        let listing = Listing(folder: folder, limit: max(4096, 4 * jobs))
        resolved.listings[folder] = listing
        return listing
    }

    /// Removes `.` and `..` segments and doubled slashes, without touching the filesystem.
    static func normalized(_ path: String) -> String {
        isNormalized(path) ? path : normalizedByParts(path)
    }

    /// `normalized` the long way, segment by segment (what the fast path must agree with).
    static func normalizedByParts(_ path: String) -> String {
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

    /// Absolute, no empty, `.` or `..` segment, no final slash: most paths, returned as they are.
    static func isNormalized(_ path: String) -> Bool {
        var bytes = path.utf8.makeIterator()
        guard bytes.next() == UInt8(ascii: "/") else { return false }
        var length = 0  // of the current segment
        var dots = 0  // in it
        while let byte = bytes.next() {
            if byte == UInt8(ascii: "/") {
                if length == 0 || (dots == length && dots <= 2) { return false }
                length = 0
                dots = 0
            } else {
                length += 1
                if byte == UInt8(ascii: ".") { dots += 1 }
            }
        }
        return length > 0 && !(dots == length && dots <= 2)
    }
}
