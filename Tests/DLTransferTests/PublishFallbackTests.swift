import DLCore
@testable import DLTransfer
import Foundation
import Synchronization
import Testing

/// `PartialFile.link` on filesystems without `renameat2(RENAME_NOREPLACE)` (it fails with
/// EINVAL: some FUSE and network filesystems, old kernels), and without hard links either
/// (EPERM: vfat, some FUSE): the file still lands under its final name, and a file already
/// there is still never replaced. The failing calls are handed in (`LinkCalls`); the rest are
/// the system's, on a real folder.
@Suite struct PublishFallbackTests {
    final class Calls: Sendable {
        let renames = Atomic<Int>(0)
        let links = Atomic<Int>(0)
        /// renameat2 unsupported; `link` as given (nil: the system's).
        func calls(linkErrno: Int32?) -> PartialFile.LinkCalls {
            PartialFile.LinkCalls(
                renameNoReplace: { _, _ in
                    self.renames.add(1, ordering: .relaxed)
                    errno = EINVAL
                    return -1
                },
                hardLink: { from, to in
                    self.links.add(1, ordering: .relaxed)
                    guard let linkErrno else { return Glibc.link(from, to) }
                    errno = linkErrno
                    return -1
                })
        }
    }

    /// A fresh folder holding `f.part` ("bytes"), for `body`; removed after it.
    private func withPartialFile(_ body: (String) throws -> Void) throws {
        let dir = NSTemporaryDirectory() + "dld-publish-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        try "bytes".write(toFile: dir + "/f.part", atomically: false, encoding: .utf8)
        try body(dir)
    }

    private func contents(_ path: String) -> String? {
        try? String(contentsOfFile: path, encoding: .utf8)
    }

    /// Without RENAME_NOREPLACE (then, too, without hard links): published, and the partial
    /// file is gone.
    @Test(arguments: [nil, EPERM, EOPNOTSUPP] as [Int32?])
    func fallbackPublishes(linkErrno: Int32?) throws {
        try withPartialFile { dir in
            let calls = Calls()
            try PartialFile.link(dir + "/f.part", to: dir + "/f", overwrite: false, calls: calls.calls(linkErrno: linkErrno))
            #expect(contents(dir + "/f") == "bytes")
            #expect(!FileManager.default.fileExists(atPath: dir + "/f.part"))
            #expect(calls.renames.load(ordering: .relaxed) == 1 && calls.links.load(ordering: .relaxed) == 1, "the fallback was taken")
        }
    }

    /// A file at the final name is never replaced, by either fallback: `destination_exists`,
    /// and the download stays in its partial file.
    @Test(arguments: [nil, EPERM, EOPNOTSUPP] as [Int32?])
    func fallbackNeverReplaces(linkErrno: Int32?) throws {
        try withPartialFile { dir in
            let calls = Calls()
            try "mine".write(toFile: dir + "/f", atomically: false, encoding: .utf8)
            do throws(TransferFailure) {
                try PartialFile.link(dir + "/f.part", to: dir + "/f", overwrite: false, calls: calls.calls(linkErrno: linkErrno))
                Issue.record("a file at the final name was replaced")
            } catch {
                #expect(error.error.code == "destination_exists", "\(error)")
            }
            #expect(contents(dir + "/f") == "mine")
            #expect(contents(dir + "/f.part") == "bytes")
            #expect(calls.links.load(ordering: .relaxed) == 1, "the fallback was taken")
        }
    }

    /// Another failure of `link` is a file error that names the final path, and nothing moves.
    @Test func otherLinkFailureIsAFileError() throws {
        try withPartialFile { dir in
            do throws(TransferFailure) {
                try PartialFile.link(dir + "/f.part", to: dir + "/f", overwrite: false, calls: Calls().calls(linkErrno: EIO))
                Issue.record("published although link failed")
            } catch {
                #expect(error.error.code == "file_error" && error.error.message.contains(dir + "/f"), "\(error)")
            }
            #expect(!FileManager.default.fileExists(atPath: dir + "/f"))
            #expect(contents(dir + "/f.part") == "bytes")
        }
    }
}
