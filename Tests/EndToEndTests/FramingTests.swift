import DLRPC
import DLTestSupport
import Foundation
import Testing

/// The control socket's framing as clients use it (docs/protocol.md, Transport): `\r\n` line
/// ends, a client that shuts down its sending side after its requests (`echo … | socat`), and
/// a last request without its `\n`. The client is a separate program on a real socket.
@Suite(.serialized) struct FramingTests {
    /// Sends `payload` on a new connection to the daemon's socket, shuts down the sending side,
    /// and returns every reply line read until the daemon closes the connection (or 30 s pass:
    /// then `closed` is false).
    private func exchange(_ daemon: DaemonHarness, _ payload: String) throws -> (lines: [JSONValue], closed: Bool) {
        let client = """
            import socket, sys
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(sys.argv[1])
            s.sendall(sys.argv[2].encode())
            s.shutdown(socket.SHUT_WR)
            s.settimeout(30)
            out = b""
            try:
                while True:
                    chunk = s.recv(65536)
                    if not chunk:
                        sys.stdout.write(out.decode() + "\\n<closed>\\n")
                        break
                    out += chunk
            except socket.timeout:
                sys.stdout.write(out.decode() + "\\n<timeout>\\n")
            """
        let run = try runProgram("/usr/bin/python3", ["-c", client, daemon.socket, payload])
        guard run.status == 0 else { throw HarnessError("the client failed: \(run.stderr)") }
        let lines = run.stdout.split(separator: "\n").map(String.init)
        let replies = try lines.filter { $0.hasPrefix("{") || $0.hasPrefix("[") }.map { try JSONValue.parse(Data($0.utf8)) }
        return (replies, lines.last == "<closed>")
    }

    private static func request(_ id: Int, _ method: String) -> String {
        #"{"jsonrpc":"2.0","id":\#(id),"method":"\#(method)"}"#
    }

    /// Lines ending in `\r\n` are requests like any other; after a half-close every reply is
    /// still written, in order, then the daemon closes the connection.
    @Test func crlfAndHalfClose() throws {
        let daemon = try DaemonHarness()
        try daemon.start()
        defer { daemon.stop() }
        let (replies, closed) = try exchange(daemon, Self.request(1, "version") + "\r\n" + Self.request(2, "stats") + "\r\n")
        #expect(replies.map { $0["id"] } == [1, 2], "\(replies)")
        #expect(replies[safe: 0]?["result"]?["protocol"] == 3, "\(replies)")
        #expect(replies[safe: 1]?["result"]?["counts"] != nil, "\(replies)")
        #expect(closed, "the daemon did not close the half-closed connection")
    }

    /// A last request without its `\n`, then a half-close: it is answered, after the ones
    /// before it.
    @Test func lastRequestWithoutNewline() throws {
        let daemon = try DaemonHarness()
        try daemon.start()
        defer { daemon.stop() }
        let (replies, closed) = try exchange(daemon, Self.request(1, "version") + "\n" + Self.request(2, "version"))
        #expect(replies.map { $0["id"] } == [1, 2], "\(replies)")
        #expect(replies.allSatisfy { $0["result"]?["protocol"] == 3 }, "\(replies)")
        #expect(closed)
        // Alone, too.
        let (single, _) = try exchange(daemon, Self.request(7, "version"))
        #expect(single.map { $0["id"] } == [7], "\(single)")
    }

    /// A half-close while a reply is being prepared (a batch of enqueues): the reply still
    /// comes, and the jobs exist.
    @Test func halfCloseDuringAnEnqueue() throws {
        let daemon = try DaemonHarness()
        try daemon.start()
        defer { daemon.stop() }
        let jobs = (0..<500).map { #"{"url":"http://127.0.0.1:9/f\#($0)","name":"f\#($0)","paused":true}"# }.joined(separator: ",")
        let enqueue = #"{"jsonrpc":"2.0","id":3,"method":"enqueue","params":{"jobs":[\#(jobs)]}}"#
        let (replies, closed) = try exchange(daemon, enqueue + "\n")
        #expect(replies.first?["result"]?["count"] == 500, "\(replies)")
        #expect(closed)
        #expect(try daemon.call("stats")["counts"]?["paused"] == 500)
    }
}

extension Array {
    subscript(safe index: Int) -> Element? { indices.contains(index) ? self[index] : nil }
}
