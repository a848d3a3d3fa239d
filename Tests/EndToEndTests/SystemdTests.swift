import DLCore
import DLRPC
import DLTestSupport
import Foundation
import Testing

/// dld as a systemd service (issue 10): sd_notify readiness, status, watchdog and stopping,
/// spoken to a datagram socket standing in for `$NOTIFY_SOCKET`; socket activation by
/// `systemd-socket-activate` (Debian's `systemd` package), which binds the socket and starts
/// dld at the first connection, as `dld.socket` does.
@Suite(.serialized) struct SystemdTests {
    /// `READY=1` comes only once the socket answers; `STATUS=` lines say what runs;
    /// `WATCHDOG=1` comes when `WATCHDOG_USEC` asks for it; SIGTERM brings `STOPPING=1` and
    /// `EXTEND_TIMEOUT_USEC` while the transfers are synced.
    @Test func notifyReadyStatusWatchdogAndStopping() throws {
        let daemon = try DaemonHarness()
        let notify = try NotifySocket(path: daemon.root + "/notify.sock")
        daemon.extraEnvironment["NOTIFY_SOCKET"] = notify.path
        daemon.extraEnvironment["WATCHDOG_USEC"] = "400000"
        try daemon.launch()
        defer { daemon.stop() }
        let beforeReady = try #require(notify.receive(until: "READY=1", timeout: 30), "no READY=1:\n\(daemon.log)")
        // Ready means served: the first call after READY=1 is answered.
        #expect(try daemon.call("version")["protocol"] == 3)
        #expect(beforeReady.count == 1, "messages before READY=1: \(beforeReady)")

        let paused = try daemon.enqueue(["url": "http://127.0.0.1:9/x", "name": "x.bin", "paused": true])
        #expect(try daemon.job(paused)["state"] == "paused")
        let heartbeat = try #require(notify.receive(until: "WATCHDOG=1", timeout: 30), "no WATCHDOG=1:\n\(daemon.log)")
        let statuses = heartbeat.flatMap { $0.split(separator: "\n") }.filter { $0.hasPrefix("STATUS=") }
        #expect(statuses.contains { $0.contains("running") && $0.contains("queued") && $0.contains("B/s") }, "\(heartbeat)")

        daemon.send(SIGTERM)
        let stopping = try #require(notify.receive(until: "STOPPING=1", timeout: 30), "no STOPPING=1:\n\(daemon.log)")
        // The message that says STOPPING=1 also says why, for `systemctl status`.
        let stoppingLines = stopping.last.map { $0.split(separator: "\n").map(String.init) } ?? []
        #expect(stoppingLines.contains("STATUS=stopping: checkpointing transfers"), "\(stopping)")
        let after = notify.receive(until: "EXTEND_TIMEOUT_USEC=20000000", timeout: 30)
        #expect(after != nil, "no EXTEND_TIMEOUT_USEC while stopping")
        #expect(daemon.stop() == 0)
    }

