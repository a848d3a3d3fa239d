import DLCore
import DLJobTable
import DLStore
import Foundation
import Testing

/// Inserts write many rows a statement (SQLite binds them with its C API, see RawStatement;
/// PostgreSQL sends them as parameters of one VALUES list): on every backend each field must
/// read back exactly as returned, and texts as GRDB binds and reads them.
@Suite struct InsertTests {
    @Test(arguments: Backend.allCases)
    func insertedRowsReadBackAsReturned(_ backend: Backend) async throws {
        try await withStore(backend) { store, _ in
            var news = [
                NewJob(
                    url: "https://example.com/a.bin", path: "/tmp/x/a.bin", meta: #"{"a":"\u0000"}"#,
                    checksum: try Checksum.parse("sha256:" + String(repeating: "ab", count: 32)).get(), expectedSize: 1 << 40),
                NewJob(url: "https://example.com/é 日.bin", path: "/tmp/x/é 日😀.bin", priority: -1000, key: "k2", meta: ""),
                NewJob(
                    url: "http://127.0.0.1:8080/c", path: "/tmp/x/c", priority: 1000, headers: [HeaderField(name: "A", value: "")],
                    overwrite: true, state: .paused),
            ]
            news[2].options = JobOptions(automaticName: true, renameIfTaken: true, insecure: true)
            news[1].host = "precomputed"
            let outcomes = try await store.insert(news, now: t0)
            #expect(outcomes.map(\.created) == [true, true, true])
            for outcome in outcomes {
                #expect(try await store.fetch(outcome.job.id) == outcome.job)
            }
            #expect(outcomes[1].job.meta == "")
            #expect(try await store.fetch(keys: ["k2"]).count == 1)
            #expect(try await store.fetch(keys: ["k"]).isEmpty)
            // One job.state event a job, numbered in order, with its state.
            let events = try await store.events(after: 0)
            #expect(events.map(\.jobID) == outcomes.map(\.job.id))
            #expect(events.map(\.state) == ["queued", "queued", "paused"])
            #expect(events.map(\.seq) == [1, 2, 3])
        }
    }

    /// A failed insert (a path in use) leaves nothing behind, and the statement works after it.
    @Test(arguments: Backend.allCases)
    func failedInsertLeavesNothing(_ backend: Backend) async throws {
        try await withStore(backend) { store, _ in
            _ = try await store.insert([NewJob(url: "https://h/a", path: "/tmp/x/a")], now: t0)
            await #expect(throws: StoreError.self) {
                _ = try await store.insert(
                    [NewJob(url: "https://h/b", path: "/tmp/x/b"), NewJob(url: "https://h/a2", path: "/tmp/x/a")], now: t0)
            }
            #expect(try await store.list().map(\.path) == ["/tmp/x/a"])
            let after = try await store.insert([NewJob(url: "https://h/b", path: "/tmp/x/b")], now: t0)
            #expect(after.first?.job.path == "/tmp/x/b")
            #expect(try await store.events(after: 0).count == 2)
        }
    }

    /// Rows are written many to a statement (256, 64, 16, 4, 1): every count gets the right ids,
    /// events and outcomes, and a key repeated in the batch returns the job it named.
    @Test(arguments: Backend.allCases)
    func batchesOfEveryShape(_ backend: Backend) async throws {
        try await withStore(backend) { store, _ in
            var total = 0
            for count in [1, 3, 255, 256, 257, 599] {
                var news = (0..<count).map { NewJob(url: "https://h/\(count)/\($0)", path: "/tmp/x/\(count)/\($0)", key: "\(count)-\($0)") }
                if count > 2 { news.append(NewJob(url: "https://h/again", path: "/tmp/x/other/\(count)", key: "\(count)-1")) }
                let outcomes = try await store.insert(news, now: t0)
                #expect(outcomes.count == news.count)
                for (index, outcome) in outcomes.enumerated() where index < count {
                    #expect(outcome.created)
                    #expect(outcome.job.path == news[index].path)
                    #expect(try await store.fetch(outcome.job.id) == outcome.job)
                }
                if count > 2 {
                    #expect(outcomes.last?.created == false)
                    #expect(outcomes.last?.job.id == outcomes[1].job.id)
                }
                total += count
            }
            #expect(try await store.list().count == total)
            let events = try await store.events(after: 0)
            #expect(events.count == total)
            #expect(events.map(\.jobID) == (try await store.list()).map(\.id))
            #expect(events.map(\.seq) == Array(1...Int64(total)))
        }
    }

    /// A path repeated inside one batch is refused as a path in use, and nothing is created.
    @Test(arguments: Backend.allCases)
    func pathRepeatedInBatchIsRefused(_ backend: Backend) async throws {
        try await withStore(backend) { store, _ in
            var news = (0..<300).map { NewJob(url: "https://h/\($0)", path: "/tmp/x/\($0)") }
            news.append(NewJob(url: "https://h/dup", path: "/tmp/x/7"))
            await #expect(throws: StoreError.pathInUse(path: "/tmp/x/7", by: 8)) {
                _ = try await store.insert(news, now: t0)
            }
            let rows = try await store.list()
            let events = try await store.events(after: 0)
            #expect(rows.isEmpty)
            #expect(events.isEmpty)
        }
    }

    /// A NUL ends a text, as GRDB binds texts (C strings) and as PostgreSQL must then keep it
    /// too (it refuses a NUL in text): the row is written, and reads back the same on both.
    @Test(arguments: Backend.allCases)
    func nulEndsAText(_ backend: Backend) async throws {
        try await withStore(backend) { store, _ in
            let created = try await store.insert(
                [NewJob(url: "https://h/n", path: "/tmp/x/n", key: "k\u{0}tail", meta: "{}\u{0}junk")], now: t0)
            let job = try #require(try await store.fetch(created[0].job.id))
            #expect(job.key == "k")
            #expect(job.meta == "{}")
            #expect(try await store.fetch(keys: ["k"]).count == 1)
            var failed = job
            failed.state = .failed
            failed.error = JobError(code: "http_status", message: "bad\u{0}rest")
            try await store.save(failed)
            #expect(try await store.fetch(job.id)?.error?.message == "bad")
        }
    }
}
