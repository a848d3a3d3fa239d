import DLCore
import DLRPC
import DLTestSupport
import Foundation
import Testing

/// Concurrency that follows the network (issue 26, `Lanes`): small files run beside big ones
/// instead of behind them, big files share `max_active` bulk slots, `max_active = 1` is still
/// one at a time, and a host that speaks HTTP/2 carries many transfers on one connection.
/// The real daemon against the loopback origin; the origin's `latency` stands for round trips.
@Suite(.serialized) struct LaneTests {
    /// Every job's row, through `list`'s pages.
    private func rows(_ daemon: DaemonHarness) throws -> [JSONValue] {
        try daemon.call("list", ["limit": 1000])["jobs"]?.arrayValue ?? []
    }

    /// Three slow big files fill the bulk lane; thirty small files enqueued after them all
    /// complete while the big ones still run. More big files than bulk slots are parked: at no
    /// time do more than `max_active` big files stream (the origin counts the bodies past their
    /// first MiB: a parked answer is cut after its head, long before), a parked file is fetched
    /// again later, and it is queued with its size known and no attempt used up; every file
    /// ends byte-exact.
    @Test func smallFilesRunBesideBigOnesAndBigOnesShareTheBulkSlots() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: "max_active = 2\nmax_per_host = 8\n")
            try daemon.start()
            defer { daemon.stop() }
            let big = 3 << 20
            // About 3 s each at 1 MB/s: still running when the small ones are done.
            let bigURI = { (n: Int) in "/bytes/\(big + n)?rate=1000000&deep_after=\(1 << 20)" }
            let bigIDs = try (0..<4).map { n in
                try daemon.enqueue(["url": .string(origin.baseURL + bigURI(n)), "name": .string("big\(n)")])
            }
            let small = (0..<30).map { n in
                JSONValue.object(["url": .string("\(origin.baseURL)/bytes/\(4000 + n)"), "name": .string("s\(n)")])
            }
            let reply = try daemon.call("enqueue", ["jobs": .array(small)])
            let smallIDs = reply["results"]?.arrayValue?.compactMap { $0["id"]?.int64Value } ?? []
            #expect(smallIDs.count == 30, "\(reply.serializedString())")
            var sawParked = false
            let deadline = Date().addingTimeInterval(60)
            while Date() < deadline {
                let all = try rows(daemon)
                let bigRows = all.filter { bigIDs.contains($0["id"]?.int64Value ?? 0) }
                if bigRows.contains(where: { $0["state"] == "queued" && $0["size"]?.int64Value != nil && $0["received"] == 0 }) {
                    sawParked = true
                }
                let smallDone = all.filter { smallIDs.contains($0["id"]?.int64Value ?? 0) && $0["state"] == "completed" }.count
                if smallDone == smallIDs.count {
                    let running = bigRows.filter { $0["state"] == "running" }.count
                    #expect(running > 0, "every small file waited for the big ones: \(bigRows.map { $0.serializedString() })")
                    break
                }
                usleep(20_000)
            }
            #expect(sawParked, "no big file was seen parked (queued with its size known)")
            for id in bigIDs {
                let job = try daemon.waitForState(id, ["completed", "failed"], timeout: 60)
                #expect(job["state"] == "completed", "\(job.serializedString())")
                #expect((job["attempts"]?.int64Value ?? 0) == 1, "parking used up an attempt: \(job.serializedString())")
            }
            for n in 0..<4 { try expectOriginBytes(at: daemon.downloadDir + "/big\(n)", count: big + n) }
            for n in 0..<30 { try expectOriginBytes(at: daemon.downloadDir + "/s\(n)", count: 4000 + n) }
            #expect(origin.mostConcurrentDeepBodies == 2, "big files streaming at once: \(origin.mostConcurrentDeepBodies)")
            let fetchedAgain = (0..<4).filter { n in origin.requests.filter { $0.uri == bigURI(n) }.count > 1 }
            #expect(!fetchedAgain.isEmpty, "no big file was parked and fetched again: \(origin.requests.map(\.uri))")
        }
    }

    /// With round trips (the origin answers 50 ms late), small files over HTTP/1.1 run up to
    /// `max_per_host` at once, not `max_active`; and `max_active = 1` is still strictly one
    /// at a time.
    @Test func smallFilesFillTheHostLimitAndOneMeansOne() async throws {
        for (config, expected) in [("max_per_host = 5\n", 5), ("max_active = 1\n", 1)] {
            try await withStarted(try await TestOrigin.start(latency: .milliseconds(50))) { origin in
                let daemon = try DaemonHarness(config: config)
                try daemon.start()
                defer { daemon.stop() }
                let jobs = (0..<40).map { n in
                    JSONValue.object(["url": .string("\(origin.baseURL)/bytes/\(20_000 + n)?rate=200000"), "name": .string("f\(n)")])
                }
                let ids =
                    try daemon.call("enqueue", ["jobs": .array(jobs)])["results"]?.arrayValue?.compactMap { $0["id"]?.int64Value } ?? []
                for id in ids {
                    let job = try daemon.waitForState(id, ["completed", "failed"], timeout: 60)
                    #expect(job["state"] == "completed", "\(job.serializedString())")
                }
                for n in 0..<40 { try expectOriginBytes(at: daemon.downloadDir + "/f\(n)", count: 20_000 + n) }
                #expect(origin.mostConcurrentBodies == expected, "\(config): bodies at once \(origin.mostConcurrentBodies)")
            }
        }
    }

    /// A group (a chapter's pages) follows the lanes inside its slot: its small members run
    /// up to the host limit, not `group_parallel` at a time, and the group is published whole.
    @Test func smallGroupMembersRunBesideEachOther() async throws {
        try await withStarted(try await TestOrigin.start(latency: .milliseconds(50))) { origin in
            let daemon = try DaemonHarness(config: "group_parallel = 2\nmax_per_host = 5\n")
            try daemon.start()
            defer { daemon.stop() }
            let dir = daemon.root + "/dl/chapter"
            let urls = (0..<30).map { "\(origin.baseURL)/bytes/\(20_000 + $0)?rate=200000" }
            let done = try daemon.dlctl(["enqueue", "--group", "chapter", "-d", dir] + urls + ["--wait"])
            #expect(done.status == 0, "\(done.stdout) \(done.stderr)")
            for n in 0..<30 { try expectOriginBytes(at: dir + "/\(20_000 + n)", count: 20_000 + n) }
            #expect(origin.mostConcurrentBodies == 5, "members at once: \(origin.mostConcurrentBodies)")
        }
    }

    /// A server that offers HTTP/2: many jobs are streams of one connection (one TLS
    /// handshake), more of them at once than `max_per_host` allows connections, every file
    /// byte-exact.
    @Test func http2CarriesManyJobsOnOneConnection() async throws {
        let tlsRoot = try DaemonHarness()
        let tls = try TLSFiles.selfSigned(in: tlsRoot.root)
        try await withStarted(try await TestOrigin.start(tls: tls, http2: true, latency: .milliseconds(50))) { origin in
            let daemon = try DaemonHarness(config: "ca_file = \"\(tls.certificatePath)\"\n")
            try daemon.start()
            defer { daemon.stop() }
            // One job first: its answer tells dld that the host speaks HTTP/2.
            let first = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/1000"), "name": .string("first")])
            #expect(try daemon.waitForState(first, ["completed", "failed"])["state"] == "completed")
            let jobs = (0..<60).map { n in
                JSONValue.object(["url": .string("\(origin.baseURL)/bytes/\(30_000 + n)"), "name": .string("f\(n)")])
            }
            let ids = try daemon.call("enqueue", ["jobs": .array(jobs)])["results"]?.arrayValue?.compactMap { $0["id"]?.int64Value } ?? []
            #expect(ids.count == 60)
            for id in ids {
                let job = try daemon.waitForState(id, ["completed", "failed"], timeout: 60)
                #expect(job["state"] == "completed", "\(job.serializedString())")
            }
            for n in 0..<60 { try expectOriginBytes(at: daemon.downloadDir + "/f\(n)", count: 30_000 + n) }
            #expect(origin.connections == 1, "connections: \(origin.connections)")
            #expect(origin.http2Connections == 1)
            #expect(origin.http2Streams == 61, "streams: \(origin.http2Streams)")
            // More requests at once than max_per_host connections would carry.
            #expect(origin.mostInFlight > 6, "requests in flight at once over HTTP/2: \(origin.mostInFlight)")
        }
    }

    /// `http2 = false`: the same server is spoken to over HTTP/1.1, within `max_per_host`
    /// connections.
    @Test func http2CanBeTurnedOff() async throws {
        let tlsRoot = try DaemonHarness()
        let tls = try TLSFiles.selfSigned(in: tlsRoot.root)
        try await withStarted(try await TestOrigin.start(tls: tls, http2: true, latency: .milliseconds(20))) { origin in
            let daemon = try DaemonHarness(config: "ca_file = \"\(tls.certificatePath)\"\nhttp2 = false\n")
            try daemon.start()
            defer { daemon.stop() }
            let jobs = (0..<20).map { n in
                JSONValue.object(["url": .string("\(origin.baseURL)/bytes/\(5000 + n)"), "name": .string("f\(n)")])
            }
            let ids = try daemon.call("enqueue", ["jobs": .array(jobs)])["results"]?.arrayValue?.compactMap { $0["id"]?.int64Value } ?? []
            for id in ids { #expect(try daemon.waitForState(id, ["completed", "failed"])["state"] == "completed") }
            #expect(origin.http2Streams == 0)
            #expect(origin.connections >= 1 && origin.connections <= 6, "connections: \(origin.connections)")
            #expect(origin.mostInFlight <= 6, "requests in flight at once: \(origin.mostInFlight)")
        }
    }
    /// Over HTTP/1.1 the next job's request waits in the pool behind each connection a small
    /// file holds (`HostLimits.startLimit`): while slow small files hold both connections that
    /// `max_per_host = 2` allows, two more jobs are started and wait in the pool (not in the
    /// queue), and the server still sees two requests at once, on two connections.
    @Test func requestsWaitBehindConnectionsWithinTheHostLimit() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: "max_per_host = 2\n")
            try daemon.start()
            defer { daemon.stop() }
            // About 2 s each: two of them hold both connections while the others are looked at.
            let jobs = (0..<6).map { n in
                JSONValue.object(["url": .string("\(origin.baseURL)/bytes/\(4000 + n)?rate=2000"), "name": .string("f\(n)")])
            }
            let ids = try daemon.call("enqueue", ["jobs": .array(jobs)])["results"]?.arrayValue?.compactMap { $0["id"]?.int64Value } ?? []
            #expect(ids.count == 6)
            let streaming = Date().addingTimeInterval(3)
            while Date() < streaming, origin.bodiesStreaming < 2 { usleep(5000) }
            var running = 0
            let deadline = Date().addingTimeInterval(1)
            while Date() < deadline, running < 4 {
                running = try rows(daemon).filter { $0["state"] == "running" }.count
                usleep(10_000)
            }
            #expect(origin.bodiesStreaming == 2, "two slow files no longer hold both connections")
            #expect(running == 4, "jobs running, two of them waiting behind the busy connections: \(running)")
            #expect(origin.requests.count == 2, "requests that reached the server: \(origin.requests.map(\.uri))")
            for id in ids {
                let job = try daemon.waitForState(id, ["completed", "failed"], timeout: 60)
                #expect(job["state"] == "completed", "\(job.serializedString())")
                #expect(job["attempts"]?.int64Value == 1, "\(job.serializedString())")
            }
            for n in 0..<6 { try expectOriginBytes(at: daemon.downloadDir + "/f\(n)", count: 4000 + n) }
            #expect(origin.mostInFlight <= 2, "requests at the server at once: \(origin.mostInFlight)")
            #expect(origin.connections <= 2, "connections: \(origin.connections)")
        }
    }

    /// A request that waits for a connection longer than `connect_timeout` (the only one is
    /// held by a slow small file) goes back to the queue: not an attempt, no error, no
    /// backoff; it completes once the connection is free.
    @Test func aRequestThatWaitsTooLongForAConnectionIsNoAttempt() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: "max_per_host = 1\nconnect_timeout = 1\n")
            try daemon.start()
            defer { daemon.stop() }
            // About 4 s at 25 000 bytes/s, and light (well under 2 MiB): the next request waits
            // behind it and gives up after 1 s, several times.
            let slow = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/100000?rate=25000"), "name": .string("slow")])
            _ = try daemon.waitForState(slow, ["running"])
            let next = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/1000"), "name": .string("next")])
            var sawWaiting = false
            let deadline = Date().addingTimeInterval(60)
            var job = try daemon.job(next)
            while Date() < deadline, job["state"] != "completed", job["state"] != "failed" {
                if job["state"] == "waiting" { sawWaiting = true }
                usleep(20_000)
                job = try daemon.job(next)
            }
            #expect(job["state"] == "completed", "\(job.serializedString())")
            #expect(!sawWaiting, "waiting for a connection became a failed attempt")
            #expect(job["attempts"]?.int64Value == 1, "\(job.serializedString())")
            #expect(job["error"] == .null || job["error"] == nil, "\(job.serializedString())")
            #expect(try daemon.waitForState(slow, ["completed", "failed"])["state"] == "completed")
            try expectOriginBytes(at: daemon.downloadDir + "/next", count: 1000)
            #expect(origin.mostInFlight == 1, "requests at the server at once: \(origin.mostInFlight)")
        }
    }
}
