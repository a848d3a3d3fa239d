import DLRPC
import DLTestSupport
import Foundation
import Synchronization
import Testing

/// What the test does while the power is cut: each workload arms its cut point, then runs.
enum PowerCutWork: String, Sendable, CaseIterable {
    /// One large download, checkpointed every 0.1 s.
    case big
    /// A batch of small files in one folder, published in batches.
    case small
    /// A group whose folder appears whole, in one rename.
    case group
    /// One `enqueue` of 10 000 jobs (paused).
    case enqueue
    /// `pause` of every job of a queue of 2000.
    case pause
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

    var testDescription: String {
        if kinds == "answer" { return "\(work.rawValue): right after the answer" }
        return "\(work.rawValue): \(after ? "after" : "before") \(kinds) #\(count)\(pattern.map { " of *\($0)*" } ?? "")"
    }

    static func at(_ work: PowerCutWork, _ kinds: String, _ pattern: String?, _ counts: [Int], short: Set<Int> = []) -> [CutPoint] {
        counts.flatMap { count in
            [false, true].map { after in
                CutPoint(
                    work: work, kinds: kinds, pattern: pattern, count: count, after: after,
                    short: short.contains(after ? count : -count))
            }
        }
    }

    /// 54 cut points; `short` picks (count, or -count for "before") a few of each workload.
    static let all: [CutPoint] =
        // A big download: its checkpoints' fdatasync, the commits of their offsets, and writes.
        at(.big, "fdatasync", ".part", [1, 3], short: [-1, 3])
        + at(.big, "fdatasync", "jobs.sqlite-wal", [3, 6], short: [6])
        + at(.big, "write", ".part", [40, 200], short: [-200])
        // Small files published in batches: their syncs, renames and folder syncs.
        + at(.small, "fdatasync", ".part", [2, 15], short: [15])
        + at(.small, "rename", "/dl/", [1, 12, 30], short: [1, -12])
        + at(.small, "fsyncdir", "/dl", [1, 4], short: [-1])
        + at(.small, "fdatasync", "jobs.sqlite-wal", [2], short: [])
        // A group: members staged, then the folder renamed into place and its parent synced.
        + at(.group, "rename", "dld-staging", [2, 6], short: [6])
        + at(.group, "rename", "/chapter", [1], short: [-1, 1])
        + at(.group, "fsyncdir", "/dl", [1, 2], short: [])
        // One enqueue of 10 000 jobs: the commit, and the middle of its WAL writes.
        + at(.enqueue, "fdatasync", "jobs.sqlite-wal", [1], short: [-1, 1])
        + at(.enqueue, "write", "jobs.sqlite-wal", [50, 200], short: [])
        // A bulk pause of 2000 jobs.
        + at(.pause, "fdatasync", "jobs.sqlite-wal", [1], short: [1])
        + at(.pause, "write", "jobs.sqlite-wal", [10, 30], short: [-30])
        // The moment a command is answered: what it changed must be durable by then.
        + [PowerCutWork.big, .small, .enqueue, .pause].map {
            CutPoint(work: $0, kinds: "answer", pattern: nil, count: 1, after: true, short: $0 == .enqueue || $0 == .pause)
        }

    /// `DLD_POWERCUT=full` (make crash): every cut point; `DLD_POWERCUT=TEXT`: those whose
    /// description contains TEXT; otherwise the short set.
    static var chosen: [CutPoint] {
        switch ProcessInfo.processInfo.environment["DLD_POWERCUT"] ?? "" {
        case "": return all.filter(\.short)
        case "full": return all
        case let text: return all.filter { $0.testDescription.contains(text) }
        }
    }
}

/// What the harness got an answer for before the cut.
final class Answers: Sendable {
    let state = Mutex<(ids: [Int64], enqueued: Bool, paused: Bool, finished: Bool, error: String?)>(([], false, false, false, nil))
}

