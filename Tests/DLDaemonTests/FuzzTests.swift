import DLCore
@testable import DLDaemon
@testable import DLEngine
import DLRPC
import DLJobTable
import DLStore
import DLTestSupport
import DLTransfer
import Logging
import Foundation
import NIOCore
import NIOEmbedded
import Testing

/// Hostile input at the protocol's two doors: the line decoder and the dispatcher.
@Suite struct FuzzTests {
    static let seeds: [String] = [
        #"{"jsonrpc":"2.0","id":1,"method":"version"}"#,
        #"{"jsonrpc":"2.0","id":2,"method":"stats"}"#,
        #"{"jsonrpc":"2.0","id":3,"method":"list","params":{"limit":5,"state":["queued","paused"],"after_id":0}}"#,
        #"{"jsonrpc":"2.0","id":4,"method":"status","params":{"ids":[1,2,3]}}"#,
        #"{"jsonrpc":"2.0","id":5,"method":"pause","params":{"id":1}}"#,
        #"{"jsonrpc":"2.0","id":6,"method":"resume","params":{"group":"g"}}"#,
        #"{"jsonrpc":"2.0","id":7,"method":"enqueue","params":{"url":"http://127.0.0.1:9/a","dir":"/nonexistent","priority":3,"meta":{"a":[1,2,{"b":null}]},"headers":{"X-A":"b"}}}"#,
        #"{"jsonrpc":"2.0","id":8,"method":"enqueue","params":{"jobs":[{"url":"http://127.0.0.1:9/b","path":"/nonexistent/b"},{"url":"ftp://x"}]}}"#,
        #"{"jsonrpc":"2.0","id":9,"method":"enqueue","params":{"group":{"name":"g","dir":"/nonexistent/g"},"jobs":[{"url":"http://127.0.0.1:9/c","checksum":"sha256:00"}]}}"#,
        #"[{"jsonrpc":"2.0","id":10,"method":"version"},{"jsonrpc":"2.0","method":"stats"}]"#,
        #"{"jsonrpc":"2.0","id":"x","method":"cancel","params":{"ids":[99,100]}}"#,
        #"{"jsonrpc":"2.0","id":11,"method":"queue"}"#,
        #"{"jsonrpc":"2.0","id":12,"method":"remove","params":{"id":7,"delete_file":false}}"#,
    ]

    static func mutate(_ input: [UInt8], _ rng: inout SplitMix64) -> [UInt8] {
        let interesting: [[UInt8]] = [
            Array("null".utf8), Array("1e400".utf8), Array("-0".utf8), Array("99999999999999999999999".utf8), Array("\"\\u0000\"".utf8),
            Array("[".utf8), Array("{".utf8), Array("\"\\ud800\"".utf8), [0xFF], [0xC0, 0x80],
            Array(String(repeating: "[", count: 600).utf8),
            Array("true".utf8), Array("\"\"".utf8), Array("{}".utf8), Array("[]".utf8),
        ]
        return Mutator.mutate(input, interesting: interesting, maxRepeat: 20, using: &rng).map { $0 == 0x0A ? 0x20 : $0 }
    }

    /// 100,000 random and mutated requests: every answer is a JSON-RPC response (or nothing, for
    /// notifications), every error carries a stable data.code, and nothing crashes or hangs.
    @Test func dispatcherSurvivesHostileRequests() async throws {
        let seed: UInt64 = 0xD1D_2026
        var rng = SplitMix64(state: seed)
        let folder =
            (FileManager.default.fileExists(atPath: "/dev/shm") ? "/dev/shm/" : NSTemporaryDirectory()) + "dld-fuzz-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        let store = try SQLiteJobStore(path: folder + "/jobs.sqlite")
        let downloader = Downloader(logger: Logger(label: "fuzz"))
        var configuration = EngineConfiguration(downloadDir: folder, maxActive: 1)
        configuration.queuePausedReason = "fuzzing"
        let engine = Engine(store: store, downloader: downloader, configuration: configuration, logger: Logger(label: "fuzz"))
        try await engine.start()
        let dispatcher = Dispatcher(engine: engine)
        var answered = 0
        var silent = 0
        for round in 0..<100_000 {
            let line: [UInt8]
            if round % 10 == 0 {
                line = (0..<Int.random(in: 0...200, using: &rng)).map { _ in
                    let byte = UInt8.random(in: 0...255, using: &rng)
                    return byte == 0x0A ? 0x20 : byte
                }
            } else {
                line = Self.mutate(Array(Self.seeds[Int.random(in: 0..<Self.seeds.count, using: &rng)].utf8), &rng)
            }
            let reply = await dispatcher.handle(line: Data(line))
            guard let data = reply.data else {
                // No answer only for notifications (requests without an id, alone or all of a
                // batch) and subscriptions: anything else left the client without a reply.
                silent += 1
                let parsed = try? JSONValue.parse(Data(line))
                let elements = parsed?.arrayValue ?? parsed.map { [$0] } ?? []
                let notifications = !elements.isEmpty && elements.allSatisfy { $0["id"] == nil && $0["method"]?.stringValue != nil }
                guard reply.subscription != nil || notifications else {
                    Issue.record("seed \(seed) round \(round): no answer to \(String(decoding: line, as: UTF8.self).prefix(300))")
                    break
                }
                continue
            }
            answered += 1
            let parsed = try? JSONValue.parse(data)
            let responses = parsed?.arrayValue ?? parsed.map { [$0] } ?? []
            guard !responses.isEmpty,
                responses.allSatisfy({
                    $0["jsonrpc"] == "2.0" && ($0["result"] != nil || $0["error"]?["data"]?["code"]?.stringValue != nil)
                })
            else {
                Issue.record(
                    "seed \(seed) round \(round): bad answer \(String(decoding: data, as: UTF8.self).prefix(300)) to \(String(decoding: line, as: UTF8.self).prefix(300))"
                )
                break
            }
        }
        #expect(answered > 90_000, "seed \(seed): \(answered) answered, \(silent) silent")
        await engine.shutdown()
    }

    /// The line decoder splits any byte stream, cut anywhere, into the same lines; a line over
    /// the limit is an error, never a buffer that grows.
    @Test func lineDecoderSplitsAnyStream() throws {
        var rng = SplitMix64(state: 42)
        for _ in 0..<300 {
            var stream: [UInt8] = []
            var expected: [[UInt8]] = []
            for _ in 0..<Int.random(in: 1...20, using: &rng) {
                let line = (0..<Int.random(in: 0...300, using: &rng)).map { _ in UInt8.random(in: 0x20...0x7E, using: &rng) }
                expected.append(line)
                stream += line + [0x0A]
            }
            let channel = EmbeddedChannel(handler: ByteToMessageHandler(LineDecoder(maxLength: 512)))
            var offset = 0
            while offset < stream.count {
                let end = min(stream.count, offset + Int.random(in: 1...64, using: &rng))
                try channel.writeInbound(ByteBuffer(bytes: stream[offset..<end]))
                offset = end
            }
            var lines: [[UInt8]] = []
            while let buffer = try channel.readInbound(as: ByteBuffer.self) {
                lines.append(Array(buffer.readableBytesView))
            }
            #expect(lines == expected)
            _ = try channel.finish()
        }
        let channel = EmbeddedChannel(handler: ByteToMessageHandler(LineDecoder(maxLength: 100)))
        #expect(throws: LineDecoder.LineTooLong.self) {
            for _ in 0..<10 { try channel.writeInbound(ByteBuffer(bytes: Array(repeating: UInt8(ascii: "a"), count: 50))) }
        }
        _ = try? channel.finish()
    }
}
