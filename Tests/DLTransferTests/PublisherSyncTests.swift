import CDLSystem
@testable import DLTransfer
import Foundation
import Synchronization
import Testing

/// How a batch of finished files is made durable: one `syncfs` per filesystem while little is
/// unwritten, else (and for every file `syncfs` cannot vouch for) `fdatasync` of each.
@Suite struct PublisherSyncTests {
    /// Two folders with files in them, under a fresh folder of the temporary directory.
    private func files(_ count: Int) throws -> (root: String, paths: [String]) {
        let root = NSTemporaryDirectory() + "dld-sync-\(UUID().uuidString)"
        var paths: [String] = []
        for folder in ["a", "b"] {
            try FileManager.default.createDirectory(atPath: root + "/" + folder, withIntermediateDirectories: true)
            for n in 0..<count {
                let path = "\(root)/\(folder)/f\(n).part"
                try Data(repeating: UInt8(n & 0xFF), count: 4096).write(to: URL(fileURLWithPath: path))
                paths.append(path)
            }
        }
        return (root, paths)
    }

    @Test func unwrittenBytesAreDirtyPlusWriteback() {
        let meminfo = "MemTotal:        8000000 kB\nDirty:              5448 kB\nWriteback:            12 kB\nAnonPages: 1 kB\n"
        #expect(Publisher.unwrittenBytes(meminfo: meminfo) == Int64(5460 * 1024))
        // Either line missing, or not in kB: unknown, and no syncfs.
        #expect(Publisher.unwrittenBytes(meminfo: "Dirty: 5 kB\n") == nil)
        #expect(Publisher.unwrittenBytes(meminfo: "Dirty: 5 MB\nWriteback: 0 kB\n") == nil)
        #expect(Publisher.unwrittenBytes(meminfo: "") == nil)
        // The real file parses on Linux.
        #expect(Publisher.unwrittenBytes() != nil)
    }

    @Test func wholeFilesystemOnlyForBatchesWhileLittleIsUnwritten() {
        let limit = Publisher.wholeFilesystemUnwrittenLimit
        #expect(!Publisher.wholeFilesystem(files: 1, unwritten: 0))
        #expect(Publisher.wholeFilesystem(files: 2, unwritten: 0))
        #expect(Publisher.wholeFilesystem(files: 500, unwritten: limit))
        #expect(!Publisher.wholeFilesystem(files: 500, unwritten: limit + 1))
        #expect(!Publisher.wholeFilesystem(files: 500, unwritten: nil))
        // A kernel whose syncfs does not report writeback errors: never.
        #expect(!Publisher.wholeFilesystem(files: 500, unwritten: 0, kernelReportsErrors: false))
    }

    @Test func aSlowSyncfsTurnsItOffForAMinute() {
        let start = ContinuousClock.now
        var gate = Publisher.SlowSyncfs()
        #expect(gate.allows(at: start))
        gate.record(.milliseconds(40), at: start)
        #expect(gate.allows(at: start + .milliseconds(1)))
        gate.record(.milliseconds(900), at: start + .seconds(1))
        #expect(!gate.allows(at: start + .seconds(2)))
        #expect(!gate.allows(at: start + .seconds(60)))
        #expect(gate.allows(at: start + .seconds(61)))
    }

    @Test func syncfsIsTrustedFromLinux5_8() {
        #expect(Publisher.kernel("6.1.0-18-amd64", isAtLeast: (5, 8)))
        #expect(Publisher.kernel("5.8.0", isAtLeast: (5, 8)))
        #expect(Publisher.kernel("5.10.209-1", isAtLeast: (5, 8)))
        #expect(!Publisher.kernel("5.4.0-150-generic", isAtLeast: (5, 8)))
        #expect(!Publisher.kernel("4.19.0", isAtLeast: (5, 8)))
        #expect(!Publisher.kernel("", isAtLeast: (5, 8)))
        #expect(!Publisher.kernel("linux", isAtLeast: (5, 8)))
    }

