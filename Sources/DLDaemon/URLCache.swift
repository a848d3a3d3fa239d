import DLCore
import DLEngine
import DLRPC
import DLJobTable
import DLStore
import DLTransfer
import Foundation
import Logging

/// The URL cache behind `get`: answers with the path of a local copy of a URL, at once when a
/// fresh copy is cached, else after revalidating a stale one (a conditional GET; a 304 costs no
/// body) or downloading it. A download is an ordinary job whose destination is in the cache
/// folder, so it is resumable, verified, retried and shown by `status` and `list`; `get`
/// answers when it completes. Concurrent `get`s of one URL share one revalidation or download.
///
/// Decisions are `CachePolicy`'s (DLCore, pure); the index is `CacheIndex`, a SQLite file in
/// the cache folder, local to this machine whatever store holds the jobs. Entries held by a
/// running `get`, a download or a caller's pin are never evicted.
public actor URLCache {
    /// The answer to one `get`.
    public struct Answer: Sendable {
        public enum Source: String, Sendable {
            /// A fresh copy was cached.
            case hit
            /// Downloaded now (by this `get` or one it joined).
            case download
            /// A stale copy that the server confirmed (304).
            case revalidated
            /// A stale copy served because the server could not be asked or the new download
            /// failed.
            case stale
        }

        public var path: String
        public var bytes: Int64
        public var sha256: String?
        public var source: Source
        public var jobID: JobID?
        public var pinned: Bool
        public var freshUntil: Date
    }

    let engine: Engine
    let hub: EventHub
    let downloader: Downloader
    let logger: Logger
    let now: @Sendable () -> Date
    /// Nil when the cache cannot be used; `unavailable` says why.
    let index: CacheIndex?
    let unavailable: String?
    /// One daemon per cache folder: the index and the in-flight guards are one process's.
    let lock: CacheLock?
    /// Where the cached files are (`<cache_dir>/files`).
    public let folder: String
    var policy: CachePolicy
    /// Revalidations and downloads under way, by key: later `get`s of the URL join them.
    var shared: [String: Task<Result<Answer, DLError>, Never>] = [:]
    /// Running `get`s by key: their entries are not evicted.
    var users: [String: Int] = [:]
    var hits = 0
    var misses = 0
    var revalidations = 0
    var stopped = false
    /// `start` is done: the age sweeps run.
    var sweeping = false
    let sweepStarted = Doorbell()

    init(
        engine: Engine, hub: EventHub, downloader: Downloader, index: CacheIndex?, unavailable: String?, folder: String,
        policy: CachePolicy, logger: Logger, lock: CacheLock? = nil, now: @escaping @Sendable () -> Date = { Date() }
    ) {
        self.lock = lock
        self.engine = engine
        self.hub = hub
        self.downloader = downloader
        self.index = index
        self.unavailable = unavailable
        self.folder = folder
        self.policy = policy
        self.logger = logger
        self.now = now
    }

    /// Opens the cache in `dir` (created `0700`): its index and its files folder. A cache that
    /// cannot be opened does not stop dld: `get` then says why.
    public static func open(
        dir: String, policy: CachePolicy, engine: Engine, hub: EventHub, downloader: Downloader,
        sharedQueue: Bool, logger: Logger
    ) -> URLCache {
        let folder = dir + "/files"
        func unusable(_ reason: String) -> URLCache {
            URLCache(
                engine: engine, hub: hub, downloader: downloader, index: nil, unavailable: reason, folder: folder,
                policy: policy, logger: logger)
        }
        if sharedQueue {
            // Another daemon of the fleet could claim the download and write it into its own
            // machine's cache folder.
            return unusable(
                "get is not available with a shared PostgreSQL job table: another daemon could take the download and write it on its own machine"
            )
        }
        do {
            _ = try Folders.ensure(dir, mode: 0o700)
            _ = try Folders.ensure(folder, mode: 0o700)
            guard let lock = CacheLock(path: dir + "/cache.lock") else {
                logger.error("the URL cache folder is used by another dld; get will fail", metadata: ["dir": "\(dir)"])
                return unusable(
                    "the cache folder \(dir) is used by another dld (it holds \(dir)/cache.lock); give this one its own cache_dir")
            }
            let index = try CacheIndex(path: dir + "/index.sqlite")
            for suffix in ["", "-wal", "-shm"] { chmod(dir + "/index.sqlite" + suffix, 0o600) }
            downloader.responseHeads.watch(folder: folder)
            return URLCache(
                engine: engine, hub: hub, downloader: downloader, index: index, unavailable: nil, folder: folder,
                policy: policy, logger: logger, lock: lock)
        } catch {
            logger.error("the URL cache cannot be opened; get will fail", metadata: ["dir": "\(dir)", "error": "\(error)"])
            return unusable("the cache folder \(dir) cannot be used: \(StorageErrorText.plain(error))")
        }
    }

    /// The key of a URL: hex SHA-256 of its normalized form; also its file's name.
    static func key(_ normalized: String) -> String? {
        guard let digest = StreamingDigest(.sha256) else { return nil }
        digest.update(Array(normalized.utf8))
        return digest.finalize()
    }

    func keyOf(_ url: String) throws(DLError) -> String {
        if case .failure(let error) = URLRules.checked(url) { throw error }
        guard let normalized = CacheURL.normalized(url) else {
            throw DLError(.invalidURL, "only absolute http and https URLs with a host can be cached")
        }
        guard let key = Self.key(normalized) else { throw DLError(.internalError, "OpenSSL could not start a SHA-256 digest") }
        return key
    }

    func requireIndex() throws(DLError) -> CacheIndex {
        guard let index else { throw DLError(.invalidState, unavailable ?? "the URL cache is not available") }
        guard !stopped else { throw DLError(.shuttingDown, "dld is shutting down") }
        return index
    }

    func storage<T>(_ body: () async throws -> T) async throws(DLError) -> T {
        do {
            return try await body()
        } catch let error as DLError {
            throw error
        } catch {
            logger.error("cache index error", metadata: ["error": "\(error)"])
            throw DLError(.storageError, "the cache index could not be read or written: \(StorageErrorText.plain(error))")
        }
    }

    // MARK: get, unpin

    public func get(_ url: String, pin: Bool) async throws(DLError) -> Answer {
        let index = try requireIndex()
        let key = try keyOf(url)
        users[key, default: 0] += 1
        defer {
            users[key, default: 1] -= 1
            if users[key] == 0 { users[key] = nil }
        }
        let result: Result<Answer, DLError>
        if let running = shared[key] {
            result = await running.value
        } else {
            let task = Task { await self.resolve(key: key, url: url) }
            shared[key] = task
            result = await task.value
            shared[key] = nil
        }
        var answer = try result.get()
        switch answer.source {
        case .hit, .stale: hits += 1
        case .download: misses += 1
        case .revalidated: revalidations += 1
        }
        if pin {
            answer.pinned = try await storage { try await index.setPinned(key, true) }
        }
        return answer
    }

    /// Clears a caller's pin; returns whether the URL was cached. The entry may then be evicted.
    public func unpin(_ url: String) async throws(DLError) -> Bool {
        let index = try requireIndex()
        let key = try keyOf(url)
        let found = try await storage { try await index.setPinned(key, false) }
        if found { await evict() }
        return found
    }

    /// What a `get` of an uncached or stale URL does; shared by the `get`s that join it.
    func resolve(key: String, url: String) async -> Result<Answer, DLError> {
        do throws(DLError) {
            let index = try requireIndex()
            let stored = try await storage { try await index.entry(key) }
            guard var entry = stored else { return .success(try await download(key: key, url: url, entry: nil)) }
            if entry.ready && !Self.fileMatches(entry) {
                logger.notice("a cached file is gone or changed; downloading it again", metadata: ["path": "\(entry.path)"])
                entry.ready = false
            }
            guard entry.ready else { return .success(try await download(key: key, url: url, entry: entry)) }
            let at = now()
            if policy.isFresh(entry.headers, receivedAt: entry.receivedAt, now: at) {
                entry.lastUsed = at
                let saved = entry
                try await storage { try await index.touch(key, at: at) }
                return .success(answer(saved, .hit))
            }
            // Stale: a download already under way (after a restart) is waited for, else the
            // server is asked whether the copy is still good.
            let conditions = CachePolicy.conditionalHeaders(entry.headers)
            if entry.jobID == nil, !conditions.isEmpty {
                switch await downloader.revalidate(url: url, conditions: conditions) {
                case .notModified(let headers):
                    let arrived = now()
                    entry.headers = entry.headers.updated(by: headers)
                    entry.receivedAt = arrived
                    entry.lastUsed = arrived
                    let saved = entry
                    try await storage { try await index.save(saved) }
                    logger.info("cache: revalidated", metadata: ["url": "\(URLRules.redacted(url))"])
                    return .success(answer(saved, .revalidated))
                case .modified(let status):
                    logger.info(
                        "cache: the server has a new version; downloading it",
                        metadata: [
                            "url": "\(URLRules.redacted(url))", "status": "\(status)",
                        ])
                case .failed(let failure):
                    // Offline copies are what the cache is for: the stale copy is better than none.
                    logger.warning(
                        "cache: the server could not be asked; serving the stale copy",
                        metadata: [
                            "url": "\(URLRules.redacted(url))", "error": "\(failure.error.message)",
                        ])
                    entry.lastUsed = now()
                    let saved = entry
                    try await storage { try await index.touch(key, at: saved.lastUsed) }
                    return .success(answer(saved, .stale))
                }
            }
            return .success(try await download(key: key, url: url, entry: entry))
        } catch {
            return .failure(error)
        }
    }

    func answer(_ entry: CacheEntry, _ source: Answer.Source, job: JobID? = nil) -> Answer {
        Answer(
            path: entry.path, bytes: entry.bytes, sha256: entry.sha256, source: source, jobID: job, pinned: entry.pinned,
            freshUntil: policy.freshUntil(entry.headers, receivedAt: entry.receivedAt))
    }

    static func fileMatches(_ entry: CacheEntry) -> Bool {
        var info = stat()
        guard lstat(entry.path, &info) == 0, (info.st_mode & S_IFMT) == S_IFREG else { return false }
        return Int64(info.st_size) == entry.bytes
    }

    static func fileSize(_ path: String) -> Int64? {
        var info = stat()
        guard lstat(path, &info) == 0, (info.st_mode & S_IFMT) == S_IFREG else { return nil }
        return Int64(info.st_size)
    }

    /// Downloads the URL as a job into the cache folder and waits for it. A job this entry
    /// started before (a restart, or a crash between the enqueue and the index) is waited for
    /// instead of starting another: its key names the entry and the generation.
    func download(key: String, url: String, entry stored: CacheEntry?) async throws(DLError) -> Answer {
        let index = try requireIndex()
        let at = now()
        var entry = stored ?? CacheEntry(key: key, url: url, path: folder + "/" + key, receivedAt: at, lastUsed: at)
        var job: Job? = nil
        if let id = entry.jobID, let known = try await engine.settledJob(id), known.path == entry.path { job = known }
        if job == nil, entry.generation > 0, let known = try await engine.settledJob(key: Self.jobKey(key, entry.generation)) {
            job = known
        }
        if let known = job, known.state == .canceled { job = nil }
        if let known = job, known.state == .failed {
            // Its bytes are kept: a resume continues them (and a `.part` left at the path
            // would make a new job's destination taken).
            _ = try await engine.resume(.ids([known.id]))
            logger.info("cache: resuming a failed download", metadata: ["url": "\(URLRules.redacted(url))", "job": "\(known.id)"])
        }
        if job == nil {
            // Unique across evictions too (an evicted entry's row, and its count, are gone):
            // the job's key must never name an older download's job.
            entry.generation = max(entry.generation + 1, Int64(now().timeIntervalSince1970 * 1_000_000))
            entry.jobID = nil
            let pending = entry
            try await storage { try await index.save(pending) }
            var spec = EnqueueSpec(url: url)
            spec.path = entry.path
            spec.overwrite = true
            spec.key = Self.jobKey(key, entry.generation)
            spec.intoCache = true
            guard let outcome = try await engine.enqueue([spec]).first else {
                throw DLError(.internalError, "enqueue returned nothing")
            }
            job = outcome.job
            logger.info("cache: downloading", metadata: ["url": "\(URLRules.redacted(url))", "job": "\(outcome.job.id)"])
        }
        guard let started = job else { throw DLError(.internalError, "no job for the cache download") }
        if entry.jobID != started.id {
            entry.jobID = started.id
            let pending = entry
            try await storage { try await index.save(pending) }
        }
        let finished = try await waitForFinish(started.id)
        entry.jobID = nil
        if let finished, finished.state == .completed, let size = Self.fileSize(entry.path) {
            let arrived = now()
            entry.ready = true
            entry.bytes = size
            entry.sha256 = finished.sha256
            // The head the transfer saw; without it (dld restarted during the download), the
            // validators the job recorded, and the default freshness.
            entry.headers =
                downloader.responseHeads.take(path: entry.path)
                ?? CacheHeaders(etag: finished.validators.etag, lastModified: finished.validators.lastModified)
            entry.receivedAt = arrived
            entry.lastUsed = arrived
            let saved = entry
            try await storage { try await index.save(saved) }
            await evict()
            return answer(saved, .download, job: started.id)
        }
        let saved = entry
        try await storage { try await index.save(saved) }
        let why: String
        switch finished?.state {
        case nil: why = "its job \(started.id) was removed"
        case .canceled?: why = "its job \(started.id) was canceled"
        case .completed?: why = "job \(started.id) completed, but its file \(entry.path) is gone"
        default: why = finished?.error.map { "\($0.message) (\($0.code), job \(started.id))" } ?? "job \(started.id) did not complete"
        }
        if entry.ready && Self.fileMatches(entry) {
            logger.warning(
                "cache: the new download failed; serving the stale copy", metadata: ["url": "\(URLRules.redacted(url))", "why": "\(why)"])
            return answer(saved, .stale)
        }
        throw DLError(.downloadFailed, "the download of \(URLRules.redacted(url)) failed: \(why)")
    }

    static func jobKey(_ key: String, _ generation: Int64) -> String { "dld-cache:\(key):\(generation)" }

    /// Waits until the job is completed, failed or canceled (or removed: nil). A job that waits
    /// to retry is waited for. Subscribes before reading the row, so no change falls between.
    func waitForFinish(_ id: JobID) async throws(DLError) -> Job? {
        while true {
            let (token, stream) = hub.subscribe(EventHub.Filter(ids: [id]))
            defer { hub.unsubscribe(token) }
            guard let job = try await engine.settledJob(id) else { return nil }
            if [.completed, .failed, .canceled].contains(job.state) { return job }
            for await item in stream {
                guard case .stored(let events) = item else { continue }
                let settled = events.contains { event in
                    event.jobID == id && (event.kind == .jobRemoved || ["completed", "failed", "canceled"].contains(event.state))
                }
                if settled { break }
            }
            if Task.isCancelled || stopped { throw DLError(.shuttingDown, "dld is shutting down") }
        }
    }

    // MARK: Eviction

    /// Evicts what the budgets say, never an entry that is pinned, used by a running `get` or
    /// being downloaded. Runs after each download and on a timer.
    func evict() async {
        guard let index else { return }
        do {
            let entries = try await index.uses()
            // Decided and carried out without a suspension: a `get` that starts meanwhile holds
            // its entry before this looks at it.
            let uses = entries.map { entry in
                CacheEntryUse(
                    key: entry.key, bytes: entry.ready ? entry.bytes : 0, lastUsed: entry.lastUsed,
                    held: entry.pinned || users[entry.key] != nil || shared[entry.key] != nil || entry.jobID != nil)
            }
            let victims = policy.evictions(uses, now: now())
            guard !victims.isEmpty else { return }
            let byKey = Dictionary(entries.map { ($0.key, $0) }, uniquingKeysWith: { first, _ in first })
            var freed: Int64 = 0
            for key in victims {
                guard let entry = byKey[key] else { continue }
                if unlink(entry.path) != 0 && errno != ENOENT {
                    logger.warning("cache: could not remove a file", metadata: ["path": "\(entry.path)"])
                }
                freed += entry.ready ? entry.bytes : 0
            }
            try await index.delete(victims)
            logger.info("cache: evicted", metadata: ["entries": "\(victims.count)", "bytes": "\(freed)"])
        } catch {
            logger.error("cache: eviction failed", metadata: ["error": "\(error)"])
        }
    }

    /// Start-up: rows whose file is gone are dropped (unless a download runs for them), files
    /// without a row are removed (partial files stay: they are jobs'), then eviction runs and
    /// the sweeps (`runSweeps`) begin.
    public func start() async {
        guard let index else { return }
        do {
            let entries = try await index.all()
            let gone = entries.filter { $0.ready && $0.jobID == nil && !Self.fileMatches($0) }.map(\.key)
            try await index.delete(gone)
            if !gone.isEmpty { logger.notice("cache: dropped entries whose files are gone", metadata: ["entries": "\(gone.count)"]) }
            let known = Set(entries.map(\.key))
            let names = (try? FileManager.default.contentsOfDirectory(atPath: folder)) ?? []
            for name in names where !name.hasSuffix(".part") && !known.contains(name) {
                unlink(folder + "/" + name)
                logger.notice("cache: removed a file the index does not know", metadata: ["path": "\(folder)/\(name)"])
            }
        } catch {
            logger.error("cache: start-up check failed", metadata: ["error": "\(error)"])
        }
        await evict()
        sweeping = true
        sweepStarted.ring()
    }

    /// The age sweeps, until cancelled (the daemon runs them as a service of its group). They
    /// begin once `start` is done, and never when the cache cannot be used.
    public func runSweeps() async {
        while !Task.isCancelled {
            guard sweeping, !stopped else {
                await sweepStarted.wait()
                continue
            }
            try? await Task.sleep(for: .seconds(sweepInterval()))
            guard !Task.isCancelled, !stopped else { continue }
            await evict()
        }
    }

    /// Time between two age sweeps: a quarter of `cache_max_age`, from 1 s to 1 h.
    func sweepInterval() -> TimeInterval {
        policy.maxAge > 0 ? min(3600, max(1, policy.maxAge / 4)) : 3600
    }

    /// A reload's budgets and default freshness apply from the next `get` and sweep.
    public func setPolicy(_ policy: CachePolicy) async {
        let changed = policy != self.policy
        self.policy = policy
        if changed { await evict() }
    }

    /// Ends the waits of running `get`s (they answer `shutting_down`); their jobs stay queued.
    public func shutdown() {
        stopped = true
        for task in shared.values { task.cancel() }
    }

    // MARK: Reads

    public struct Stats: Sendable {
        public var available: Bool
        public var hits: Int
        public var misses: Int
        public var revalidations: Int
        public var bytes: Int64
        public var entries: Int
        public var pinned: Int
        public var maxBytes: Int64
    }

    public func stats() async -> Stats {
        var stats = Stats(
            available: index != nil, hits: hits, misses: misses, revalidations: revalidations, bytes: 0, entries: 0,
            pinned: 0, maxBytes: policy.maxBytes)
        if let totals = try? await index?.totals() {
            (stats.entries, stats.bytes, stats.pinned) = totals
        }
        return stats
    }

    /// Lookups answered from the cache and lookups that downloaded, since start: what the
    /// metrics read at each scrape, without the index's totals that `stats` adds up.
    public func lookups() -> (hits: Int, misses: Int) {
        (hits, misses)
    }

    /// The cached entries, least recently used first (`cache_list`).
    public func list() async throws(DLError) -> [(entry: CacheEntry, freshUntil: Date, held: Bool)] {
        let index = try requireIndex()
        let entries = try await storage { try await index.all() }.filter(\.ready).sorted { ($0.lastUsed, $0.key) < ($1.lastUsed, $1.key) }
        return entries.map { ($0, policy.freshUntil($0.headers, receivedAt: $0.receivedAt), users[$0.key] != nil || shared[$0.key] != nil) }
    }
}

/// An exclusive `flock` on `<cache_dir>/cache.lock` for the daemon's life (released by the
/// kernel however the process ends). Its own file, so a `cache_dir` equal to `state_dir` works.
final class CacheLock: Sendable {
    private let fd: Int32

    init?(path: String) {
        let fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard fd >= 0 else { return nil }
        guard flock(fd, LOCK_EX | LOCK_NB) == 0 else {
            close(fd)
            return nil
        }
        self.fd = fd
    }

    deinit { close(fd) }
}
