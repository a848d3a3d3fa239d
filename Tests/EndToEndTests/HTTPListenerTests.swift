import DLRPC
import DLTestSupport
import Foundation
import Synchronization
import Testing

/// A free TCP port on 127.0.0.1 at this moment (bound to port 0 and released).
func freePort() throws -> Int { try freeLoopbackPort() }

/// A listening socket on 127.0.0.1:`port` (to make the port busy), or nil if it is busy already.
func occupy(port: Int) -> Int32? {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard fd >= 0 else { return nil }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    address.sin_port = UInt16(port).bigEndian
    let ok = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
    }
    guard ok, listen(fd, 8) == 0 else {
        close(fd)
        return nil
    }
    return fd
}

/// A blocking TCP connection to 127.0.0.1, for raw HTTP and WebSocket bytes.
final class RawConnection {
    let fd: Int32

    init(port: Int, timeout: Int = 10) throws {
        fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw HarnessError("socket failed") }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = UInt16(port).bigEndian
        var limit = timeval(tv_sec: timeout, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, socklen_t(MemoryLayout<timeval>.size))
        let ok = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
        }
        guard ok else {
            close(fd)
            throw HarnessError("connect to \(port) failed: \(String(cString: strerror(errno)))")
        }
    }

    deinit { close(fd) }

    /// Writes all of it; false when the peer closed first (a refused upload).
    @discardableResult
    func send(_ data: Data) -> Bool {
        data.withUnsafeBytes { raw in
            var offset = 0
            while offset < raw.count {
                let n = Glibc.send(fd, raw.baseAddress.map { $0 + offset }, raw.count - offset, Int32(MSG_NOSIGNAL))
                if n <= 0 { return false }
                offset += n
            }
            return true
        }
    }

    func send(_ text: String) { send(Data(text.utf8)) }

    /// Some bytes, or empty at the end (or the timeout).
    func receive() -> Data {
        var buffer = [UInt8](repeating: 0, count: 65536)
        let n = recv(fd, &buffer, buffer.count, 0)
        return n > 0 ? Data(buffer[0..<n]) : Data()
    }

    /// Whether bytes (or the peer's close) are there to read now, without waiting.
    var hasInput: Bool {
        var byte: UInt8 = 0
        let n = recv(fd, &byte, 1, Int32(MSG_PEEK | MSG_DONTWAIT))
        return n >= 0
    }

    /// Everything until the peer closes.
    func receiveAll() -> Data {
        var all = Data()
        while true {
            let part = receive()
            if part.isEmpty { return all }
            all.append(part)
        }
    }
}

/// An HTTP response as read off the wire.
struct RawResponse {
    var status: Int
    var headers: [(String, String)]
    var body: Data

    func header(_ name: String) -> String? { headers.first { $0.0.lowercased() == name.lowercased() }?.1 }
    var text: String { String(decoding: body, as: UTF8.self) }

    /// Parses what a `Connection: close` exchange returned.
    init(_ data: Data) throws {
        guard let split = data.firstRange(of: Data("\r\n\r\n".utf8)) else {
            throw HarnessError("no HTTP response: \(String(decoding: data.prefix(300), as: UTF8.self))")
        }
        let head = String(decoding: data[..<split.lowerBound], as: UTF8.self).components(separatedBy: "\r\n")
        let statusLine = head.first?.split(separator: " ") ?? []
        guard statusLine.count >= 2, let code = Int(statusLine[1]) else { throw HarnessError("bad status line \(head.first ?? "")") }
        status = code
        headers = head.dropFirst().compactMap { line in
            guard let colon = line.firstIndex(of: ":") else { return nil }
            return (String(line[..<colon]), line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces))
        }
        body = Data(data[split.upperBound...])
    }
}

/// A daemon with its HTTP listener on a free port, and requests to it.
struct WebDaemon {
    let daemon: DaemonHarness
    let port: Int

    init(config: String? = nil, environment: [String: String] = [:]) throws {
        daemon = try DaemonHarness(config: config)
        daemon.extraEnvironment.merge(environment) { _, new in new }
        port = try freePort()
        daemon.httpListen = "127.0.0.1:\(port)"
        try daemon.start()
    }

    /// A daemon started otherwise (under systemd-socket-activate) that serves `port`.
    init(running daemon: DaemonHarness, port: Int) {
        self.daemon = daemon
        self.port = port
    }

    var token: String {
        get throws {
            try String(contentsOfFile: daemon.stateDir + "/http-token", encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
        }
    }

    /// One request on a fresh connection (`Connection: close`); headers as given, Host and
    /// Authorization added unless given.
    func request(
        _ method: String, _ path: String, body: Data = Data(), headers: [(String, String)] = [], auth: Bool = true
    ) throws -> RawResponse {
        var all = headers
        if !all.contains(where: { $0.0.lowercased() == "host" }) { all.append(("Host", "127.0.0.1:\(port)")) }
        if auth, !all.contains(where: { $0.0.lowercased() == "authorization" }) { all.append(("Authorization", "Bearer \(try token)")) }
        all.append(("Content-Length", "\(body.count)"))
        all.append(("Connection", "close"))
        let connection = try RawConnection(port: port)
        var message = Data("\(method) \(path) HTTP/1.1\r\n".utf8)
        for (name, value) in all { message.append(Data("\(name): \(value)\r\n".utf8)) }
        message.append(Data("\r\n".utf8))
        message.append(body)
        connection.send(message)
        return try RawResponse(connection.receiveAll())
    }

    /// A JSON-RPC request over POST /rpc.
    func rpc(_ json: String, headers: [(String, String)] = [("Content-Type", "application/json")]) throws -> RawResponse {
        try request("POST", "/rpc", body: Data(json.utf8), headers: headers)
    }

    /// The same line on the socket, its one reply line.
    func socketReply(_ json: String) throws -> String {
        let client = RPCClient(socketPath: daemon.socket)
        defer { client.close() }
        try client.sendLine(Data(json.utf8))
        return String(decoding: try client.readLine(), as: UTF8.self)
    }
}

@Suite(.serialized) struct HTTPListenerTests {
    /// The URL served is written to <state_dir>/http-url (0600), with the token beside it.
    @Test func writesItsURLAndToken() throws {
        let web = try WebDaemon()
        defer { web.daemon.stop() }
        let url = try String(contentsOfFile: web.daemon.stateDir + "/http-url", encoding: .utf8)
        #expect(url == "http://127.0.0.1:\(web.port)/\n")
        for file in ["http-url", "http-token"] {
            let mode = try FileManager.default.attributesOfItem(atPath: web.daemon.stateDir + "/" + file)[.posixPermissions] as? Int
            #expect(mode == 0o600, "\(file)")
        }
        #expect(try web.token.count == 64)
    }

