import DLCore
import DLJobTable
import DLStore
import Foundation
import Testing

/// Retention's deletes and the job table's compaction, on both backends.
@Suite struct RetentionStoreTests {
    /// `.finished` takes standalone jobs in the given states that finished at or before the
    /// cutoff: not newer ones, not other states, not group members; completed files are not
    /// listed for deletion.
    @Test(arguments: Backend.allCases)
    func finishedSelectionTakesOnlyOldFinishedStandaloneJobs(_ backend: Backend) async throws {
        try await withStore(backend) { store, _ in
            var byName: [String: JobID] = [:]
            func add(_ name: String, _ state: JobState, finished: Date?, group: Bool = false) async throws {
                let new = NewJob(url: "https://e.com/\(name)", path: "/tmp/ret/\(name)")
                var job =
                    group
                    ? try #require(
                        try await store.insertGroup(name: "g-\(name)", dir: "/tmp/ret/g-\(name)", priority: 0, members: [new], now: t0).1
                            .first)
                    : try await store.insert([new], now: t0)[0].job
                job.state = state
                job.finishedAt = finished
                if state == .failed {
                    job.error = JobError(code: "http_status", message: "gone")
                    job.attempts = 1
                    job.received = 10
                }
                try await store.save(job)
                byName[name] = job.id
            }
            let old = t0, recent = t0.addingTimeInterval(1000)
            try await add("old-completed", .completed, finished: old)
            try await add("old-canceled", .canceled, finished: old)
            try await add("new-completed", .completed, finished: recent)
            try await add("old-failed", .failed, finished: old)
            try await add("queued", .queued, finished: nil)
            try await add("member", .completed, finished: old, group: true)

            let cutoff = t0.addingTimeInterval(500)
            let outcome = try await store.delete(.finished([.completed, .canceled], before: cutoff), deleteFiles: false, now: recent)
            #expect(outcome.count == 2)
            #expect(Set(outcome.ids) == Set([byName["old-completed"], byName["old-canceled"]].compactMap { $0 }))
            #expect(outcome.files.isEmpty, "a completed file is never listed: \(outcome.files)")
            for name in ["new-completed", "old-failed", "queued", "member"] {
                #expect(try await store.fetch(try #require(byName[name])) != nil, "\(name) stays")
            }
            let failed = try await store.delete(.finished([.failed], before: nil), deleteFiles: false, now: recent)
            #expect(failed.count == 1)
            #expect(failed.files == ["/tmp/ret/old-failed.part"], "a failed job's partial file goes with its record")
        }
    }

    /// After many records go, compaction gives the free pages back: the table (and, on
    /// SQLite, the file) is smaller. PostgreSQL leaves it to autovacuum.
    @Test func compactionShrinksTheFile() async throws {
        try await withStore(.sqlite) { store, _ in
            let jobs = (0..<20_000).map {
                NewJob(url: "https://example.com/some/long/path/\($0)?token=abcdefghijklmnop", path: "/tmp/compact/\($0).bin")
            }
            _ = try await store.insert(jobs, now: t0)
            let full = try await store.databaseBytes()
            #expect(try await store.compact(CompactionPolicy()) == 0, "nothing free yet")
            _ = try await store.delete(.all, deleteFiles: false, now: t0)
            let freed = try await store.compact(CompactionPolicy())
            #expect(freed > 0)
            let after = try await store.databaseBytes()
            #expect(after < full / 2, "\(after) bytes after compaction, \(full) before")
            let path = try #require((store as? SQLiteJobStore)?.path)
            let fileSize = try #require(try FileManager.default.attributesOfItem(atPath: path)[.size] as? Int64)
            #expect(fileSize < full / 2, "the file shrinks with the checkpoint: \(fileSize) bytes, \(full) before")
        }
    }
}
