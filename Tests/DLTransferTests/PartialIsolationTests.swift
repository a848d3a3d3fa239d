import CDLSystem
import DLCore
@testable import DLTransfer
import Foundation
import Testing

/// `PartialFile.isolate` on a real folder (issue 36, items 4 and 9): each attempt at a job on
/// a shared table writes an inode of its own, so that a stale attempt that still holds the old
/// file open writes where no name reaches; and the bytes found under the name are carried over
/// only when they carry the tag of the attempt that committed the offset.
@Suite struct PartialIsolationTests {
    let folder: String

    init() throws {
        folder = NSTemporaryDirectory() + "dld-isolate-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
    }

    /// A file at `path` holding `bytes`, tagged `tag` (none: nil); it stays open for writing,
    /// as a stale attempt's would: its descriptor is returned.
    func partial(_ path: String, _ bytes: [UInt8], tag: String?) throws -> Int32 {
        let fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
        #expect(fd >= 0)
        _ = bytes.withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, 0) }
        if let tag { #expect(dld_set_attempt(fd, tag) == 0, "the test folder keeps no user attributes") }
        return fd
    }

    func contents(_ path: String) throws -> [UInt8] { [UInt8](try Data(contentsOf: URL(fileURLWithPath: path))) }

    /// The committing attempt's file: its bytes are carried into a new inode that carries this
    /// attempt's tag; the stale writer's later bytes land in the old inode only.
    @Test func aStaleWriterNeverReachesTheNewAttemptsFile() throws {
        let path = folder + "/a.bin.part"
        let stale = try partial(path, Array(repeating: 0x41, count: 300_000), tag: "w1/4")
        defer { close(stale) }
        let attempt = PartialAttempt(worker: "w2", epoch: 6, trusted: "w1/4")
        #expect(try PartialFile.isolate(path, for: attempt))
        // The stale attempt goes on writing, and cuts its file back, through what it opened.
        _ = [UInt8](repeating: 0x5A, count: 100_000).withUnsafeBytes { pwrite(stale, $0.baseAddress, $0.count, 100_000) }
        #expect(ftruncate(stale, 50_000) == 0)
        #expect(try contents(path) == Array(repeating: 0x41, count: 300_000))
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        defer { close(fd) }
        #expect(PartialFile.attemptTag(of: fd) == .tag("w2/6"))
        #expect(!FileManager.default.fileExists(atPath: path + ".e6"))
    }

    /// A file that another attempt wrote (a leftover in another machine's folder, an older
    /// attempt's, or one with no tag) is not trusted: this attempt starts with an empty file.
    @Test(arguments: ["w1/3", "w9/4", nil] as [String?])
    func bytesOfAnotherAttemptAreNotTrusted(_ tag: String?) throws {
        let path = folder + "/b.bin.part"
        close(try partial(path, Array(repeating: 0x42, count: 70_000), tag: tag))
        #expect(try !PartialFile.isolate(path, for: PartialAttempt(worker: "w1", epoch: 5, trusted: "w1/4")))
        #expect(try contents(path).isEmpty)
    }

    /// The first attempt (no file yet) makes its file at the name, tagged; a holed file keeps
    /// its holes' places and its length.
    @Test func aFirstAttemptAndAHoledFile() throws {
        let path = folder + "/c.bin.part"
        #expect(try !PartialFile.isolate(path, for: PartialAttempt(worker: "w1", epoch: 1, trusted: nil)))
        let fd = open(path, O_RDWR | O_CLOEXEC)
        #expect(PartialFile.attemptTag(of: fd) == .tag("w1/1"))
        // Ranges of a segmented download: bytes at 0 and at 3 MiB, a hole between, 4 MiB long.
        _ = [UInt8](repeating: 1, count: 1000).withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, 0) }
        _ = [UInt8](repeating: 2, count: 1000).withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, 3 << 20) }
        #expect(ftruncate(fd, 4 << 20) == 0)
        close(fd)
        #expect(try PartialFile.isolate(path, for: PartialAttempt(worker: "w2", epoch: 2, trusted: "w1/1")))
        let bytes = try contents(path)
        #expect(bytes.count == 4 << 20)
        #expect(bytes[0..<1000].allSatisfy { $0 == 1 } && bytes[1000..<(3 << 20)].allSatisfy { $0 == 0 })
        #expect(bytes[(3 << 20)..<((3 << 20) + 1000)].allSatisfy { $0 == 2 })
    }

    /// Where the filesystem keeps no user attributes, only this worker's own bytes are trusted.
    @Test func withoutAttributesOnlyTheSameWorkersBytes() {
        let trusted = PartialAttempt(worker: "w1", epoch: 5, trusted: "w1/4")
        #expect(trusted.trusts(.unsupported))
        #expect(!PartialAttempt(worker: "w2", epoch: 5, trusted: "w1/4").trusts(.unsupported))
        #expect(!PartialAttempt(worker: "w1", epoch: 5, trusted: nil).trusts(.unsupported))
        #expect(!trusted.trusts(.missing))
    }
}
