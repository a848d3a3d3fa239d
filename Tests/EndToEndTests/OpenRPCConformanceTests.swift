import DLCore
import DLRPC
import DLTestSupport
import DLTransfer
import Foundation
import Testing

/// The OpenRPC document that `rpc.discover` answers is true of the real daemon: every method
/// is called with real params against a real `dld` and the test origin, and each request's
/// params and each reply's result are checked against the document's schemas (and the
/// notifications of a subscription against theirs) by Python's `jsonschema`
/// (scripts/check-openrpc.py), which knows nothing of dld's code.
@Suite struct OpenRPCConformanceTests {
    /// What was sent and what came back, as the checker reads it.
    final class Recorder {
        let daemon: DaemonHarness
        var calls: [JSONValue] = []

        init(_ daemon: DaemonHarness) { self.daemon = daemon }

        @discardableResult
        func call(_ method: String, _ params: [String: JSONValue] = [:]) throws -> JSONValue {
            let result = try daemon.call(method, params)
            calls.append(["method": .string(method), "params": .object(params), "result": result])
            return result
        }
    }

    static var repository: URL {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    }

    @Test func everyMethodsRealParamsAndResultsMatchTheDocument() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness()
            try daemon.start()
            defer { daemon.stop() }
            let record = Recorder(daemon)
            let base = origin.baseURL
            let dl = daemon.downloadDir

            let document = try record.call("rpc.discover")
            try record.call("version")