    @Test func oneSyncPerFilesystem() throws {
        let (root, paths) = try files(3)
        defer { try? FileManager.default.removeItem(atPath: root) }
        let calls = Mutex(0)
        let checked = Mutex<[String]>([])
        let outcome = Publisher.syncFilesystems(
            of: paths, type: { _ in 0xEF53 },
            sync: { fd in
                calls.withLock { $0 += 1 }
                usleep(30_000)
                return fsync(fd)
            },
            writtenBack: { path in
                checked.withLock { $0.append(path) }
                return dld_written_back(path)
            })
        #expect(outcome.rest.isEmpty)
        #expect(outcome.failures.isEmpty)
        // Both folders are on one filesystem: one sync for the six files, then each file's
        // own writeback is checked.
        #expect(calls.withLock { $0 } == 1)
        #expect(Set(checked.withLock { $0 }) == Set(paths))
        // How long the sync took, for `SlowSyncfs` (at least the 30 ms it slept).
        #expect(outcome.longestSync >= .milliseconds(30))
    }

    @Test func aFileWhoseWritebackFailedIsAFailure() throws {
        let (root, paths) = try files(2)
        defer { try? FileManager.default.removeItem(atPath: root) }
        // syncfs said nothing (another program saw the filesystem's error first); the file's
        // own check did.
        let outcome = Publisher.syncFilesystems(
            of: paths, type: { _ in 0xEF53 }, sync: { _ in 0 },
            writtenBack: { $0 == paths[1] ? EIO : 0 })
        #expect(outcome.rest.isEmpty)
        #expect(Set(outcome.failures.keys) == [paths[1]])
        #expect(outcome.failures[paths[1]]?.error.code == "file_error")
        #expect(outcome.failures[paths[1]]?.error.message.contains(paths[1]) == true)
    }

    @Test func filesSyncfsCannotVouchForAreLeftToFdatasync() throws {
        let (root, paths) = try files(2)
        defer { try? FileManager.default.removeItem(atPath: root) }
        // A sync that reports an error: every file of that filesystem is left over, unchecked
        // (its own fdatasync sees its own error).
        let checked = Mutex(0)
        let failed = Publisher.syncFilesystems(
            of: paths, type: { _ in 0xEF53 }, sync: { _ in -1 },
            writtenBack: { _ in
                checked.withLock { $0 += 1 }
                return 0
            })
        #expect(Set(failed.rest) == Set(paths))
        #expect(failed.failures.isEmpty)
        #expect(checked.withLock { $0 } == 0)
        // A filesystem whose syncfs is not trusted (here, NFS): not synced at all.
        let calls = Mutex(0)
        let nfs = Publisher.syncFilesystems(
            of: paths, type: { _ in 0x6969 },
            sync: { _ in
                calls.withLock { $0 += 1 }
                return 0
            })
        #expect(Set(nfs.rest) == Set(paths))
        #expect(calls.withLock { $0 } == 0)
        // A file that is not there, in a folder that is or is not, and a symbolic link.
        let goneFolder = root + "/gone/f.part"
        let goneFile = root + "/a/gone.part"
        let link = root + "/b/link.part"
        try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: paths[0])
        let left = Publisher.syncFilesystems(of: [goneFolder] + paths + [goneFile, link], type: { _ in 0xEF53 }, sync: { _ in 0 })
        #expect(Set(left.rest) == [goneFolder, goneFile, link])
        #expect(left.failures.isEmpty)
    }

    @Test func syncAllReportsOnlyTheFilesThatFail() async throws {
        let (root, paths) = try files(4)
        defer { try? FileManager.default.removeItem(atPath: root) }
        let gone = root + "/a/gone.part"
        let failures = await Publisher.syncAll(paths + [gone])
        #expect(Set(failures.keys) == [gone])
        #expect(failures[gone]?.error.message.contains(gone) == true)
        // One file alone is synced with fdatasync.
        #expect(await Publisher.syncAll([paths[0]]).isEmpty)
        #expect(await Publisher.syncAll([]).isEmpty)
    }
}
