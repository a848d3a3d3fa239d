import DLCore
import DLRPC
import Foundation
import Testing

/// `on_exists: "rename"` steps past names that unfinished jobs hold (asked of the job table,
/// one candidate at a time), as well as past files on disk.
@Suite struct RenameTests {
    @Test func renameStepsPastNamesOfUnfinishedJobs() async throws {
        try await DispatcherFixture.with { f in
            func enqueue(_ extra: [String: JSONValue]) async -> JSONValue? {
                var params: [String: JSONValue] = ["url": "http://127.0.0.1:9/a.bin", "name": "a.bin", "paused": true]
                params.merge(extra) { $1 }
                return await f.request("enqueue", .object(params))
            }
            let first = await enqueue([:])
            #expect(first?["result"]?["job"]?["path"] == .string(f.downloads + "/a.bin"))
            // The name is held by a paused job, not by a file: without rename it is refused.
            #expect(await enqueue([:])?.stableCode == "destination_exists")
            let second = await enqueue(["on_exists": "rename"])
            #expect(second?["result"]?["job"]?["path"] == .string(f.downloads + "/a (2).bin"))
            // A file takes the next name; the one after it is free.
            try Data("x".utf8).write(to: URL(fileURLWithPath: f.downloads + "/a (3).bin"))
            let third = await enqueue(["on_exists": "rename"])
            #expect(third?["result"]?["job"]?["path"] == .string(f.downloads + "/a (4).bin"))
        }
    }
}