            // enqueue: one job with most params, a paused one with mirrors, a batch, a group.
            let digest = try #require(StreamingDigest(.sha256))
            digest.update(TestOrigin.bytes(count: 1000))
            let a = try #require(
                try record.call(
                    "enqueue",
                    [
                        "url": .string("\(base)/bytes/1000"), "name": "a.bin", "priority": 5, "key": "a", "meta": ["n": 1, "s": "x"],
                        "headers": ["X-Trace": "42", "Authorization": "Bearer t"], "checksum": .string("sha256:" + digest.finalize()),
                        "size": 1000, "on_exists": "rename", "max_speed": 0,
                    ])["job"]?["id"]?.int64Value)
            try daemon.waitForState(a, ["completed"])
            let b = try #require(
                try record.call(
                    "enqueue",
                    [
                        "url": .string("\(base)/bytes/400000"), "mirrors": [.string("\(base)/bytes/400000?m=1")],
                        "path": .string(dl + "/b.bin"),
                        "paused": true, "segments": 2, "metered": false, "max_speed": 100_000, "overwrite": true,
                    ])["job"]?["id"]?.int64Value)
            let batch = try record.call(
                "enqueue",
                [
                    "jobs": [
                        ["url": .string("\(base)/bytes/10"), "name": "c.bin", "paused": true],
                        ["url": .string("\(base)/bytes/20"), "dir": .string(dl), "name": "d.bin", "paused": true],
                    ]
                ])
            let c = try #require(batch["results"]?[0]?["id"]?.int64Value)
            let d = try #require(batch["results"]?[1]?["id"]?.int64Value)
            try record.call(
                "enqueue",
                [
                    "group": ["name": "g", "dir": .string(dl + "/g")], "priority": 1, "headers": ["X-G": "1"],
                    "jobs": [
                        ["url": .string("\(base)/bytes/30"), "name": "1.bin"],
                        ["url": .string("\(base)/bytes/40"), "path": "sub/2.bin", "size": 40],
                    ],
                ])

            // status, list, stats, queue.
            try record.call("status", ["id": .int(a)])
            try record.call("status", ["ids": [.int(b), .int(c)]])
            try record.call("status", ["group": "g"])
            try record.call("list")
            try record.call("list", ["state": ["paused", "completed"], "limit": 2, "after_id": 0])
            try record.call("list", ["state": "queued", "group": "g"])
            try record.call("stats")
            try record.call("queue")
            try record.call("queue", ["paused": true])
            try record.call("queue", ["paused": false])

            // pause, resume, set_speed, change, cancel.
            try record.call("pause", ["ids": [.int(c), .int(d)]])
            try record.call("pause", ["group": "g"])
            try record.call("resume", ["group": "g"])
            try record.call("set_speed", ["global": true, "max_speed": .int(1 << 20)])
            try record.call("set_speed", ["id": .int(b), "max_speed": 2048])
            try record.call("set_speed", ["global": true, "max_speed": .null])
            try record.call("change", ["id": .int(c), "url": .string("\(base)/bytes/11"), "headers": ["Authorization": "Bearer new"]])
            try record.call("change", ["id": .int(d), "headers": [:]])
            try record.call("resume", ["id": .int(b)])
            try daemon.waitForJob(b) { $0["state"] == "running" || $0["state"] == "completed" }
            try record.call("status", ["id": .int(b)])
            try record.call("pause", ["all": true])
            try record.call("status", ["id": .int(b)])
            try record.call("cancel", ["id": .int(d)])

            // The URL cache.
            let cached = "\(base)/bytes/300?cache_control=max-age=3600"
            try record.call("get", ["url": .string(cached), "pin": true])
            try record.call("get", ["url": .string(cached)])
            try record.call("cache_list")
            try record.call("unpin", ["url": .string(cached)])

            // A subscription: the numbered events kept so far, then a running job's progress.
            let notifications = try Self.subscribe(daemon, record, url: "\(base)/bytes/300000?rate=200000")

            // remove, in both forms, then shutdown last.
            try record.call("remove", ["id": .int(d)])
            try record.call("remove", ["ids": [.int(c)], "delete_file": false])
            try record.call("remove", ["finished": true, "failed": true, "older_than": 0])
            try record.call("stats")
            try record.call("shutdown")
            #expect(daemon.stop() == 0)

            let called = Set(record.calls.compactMap { $0["method"]?.stringValue })
            #expect(called.union(["subscribe"]) == Set(RPCMethod.names), "every method is called")
            #expect(notifications.contains { $0["method"] == "job.progress" }, "\(notifications)")
            #expect(notifications.contains { $0["method"] == "job.state" }, "\(notifications)")
            try Self.check(document: document, calls: record.calls, notifications: notifications)
        }
    }

    /// Subscribes with `since: 0`, enqueues a throttled job on another connection, and collects
    /// notifications until that job completes.
    static func subscribe(_ daemon: DaemonHarness, _ record: Recorder, url: String) throws -> [JSONValue] {
        let client = RPCClient(socketPath: daemon.socket)
        defer { client.close() }
        let params: [String: JSONValue] = ["since": 0]
        let request: JSONValue = ["jsonrpc": "2.0", "id": 1, "method": "subscribe", "params": .object(params)]
        try client.sendLine(request.serialized())
        try client.setReadTimeout(20)
        let reply = try client.readMessage()
        let result = try #require(reply["result"], "\(reply)")
        record.calls.append(["method": "subscribe", "params": .object(params), "result": result])
        let id = try #require(try record.call("enqueue", ["url": .string(url), "name": "e.bin"])["job"]?["id"]?.int64Value)
        var notifications: [JSONValue] = []
        while true {
            let message = try client.readMessage()
            notifications.append(message)
            if message["method"] == "job.state", message["params"]?["id"]?.int64Value == id, message["params"]?["state"] == "completed" {
                return notifications
            }
        }
    }

    /// Runs scripts/check-openrpc.py on what was exchanged.
    static func check(document: JSONValue, calls: [JSONValue], notifications: [JSONValue]) throws {
        let folder = try makeTemporaryFolder("/tmp/dld-openrpc-XXXXXX")
        defer { try? FileManager.default.removeItem(atPath: folder) }
        try document.serialized().write(to: URL(fileURLWithPath: folder + "/openrpc.json"))
        try JSONValue.array(calls).serialized().write(to: URL(fileURLWithPath: folder + "/calls.json"))
        let notes = notifications.map { message -> JSONValue in ["method": message["method"] ?? nil, "params": message["params"] ?? nil] }
        try JSONValue.array(notes).serialized().write(to: URL(fileURLWithPath: folder + "/notifications.json"))
        let script = repository.appendingPathComponent("scripts/check-openrpc.py").path
        let run = try runProgram("/usr/bin/env", ["python3", script, folder])
        #expect(run.status == 0, "the replies do not match the document:\n\(run.stdout)\(run.stderr)")
        #expect(run.stdout.contains("\(calls.count) calls, \(notifications.count) notifications"), "\(run.stdout)\(run.stderr)")
    }
}
