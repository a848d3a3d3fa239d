import DLRPC
import DLTestSupport
import Foundation
import Synchronization
import Testing

/// What the test does while the power is cut: each workload arms its cut point, then runs.
enum PowerCutWork: String, Sendable, CaseIterable {
    /// One large download in four ranges (segmented), checkpointed every 0.1 s.
    case big
    /// One download in a single stream (`segments: 1`), checkpointed every 0.1 s.
    case stream
    /// A batch of small files in one folder, published in batches.
    case small
    /// The same on a filesystem without RENAME_NOREPLACE: published with link(2) and unlink.
    case smallLink = "small-link"
    /// The same without hard links either: published by a check and a plain rename.
    case smallRename = "small-rename"
    /// A group whose folder appears whole, in one rename.
    case group
    /// One `enqueue` of 10 000 jobs (paused).
    case enqueue
    /// `pause` of every job of a queue of 2000.
    case pause
    /// `cancel` of a single-stream download that has committed offsets.
    case cancel
    /// `remove` with `delete_file` of a completed job and of a download with committed offsets.
    case remove
    /// A group published into a folder that exists (with a file of the user's in it): its
    /// files move in one by one.
    case groupInto
    /// An input list dropped into the drop folder (`watch_dir`): enqueued, then moved to `added/`.
    case drop
    /// `resume` of every job of a queue of 500 paused ones.
    case resume
    /// A single-stream download paused with committed offsets, then resumed: its transfer
    /// continues from the committed offset (`Range`).
    case streamResume = "stream-resume"
    /// A download paused right after its enqueue, before its first checkpoint.
    case pausedEarly = "paused-early"
    /// `change` of a running single-stream download's headers.
    case change
    /// `set_speed` of a running single-stream download.
    case setSpeed = "set_speed"
    /// The small batch where dld's `syncfs` is honoured (scripts/powercutfs_shim.c): a batch
    /// of finished files is synced with one `syncfs` of the filesystem.
    case smallSyncfs = "small-syncfs"
    /// One single-stream download encrypted to an age recipient (`encrypt_to`).
    case encrypted
    /// `get` with `pin` of a URL not cached: a job downloads it into the cache folder, then
    /// the cache's index records the entry ready and pinned.
    case get
    /// An HLS playlist of 8 segments, joined into one file when all are in.
    case hls
    /// A Metalink file with piece hashes and two mirrors, downloaded in ranges.
    case metalink
    /// `remove` without `delete_file` of a completed job and of a download with committed
    /// offsets: the completed file is the user's and stays.
    case removeKeep = "remove-keep"
}

/// Where a cut point claims to fall relative to its workload's command: before the command's
/// commit is durable (nothing of it may be in effect after the cut), or after (all of it must
/// be, answered or not). A cut that lands elsewhere (in a checkpoint beside the command) fails
/// the point instead of passing it.
enum CutClaim: Sendable {
    case commandLost
    case commandDurable
}

/// A cut: at the `count`-th operation of one of `kinds` on a path containing `pattern`, before
/// or after it is applied (scripts/powercutfs.c).
struct CutPoint: Sendable, CustomTestStringConvertible {
    var work: PowerCutWork
    var kinds: String
    var pattern: String?
    var count: Int
    var after: Bool
    /// Part of the short set that `make test` runs; `make crash` runs them all.
    var short = false
    /// Only operations on a file with this many bytes written since its last sync count: the
    /// point is inside a transaction at least that big (the command's, not a checkpoint's).
    var minUnsynced = 0
    /// What the cut leaves of what was not durable; nil: zeros for a cut before an operation,
    /// torn after one with an odd count, plain after one with an even count.
    var mode: PowerCutFS.CutMode? = nil
    var claim: CutClaim? = nil

    var testDescription: String {
        if kinds == "answer" { return "\(work.rawValue): right after the \(count == 1 ? "" : "second ")answer" }
        let inside = minUnsynced > 0 ? " past \(minUnsynced >> 10) KiB unsynced" : ""
        let left = mode.map { " (\($0.rawValue))" } ?? ""
        return "\(work.rawValue): \(after ? "after" : "before") \(kinds) #\(count)\(pattern.map { " of *\($0)*" } ?? "")\(inside)\(left)"
    }

    /// What the cut leaves.
    var cutMode: PowerCutFS.CutMode { mode ?? (!after ? .zeros : count % 2 == 1 ? .torn : .plain) }

    static func at(
        _ work: PowerCutWork, _ kinds: String, _ pattern: String?, _ counts: [Int], short: Set<Int> = [], minUnsynced: Int = 0,
        mode: PowerCutFS.CutMode? = nil, claim: (_ after: Bool) -> CutClaim? = { _ in nil }
    ) -> [CutPoint] {
        counts.flatMap { count in
            [false, true].map { after in
                CutPoint(
                    work: work, kinds: kinds, pattern: pattern, count: count, after: after,
                    short: short.contains(after ? count : -count), minUnsynced: minUnsynced, mode: mode, claim: claim(after))
            }
        }
    }

    /// A command's commit: lost if cut before its sync, durable after.
    static func commit(_ after: Bool) -> CutClaim? { after ? .commandDurable : .commandLost }

