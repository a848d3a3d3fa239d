import Foundation

/// One daemon per state folder: an exclusive `flock` on `<state>/dld.lock`, held for the
/// daemon's life and released by the kernel when the process dies, however it dies. It cannot
/// tell two daemons apart on a network filesystem without working locks.
public final class StateLock: Sendable {
    public let path: String
    private let fd: Int32

    public init(stateDir: String) throws {
        path = stateDir + "/dld.lock"
        let fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            throw DaemonError("cannot open lock file \(path): \(String(cString: strerror(errno)))")
        }
        guard flock(fd, LOCK_EX | LOCK_NB) == 0 else {
            let holder = (try? String(contentsOfFile: path, encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines)
            close(fd)
            throw DaemonError(
                "another dld is running with this state folder: it holds the lock \(path)"
                    + (holder.map { $0.isEmpty ? "" : " (pid \($0))" } ?? ""))
        }
        ftruncate(fd, 0)
        let pid = "\(getpid())\n"
        _ = pid.withCString { write(fd, $0, strlen($0)) }
        self.fd = fd
    }

    deinit { close(fd) }
}

/// Folder creation with fixed modes, whatever the umask.
enum Folders {
    /// Creates `path` (and parents) if needed; the last component gets `mode`. A folder owned
    /// by another user is refused; a looser mode is tightened. Returns the old mode when it
    /// had to be tightened, so that the caller can say so.
    @discardableResult
    static func ensure(_ path: String, mode: mode_t) throws -> mode_t? {
        let existed = FileManager.default.fileExists(atPath: path)
        do {
            try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        } catch {
            throw DaemonError("cannot create folder \(path): \(error.localizedDescription)")
        }
        var info = stat()
        guard lstat(path, &info) == 0, (info.st_mode & S_IFMT) == S_IFDIR else {
            throw DaemonError("\(path) is not a folder")
        }
        guard info.st_uid == getuid() else {
            throw DaemonError("\(path) belongs to another user (uid \(info.st_uid)); refusing to use it")
        }
        let old = info.st_mode & 0o777
        guard old != mode else { return nil }
        guard chmod(path, mode) == 0 else {
            throw DaemonError("cannot set mode \(String(mode, radix: 8)) on \(path): \(String(cString: strerror(errno)))")
        }
        // A folder just created under the umask is not news; one that was looser is.
        return existed ? old : nil
    }
}
