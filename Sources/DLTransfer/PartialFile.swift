import CDLSystem
import DLCore
import Foundation
import NIOPosix

#if canImport(Glibc)
    import Glibc
#endif

/// The `<name>.part` file a transfer writes into, by offset. Its bytes before the committed
/// offset are synced before that offset is recorded (durability rule 2).
public final class PartialFile {
    public let path: String
    private(set) var fd: Int32

    /// Opens or creates the file without following a symlink at its name.
    public init(path: String) throws(TransferFailure) {
        self.path = path
        fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o644)
        if fd < 0 { throw Self.failure("open", path, errno) }
    }

    deinit { close() }

    public func close() {
        if fd >= 0 {
            _ = Glibc.close(fd)
            fd = -1
        }
    }

    public func size() throws(TransferFailure) -> Int64 {
        var info = stat()
        guard fstat(fd, &info) == 0 else { throw Self.failure("stat", path, errno) }
        return Int64(info.st_size)
    }

    public func truncate(to length: Int64) throws(TransferFailure) {
        guard ftruncate(fd, off_t(length)) == 0 else { throw Self.failure("truncate", path, errno) }
    }

    /// Writes all of `bytes` at `offset`.
    public func write(_ bytes: UnsafeRawBufferPointer, at offset: Int64) throws(TransferFailure) {
        try writer.write(bytes, at: offset)
    }

    /// Reads the first `length` bytes in 1 MiB blocks.
    public func read(upTo length: Int64, _ body: (UnsafeRawBufferPointer) -> Void) throws(TransferFailure) {
        guard length > 0 else { return }
        var buffer = [UInt8](repeating: 0, count: Int(min(length, 1 << 20)))
        var offset: Int64 = 0
        while offset < length {
            let want = Int(min(Int64(buffer.count), length - offset))
            let n = buffer.withUnsafeMutableBytes { pread(fd, $0.baseAddress, want, off_t(offset)) }
            if n < 0 {
                if errno == EINTR { continue }
                throw Self.failure("read", path, errno)
            }
            if n == 0 { throw TransferFailure(.permanent, .fileError, "\(path) is shorter than its recorded \(length) bytes") }
            buffer.withUnsafeBytes { body(UnsafeRawBufferPointer(rebasing: $0[..<n])) }
            offset += Int64(n)
        }
    }

    /// The descriptor and name, for the workers of a segmented download: each writes its own
    /// range with `pwrite`, which needs no shared position.
    var writer: Writer { Writer(fd: fd, path: path) }

    /// Positioned I/O on a partial file that its owner keeps open while any copy is in use.
    struct Writer: Sendable {
        let fd: Int32
        let path: String

        func write(_ bytes: UnsafeRawBufferPointer, at offset: Int64) throws(TransferFailure) {
            var done = 0
            while done < bytes.count {
                let n = pwrite(fd, bytes.baseAddress.map { $0 + done }, bytes.count - done, off_t(offset) + off_t(done))
                if n < 0 {
                    if errno == EINTR { continue }
                    throw PartialFile.failure("write", path, errno)
                }
                done += n
            }
        }

        /// Reads `range` in blocks of up to 1 MiB into `buffer` (kept by the caller, so that a
        /// reader allocates once).
        func read(_ range: Range<Int64>, buffer: inout [UInt8], _ body: (UnsafeRawBufferPointer) -> Void) throws(TransferFailure) {
            var offset = range.lowerBound
            while offset < range.upperBound {
                let want = Int(min(Int64(buffer.count), range.upperBound - offset))
                let n = buffer.withUnsafeMutableBytes { pread(fd, $0.baseAddress, want, off_t(offset)) }
                if n < 0 {
                    if errno == EINTR { continue }
                    throw PartialFile.failure("read", path, errno)
                }
                if n == 0 {
                    throw TransferFailure(.permanent, .fileError, "\(path) is shorter than the \(range.upperBound) bytes written to it")
                }
                buffer.withUnsafeBytes { body(UnsafeRawBufferPointer(rebasing: $0[..<n])) }
                offset += Int64(n)
            }
        }
    }

    /// Reserves blocks for the rest of a known size without changing the file's size (so the
    /// size still says how far the data goes). Filesystems without fallocate are left alone.
    public func reserve(from offset: Int64, length: Int64) throws(TransferFailure) {
        // A small file gets its blocks as it is written; the call would only cost time.
        guard length >= Self.reserveThreshold else { return }
        if dld_reserve_keep_size(fd, off_t(offset), off_t(length)) != 0 {
            let code = errno
            if code == ENOSPC || code == EDQUOT { throw Self.failure("reserve space for", path, code) }
        }
    }

    /// Below this, `reserve` does nothing.
    static let reserveThreshold: Int64 = 1 << 20

    /// Data only: the size is fixed by the committed offset, and metadata is synced at publish.
    public func syncData() throws(TransferFailure) {
        guard fdatasync(fd) == 0 else { throw Self.syncFailure(path, errno) }
    }

    /// fsync of the file's folder, so that its name is durable.
    public func syncFolder() throws(TransferFailure) {
        let code = Self.syncFolder((path as NSString).deletingLastPathComponent)
        guard code == 0 else { throw Self.syncFailure(path, code) }
    }

    /// fsync on a thread of the disk pool: it can take as long as the disk needs, and a
    /// cooperative thread must not wait that long.
    public func syncOffThread() async throws {
        let fd = self.fd
        let code = try await DiskPool.shared.runIfActive { fsync(fd) == 0 ? 0 : errno }
        if code != 0 { throw Self.syncFailure(path, code) }
    }

    /// The descriptor, for work handed to another thread; valid until `close`.
    var descriptor: Int32 { fd }

    /// fdatasync then `commit` (durability rule 2: the bytes before the offset are on disk
    /// before the offset is recorded), off the cooperative threads. With `folder`, the folder
    /// is synced too, so that the file's name is as durable as its bytes: a `.part` created
    /// since its folder was last synced would vanish in a power cut with every offset
    /// committed for it (the attempt's first checkpoint asks for it).
    static func syncData(
        fd: Int32, path: String, _ checkpoint: TransferCheckpoint, folder: Bool = false,
        then commit: @Sendable (TransferCheckpoint) async throws -> Void
    ) async throws {
        let code = try await DiskPool.shared.runIfActive { () -> Int32 in
            guard fdatasync(fd) == 0 else { return errno }
            return folder ? syncFolder((path as NSString).deletingLastPathComponent) : 0
        }
        if code != 0 { throw syncFailure(path, code) }
        try await commit(checkpoint)
    }

    /// Moves the complete file to its final name (durability rule 4; the caller syncs the
    /// folder, once per batch). Without `overwrite`, an existing file is never replaced:
    /// `link` fails when the name exists, atomically, where a check-then-rename would race.
    /// `calls` are the system's; tests hand in failing ones to take the fallbacks that other
    /// filesystems need.
    public static func link(_ partial: String, to final: String, overwrite: Bool, calls: LinkCalls = .system) throws(TransferFailure) {
        if overwrite {
            guard rename(partial, final) == 0 else { throw failure("rename", final, errno) }
        } else if calls.renameNoReplace(partial, final) == 0 {
            // One atomic call that never replaces (renameat2 RENAME_NOREPLACE).
        } else if errno == EEXIST {
            throw TransferFailure(
                .permanent, .destinationExists,
                "\(final) appeared while downloading; it was not replaced (the download is kept at \(partial))")
        } else if calls.hardLink(partial, final) == 0 {
            // Filesystems without RENAME_NOREPLACE: link, which fails on an existing name.
            unlink(partial)
        } else {
            let linkErrno = errno
            if linkErrno == EEXIST {
                throw TransferFailure(
                    .permanent, .destinationExists,
                    "\(final) appeared while downloading; it was not replaced (the download is kept at \(partial))")
            }
            // Filesystems without hard links: check, then rename. The window is small and only
            // our own user can write there.
            guard linkErrno == EPERM || linkErrno == EOPNOTSUPP || linkErrno == ENOSYS else {
                throw failure("link", final, linkErrno)
            }
            if access(final, F_OK) == 0 {
                throw TransferFailure(
                    .permanent, .destinationExists,
                    "\(final) appeared while downloading; it was not replaced (the download is kept at \(partial))")
            }
            guard rename(partial, final) == 0 else { throw failure("rename", final, errno) }
        }
    }

    /// fsync of `folder`; 0 or the errno.
    public static func syncFolder(_ folder: String) -> Int32 {
        let dfd = open(folder.isEmpty ? "." : folder, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard dfd >= 0 else { return errno }
        defer { _ = Glibc.close(dfd) }
        return fsync(dfd) == 0 ? 0 : errno
    }

    /// Creates `folder` and the folders above it that are missing, each made durable (its
    /// parent synced): a folder whose files are committed must not vanish in a power cut.
    public static func makeFolders(_ folder: String) throws(TransferFailure) {
        var missing: [String] = []
        var probe = folder
        while !probe.isEmpty, probe != "/", access(probe, F_OK) != 0 {
            missing.append(probe)
            probe = (probe as NSString).deletingLastPathComponent
        }
        for dir in missing.reversed() {
            if mkdir(dir, 0o755) != 0 && errno != EEXIST { throw failure("create the folder", dir, errno) }
            let code = syncFolder((dir as NSString).deletingLastPathComponent)
            if code != 0 { throw failure("sync the folder of", dir, code) }
        }
    }

    /// The calls of `link` that filesystems differ in: `renameat2(RENAME_NOREPLACE)` (EINVAL
    /// where unsupported) and `link` (EPERM where there are no hard links). Each returns 0, or
    /// -1 with `errno` set.
    public struct LinkCalls: Sendable {
        public var renameNoReplace: @Sendable (String, String) -> Int32
        public var hardLink: @Sendable (String, String) -> Int32

        public init(renameNoReplace: @escaping @Sendable (String, String) -> Int32, hardLink: @escaping @Sendable (String, String) -> Int32)
        {
            self.renameNoReplace = renameNoReplace
            self.hardLink = hardLink
        }

        public static let system = LinkCalls(renameNoReplace: { dld_rename_noreplace($0, $1) }, hardLink: { Glibc.link($0, $1) })
    }

    /// fsync of the folder that holds `path`, so that a rename in it is durable.
    public static func syncDirectory(of path: String) {
        let dir = (path as NSString).deletingLastPathComponent
        let dfd = open(dir.isEmpty ? "." : dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if dfd >= 0 {
            _ = fsync(dfd)
            _ = Glibc.close(dfd)
        }
    }

    /// A failed fsync or fdatasync of `path` (`TransferFailure.failedSync`).
    static func syncFailure(_ path: String, _ code: Int32) -> TransferFailure {
        var failure = failure("sync", path, code)
        failure.failedSync = true
        return failure
    }

    static func failure(_ operation: String, _ path: String, _ code: Int32) -> TransferFailure {
        let reason = String(cString: strerror(code))
        if code == ENOSPC || code == EDQUOT {
            return TransferFailure(
                .transient(.diskSpace), .diskFull, "cannot \(operation) \(path): \(reason); free some space, dld looks again by itself")
        }
        return TransferFailure(.permanent, .fileError, "cannot \(operation) \(path): \(reason)")
    }
}

/// Filesystem facts.
public enum FileSystem {
    /// Bytes available to an unprivileged user on the filesystem holding `path`.
    public static func freeBytes(_ path: String) -> Int64? {
        var info = statvfs()
        guard statvfs(path, &info) == 0 else { return nil }
        return Int64(info.f_bavail) * Int64(info.f_frsize)
    }
}
