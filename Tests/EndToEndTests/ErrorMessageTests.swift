import DLCore
import DLRPC
import DLTestSupport
import Foundation
import Testing

/// The job error codes of docs/protocol.md's table.
func documentedJobErrorCodes() throws -> Set<String> {
    let docs = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("docs/protocol.md")
    let text = try String(contentsOf: docs, encoding: .utf8)
    guard let start = text.range(of: "### Job error codes"), let end = text.range(of: "## Changelog") else { return [] }
    var codes: Set<String> = []
    for line in text[start.upperBound..<end.lowerBound].split(separator: "\n") where line.hasPrefix("| `") {
        let cell = line.dropFirst(3)
        if let tick = cell.firstIndex(of: "`"), cell[..<tick] != "error.code" { codes.insert(String(cell[..<tick])) }
    }
    return codes
}

/// Job error codes are a type (`JobErrorCode`): docs/protocol.md's table lists exactly the
/// documented ones, each static member is either documented or never recorded on a job, and
/// no source file outside the type writes a code as a string literal.
@Suite struct JobErrorCodeTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    @Test func theTableListsExactlyTheDocumentedCodes() throws {
        let documented = Set(JobErrorCode.documented.map(\.rawValue))
        #expect(documented.count == JobErrorCode.documented.count, "a code listed twice")
        #expect(try documentedJobErrorCodes() == documented)
        #expect(Set(JobErrorCode.documented).isDisjoint(with: JobErrorCode.neverRecorded))
        // Every member of the type is in one of the two lists.
        let source = try String(contentsOf: Self.root.appendingPathComponent("Sources/DLCore/JobErrorCode.swift"), encoding: .utf8)
        let members = source.split(separator: "\n").compactMap { line -> String? in
            guard line.contains("public static let"), let open = line.range(of: "rawValue: \""),
                let close = line[open.upperBound...].firstIndex(of: "\"")
            else { return nil }
            return String(line[open.upperBound..<close])
        }
        #expect(members.count > 30)
        #expect(Set(members) == documented.union(JobErrorCode.neverRecorded.map(\.rawValue)))
    }

    @Test func noSourceWritesACodeAsAString() throws {
        let sources = Self.root.appendingPathComponent("Sources")
        let walker = try #require(FileManager.default.enumerator(atPath: sources.path))
        var offenders: [String] = []
        while let path = walker.nextObject() as? String {
            guard path.hasSuffix(".swift"), !path.hasSuffix("JobErrorCode.swift") else { continue }
            let text = try String(contentsOf: sources.appendingPathComponent(path), encoding: .utf8)
            for (number, line) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
                let code = line.trimmingCharacters(in: .whitespaces)
                if code.hasPrefix("//") { continue }
                if code.contains("JobError(code: \"")
                    || code.range(of: #"TransferFailure\([^,\"]*,\s*\""#, options: .regularExpression) != nil
                    || code.range(of: #"code != \"|code == \""#, options: .regularExpression) != nil
                {
                    offenders.append("\(path):\(number + 1)")
                }
            }
        }
        #expect(offenders.isEmpty, "job error codes written as strings: \(offenders)")
    }
}

/// A port on 127.0.0.1 where nothing listens.
func closedPort() throws -> Int {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(fd) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let bound = withUnsafeMutablePointer(to: &address) { pointer in
        pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) == 0 && getsockname(fd, $0, &length) == 0 }
    }
    guard bound else { throw HarnessError("no free port") }
    return Int(UInt16(bigEndian: address.sin_port))
}