    /// 145 cut points; `short` picks (count, or -count for "before") a few of each workload.
    static let all: [CutPoint] = [
        // A big download in ranges: its checkpoints' fdatasync, the commits of their offsets, and writes.
        at(.big, "fdatasync", ".part", [1, 3], short: [-1, 3]),
        at(.big, "fdatasync", "jobs.sqlite-wal", [3, 6], short: [6]),
        at(.big, "write", ".part", [40, 200], short: [-200]),
        // The same in one stream, and its checkpoints under a torn cut.
        at(.stream, "fdatasync", ".part", [1, 3], short: [-3]),
        at(.stream, "fdatasync", "jobs.sqlite-wal", [4], short: []),
        at(.stream, "write", ".part", [60], mode: .torn),
        // Small files published in batches: their syncs, renames and folder syncs.
        at(.small, "fdatasync", ".part", [2, 15], short: [15]),
        at(.small, "rename", "/dl/", [1, 12, 30], short: [1, -12]),
        at(.small, "fsyncdir", "/dl", [1, 4], short: [-1]),
        at(.small, "fdatasync", "jobs.sqlite-wal", [2], short: []),
        // The fallbacks of filesystems without RENAME_NOREPLACE: link(2), then the partial
        // name's unlink (a journal commit too, that makes the link durable and not the
        // unlink's folder sync, or both); without hard links, a plain rename.
        at(.smallLink, "link", "/dl/", [1, 12], short: []),
        at(.smallLink, "unlink", ".part", [1, 12], mode: .names),
        at(.smallLink, "fsyncdir", "/dl", [1]),
        at(.smallRename, "rename", "/dl/", [1, 12]),
        at(.smallRename, "fsyncdir", "/dl", [1]),
        // The same where `syncfs` is honoured: a batch synced by one `syncfs`, then renamed.
        at(.smallSyncfs, "syncfs", nil, [1]),
        at(.smallSyncfs, "rename", "/dl/", [12, 30], short: [-12]),
        // An encrypted download: its checkpoints (ciphertext synced, the plaintext's count
        // committed), a torn write, and its publish (start-up links a complete `.age.part`,
        // known by its encrypted size).
        at(.encrypted, "fdatasync", ".part", [1, 3]),
        at(.encrypted, "write", ".part", [60], mode: .torn),
        at(.encrypted, "rename", "/dl/", [1]),
        // `get` with `pin` of a URL not cached: its job's publish into the cache folder, and
        // the index's commits (the new generation first, the entry ready and pinned last).
        at(.get, "rename", "/cache/files/", [1]),
        at(.get, "fdatasync", "index.sqlite-wal", [1, 3]),
        // HLS: the joined file built in the staging folder and synced, then renamed out.
        // (A staging folder removed after the commit: start-up finishes what was left.)
        at(.hls, "write", ".dld-hls-output", [4]),
        at(.hls, "fsync", ".dld-hls-output", [1]),
        at(.hls, "rename", "/dl/film.ts", [1]),
        at(.hls, "unlink", "dld-staging", [3], mode: .names),
        // Metalink: the checkpoints of a download in ranges checked piece by piece.
        at(.metalink, "fdatasync", ".part", [1, 3]),
        at(.metalink, "fdatasync", "jobs.sqlite-wal", [3]),
        at(.metalink, "rename", "/dl/", [1]),
        // A group: members staged, then the folder renamed into place and its parent synced.
        at(.group, "rename", "dld-staging", [2, 6], short: [6]),
        at(.group, "rename", "/chapter", [1], short: [-1, 1]),
        at(.group, "fsyncdir", "/dl", [1, 2], short: []),
        // One enqueue of 10 000 jobs: the commit, and the middle of its WAL writes (torn too).
        at(.enqueue, "fdatasync", "jobs.sqlite-wal", [1], short: [-1, 1], minUnsynced: 1 << 20, claim: commit),
        at(.enqueue, "write", "jobs.sqlite-wal", [50, 200], short: [], claim: { _ in .commandLost }),
        at(.enqueue, "fdatasync", "jobs.sqlite-wal", [1], minUnsynced: 1 << 20, mode: .torn, claim: commit).filter { !$0.after },
        // A bulk pause of 2000 jobs whose transfers checkpoint meanwhile: the points are in the
        // pause's own transaction (the only one that big), and the cut must show it.
        at(.pause, "fdatasync", "jobs.sqlite-wal", [1], short: [1], minUnsynced: 256 << 10, claim: commit),
        at(.pause, "write", "jobs.sqlite-wal", [10, 30], short: [-30], minUnsynced: 256 << 10, claim: { _ in .commandLost }),
        // A cancel: its commit, then the partial file's unlink, under a journal commit that
        // makes every name change durable (the unlink too).
        at(.cancel, "unlink", ".part", [1], short: [1], mode: .names, claim: { _ in .commandDurable }),
        // A remove with delete_file: its commit comes before both unlinks (the completed file's
        // and the partial one's), under a journal commit that makes the unlinks durable.
        at(.remove, "unlink", "/dl/", [1, 2], mode: .names, claim: { _ in .commandDurable }),
        // A remove without delete_file: its commit comes before the partial file's unlink.
        at(.removeKeep, "unlink", ".part", [1], mode: .names, claim: { _ in .commandDurable }),
        // A group into a folder that exists: its files renamed in one by one, then synced.
        at(.groupInto, "rename", "/volume/", [1, 5], short: []),
        at(.groupInto, "fsyncdir", "/volume", [1], short: []),
        // A dropped input list: its enqueue is committed before it moves into added/ (a journal
        // commit makes the move durable).
        at(.drop, "rename", "/added/", [1], mode: .names, claim: { _ in .commandDurable }),
        // A single-stream download resumed from its committed offset: its checkpoints.
        at(.streamResume, "fdatasync", ".part", [1, 3]),
        at(.streamResume, "fdatasync", "jobs.sqlite-wal", [2]),
        // A download paused before its first checkpoint: the pause's answer (the second).
        [CutPoint(work: .pausedEarly, kinds: "answer", pattern: nil, count: 2, after: true)],
        // A resume of 500 paused jobs: its commit (nothing else writes the table meanwhile).
        at(.resume, "fdatasync", "jobs.sqlite-wal", [1], minUnsynced: 64 << 10, claim: commit),
        // The moment a command is answered: what it changed must be durable by then. (Not
        // `queue`: a paused queue is not kept across a restart, by design.)
        [PowerCutWork.big, .small, .enqueue, .pause, .cancel, .remove, .removeKeep, .resume, .change, .setSpeed, .get].map {
            CutPoint(work: $0, kinds: "answer", pattern: nil, count: 1, after: true, short: $0 == .enqueue || $0 == .pause)
        },
    ].flatMap { $0 }

    /// `DLD_POWERCUT=full` (make crash): every cut point; `DLD_POWERCUT=TEXT`: those whose
    /// description contains TEXT (`A|B`: A or B); otherwise the short set.
    static var chosen: [CutPoint] {
        switch ProcessInfo.processInfo.environment["DLD_POWERCUT"] ?? "" {
        case "": return all.filter(\.short)
        case "full": return all
        case let text:
            let alternatives = text.split(separator: "|").map { $0.trimmingCharacters(in: .whitespaces) }
            return all.filter { point in alternatives.contains { point.testDescription.contains($0) } }
        }
    }
}

/// What the harness got an answer for before the cut.
final class Answers: Sendable {
    struct State {
        /// Jobs whose enqueue was answered.
        var ids: [Int64] = []
        /// The jobs a command of the workload names (`remove`'s).
        var targets: [Int64] = []
        var enqueued = false
        var paused = false
        var canceled = false
        var removed = false
        var resumed = false
        /// `change` or `set_speed` was answered.
        var changed = false
        /// `get`'s answer: the path and digest of the cached copy.
        var cached: (path: String, sha256: String)?
        /// The URL `get` asked for (set before it asks).
        var getURL: String?
        /// The age identity an encrypted download is for (its files decrypt with it).
        var identity: AgeTool.Identity?
        /// The workload's command was answered (an `answer` point cuts only then).
        var answered = false
        var finished = false
        var error: String?
    }
    let state = Mutex(State())
}

/// The power is cut (powercutfs) at chosen points of dld's work, dld is killed at that moment,
/// what was not durable is dropped, the machine "reboots" (a fresh mount, a new boot id) and
/// dld starts again. After each cut: no file is under its final name unless its job is
/// completed with that file's digest; every completed job's file is there with its digest;
/// every answered command is still in effect and no job is lost; the job table passes
/// `PRAGMA integrity_check` and every job resumes or completes.
@Suite(.serialized) struct PowerCutTests {
    static let resumeCount = 500
    /// The rate `set_speed` gives the download (above the origin's, so it ends as soon).
    static let changedSpeed: Int64 = 3_000_000

    /// The file dld writes right before each reply (DLD_TEST_REPLY_MARK), at the mount's top.
    static let replyMark = "reply-mark"

    static let config = """
        retry_base = 0.05
        retry_max_delay = 0.2
        read_timeout = 2
        min_free = 0
        checkpoint_interval = 0.1
        """
    static let bigSize = 24_000_000
    static let smallSize = 16 << 10
    static let smallCount = 40
    static let groupSize = 48 << 10
    static let groupCount = 8
    static let streamSize = 8_000_000
    static let dropCount = 20
    static let hlsSegments = 8
    static let hlsSegmentSize = 256 << 10
    /// Files of the user's in the download folder throughout: no cut and no start-up may
    /// touch them (durability rule 5), a `.part` of another program's included.
    static let userFiles = [
        "notes.txt": "the user's own notes\n", "other-program.bin.part": "not dld's partial file\n",
        "volume/cover.txt": "the user's file in a folder a group is published into\n",
    ]

