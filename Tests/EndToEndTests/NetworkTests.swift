import DLCore
import DLRPC
import DLTestSupport
import Foundation
import Testing

/// A network namespace of the test's own, joined to the test's origin by a veth pair: dld runs
/// inside it, and the test takes the link down and up (needs root and `ip`, as CI has).
final class NetworkNamespace {
    let name: String
    let hostAddress: String
    private let inside: String

    init() throws {
        let tag = "\(getpid() % 10_000)\(Int.random(in: 10...99))"
        name = "dldt\(tag)"
        let outside = "dvh\(tag)"
        inside = "dvn\(tag)"
        let subnet = "10.\(200 + Int.random(in: 0...50)).\(Int.random(in: 0...255))"
        hostAddress = "\(subnet).1"
        try Self.ip(["netns", "add", name])
        do {
            try Self.ip(["link", "add", outside, "type", "veth", "peer", "name", inside])
            try Self.ip(["link", "set", inside, "netns", name])
            try Self.ip(["addr", "add", "\(hostAddress)/30", "dev", outside])
            try Self.ip(["link", "set", outside, "up"])
            try Self.ip(["netns", "exec", name, "ip", "addr", "add", "\(subnet).2/30", "dev", inside])
            try Self.ip(["netns", "exec", name, "ip", "link", "set", "lo", "up"])
            try setLink(up: true)
        } catch {
            try? Self.ip(["netns", "del", name])
            throw error
        }
    }

    /// The launcher that runs dld inside the namespace.
    var launcher: [String] { ["/usr/sbin/ip", "netns", "exec", name] }

    func setLink(up: Bool) throws {
        try Self.ip(["netns", "exec", name, "ip", "link", "set", inside, up ? "up" : "down"])
    }

    /// Deleting the namespace deletes its end of the pair, and so the other end too.
    func remove() { try? Self.ip(["netns", "del", name]) }

    static func ip(_ arguments: [String]) throws {
        let out = try runProgram("/usr/sbin/ip", arguments, environment: ProcessInfo.processInfo.environment)
        if out.status != 0 { throw HarnessError("ip \(arguments.joined(separator: " ")): \(out.stderr)") }
    }
}

/// Network awareness (issue 11): without a route to any network, jobs wait with `network`
/// without using up attempts, and are queued again when a route comes back, not at their
/// next retry time.
@Suite struct NetworkTests {
    @Test func jobsWaitForTheNetworkAndResumeWhenItIsBack() async throws {
        let namespace = try NetworkNamespace()
        defer { namespace.remove() }
        try await withStarted(try await TestOrigin.start(host: namespace.hostAddress)) { origin in
            // Retries an hour apart: only the route's return can queue the jobs again in time.
            let daemon = try DaemonHarness(
                config: """
                    read_timeout = 2
                    retry_base = 3600
                    retry_max_delay = 3600
                    max_attempts = 3
                    min_free = 0
                    """)
            daemon.launcher = namespace.launcher
            try daemon.start()
            defer { daemon.stop() }

            let size = 2_000_000
            let slow = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/\(size)?rate=400000"), "name": "slow.bin"])
            _ = try daemon.waitForJob(slow) { $0["state"] == "running" && ($0["received"]?.int64Value ?? 0) > 0 }

            try namespace.setLink(up: false)
            let waiting = try daemon.waitForJob(slow, timeout: 60) { $0["state"] == "waiting" }
            #expect(waiting["wait_reason"] == "network", "\(waiting.serializedString())")
            #expect(waiting["attempts"]?.int64Value == 0, "an attempt without a network is not counted: \(waiting.serializedString())")
            let late = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/1000"), "name": "late.bin"])
            let lateWaiting = try daemon.waitForJob(late, timeout: 60) { $0["state"] == "waiting" }
            #expect(
                lateWaiting["wait_reason"] == "network" && lateWaiting["attempts"]?.int64Value == 0, "\(lateWaiting.serializedString())")

            try namespace.setLink(up: true)
            for id in [slow, late] {
                let job = try daemon.waitForJob(id, timeout: 60) { ["completed", "failed"].contains($0["state"]?.stringValue ?? "") }
                #expect(job["state"] == "completed", "\(job.serializedString())")
            }
            try expectOriginBytes(at: daemon.downloadDir + "/slow.bin", count: size)
            #expect(daemon.waitForLog("the network is back"), "the route monitor saw the link come back")
        }
    }
}
