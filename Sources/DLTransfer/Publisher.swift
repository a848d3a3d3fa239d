import CDLSystem
import DLCore
import Foundation
import NIOPosix
import Synchronization

/// The last steps of finished files, done in batches so that many small files cost a few
/// disk flushes and not several each: sync their data in parallel, choose their names, and,
/// after the caller has committed them as completed, link them and sync each folder once.
///
/// The order is what makes a crash harmless (durability rule 4, docs/architecture.md):
/// data synced → row committed as `completed` with its final path → name linked → folder
/// synced. A crash before the commit leaves a running job (requeued, and cut back to its
/// committed offset); a crash after it leaves a completed job whose `.part` start-up
/// reconciliation links. A file is never under its name while its job is not completed.
public enum Publisher {
    /// Files synced at once: as many as the disk pool has threads.
    static let parallelSyncs = DiskPool.threads

    /// Makes the data of every file durable. A batch of several files is synced with one
    /// `syncfs` per filesystem (one journal commit for all of them, where each `fdatasync`
    /// would wait for one of its own) while that stays cheap (`wholeFilesystem`); otherwise,
    /// and for the files `syncfs` could not vouch for, with `fdatasync` of each, several at a
    /// time, on the disk pool. Returns the failures by path; the others are durable.
    public static func syncAll(_ paths: [String]) async -> [String: TransferFailure] {
        var outcome = WholeFilesystemSync(rest: paths)
        if paths.count >= wholeFilesystemFrom, let synced = try? await DiskPool.shared.runIfActive({ syncIfCheap(paths) }) {
            outcome = synced
        }
        var failures = outcome.failures.merging(await syncEach(outcome.rest)) { first, _ in first }
        // `syncfs` wrote the folders with the rest of the filesystem; `fdatasync` makes a file's
        // bytes durable, not its name. The caller commits these files as completed next, and a
        // power cut before their link and its folder sync would then leave a completed job with
        // no file at all (a `.part` created since its folder was last synced is lost with it).
        failures.merge(await syncNames(outcome.rest.filter { failures[$0] == nil })) { first, _ in first }
        return failures
    }

    /// fsync of each folder that holds one of `paths`, once, on the disk pool; a folder whose
    /// sync fails fails each of its files.
    static func syncNames(_ paths: [String]) async -> [String: TransferFailure] {
        guard !paths.isEmpty else { return [:] }
        let folders = Dictionary(grouping: paths) { ($0 as NSString).deletingLastPathComponent }
        let codes =
            (try? await DiskPool.shared.runIfActive { folders.keys.map { ($0, PartialFile.syncFolder($0)) } })
            ?? folders.keys.map { ($0, ECANCELED) }
        var failures: [String: TransferFailure] = [:]
        for (folder, code) in codes where code != 0 {
            for path in folders[folder] ?? [] { failures[path] = PartialFile.failure("sync the folder of", path, code) }
        }
        return failures
    }

    /// `syncFilesystems`, when `wholeFilesystem` and `slowSyncfs` allow it now; nil otherwise.
    static func syncIfCheap(_ paths: [String]) -> WholeFilesystemSync? {
        guard wholeFilesystem(files: paths.count, unwritten: unwrittenBytes()),
            slowSyncfs.withLock({ $0.allows(at: .now) })
        else { return nil }
        let synced = syncFilesystems(of: paths)
        slowSyncfs.withLock { $0.record(synced.longestSync, at: .now) }
        return synced
    }

    /// From this many files on, a batch may be synced a filesystem at a time.
    static let wholeFilesystemFrom = 2
    /// `syncfs` writes everything unwritten on the filesystem, not only the batch: it is not
    /// used while the whole system holds more than this (a copy, or a large download being
    /// written, would make it wait for all of its bytes: 256 MiB is 2.6 s on a disk of
    /// 100 MB/s), nor for a while after one was slow (`SlowSyncfs`: most of what is unwritten
    /// was on its filesystem).
    static let wholeFilesystemUnwrittenLimit: Int64 = 256 << 20

    /// Whether a batch of `files` is synced with `syncfs`, with `unwritten` bytes of the
    /// system not yet on disk (nil: unknown).
    static func wholeFilesystem(files: Int, unwritten: Int64?, kernelReportsErrors: Bool = syncfsReportsErrors) -> Bool {
        guard kernelReportsErrors, files >= wholeFilesystemFrom, let unwritten else { return false }
        return unwritten <= wholeFilesystemUnwrittenLimit
    }

