import CDLSystem
import DLCore
import DLRPC
import DLTransfer
import Dispatch
import Foundation
import Logging
import Synchronization

/// The drop folder (`watch_dir`, docs/operations.md "The drop folder"): an input list dropped
/// there is enqueued, then moved into `added/`; one that cannot be read or enqueued goes to
/// `failed/` with `NAME.error` saying why. Files are found by inotify (closed after writing, or
/// renamed in) and by a sweep when the watch starts (files dropped while dld was stopped).
///
/// One task takes the files one at a time, in the order they were seen; it talks to the engine
/// through the dispatcher, as a client on the socket does (same checks), so it never holds the
/// engine's queue longer than an `enqueue` does.
final class DropFolderWatch: Sendable {
    /// What a handler made of a file.
    enum Outcome: Sendable, Equatable {
        /// Enqueued (its jobs exist now): move it into `added/`.
        case enqueued(count: Int, created: Int)
        /// Refused, for this reason: move it into `failed/` with `NAME.error`.
        case refused(String)
        /// Not taken now, for this reason (logged once): it stays where it is.
        case left(String)
    }

    /// A dropped file, read: its name, content and identity (for the job keys).
    struct Dropped: Sendable {
        var name: String
        var bytes: [UInt8]
        var device: UInt64
        var inode: UInt64
        var mtimeNanoseconds: Int64
        var sha256: String
    }

    typealias Handler = @Sendable (DropFolderWatch, Dropped) async -> Outcome

    /// The handler of each kind of file (`DropFolderRules.suffixes` says which names are which).
    /// The Metalink handler comes with the Metalink parser; until then such files are left.
    static let handlers: [DropFolderRules.Kind: Handler] = [
        .inputList: { watch, file in await watch.enqueueInputList(file) },
        .metalink: { watch, file in await watch.enqueueMetalink(file) },
    ]

    let folder: String
    let dispatcher: Dispatcher
    /// The download folder in force, for a relative `dir=`.
    let downloadDir: @Sendable () -> String
    let logger: Logger
    /// The inotify descriptor; closed by `run` when it ends.
    private let inotify: Int32
    /// Names already logged as left alone, so that each is logged once (bounded).
    private let logged = Mutex<Set<String>>([])
    /// `DLD_TEST_WATCH_HOLD`: for tests only, the file is held between its enqueue and its move
    /// until dld stops (a test kills dld there to show that a restart enqueues nothing twice).
    private let holdBeforeMove: Bool

    /// Creates the folder (0700, with `added/` and `failed/`) if missing and starts watching it.
    /// Throws a message for the start-up when it cannot: then dld does not start.
    init(folder: String, dispatcher: Dispatcher, downloadDir: @escaping @Sendable () -> String, logger: Logger) throws {
        self.folder = folder
        self.dispatcher = dispatcher
        self.downloadDir = downloadDir
        self.logger = logger
        holdBeforeMove = ProcessInfo.processInfo.environment["DLD_TEST_WATCH_HOLD"] == "1"
        for path in [folder, folder + "/" + DropFolderRules.added, folder + "/" + DropFolderRules.failed] {
            var info = stat()
            if lstat(path, &info) != 0 {
                guard errno == ENOENT, mkdir(path, 0o700) == 0 || errno == EEXIST else {
                    throw DaemonError("watch_dir: cannot create \(path): \(String(cString: strerror(errno)))")
                }
                continue
            }
            guard info.st_mode & S_IFMT == S_IFDIR else {
                throw DaemonError("watch_dir: \(path) is not a folder (a symbolic link is not followed)")
            }
        }
        let fd = dld_drop_watch_open(folder)
        guard fd >= 0 else {
            throw DaemonError("watch_dir: cannot watch \(folder) (inotify): \(String(cString: strerror(errno)))")
        }
        inotify = fd
        if holdBeforeMove { logger.warning("test hook: DLD_TEST_WATCH_HOLD holds dropped files between enqueue and move") }
    }