    @Test(arguments: CutPoint.chosen) func powerCut(at point: CutPoint) async throws {
        try await withOrigin { origin in
            let fs = try PowerCutFS(folders: ["state", "dl", "watch/added", "watch/failed"])
            fs.refusing = point.work == .smallLink ? "noreplace" : point.work == .smallRename ? "noreplace,link" : nil
            try FileManager.default.createDirectory(atPath: fs.backing + "/dl/volume", withIntermediateDirectories: true)
            // The cache's folder exists, as ~/.cache does; dld makes `files/` in it.
            try FileManager.default.createDirectory(atPath: fs.backing + "/cache", withIntermediateDirectories: true)
            for (name, text) in Self.userFiles { try text.write(toFile: fs.backing + "/dl/" + name, atomically: false, encoding: .utf8) }
            try fs.mount()
            defer { try? fs.unmount() }
            let bootFile = fs.root + "/boot_id"
            try UUID().uuidString.lowercased().write(toFile: bootFile, atomically: true, encoding: .utf8)
            // With syncfs, no checkpoint syncs the paced files meanwhile: the batch's syncfs is
            // what makes their data durable.
            let config =
                (point.work == .smallSyncfs
                    ? Self.config.replacingOccurrences(of: "checkpoint_interval = 0.1", with: "checkpoint_interval = 60") : Self.config)
                + (point.work == .drop ? "\nwatch_dir = \"\(fs.mountpoint)/watch\"\n" : "")
                + "\ncache_dir = \"\(fs.mountpoint)/cache\"\n" + (point.work == .smallSyncfs ? "max_per_host = \(Self.smallCount)\n" : "")
            // dld's `syncfs` of the mount honoured, for the workload that proves that path.
            let shim = point.work == .smallSyncfs ? try fs.syncfsShimEnvironment() : [:]
            let daemon = try DaemonHarness(config: config, dataRoot: fs.mountpoint)
            daemon.extraEnvironment["DLD_TEST_BOOT_ID_FILE"] = bootFile
            daemon.extraEnvironment.merge(shim) { $1 }
            // dld writes this file right before each reply: an `answer` point freezes there.
            daemon.extraEnvironment["DLD_TEST_REPLY_MARK"] = fs.mountpoint + "/" + Self.replyMark
            try daemon.start()

            // The workload's setup, before the cut point is armed.
            let base = origin.baseURL
            let answers = Answers()
            if point.work == .hls {
                let segment = "\(base)/bytes/\(Self.hlsSegmentSize)?rate=1000000"
                let segments = (0..<Self.hlsSegments).map { n in "#EXTINF:2.0,\n\(segment)&n=\(n)\n" }
                origin.setDocument(
                    "film.m3u8",
                    "#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:2\n#EXT-X-MEDIA-SEQUENCE:0\n" + segments.joined() + "#EXT-X-ENDLIST\n"
                )
            }
            if point.work == .encrypted {
                let identity = try AgeTool.keygen(in: fs.root)
                answers.state.withLock { $0.identity = identity }
            }
            if point.work == .pause {
                let jobs = (0..<2000).map { n -> JSONValue in
                    .object(["url": .string("\(base)/bytes/4096?rate=512&n=\(n)"), "name": .string("p\(n).bin")])
                }
                _ = try daemon.call("enqueue", ["jobs": .array(jobs)])
            }
            if point.work == .cancel {
                // A single-stream download with offsets committed, then the cancel.
                let id = try daemon.enqueue([
                    "url": .string("\(base)/bytes/\(Self.streamSize)?rate=2000000"), "name": "canceled.bin", "segments": 1,
                ])
                answers.state.withLock { $0.ids.append(id) }
                try daemon.waitForJob(id, timeout: 30) { ($0["received"]?.int64Value ?? 0) >= 1_000_000 }
            }
            if point.work == .resume {
                let jobs = (0..<Self.resumeCount).map { n -> JSONValue in
                    .object(["url": .string("\(base)/bytes/4096?n=\(n)"), "name": .string("r\(n).bin"), "paused": true])
                }
                let result = try daemon.call("enqueue", ["jobs": .array(jobs)])
                answers.state.withLock { $0.ids = (result["results"]?.arrayValue ?? []).compactMap { $0["id"]?.int64Value } }
            }
            if point.work == .streamResume {
                // Committed offsets, then a pause: the cut comes in the resumed transfer.
                let id = try daemon.enqueue([
                    "url": .string("\(base)/bytes/\(Self.streamSize)?rate=2000000"), "name": "resumed.bin", "segments": 1,
                ])
                answers.state.withLock { $0.ids.append(id) }
                try daemon.waitForJob(id, timeout: 30) { ($0["received"]?.int64Value ?? 0) >= 1_000_000 }
                _ = try daemon.call("pause", ["id": .int(id)])
                try daemon.waitForState(id, ["paused"], timeout: 30)
            }
            if point.work == .change || point.work == .setSpeed {
                // A single-stream download with offsets committed, then the command.
                let id = try daemon.enqueue([
                    "url": .string("\(base)/bytes/\(Self.streamSize)?rate=2000000"), "name": "changed.bin", "segments": 1,
                ])
                answers.state.withLock { $0.ids.append(id) }
                try daemon.waitForJob(id, timeout: 30) { ($0["received"]?.int64Value ?? 0) >= 1_000_000 }
            }
            if point.work == .remove || point.work == .removeKeep {
                // A completed file (the user's now) and a download with committed offsets.
                let done = try daemon.enqueue(["url": .string("\(base)/bytes/\(Self.groupSize)"), "name": "kept.bin"])
                try daemon.waitForState(done, ["completed"], timeout: 30)
                let partial = try daemon.enqueue([
                    "url": .string("\(base)/bytes/\(Self.streamSize)?rate=2000000"), "name": "removed.bin", "segments": 1,
                ])
                try daemon.waitForJob(partial, timeout: 30) { ($0["received"]?.int64Value ?? 0) >= 1_000_000 }
                answers.state.withLock { $0.targets = [done, partial] }
            }
            if point.work == .smallSyncfs {
                // dld syncs a batch with syncfs only while the system holds little unwritten
                // data (`Publisher.wholeFilesystem`): a build just before (a mutant's) can hold
                // more, and dld would sync each file instead.
                sync()
            }
            if point.kinds == "answer" {
                // The moment dld writes the workload's reply (the first reply from now on): what
                // it commits after that is lost with the cut.
                try fs.arm("write", Self.replyMark, count: point.count, after: true)
            } else {
                try fs.arm(point.kinds, point.pattern, count: point.count, after: point.after, minUnsynced: point.minUnsynced)
            }
            let work = Task.detached {
                var failure: String? = nil
                do {
                    try Self.run(point.work, daemon: daemon, base: base, answers: answers) {
                        answers.state.withLock { $0.answered = true }
                    }
                } catch {
                    failure = "\(error)"
                }
                answers.state.withLock {
                    $0.finished = true
                    $0.error = failure
                }
            }
            var frozeAt: PowerCutFS.Frozen? = nil
            var grace = 20
            while frozeAt == nil && grace > 0 {
                frozeAt = try fs.waitFrozen(timeout: 0.1)
                if answers.state.withLock({ $0.finished }) { grace -= 1 }
            }
            if point.kinds == "answer", frozeAt != nil {
                // Frozen as dld wrote its reply: the harness reads the reply before the cut
                // (nothing of the filesystem is needed for it to arrive).
                let deadline = Date().addingTimeInterval(30)
                while !answers.state.withLock({ $0.answered || $0.finished }) && Date() < deadline { usleep(10_000) }
                #expect(answers.state.withLock { $0.answered }, "frozen at the reply, but the reply never came")
            }
            // The moment of the cut: dld dies with everything not yet durable.
            if let pid = daemon.pid { kill(pid, SIGKILL) }
            // What a cut may leave varies with the point (see `CutPoint.cutMode`); an undo that
            // failed throws here (the disk would not be what the model says).
            let cutError = Result { try fs.cut(point.cutMode) }
            daemon.crash()
            await work.value
            try fs.unmount()
            _ = try cutError.get()
            // The cut hit what the point names: its kind of operation on its file, inside a
            // transaction as big as it claims; a workload that never got there fails the point.
            guard let frozeAt else {
                Issue.record(
                    "the cut point was never reached: the workload ended first (\(answers.state.withLock { $0.error } ?? "no error"))")
                return
            }
            if point.kinds == "answer" {
                #expect(frozeAt.kind == "write" && frozeAt.path.hasSuffix(Self.replyMark), "the cut froze at \(frozeAt), not at the answer")
            } else {
                #expect(
                    point.kinds.split(separator: ",").contains(Substring(frozeAt.kind))
                        && (point.pattern.map { frozeAt.path.contains($0) } ?? true),
                    "the cut froze at \(frozeAt), not at \(point.kinds) of \(point.pattern ?? "-")")
                #expect(frozeAt.unsynced >= point.minUnsynced, "the cut froze at \(frozeAt), outside the transaction it claims")
            }

            // Before dld starts again: the table opens, and no file has its final name early.
            let rows = try Self.offlineRows(fs: fs)
            let identity = answers.state.withLock { $0.identity }
            try Self.expectFinalNamesVerified(fs: fs, rows: rows, work: point.work, identity: identity)
            // Committed offsets survive: below each committed offset (each range's, for a download
            // in ranges) an unfinished job's partial file holds the origin's bytes (else the
            // download would start over, or go on from wrong bytes).
            try Self.expectCommittedBytes(fs: fs, rows: rows)
            if point.work == .group || point.work == .groupInto { try Self.expectGroupWhole(fs: fs, point.work) }
            if point.work == .get { try Self.expectCacheIndex(fs: fs, answers: answers) }
            if point.work == .drop {
                // The list leaves the drop folder only once its jobs are committed.
                let waiting = FileManager.default.fileExists(atPath: fs.backing + "/watch/list.txt")
                #expect(waiting || rows.count == Self.dropCount, "list.txt left the drop folder; \(rows.count) of its jobs exist")
                if point.claim == .commandDurable {
                    #expect(rows.count == Self.dropCount, "the cut claims the list's enqueue committed; \(rows.count) jobs exist")
                }
            }
            try Self.expectUserFilesUntouched(fs.backing + "/dl")
            if ProcessInfo.processInfo.environment["DLD_POWERCUT_LOG"] != nil {
                print("frozen at", frozeAt, rows.values.sorted { $0.id < $1.id }.map { "\($0.id) \($0.state) \($0.path)" })
                print(try runProgram("/usr/bin/find", [fs.backing + "/dl", "-ls"]).stdout)
            }

            // The reboot: a fresh mount, a new boot id, dld again.
            try UUID().uuidString.lowercased().write(toFile: bootFile, atomically: true, encoding: .utf8)
            try fs.mount()
            let again = try DaemonHarness(config: config, dataRoot: fs.mountpoint)
            again.extraEnvironment["DLD_TEST_BOOT_ID_FILE"] = bootFile
            again.extraEnvironment.merge(shim) { $1 }
            try again.start()
            defer { again.stop() }
            try Self.expectAnswersInEffect(point, answers: answers, rows: rows, daemon: again)
            try Self.expectEveryJobFinishes(point.work, daemon: again, identity: identity)
            try Self.expectUserFilesUntouched(again.downloadDir)
            if ProcessInfo.processInfo.environment["DLD_POWERCUT_LOG"] != nil { print(daemon.log, again.log) }
        }
    }

    /// The workload; records each answer it gets.
    static func run(_ work: PowerCutWork, daemon: DaemonHarness, base: String, answers: Answers, answered: () -> Void) throws {
        switch work {
        case .big:
            // 6 MB/s a connection, four ranges: about a second, so that a loaded machine still
            // makes the six WAL syncs a point waits for (at 12 MB/s one run ended before them).
            let id = try daemon.enqueue(["url": .string("\(base)/bytes/\(bigSize)?rate=6000000"), "name": "big.bin"])
            answers.state.withLock { $0.ids.append(id) }
            answered()
            try daemon.waitForState(id, ["completed"], timeout: 60)
        case .stream, .encrypted:
            var job: [String: JSONValue] = [
                "url": .string("\(base)/bytes/\(streamSize)?rate=4000000"), "name": "stream.bin", "segments": 1,
            ]
            if work == .encrypted {
                job["name"] = "secret.bin"
                job["encrypt_to"] = [.string(answers.state.withLock { $0.identity?.recipient } ?? "")]
            }
            let id = try daemon.enqueue(job)
            answers.state.withLock { $0.ids.append(id) }
            answered()
            try daemon.waitForState(id, ["completed"], timeout: 60)
        case .streamResume:
            let id = answers.state.withLock { $0.ids[0] }
            _ = try daemon.call("resume", ["id": .int(id)])
            answered()
            try daemon.waitForState(id, ["completed"], timeout: 60)
        case .pausedEarly:
            let id = try daemon.enqueue([
                "url": .string("\(base)/bytes/\(streamSize)?rate=1000000"), "name": "early.bin", "segments": 1,
            ])
            answers.state.withLock { $0.ids.append(id) }
            _ = try daemon.call("pause", ["id": .int(id)])
            answers.state.withLock { $0.paused = true }
            answered()
        case .cancel:
            let ids = answers.state.withLock { $0.ids }
            _ = try daemon.call("cancel", ["ids": .array(ids.map { .int($0) })])
            answers.state.withLock { $0.canceled = true }
            answered()
        case .drop:
            // Written aside, synced, renamed in and its folder synced: the list is the user's,
            // durable before dld sees it.
            let lines = (0..<dropCount).map { n in String(format: "\(base)/bytes/\(smallSize)?n=%d\n  out=d%02d.bin\n", n, n) }
            let folder = String(daemon.downloadDir.dropLast("/dl".count)) + "/watch"
            try Self.writeDurably(lines.joined(), to: folder + "/.list.txt")
            guard rename(folder + "/.list.txt", folder + "/list.txt") == 0 else { throw HarnessError("rename list.txt: \(errno)") }
            try Self.syncFolder(folder)
            let deadline = Date().addingTimeInterval(60)
            while (try allJobs(daemon).filter { $0["state"] == "completed" }.count) < dropCount && Date() < deadline { usleep(50_000) }
        case .remove, .removeKeep:
            let ids = answers.state.withLock { $0.targets }
            _ = try daemon.call("remove", ["ids": .array(ids.map { .int($0) }), "delete_file": .bool(work == .remove)])
            answers.state.withLock { $0.removed = true }
            answered()
        case .get:
            let url = "\(base)/bytes/\(streamSize)?rate=4000000"
            answers.state.withLock { $0.getURL = url }
            let got = try daemon.call("get", ["url": .string(url), "pin": true])
            let path = got["path"]?.stringValue ?? ""
            answers.state.withLock { $0.cached = (path, got["sha256"]?.stringValue ?? "") }
            answered()
        case .hls:
            let result = try daemon.call("enqueue", ["url": .string("\(base)/doc/film.m3u8"), "name": "film.ts"])
            let ids = (result["results"]?.arrayValue ?? []).compactMap { $0["id"]?.int64Value }
            answers.state.withLock { $0.ids += ids }
            answered()
            let deadline = Date().addingTimeInterval(60)
            while try daemon.call("status", ["group": "film.ts"])["group"]?["state"] != "completed" && Date() < deadline { usleep(50_000) }
        case .metalink:
            let mirrors = [1, 2].map { ("\(base)/bytes/\(streamSize)?rate=2000000&n=\($0)", 1) }
            let xml = MetalinkTests.document([try MetalinkTests.file("linked.bin", size: streamSize, urls: mirrors)])
            let result = try daemon.call("enqueue", ["metalink": .string(xml)])
            let id = result["job"]?["id"]?.int64Value ?? 0
            answers.state.withLock { $0.ids.append(id) }
            answered()
            try daemon.waitForState(id, ["completed"], timeout: 60)
        case .small, .smallLink, .smallRename, .smallSyncfs:
            // With syncfs, all the files at once for about a second: they finish together, so
            // that they are published in batches of many (one file alone gets its `fdatasync`).
            let pace = work == .smallSyncfs ? "&rate=\(smallSize)" : ""
            let jobs = (0..<smallCount).map { n -> JSONValue in
                .object(["url": .string("\(base)/bytes/\(smallSize)?n=\(n)\(pace)"), "name": .string(String(format: "f%02d.bin", n))])
            }
            let result = try daemon.call("enqueue", ["jobs": .array(jobs)])
            let ids = (result["results"]?.arrayValue ?? []).compactMap { $0["id"]?.int64Value }
            answers.state.withLock { $0.ids += ids }
            answered()
            for id in ids { try daemon.waitForState(id, ["completed"], timeout: 60) }
        case .group, .groupInto:
            let jobs = (0..<groupCount).map { n -> JSONValue in
                .object(["url": .string("\(base)/bytes/\(groupSize)?n=\(n)"), "name": .string("page\(n).bin")])
            }
            let name = work == .group ? "chapter" : "volume"
            let result = try daemon.call(
                "enqueue",
                [
                    "group": ["name": .string(name), "dir": .string(daemon.downloadDir + "/" + name)], "jobs": .array(jobs),
                ])
            let ids = (result["results"]?.arrayValue ?? []).compactMap { $0["id"]?.int64Value }
            answers.state.withLock { $0.ids += ids }
            for id in ids { try daemon.waitForState(id, ["completed"], timeout: 60) }
        case .enqueue:
            let jobs = (0..<10_000).map { n -> JSONValue in
                .object(["url": .string("\(base)/bytes/1024?n=\(n)"), "name": .string("e\(n).bin"), "paused": true])
            }
            let result = try daemon.call("enqueue", ["jobs": .array(jobs)])
            let ids = (result["results"]?.arrayValue ?? []).compactMap { $0["id"]?.int64Value }
            answers.state.withLock {
                $0.ids += ids
                $0.enqueued = true
            }
            answered()
        case .pause:
            _ = try daemon.call("pause", ["all": true])
            answers.state.withLock { $0.paused = true }
            answered()
        case .resume:
            _ = try daemon.call("resume", ["all": true])
            answers.state.withLock { $0.resumed = true }
            answered()
        case .change:
            let id = answers.state.withLock { $0.ids[0] }
            _ = try daemon.call("change", ["id": .int(id), "headers": ["X-Changed": "yes"]])
            answers.state.withLock { $0.changed = true }
            answered()
        case .setSpeed:
            let id = answers.state.withLock { $0.ids[0] }
            _ = try daemon.call("set_speed", ["id": .int(id), "max_speed": .int(Self.changedSpeed)])
            answers.state.withLock { $0.changed = true }
            answered()
        }
    }

    /// One row of the job table, read with sqlite3 from the backing folder (a copy).
    struct Row {
        var id: Int64
        var state: String
        var path: String
        var sha256: String?
        var received: Int64
        /// Where its partial file is: beside its final name, or in its group's staging folder.
        var partialPath: String
        /// A download in ranges: `start-done-end` per range (`SegmentLayout.encoded`); empty
        /// for one stream of `received` bytes.
        var segments: String
    }

    /// Copies a SQLite database and its WAL (as the cut left them; `-shm` is rebuilt) from the
    /// backing folder into a fresh folder `copy`, so that reading it changes nothing.
    static func copyDatabase(_ relative: String, of fs: PowerCutFS, into copy: String) throws {
        try? FileManager.default.removeItem(atPath: copy)
        try FileManager.default.createDirectory(atPath: copy, withIntermediateDirectories: true)
        let name = (relative as NSString).lastPathComponent
        for suffix in ["", "-wal"] where FileManager.default.fileExists(atPath: fs.backing + "/" + relative + suffix) {
            try FileManager.default.copyItem(atPath: fs.backing + "/" + relative + suffix, toPath: copy + "/" + name + suffix)
        }
    }

    /// Copies the job table out of the backing folder, checks its integrity and reads its rows.
    static func offlineRows(fs: PowerCutFS) throws -> [Int64: Row] {
        let copy = fs.root + "/copy"
        try copyDatabase("state/jobs.sqlite", of: fs, into: copy)
        guard FileManager.default.fileExists(atPath: copy + "/jobs.sqlite") else { return [:] }
        let check = try runProgram("/usr/bin/sqlite3", [copy + "/jobs.sqlite", "PRAGMA integrity_check;"])
        #expect(check.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "ok", "integrity_check: \(check.stdout) \(check.stderr)")
        let listed = try runProgram(
            "/usr/bin/sqlite3",
            [
                "-separator", "\t", copy + "/jobs.sqlite",
                "SELECT id, state, path, coalesce(sha256, ''), received, coalesce(staging_path, path) || '.part', "
                    + "coalesce(segments, '') FROM jobs;",
            ])
        #expect(listed.status == 0, "\(listed.stderr)")
        var rows: [Int64: Row] = [:]
        for line in listed.stdout.split(separator: "\n") {
            let fields = line.split(separator: "\t", omittingEmptySubsequences: false).map(String.init)
            guard fields.count == 7, let id = Int64(fields[0]) else { continue }
            rows[id] = Row(
                id: id, state: fields[1], path: fields[2], sha256: fields[3].isEmpty ? nil : fields[3], received: Int64(fields[4]) ?? 0,
                partialPath: fields[5], segments: fields[6])
        }
        return rows
    }

    /// Below every committed offset of an unfinished job (each range's, for a download in
    /// ranges), its partial file holds the origin's bytes: what was committed was synced
    /// first (rule 2), under a name that was durable too. Every file here is the origin's
    /// deterministic bytes from offset 0, whatever its URL's query.
    static func expectCommittedBytes(fs: PowerCutFS, rows: [Int64: Row]) throws {
        for row in rows.values where row.received > 0 && !["completed", "canceled"].contains(row.state) {
            if row.path.hasSuffix(".age") {
                try expectCiphertextOnly(fs: fs, row: row)
                continue
            }
            var ranges: [(start: Int64, done: Int64)] = [(0, row.received)]
            if !row.segments.isEmpty {
                ranges = row.segments.split(separator: ",").compactMap { part in
                    let numbers = part.split(separator: "-").compactMap { Int64($0) }
                    return numbers.count == 3 ? (numbers[0], numbers[1]) : nil
                }
                #expect(
                    ranges.reduce(0) { $0 + $1.done - $1.start } == row.received,
                    "job \(row.id): its ranges \(row.segments) do not add up to its \(row.received) bytes")
            }
            let partial = fs.backing + row.partialPath.dropFirst(fs.mountpoint.count)
            guard let handle = FileHandle(forReadingAtPath: partial) else {
                Issue.record("job \(row.id) (\(row.state)) committed \(row.received) bytes; its partial file is gone")
                continue
            }
            defer { try? handle.close() }
            for range in ranges where range.done > range.start {
                try handle.seek(toOffset: UInt64(range.start))
                let count = Int(range.done - range.start)
                let onDisk = [UInt8](try handle.read(upToCount: count) ?? Data())
                let origin = TestOrigin.bytes(from: range.start, count: count)
                guard onDisk != origin else { continue }
                let first = (0..<min(onDisk.count, origin.count)).first { onDisk[$0] != origin[$0] } ?? min(onDisk.count, origin.count)
                let what =
                    onDisk.count < count
                    ? "ends at \(range.start + Int64(onDisk.count))" : "differs from the origin's at \(range.start + Int64(first))"
                Issue.record("job \(row.id) (\(row.state)) committed bytes \(range.start)..<\(range.done); its partial file \(what)")
                break
            }
        }
    }

    /// An encrypted job's partial file holds ciphertext only, whatever the cut left: an age
    /// header at byte 0 (or zeros, where the cut lost the header's write), and none of the
    /// origin's bytes. Its `received` counts plaintext that no new attempt can continue (the
    /// key was in the dead attempt's memory), so no bytes are compared with the origin's.
    static func expectCiphertextOnly(fs: PowerCutFS, row: Row) throws {
        let partial = fs.backing + row.partialPath.dropFirst(fs.mountpoint.count)
        guard let data = FileManager.default.contents(atPath: partial), !data.isEmpty else { return }
        let header = Data("age-encryption.org/v1\n".utf8)
        let start = data.prefix(header.count)
        #expect(
            start == header.prefix(start.count) || start.allSatisfy { $0 == 0 },
            "job \(row.id)'s encrypted partial file starts with \(Array(start))")
        for offset in [0, 1 << 20, 3 << 20] where offset + 4096 <= streamSize {
            let probe = Data(TestOrigin.bytes(from: Int64(offset), count: 64))
            #expect(data.range(of: probe) == nil, "job \(row.id)'s encrypted partial file holds the plaintext of byte \(offset)")
        }
    }

    /// The URL cache's index after a cut, before dld starts: it opens and passes
    /// `integrity_check`; every entry it holds ready names a file with the entry's size and
    /// digest; an answered `get` with `pin` is there, ready and pinned, with the file it named.
    static func expectCacheIndex(fs: PowerCutFS, answers: Answers) throws {
        let copy = fs.root + "/cache-copy"
        try copyDatabase("cache/index.sqlite", of: fs, into: copy)
        let cached = answers.state.withLock { $0.cached }
        guard FileManager.default.fileExists(atPath: copy + "/index.sqlite") else {
            #expect(cached == nil, "get was answered with \(cached?.path ?? "-"); the cache's index is gone")
            return
        }
        let check = try runProgram("/usr/bin/sqlite3", [copy + "/index.sqlite", "PRAGMA integrity_check;"])
        #expect(check.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "ok", "the cache index: \(check.stdout) \(check.stderr)")
        let listed = try runProgram(
            "/usr/bin/sqlite3",
            ["-separator", "\t", copy + "/index.sqlite", "SELECT path, ready, bytes, coalesce(sha256, ''), pinned FROM cache_entries;"])
        #expect(listed.status == 0, "\(listed.stderr)")
        var entries: [String: (ready: Bool, bytes: Int64, sha256: String, pinned: Bool)] = [:]
        for line in listed.stdout.split(separator: "\n") {
            let fields = line.split(separator: "\t", omittingEmptySubsequences: false).map(String.init)
            guard fields.count == 5 else { continue }
            entries[fields[0]] = (fields[1] == "1", Int64(fields[2]) ?? -1, fields[3], fields[4] == "1")
        }
        for (path, entry) in entries where entry.ready {
            let file = fs.backing + path.dropFirst(fs.mountpoint.count)
            let size = (try? FileManager.default.attributesOfItem(atPath: file))?[.size] as? Int64
            #expect(
                size == entry.bytes,
                "the cache holds \(path) ready with \(entry.bytes) bytes; the file has \(size.map(String.init) ?? "gone")")
            if size == entry.bytes {
                #expect((try sha256sum(file)) == entry.sha256, "the cache's \(path) does not match its entry's digest")
            }
        }
        if let cached {
            let entry = entries[cached.path]
            #expect(
                entry?.ready == true && entry?.pinned == true && entry?.sha256 == cached.sha256,
                "get was answered with \(cached.path), pinned; the index holds \(entry.map { "\($0)" } ?? "no entry for it")")
        }
    }

    static func writeDurably(_ text: String, to path: String) throws {
        let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw HarnessError("open \(path): \(errno)") }
        defer { close(fd) }
        let bytes = Array(text.utf8)
        guard write(fd, bytes, bytes.count) == bytes.count, fsync(fd) == 0 else { throw HarnessError("write \(path): \(errno)") }
    }

    static func syncFolder(_ folder: String) throws {
        let fd = open(folder, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { throw HarnessError("open \(folder): \(errno)") }
        defer { close(fd) }
        guard fsync(fd) == 0 else { throw HarnessError("fsync \(folder): \(errno)") }
    }

    /// A group's files are in its folder only once the group is recorded completed: the folder
    /// appears whole (or, for a folder that exists, its members move in after the commit).
    static func expectGroupWhole(fs: PowerCutFS, _ work: PowerCutWork) throws {
        let name = work == .group ? "chapter" : "volume"
        let folder = fs.backing + "/dl/" + name
        let members = ((try? FileManager.default.contentsOfDirectory(atPath: folder)) ?? []).filter { $0.hasPrefix("page") }
        guard !members.isEmpty || (work == .group && FileManager.default.fileExists(atPath: folder)) else { return }
        let copy = fs.root + "/copy/jobs.sqlite"
        let closed = try runProgram("/usr/bin/sqlite3", [copy, "SELECT coalesce(closed, 'open') FROM groups WHERE name = '\(name)';"])
        #expect(
            closed.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "completed",
            "\(name)/ holds \(members.sorted()) while its group is \(closed.stdout.trimmingCharacters(in: .whitespacesAndNewlines))")
    }

    /// The user's own files in `folder` are there, unchanged.
    static func expectUserFilesUntouched(_ folder: String) throws {
        for (name, text) in userFiles {
            let now = try? String(contentsOfFile: folder + "/" + name, encoding: .utf8)
            #expect(now == text, "the user's \(name) was \(now == nil ? "deleted" : "changed")")
        }
    }

    /// No file is under its final name unless its job is completed with that file's digest
    /// (or, after a `remove` with `delete_file` committed and its unlink not durable, it is the
    /// removed job's complete file: deleted late, never early).
    static func expectFinalNamesVerified(
        fs: PowerCutFS, rows: [Int64: Row], work: PowerCutWork? = nil, identity: AgeTool.Identity? = nil
    ) throws {
        try expectFinalNamesVerified(fs: fs, rows: rows, folder: "dl", work: work, identity: identity)
        // The cache's copies are jobs' files too (`get`).
        try expectFinalNamesVerified(fs: fs, rows: rows, folder: "cache/files", work: work, identity: identity)
    }

    static func expectFinalNamesVerified(
        fs: PowerCutFS, rows: [Int64: Row], folder: String, work: PowerCutWork?, identity: AgeTool.Identity?
    ) throws {
        let byPath = Dictionary(rows.values.map { ($0.path, $0) }, uniquingKeysWith: { first, _ in first })
        let root = fs.backing + "/" + folder
        guard let walker = FileManager.default.enumerator(atPath: root) else { return }
        while let relative = walker.nextObject() as? String {
            let full = root + "/" + relative
            var isDir: ObjCBool = false
            guard FileManager.default.fileExists(atPath: full, isDirectory: &isDir), !isDir.boolValue else { continue }
            if relative.hasSuffix(".part") || relative.contains(".dld-staging-") || userFiles[relative] != nil { continue }
            let row = byPath[fs.mountpoint + "/" + folder + "/" + relative]
            // The joined file of an HLS group (its members' path): there only once the group
            // is recorded completed, with the segments in order.
            if work == .hls && relative == "film.ts" {
                let copy = fs.root + "/copy/jobs.sqlite"
                let closed = try runProgram(
                    "/usr/bin/sqlite3", [copy, "SELECT coalesce(closed, 'open') FROM groups WHERE name = 'film.ts';"])
                #expect(
                    closed.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "completed",
                    "film.ts is under its name while its group is \(closed.stdout.trimmingCharacters(in: .whitespacesAndNewlines))")
                #expect((try sha256sum(full)) == (try joinedDigest()), "film.ts under its name is not the segments joined")
                continue
            }
            if (work == .remove || work == .removeKeep) && relative == "kept.bin" && row == nil {
                #expect((try sha256sum(full)) == (try originDigest(groupSize)), "the removed job's kept.bin is not its complete file")
                continue
            }
            #expect(
                row?.state == "completed",
                "\(relative) is under its final name, its job is \(row.map { "\($0.id) \($0.state)" } ?? "unknown")")
            if let row, row.state == "completed" {
                #expect(
                    row.sha256 == (try plaintextDigest(full, identity: identity)),
                    "\(relative) under its final name does not match its job's digest")
            }
        }
    }

    /// The SHA-256 of a file, or of its plaintext for an encrypted one (`.age`, decrypted with
    /// `identity`; nil when it does not decrypt).
    static func plaintextDigest(_ path: String, identity: AgeTool.Identity?) throws -> String? {
        guard path.hasSuffix(".age") else { return try sha256sum(path) }
        guard let identity, let plaintext = try? AgeTool.decrypt(path, identity: identity) else { return nil }
        return try MetalinkTests.hex(.sha256, [UInt8](plaintext)[...])
    }

    /// Every command answered before the cut is in effect, and no job is lost.
    static func expectAnswersInEffect(_ point: CutPoint, answers: Answers, rows: [Int64: Row], daemon: DaemonHarness) throws {
        let work = point.work
        let answered = answers.state.withLock { $0 }
        if work == .remove || work == .removeKeep {
            if work == .removeKeep {
                // Removed or not, the completed file stays: it is the user's.
                #expect(
                    (try? sha256sum(daemon.downloadDir + "/kept.bin")) == (try originDigest(groupSize)),
                    "a remove without delete_file took kept.bin")
            }
            let left = Set(try allJobs(daemon).compactMap { $0["id"]?.int64Value })
            #expect(Set(rows.keys) == left, "dld lists the jobs of the table")
            let removed = answered.targets.filter { !left.contains($0) }
            #expect(
                removed.isEmpty || removed.count == answered.targets.count, "a remove is one transaction: \(removed) of \(answered.targets)"
            )
            if answered.removed || point.claim == .commandDurable {
                #expect(
                    removed.count == answered.targets.count,
                    "the remove was \(answered.removed ? "answered" : "committed"); jobs \(answered.targets) are \(left.sorted()) after the cut"
                )
            } else if point.claim == .commandLost {
                #expect(removed.isEmpty, "the cut claims the remove's commit lost; jobs \(removed) are gone")
            }
            return
        }
        let jobs = try allJobs(daemon)
        let ids = Set(jobs.compactMap { $0["id"]?.int64Value })
        if work != .pause { #expect(!answered.ids.isEmpty || !answered.enqueued, "an answered enqueue names its jobs") }
        for id in answered.ids { #expect(ids.contains(id), "job \(id) was answered and is lost") }
        #expect(Set(rows.keys) == ids, "dld lists the jobs of the table")
        switch work {
        case .enqueue:
            // One transaction: all or nothing; all once answered.
            #expect(
                ids.count == 10_000 || (ids.isEmpty && !answered.enqueued),
                "\(ids.count) jobs after the cut, answered: \(answered.enqueued)")
            if let claim = point.claim {
                #expect(
                    ids.count == (claim == .commandDurable ? 10_000 : 0),
                    "the cut claims the enqueue's commit \(claim == .commandDurable ? "durable" : "lost"): \(ids.count) jobs after it")
            }
        case .pause:
            #expect(ids.count == 2000)
            let paused = jobs.filter { $0["state"] == "paused" }.count
            let unfinished = jobs.filter { $0["state"] != "completed" }.count
            if answered.paused {
                #expect(paused == unfinished, "pause was answered; \(paused) of \(unfinished) unfinished jobs are paused")
            } else {
                #expect(paused == 0 || paused == unfinished, "a pause is one transaction: \(paused) of \(unfinished) paused")
            }
            if let claim = point.claim {
                #expect(
                    paused == (claim == .commandDurable ? unfinished : 0),
                    "the cut claims the pause's commit \(claim == .commandDurable ? "durable" : "lost"): \(paused) of \(unfinished) paused")
            }
        case .resume:
            #expect(ids.count == resumeCount)
            let paused = jobs.filter { $0["state"] == "paused" }.count
            if answered.resumed || point.claim == .commandDurable {
                #expect(paused == 0, "the resume was \(answered.resumed ? "answered" : "committed"); \(paused) jobs are paused")
            } else {
                #expect(paused == 0 || paused == resumeCount, "a resume is one transaction: \(paused) of \(resumeCount) paused")
            }
            if point.claim == .commandLost { #expect(paused == resumeCount, "the cut claims the resume's commit lost; \(paused) paused") }
        case .get:
            // The copy `get` answered is still the cache's, pinned: asked again, the cache
            // answers it at once from the same file.
            guard let url = answered.getURL else { break }
            let again = try daemon.call("get", ["url": .string(url)])
            let path = again["path"]?.stringValue ?? ""
            #expect((try? sha256sum(path)) == (try originDigest(streamSize)), "the cache's copy \(path) is not the origin's bytes")
            if let cached = answered.cached {
                #expect(
                    again["source"] == "hit" && path == cached.path, "get was answered with \(cached.path); now \(again.serializedString())"
                )
                let listed = try daemon.call("cache_list")["entries"]?.arrayValue ?? []
                #expect(listed.contains { $0["path"]?.stringValue == cached.path && $0["pinned"] == true }, "the pin is lost: \(listed)")
            }
        case .pausedEarly:
            let state = jobs.first?["state"]?.stringValue
            if answered.paused { #expect(state == "paused", "the pause was answered and the job is \(state ?? "gone")") }
        case .change, .setSpeed:
            let job = try #require(jobs.first)
            let headers = (job["headers"]?.arrayValue ?? []).compactMap { $0["name"]?.stringValue }
            let inEffect = work == .change ? headers.contains("X-Changed") : job["max_speed"]?.int64Value == changedSpeed
            if answered.changed {
                #expect(inEffect, "the \(work.rawValue) was answered and is not in effect: \(job.serializedString())")
            }
        case .cancel:
            let state = jobs.first?["state"]?.stringValue
            if answered.canceled || point.claim == .commandDurable {
                #expect(
                    state == "canceled", "the cancel was \(answered.canceled ? "answered" : "committed") and the job is \(state ?? "gone")")
            } else if point.claim == .commandLost {
                #expect(state != "canceled", "the cut claims the cancel's commit lost, and the job is canceled")
            }
        default:
            break
        }
    }

    /// Every job resumes or completes; every completed job's file is there with its digest.
    static func expectEveryJobFinishes(_ work: PowerCutWork, daemon: DaemonHarness, identity: AgeTool.Identity? = nil) throws {
        switch work {
        case .remove, .removeKeep:
            // What the remove did not take completes, with its file (a completed file is deleted
            // only with its record).
            for job in try allJobs(daemon) {
                guard let id = job["id"]?.int64Value else { continue }
                let done = try daemon.waitForState(id, ["completed", "failed"], timeout: 60)
                #expect(done["state"] == "completed", "\(done.serializedString())")
                let path = done["path"]?.stringValue ?? ""
                let size = path.hasSuffix("kept.bin") ? groupSize : streamSize
                #expect((try? sha256sum(path)) == (try originDigest(size)), "\(path) of completed job \(id) is missing or wrong")
            }
        case .cancel:
            // A canceled job stays so, its partial data gone (start-up removes what the cut
            // left); one whose cancel was lost completes.
            for job in try allJobs(daemon) {
                guard let id = job["id"]?.int64Value else { continue }
                let done = try daemon.waitForState(id, ["completed", "failed", "canceled"], timeout: 60)
                #expect(done["state"] != "failed", "\(done.serializedString())")
                let path = done["path"]?.stringValue ?? ""
                if done["state"] == "canceled" {
                    #expect(!FileManager.default.fileExists(atPath: path + ".part"), "canceled job \(id) left its partial file")
                } else if done["state"] == "completed" {
                    #expect((try sha256sum(path)) == (try originDigest(streamSize)), "\(path) does not hold the origin's bytes")
                }
            }
        case .resume:
            for job in try allJobs(daemon) {
                guard let id = job["id"]?.int64Value else { continue }
                if job["state"] == "paused" { _ = try daemon.call("resume", ["id": .int(id)]) }
                let done = try daemon.waitForState(id, ["completed", "failed"], timeout: 60)
                #expect(done["state"] == "completed", "\(done.serializedString())")
            }
        case .change, .setSpeed:
            for job in try allJobs(daemon) {
                guard let id = job["id"]?.int64Value else { continue }
                let done = try daemon.waitForState(id, ["completed", "failed"], timeout: 60)
                #expect(done["state"] == "completed", "\(done.serializedString())")
                #expect((try sha256sum(done["path"]?.stringValue ?? "")) == (try originDigest(streamSize)), "job \(id)'s file")
            }
        case .enqueue, .pause:
            // Thousands of jobs: each resumes (queued again), checked by state.
            _ = try daemon.call("resume", ["all": true])
            let jobs = try allJobs(daemon)
            let stuck = jobs.filter { !["queued", "running", "completed"].contains($0["state"]?.stringValue ?? "") }
            #expect(stuck.isEmpty, "jobs that did not resume: \(stuck.prefix(3).map { $0.serializedString() })")
        case .drop:
            // The list's jobs all exist (enqueued before the cut, or by the sweep at start) and complete.
            let deadline = Date().addingTimeInterval(30)
            var jobs = try allJobs(daemon)
            while jobs.count < dropCount && Date() < deadline {
                usleep(50_000)
                jobs = try allJobs(daemon)
            }
            #expect(jobs.count == dropCount, "the dropped list's \(dropCount) jobs: \(jobs.count) exist")
            for job in jobs {
                guard let id = job["id"]?.int64Value else { continue }
                let done = try daemon.waitForState(id, ["completed", "failed"], timeout: 60)
                #expect(done["state"] == "completed", "\(done.serializedString())")
            }
        case .hls:
            // The members are joined into one file: it is there, the segments in order.
            let deadline = Date().addingTimeInterval(60)
            var group = try daemon.call("status", ["group": "film.ts"])
            while group["group"]?["state"] != "completed" && group["group"]?["state"] != "failed" && Date() < deadline {
                usleep(20_000)
                group = try daemon.call("status", ["group": "film.ts"])
            }
            #expect(group["group"]?["state"] == "completed", "\(group.serializedString())")
            #expect((try? sha256sum(daemon.downloadDir + "/film.ts")) == (try joinedDigest()), "film.ts is not the segments joined")
        case .pausedEarly:
            for job in try allJobs(daemon) {
                guard let id = job["id"]?.int64Value else { continue }
                if job["state"] == "paused" { _ = try daemon.call("resume", ["id": .int(id)]) }
            }
            fallthrough
        case .big, .stream, .streamResume, .small, .smallLink, .smallRename, .smallSyncfs, .group, .groupInto, .encrypted, .get, .metalink:
            let jobs = try allJobs(daemon)
            for job in jobs {
                guard let id = job["id"]?.int64Value else { continue }
                try daemon.waitForState(id, ["completed", "failed"], timeout: 60)
            }
            // A group's completed members are in its folder once the group is published.
            if work == .group || work == .groupInto {
                let name: JSONValue = work == .group ? "chapter" : "volume"
                let deadline = Date().addingTimeInterval(60)
                var group = try daemon.call("status", ["group": name])
                while group["group"]?["state"] != "completed" && group["group"]?["state"] != "failed" && Date() < deadline {
                    usleep(20_000)
                    group = try daemon.call("status", ["group": name])
                }
                #expect(group["group"]?["state"] == "completed", "\(group.serializedString())")
            }
            for job in jobs {
                guard let id = job["id"]?.int64Value else { continue }
                let done = try daemon.waitForState(id, ["completed", "failed"], timeout: 60)
                #expect(done["state"] == "completed", "\(done.serializedString())")
                guard let path = done["path"]?.stringValue else { continue }
                #expect(FileManager.default.fileExists(atPath: path), "\(path) of completed job \(id) is missing")
                let size =
                    work == .big
                    ? bigSize
                    : [.stream, .streamResume, .pausedEarly, .encrypted, .get, .metalink].contains(work)
                        ? streamSize : [.small, .smallLink, .smallRename, .smallSyncfs].contains(work) ? smallSize : groupSize
                #expect(done["sha256"]?.stringValue == (try originDigest(size)), "job \(id)'s recorded digest")
                if FileManager.default.fileExists(atPath: path) {
                    #expect(
                        (try plaintextDigest(path, identity: identity)) == (try originDigest(size)),
                        "\(path) does not hold the origin's bytes")
                }
            }
        }
    }

    static func allJobs(_ daemon: DaemonHarness) throws -> [JSONValue] {
        var jobs: [JSONValue] = []
        var after: Int64 = 0
        while true {
            let page = try daemon.call("list", ["after_id": .int(after), "limit": 1000])
            jobs += page["jobs"]?.arrayValue ?? []
            guard let next = page["next_after_id"]?.int64Value else { return jobs }
            after = next
        }
    }

    static let digests = Mutex<[Int: String]>([:])

    /// The SHA-256 of the HLS workload's segments joined (each the origin's first bytes).
    static func joinedDigest() throws -> String {
        let joined = [UInt8](Array(repeating: TestOrigin.bytes(count: hlsSegmentSize), count: hlsSegments).joined())
        return try MetalinkTests.hex(.sha256, joined[...])
    }

    /// The SHA-256 of the origin's first `size` bytes.
    static func originDigest(_ size: Int) throws -> String {
        if let known = digests.withLock({ $0[size] }) { return known }
        let path = NSTemporaryDirectory() + "/dld-origin-\(size)-\(getpid())"
        try Data(TestOrigin.bytes(count: size)).write(to: URL(fileURLWithPath: path))
        defer { unlink(path) }
        let digest = try sha256sum(path)
        digests.withLock { $0[size] = digest }
        return digest
    }
}
