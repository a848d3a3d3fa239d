import DLCore
@testable import DLEngine
import DLJobTable
import DLStore
import DLTransfer
import Foundation
import Logging
import Testing

/// The crash points of an HLS group's publish (built, recorded, renamed), met at start-up.
@Suite struct HLSRecoveryTests {
    /// An HLS group of two plain segments (each file holds its own name), its members staged
    /// and completed as a crash would leave them; not yet saved.
    private func stagedHLSGroup(_ store: SQLiteJobStore, output: String) async throws -> (JobGroup, [Job], HLSRecipe) {
        let text =
            "#EXTM3U\n#EXT-X-TARGETDURATION:1\n#EXTINF:1,\nhttp://127.0.0.1:9/a.ts\n#EXTINF:1,\nhttp://127.0.0.1:9/b.ts\n#EXT-X-ENDLIST\n"
        guard case .success(.media(let media)) = HLSParser.parse(Array(text.utf8), base: "http://127.0.0.1:9/v.m3u8") else {
            throw DLError(.internalError, "the playlist did not parse")
        }
        var recipe = try HLSRecipe.plan(media, layout: .file).get()
        recipe.output = output
        let news = recipe.members.map { NewJob(url: $0.url, path: output + "/" + $0.name, state: .paused) }
        let (group, members) = try await store.insertGroup(
            name: "v.ts", dir: output, priority: 0, members: news, hls: recipe.encoded(), now: Date())
        var done: [Job] = []
        for var member in members {
            let staged = try #require(member.stagingPath)
            try FileManager.default.createDirectory(atPath: group.staging, withIntermediateDirectories: true)
            try Data(member.name.utf8).write(to: URL(fileURLWithPath: staged))
            member.state = .completed
            member.received = Int64(member.name.utf8.count)
            done.append(member)
        }
        return (group, done, recipe)
    }

    private func engine(_ store: SQLiteJobStore, _ folder: String) -> Engine {
        let logger = Logger(label: "test")
        return Engine(
            store: store, downloader: Downloader(logger: logger), configuration: EngineConfiguration(downloadDir: folder + "/dl"),
            logger: logger)
    }

    /// All members complete, not yet published when dld died: the next start joins and
    /// publishes them.
    @Test func completeButUnpublishedIsJoinedAtStart() async throws {
        let folder = NSTemporaryDirectory() + "dld-hls-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: folder + "/dl", withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let store = try SQLiteJobStore(path: folder + "/jobs.sqlite")
        let output = folder + "/dl/v.ts"
        let (group, done, _) = try await stagedHLSGroup(store, output: output)
        try await store.save(done)
        let engine = engine(store, folder)
        do { try await engine.start() } catch { Issue.record(error, "the engine did not start") }
        // The publish runs in the start's first turn; a status waits for it.
        let status = try? await engine.groupStatus(.id(group.id))
        #expect(status?.1.state == .completed, "\(String(describing: status?.0.error))")
        #expect((try? String(contentsOfFile: output, encoding: .utf8)) == "seg-000000.tsseg-000001.ts")
        #expect(!FileManager.default.fileExists(atPath: group.staging))
        let after = try? await store.fetchGroup(group.id)
        #expect(after?.closed == .completed)
        await engine.shutdown()
    }

    /// Recorded completed, the joined file built and synced in the staging folder, and dld died
    /// before the rename: the next start renames it into place, removes the staging folder,
    /// and reports no member missing.
    @Test func recordedButNotRenamedIsFinishedAtStart() async throws {
        let folder = NSTemporaryDirectory() + "dld-hls-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: folder + "/dl", withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let store = try SQLiteJobStore(path: folder + "/jobs.sqlite")
        let output = folder + "/dl/v.ts"
        var (group, members, _) = try await stagedHLSGroup(store, output: output)
        try Data("joined".utf8).write(to: URL(fileURLWithPath: Engine.builtPath(group)))
        for index in members.indices {
            members[index].stagingPath = nil
            members[index].path = output
        }
        group.closed = .completed
        try await store.saveGroup(group, members: members)
        let engine = engine(store, folder)
        do { try await engine.start() } catch { Issue.record(error, "the engine did not start") }
        #expect((try? String(contentsOfFile: output, encoding: .utf8)) == "joined")
        #expect(!FileManager.default.fileExists(atPath: group.staging))
        let after = (try? await store.members(of: group.id)) ?? []
        #expect(after.count == 2)
        for member in after {
            #expect(member.state == .completed && member.error == nil, "\(member.id): \(String(describing: member.error))")
        }
        await engine.shutdown()
    }
}