/// The power is cut (powercutfs) at chosen points of dld's work, dld is killed at that moment,
/// what was not durable is dropped, the machine "reboots" (a fresh mount, a new boot id) and
/// dld starts again. After each cut: no file is under its final name unless its job is
/// completed with that file's digest; every completed job's file is there with its digest;
/// every answered command is still in effect and no job is lost; the job table passes
/// `PRAGMA integrity_check` and every job resumes or completes.
@Suite(.serialized) struct PowerCutTests {
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

    @Test(arguments: CutPoint.chosen) func powerCut(at point: CutPoint) async throws {
        try await withOrigin { origin in
            let fs = try PowerCutFS(folders: ["state", "dl"])
            try fs.mount()
            defer { try? fs.unmount() }
            let bootFile = fs.root + "/boot_id"
            try UUID().uuidString.lowercased().write(toFile: bootFile, atomically: true, encoding: .utf8)
            let daemon = try DaemonHarness(config: Self.config, dataRoot: fs.mountpoint)
            daemon.extraEnvironment["DLD_TEST_BOOT_ID_FILE"] = bootFile
            try daemon.start()

            // The workload's setup, before the cut point is armed.
            let base = origin.baseURL
            if point.work == .pause {
                let jobs = (0..<2000).map { n -> JSONValue in
                    .object(["url": .string("\(base)/bytes/4096?rate=512&n=\(n)"), "name": .string("p\(n).bin")])
                }
                _ = try daemon.call("enqueue", ["jobs": .array(jobs)])
            }
            if point.kinds != "answer" { try fs.arm(point.kinds, point.pattern, count: point.count, after: point.after) }
            let answers = Answers()
            let work = Task.detached {
                var failure: String? = nil
                do {
                    try Self.run(point.work, daemon: daemon, base: base, answers: answers) {
                        if point.kinds == "answer" { fs.freeze() }
                    }
                } catch {
                    failure = "\(error)"
                }
                answers.state.withLock {
                    $0.finished = true
                    $0.error = failure
                }
            }
            var frozeAt: String? = nil
            var grace = 20
            while frozeAt == nil && grace > 0 {
                frozeAt = try fs.waitFrozen(timeout: 0.1)
                if answers.state.withLock({ $0.finished }) { grace -= 1 }
            }
            // The moment of the cut: dld dies with everything not yet durable.
            if let pid = daemon.pid { kill(pid, SIGKILL) }
            // Cuts before an operation leave unsynced data as zeros in a size kept; cuts after one
            // leave files as they were at their last sync, except that with an odd count every
            // other unsynced write reached the disk anyway: all are what a power cut may leave.
            try fs.cut(zeros: !point.after, some: point.after && point.count % 2 == 1)
            daemon.crash()
            await work.value
            try fs.unmount()
            #expect(
                frozeAt != nil,
                "the cut point was never reached: the workload ended first (\(answers.state.withLock { $0.error } ?? "no error"))")

            // Before dld starts again: the table opens, and no file has its final name early.
            let rows = try Self.offlineRows(fs: fs)
            try Self.expectFinalNamesVerified(fs: fs, rows: rows)
            // Committed offsets survive: an unfinished job's partial file holds its committed bytes
            // (else the download would start over; its name must be as durable as its offsets).
            for row in rows.values where row.received > 0 && !["completed", "canceled"].contains(row.state) {
                let partial = fs.backing + row.path.dropFirst(fs.mountpoint.count) + ".part"
                let length = (try? FileManager.default.attributesOfItem(atPath: partial)[.size] as? Int64) ?? nil
                #expect(
                    (length ?? -1) >= row.received,
                    "job \(row.id) committed \(row.received) bytes, its partial file has \(length.map(String.init) ?? "gone")")
            }
            if ProcessInfo.processInfo.environment["DLD_POWERCUT_LOG"] != nil {
                print("frozen at", frozeAt ?? "-", rows.values.sorted { $0.id < $1.id }.map { "\($0.id) \($0.state) \($0.path)" })
                print(try runProgram("/usr/bin/find", [fs.backing + "/dl", "-ls"]).stdout)
            }