/// Every job error code, triggered for real, with a message for a person: it names the host
/// (network and TLS codes) or the file (file codes) and holds no type name, library dump or
/// build path. Codes that no real part here can cause (a full disk, a broken libcrypto, a
/// driver error without a category, a URL the client refuses after dld accepted it) are
/// built by the functions that make them in `TransferMessageTests`.
@Suite(.serialized) struct ErrorMessageTests {
    @Test func everyJobErrorCodeHasAMessageForAPerson() async throws {
        var seen: [String: String] = [:]
        func check(_ job: JSONValue, _ code: String, names: [String], sourceLocation: SourceLocation = #_sourceLocation) {
            #expect(job["error"]?["code"]?.stringValue == code, "\(job.serializedString())", sourceLocation: sourceLocation)
            let message = job["error"]?["message"]?.stringValue ?? ""
            let problems = MessageRules.problems(message, mustName: names)
            #expect(problems.isEmpty, "\(code): \(problems): \(message)", sourceLocation: sourceLocation)
            seen[code] = message
        }
        let daemon = try DaemonHarness(
            config: "retry_base = 3600\nretry_max_delay = 3600\nread_timeout = 1\nmin_free = 0\nconnect_timeout = 5\n")
        let tls = try TLSFiles.selfSigned(in: daemon.root)
        let host = "127.0.0.1"
        try await withTLSOrigin(tls) { secure in
            try await withOrigin { origin in
                try daemon.start()
                defer { daemon.stop() }
                let base = origin.baseURL
                func run(_ params: [String: JSONValue], until: @escaping (JSONValue) -> Bool) throws -> JSONValue {
                    try daemon.waitForJob(try daemon.enqueue(params), timeout: 60, until)
                }
                let failed: (JSONValue) -> Bool = { $0["state"] == "failed" }
                func waiting(_ code: String) -> (JSONValue) -> Bool {
                    { $0["state"] == "waiting" && $0["error"]?["code"]?.stringValue == code }
                }

                check(try run(["url": .string("\(base)/status/404"), "name": "a"], until: failed), "http_status", names: [host, "404"])
                check(
                    try run(["url": .string("\(base)/bytes/2000?stall_after=1000"), "name": "b"], until: waiting("timeout")), "timeout",
                    names: [host])
                check(
                    try run(["url": .string("\(base)/close"), "name": "c"], until: waiting("connection_closed")), "connection_closed",
                    names: [host])
                check(
                    try run(["url": "http://no-such-host.invalid/x", "name": "d"], until: waiting("dns_error")), "dns_error",
                    names: ["no-such-host.invalid"])
                let port = try closedPort()
                check(
                    try run(["url": .string("http://127.0.0.1:\(port)/x"), "name": "e"], until: waiting("connection_refused")),
                    "connection_refused", names: ["127.0.0.1:\(port)"])
                check(try run(["url": .string("\(base)/loop"), "name": "f"], until: failed), "too_many_redirects", names: [host])
                check(
                    try run(["url": .string("\(base)/redirect/0?to=ftp%3A%2F%2Fexample.com%2Fx"), "name": "g"], until: failed),
                    "redirect_refused", names: ["ftp"])
                check(
                    try run(
                        [
                            "url": .string("\(base)/bytes/1000"), "name": "h",
                            "checksum": .string("sha256:" + String(repeating: "0", count: 64)),
                        ], until: failed),
                    "checksum_mismatch", names: [host, daemon.downloadDir + "/h.part"])
                check(
                    try run(["url": .string("\(base)/bytes/1000"), "name": "i", "size": 999], until: failed), "size_mismatch", names: [host]
                )
                check(
                    try run(["url": .string("\(secure.baseURL)/bytes/1000"), "name": "j"], until: failed), "tls_untrusted", names: [host])
                check(
                    try run(["url": .string("https://127.0.0.1:\(origin.port)/bytes/1000"), "name": "k"], until: failed), "tls_handshake",
                    names: [host])

                // Truncated, then (resumed) longer than announced.
                let cut = try daemon.enqueue(["url": .string("\(base)/bytes/100000?drop_after=60000&overlong=1000"), "name": "l"])
                check(try daemon.waitForJob(cut, waiting("truncated")), "truncated", names: [host])
                _ = try daemon.call("resume", ["id": .int(cut)])
                check(try daemon.waitForJob(cut, waiting("length_mismatch")), "length_mismatch", names: [host])

                // A TLS file that went away between enqueue and the transfer.
                let copy = daemon.root + "/gone.pem"
                try FileManager.default.copyItem(atPath: tls.certificatePath, toPath: copy)
                let gone = try daemon.enqueue([
                    "url": .string("\(secure.baseURL)/bytes/1000"), "name": "m", "ca_file": .string(copy), "paused": true,
                ])
                try FileManager.default.removeItem(atPath: copy)
                _ = try daemon.call("resume", ["id": .int(gone)])
                check(try daemon.waitForJob(gone, failed), "tls_config", names: [copy])

                // A destination folder that became a file.
                let folder = daemon.downloadDir + "/sub"
                try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
                let lost = try daemon.enqueue(["url": .string("\(base)/bytes/1000"), "dir": .string(folder), "name": "n", "paused": true])
                try FileManager.default.removeItem(atPath: folder)
                try "x".write(toFile: folder, atomically: false, encoding: .utf8)
                _ = try daemon.call("resume", ["id": .int(lost)])
                check(try daemon.waitForJob(lost, failed), "file_error", names: [folder])

                // A file that appears at the destination while downloading.
                let racing = try daemon.enqueue(["url": .string("\(base)/bytes/400000?rate=200000"), "name": "o"])
                try daemon.waitForJob(racing) { $0["state"] == "running" }
                try "mine".write(toFile: daemon.downloadDir + "/o", atomically: false, encoding: .utf8)
                check(try daemon.waitForJob(racing, failed), "destination_exists", names: [daemon.downloadDir + "/o"])

                // A completed file deleted before the next start.
                let kept = try daemon.enqueue(["url": .string("\(base)/bytes/1000"), "name": "p"])
                try daemon.waitForState(kept, ["completed"])
                try FileManager.default.removeItem(atPath: daemon.downloadDir + "/p")
                daemon.stop()
                try daemon.start()
                check(try daemon.waitForJob(kept) { $0["error"] != .null }, "file_missing", names: [daemon.downloadDir + "/p"])
            }
        }

        // Retries that run out, and a disk below the floor: a daemon of their own.
        let strict = try DaemonHarness(config: "max_attempts = 1\nmin_free = 4611686018427387904\n")
        try await withOrigin { origin in
            try strict.start()
            defer { strict.stop() }
            let port = try closedPort()
            let exhausted = try strict.waitForJob(try strict.enqueue(["url": .string("http://127.0.0.1:\(port)/x"), "name": "q"])) {
                $0["state"] == "failed"
            }
            check(exhausted, "retries_exhausted", names: ["127.0.0.1:\(port)", "connection_refused"])
            let full = try strict.waitForJob(try strict.enqueue(["url": .string("\(origin.baseURL)/bytes/1000"), "name": "r"])) {
                $0["state"] == "waiting"
            }
            check(full, "disk_space", names: [strict.downloadDir])
        }

        // Together with the codes shown elsewhere, every documented code was met. Each
        // exemption names the test that asserts the code, and that test's source is read to
        // check that it does: a test renamed, moved or changed no longer exempts a code.
        let elsewhere: [String: (file: String, test: String)] = [
            "tls_expired": ("EndToEndTests/TLSTests", "hostNameExpiredAndNotYetValid"),
            "tls_not_yet_valid": ("EndToEndTests/TLSTests", "hostNameExpiredAndNotYetValid"),
            "tls_hostname": ("EndToEndTests/TLSTests", "hostNameExpiredAndNotYetValid"),
            "tls_client_cert": ("EndToEndTests/TLSTests", "clientCertificate"),
            "disk_full": ("EndToEndTests/FaultTests", "fullDiskWaitsAndRecovers"),
            "proxy_error": ("EndToEndTests/ProxyTests", "httpProxyFromTheEnvironmentAndNoProxy"),
            "proxy_auth": ("EndToEndTests/ProxyTests", "proxyLogin"),
            "started_over": ("EndToEndTests/SpeedTests", "changedURLWithAnotherETagStartsOverWithTheReason"),
            "metered": ("EndToEndTests/MeteredTests", "jobsThatMayNotUseAMeteredConnectionWaitForOneThatIsNot"),
            "no_mirror_left": ("EndToEndTests/MirrorTests", "jobFailsOnlyWhenNoMirrorIsLeft"),
            "hls_assembly": ("EndToEndTests/HLSTests", "undecryptableSegmentFailsTheGroup"),
            "bad_piece": ("EndToEndTests/MetalinkTests", "badPieceFromEveryMirrorFails"),
            // No real part here causes these: built by the functions that make them.
            "digest_error": ("DLTransferTests/TransferMessageTests", "codesNoRealPartCauses"),
            "network_error": ("DLTransferTests/TransferMessageTests", "codesNoRealPartCauses"),
            "invalid_url": ("DLTransferTests/TransferMessageTests", "codesNoRealPartCauses"),
            // A recipient whose key shares no secret with any file key.
            "encryption_error": ("DLTransferTests/AgeTests", "lowOrderRecipientRefused"),
        ]
        for (code, place) in elsewhere.sorted(by: { $0.key < $1.key }) {
            let body = try testSource(place.file, place.test)
            #expect(body?.contains("\"\(code)\"") == true, "\(code) is exempted as asserted by \(place.file).\(place.test), which does not")
        }
        let documented = try documentedJobErrorCodes()
        #expect(documented.count > 20)
        let unmet = documented.subtracting(seen.keys).subtracting(elsewhere.keys)
        #expect(unmet.isEmpty, "not triggered: \(unmet.sorted())")
        let stale = Set(elsewhere.keys).subtracting(documented)
        #expect(stale.isEmpty, "exempted but not documented: \(stale.sorted())")
    }

