import DLRPC
import DLTestSupport
import Foundation
import Testing

/// An aria2 web front-end, unchanged, drives dld: webui-aria2's built app
/// (Tests/Fixtures/webui-aria2) served by nginx from another port, in Debian's chromium driven
/// by Selenium (scripts/aria2_webui_test.py), talking to dld's `aria2_listen` as it talks to
/// aria2 (issue #37).
@Suite(.serialized) struct Aria2WebUITests {
    static var repository: URL {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    }

    /// nginx's own list knows neither CSS nor JavaScript: a stylesheet served as
    /// application/octet-stream is not applied.
    static let types = """
        location / {
            types {
                text/html html;
                text/css css;
                application/javascript js;
                image/svg+xml svg;
            }
        }
        """

    /// Configured in the page's Settings > Connection Settings with the host, `aria2_listen`'s
    /// port and `aria2_secret`, as for aria2 (`http_origins` names the page's origin): the
    /// page adds three URIs and lists them; one is seen active with its bar moving, paused,
    /// resumed and complete (its file is the origin's bytes), another removed while active
    /// (Removed), a finished one restarted (added again under a free name, as aria2 does) and
    /// its result removed, then Purge Completed empties the page.
    /// After each click dld's own `status` and `list` (on its socket) must agree with the page;
    /// the page raises no error alert and its console stays clean once it is connected.
    /// Screenshots in .build/aria2-webui-screenshots.
    @Test func webuiAria2AddsPausesResumesRemovesAndPurges() async throws {
        try await withOrigin { origin in
            let folder = NSTemporaryDirectory() + "dld-aria2-webui-\(UUID().uuidString.prefix(8))"
            try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
            defer { try? FileManager.default.removeItem(atPath: folder) }
            let fixture = Self.repository.appendingPathComponent("Tests/Fixtures/webui-aria2").path
            let page = try TestNginx(serving: fixture, in: folder, serverConfig: Self.types)
            defer { page.stop() }

            let aria2Port = try freePort()
            let secret = "webui-\(UUID().uuidString.prefix(13))"
            let config = """
                aria2_listen = "127.0.0.1:\(aria2Port)"
                aria2_secret = "\(secret)"
                http_origins = ["\(page.url)"]

                """
            let web = try WebDaemon(config: config)
            defer { web.daemon.stop() }

            let shots = Self.repository.appendingPathComponent(".build/aria2-webui-screenshots").path
            try? FileManager.default.removeItem(atPath: shots)
            let script = Self.repository.appendingPathComponent("scripts/aria2_webui_test.py").path
            let run = try runProgram(
                "/usr/bin/python3",
                [script, page.url + "/index.html", "\(aria2Port)", secret, origin.baseURL, web.daemon.socket, shots])
            #expect(run.status == 0, "\(run.stdout)\(run.stderr.suffix(3000))")

            // The page came from nginx, not from dld.
            for file in ["/index.html", "/vendor.js", "/app.js", "/app.css"] {
                #expect(page.requests.contains(file), "\(file): \(page.requests)")
            }
            // The download that was paused and resumed through the page has the origin's bytes.
            let finished = run.stdout.split(separator: "\n").first { $0.hasPrefix("finished: ") }
            let gid = try #require(finished.map { String($0.dropFirst("finished: ".count)) }, "\(run.stdout)")
            #expect(gid.count == 16 && Int64(gid, radix: 16) != nil, "\(gid)")
            try expectOriginBytes(at: web.daemon.downloadDir + "/2000000", count: 2_000_000)
            // Purged: dld's table is empty (the files stay), and the removed download left no file.
            #expect(try web.daemon.call("list")["jobs"] == [], "after Purge Completed")
            // The restarted one was fetched again beside the first file.
            for name in ["150000", "150000 (2)"] {
                try expectOriginBytes(at: web.daemon.downloadDir + "/" + name, count: 150_000)
            }
            #expect(run.stdout.contains("\nrestarted: "), "\(run.stdout)")
            let left = try FileManager.default.contentsOfDirectory(atPath: web.daemon.downloadDir)
            #expect(!left.contains { $0.hasPrefix("8000000") }, "the removed download's file: \(left)")
            #expect(!web.daemon.log.contains(secret), "the secret is not logged")
            for name in ["1-connection-settings", "2-active", "3-paused", "4-finished", "5-purged"] {
                let png = try Data(contentsOf: URL(fileURLWithPath: "\(shots)/\(name).png"))
                #expect(png.starts(with: [0x89, 0x50, 0x4E, 0x47]) && png.count > 10_000, "\(name): \(png.count) bytes")
            }
        }
    }
}