    /// After a `syncfs` that took longer than `slow` (it had other data to write than the
    /// batch's), the next `pause` of batches use `fdatasync`, which waits for its own file only.
    struct SlowSyncfs: Sendable {
        static let slow: Duration = .milliseconds(250)
        static let pause: Duration = .seconds(60)
        var offUntil: ContinuousClock.Instant?

        func allows(at now: ContinuousClock.Instant) -> Bool {
            offUntil.map { now >= $0 } ?? true
        }

        mutating func record(_ elapsed: Duration, at now: ContinuousClock.Instant) {
            if elapsed > Self.slow { offUntil = now + Self.pause }
        }
    }

    static let slowSyncfs = Mutex(SlowSyncfs())

    /// Whether this kernel's `syncfs` reports writeback errors (Linux 5.8 and later): before,
    /// it returned 0 whatever became of the data, and only `fdatasync` told.
    static let syncfsReportsErrors: Bool = {
        var names = utsname()
        guard uname(&names) == 0 else { return false }
        let release = withUnsafeBytes(of: &names.release) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
        return kernel(release, isAtLeast: (5, 8))
    }()

    /// Whether a kernel release such as `6.1.0-18-amd64` is at least `version`.
    static func kernel(_ release: String, isAtLeast version: (Int, Int)) -> Bool {
        let numbers = release.split(whereSeparator: { !$0.isNumber }).prefix(2).compactMap { Int($0) }
        guard numbers.count == 2 else { return false }
        return (numbers[0], numbers[1]) >= version
    }

    /// The system's dirty and writeback bytes (`/proc/meminfo`), or nil when unreadable.
    static func unwrittenBytes() -> Int64? {
        guard let text = try? String(contentsOfFile: "/proc/meminfo", encoding: .utf8) else { return nil }
        return unwrittenBytes(meminfo: text)
    }

    static func unwrittenBytes(meminfo text: String) -> Int64? {
        var total: Int64 = 0
        var found = 0
        for line in text.split(separator: "\n") where line.hasPrefix("Dirty:") || line.hasPrefix("Writeback:") {
            let fields = line.split(separator: " ", omittingEmptySubsequences: true)
            guard fields.count == 3, fields[2] == "kB", let kib = Int64(fields[1]) else { return nil }
            total += kib * 1024
            found += 1
        }
        return found == 2 ? total : nil
    }

    /// Filesystems whose `syncfs` writes and flushes every file's data and reports a
    /// writeback error of any of them (Linux 5.8 and later), by statfs type: ext2/3/4, XFS,
    /// Btrfs, F2FS, and tmpfs (nothing to write). Elsewhere (network and FUSE filesystems
    /// among them) each file is synced on its own.
    static let syncfsTypes: Set<Int> = [0xEF53, 0x5846_5342, 0x9123_683E, 0xF2F5_2010, 0x0102_1994]

    /// What `syncFilesystems` did: files that failed, and files left to `fdatasync`.
    struct WholeFilesystemSync: Sendable {
        var failures: [String: TransferFailure] = [:]
        var rest: [String] = []
        /// The longest `syncfs` of the batch.
        var longestSync: Duration = .zero
    }