    /// Sweeps the folder, then takes each file inotify reports, until the task is cancelled.
    func run() async {
        let (events, continuation) = AsyncStream.makeStream(of: WatchEvent.self)
        let source = DispatchSource.makeReadSource(fileDescriptor: inotify, queue: DispatchQueue(label: "dld.watch-dir"))
        let fd = inotify
        source.setEventHandler { Self.drain(fd) { continuation.yield($0) } }
        source.setCancelHandler { close(fd) }
        // Watching before the sweep: a file dropped during it is reported too (and taken once:
        // the second look finds it gone).
        source.resume()
        defer {
            source.cancel()
            continuation.finish()
        }
        logger.info("watching the drop folder", metadata: ["watch_dir": "\(folder)"])
        await sweep()
        for await event in events {
            switch event {
            case .file(let name): await take(name)
            case .overflow:
                logger.warning("the drop folder's event queue overflowed; the folder is swept again")
                await sweep()
            case .gone:
                logger.error("the drop folder was removed or unmounted; dropped files are not seen until dld restarts")
            }
            if Task.isCancelled { break }
        }
    }

    enum WatchEvent: Sendable {
        case file(String)
        case overflow, gone
    }

    /// Reads every pending inotify event (on the watch's own queue).
    private static func drain(_ fd: Int32, _ report: (WatchEvent) -> Void) {
        var buffer = [UInt8](repeating: 0, count: 64 << 10)
        while true {
            let count = buffer.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            guard count > 0 else { return }
            var offset = 0
            // struct inotify_event: wd (int32), mask, cookie, len (uint32), then len bytes of
            // NUL-padded name.
            while offset + 16 <= count {
                let (mask, length) = buffer.withUnsafeBytes {
                    (
                        $0.loadUnaligned(fromByteOffset: offset + 4, as: UInt32.self),
                        Int($0.loadUnaligned(fromByteOffset: offset + 12, as: UInt32.self))
                    )
                }
                let nameBytes = buffer[(offset + 16)..<min(count, offset + 16 + length)].prefix { $0 != 0 }
                offset += 16 + length
                if mask & DLD_IN_Q_OVERFLOW != 0 {
                    report(.overflow)
                } else if mask & DLD_IN_IGNORED != 0 {
                    report(.gone)
                } else if mask & DLD_IN_ISDIR == 0, !nameBytes.isEmpty {
                    report(.file(String(decoding: nameBytes, as: UTF8.self)))
                }
            }
        }
    }

