import DLCore
import Testing

/// The drop folder's pure rules: which names it takes, the job key of a line, and the names a
/// file takes in `added/` and `failed/`.
struct DropFolderTests {
    /// `.txt` and `.meta4` (any case) are taken; hidden names, other suffixes and a bare suffix are not.
    @Test func kinds() {
        #expect(DropFolderRules.kind(of: "list.txt") == .inputList)
        #expect(DropFolderRules.kind(of: "LIST.TXT") == .inputList)
        #expect(DropFolderRules.kind(of: "ubuntu.meta4") == .metalink)
        for name in [".list.txt", "list.txt.part", "notes.md", ".txt", "txt", "a/b.txt"] {
            #expect(DropFolderRules.kind(of: name) == nil, "\(name)")
        }
    }

    /// The key names the file (device, inode, mtime), its content and the line; any of them
    /// changing gives another key, and the same inputs give the same key.
    @Test func keys() {
        let key = DropFolderRules.key(device: 2049, inode: 77, mtimeNanoseconds: 1_700_000_000_123_456_789, sha256: "ab12", line: 4)
        #expect(key == "watch:2049:77:1700000000123456789:ab12:4")
        #expect(key == DropFolderRules.key(device: 2049, inode: 77, mtimeNanoseconds: 1_700_000_000_123_456_789, sha256: "ab12", line: 4))
        let others = [
            DropFolderRules.key(device: 2050, inode: 77, mtimeNanoseconds: 1_700_000_000_123_456_789, sha256: "ab12", line: 4),
            DropFolderRules.key(device: 2049, inode: 78, mtimeNanoseconds: 1_700_000_000_123_456_789, sha256: "ab12", line: 4),
            DropFolderRules.key(device: 2049, inode: 77, mtimeNanoseconds: 1_700_000_000_123_456_780, sha256: "ab12", line: 4),
            DropFolderRules.key(device: 2049, inode: 77, mtimeNanoseconds: 1_700_000_000_123_456_789, sha256: "ab13", line: 4),
            DropFolderRules.key(device: 2049, inode: 77, mtimeNanoseconds: 1_700_000_000_123_456_789, sha256: "ab12", line: 5),
        ]
        #expect(Set(others + [key]).count == 6)
        // Within the protocol's 1…1024 bytes for a key, with the largest values.
        let longest = DropFolderRules.key(
            device: .max, inode: .max, mtimeNanoseconds: .max, sha256: String(repeating: "f", count: 64), line: .max)
        #expect(longest.utf8.count <= 1024)
    }

    /// The name itself, then a number before the last suffix; a name without a suffix (or a
    /// hidden one) gets it at the end.
    @Test func namesInAddedAndFailed() {
        #expect(DropFolderRules.candidate("list.txt", attempt: 0) == "list.txt")
        #expect(DropFolderRules.candidate("list.txt", attempt: 1) == "list-1.txt")
        #expect(DropFolderRules.candidate("my.list.txt", attempt: 12) == "my.list-12.txt")
        #expect(DropFolderRules.candidate("README", attempt: 2) == "README-2")
        #expect(DropFolderRules.candidate(".txt", attempt: 1) == ".txt-1")
        #expect(DropFolderRules.errorFileName("list-1.txt") == "list-1.txt.error")
        let names = (0..<50).map { DropFolderRules.candidate("a.txt", attempt: $0) }
        #expect(Set(names).count == 50, "each attempt a new name")
    }

    /// An enqueue error about one job of the call gives its index and the rest of the message.
    @Test func jobIndexOfAnEnqueueError() {
        let found = DropFolderRules.jobIndex(inMessage: "jobs[3]: path is outside allowed_roots")
        #expect(found?.index == 3 && found?.rest == "path is outside allowed_roots")
        #expect(DropFolderRules.jobIndex(inMessage: "queue is full") == nil)
        #expect(DropFolderRules.jobIndex(inMessage: "jobs[x]: no") == nil)
        #expect(DropFolderRules.jobIndex(inMessage: "jobs[-1]: no") == nil)
    }
}
