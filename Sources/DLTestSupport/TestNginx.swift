import Foundation

/// A real nginx (Debian's, at /usr/sbin/nginx, installed by scripts/deps.sh) serving a folder
/// on a free loopback port, from a configuration of its own in a temporary folder: `daemon
/// off`, one process (`master_process off`: no worker that changes user, so it works as root
/// and as anyone else), pid, temp paths and logs inside that folder. The access log, one line
/// a request, lets tests count what was fetched.
public final class TestNginx: @unchecked Sendable {
    public let port: Int
    /// The folder served at `/`.
    public let root: String
    private let folder: String
    private var process: Process?

    /// `http://127.0.0.1:PORT`.
    public var url: String { "http://127.0.0.1:\(port)" }

    /// Starts nginx serving `root`. `limitRate`: bytes per second for each response whose path
    /// ends in one of `slowExtensions` (nginx's `limit_rate`), to keep a download going.
    /// `serverConfig`: more directives inside the `server` block (`location`s of a test's own).
    public init(
        serving root: String, in parent: String, limitRate: Int? = nil, slowExtensions: [String] = ["ts", "m4s"], serverConfig: String = ""
    ) throws {
        self.root = root
        folder = parent + "/nginx-\(UUID().uuidString.prefix(8))"
        try FileManager.default.createDirectory(atPath: folder + "/tmp", withIntermediateDirectories: true)
        port = try freeLoopbackPort()
        let slow =
            limitRate.map { rate in
                "location ~ \\.(\(slowExtensions.joined(separator: "|")))$ { limit_rate \(rate); }"
            } ?? ""
        let config = """
            daemon off;
            master_process off;
            worker_processes 1;
            pid \(folder)/nginx.pid;
            error_log \(folder)/error.log info;
            events { worker_connections 256; }
            http {
                access_log \(folder)/access.log;
                client_body_temp_path \(folder)/tmp/body;
                proxy_temp_path \(folder)/tmp/proxy;
                fastcgi_temp_path \(folder)/tmp/fastcgi;
                uwsgi_temp_path \(folder)/tmp/uwsgi;
                scgi_temp_path \(folder)/tmp/scgi;
                types {
                    text/html html;
                    application/vnd.apple.mpegurl m3u8;
                    video/mp2t ts;
                    video/iso.segment m4s;
                    video/mp4 mp4;
                }
                default_type application/octet-stream;
                server {
                    listen 127.0.0.1:\(port);
                    root \(root);
                    \(slow)
                    \(serverConfig)
                }
            }
            """
        try config.write(toFile: folder + "/nginx.conf", atomically: true, encoding: .utf8)
        try start()
    }

    deinit { stop() }

    private func start() throws {
        let program = "/usr/sbin/nginx"
        guard FileManager.default.isExecutableFile(atPath: program) else {
            throw HarnessError(
                "nginx is not installed at \(program): run scripts/deps.sh (or apt-get install --no-install-recommends nginx)")
        }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: program)
        process.arguments = ["-p", folder, "-c", folder + "/nginx.conf", "-e", folder + "/error.log"]
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        self.process = process
        let deadline = Date().addingTimeInterval(10)
        while Date() < deadline {
            guard process.isRunning else { throw HarnessError("nginx exited at start:\n\(errorLog)") }
            if canConnect(port: port) { return }
            usleep(20_000)
        }
        throw HarnessError("nginx did not listen on 127.0.0.1:\(port) within 10 s:\n\(errorLog)")
    }

    /// Stops nginx (it is stopped anyway when this goes away): the files are then unreachable.
    public func stop() {
        guard let process, process.isRunning else { return }
        kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
    }

    public var errorLog: String { (try? String(contentsOfFile: folder + "/error.log", encoding: .utf8)) ?? "" }

    /// The access log's request lines' paths (`GET /a/b.ts HTTP/1.1` → `/a/b.ts`), in order.
    public var requests: [String] {
        let log = (try? String(contentsOfFile: folder + "/access.log", encoding: .utf8)) ?? ""
        return log.split(separator: "\n").compactMap { line in
            guard let start = line.firstIndex(of: "\"") else { return nil }
            let request = line[line.index(after: start)...].split(separator: " ")
            return request.count >= 2 ? String(request[1]) : nil
        }
    }

    /// Requests of `path` whose status was `status` (e.g. 200: whole answers), sent by a client
    /// whose User-Agent starts with `agent` (by default dld's: not the ffmpeg of the test).
    public func count(_ path: String, status: Int? = nil, agent: String = "dld/") -> Int {
        let log = (try? String(contentsOfFile: folder + "/access.log", encoding: .utf8)) ?? ""
        return log.split(separator: "\n").filter { line in
            guard line.contains("\"GET \(path) ") || line.contains("\"GET \(path)?") else { return false }
            // The combined format ends with "referer" "user-agent".
            guard line.hasSuffix("\""), line.contains("\"\(agent)") else { return false }
            guard let status else { return true }
            return line.contains("\" \(status) ")
        }.count
    }
}