    /// Syncs the filesystems that hold `paths`, one `sync` (`syncfs`) each, where their type
    /// is known to honour it, then asks each file whether its own data was written
    /// (`writtenBack`): `syncfs` reports a writeback error of the filesystem only once, to
    /// the first who asks, and another program may have asked first; a file's own error is
    /// seen by dld alone. A file whose check fails is a failure. Left to `fdatasync` are the
    /// files not known to be durable: not a regular file (missing, or a symbolic link), on
    /// another type of filesystem, or on one that could not be opened or whose `syncfs`
    /// failed (each file's own `fdatasync` then tells whether it is one of those that failed).
    static func syncFilesystems(
        of paths: [String], type: (Int32) -> Int = { dld_filesystem_type($0) }, sync: (Int32) -> Int32 = { dld_syncfs($0) },
        writtenBack: (String) -> Int32 = { dld_written_back($0) }
    ) -> WholeFilesystemSync {
        var byDevice: [UInt64: [String]] = [:]
        var outcome = WholeFilesystemSync()
        for path in paths {
            var info = stat()
            guard lstat(path, &info) == 0, info.st_mode & S_IFMT == S_IFREG else {
                outcome.rest.append(path)
                continue
            }
            byDevice[UInt64(info.st_dev), default: []].append(path)
        }
        for files in byDevice.values {
            // Any of the files opens its filesystem; it is opened as the per-file sync would.
            let fd = open(files[0], O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
            guard fd >= 0 else {
                outcome.rest += files
                continue
            }
            let start = ContinuousClock.now
            let synced = syncfsTypes.contains(type(fd)) && sync(fd) == 0
            outcome.longestSync = max(outcome.longestSync, ContinuousClock.now - start)
            close(fd)
            guard synced else {
                outcome.rest += files
                continue
            }
            for file in files {
                let code = writtenBack(file)
                if code != 0 { outcome.failures[file] = PartialFile.failure("sync", file, code) }
            }
        }
        return outcome
    }

    /// `fdatasync` of each file, several at a time.
    static func syncEach(_ paths: [String]) async -> [String: TransferFailure] {
        guard !paths.isEmpty else { return [:] }
        return await withTaskGroup(of: (String, TransferFailure?).self) { group in
            var failures: [String: TransferFailure] = [:]
            var next = paths.makeIterator()
            func add(_ path: String) {
                group.addTask {
                    let code =
                        (try? await DiskPool.shared.runIfActive { () -> Int32 in
                            let fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
                            guard fd >= 0 else { return errno }
                            defer { close(fd) }
                            return fdatasync(fd) == 0 ? 0 : errno
                        }) ?? ECANCELED
                    return (path, code == 0 ? nil : PartialFile.failure("sync", path, code))
                }
            }
            for _ in 0..<parallelSyncs { if let path = next.next() { add(path) } }
            while let (path, failure) = await group.next() {
                if let failure { failures[path] = failure }
                if let path = next.next() { add(path) }
            }
            return failures
        }
    }

    /// The name a finished file takes: its target (the server's proposed name when the job's
    /// name is automatic), else the job's path; with `renameIfTaken`, `name (N).ext` when
    /// those are taken. Without `overwrite`, a name that is taken is never chosen.
    public static func chooseName(
        path: String, target: String?, overwrite: Bool, renameIfTaken: Bool,
        taken: (String) -> Bool = { access($0, F_OK) == 0 }
    ) -> Result<String, TransferFailure> {
        // A name the server chose never replaces a file: if it is taken, it is numbered (when
        // the job takes `name (N)`), else the job's own name is used.
        if let target, target != path {
            if !taken(target) { return .success(target) }
            if renameIfTaken, let numbered = firstFree(like: target, taken: taken) { return .success(numbered) }
        }
        if overwrite || !taken(path) { return .success(path) }
        guard renameIfTaken else {
            return .failure(
                TransferFailure(
                    .permanent, .destinationExists,
                    "\(path) appeared while downloading; it was not replaced (the download is kept at \(path).part)"))
        }
        guard let numbered = firstFree(like: path, taken: taken) else {
            return .failure(
                TransferFailure(.permanent, .destinationExists, "no free name like \(path) (the download is kept at \(path).part)"))
        }
        return .success(numbered)
    }

    /// `name (2).ext`, `name (3).ext`, … up to 999: the first that is free.
    static func firstFree(like path: String, taken: (String) -> Bool) -> String? {
        let folder = (path as NSString).deletingLastPathComponent
        let name = (path as NSString).lastPathComponent
        for n in 2..<1000 {
            let candidate = folder + "/" + FileNames.numbered(name, n)
            if !taken(candidate) { return candidate }
        }
        return nil
    }

    /// A file to move to its final name.
    public struct Link: Sendable {
        public var partial: String
        public var final: String
        public var overwrite: Bool

        public init(partial: String, final: String, overwrite: Bool) {
            self.partial = partial
            self.final = final
            self.overwrite = overwrite
        }
    }

    /// Links every file under its name, then syncs each folder that gained one, on the
    /// disk pool: whoever awaits it is not held by the disk (here, when the pool has
    /// stopped). Returns a failure, or nil, for each link in order.
    public static func linkAll(_ links: [Link]) async -> [TransferFailure?] {
        guard !links.isEmpty else { return [] }
        if let done = try? await DiskPool.shared.runIfActive({ linkNow(links) }) { return done }
        return linkNow(links)
    }

    static func linkNow(_ links: [Link]) -> [TransferFailure?] {
        var failures: [TransferFailure?] = []
        for link in links {
            do throws(TransferFailure) {
                try PartialFile.link(link.partial, to: link.final, overwrite: link.overwrite)
                failures.append(nil)
            } catch {
                failures.append(error)
            }
        }
        syncFolders(of: zip(links, failures).filter { $0.1 == nil }.map(\.0.final))
        return failures
    }

    /// fsync of each folder once.
    public static func syncFolders(of paths: some Sequence<String>) {
        var synced: Set<String> = []
        for path in paths where synced.insert((path as NSString).deletingLastPathComponent).inserted {
            PartialFile.syncDirectory(of: path)
        }
    }
}
