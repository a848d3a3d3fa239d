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

    /// Gives an attempt of a job on a shared table a partial file of its own inode, named
    /// `path` as always, with the attempt's tag in its `user.dld.attempt` attribute. A stale
    /// attempt (on another machine sharing the folder, or one this machine has not yet heard
    /// is stale) keeps writing into the inode it opened, which no name reaches any more: it can
    /// never write into this attempt's bytes (docs/architecture.md, "One inode per attempt").
    ///
    /// The bytes of the file found at `path` are carried over (their data extents copied in the
    /// kernel) only when it carries the tag of the attempt that committed the offset
    /// (`attempt.trusted`): bytes that another machine or an older attempt wrote, such as a
    /// leftover in a private folder, are never trusted up to an offset someone else committed.
    /// Where the filesystem has no user attributes, only this worker's own are. Returns whether
    /// the bytes were carried over; false: the file is empty and the transfer starts at 0.
    public static func isolate(_ path: String, for attempt: PartialAttempt) throws(TransferFailure) -> Bool {
        let old = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
        if old < 0 {
            guard errno == ENOENT else { throw failure("open", path, errno) }
            // No file yet (the usual first attempt): this attempt's own, made at its name.
            let fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0o644)
            if fd >= 0 {
                _ = dld_set_attempt(fd, attempt.tag)
                _ = Glibc.close(fd)
                return false
            }
            guard errno == EEXIST else { throw failure("create", path, errno) }
            // Made meanwhile (by a stale attempt): replaced below like any other.
            return try isolate(path, for: attempt, replacing: -1)
        }
        defer { _ = Glibc.close(old) }
        return try isolate(path, for: attempt, replacing: old)
    }

    private static func isolate(_ path: String, for attempt: PartialAttempt, replacing old: Int32) throws(TransferFailure) -> Bool {
        let keep = old >= 0 && attempt.trusts(attemptTag(of: old))
        let temporary = "\(path).e\(attempt.epoch)"
        var fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0o644)
        if fd < 0 && errno == EEXIST {
            // Left by an attempt of this epoch that died while making it: only dld names so.
            unlink(temporary)
            fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0o644)
        }
        guard fd >= 0 else { throw failure("create", temporary, errno) }
        var failed: TransferFailure?
        if keep {
            // The carried bytes are synced before the name moves to them: the committed offset
            // counts them, and the file they replace is gone from the name.
            if dld_copy_data(old, fd) != 0 {
                failed = failure("copy", path, errno)
            } else if fsync(fd) != 0 {
                failed = syncFailure(temporary, errno)
            }
        }
        // A filesystem without user attributes: the tag is not written (`trusts` then asks the
        // row's worker instead); nothing else is lost.
        _ = dld_set_attempt(fd, attempt.tag)
        _ = Glibc.close(fd)
        if failed == nil, rename(temporary, path) != 0 { failed = failure("rename", path, errno) }
        if let failed {
            unlink(temporary)
            throw failed
        }
        return keep
    }

    /// The tag of the attempt that made the file open at `fd`: nil when it has none, `.none`
    /// inside when the filesystem keeps no user attributes.
    static func attemptTag(of fd: Int32) -> AttemptTag {
        var buffer = [CChar](repeating: 0, count: 512)
        let length = buffer.withUnsafeMutableBufferPointer { dld_get_attempt(fd, $0.baseAddress, $0.count) }
        if length < 0 { return errno == ENOTSUP || errno == EOPNOTSUPP ? .unsupported : .missing }
        return .tag(String(decoding: buffer[..<Int(length)].map { UInt8(bitPattern: $0) }, as: UTF8.self))
    }

    /// What a partial file says of the attempt that made it.
    enum AttemptTag: Equatable {
        case tag(String)
        case missing
        case unsupported
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

/// An attempt at a job on a shared table, as its partial file knows it (`PartialFile.isolate`).
public struct PartialAttempt: Sendable, Equatable {
    public var worker: String
    public var epoch: Int64
    /// The tag of the attempt whose bytes the committed offset counts (`Job.partialTag`).
    public var trusted: String?

    public init(worker: String, epoch: Int64, trusted: String?) {
        self.worker = worker
        self.epoch = epoch
        self.trusted = trusted
    }

    /// `worker/epoch`, as `JobOwner.tag` writes it into the row.
    public var tag: String { "\(worker)/\(epoch)" }

    /// Whether a file with `found` holds the committed bytes: it carries the committing
    /// attempt's tag; where attributes are not kept, it was this worker that committed them.
    func trusts(_ found: PartialFile.AttemptTag) -> Bool {
        guard let trusted else { return false }
        switch found {
        case .tag(let tag): return tag == trusted
        case .missing: return false
        case .unsupported:
            guard let slash = trusted.lastIndex(of: "/") else { return false }
            return trusted[..<slash] == worker
        }
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
