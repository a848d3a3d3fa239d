import DLRPC
import DLTestSupport
import Foundation
import Testing

/// A dld on a powercutfs mount, with one file completed before the fault, to show that a
/// fault never touches what is already completed.
struct FaultyDisk {
    let fs: PowerCutFS
    let bootFile: String
    var daemon: DaemonHarness
    let keptID: Int64
    let keptPath: String

    static let keptSize = 64 << 10

    init(origin: TestOrigin) throws {
        fs = try PowerCutFS(folders: ["state", "dl"])
        try fs.mount()
        bootFile = fs.root + "/boot_id"
        try UUID().uuidString.lowercased().write(toFile: bootFile, atomically: true, encoding: .utf8)
        daemon = try DaemonHarness(config: PowerCutTests.config, dataRoot: fs.mountpoint)
        daemon.extraEnvironment["DLD_TEST_BOOT_ID_FILE"] = bootFile
        try daemon.start()
        keptID = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/\(Self.keptSize)"), "name": "kept.bin"])
        let kept = try daemon.waitForState(keptID, ["completed", "failed"])
        keptPath = try #require(kept["path"]?.stringValue)
        #expect(kept["state"] == "completed")
    }

    /// dld answers, and the completed file is as it was.
    func expectAliveAndKeptIntact() throws {
        let kept = try daemon.job(keptID)
        #expect(kept["state"] == "completed")
        #expect((try sha256sum(keptPath)) == (try PowerCutTests.originDigest(Self.keptSize)))
    }

