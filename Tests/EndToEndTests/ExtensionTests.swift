import DLRPC
import DLTestSupport
import Foundation
import Testing

/// dld's browser extension (extension/) in a real browser: Debian's chromium with the extension
/// loaded unpacked, driven by Selenium (scripts/extension_test.py), against the real dld and a
/// real nginx that serves a file only with the page's cookie and the page as referer.
@Suite(.serialized) struct ExtensionTests {
    /// Fixed by the `key` of extension/manifest.json; `dlctl web --extension` names it.
    static let extensionID = "camfkgjdhnjdalmdbpfcfadjilekeabo"

    static var repository: URL {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    }

    /// The page sets `session` for /files only (and a cookie of another path); another site
    /// (`localhost`, not `127.0.0.1`) sets one of its own. /files/ answers 403 unless the
    /// request has the page's cookie and the page as its referer, and none of the others, and
    /// the browser's user agent (nginx reads the first of two `User-Agent` headers).
    static let site = """
        location = /page.html {
            add_header Set-Cookie "session=s3cret; Path=/files";
            add_header Set-Cookie "elsewhere=no; Path=/elsewhere";
        }
        location = /other.html { add_header Set-Cookie "other=leak; Path=/"; }
        location /files/ {
            if ($http_cookie ~ "(other|elsewhere)=") { return 403; }
            if ($cookie_session != "s3cret") { return 403; }
            if ($http_referer != "http://$http_host/page.html") { return 403; }
            if ($http_user_agent !~ "Chrome/") { return 403; }
            add_header Content-Disposition 'attachment; filename="report.bin"';
        }
        """

    /// `dlctl web --extension` prints what the options page takes and the `http_origins` line;
    /// filled in as printed, a click on the page's link gives a dld job that completes with the
    /// file's bytes (so dld sent that cookie, that referer and the browser's user agent, and
    /// no other site's cookie),
    /// and no download of the browser's own; with the popup's switch off, the browser's own
    /// download and no job. With dld stopped, the same click gives the browser's own download
    /// of the file. Screenshots in .build/extension-screenshots.
    @Test func aClickedDownloadGoesToDldAndStaysInTheBrowserWithoutIt() throws {
        let origins = "http_origins = [\"chrome-extension://\(Self.extensionID)\"]"
        let web = try WebDaemon(config: origins + "\n")
        defer { web.daemon.stop() }
        let www = web.daemon.root + "/www"
        try FileManager.default.createDirectory(atPath: www + "/files", withIntermediateDirectories: true)
        let bytes = Data((0..<300_000).map { UInt8(truncatingIfNeeded: ($0 &* 2_654_435_761) >> 13) })
        try bytes.write(to: URL(fileURLWithPath: www + "/files/report.bin"))
        func page(_ title: String, _ body: String) -> String {
            "<!doctype html><html><head><meta charset=\"utf-8\"><title>\(title)</title></head><body>\(body)</body></html>"
        }
        try page("Files", #"<a id="file" href="/files/report.bin">report.bin</a>"#)
            .write(toFile: www + "/page.html", atomically: true, encoding: .utf8)
        try page("Other", "another site").write(toFile: www + "/other.html", atomically: true, encoding: .utf8)
        let nginx = try TestNginx(serving: www, in: web.daemon.root, serverConfig: Self.site)
        let origin = nginx.url
        let other = "http://localhost:\(nginx.port)"

        let printed = try web.daemon.dlctl(["web", "--extension", "--state-dir", web.daemon.stateDir])
        #expect(printed.status == 0, "\(printed.stderr)")
        func field(_ name: String) -> String? {
            printed.stdout.split(separator: "\n").map { $0.trimmingCharacters(in: .whitespaces) }
                .first { $0.hasPrefix(name + ":") }.map { String($0.dropFirst(name.count + 1)).trimmingCharacters(in: .whitespaces) }
        }
        let address = try #require(field("Address"), "\(printed.stdout)")
        let token = try #require(field("Token"), "\(printed.stdout)")
        #expect(address == "http://127.0.0.1:\(web.port)")
        #expect(token == (try web.token))
        #expect(printed.stdout.contains("\n  \(origins)\n"), "\(printed.stdout)")

        let script = Self.repository.appendingPathComponent("scripts/extension_test.py").path
        let extensionFolder = Self.repository.appendingPathComponent("extension").path
        let shots = Self.repository.appendingPathComponent(".build/extension-screenshots").path
        try? FileManager.default.removeItem(atPath: shots)
        func browser(_ mode: String, downloads: String) throws -> ProgramOutput {
            try runProgram("/usr/bin/python3", [script, mode, extensionFolder, origin, other, address, token, downloads, shots])
        }

        let first = try browser("with-dld", downloads: web.daemon.root + "/browser-1")
        #expect(first.status == 0, "\(first.stdout)\(first.stderr.suffix(3000))")
        #expect(first.stdout.contains("loaded as \(Self.extensionID)"), "\(first.stdout)")
        let line = first.stdout.split(separator: "\n").first { $0.hasPrefix("job: ") }
        let id = try #require(line.flatMap { Int64($0.dropFirst("job: ".count)) }, "\(first.stdout)")
        let job = try web.daemon.waitForState(id, ["completed", "failed"])
        #expect(job["state"] == "completed", "\(job.serializedString())\n\(nginx.requests)")
        let path = try #require(job["path"]?.stringValue)
        #expect(job["name"] == "report.bin")
        #expect((try? Data(contentsOf: URL(fileURLWithPath: path))) == bytes, "dld's file")
        let headers = Dictionary(
            (job["headers"]?.arrayValue ?? []).compactMap { header in
                header["name"]?.stringValue.map { ($0.lowercased(), header["value"]?.stringValue ?? "") }
            }, uniquingKeysWith: { first, _ in first })
        #expect(headers["referer"] == "\(origin)/page.html", "\(headers)")
        #expect(headers["user-agent"]?.contains("Chrome/") == true, "the browser's user agent: \(headers)")
        #expect(headers["cookie"] == "<redacted>", "\(headers)")
        #expect(job["meta"]?["final_url"] == .string("\(origin)/files/report.bin"), "\(job.serializedString())")
        // Nobody was refused: neither the browser nor dld came without the cookie and referer,
        // or with a cookie of another site or path.
        #expect(nginx.count("/files/report.bin", status: 403, agent: "") == 0, "\(nginx.requests)")
        // Then the popup's switch was turned off: the same click was the browser's alone.
        #expect((try? Data(contentsOf: URL(fileURLWithPath: web.daemon.root + "/browser-1/report.bin"))) == bytes, "switch off")
        let jobs = try web.daemon.call("list")["jobs"]?.arrayValue ?? []
        #expect(jobs.count == 1, "one job, the first click's: \(jobs)")
        for name in ["options", "popup"] {
            let png = try Data(contentsOf: URL(fileURLWithPath: "\(shots)/\(name).png"))
            #expect(png.starts(with: [0x89, 0x50, 0x4E, 0x47]) && png.count > 5_000, "\(name): \(png.count) bytes")
        }

        web.daemon.stop()
        let downloads = web.daemon.root + "/browser-2"
        let second = try browser("without-dld", downloads: downloads)
        #expect(second.status == 0, "\(second.stdout)\(second.stderr.suffix(3000))")
        #expect((try? Data(contentsOf: URL(fileURLWithPath: downloads + "/report.bin"))) == bytes, "the browser's own file")
    }
}
