@testable import DLTransfer
import Foundation
import Testing

/// Which proxy a URL goes through, by curl's rules, without a network.
@Suite struct ProxyRuleTests {
    private func url(_ text: String) -> URL { URL(string: text) ?? URL(fileURLWithPath: "/invalid") }

    /// Proxy URLs read as curl reads them: no scheme is http, the port defaults to 1080,
    /// credentials are percent-decoded and never shown.
    @Test func parsing() throws {
        let plain = try ProxyServer.parse("proxy.lan")
        #expect(plain == ProxyServer(kind: .http, host: "proxy.lan", port: 1080))
        let login = try ProxyServer.parse("http://me:p%40ss@10.0.0.1:3128/")
        #expect(login.user == "me" && login.password == "p@ss" && login.port == 3128)
        #expect(login.description == "http://me:***@10.0.0.1:3128")
        #expect(!login.description.contains("p@ss") && !login.description.contains("p%40ss"))
        #expect(try ProxyServer.parse("socks5h://[::1]:9050") == ProxyServer(kind: .socks5, host: "::1", port: 9050))
        #expect(try ProxyServer.parse("SOCKS5://127.0.0.1").kind == .socks5)
        for refused in [
            "https://proxy:443", "socks4://proxy", "ftp://proxy", "socks5://u:p@proxy", "http://proxy:99999", "http://proxy/path", "",
        ] {
            #expect(throws: ProxyError.self, "\(refused)") { try ProxyServer.parse(refused) }
        }
        #expect(ProxyServer.redacted("http://me:secret@proxy:3128") == "http://me:***@proxy:3128")
        #expect(ProxyServer.redacted("me:secret@proxy") == "me:***@proxy")
        #expect(ProxyServer.redacted("http://proxy:3128") == "http://proxy:3128")
        // A URL that does not parse still has its password hidden in the message.
        let error = try #require(throws: ProxyError.self) { try ProxyServer.parse("https://me:secret@proxy") }
        #expect(!error.description.contains("secret"))
    }

    /// curl's precedence: the scheme's variable, else all_proxy; http_proxy only in lower
    /// case; lower case before upper case for the others; the config replaces them all.
    @Test func precedence() throws {
        let env = [
            "http_proxy": "http://h:1", "HTTPS_PROXY": "http://s:2", "https_proxy": "http://lower-s:2", "ALL_PROXY": "socks5://a:3",
        ]
        let (rules, source, ignored) = try ProxyRules.resolve(configProxy: nil, configNoProxy: nil, environment: env)
        #expect(source == .environment && ignored.isEmpty)
        #expect(rules.proxy(for: url("http://x/"))?.host == "h")
        #expect(rules.proxy(for: url("https://x/"))?.host == "lower-s")
        // Upper-case HTTP_PROXY is never read (httpoxy); all_proxy serves http instead.
        let upper = try ProxyRules.resolve(
            configProxy: nil, configNoProxy: nil, environment: ["HTTP_PROXY": "http://evil:1", "all_proxy": "http://a:3"]
        ).rules
        #expect(upper.proxy(for: url("http://x/"))?.host == "a")
        #expect(try ProxyRules.resolve(configProxy: nil, configNoProxy: nil, environment: ["HTTP_PROXY": "http://evil:1"]).source == .none)
        #expect(
            try ProxyRules.resolve(configProxy: nil, configNoProxy: nil, environment: ["HTTPS_PROXY": "http://s:2"]).rules.proxy(
                for: url("https://x/"))?.host == "s")
        // The config's proxy wins for every scheme; "" turns proxies off.
        let configured = try ProxyRules.resolve(configProxy: "http://c:8", configNoProxy: nil, environment: env).rules
        #expect(configured.proxy(for: url("http://x/"))?.host == "c")
        #expect(configured.proxy(for: url("https://x/"))?.host == "c")
        let off = try ProxyRules.resolve(configProxy: "", configNoProxy: nil, environment: env)
        #expect(off.source == .none && off.rules.proxy(for: url("http://x/")) == nil)
        // A variable that does not parse is left out and reported, not fatal.
        let bad = try ProxyRules.resolve(
            configProxy: nil, configNoProxy: nil, environment: ["https_proxy": "socks4://x", "all_proxy": "http://a:1"])
        #expect(bad.ignored.count == 1 && bad.ignored[0].hasPrefix("https_proxy"))
        #expect(bad.rules.proxy(for: url("https://x/"))?.host == "a")
    }

    /// no_proxy: names match themselves and subdomains, `*` everything, addresses and ranges.
    @Test func noProxy() throws {
        let rules = try ProxyRules.resolve(
            configProxy: nil, configNoProxy: nil,
            environment: ["all_proxy": "http://p:1", "NO_PROXY": "localhost, .example.com internal.lan,10.0.0.0/8,[::1],192.168.1.7"]
        ).rules
        for direct in [
            "http://localhost/", "http://example.com/", "https://a.b.example.com/", "http://INTERNAL.lan/", "http://10.2.3.4/",
            "http://[::1]:8080/", "http://192.168.1.7/", "http://example.com./",
        ] {
            #expect(rules.proxy(for: url(direct)) == nil, "\(direct)")
        }
        for proxied in [
            "http://notexample.com/", "http://example.org/", "http://11.0.0.1/", "http://192.168.1.8/", "http://[::2]/",
            "http://localhost.evil/",
        ] {
            #expect(rules.proxy(for: url(proxied)) != nil, "\(proxied)")
        }
        #expect(NoProxy("*").matches(host: "anything"))
        #expect(!NoProxy("").matches(host: "anything"))
        #expect(NoProxy("fe80::/10").matches(host: "fe80::1") && !NoProxy("fe80::/10").matches(host: "fe00::1"))
        // The lower-case variable is read first; the config's no_proxy replaces it.
        let both = try ProxyRules.resolve(
            configProxy: nil, configNoProxy: nil, environment: ["all_proxy": "http://p:1", "no_proxy": "a", "NO_PROXY": "b"]
        ).rules
        #expect(both.proxy(for: url("http://a/")) == nil && both.proxy(for: url("http://b/")) != nil)
        let configured = try ProxyRules.resolve(
            configProxy: nil, configNoProxy: "b", environment: ["all_proxy": "http://p:1", "no_proxy": "a"]
        ).rules
        #expect(configured.proxy(for: url("http://a/")) != nil && configured.proxy(for: url("http://b/")) == nil)
    }
}
