/// Where a download may be written. A client (or a server, through a proposed file name) must
/// not be able to make the daemon write `~/.ssh/authorized_keys` or `~/.bashrc`.
///
/// Pure: the caller resolves symlinks first (realpath of the destination's folder) and passes
/// resolved absolute paths, so that a link inside an allowed folder cannot point out of it.
public struct PathPolicy: Sendable, Equatable {
    /// Resolved absolute folders that downloads may be written into (at any depth).
    public let allowedRoots: [String]
    /// Resolved `$HOME`; its hidden entries are refused unless a root lies inside them. nil (or a
    /// relative path) turns that rule off, so pass it whenever it is known.
    public let home: String?
    /// The same, split once: every enqueued job is checked twice.
    private let roots: [[Substring]]
    private let homeParts: [Substring]?

    public init(allowedRoots: [String], home: String?) {
        self.allowedRoots = allowedRoots
        self.home = home
        roots = allowedRoots.compactMap(Self.components)
        homeParts = home.flatMap(Self.components)
    }

    /// nil if `path` (resolved, absolute, normalized: no `.`/`..` segments) may be written; else
    /// the reason it may not, for the user.
    ///
    /// - The path must be strictly inside one of `allowedRoots`, compared by components:
    ///   `/home/u/Downloads2/x` is not inside `/home/u/Downloads`, and a root itself is a folder,
    ///   not a file to write.
    /// - A path under a hidden entry of `home` (`~/.ssh/…`, `~/.config/…`, or a hidden file such
    ///   as `~/.bashrc` itself) is refused unless the root that admits it lies at or inside that
    ///   hidden entry: `$HOME` as a root does not open `~/.ssh`, `~/.local/share` as a root does
    ///   open `~/.local/share/x`.
    /// - A relative path, one with `.`, `..` or empty segments, or one with a NUL is refused:
    ///   it is not what the caller resolved, and comparing it by components would be wrong.
    public func refusal(for path: String) -> String? {
        var shown: String { String(path.prefix(200)) }
        guard path.hasPrefix("/") else { return "\(shown) is not an absolute path" }
        guard !path.unicodeScalars.contains("\u{0}") else { return "the path contains a NUL character" }
        // Substrings: no copy of each segment (this runs once or twice a job of an enqueue).
        let parts = Array(path.split(separator: "/", omittingEmptySubsequences: false).dropFirst())
        if parts.contains(where: { $0 == "." || $0 == ".." }) {
            return "\(shown) has a . or .. segment; give the resolved path"
        }
        if parts.contains("") { return "\(shown) is not a normalized file path" }

        guard !roots.isEmpty else { return "no download folder is allowed" }
        let admitting = roots.filter { parts.count > $0.count && parts.starts(with: $0) }
        guard !admitting.isEmpty else {
            let list = allowedRoots.prefix(5).joined(separator: ", ")
            if roots.contains(parts) { return "\(shown) is an allowed folder, not a file inside one" }
            return "\(shown) is outside the allowed download folders (\(list))"
        }

        if let home = homeParts, parts.count > home.count, parts.starts(with: home),
            parts[home.count].hasPrefix(".")
        {
            let hidden = Array(parts[...home.count])
            guard admitting.contains(where: { $0.starts(with: hidden) }) else {
                return "\(shown) is inside the hidden \("/" + hidden.joined(separator: "/")); "
                    + "list that folder as a download folder to allow it"
            }
        }
        return nil
    }

    /// Folders already seen to admit the names put in them, for `refusal(forName:in:memo:)`.
    public struct Memo: Sendable {
        fileprivate var admitted: Set<String> = []
        public init() {}
    }

    /// `refusal(for: folder + "/" + name)`, for an enqueue of thousands of names into a few
    /// folders: the verdict on a name depends on its folder and on whether the name is hidden
    /// (`.x`, which matters in `$HOME` itself), so an admitted (folder, hidden) pair is kept in
    /// `memo` and the path is not split again. `folder` is absolute and normalized (or "/"),
    /// `name` one segment.
    public func refusal(forName name: String, in folder: String, memo: inout Memo) -> String? {
        let path = (folder == "/" ? "" : folder) + "/" + name
        // A NUL, "/" or dot segment is the full check's to describe.
        guard !name.isEmpty, name != ".", name != "..", !name.utf8.contains(0), !name.utf8.contains(UInt8(ascii: "/")) else {
            return refusal(for: path)
        }
        let key = (name.hasPrefix(".") ? "." : "-") + folder
        if memo.admitted.contains(key) { return nil }
        let verdict = refusal(for: path)
        if verdict == nil { memo.admitted.insert(key) }
        return verdict
    }

    /// The segments of an absolute folder, ignoring empty ones and a final slash; nil when it is
    /// relative or has `.`/`..` (such a root is ignored: it can never match a resolved path).
    private static func components(_ folder: String) -> [Substring]? {
        guard folder.hasPrefix("/") else { return nil }
        let parts = folder.split(separator: "/")
        guard !parts.contains(where: { $0 == "." || $0 == ".." }) else { return nil }
        return parts
    }
}