            // The reboot: a fresh mount, a new boot id, dld again.
            try UUID().uuidString.lowercased().write(toFile: bootFile, atomically: true, encoding: .utf8)
            try fs.mount()
            let again = try DaemonHarness(config: Self.config, dataRoot: fs.mountpoint)
            again.extraEnvironment["DLD_TEST_BOOT_ID_FILE"] = bootFile
            try again.start()
            defer { again.stop() }
            try Self.expectAnswersInEffect(point.work, answers: answers, rows: rows, daemon: again)
            try Self.expectEveryJobFinishes(point.work, daemon: again)
            if ProcessInfo.processInfo.environment["DLD_POWERCUT_LOG"] != nil { print(daemon.log, again.log) }
        }
    }

    /// The workload; records each answer it gets.
    static func run(_ work: PowerCutWork, daemon: DaemonHarness, base: String, answers: Answers, answered: () -> Void) throws {
        switch work {
        case .big:
            let id = try daemon.enqueue(["url": .string("\(base)/bytes/\(bigSize)?rate=12000000"), "name": "big.bin"])
            answers.state.withLock { $0.ids.append(id) }
            answered()
            try daemon.waitForState(id, ["completed"], timeout: 60)
        case .small:
            let jobs = (0..<smallCount).map { n -> JSONValue in
                .object(["url": .string("\(base)/bytes/\(smallSize)?n=\(n)"), "name": .string(String(format: "f%02d.bin", n))])
            }
            let result = try daemon.call("enqueue", ["jobs": .array(jobs)])
            let ids = (result["results"]?.arrayValue ?? []).compactMap { $0["id"]?.int64Value }
            answers.state.withLock { $0.ids += ids }
            answered()
            for id in ids { try daemon.waitForState(id, ["completed"], timeout: 60) }
        case .group:
            let jobs = (0..<groupCount).map { n -> JSONValue in
                .object(["url": .string("\(base)/bytes/\(groupSize)?n=\(n)"), "name": .string("page\(n).bin")])
            }
            let result = try daemon.call(
                "enqueue",
                [
                    "group": ["name": "chapter", "dir": .string(daemon.downloadDir + "/chapter")], "jobs": .array(jobs),
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
        }
    }

    /// One row of the job table, read with sqlite3 from the backing folder (a copy).
    struct Row {
        var id: Int64
        var state: String
        var path: String
        var sha256: String?
        var received: Int64
    }

    /// Copies the job table out of the backing folder, checks its integrity and reads its rows.
    static func offlineRows(fs: PowerCutFS) throws -> [Int64: Row] {
        let copy = fs.root + "/copy"
        try? FileManager.default.removeItem(atPath: copy)
        try FileManager.default.createDirectory(atPath: copy, withIntermediateDirectories: true)
        for suffix in ["", "-wal"] {
            let source = fs.backing + "/state/jobs.sqlite" + suffix
            if FileManager.default.fileExists(atPath: source) {
                try FileManager.default.copyItem(atPath: source, toPath: copy + "/jobs.sqlite" + suffix)
            }
        }
        guard FileManager.default.fileExists(atPath: copy + "/jobs.sqlite") else { return [:] }
        let check = try runProgram("/usr/bin/sqlite3", [copy + "/jobs.sqlite", "PRAGMA integrity_check;"])
        #expect(check.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "ok", "integrity_check: \(check.stdout) \(check.stderr)")
        let listed = try runProgram(
            "/usr/bin/sqlite3",
            [
                "-separator", "\t", copy + "/jobs.sqlite",
                "SELECT id, state, path, coalesce(sha256, ''), received FROM jobs;",
            ])
        #expect(listed.status == 0, "\(listed.stderr)")
        var rows: [Int64: Row] = [:]
        for line in listed.stdout.split(separator: "\n") {
            let fields = line.split(separator: "\t", omittingEmptySubsequences: false).map(String.init)
            guard fields.count == 5, let id = Int64(fields[0]) else { continue }
            rows[id] = Row(
                id: id, state: fields[1], path: fields[2], sha256: fields[3].isEmpty ? nil : fields[3], received: Int64(fields[4]) ?? 0)
        }
        return rows
    }

    /// No file is under its final name unless its job is completed with that file's digest.
    static func expectFinalNamesVerified(fs: PowerCutFS, rows: [Int64: Row]) throws {
        let byPath = Dictionary(rows.values.map { ($0.path, $0) }, uniquingKeysWith: { first, _ in first })
        let root = fs.backing + "/dl"
        guard let walker = FileManager.default.enumerator(atPath: root) else { return }
        while let relative = walker.nextObject() as? String {
            let full = root + "/" + relative
            var isDir: ObjCBool = false
            guard FileManager.default.fileExists(atPath: full, isDirectory: &isDir), !isDir.boolValue else { continue }
            if relative.hasSuffix(".part") || relative.contains(".dld-staging-") { continue }
            let row = byPath[fs.mountpoint + "/dl/" + relative]
            #expect(
                row?.state == "completed",
                "\(relative) is under its final name, its job is \(row.map { "\($0.id) \($0.state)" } ?? "unknown")")
            if let row, row.state == "completed" {
                #expect(row.sha256 == (try sha256sum(full)), "\(relative) under its final name does not match its job's digest")
            }
        }
    }

    /// Every command answered before the cut is in effect, and no job is lost.
    static func expectAnswersInEffect(_ work: PowerCutWork, answers: Answers, rows: [Int64: Row], daemon: DaemonHarness) throws {
        let answered = answers.state.withLock { $0 }
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
        case .pause:
            #expect(ids.count == 2000)
            let paused = jobs.filter { $0["state"] == "paused" }.count
            let unfinished = jobs.filter { $0["state"] != "completed" }.count
            if answered.paused {
                #expect(paused == unfinished, "pause was answered; \(paused) of \(unfinished) unfinished jobs are paused")
            } else {
                #expect(paused == 0 || paused == unfinished, "a pause is one transaction: \(paused) of \(unfinished) paused")
            }
        default:
            break
        }
    }

    /// Every job resumes or completes; every completed job's file is there with its digest.
    static func expectEveryJobFinishes(_ work: PowerCutWork, daemon: DaemonHarness) throws {
        switch work {
        case .enqueue, .pause:
            // Thousands of jobs: each resumes (queued again), checked by state.
            _ = try daemon.call("resume", ["all": true])
            let jobs = try allJobs(daemon)
            let stuck = jobs.filter { !["queued", "running", "completed"].contains($0["state"]?.stringValue ?? "") }
            #expect(stuck.isEmpty, "jobs that did not resume: \(stuck.prefix(3).map { $0.serializedString() })")
        case .big, .small, .group:
            let jobs = try allJobs(daemon)
            for job in jobs {
                guard let id = job["id"]?.int64Value else { continue }
                try daemon.waitForState(id, ["completed", "failed"], timeout: 60)
            }
            // A group's completed members are in its folder once the group is published.
            if work == .group {
                let deadline = Date().addingTimeInterval(60)
                var group = try daemon.call("status", ["group": "chapter"])
                while group["group"]?["state"] != "completed" && group["group"]?["state"] != "failed" && Date() < deadline {
                    usleep(20_000)
                    group = try daemon.call("status", ["group": "chapter"])
                }
                #expect(group["group"]?["state"] == "completed", "\(group.serializedString())")
            }
            for job in jobs {
                guard let id = job["id"]?.int64Value else { continue }
                let done = try daemon.waitForState(id, ["completed", "failed"], timeout: 60)
                #expect(done["state"] == "completed", "\(done.serializedString())")
                guard let path = done["path"]?.stringValue else { continue }
                #expect(FileManager.default.fileExists(atPath: path), "\(path) of completed job \(id) is missing")
                let size = work == .big ? bigSize : work == .small ? smallSize : groupSize
                #expect(done["sha256"]?.stringValue == (try originDigest(size)), "job \(id)'s recorded digest")
                if FileManager.default.fileExists(atPath: path) {
                    #expect((try sha256sum(path)) == (try originDigest(size)), "\(path) does not hold the origin's bytes")
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
