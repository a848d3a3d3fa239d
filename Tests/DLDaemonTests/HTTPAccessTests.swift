@testable import DLDaemon
import Testing

/// The HTTP listener's address syntax, its Host and Origin rules, and the token comparison,
/// without a listener (the end-to-end tests in HTTPListenerTests run the real one).
@Suite struct HTTPAccessTests {
    @Test func addresses() throws {
        #expect(try HTTPAddress.parse("127.0.0.1:6802") == HTTPAddress(host: "127.0.0.1", port: 6802))
        #expect(try HTTPAddress.parse("localhost:80") == HTTPAddress(host: "127.0.0.1", port: 80))
        #expect(try HTTPAddress.parse("[::1]:6802") == HTTPAddress(host: "::1", port: 6802))
        #expect(try HTTPAddress.parse("[::1]:6802").hostInURL == "[::1]")
        #expect(try HTTPAddress.parse("0.0.0.0:1").localHostInURL == "127.0.0.1")
        #expect(try HTTPAddress.parse("127.0.0.5:1").isLoopback)
        #expect(try !HTTPAddress.parse("0.0.0.0:1").isLoopback)
        #expect(try !HTTPAddress.parse("[::]:1").isLoopback)
        for bad in ["", "6802", "127.0.0.1", "127.0.0.1:0", "127.0.0.1:65536", "::1:6802", "[::1]6802", "example.com:80", "1.2.3:4"] {
            #expect(throws: HTTPAddress.ParseError.self, "\(bad)") { try HTTPAddress.parse(bad) }
        }
    }

    @Test func hosts() {
        let policy = HostPolicy(
            address: HTTPAddress(host: "127.0.0.1", port: 6802), tls: false, extraHosts: ["dl.example.com", "box:8080"])
        for good in [
            "127.0.0.1:6802", "localhost:6802", "LOCALHOST:6802", "[::1]:6802", "dl.example.com", "dl.example.com:443", "box:8080",
        ] {
            #expect(policy.allows(host: good), "\(good)")
        }
        for bad in ["127.0.0.1", "127.0.0.1:6803", "evil.example:6802", "localhost.evil.example:6802", "box", "box:9", ""] {
            #expect(!policy.allows(host: bad), "\(bad)")
        }
        // A client leaves out the scheme's default port.
        #expect(HostPolicy(address: HTTPAddress(host: "127.0.0.1", port: 443), tls: true, extraHosts: []).allows(host: "localhost"))
    }

    @Test func origins() {
        let policy = HostPolicy(address: HTTPAddress(host: "127.0.0.1", port: 6802), tls: false, extraHosts: ["dl.example.com"])
        #expect(policy.allows(origin: "http://127.0.0.1:6802", host: "127.0.0.1:6802"))
        #expect(policy.allows(origin: "http://localhost:6802", host: "localhost:6802"))
        #expect(!policy.allows(origin: "http://localhost:6802", host: "127.0.0.1:6802"))
        #expect(!policy.allows(origin: "https://127.0.0.1:6802", host: "127.0.0.1:6802"))
        #expect(!policy.allows(origin: "null", host: "127.0.0.1:6802"))
        #expect(!policy.allows(origin: "http://evil.example", host: "127.0.0.1:6802"))
        // Through a proxy that ends TLS, the browser's origin is https.
        #expect(policy.allows(origin: "https://dl.example.com", host: "dl.example.com"))
    }

    @Test func tokens() {
        let token = String(repeating: "ab", count: 32)
        #expect(HTTPToken.matches(token[...], token))
        #expect(!HTTPToken.matches(token.dropLast(), token))
        #expect(!HTTPToken.matches((token + "0")[...], token))
        #expect(!HTTPToken.matches("", token))
        #expect(!HTTPToken.matches(String(repeating: "ab", count: 31)[...] + "ac", token))
    }

    /// Wrong tokens in a row (docs/protocol.md): 50 ms, doubled each time, up to 5 s and no
    /// more, however many come.
    @Test func wrongTokenDelaysDoubleUpToFiveSeconds() {
        let throttle = AuthThrottle()
        let delays = (1...40).map { _ in throttle.failed() }
        #expect(delays.map { $0.failures } == Array(1...40))
        let expected = [50, 100, 200, 400, 800, 1600, 3200] + Array(repeating: 5000, count: 33)
        #expect(delays.map { $0.delay.nanoseconds / 1_000_000 } == expected.map(Int64.init))
    }
}