    /// The token stays the same across restarts (a bookmarked login keeps working).
    @Test func theTokenIsKept() throws {
        let daemon = try DaemonHarness()
        daemon.httpListen = "127.0.0.1:\(try freePort())"
        try daemon.start()
        let first = try String(contentsOfFile: daemon.stateDir + "/http-token", encoding: .utf8)
        daemon.stop()
        daemon.httpListen = "127.0.0.1:\(try freePort())"
        try daemon.start()
        defer { daemon.stop() }
        #expect(try String(contentsOfFile: daemon.stateDir + "/http-token", encoding: .utf8) == first)
    }

    /// An explicit port that is busy stops dld at start with a message; so does an address
    /// beyond loopback without TLS.
    @Test func startUpErrors() throws {
        let port = try freePort()
        let fd = try #require(occupy(port: port))
        defer { close(fd) }
        let busy = try DaemonHarness()
        busy.httpListen = "127.0.0.1:\(port)"
        #expect(throws: HarnessError.self) { try busy.start() }
        busy.stop()
        #expect(busy.log.contains("dld: http_listen 127.0.0.1:\(port): the port is in use"), "\(busy.log)")

        let open = try DaemonHarness()
        open.httpListen = "0.0.0.0:\(try freePort())"
        #expect(throws: HarnessError.self) { try open.start() }
        open.stop()
        #expect(open.log.contains("is beyond loopback: set http_cert and http_key"), "\(open.log)")
    }

    /// A start-up that fails after the socket was bound (here on a busy HTTP port) ends with
    /// its reason even while clients keep connecting: a connection accepted as the socket
    /// closes is closed, not dropped into NIO's trap for an unfinished writer (which crashed
    /// dld in 8 of 10 such starts).
    @Test func aFailedStartUpWithClientsConnectingEndsWithItsReason() throws {
        let port = try freePort()
        let fd = try #require(occupy(port: port))
        defer { close(fd) }
        for _ in 0..<5 {
            let busy = try DaemonHarness()
            busy.httpListen = "127.0.0.1:\(port)"
            let socket = busy.socket
            let done = Atomic(false)
            let clients = (0..<3).map { _ in
                Thread {
                    var held: [RPCClient] = []
                    while !done.load(ordering: .relaxed) {
                        let client = RPCClient(socketPath: socket)
                        if (try? client.connect()) != nil { held.append(client) } else { usleep(500) }
                    }
                    for client in held { client.close() }
                }
            }
            for client in clients { client.start() }
            #expect(throws: HarnessError.self) { try busy.start() }
            done.store(true, ordering: .relaxed)
            busy.stop()
            #expect(busy.log.contains("dld: http_listen 127.0.0.1:\(port): the port is in use"), "\(busy.log)")
            #expect(!busy.log.contains("Fatal error"), "\(busy.log)")
        }
    }

    /// With no http_listen, a busy 6802 moves on to the next free port, logged and in http-url.
    @Test func theDefaultPortMovesOn() throws {
        let held = occupy(port: 6802)
        defer { if let held { close(held) } }
        let daemon = try DaemonHarness()
        daemon.httpListen = nil
        try daemon.start()
        defer { daemon.stop() }
        let url = try String(contentsOfFile: daemon.stateDir + "/http-url", encoding: .utf8)
        let port = try #require(Int(url.split(separator: ":").last?.prefix { $0.isNumber } ?? ""), "\(url)")
        #expect((6803...6811).contains(port), "\(url)")
        #expect(daemon.log.contains("HTTP port 6802 was in use"), "\(daemon.log)")
        let response = try RawResponse(
            {
                let connection = try RawConnection(port: port)
                connection.send("GET / HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nConnection: close\r\n\r\n")
                return connection.receiveAll()
            }())
        #expect(response.status == 401)
    }