    /// Without `WATCHDOG_USEC` no clock drives the status line (an idle dld is not woken for
    /// it): it follows the queue, so a job that comes to wait shows in a later `STATUS=`.
    @Test func statusFollowsTheQueueWithoutWatchdog() throws {
        let daemon = try DaemonHarness()
        let notify = try NotifySocket(path: daemon.root + "/notify.sock")
        daemon.extraEnvironment["NOTIFY_SOCKET"] = notify.path
        try daemon.launch()
        defer { daemon.stop() }
        #expect(notify.receive(until: "READY=1", timeout: 30) != nil)
        // Nothing listens on port 9: the attempt fails and the job waits to be retried.
        _ = try daemon.enqueue(["url": "http://127.0.0.1:9/x", "name": "x.bin"])
        let deadline = Date().addingTimeInterval(30)
        var seen: [String] = []
        while Date() < deadline, !seen.contains(where: { $0.hasPrefix("STATUS=") && $0.contains("1 waiting") }) {
            if let message = notify.receive(timeout: max(0.01, deadline.timeIntervalSinceNow)) {
                seen += message.split(separator: "\n").map(String.init)
            }
        }
        #expect(
            seen.contains { $0.hasPrefix("STATUS=") && $0.contains("1 waiting") }, "no STATUS= with the waiting job: \(seen)\n\(daemon.log)"
        )
    }

    /// Without `$NOTIFY_SOCKET` nothing is sent and nothing changes (checked by every other test);
    /// with a `WATCHDOG_PID` of another process the watchdog is not this one's to feed.
    @Test func watchdogForAnotherProcessIsNotFed() throws {
        let daemon = try DaemonHarness()
        let notify = try NotifySocket(path: daemon.root + "/notify.sock")
        daemon.extraEnvironment["NOTIFY_SOCKET"] = notify.path
        daemon.extraEnvironment["WATCHDOG_USEC"] = "200000"
        daemon.extraEnvironment["WATCHDOG_PID"] = "1"
        try daemon.launch()
        defer { daemon.stop() }
        #expect(notify.receive(until: "READY=1", timeout: 30) != nil)
        // The STATUS= line still comes, without WATCHDOG=1 (both would go in one message).
        let status = try #require(notify.receive(timeout: 15))
        #expect(status.contains("STATUS=") && !status.contains("WATCHDOG=1"), "\(status)")
    }

    /// `systemd-socket-activate` binds the socket and starts dld at the first connection: the
    /// first `dlctl` works although no dld ran, dld serves the socket it was handed (a real
    /// download through it), another user is still refused by the peer-uid check, and the
    /// socket file, systemd's, is left in place when dld stops.
    @Test func socketActivation() async throws {
        let daemon = try DaemonHarness()
        daemon.launcher = ["/usr/bin/systemd-socket-activate", "--listen=" + daemon.socket, "--fdname=dld"]
        let origin = try await TestOrigin.start()
        do {
            try daemon.launch()
            defer { daemon.stop() }
            let deadline = Date().addingTimeInterval(20)
            while (!FileManager.default.fileExists(atPath: daemon.socket) || daemon.pid == nil) && Date() < deadline { usleep(20_000) }
            // Proof that dld has not started (its log line could still be on its way): the
            // launched process is still systemd-socket-activate, which becomes dld by exec.
            let launched = try #require(daemon.pid, "the launcher wrote no pid")
            let program = try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(launched)/exe")
            #expect(program.hasSuffix("/systemd-socket-activate"), "dld started before any connection: \(program)\n\(daemon.log)")

            let first = try daemon.dlctl(["status"])
            #expect(first.status == 0, "\(first.stderr)\n\(daemon.log)")
            #expect(daemon.waitForLog("socket_from=systemd"), "\(daemon.log)")
            let enqueued = try daemon.dlctl(["enqueue", "\(origin.baseURL)/bytes/30000", "--name", "activated.bin"])
            #expect(enqueued.status == 0, "\(enqueued.stderr)")
            let id = try #require(Int64(enqueued.stdout.trimmingCharacters(in: .whitespacesAndNewlines)), "\(enqueued.stdout)")
            #expect(try daemon.waitForState(id, ["completed", "failed", "waiting"])["state"] == "completed")
            try expectOriginBytes(at: daemon.downloadDir + "/activated.bin", count: 30000)

            // The folder and socket as open as a careless unit could make them: only the uid
            // check stands.
            let other = try listAsNobody(daemon)
            #expect(other.status == 0, "\(other.stderr)")
            #expect(other.stdout.contains("permission denied") && !other.stdout.contains("\"jobs\""), "\(other.stdout)")
            #expect(daemon.waitForLog("uid=65534"), "\(daemon.log.suffix(2000))")

            let log = daemon.log
            #expect(daemon.stop() == 0, "\(log.suffix(3000))")
            #expect(FileManager.default.fileExists(atPath: daemon.socket), "dld removed the socket file systemd owns")
        } catch {
            try? await origin.shutdown()
            throw error
        }
        try await origin.shutdown()
    }

    /// dld-http.socket: systemd binds the HTTP port beside the control socket. The first
    /// connection is an HTTP request: it starts dld, which serves that socket (not its own
    /// http_listen) with its checks (no token: 401), writes its URL to http-url, and answers
    /// JSON-RPC on it; the control socket passed with it is served too.
    @Test func httpSocketActivation() throws {
        let daemon = try DaemonHarness()
        let port = try freeLoopbackPort()
        let configured = try freeLoopbackPort()
        daemon.httpListen = "127.0.0.1:\(configured)"
        daemon.launcher = [
            "/usr/bin/systemd-socket-activate", "--listen=" + daemon.socket, "--listen=127.0.0.1:\(port)", "--fdname=dld:dld-http",
        ]
        try daemon.launch()
        defer { daemon.stop() }
        let web = WebDaemon(running: daemon, port: port)
        // dld starts with this connection waiting: a generous timeout for a loaded machine.
        let first = try connectOnceListening(port: port)
        first.send("GET / HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nConnection: close\r\n\r\n")
        #expect(try RawResponse(first.receiveAll()).status == 401, "\(daemon.log)")
        #expect(daemon.waitForLog("socket_from=systemd"), "\(daemon.log)")
        let url = try String(contentsOfFile: daemon.stateDir + "/http-url", encoding: .utf8)
        #expect(url.trimmingCharacters(in: .whitespacesAndNewlines) == "http://127.0.0.1:\(port)/", "\(url)")
        #expect(daemon.log.contains("http_listen is not used"), "\(daemon.log)")
        let reply = try web.rpc(#"{"jsonrpc":"2.0","id":1,"method":"version"}"#)
        #expect(reply.status == 200 && String(decoding: reply.body, as: UTF8.self).contains("\"protocol\":3"), "\(reply.status)")
        #expect(try web.request("GET", "/", headers: [("Host", "evil.example")]).status == 421)
        #expect(try daemon.dlctl(["status"]).status == 0)
        #expect(throws: HarnessError.self) { try RawConnection(port: configured, timeout: 2) }
    }

    /// A passed HTTP socket beyond loopback without TLS stops dld with the reason, as
    /// http_listen would.
    @Test func httpSocketBeyondLoopbackNeedsTLS() throws {
        let daemon = try DaemonHarness()
        let port = try freeLoopbackPort()
        daemon.launcher = [
            "/usr/bin/systemd-socket-activate", "--listen=" + daemon.socket, "--listen=0.0.0.0:\(port)", "--fdname=dld:dld-http",
        ]
        try daemon.launch()
        defer { daemon.stop() }
        let first = try connectOnceListening(port: port)
        first.send("GET / HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nConnection: close\r\n\r\n")
        _ = first.receiveAll()
        #expect(daemon.waitForLog("is beyond loopback: set http_cert and http_key"), "\(daemon.log)")
        #expect(daemon.stop() != 0)
    }

    /// A connection to the port systemd-socket-activate binds, once it has bound it (it is
    /// refused until then).
    private func connectOnceListening(port: Int) throws -> RawConnection {
        let deadline = Date().addingTimeInterval(30)
        while true {
            do {
                return try RawConnection(port: port, timeout: 60)
            } catch  where Date() < deadline {
                usleep(50_000)
            }
        }
    }
}
