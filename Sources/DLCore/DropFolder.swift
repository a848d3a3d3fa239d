/// The pure rules of the drop folder (`watch_dir`, docs/operations.md "The drop folder"): which
/// handler a dropped name goes to, the job key that says where a line came from, and the names a
/// file takes in `added/` and `failed/`. The daemon's `DropFolderWatch` does the I/O.
public enum DropFolderRules {
    /// What a dropped file is, by the end of its name.
    public enum Kind: String, Sendable, Equatable {
        /// An input list (`*.txt`), the format of `dlctl enqueue -i`.
        case inputList
        /// A Metalink file (`*.meta4`), enqueued in `enqueue`'s Metalink form.
        case metalink
    }

    /// The suffixes the folder takes, matched without regard to case. Anything else is left
    /// where it is.
    public static let suffixes: [(suffix: String, kind: Kind)] = [(".txt", .inputList), (".meta4", .metalink)]

    /// The largest file read: a list of 10 000 long URLs with their options fits many times over;
    /// the folder is untrusted input, and a file is read whole into memory.
    public static let maxBytes = 16 << 20

    /// The sub-folders beside the dropped files.
    public static let added = "added"
    public static let failed = "failed"

    /// The kind of a dropped name, or nil when the folder leaves it alone: other suffixes,
    /// hidden names (an editor's or a copy's temporary file, which is renamed in when done), and
    /// a suffix alone (".txt").
    public static func kind(of name: String) -> Kind? {
        guard !name.hasPrefix("."), !name.contains("/") else { return nil }
        let lowered = name.lowercased()
        for (suffix, kind) in suffixes where lowered.hasSuffix(suffix) && lowered.count > suffix.count { return kind }
        return nil
    }

    /// The job key of line `line` of a dropped file: `watch:<dev>:<inode>:<mtime_ns>:<sha256>:<line>`.
    ///
    /// Exactly once: dld enqueues a file's lines in one transaction, then moves the file; a crash
    /// between the two leaves the same file (same device, inode, modification time and content:
    /// dld never writes to it) in the folder, so the sweep at the next start computes the same
    /// keys, the existing jobs come back with `created: false` and only missing ones are made.
    /// The file's identity is in the key as well as its content so that the same list dropped
    /// again later (a copy: another inode) is downloaded again, as a user who drops it twice
    /// expects; and a file edited before the restart is a new file.
    public static func key(device: UInt64, inode: UInt64, mtimeNanoseconds: Int64, sha256: String, line: Int) -> String {
        "watch:\(device):\(inode):\(mtimeNanoseconds):\(sha256):\(line)"
    }

    /// The name a file takes in `added/` or `failed/` at its `attempt`-th try: the name itself
    /// first, then `NAME-1.txt`, `NAME-2.txt`… (the number before the last suffix, so that the
    /// kind stays visible). A name in those folders is never replaced: the caller tries the
    /// next attempt when one is taken.
    public static func candidate(_ name: String, attempt: Int) -> String {
        guard attempt > 0 else { return name }
        if let dot = name.lastIndex(of: "."), dot != name.startIndex {
            return "\(name[..<dot])-\(attempt)\(name[dot...])"
        }
        return "\(name)-\(attempt)"
    }

    /// The `NAME.error` file written beside a failed file.
    public static func errorFileName(_ name: String) -> String { name + ".error" }

    /// The text of `NAME.error`: what was dropped and why it was refused (for an input list the
    /// reason starts with `line N:`). Nothing of that file was enqueued.
    public static func errorText(name: String, reason: String) -> String {
        "\(name): \(reason)\nNothing of this file was enqueued. Fix it and drop it into the folder again.\n"
    }

    /// The line an enqueue error is about, from its `jobs[N]:` prefix (N the 0-based index of
    /// the job in the call), and the message without the prefix; nil when the error is not
    /// about one job.
    public static func jobIndex(inMessage message: String) -> (index: Int, rest: String)? {
        guard message.hasPrefix("jobs["), let close = message.firstIndex(of: "]") else { return nil }
        let digits = message[message.index(message.startIndex, offsetBy: 5)..<close]
        guard let index = Int(digits), index >= 0 else { return nil }
        var rest = message[message.index(after: close)...]
        if rest.hasPrefix(":") { rest = rest.dropFirst() }
        if rest.hasPrefix(" ") { rest = rest.dropFirst() }
        return (index, String(rest))
    }
}