    /// POST /rpc answers as the socket does: the same bytes for the same request line.
    @Test func rpcAnswersAsTheSocket() throws {
        let web = try WebDaemon()
        defer { web.daemon.stop() }
        let requests = [
            #"{"jsonrpc":"2.0","id":1,"method":"version"}"#,
            #"{"jsonrpc":"2.0","id":"s","method":"stats"}"#,
            #"{"jsonrpc":"2.0","id":2,"method":"list","params":{"limit":5}}"#,
            #"{"jsonrpc":"2.0","id":3,"method":"status","params":{"id":99}}"#,
            #"{"jsonrpc":"2.0","id":4,"method":"nope"}"#,
            #"[{"jsonrpc":"2.0","id":"a","method":"version"},{"jsonrpc":"2.0","method":"stats"}]"#,
            #"{"jsonrpc":"2.0","id":5"#,
        ]
        for line in requests {
            let response = try web.rpc(line)
            #expect(response.status == 200, "\(line): \(response.text)")
            #expect(response.header("content-type") == "application/json")
            #expect(response.text == (try web.socketReply(line)), "\(line)")
        }
        // Only notifications: nothing to answer.
        #expect(try web.rpc(#"{"jsonrpc":"2.0","method":"stats"}"#).status == 204)
        // subscribe needs /ws.
        let subscribe = try JSONValue.parse(Data(try web.rpc(#"{"jsonrpc":"2.0","id":7,"method":"subscribe"}"#).body))
        #expect(subscribe["error"]?["data"]?["code"] == "invalid_request")
        #expect(subscribe["error"]?["message"]?.stringValue?.contains("/ws") == true)
        #expect(try web.rpc("{}", headers: [("Content-Type", "text/plain")]).status == 415)
    }

    /// `shutdown` over HTTP stops dld as on the socket.
    @Test func shutdownOverHTTP() throws {
        let web = try WebDaemon()
        defer { web.daemon.stop() }
        let response = try web.rpc(#"{"jsonrpc":"2.0","id":1,"method":"shutdown"}"#)
        #expect(response.text == #"{"id":1,"jsonrpc":"2.0","result":{"ok":true}}"#)
        let deadline = Date().addingTimeInterval(20)
        while web.daemon.isRunning && Date() < deadline { usleep(50_000) }
        #expect(!web.daemon.isRunning)
    }

    /// No token, a wrong one: 401 (the wrong one logged); /login with the right one sets a
    /// cookie that then works.
    @Test func theTokenIsRequired() throws {
        let web = try WebDaemon()
        defer { web.daemon.stop() }
        let version = #"{"jsonrpc":"2.0","id":1,"method":"version"}"#
        let json = [("Content-Type", "application/json")]
        #expect(try web.request("POST", "/rpc", body: Data(version.utf8), headers: json, auth: false).status == 401)
        let wrong = String(repeating: "0", count: 64)
        #expect(
            try web.request("POST", "/rpc", body: Data(version.utf8), headers: json + [("Authorization", "Bearer \(wrong)")]).status == 401)
        #expect(try web.request("GET", "/", headers: [("Cookie", "dld_token=\(wrong)")], auth: false).status == 401)
        #expect(web.daemon.log.contains("wrong token"))
        #expect(try web.request("GET", "/login?token=\(wrong)", auth: false).status == 401)
        let login = try web.request("GET", "/login?token=\(try web.token)", auth: false)
        #expect(login.status == 303)
        #expect(login.header("location") == "/")
        let cookie = try #require(login.header("set-cookie"))
        #expect(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict") && cookie.contains("Path=/"))
        let pair = String(cookie.prefix { $0 != ";" })
        #expect(try web.request("POST", "/rpc", body: Data(version.utf8), headers: json + [("Cookie", pair)], auth: false).status == 200)
    }

    /// DNS rebinding and CSRF: a foreign Host is refused; a foreign Origin on a POST or an
    /// upgrade is refused; the listener's own origin passes.
    @Test func hostAndOriginChecks() throws {
        let web = try WebDaemon()
        defer { web.daemon.stop() }
        let version = Data(#"{"jsonrpc":"2.0","id":1,"method":"version"}"#.utf8)
        let json = ("Content-Type", "application/json")
        #expect(try web.request("POST", "/rpc", body: version, headers: [json, ("Host", "evil.example:\(web.port)")]).status == 421)
        #expect(try web.request("POST", "/rpc", body: version, headers: [json, ("Host", "127.0.0.1:1")]).status == 421)
        #expect(try web.request("POST", "/rpc", body: version, headers: [json, ("Host", "localhost:\(web.port)")]).status == 200)
        #expect(try web.request("POST", "/rpc", body: version, headers: [json, ("Origin", "http://evil.example")]).status == 403)
        #expect(try web.request("POST", "/rpc", body: version, headers: [json, ("Origin", "null")]).status == 403)
        #expect(try web.request("POST", "/rpc", body: version, headers: [json, ("Origin", "http://127.0.0.1:\(web.port)")]).status == 200)
        let upgrade = [
            ("Origin", "http://evil.example"), ("Upgrade", "websocket"), ("Connection", "Upgrade"), ("Sec-WebSocket-Version", "13"),
            ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ]
        #expect(try web.request("GET", "/ws", headers: upgrade).status == 403, "\(web.daemon.log)")
    }

    /// Hostile input gets HTTP errors, and dld answers on the socket afterwards.
    @Test func hostileInput() throws {
        let web = try WebDaemon(config: "max_line_bytes = 65536\nmax_connections = 8\n")
        defer { web.daemon.stop() }
        // A body over the limit, said in advance or not.
        #expect(try web.rpc(String(repeating: " ", count: 70000)).status == 413)
        let chunked = try RawConnection(port: web.port)
        chunked.send(
            "POST /rpc HTTP/1.1\r\nHost: 127.0.0.1:\(web.port)\r\nAuthorization: Bearer \(try web.token)\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        for _ in 0..<20 where chunked.send(Data("1000\r\n\(String(repeating: "x", count: 4096))\r\n".utf8)) {}
        #expect(try RawResponse(chunked.receiveAll()).status == 413)
        // Headers over the parser's limit, a garbage request line.
        let huge = try web.request("GET", "/", headers: [("X-Big", String(repeating: "a", count: 200_000))])
        #expect(huge.status == 400 || huge.status == 431, "\(huge.status)")
        let garbage = try RawConnection(port: web.port)
        garbage.send("\u{1}\u{2} GARBAGE \r\n\r\n")
        #expect(try RawResponse(garbage.receiveAll()).status == 400)
        // Connections beyond max_connections: refused with 503 while the others stay open.
        // Each held one is answered once first, so that dld has counted it before the next.
        let held = try (0..<8).map { _ in
            let connection = try RawConnection(port: web.port)
            connection.send("GET / HTTP/1.1\r\nHost: 127.0.0.1:\(web.port)\r\n\r\n")
            _ = connection.receive()
            return connection
        }
        let extra = try RawConnection(port: web.port)
        #expect(try RawResponse(extra.receiveAll()).status == 503)
        withExtendedLifetime(held) {}
        #expect(try web.daemon.call("version")["protocol"] != nil)
    }
}

/// The listener under mutated requests (as the socket's JSON-RPC is fuzzed): valid requests of
/// every kind — the page, /login, POST /rpc with a body and with chunks, a WebSocket upgrade
/// and frames, aria2's /jsonrpc (POST, a multicall, GET with base64 params, a WebSocket) — with
/// bytes flipped, inserted, removed and repeated, and lines cut or doubled.
/// Each connection gets an HTTP answer or is closed, and dld stays up and answers both
/// transports after. The seed is in every failure message (replay with `DLD_TEST_SEED`).
@Suite(.serialized) struct HTTPListenerFuzzTests {
    @Test func mutatedRequestsNeverKillTheListener() throws {
        let web = try WebDaemon(config: "max_line_bytes = 65536\n")
        defer { web.daemon.stop() }
        let token = try web.token
        let host = "127.0.0.1:\(web.port)"
        let rpc = #"{"jsonrpc":"2.0","id":1,"method":"list","params":{"limit":2}}"#
        let frame: [UInt8] =
            [0x81, 0x80 | 10, 1, 2, 3, 4]
            + Array("{\"id\":1}\n ".utf8.prefix(10)).enumerated().map { $0.element ^ [1, 2, 3, 4][$0.offset % 4] }
        // aria2's JSON-RPC: a call, a multicall, a GET with base64 params, and a WebSocket.
        let secret = "\"token:\(token)\""
        let aria2 = #"{"jsonrpc":"2.0","id":"a","method":"aria2.tellActive","params":[\#(secret),["gid","status"]]}"#
        let multicall =
            #"{"jsonrpc":"2.0","id":"m","method":"system.multicall","params":[[{"methodName":"aria2.getGlobalStat","params":[\#(secret)]},"#
            + #"{"methodName":"aria2.tellWaiting","params":[\#(secret),-1,2]}]]}"#
        let params = Data("[\(secret)]".utf8).base64EncodedString()
        let aria2Frame: [UInt8] = {
            let payload = Array(aria2.utf8)
            return [0x81, 0x80 | 126, UInt8(payload.count >> 8), UInt8(payload.count & 0xff), 9, 8, 7, 6]
                + payload.enumerated().map { $0.element ^ [9, 8, 7, 6][$0.offset % 4] }
        }()
        let seeds: [Data] = [
            Data("GET / HTTP/1.1\r\nHost: \(host)\r\nCookie: dld_token=\(token)\r\nConnection: close\r\n\r\n".utf8),
            Data(
                ("POST /jsonrpc HTTP/1.1\r\nHost: \(host)\r\nContent-Type: application/json\r\nContent-Length: \(aria2.utf8.count)\r\n"
                    + "Connection: close\r\n\r\n\(aria2)").utf8),
            Data(
                ("POST /jsonrpc HTTP/1.1\r\nHost: \(host)\r\nContent-Length: \(multicall.utf8.count)\r\nConnection: close\r\n\r\n"
                    + multicall).utf8),
            Data("GET /jsonrpc?method=aria2.getVersion&id=g&params=\(params) HTTP/1.1\r\nHost: \(host)\r\nConnection: close\r\n\r\n".utf8),
            Data(
                ("GET /jsonrpc HTTP/1.1\r\nHost: \(host)\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                    + "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n").utf8) + Data(aria2Frame),
            Data("GET /login?token=\(token) HTTP/1.1\r\nHost: \(host)\r\nConnection: close\r\n\r\n".utf8),
            Data("GET /metrics HTTP/1.1\r\nHost: \(host)\r\nAuthorization: Bearer \(token)\r\nConnection: close\r\n\r\n".utf8),
            Data(
                ("POST /rpc HTTP/1.1\r\nHost: \(host)\r\nOrigin: http://\(host)\r\nAuthorization: Bearer \(token)\r\n"
                    + "Content-Type: application/json\r\nContent-Length: \(rpc.utf8.count)\r\nConnection: close\r\n\r\n\(rpc)").utf8),
            Data(
                ("POST /rpc HTTP/1.1\r\nHost: \(host)\r\nAuthorization: Bearer \(token)\r\nContent-Type: application/json\r\n"
                    + "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n\(String(rpc.utf8.count, radix: 16))\r\n\(rpc)\r\n0\r\n\r\n")
                    .utf8),
            Data(
                ("GET /ws HTTP/1.1\r\nHost: \(host)\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                    + "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nAuthorization: Bearer \(token)\r\n\r\n").utf8) + Data(frame),
        ]
        let specials: [UInt8] = [0, 0x0D, 0x0A, 0x3A, 0x20, 0xFF, 0x80, 0x25, 0x3F, 0x22, 0x7B]
        // The first seed once killed dld (a WebSocket upgrade with frames behind it: the
        // decoder's leftover bytes reached the upgrade gate, which took them for HTTP parts);
        // the second is new on each run.
        for seed in [8_242_189_781_702_187_837, SplitMix64.testSeed()] {
            try mutate(seeds, seed: seed, specials: specials, web: web)
        }
        #expect(try web.daemon.call("version")["protocol"] != nil, "\(web.daemon.log.suffix(3000))")
        #expect(try web.rpc(#"{"jsonrpc":"2.0","id":1,"method":"version"}"#).status == 200)
    }

    private func mutate(_ seeds: [Data], seed: UInt64, specials: [UInt8], web: WebDaemon) throws {
        var generator = SplitMix64(state: seed)
        for round in 0..<600 {
            var bytes = [UInt8](seeds[Int.random(in: 0..<seeds.count, using: &generator)])
            for _ in 0..<Int.random(in: 1...6, using: &generator) where !bytes.isEmpty {
                let at = Int.random(in: 0..<bytes.count, using: &generator)
                switch Int.random(in: 0..<6, using: &generator) {
                case 0: bytes[at] ^= UInt8.random(in: 1...255, using: &generator)
                case 1: bytes.insert(specials[Int.random(in: 0..<specials.count, using: &generator)], at: at)
                case 2: bytes.remove(at: at)
                case 3: bytes.insert(contentsOf: repeatElement(bytes[at], count: Int.random(in: 1...5000, using: &generator)), at: at)
                case 4: bytes = Array(bytes[..<at])
                default:
                    let end = min(bytes.count, at + Int.random(in: 1...80, using: &generator))
                    bytes.insert(contentsOf: bytes[at..<end], at: at)
                }
            }
            let connection: RawConnection
            do {
                connection = try RawConnection(port: web.port, timeout: 40)
            } catch {
                Issue.record("round \(round), seed \(seed): \(error)\n\(web.daemon.log.suffix(3000))")
                return
            }
            connection.send(Data(bytes))
            // A request cut short may wait for its rest: half-close so that dld sees the end.
            shutdown(connection.fd, Int32(SHUT_WR))
            let answer = connection.receiveAll()
            if !answer.isEmpty, !answer.starts(with: Data("HTTP/1.1 ".utf8)), !answer.starts(with: Data([0x81])) {
                Issue.record("round \(round), seed \(seed): not an HTTP answer: \(String(decoding: answer.prefix(200), as: UTF8.self))")
            }
        }
    }
}

/// A minimal WebSocket client over a raw connection (RFC 6455: masked frames out, whole
/// unfragmented frames in), enough to talk to dld's /ws.
final class RawWebSocket {
    let connection: RawConnection
    private var buffer = Data()
    /// The head of dld's 101 answer.
    private(set) var head = ""

    /// Connects and upgrades; throws with the response when dld refuses.
    init(port: Int, token: String?, origin: String? = nil, path: String = "/ws", protocols: [String] = []) throws {
        connection = try RawConnection(port: port)
        var request =
            "GET \(path) HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            + "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        if let token { request += "Authorization: Bearer \(token)\r\n" }
        if let origin { request += "Origin: \(origin)\r\n" }
        if !protocols.isEmpty { request += "Sec-WebSocket-Protocol: \(protocols.joined(separator: ", "))\r\n" }
        connection.send(request + "\r\n")
        while buffer.firstRange(of: Data("\r\n\r\n".utf8)) == nil {
            let part = connection.receive()
            if part.isEmpty { throw HarnessError("no upgrade response: \(String(decoding: buffer, as: UTF8.self))") }
            buffer.append(part)
        }
        let end = buffer.firstRange(of: Data("\r\n\r\n".utf8))?.upperBound ?? buffer.endIndex
        head = String(decoding: buffer[..<end], as: UTF8.self)
        guard head.hasPrefix("HTTP/1.1 101") else { throw HarnessError("upgrade refused: \(head)") }
        buffer = Data(buffer[end...])
    }

    func send(_ text: String, opcode: UInt8 = 1) {
        let payload = Array(text.utf8)
        var frame: [UInt8] = [0x80 | opcode]
        if payload.count < 126 {
            frame.append(0x80 | UInt8(payload.count))
        } else if payload.count < 65536 {
            frame.append(0x80 | 126)
            frame += [UInt8(payload.count >> 8), UInt8(payload.count & 0xff)]
        } else {
            frame.append(0x80 | 127)
            frame += (0..<8).reversed().map { UInt8((payload.count >> ($0 * 8)) & 0xff) }
        }
        let mask: [UInt8] = [1, 2, 3, 4]
        frame += mask
        frame += payload.enumerated().map { $0.element ^ mask[$0.offset % 4] }
        connection.send(Data(frame))
    }

    private func need(_ count: Int) throws {
        while buffer.count < count {
            let part = connection.receive()
            if part.isEmpty { throw HarnessError("WebSocket closed or silent") }
            buffer.append(part)
        }
    }

    /// The next frame: its opcode and payload.
    func receive() throws -> (opcode: UInt8, payload: Data) {
        try need(2)
        let bytes = [UInt8](buffer.prefix(2))
        var length = Int(bytes[1] & 0x7f)
        var offset = 2
        if length == 126 {
            try need(4)
            length = Int(buffer[buffer.startIndex + 2]) << 8 | Int(buffer[buffer.startIndex + 3])
            offset = 4
        } else if length == 127 {
            try need(10)
            length = (2..<10).reduce(0) { $0 << 8 | Int(buffer[buffer.startIndex + $1]) }
            offset = 10
        }
        try need(offset + length)
        let payload = Data(buffer[(buffer.startIndex + offset)..<(buffer.startIndex + offset + length)])
        buffer = Data(buffer[(buffer.startIndex + offset + length)...])
        return (bytes[0] & 0x0f, payload)
    }

    /// The next text message as JSON (pings answered by dld's side are not expected here).
    func receiveJSON() throws -> JSONValue {
        while true {
            let (opcode, payload) = try receive()
            if opcode == 1 { return try JSONValue.parse(payload) }
            if opcode == 8 { throw HarnessError("closed: \(payload.map { $0 })") }
        }
    }
}

extension HTTPListenerTests {
    /// Requests over /ws are answered as on the socket; subscribe pushes a job's change.
    @Test func webSocketRequestsAndEvents() throws {
        let web = try WebDaemon()
        defer { web.daemon.stop() }
        let socket = try RawWebSocket(port: web.port, token: try web.token)
        let version = #"{"jsonrpc":"2.0","id":1,"method":"version"}"#
        socket.send(version)
        #expect(try socket.receiveJSON() == JSONValue.parse(Data(try web.socketReply(version).utf8)))
        _ = try web.daemon.call("queue", ["paused": true])
        socket.send(#"{"jsonrpc":"2.0","id":2,"method":"subscribe"}"#)
        #expect(try socket.receiveJSON()["result"]?["seq"] != nil)
        let id = try web.daemon.enqueue(["url": "http://127.0.0.1:1/x"])
        _ = try web.daemon.call("pause", ["id": .int(id)])
        var states: [String] = []
        while !states.contains("paused") {
            let event = try socket.receiveJSON()
            guard event["method"] == "job.state", event["params"]?["id"]?.int64Value == id else { continue }
            states.append(event["params"]?["state"]?.stringValue ?? "?")
        }
        #expect(states == ["queued", "paused"])
    }

    /// A foreign origin, no token: the upgrade is refused with the reason.
    @Test func webSocketUpgradeChecks() throws {
        let web = try WebDaemon()
        defer { web.daemon.stop() }
        #expect(throws: HarnessError.self) { try RawWebSocket(port: web.port, token: try web.token, origin: "http://evil.example") }
        #expect(throws: HarnessError.self) { try RawWebSocket(port: web.port, token: String(repeating: "0", count: 64)) }
        _ = try RawWebSocket(port: web.port, token: try web.token, origin: "http://127.0.0.1:\(web.port)")
    }

    /// A browser's WebSocket sends the token as the subprotocol `dld.token.<token>` beside
    /// `dld`, which dld answers with (the extension's popup does so); a wrong one is refused as
    /// a wrong token, and the subprotocol is no credential outside an upgrade.
    @Test func theTokenAsASubprotocol() throws {
        let web = try WebDaemon(config: "http_origins = [\"chrome-extension://abcdefghijklmnop\"]\n")
        defer { web.daemon.stop() }
        let token = try web.token
        let socket = try RawWebSocket(
            port: web.port, token: nil, origin: "chrome-extension://abcdefghijklmnop", protocols: ["dld", "dld.token.\(token)"])
        #expect(socket.head.lowercased().contains("sec-websocket-protocol: dld\r\n"), "\(socket.head)")
        #expect(!socket.head.contains(token))
        socket.send(#"{"jsonrpc":"2.0","id":1,"method":"version"}"#)
        #expect(try socket.receiveJSON()["result"]?["protocol"] != nil)
        // Offered alone, the token still admits a client that needs no subprotocol back.
        _ = try RawWebSocket(port: web.port, token: nil, protocols: ["dld.token.\(token)"])
        let wrong = String(repeating: "0", count: 64)
        #expect(throws: HarnessError.self) { try RawWebSocket(port: web.port, token: nil, protocols: ["dld", "dld.token.\(wrong)"]) }
        #expect(throws: HarnessError.self) { try RawWebSocket(port: web.port, token: nil, protocols: ["dld"]) }
        #expect(
            throws: HarnessError.self,
            "a foreign origin stays refused"
        ) {
            try RawWebSocket(port: web.port, token: nil, origin: "http://evil.example", protocols: ["dld", "dld.token.\(token)"])
        }
        let post = try web.request(
            "POST", "/rpc", body: Data(#"{"jsonrpc":"2.0","id":1,"method":"version"}"#.utf8),
            headers: [("Content-Type", "application/json"), ("Sec-WebSocket-Protocol", "dld.token.\(token)")], auth: false)
        #expect(post.status == 401)
    }
}

extension HTTPListenerTests {
    /// `dlctl web` prints the login URL, which logs in.
    @Test func dlctlWebPrintsTheLoginURL() throws {
        let web = try WebDaemon()
        defer { web.daemon.stop() }
        let out = try web.daemon.dlctl(["web", "--state-dir", web.daemon.stateDir, "--no-open"])
        #expect(out.status == 0, "\(out.stderr)")
        let url = out.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(url == "http://127.0.0.1:\(web.port)/login?token=\(try web.token)")
        let path = String(url.dropFirst("http://127.0.0.1:\(web.port)".count))
        #expect(try web.request("GET", path, auth: false).status == 303)
        web.daemon.stop()
        let stopped = try web.daemon.dlctl(["web", "--state-dir", web.daemon.stateDir, "--no-open"])
        #expect(stopped.status == 69, "no http-url once dld stopped")
    }
}

extension HTTPListenerTests {
    /// With http_cert and http_key, dld listens beyond loopback over TLS; the URL it writes is
    /// one this machine can open, and the login cookie is Secure.
    @Test func tlsBeyondLoopback() throws {
        let daemon = try DaemonHarness()
        let ca = try TestCA.make(in: daemon.root + "/ca")
        let files = try ca.issue("web")
        try "http_cert = \"\(files.certificatePath)\"\nhttp_key = \"\(files.keyPath)\"\n".write(
            toFile: daemon.root + "/web.toml", atomically: true, encoding: .utf8)
        daemon.extraArguments += ["--config", daemon.root + "/web.toml"]
        let port = try freePort()
        daemon.httpListen = "0.0.0.0:\(port)"
        try daemon.start()
        defer { daemon.stop() }
        let url = try String(contentsOfFile: daemon.stateDir + "/http-url", encoding: .utf8)
        #expect(url == "https://127.0.0.1:\(port)/\n")
        let token = try String(contentsOfFile: daemon.stateDir + "/http-token", encoding: .utf8).trimmingCharacters(
            in: .whitespacesAndNewlines)
        let version = try runProgram(
            "/usr/bin/curl",
            [
                "-s", "--cacert", ca.certificatePath, "-H", "Authorization: Bearer \(token)", "-H", "Content-Type: application/json",
                "-d", #"{"jsonrpc":"2.0","id":1,"method":"version"}"#, "https://127.0.0.1:\(port)/rpc",
            ])
        #expect(version.status == 0, "\(version.stderr)")
        #expect(try JSONValue.parse(Data(version.stdout.utf8))["result"]?["protocol"] != nil, "\(version.stdout)")
        let login = try runProgram(
            "/usr/bin/curl",
            ["-s", "-D", "-", "-o", "/dev/null", "--cacert", ca.certificatePath, "https://127.0.0.1:\(port)/login?token=\(token)"])
        #expect(login.stdout.contains("HttpOnly; SameSite=Strict; Path=/; Secure"), "\(login.stdout)")
        // Plain HTTP on the TLS port gets nowhere.
        let plain = try runProgram("/usr/bin/curl", ["-s", "-o", "/dev/null", "-w", "%{http_code}", "http://127.0.0.1:\(port)/"])
        #expect(plain.stdout != "401" && plain.stdout != "200", "\(plain.stdout)")
    }
}

extension HTTPListenerTests {
    /// Hostile WebSocket input: a message over max_line_bytes, a binary message; each closes
    /// that connection (a flood: `aFloodOfMessagesIsCutAt64`), and dld answers on the socket
    /// afterwards.
    @Test func hostileWebSocketInput() throws {
        let web = try WebDaemon(config: "max_line_bytes = 65536\n")
        defer { web.daemon.stop() }
        let token = try web.token
        let big = try RawWebSocket(port: web.port, token: token)
        big.send(String(repeating: " ", count: 70000))
        #expect(try big.closeCode() == 1009)
        let binary = try RawWebSocket(port: web.port, token: token)
        binary.send("{}", opcode: 2)
        #expect(try binary.closeCode() == 1003)
        // Garbage JSON is a JSON-RPC error, as on the socket, and the connection stays.
        let garbage = try RawWebSocket(port: web.port, token: token)
        garbage.send("{\u{1}")
        #expect(try garbage.receiveJSON()["error"]?["data"]?["code"] == "parse_error")
        garbage.send(#"{"jsonrpc":"2.0","id":1,"method":"version"}"#)
        #expect(try garbage.receiveJSON()["result"]?["protocol"] != nil)
        #expect(try web.daemon.call("version")["protocol"] != nil)
    }

    /// At most 64 messages wait for their answer (docs/protocol.md, "WebSocket"): behind a
    /// `get` whose download the origin holds (`gate=2`: until a second body streams, for at
    /// most 20 s), 64 messages are all answered, in order, once the test lets the download go;
    /// 65 close the connection with 1008.
    @Test func aFloodOfMessagesIsCutAt64() async throws {
        try await withOrigin { origin in
            let web = try WebDaemon()
            defer { web.daemon.stop() }
            let token = try web.token
            func get(_ path: String) -> String {
                #"{"jsonrpc":"2.0","id":0,"method":"get","params":{"url":"\#(origin.baseURL)\#(path)"}}"#
            }
            func version(_ id: Int) -> String { #"{"jsonrpc":"2.0","id":\#(id),"method":"version"}"# }

            let full = try RawWebSocket(port: web.port, token: token)
            full.send(get("/bytes/1000?gate=2"))
            for id in 1...64 { full.send(version(id)) }
            // A second body, streamed for three seconds: the gate sees two bodies and opens.
            let second = try RawConnection(port: origin.port)
            second.send("GET /bytes/150000?rate=50000 HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            let answer = try full.receiveJSON()
            #expect(answer["id"] == 0 && answer["result"]?["size"] == 1000, "\(answer.serializedString())")
            for id in 1...64 {
                let reply = try full.receiveJSON()
                #expect(reply["id"] == .int(Int64(id)) && reply["result"]?["protocol"] != nil, "\(reply.serializedString())")
            }
            #expect(try RawResponse(second.receiveAll()).status == 200)

            let flood = try RawWebSocket(port: web.port, token: token)
            flood.send(get("/bytes/2000?gate=2"))
            for id in 1...65 { flood.send(version(id)) }
            #expect(try flood.closeCode() == 1008)
            #expect(try web.daemon.call("version")["protocol"] != nil)
        }
    }
}

extension RawWebSocket {
    /// The status code of the close frame dld sends next (text messages before it skipped).
    func closeCode() throws -> Int {
        while true {
            let (opcode, payload) = try receive()
            guard opcode == 8 else { continue }
            let bytes = [UInt8](payload)
            return bytes.count >= 2 ? Int(bytes[0]) << 8 | Int(bytes[1]) : -1
        }
    }
}

extension HTTPListenerTests {
    /// Wrong tokens in a row are answered ever more slowly (`AuthThrottle`: 50 ms, doubled each
    /// time, at most 5 s; its delays are HTTPAccessTests'), and the wait holds no one else.
    /// Seven wrong tokens at once, then an eighth, which waits the longest delay: once dld has
    /// read it (its log line), a request with the token is answered while the eighth is not.
    @Test func wrongTokensAreSlowedForThemOnly() throws {
        let web = try WebDaemon()
        defer { web.daemon.stop() }
        let wrong = "GET / HTTP/1.1\r\nHost: 127.0.0.1:\(web.port)\r\nAuthorization: Bearer \(String(repeating: "f", count: 64))\r\n\r\n"
        func read(_ failures: Int) throws {
            let deadline = Date().addingTimeInterval(60)
            while !web.daemon.log.contains("failures_in_a_row=\(failures)") {
                guard Date() < deadline else { throw HarnessError("dld did not log wrong token \(failures)") }
                usleep(20_000)
            }
        }
        let first = try (0..<7).map { _ in
            let connection = try RawConnection(port: web.port)
            connection.send(wrong)
            return connection
        }
        try read(7)
        let slowest = try RawConnection(port: web.port)
        slowest.send(wrong)
        try read(8)
        #expect(try web.request("GET", "/").status == 200)
        #expect(!slowest.hasInput, "the eighth wrong token was answered before the request with the token")
        for connection in first + [slowest] { #expect(try RawResponse(connection.receiveAll()).status == 401) }
    }
}

extension HTTPListenerTests {
    /// Slow clients (with the read timeout at 1 s through DLD_TEST_HTTP_TIMEOUT): a silent
    /// connection is closed, a body that drips in slower than the deadline is cut off, and a
    /// silent WebSocket is pinged, kept while it answers, and closed when it does not.
    @Test func slowClientsAreCutOff() throws {
        let web = try WebDaemon(environment: ["DLD_TEST_HTTP_TIMEOUT": "1"])
        let (daemon, port, token) = (web.daemon, web.port, try web.token)
        defer { daemon.stop() }
        var started = Date()
        let silent = try RawConnection(port: port)
        #expect(silent.receiveAll().isEmpty)
        #expect(Date().timeIntervalSince(started) < 5, "a silent connection stayed open")

        started = Date()
        let drip = try RawConnection(port: port)
        drip.send(
            "POST /rpc HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nAuthorization: Bearer \(token)\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
        )
        var open = true
        while open && Date().timeIntervalSince(started) < 10 {
            usleep(300_000)
            open = drip.send(Data(" ".utf8))
        }
        #expect(Date().timeIntervalSince(started) < 5, "a dripping body was not cut off")

        let socket = try RawWebSocket(port: port, token: token)
        let (opcode, _) = try socket.receive()
        #expect(opcode == 9, "a silent WebSocket is pinged")
        socket.send("", opcode: 10)
        let (again, _) = try socket.receive()
        #expect(again == 9, "a WebSocket that answered is pinged again, not closed")
        started = Date()
        var closed = false
        while !closed && Date().timeIntervalSince(started) < 10 {
            guard let frame = try? socket.receive() else { break }
            closed = frame.opcode == 8
        }
        #expect(closed, "a WebSocket that did not answer its ping was not closed")
        #expect(try daemon.call("version")["protocol"] != nil)
    }
}

extension HTTPListenerTests {
    /// A `get` that waits for its download longer than the read timeout (1 s here) still gets
    /// its reply: a connection waiting for an answer is not idle.
    @Test func aSlowAnswerIsNotIdle() async throws {
        try await withOrigin { origin in
            let web = try WebDaemon(environment: ["DLD_TEST_HTTP_TIMEOUT": "1"])
            let (daemon, port, token) = (web.daemon, web.port, try web.token)
            defer { daemon.stop() }
            let started = Date()
            let body = #"{"jsonrpc":"2.0","id":1,"method":"get","params":{"url":"\#(origin.baseURL)/bytes/8000?rate=3000"}}"#
            let connection = try RawConnection(port: port, timeout: 30)
            connection.send(
                "POST /rpc HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nAuthorization: Bearer \(token)\r\nContent-Type: application/json\r\n"
                    + "Content-Length: \(body.utf8.count)\r\nConnection: close\r\n\r\n\(body)")
            let response = try RawResponse(connection.receiveAll())
            #expect(response.status == 200)
            #expect(try JSONValue.parse(response.body)["result"]?["path"] != nil, "\(response.text)")
            #expect(Date().timeIntervalSince(started) > 1.5, "the download should outlast the read timeout")
        }
    }
}

extension HTTPListenerTests {
    /// What docs/protocol.md ("HTTP: POST /rpc", "Authentication, Host and Origin") promises of
    /// every reply and request head: `Cache-Control: no-store` on every reply; the dashboard's
    /// files with the whole Content-Security-Policy and `X-Frame-Options: DENY`; `404` for
    /// anything else (after the token); `400` without `Host`; a head of 32 KiB and 100 headers
    /// served, one byte or one header more `400`. (The delays of wrong tokens, up to 5 s, are
    /// HTTPAccessTests'.)
    @Test func documentedHeadersAndLimits() throws {
        let web = try WebDaemon()
        defer { web.daemon.stop() }
        let policy =
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
            + "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
        for path in ["/", "/index.html", "/app.js", "/app.css", "/icon.svg"] {
            let file = try web.request("GET", path)
            #expect(file.status == 200, "\(path)")
            #expect(file.header("content-security-policy") == policy, "\(path): \(file.header("content-security-policy") ?? "none")")
            #expect(file.header("x-frame-options") == "DENY", "\(path)")
            #expect(file.header("cache-control") == "no-store", "\(path)")
        }
        let version = Data(#"{"jsonrpc":"2.0","id":1,"method":"version"}"#.utf8)
        let json = ("Content-Type", "application/json")
        let notification = Data(#"{"jsonrpc":"2.0","method":"stats"}"#.utf8)
        let replies: [(String, RawResponse, Int)] = [
            ("rpc", try web.request("POST", "/rpc", body: version, headers: [json]), 200),
            ("notification", try web.request("POST", "/rpc", body: notification, headers: [json]), 204),
            ("metrics", try web.request("GET", "/metrics"), 200),
            ("openrpc", try web.request("GET", "/openrpc.json"), 200),
            ("login", try web.request("GET", "/login?token=\(try web.token)", auth: false), 303),
            ("no token", try web.request("GET", "/", auth: false), 401),
            ("unknown path", try web.request("GET", "/nothing-here"), 404),
            ("unknown file", try web.request("GET", "/app.jsx"), 404),
            ("POST of a page", try web.request("POST", "/", body: version, headers: [json]), 404),
            ("unknown path, no token", try web.request("GET", "/nothing-here", auth: false), 401),
            ("foreign host", try web.request("GET", "/", headers: [("Host", "evil.example:\(web.port)")]), 421),
            ("body too large", try web.request("POST", "/rpc", body: Data(count: (4 << 20) + 1), headers: [json]), 413),
        ]
        for (what, reply, status) in replies {
            #expect(reply.status == status, "\(what): \(reply.status) \(reply.text)")
            #expect(reply.header("cache-control") == "no-store", "\(what)")
        }
        // No Host at all.
        let hostless = try RawConnection(port: web.port)
        hostless.send("GET / HTTP/1.1\r\nAuthorization: Bearer \(try web.token)\r\nConnection: close\r\n\r\n")
        let noHost = try RawResponse(hostless.receiveAll())
        #expect(noHost.status == 400, "\(noHost.text)")
        #expect(noHost.header("cache-control") == "no-store")

        // The head's size: the request target and the header names and values, as the limit
        // counts them (docs/protocol.md; the spaces, colons and line ends around them aside).
        func head(counted: Int) throws -> RawResponse {
            let fields = [("Host", "127.0.0.1:\(web.port)"), ("Authorization", "Bearer \(try web.token)"), ("Connection", "close")]
            let used = "/".utf8.count + fields.reduce(0) { $0 + $1.0.utf8.count + $1.1.utf8.count } + "X-Pad".utf8.count
            let pad = ("X-Pad", String(repeating: "a", count: counted - used))
            let connection = try RawConnection(port: web.port)
            connection.send("GET / HTTP/1.1\r\n" + (fields + [pad]).map { "\($0.0): \($0.1)\r\n" }.joined() + "\r\n")
            return try RawResponse(connection.receiveAll())
        }
        #expect(try head(counted: 32 << 10).status == 200)
        #expect(try head(counted: (32 << 10) + 1).status == 400)
        // `request` adds Host, Authorization, Content-Length and Connection.
        func headers(count: Int) throws -> RawResponse {
            try web.request("GET", "/", headers: (0..<(count - 4)).map { ("X-H\($0)", "1") })
        }
        #expect(try headers(count: 100).status == 200)
        #expect(try headers(count: 101).status == 400)
    }
}