    /// Every file in the folder, in the order of their names.
    func sweep() async {
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: folder) else {
            logger.error("cannot list the drop folder", metadata: ["watch_dir": "\(folder)"])
            return
        }
        for name in names.sorted() {
            if Task.isCancelled { return }
            await take(name)
        }
    }

    /// Logs once that `name` is left where it is.
    private func leave(_ name: String, _ why: String, level: Logger.Level = .notice) {
        let first = logged.withLock { set in
            if set.count >= 10_000 { set.removeAll() }
            return set.insert(name).inserted
        }
        if first { logger.log(level: level, "drop folder: \(name) is left alone: \(why)", metadata: ["watch_dir": "\(folder)"]) }
    }

    /// Looks at one name of the folder and, when it is a complete file dld takes, enqueues it
    /// and moves it.
    func take(_ name: String) async {
        if name == DropFolderRules.added || name == DropFolderRules.failed { return }
        guard let kind = DropFolderRules.kind(of: name), let handler = Self.handlers[kind] else {
            leave(name, "only *.txt input lists and *.meta4 files are taken", level: name.hasPrefix(".") ? .debug : .notice)
            return
        }
        let path = folder + "/" + name
        let dropped: Dropped
        switch readDropped(path, name: name) {
        case .gone: return
        case .busy:
            logger.debug("drop folder: \(name) is still open for writing; it is taken once closed")
            return
        case .leave(let why):
            leave(name, why)
            return
        case .unreadable(let why):
            fail(name, why)
            return
        case .read(let file):
            dropped = file
        }
        switch await handler(self, dropped) {
        case .enqueued(let count, let created):
            logger.notice(
                "drop folder: \(name) enqueued", metadata: ["jobs": "\(count)", "created": "\(created)", "watch_dir": "\(folder)"])
            if holdBeforeMove {
                logger.warning("test hook: holding \(name) between enqueue and move")
                while !Task.isCancelled { try? await Task.sleep(for: .seconds(3600)) }
                return
            }
            if let problem = Self.move(path, into: folder + "/" + DropFolderRules.added, as: name).problem {
                logger.error("drop folder: \(name) was enqueued but cannot be moved into added/: \(problem)")
            }
        case .refused(let why):
            fail(name, why)
        case .left(let why):
            leave(name, why)
        }
    }

    enum Read {
        case read(Dropped)
        case gone, busy
        case leave(String)
        case unreadable(String)
    }

    /// Reads a dropped file without following a symbolic link, and only a regular file of at
    /// most `DropFolderRules.maxBytes` that no process has open for writing.
    private func readDropped(_ path: String, name: String) -> Read {
        // O_NONBLOCK: a FIFO dropped there must not block the open.
        let fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
        guard fd >= 0 else {
            switch errno {
            case ENOENT: return .gone
            case ELOOP: return .leave("a symbolic link is not followed")
            default: return .unreadable("cannot open it: \(String(cString: strerror(errno)))")
            }
        }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0 else { return .unreadable("cannot stat it: \(String(cString: strerror(errno)))") }
        guard info.st_mode & S_IFMT == S_IFREG else { return .leave("not a regular file") }
        if dld_open_for_writing_elsewhere(fd) == 1 { return .busy }
        guard info.st_size <= DropFolderRules.maxBytes else {
            return .unreadable("it has \(info.st_size) bytes; a dropped file may have \(DropFolderRules.maxBytes) at most")
        }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 64 << 10)
        while true {
            let count = chunk.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            if count < 0 {
                if errno == EINTR { continue }
                return .unreadable("cannot read it: \(String(cString: strerror(errno)))")
            }
            if count == 0 { break }
            bytes += chunk[0..<count]
            // It grew after fstat: still bounded.
            if bytes.count > DropFolderRules.maxBytes {
                return .unreadable("it has more than \(DropFolderRules.maxBytes) bytes, the most a dropped file may have")
            }
        }
        guard let digest = StreamingDigest(.sha256) else { return .unreadable("cannot hash it (OpenSSL)") }
        digest.update(bytes)
        let mtime = Int64(info.st_mtim.tv_sec) * 1_000_000_000 + Int64(info.st_mtim.tv_nsec)
        return .read(
            Dropped(
                name: name, bytes: bytes, device: UInt64(info.st_dev), inode: UInt64(info.st_ino), mtimeNanoseconds: mtime,
                sha256: digest.finalize()))
    }

    /// The `.txt` handler: the list parsed as `dlctl enqueue -i` parses it, its lines enqueued in
    /// one call (all or nothing), each with the key of its line.
    func enqueueInputList(_ file: Dropped) async -> Outcome {
        guard let text = String(validating: file.bytes, as: UTF8.self) else { return .refused("it is not UTF-8 text") }
        let entries: [InputEntry]
        switch InputList.parse(text) {
        case .success(let parsed): entries = parsed
        case .failure(let error): return .refused(error.description)
        }
        guard !entries.isEmpty else { return .refused("it holds no URL") }
        let most = dispatcher.limits.maxJobsPerEnqueue
        guard entries.count <= most else {
            return .refused("it holds \(entries.count) URLs; a dropped list may hold \(most) at most (split it)")
        }
        let downloads = downloadDir()
        let jobs: [JSONValue] = entries.map { entry in
            var base = EnqueueSpec(url: "")
            base.key = DropFolderRules.key(
                device: file.device, inode: file.inode, mtimeNanoseconds: file.mtimeNanoseconds, sha256: file.sha256, line: entry.line)
            // A relative `dir=` is under the download folder (there is no working folder).
            let spec = entry.spec(over: base) { $0.hasPrefix("/") ? $0 : downloads + "/" + $0 }
            return .object(spec.params)
        }
        do throws(DLError) {
            let result = try await dispatcher.call(RPCMethod.enqueue.rawValue, ["jobs": .array(jobs)])
            return .enqueued(count: entries.count, created: Int(result["created"]?.int64Value ?? 0))
        } catch {
            if let (index, rest) = DropFolderRules.jobIndex(inMessage: error.message), entries.indices.contains(index) {
                return .refused("line \(entries[index].line): \(rest)")
            }
            return Self.outcome(of: error)
        }
    }

    /// A dropped Metalink: enqueued as `enqueue`'s Metalink form (one file a job, several a
    /// group named after the dropped file), under the key of the file with line 0, so that a
    /// second look after a crash returns what the first made.
    func enqueueMetalink(_ file: Dropped) async -> Outcome {
        guard let text = String(validating: file.bytes, as: UTF8.self) else { return .refused("it is not UTF-8 text") }
        let metalink: Metalink
        do throws(DLError) {
            metalink = try MetalinkReader.parse(text)
        } catch {
            return .refused(error.message)
        }
        // Read once, here: handed to the dispatcher as read (the socket's params would be
        // read again from their text).
        var request = MetalinkEnqueue(source: .document(metalink, text: text))
        request.key = DropFolderRules.key(
            device: file.device, inode: file.inode, mtimeNanoseconds: file.mtimeNanoseconds, sha256: file.sha256, line: 0)
        if metalink.files.count > 1 {
            let base = (file.name as NSString).deletingPathExtension
            request.name = base.isEmpty ? file.name : base
        }
        do throws(DLError) {
            let result = try await dispatcher.enqueueMetalink(request)
            let results = result["results"]?.arrayValue
            let count = results?.count ?? 1
            let created = results.map { $0.filter { $0["created"] == .bool(true) }.count } ?? (result["created"] == .bool(true) ? 1 : 0)
            return .enqueued(count: count, created: created)
        } catch {
            return Self.outcome(of: error)
        }
    }

    /// A refused enqueue: the file's fault (it goes to `failed/`), or not (it stays, and is
    /// taken at the next start, or when it is dropped again).
    static func outcome(of error: DLError) -> Outcome {
        switch error.code {
        case .queueFull, .shuttingDown, .storageError, .internalError:
            return .left("not enqueued now (\(error.code.rawValue): \(error.message)); it is taken again at the next start")
        default:
            return .refused(error.message)
        }
    }

    /// Moves a refused file into `failed/` with `NAME.error` beside it (both under a free name).
    private func fail(_ name: String, _ reason: String) {
        logger.warning("drop folder: \(name) refused: \(reason)", metadata: ["watch_dir": "\(folder)"])
        let failed = folder + "/" + DropFolderRules.failed
        let text = Array(DropFolderRules.errorText(name: name, reason: reason).utf8)
        for attempt in 0..<Self.attempts {
            let target = DropFolderRules.candidate(name, attempt: attempt)
            let errorPath = failed + "/" + DropFolderRules.errorFileName(target)
            // The reason first (under a name no file has), then the file: a crash between the
            // two leaves the file in the folder, to be refused again at the next start.
            let fd = open(errorPath, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
            if fd < 0 {
                if errno == EEXIST { continue }
                logger.error("drop folder: cannot write \(errorPath): \(String(cString: strerror(errno)))")
                return
            }
            _ = text.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
            fsync(fd)
            close(fd)
            switch Self.rename(folder + "/" + name, failed + "/" + target) {
            case 0:
                Self.syncFolders([folder, failed])
                return
            case EEXIST:
                unlink(errorPath)
            case let code:
                unlink(errorPath)
                logger.error("drop folder: cannot move \(name) into failed/: \(String(cString: strerror(code)))")
                return
            }
        }
        logger.error("drop folder: no free name for \(name) in failed/")
    }

    /// How many names are tried in `added/` and `failed/` before giving up.
    static let attempts = 10_000

    /// Moves `path` into `folder` under `name`, or the first free name after it; never replaces.
    static func move(_ path: String, into target: String, as name: String) -> (name: String?, problem: String?) {
        for attempt in 0..<attempts {
            let candidate = DropFolderRules.candidate(name, attempt: attempt)
            switch rename(path, target + "/" + candidate) {
            case 0:
                syncFolders([(path as NSString).deletingLastPathComponent, target])
                return (candidate, nil)
            case EEXIST: continue
            case let code: return (nil, String(cString: strerror(code)))
            }
        }
        return (nil, "no free name")
    }

    /// A rename that never replaces: 0, or the errno (EEXIST when `to` exists).
    static func rename(_ from: String, _ to: String) -> Int32 {
        if dld_rename_noreplace(from, to) == 0 { return 0 }
        let code = errno
        guard code == EINVAL || code == ENOSYS else { return code }
        // A filesystem without RENAME_NOREPLACE: a hard link fails on an existing name too.
        guard link(from, to) == 0 else { return errno }
        unlink(from)
        return 0
    }

    static func syncFolders(_ folders: [String]) {
        for folder in folders {
            let fd = open(folder, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
            guard fd >= 0 else { continue }
            fsync(fd)
            close(fd)
        }
    }
}
