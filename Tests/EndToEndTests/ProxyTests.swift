import DLCore
import DLRPC
import DLTestSupport
import Foundation
import Testing

/// Proxies as curl users set them (issue 10): `http_proxy`/`https_proxy`/`all_proxy` and
/// `no_proxy` in dld's environment, or `proxy` in the config file, with real proxies from
/// Debian's packages (tinyproxy for HTTP CONNECT, microsocks for SOCKS5) between dld and the
/// test origin. The proxies' own logs say what went through them.
@Suite(.serialized) struct ProxyTests {
    /// Proxy variables of the test runner's environment must not leak into the daemon's.
    static let cleared = ["http_proxy", "https_proxy", "all_proxy", "no_proxy", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"]

    /// http and https URLs go through tinyproxy (the https one as a CONNECT tunnel, with the
    /// certificate still checked end to end); a host in `no_proxy` is reached directly; with the
    /// proxy gone, a proxied job waits with `proxy_error` naming the proxy while the direct
    /// one still completes.
    @Test func httpProxyFromTheEnvironmentAndNoProxy() async throws {
        let daemon = try DaemonHarness(config: slowRetries)
        let proxy = try TestProxy(.tinyproxy, in: daemon.root)
        for name in Self.cleared { daemon.extraEnvironment[name] = "" }
        daemon.extraEnvironment["http_proxy"] = proxy.url
        daemon.extraEnvironment["HTTPS_PROXY"] = proxy.url
        daemon.extraEnvironment["no_proxy"] = "localhost"
        let tls = try TLSFiles.selfSigned(in: daemon.root)
        let origin = try await TestOrigin.start()
        let secure = try await TestOrigin.start(tls: tls)
        do {
            try daemon.start()
            defer { daemon.stop() }
            let port = try #require(URL(string: origin.baseURL)?.port)
            let securePort = try #require(URL(string: secure.baseURL)?.port)

            let proxied = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/70000"), "name": "proxied.bin"])
            let done = try daemon.waitForState(proxied, ["completed", "failed", "waiting"])
            #expect(done["state"] == "completed", "\(done.serializedString())")
            try expectOriginBytes(at: daemon.downloadDir + "/proxied.bin", count: 70000)
            #expect(proxy.forwarded(toPort: port), "tinyproxy did not forward the http job:\n\(proxy.log)")

            let tunneled = try daemon.enqueue([
                "url": .string("\(secure.baseURL)/bytes/3000"), "name": "tunneled.bin", "ca_file": .string(tls.certificatePath),
            ])
            let tunnelDone = try daemon.waitForState(tunneled, ["completed", "failed", "waiting"])
            #expect(tunnelDone["state"] == "completed", "\(tunnelDone.serializedString())")
            #expect(proxy.forwarded(toPort: securePort), "tinyproxy did not tunnel the https job:\n\(proxy.log)")

            let direct = try daemon.enqueue(["url": .string("http://localhost:\(port)/bytes/2000"), "name": "direct.bin"])
            let directDone = try daemon.waitForState(direct, ["completed", "failed", "waiting"])
            #expect(directDone["state"] == "completed", "\(directDone.serializedString())")
            #expect(!proxy.log.contains("localhost"), "a host in no_proxy went through the proxy:\n\(proxy.log)")

            proxy.stop()
            let stranded = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/1000"), "name": "stranded.bin"])
            let waiting = try daemon.waitForState(stranded, ["completed", "failed", "waiting"])
            #expect(waiting["state"] == "waiting" && waiting["error"]?["code"] == "proxy_error", "\(waiting.serializedString())")
            let message = waiting["error"]?["message"]?.stringValue ?? ""
            #expect(message.contains("127.0.0.1:\(proxy.port)") && message.contains("proxy"), "\(message)")
            // The table says why the job does not run, without opening it.
            let table = try daemon.dlctl(["status"])
            #expect(table.stdout.contains("waiting(proxy_error)"), "\(table.stdout)")
            let stillDirect = try daemon.enqueue(["url": .string("http://localhost:\(port)/bytes/1000"), "name": "still-direct.bin"])
            #expect(try daemon.waitForState(stillDirect, ["completed", "failed", "waiting"])["state"] == "completed")
        } catch {
            try? await origin.shutdown()
            try? await secure.shutdown()
            throw error
        }
        try await origin.shutdown()
        try await secure.shutdown()
    }

    /// The config's `proxy` (SOCKS5 here) replaces the environment's variables: the job goes
    /// through microsocks although `all_proxy` names a port where nothing listens.
    @Test func socks5ProxyFromTheConfigFile() async throws {
        let probe = try DaemonHarness()
        let proxy = try TestProxy(.microsocks, in: probe.root)
        let dead = try freeLoopbackPort()
        let daemon = try DaemonHarness(config: slowRetries + "\nproxy = \"socks5h://127.0.0.1:\(proxy.port)\"\n")
        for name in Self.cleared { daemon.extraEnvironment[name] = "" }
        daemon.extraEnvironment["all_proxy"] = "http://127.0.0.1:\(dead)"
        let origin = try await TestOrigin.start()
        do {
            try daemon.start()
            defer { daemon.stop() }
            let port = try #require(URL(string: origin.baseURL)?.port)
            let id = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/40000"), "name": "socks.bin"])
            let done = try daemon.waitForState(id, ["completed", "failed", "waiting"])
            #expect(done["state"] == "completed", "\(done.serializedString())")
            try expectOriginBytes(at: daemon.downloadDir + "/socks.bin", count: 40000)
            #expect(proxy.forwarded(toPort: port), "microsocks did not forward the job:\n\(proxy.log)")
        } catch {
            try? await origin.shutdown()
            throw error
        }
        try await origin.shutdown()
    }

    /// A proxy that wants a login: without credentials the job fails with `proxy_auth` at
    /// once; with `user:password@` in the proxy URL it goes through, and the password is
    /// never logged.
    @Test func proxyLogin() async throws {
        let probe = try DaemonHarness()
        let proxy = try TestProxy(.tinyproxy, in: probe.root, login: ("dld", "pr0xy-secret"))
        let origin = try await TestOrigin.start()
        do {
            let anonymous = try DaemonHarness(config: slowRetries + "\nproxy = \"\(proxy.url)\"\n")
            try anonymous.start()
            let refused = try anonymous.waitForState(
                try anonymous.enqueue(["url": .string("\(origin.baseURL)/bytes/1000"), "name": "a.bin"]),
                ["completed", "failed", "waiting"])
            anonymous.stop()
            #expect(refused["state"] == "failed" && refused["error"]?["code"] == "proxy_auth", "\(refused.serializedString())")

            let port = proxy.port
            let member = try DaemonHarness(config: slowRetries + "\nproxy = \"http://dld:pr0xy-secret@127.0.0.1:\(port)\"\n")
            try member.start()
            let done = try member.waitForState(
                try member.enqueue(["url": .string("\(origin.baseURL)/bytes/5000"), "name": "b.bin"]), ["completed", "failed", "waiting"])
            member.stop()
            #expect(done["state"] == "completed", "\(done.serializedString())")
            #expect(member.log.contains("dld:***@127.0.0.1:\(port)"), "\(member.log)")
            #expect(!member.log.contains("pr0xy-secret"))
        } catch {
            try? await origin.shutdown()
            throw error
        }
        try await origin.shutdown()
    }

    /// `--print-config` shows the proxy with its password as `***`, and the environment's
    /// proxies as comments; a proxy URL dld cannot use is refused at start with its line.
    @Test func printConfigRedactsAndBadProxyIsRefused() throws {
        let daemon = try DaemonHarness(config: "proxy = \"http://me:s3cret@proxy.example:3128\"\nno_proxy = \"localhost,.lan\"\n")
        for name in Self.cleared { daemon.extraEnvironment[name] = "" }
        let printed = try runProgram(try BuiltProducts.path("dld"), daemon.arguments + ["--print-config"], environment: daemon.environment)
        #expect(printed.status == 0, "\(printed.stderr)")
        #expect(printed.stdout.contains("proxy = \"http://me:***@proxy.example:3128\""), "\(printed.stdout)")
        #expect(printed.stdout.contains("no_proxy = \"localhost,.lan\""), "\(printed.stdout)")
        #expect(!printed.stdout.contains("s3cret"))

        let fromEnvironment = try DaemonHarness()
        for name in Self.cleared { fromEnvironment.extraEnvironment[name] = "" }
        fromEnvironment.extraEnvironment["https_proxy"] = "http://u:hidden@10.1.1.1:8080"
        let shown = try runProgram(
            try BuiltProducts.path("dld"), fromEnvironment.arguments + ["--print-config"], environment: fromEnvironment.environment)
        #expect(shown.stdout.contains("# from the environment: https URLs through http://u:***@10.1.1.1:8080"), "\(shown.stdout)")
        #expect(!shown.stdout.contains("hidden"))

        let bad = try DaemonHarness(config: "max_active = 2\nproxy = \"socks4://me:pw@proxy.example\"\n")
        let refused = try runProgram(try BuiltProducts.path("dld"), bad.arguments + ["--print-config"], environment: bad.environment)
        #expect(refused.status != 0)
        #expect(refused.stderr.contains("line 2") && refused.stderr.contains("SOCKS4"), "\(refused.stderr)")
        #expect(!refused.stderr.contains("pw@"), "\(refused.stderr)")
    }
}
