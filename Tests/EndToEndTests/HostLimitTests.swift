import DLRPC
import DLTestSupport
import Foundation
import Testing

/// `max_per_host` seen from the servers, not from dld's own accounting (SchedulingTests checks
/// that accounting with fake transfers): each origin counts the requests it is answering at
/// once, which over HTTP/1.1 are the connections dld uses to it, whatever opened them.
@Suite(.serialized) struct HostLimitTests {
    /// Two hosts and `max_per_host = 2`: a file on the first with a mirror on the second
    /// (ranges from both), a segmented file on the first (four ranges if it could), then more
    /// of each and small files on the second, all at once. Neither server ever
    /// answers more than two requests at once, and each does answer two at once (the limit
    /// was reached, not just respected by a quiet queue); every file is exact.
    @Test func neitherHostEverHasMoreThanItsLimit() async throws {
        try await withOrigin { first in
            try await withStarted(try await TestOrigin.start()) { second in
                let daemon = try DaemonHarness(
                    config: "max_per_host = 2\nmax_active = 8\nsegments = 4\nsegment_min_size = 65536\n")
                try daemon.start()
                defer { daemon.stop() }
                var sizes: [String: Int] = [:]
                var ids: [Int64] = []
                func enqueue(_ jobs: [JSONValue]) throws {
                    let reply = try daemon.call("enqueue", ["jobs": .array(jobs)])
                    let created = reply["results"]?.arrayValue?.compactMap { $0["id"]?.int64Value } ?? []
                    #expect(created.count == jobs.count, "\(reply.serializedString())")
                    ids += created
                }
                func job(_ origin: TestOrigin, _ size: Int, _ name: String, mirror: TestOrigin? = nil, rate: Int = 300_000) -> JSONValue {
                    sizes[name] = size
                    var job: [String: JSONValue] = ["url": .string("\(origin.baseURL)/bytes/\(size)?rate=\(rate)"), "name": .string(name)]
                    if let mirror { job["mirrors"] = [.string("\(mirror.baseURL)/bytes/\(size)?rate=\(rate)")] }
                    return .object(job)
                }
                func ranged(_ origin: TestOrigin, _ prefix: String) -> Int {
                    origin.requests.filter { $0.path.hasPrefix(prefix) && $0.header("range") != nil }.count
                }
                func eventually(_ what: String, _ condition: () -> Bool) throws {
                    let deadline = Date().addingTimeInterval(60)
                    while !condition() {
                        guard Date() < deadline else { throw HarnessError("timed out waiting for \(what)") }
                        usleep(20_000)
                    }
                }
                // A file with a mirror, alone: its ranges go to both hosts.
                try enqueue([job(first, 3_000_000, "mirrored0", mirror: second, rate: 1_000_000)])
                try eventually("the ranges from the mirror") { ranged(second, "/bytes/3000000") > 0 }
                // A segmented file on the first host: its ranges take what is free of it.
                try enqueue([job(first, 1_200_000, "seg0")])
                try eventually("the ranges of the segmented file") { ranged(first, "/bytes/1200000") > 0 }
                // And more of each, with small files, all at once, while those still run.
                try enqueue(
                    [job(first, 700_000, "mirrored1", mirror: second), job(first, 600_000, "seg1"), job(first, 600_001, "seg2")]
                        + (0..<6).map { job(second, 40_000 + $0, "small\($0)") })
                for id in ids {
                    let job = try daemon.waitForState(id, ["completed", "failed"], timeout: 120)
                    #expect(job["state"] == "completed", "\(job.serializedString())")
                }
                for (name, size) in sizes { try expectOriginBytes(at: daemon.downloadDir + "/" + name, count: size) }
                #expect(first.mostInFlight == 2, "requests answered at once by the first host: \(first.mostInFlight)")
                #expect(second.mostInFlight == 2, "requests answered at once by the second host: \(second.mostInFlight)")
            }
        }
    }
}
