@testable import DLDaemon
@testable import DLEngine
import DLCore
import DLTestSupport
import Foundation
import Testing

/// Where a job's file goes, against a real folder: the answers must not depend on whether the
/// folder was listed once (large requests) or asked name by name with `lstat` (small ones).
@Suite struct DestinationTests {
    private func folder() throws -> String {
        let root = FileManager.default.temporaryDirectory.appendingPathComponent("dld-dest-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true)
        return Destination.realPath(root) ?? root
    }

    @Test func listedFolderAnswersAsLstat() throws {
        let root = try folder()
        defer { try? FileManager.default.removeItem(atPath: root) }
        for name in ["a.bin", "b.bin.part", "c.bin", "c.bin.part", FileNames.numbered("c.bin", 2)] {
            _ = FileManager.default.createFile(atPath: root + "/" + name, contents: Data("x".utf8))
        }
        try FileManager.default.createDirectory(atPath: root + "/d.bin", withIntermediateDirectories: false)
        try FileManager.default.createSymbolicLink(atPath: root + "/e.bin", withDestinationPath: "/nonexistent")
        let names = ["a.bin", "b.bin", "c.bin", "d.bin", "e.bin", "f.bin"]
        for onExists in [ExistingFilePolicy.error, .rename] {
            for overwrite in [false, true] {
                let one = Destination(downloadDir: root, policy: nil, jobs: 1)
                let many = Destination(downloadDir: root, policy: nil, jobs: Destination.Listing.minimumJobs)
                for name in names {
                    let answer = { (destination: Destination) -> String in
                        do throws(DLError) {
                            return try destination.resolve(
                                url: "http://h/x", path: nil, dir: root, name: name, overwrite: overwrite, onExists: onExists
                            ).path
                        } catch {
                            return "\(error.code)"
                        }
                    }
                    let expected = answer(one)
                    #expect(answer(many) == expected, "\(name) overwrite \(overwrite) \(onExists)")
                }
            }
        }
        // What the answers are, so that both sides being wrong the same way shows too.
        let many = Destination(downloadDir: root, policy: nil, jobs: 100)
        #expect(
            try many.resolve(url: "http://h/x", path: nil, dir: root, name: "f.bin", overwrite: false, onExists: .error).path == root
                + "/f.bin")
        #expect(throws: DLError.self) {
            try many.resolve(url: "http://h/x", path: nil, dir: root, name: "a.bin", overwrite: false, onExists: .error)
        }
        #expect(throws: DLError.self) {
            try many.resolve(url: "http://h/x", path: nil, dir: root, name: "b.bin", overwrite: true, onExists: .error)
        }
        #expect(throws: DLError.self) {
            try many.resolve(url: "http://h/x", path: nil, dir: root, name: "d.bin", overwrite: true, onExists: .rename)
        }
        #expect(
            try many.resolve(url: "http://h/x", path: nil, dir: root, name: "a.bin", overwrite: true, onExists: .error).path == root
                + "/a.bin")
        #expect(
            try many.resolve(url: "http://h/x", path: nil, dir: root, name: "c.bin", overwrite: false, onExists: .rename).path == root + "/"
                + FileNames.numbered("c.bin", 3))
        #expect(
            try many.resolve(url: "http://h/x", path: nil, dir: root, name: "e.bin", overwrite: false, onExists: .rename).path == root + "/"
                + FileNames.numbered("e.bin", 2))
    }

    /// A folder with more names than the limit is not listed; its names are asked one by one.
    @Test func largeFolderIsNotListed() throws {
        let root = try folder()
        defer { try? FileManager.default.removeItem(atPath: root) }
        for i in 0..<20 { _ = FileManager.default.createFile(atPath: root + "/n\(i)", contents: nil) }
        #expect(Destination.Listing(folder: root, limit: 10) == nil)
        let listing = try #require(Destination.Listing(folder: root, limit: 100))
        #expect(listing.entries["n7"] == .some(.some(false)))
        #expect(Destination.Listing(folder: root + "/missing", limit: 100) == nil)
    }

    /// The full path drops `.`, `..` and doubled slashes, never above the root.
    @Test func normalizedByParts() {
        #expect(Destination.normalizedByParts("/a/./b/../c//") == "/a/c")
        #expect(Destination.normalizedByParts("a/../../b") == "/b")
        #expect(Destination.normalizedByParts("") == "/")
        #expect(Destination.normalizedByParts("/x/y/z/..") == "/x/y")
    }

    /// The fast path of `normalized` gives what the full one gives.
    @Test func normalizedFastPathAgrees() {
        let segments = ["a", ".", "..", "", "...", ".a", "a.", "b c", "é"]
        let seed = SplitMix64.testSeed()
        var rng = SplitMix64(state: seed)
        for _ in 0..<5000 {
            var path = Bool.random(using: &rng) ? "/" : ""
            path += (0..<Int.random(in: 0...5, using: &rng)).map { _ in segments.randomElement(using: &rng) ?? "a" }.joined(separator: "/")
            if Bool.random(using: &rng) { path += "/" }
            #expect(Destination.normalized(path) == Destination.normalizedByParts(path), "seed \(seed): \(path)")
        }
    }
}

/// Names kept for partial files: ".part" in any case, compared as bytes, as `lowercased()`
/// would tell it.
@Suite struct PartSuffixTests {
    @Test func asLowercased() {
        let names = [
            "a.part", "a.PART", "a.PaRt", ".part", "part", "a.par", "a\u{0E}part", "a.pert", "a.pārt", "a.ｐart", "a.part ", "a.parts",
            "日本.Part", "",
        ]
        for name in names {
            #expect(Destination.hasPartSuffix(name) == name.lowercased().hasSuffix(".part"), "\(name)")
        }
    }
}

/// The policy's memo for many names in few folders must give the verdicts of the full check.
@Suite struct PathPolicyMemoTests {
    @Test func memoAgreesWithFullCheck() {
        let home = "/home/u"
        let policies = [
            PathPolicy(allowedRoots: ["/home/u"], home: home),
            PathPolicy(allowedRoots: ["/home/u/Downloads", "/home/u/.local/share"], home: home),
            PathPolicy(allowedRoots: ["/"], home: home),
            PathPolicy(allowedRoots: [], home: nil),
        ]
        let folders = [
            "/", "/home", "/home/u", "/home/u/Downloads", "/home/u/Downloads/x", "/home/u/.ssh", "/home/u/.local/share",
            "/home/u/.local/share/a", "/home/u/Downloads2", "/tmp",
        ]
        let names = ["a", ".a", ".", "..", "", "a/b", ".ssh/k", "a\u{0}b", "é", ".."]
        let seed = SplitMix64.testSeed()
        var rng = SplitMix64(state: seed)
        for policy in policies {
            var memo = PathPolicy.Memo()
            for _ in 0..<3000 {
                let folder = folders.randomElement(using: &rng) ?? "/"
                let name = names.randomElement(using: &rng) ?? "a"
                let full = policy.refusal(for: (folder == "/" ? "" : folder) + "/" + name)
                #expect(policy.refusal(forName: name, in: folder, memo: &memo) == full, "seed \(seed): \(folder) \(name)")
            }
        }
    }
}
