// dld-origin: the test origin as a program (for `make bench` when nginx is not installed).
// Prints its base URL as the only line on stdout, then serves until SIGTERM or SIGINT.

import ArgumentParser
import DLTestSupport
import Dispatch
import Foundation

@main
struct DLDOrigin: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "dld-origin",
        abstract: "Serve deterministic test bytes over HTTP/1.1 (or HTTP/2 over TLS) on loopback."
    )

    @Option(help: "Port to listen on (0 lets the OS choose).")
    var port: Int = 0

    @Option(help: "Address to listen on.")
    var host: String = "127.0.0.1"

    @Option(help: "Serve https with a self-signed certificate made in this folder (cert.pem, key.pem).")
    var tlsDir: String?

    @Flag(help: "With --tls-dir: offer HTTP/2 (ALPN).")
    var http2 = false

    @Option(help: "Milliseconds each answer waits before its head, as a distant server's would.")
    var latencyMs: Int64 = 0

    func run() async throws {
        let (signals, continuation) = AsyncStream.makeStream(of: Int32.self)
        let queue = DispatchQueue(label: "dld-origin.signals")
        var sources: [any DispatchSourceSignal] = []
        for sig in [SIGTERM, SIGINT] {
            signal(sig, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: sig, queue: queue)
            source.setEventHandler { continuation.yield(sig) }
            source.resume()
            sources.append(source)
        }

        let tls = try tlsDir.map { try TLSFiles.selfSigned(in: $0) }
        let origin = try await TestOrigin.start(host: host, port: port, tls: tls, http2: http2, latency: .milliseconds(latencyMs))
        // Unbuffered, so a parent reading the pipe sees the line at once.
        FileHandle.standardOutput.write(Data((origin.baseURL + "\n").utf8))

        for await _ in signals { break }
        for source in sources { source.cancel() }
        try await origin.shutdown()
    }
}
