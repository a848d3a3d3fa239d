import DLCore
import DLRPC
import DLTestSupport
import Foundation
import Testing

/// The drop folder (`watch_dir`, issue 30): lists dropped there are enqueued exactly once and
/// moved into `added/`; bad ones land in `failed/` with their reason.
@Suite(.serialized) struct WatchDirTests {
    /// A daemon whose config names `root/drop` as its drop folder (not created: dld makes it).
    static func daemon(extra: String = "") throws -> (DaemonHarness, String) {
        let daemon = try DaemonHarness()
        let folder = daemon.root + "/drop"
        try "watch_dir = \"\(folder)\"\n\(extra)".write(toFile: daemon.root + "/config.toml", atomically: true, encoding: .utf8)
        daemon.extraArguments += ["--config", daemon.root + "/config.toml"]
        return (daemon, folder)
    }

    /// Polls until `path` exists.
    static func waitForFile(_ path: String, timeout: TimeInterval = 30) -> Bool {
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            if FileManager.default.fileExists(atPath: path) { return true }
            usleep(20_000)
        }
        return FileManager.default.fileExists(atPath: path)
    }

    /// Every job of the table (a test's few).
    static func jobs(_ daemon: DaemonHarness) throws -> [JSONValue] {
        try daemon.call("list", ["limit": 1000])["jobs"]?.arrayValue ?? []
    }

    /// A list written in place (in two writes, the file open between them) and one written
    /// elsewhere and renamed in are each enqueued once, whole, and moved into `added/`; a second
    /// list of the same name gets a suffix there; other names stay where they are.
    @Test func listsDroppedWhileRunningAreEnqueuedOnceAndMoved() async throws {
        let (daemon, folder) = try Self.daemon()
        let origin = try await TestOrigin.start()
        do {
            try daemon.start()
            defer { daemon.stop() }
            var info = stat()
            #expect(stat(folder, &info) == 0 && info.st_mode & 0o777 == 0o700, "the folder is made 0700")
            try "not a list".write(toFile: folder + "/notes.md", atomically: false, encoding: .utf8)

            // In place: the first line is written, and the file stays open for a while before
            // the second; a watcher that took it then would enqueue one job, not two.
            // Made in place by open(2) (FileManager writes elsewhere and renames in).
            let fd = open(folder + "/list.txt", O_WRONLY | O_CREAT | O_EXCL, 0o600)
            try #require(fd >= 0)
            let handle = FileHandle(fileDescriptor: fd, closeOnDealloc: true)
            handle.write(Data("\(origin.baseURL)/bytes/3000\n  out=a.bin\n".utf8))
            try handle.synchronize()
            usleep(500_000)
            handle.write(Data("# the second\n\(origin.baseURL)/bytes/4000\n  out=b.bin\n".utf8))
            try handle.close()
            #expect(Self.waitForFile(folder + "/added/list.txt"), "\(daemon.log.suffix(3000))")

            // Elsewhere, then renamed in.
            let elsewhere = daemon.root + "/list2.txt"
            try "\(origin.baseURL)/bytes/5000\n  out=c.bin\n".write(toFile: elsewhere, atomically: false, encoding: .utf8)
            #expect(rename(elsewhere, folder + "/list2.txt") == 0)
            #expect(Self.waitForFile(folder + "/added/list2.txt"), "\(daemon.log.suffix(3000))")

            // The same name again: list-1.txt in added/, the first one kept.
            try "\(origin.baseURL)/bytes/6000\n  out=d.bin\n".write(toFile: elsewhere, atomically: false, encoding: .utf8)
            #expect(rename(elsewhere, folder + "/list.txt") == 0)
            #expect(Self.waitForFile(folder + "/added/list-1.txt"), "\(daemon.log.suffix(3000))")
            #expect(try String(contentsOfFile: folder + "/added/list.txt", encoding: .utf8).contains("out=b.bin"))

            let jobs = try Self.jobs(daemon)
            #expect(jobs.count == 4, "\(jobs.map { $0.serializedString() })")
            #expect(Set(jobs.compactMap { $0["key"]?.stringValue }).count == 4)
            #expect(jobs.allSatisfy { $0["key"]?.stringValue?.hasPrefix("watch:") == true })
            for job in jobs {
                let id = try #require(job["id"]?.int64Value)
                #expect(try daemon.waitForState(id, ["completed", "failed"])["state"] == "completed")
            }
            for (name, count) in [("a.bin", 3000), ("b.bin", 4000), ("c.bin", 5000), ("d.bin", 6000)] {
                try expectOriginBytes(at: daemon.downloadDir + "/" + name, count: count)
            }
            #expect(FileManager.default.fileExists(atPath: folder + "/notes.md"), "other names are left where they are")
            #expect(daemon.log.components(separatedBy: "notes.md is left alone").count == 2, "logged once")
        } catch {
            try? await origin.shutdown()
            throw error
        }
        try await origin.shutdown()
    }

    /// A list dropped while dld is stopped is enqueued when it starts (the sweep); one that is
    /// still open for writing then (swept first: names in order) waits until it is closed.
    @Test func aListDroppedWhileStoppedIsEnqueuedAtStart() async throws {
        let (daemon, folder) = try Self.daemon()
        let origin = try await TestOrigin.start()
        do {
            try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: false)
            try "\(origin.baseURL)/bytes/7000\n  out=early.bin\n".write(toFile: folder + "/early.txt", atomically: false, encoding: .utf8)
            // A FIFO swept first: opening it must not block the folder (nor be taken).
            #expect(mkfifo(folder + "/0fifo.txt", 0o600) == 0)
            let fd = open(folder + "/a-open.txt", O_WRONLY | O_CREAT | O_EXCL, 0o600)
            try #require(fd >= 0)
            let handle = FileHandle(fileDescriptor: fd, closeOnDealloc: true)
            handle.write(Data("\(origin.baseURL)/bytes/8000\n  out=open1.bin\n".utf8))
            try daemon.start()
            defer { daemon.stop() }
            #expect(Self.waitForFile(folder + "/added/early.txt"), "\(daemon.log.suffix(3000))")
            #expect(FileManager.default.fileExists(atPath: folder + "/a-open.txt"), "a file open for writing is not taken")
            #expect(daemon.waitForLog("0fifo.txt is left alone: not a regular file"))
            handle.write(Data("\(origin.baseURL)/bytes/9000\n  out=open2.bin\n".utf8))
            try handle.close()
            #expect(Self.waitForFile(folder + "/added/a-open.txt"), "\(daemon.log.suffix(3000))")
            let jobs = try Self.jobs(daemon)
            #expect(jobs.count == 3, "\(jobs.map { $0.serializedString() })")
            for job in jobs {
                let id = try #require(job["id"]?.int64Value)
                #expect(try daemon.waitForState(id, ["completed", "failed"])["state"] == "completed")
            }
            try expectOriginBytes(at: daemon.downloadDir + "/early.bin", count: 7000)
            try expectOriginBytes(at: daemon.downloadDir + "/open1.bin", count: 8000)
            try expectOriginBytes(at: daemon.downloadDir + "/open2.bin", count: 9000)
        } catch {
            try? await origin.shutdown()
            throw error
        }
        try await origin.shutdown()
    }

    /// A list with a bad line, and one whose folder is outside `allowed_roots` (a check of the
    /// enqueue itself), land in `failed/` with `NAME.error` naming the line; nothing of them is
    /// enqueued; so does a `.meta4` file that is not a Metalink. A symbolic link stays where it
    /// is.
    @Test func badFilesLandInFailedWithTheirReason() async throws {
        let (daemon, folder) = try Self.daemon()
        let origin = try await TestOrigin.start()
        do {
            try daemon.start()
            defer { daemon.stop() }
            try "\(origin.baseURL)/bytes/100\n  out=x.bin\n  colour=blue\n".write(
                toFile: folder + "/bad.txt", atomically: false, encoding: .utf8)
            #expect(Self.waitForFile(folder + "/failed/bad.txt"), "\(daemon.log.suffix(3000))")
            let reason = try String(contentsOfFile: folder + "/failed/bad.txt.error", encoding: .utf8)
            #expect(reason.contains("line 3: unknown option \"colour\""), "\(reason)")

            try "\(origin.baseURL)/bytes/100\n  out=ok.bin\n\(origin.baseURL)/bytes/100\n  dir=/etc\n".write(
                toFile: folder + "/outside.txt", atomically: false, encoding: .utf8)
            #expect(Self.waitForFile(folder + "/failed/outside.txt.error"), "\(daemon.log.suffix(3000))")
            let outside = try String(contentsOfFile: folder + "/failed/outside.txt.error", encoding: .utf8)
            #expect(outside.hasPrefix("outside.txt: line 3: "), "\(outside)")

            // Larger than the 16 MiB a dropped file may have (sparse: nothing is written).
            let big = open(daemon.root + "/big.txt", O_WRONLY | O_CREAT | O_EXCL, 0o600)
            try #require(big >= 0 && ftruncate(big, 17 << 20) == 0)
            close(big)
            #expect(rename(daemon.root + "/big.txt", folder + "/big.txt") == 0)
            #expect(Self.waitForFile(folder + "/failed/big.txt.error"), "\(daemon.log.suffix(3000))")
            let tooBig = try String(contentsOfFile: folder + "/failed/big.txt.error", encoding: .utf8)
            #expect(tooBig.contains("a dropped file may have 16777216 at most"), "\(tooBig)")

            try "<metalink/>".write(toFile: folder + "/later.meta4", atomically: false, encoding: .utf8)
            // A link made elsewhere and moved in (inotify reports no link made in place).
            try FileManager.default.createSymbolicLink(atPath: daemon.root + "/link.txt", withDestinationPath: daemon.root + "/config.toml")
            #expect(rename(daemon.root + "/link.txt", folder + "/link.txt") == 0)
            #expect(Self.waitForFile(folder + "/failed/later.meta4.error"), "\(daemon.log.suffix(3000))")
            let notMetalink = try String(contentsOfFile: folder + "/failed/later.meta4.error", encoding: .utf8)
            #expect(notMetalink.contains("invalid metalink"), "\(notMetalink)")
            #expect(daemon.waitForLog("link.txt is left alone: a symbolic link is not followed"))
            #expect((try? FileManager.default.destinationOfSymbolicLink(atPath: folder + "/link.txt")) != nil)
            #expect(try Self.jobs(daemon).isEmpty, "nothing of a refused list is enqueued")
        } catch {
            try? await origin.shutdown()
            throw error
        }
        try await origin.shutdown()
    }

    /// A `watch_dir` that is a file, not a folder, stops dld at start with that reason.
    @Test func aWatchDirThatIsNotAFolderStopsTheStart() throws {
        let (daemon, folder) = try Self.daemon()
        try "".write(toFile: folder, atomically: false, encoding: .utf8)
        #expect(throws: HarnessError.self) { try daemon.start() }
        #expect(daemon.log.contains("watch_dir: \(folder) is not a folder"), "\(daemon.log.suffix(2000))")
        #expect(!daemon.log.contains("Fatal error"), "a refused start ends dld cleanly: \(daemon.log.suffix(2000))")
    }

    /// dld killed after a list's jobs are committed and before the list is moved (a test hook
    /// holds it there): at the restart the sweep finds the list again and enqueues none of its
    /// lines twice, then moves it.
    @Test func aCrashBetweenEnqueueAndMoveEnqueuesEachLineOnce() async throws {
        let (daemon, folder) = try Self.daemon()
        let origin = try await TestOrigin.start()
        do {
            daemon.extraEnvironment["DLD_TEST_WATCH_HOLD"] = "1"
            try daemon.start()
            let lines = (1...3).map { "\(origin.baseURL)/bytes/\(1000 * $0)\n  out=crash\($0).bin" }
            try (lines.joined(separator: "\n") + "\n").write(toFile: folder + "/crash.txt", atomically: false, encoding: .utf8)
            #expect(daemon.waitForLog("test hook: holding crash.txt between enqueue and move"), "\(daemon.log.suffix(3000))")
            #expect(try Self.jobs(daemon).count == 3)
            daemon.crash()
            #expect(FileManager.default.fileExists(atPath: folder + "/crash.txt"), "the crash came before the move")

            daemon.extraEnvironment["DLD_TEST_WATCH_HOLD"] = nil
            try daemon.start()
            defer { daemon.stop() }
            #expect(Self.waitForFile(folder + "/added/crash.txt"), "\(daemon.log.suffix(3000))")
            #expect(!FileManager.default.fileExists(atPath: folder + "/failed/crash.txt.error"))
            let jobs = try Self.jobs(daemon)
            #expect(jobs.count == 3, "each line once: \(jobs.map { $0.serializedString() })")
            for job in jobs {
                let id = try #require(job["id"]?.int64Value)
                #expect(try daemon.waitForState(id, ["completed", "failed"])["state"] == "completed")
            }
            for n in 1...3 { try expectOriginBytes(at: daemon.downloadDir + "/crash\(n).bin", count: 1000 * n) }
        } catch {
            try? await origin.shutdown()
            throw error
        }
        try await origin.shutdown()
    }

    /// A Metalink of two files dropped, dld killed after its group is committed and before the
    /// file is moved: at the restart the same group is found by its key (none made twice), the
    /// file moves into `added/`, and both files land in the group's folder.
    @Test func aDroppedMetalinkIsOneGroupEvenAcrossACrash() async throws {
        let (daemon, folder) = try Self.daemon()
        let origin = try await TestOrigin.start()
        do {
            daemon.extraEnvironment["DLD_TEST_WATCH_HOLD"] = "1"
            try daemon.start()
            let xml = MetalinkTests.document([
                try MetalinkTests.file("a.bin", size: 3000, urls: [("\(origin.baseURL)/bytes/3000", 1)]),
                try MetalinkTests.file("sub/b.bin", size: 5000, urls: [("\(origin.baseURL)/bytes/5000", 1)]),
            ])
            try xml.write(toFile: folder + "/release.meta4", atomically: false, encoding: .utf8)
            #expect(daemon.waitForLog("test hook: holding release.meta4 between enqueue and move"), "\(daemon.log.suffix(3000))")
            daemon.crash()
            #expect(FileManager.default.fileExists(atPath: folder + "/release.meta4"), "the crash came before the move")

            daemon.extraEnvironment["DLD_TEST_WATCH_HOLD"] = nil
            try daemon.start()
            defer { daemon.stop() }
            #expect(Self.waitForFile(folder + "/added/release.meta4"), "\(daemon.log.suffix(3000))")
            let jobs = try Self.jobs(daemon)
            #expect(jobs.count == 2, "each file once: \(jobs.map { $0.serializedString() })")
            let group = try daemon.call("status", ["group": "release"])
            let members = group["jobs"]?.arrayValue ?? []
            #expect(members.count == 2, "\(group.serializedString())")
            for member in members {
                let id = try #require(member["id"]?.int64Value)
                #expect(try daemon.waitForState(id, ["completed", "failed"])["state"] == "completed")
            }
            let dir = try #require(group["group"]?["dir"]?.stringValue)
            let deadline = Date().addingTimeInterval(60)
            while try daemon.call("status", ["group": "release"])["group"]?["state"] != "completed" && Date() < deadline {
                usleep(50_000)
            }
            try expectOriginBytes(at: dir + "/a.bin", count: 3000)
            try expectOriginBytes(at: dir + "/sub/b.bin", count: 5000)
        } catch {
            try? await origin.shutdown()
            throw error
        }
        try await origin.shutdown()
    }
}