    /// The job stops in `state` with `code`, and a message that names `reason`.
    func expectStopped(_ id: Int64, _ state: String, code: String, reason: String? = nil) throws {
        let stopped = try daemon.waitForState(id, ["failed", "waiting", "completed"])
        #expect(stopped["state"]?.stringValue == state, "\(stopped.serializedString())")
        #expect(stopped["error"]?["code"]?.stringValue == code, "\(stopped.serializedString())")
        if let reason { #expect(stopped["error"]?["message"]?.stringValue?.contains(reason) == true, "\(stopped.serializedString())") }
        if state == "waiting" { #expect(stopped["wait_reason"] == "disk_space") }
    }

    /// After the fault: dld answers and the completed file is intact; once the fault clears, a
    /// resume of `resumed` (all of `jobs` if nil) completes `jobs` (id: size), and a power cut
    /// leaves every completed file whole.
    mutating func recovers(_ jobs: [Int64: Int], resumed: [Int64]? = nil) throws {
        try expectAliveAndKeptIntact()
        try fs.clearFailures()
        _ = try daemon.call("resume", ["ids": .array((resumed ?? Array(jobs.keys)).map { .int($0) })])
        for id in jobs.keys {
            let done = try daemon.waitForState(id, ["completed", "failed"])
            #expect(done["state"] == "completed", "\(done.serializedString())")
        }
        try cutAndCheck(sizes: jobs)
    }

    /// The file as the disk holds it (the backing folder), whatever the page cache shows.
    func onDisk(_ path: String) -> String {
        fs.backing + path.dropFirst(fs.mountpoint.count)
    }

    /// Ends with a power cut and a reboot: every completed job's file is there with its digest.
    private mutating func cutAndCheck(sizes: [Int64: Int]) throws {
        if let pid = daemon.pid { kill(pid, SIGKILL) }
        try fs.cut()
        daemon.crash()
        try fs.unmount()
        let rows = try PowerCutTests.offlineRows(fs: fs)
        try PowerCutTests.expectFinalNamesVerified(fs: fs, rows: rows)
        try UUID().uuidString.lowercased().write(toFile: bootFile, atomically: true, encoding: .utf8)
        try fs.mount()
        daemon = try DaemonHarness(config: PowerCutTests.config, dataRoot: fs.mountpoint)
        daemon.extraEnvironment["DLD_TEST_BOOT_ID_FILE"] = bootFile
        try daemon.start()
        for (id, size) in sizes.merging([keptID: Self.keptSize], uniquingKeysWith: { a, _ in a }) {
            let job = try daemon.waitForState(id, ["completed", "failed"])
            #expect(job["state"] == "completed", "\(job.serializedString())")
            let path = try #require(job["path"]?.stringValue)
            #expect(job["sha256"]?.stringValue == (try PowerCutTests.originDigest(size)), "job \(id)'s recorded digest")
            #expect((try sha256sum(onDisk(path))) == (try PowerCutTests.originDigest(size)), "\(path) on disk")
        }
        daemon.stop()
        try fs.unmount()
    }
}

/// The disk fails under dld (powercutfs injects the errors): EIO on write and on fsync, a full
/// disk, a folder that becomes read-only. dld keeps running, the job waits or fails with a
/// code that says what happened, what is completed is untouched, and a failed fsync is never
/// retried as if its data were safe (fsyncgate): the job goes back to its last committed offset.
@Suite(.serialized) struct DiskFaultTests {
    static let size = PowerCutTests.bigSize

    func startBig(_ disk: FaultyDisk, origin: TestOrigin) throws -> Int64 {
        let id = try disk.daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/\(Self.size)?rate=12000000"), "name": "big.bin"])
        // Some bytes are committed before the fault.
        try disk.daemon.waitForJob(id) {
            ($0["received"]?.int64Value ?? 0) > 4_000_000 || $0["state"] != "running" && $0["state"] != "queued"
        }
        return id
    }

    /// A big download meets the fault (`kinds` of its `.part` fail with `code`, `count` times,
    /// 0: until cleared), stops in `state` with `error`, and recovers.
    func bigDownloadMeets(_ kinds: String, errno code: Int32, count: Int = 0, stops state: String, error: String, reason: String? = nil)
        async throws
    {
        try await withOrigin { origin in
            var disk = try FaultyDisk(origin: origin)
            let id = try startBig(disk, origin: origin)
            try disk.fs.fail(kinds, ".part", errno: code, count: count)
            try disk.expectStopped(id, state, code: error, reason: reason)
            // The digests, recorded and on disk, are checked after a cut.
            try disk.recovers([id: Self.size])
        }
    }

    /// A checkpoint's fdatasync fails once (the writeback of its bytes failed): the next one
    /// would succeed, but the bytes are gone from the disk. The job must not count them: it stops
    /// with file_error, keeps its last committed offset, and a resume fetches the rest again.
    @Test func failedFsyncIsNotRetried() async throws {
        try await bigDownloadMeets("fdatasync", errno: EIO, count: 1, stops: "failed", error: "file_error", reason: "Input/output error")
    }

    /// EIO on write: the job fails with file_error naming the error; a resume after the fault
    /// completes it.
    @Test func failedWriteFailsTheJob() async throws {
        try await bigDownloadMeets("write", errno: EIO, stops: "failed", error: "file_error", reason: "Input/output error")
    }

    /// ENOSPC on write: the job waits (disk_space) with disk_full, and completes once there is room.
    @Test func fullDiskWaits() async throws {
        try await bigDownloadMeets("write,fallocate", errno: ENOSPC, stops: "waiting", error: "disk_full")
    }

    /// The download folder becomes read-only (EROFS on every change in it): new jobs and the
    /// running one fail with file_error naming it; the completed file is untouched; once the
    /// folder is writable again, resumed jobs complete.
    @Test func readOnlyFolder() async throws {
        try await withOrigin { origin in
            var disk = try FaultyDisk(origin: origin)
            let id = try startBig(disk, origin: origin)
            try disk.fs.fail("create,mkdir,unlink,rmdir,rename,link,symlink,write,truncate,fallocate,fsyncdir", "/dl/", errno: EROFS)
            try disk.fs.fail("fsync,fdatasync", "/dl/", errno: EROFS)
            let small = try disk.daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/4096?n=ro"), "name": "small.bin"])
            for job in [id, small] { try disk.expectStopped(job, "failed", code: "file_error", reason: "Read-only file system") }
            try disk.recovers([id: Self.size, small: 4096])
        }
    }

    /// A finished file's sync fails at publish: that job is not completed (file_error, its
    /// last committed offset kept); the others are; a resume completes it.
    @Test func failedPublishSync() async throws {
        try await withOrigin { origin in
            var disk = try FaultyDisk(origin: origin)
            try disk.fs.fail("fdatasync", "f03.bin.part", errno: EIO, count: 1)
            let jobs = (0..<8).map { n -> JSONValue in
                .object([
                    "url": .string("\(origin.baseURL)/bytes/\(PowerCutTests.smallSize)?n=\(n)"),
                    "name": .string(String(format: "f%02d.bin", n)),
                ])
            }
            let result = try disk.daemon.call("enqueue", ["jobs": .array(jobs)])
            let ids = (result["results"]?.arrayValue ?? []).compactMap { $0["id"]?.int64Value }
            try #require(ids.count == 8)
            var failed: [Int64] = []
            for id in ids {
                let job = try disk.daemon.waitForState(id, ["completed", "failed"])
                if job["state"] == "failed" {
                    failed.append(id)
                    #expect(job["error"]?["code"] == "file_error", "\(job.serializedString())")
                    #expect(FileManager.default.fileExists(atPath: try #require(job["path"]?.stringValue)) == false)
                }
            }
            #expect(failed == [ids[3]])
            try disk.recovers(Dictionary(uniqueKeysWithValues: ids.map { ($0, PowerCutTests.smallSize) }), resumed: failed)
        }
    }
}