    /// The source of test `name` in `Tests/<file>.swift`: from its `func` to the next test.
    private func testSource(_ file: String, _ name: String) throws -> Substring? {
        let tests = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        let text = try String(contentsOf: tests.appendingPathComponent(file + ".swift"), encoding: .utf8)
        guard let start = text.range(of: "func \(name)(") else { return nil }
        let end = text.range(of: "@Test", range: start.upperBound..<text.endIndex)?.lowerBound ?? text.endIndex
        return text[start.lowerBound..<end]
    }

    /// A job table that is not a database stops dld at start with SQLite's short reason and the
    /// file named, not the statement GRDB was running.
    @Test func aDamagedJobTableIsNamedInWords() throws {
        let daemon = try DaemonHarness()
        try FileManager.default.createDirectory(atPath: daemon.stateDir, withIntermediateDirectories: true)
        let table = daemon.stateDir + "/jobs.sqlite"
        try Data(repeating: 0x41, count: 4096).write(to: URL(fileURLWithPath: table))
        let run = try runProgram(BuiltProducts.path("dld"), daemon.arguments, environment: daemon.environment)
        #expect(run.status != 0)
        let message = run.stderr.split(separator: "\n").last.map(String.init) ?? ""
        #expect(MessageRules.problems(message, mustName: [table, "damaged"]).isEmpty, "\(run.stderr)")
        #expect(!message.contains("SELECT") && !message.contains("while executing"), "\(message)")
    }
}
