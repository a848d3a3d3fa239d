import DLCore
import DLRPC
import DLTestSupport
import Foundation
import Testing

/// Starts an https origin with these files, runs `body`, and shuts the origin down.
func withTLSOrigin(_ tls: TLSFiles, _ body: (TestOrigin) async throws -> Void) async throws {
    try await withStarted(try await TestOrigin.start(tls: tls), body)
}

/// A job's final state, once it is no longer queued or running.
func settled(_ daemon: DaemonHarness, _ id: Int64) throws -> JSONValue {
    try daemon.waitForJob(id) { $0["state"] != "queued" && $0["state"] != "running" }
}

/// TLS as people meet it (issue 13): certificates that are self-signed, expired, not yet valid
/// or for another name fail at the first attempt with their own code and a message naming the
/// host; `ca_file` (per job or in the config file) and `SSL_CERT_FILE` make them trusted; a
/// server that wants a client certificate gets one from `client_cert`/`client_key`. All with
/// real certificates made by openssl and a real https origin.
@Suite(.serialized) struct TLSTests {
    /// A self-signed certificate: failed at once (one attempt, no request made) with
    /// `tls_untrusted` and a message that says so in plain words; the same URL with the
    /// certificate as `ca_file` completes; `dlctl status` shows the code beside the state.
    @Test func untrustedFailsAtOnceAndCAFileTrustsIt() async throws {
        let daemon = try DaemonHarness(config: slowRetries)
        let tls = try TLSFiles.selfSigned(in: daemon.root)
        try await withTLSOrigin(tls) { origin in
            try daemon.start()
            defer { daemon.stop() }
            let url = JSONValue.string("\(origin.baseURL)/bytes/5000")
            let refused = try settled(daemon, try daemon.enqueue(["url": url, "name": "untrusted.bin"]))
            #expect(refused["state"] == "failed", "\(refused.serializedString())")
            #expect(refused["attempts"] == 1)
            #expect(refused["error"]?["code"] == "tls_untrusted")
            let message = refused["error"]?["message"]?.stringValue ?? ""
            #expect(message.contains("127.0.0.1") && message.contains("self-signed") && message.contains("ca_file"), "\(message)")
            #expect(origin.requests.isEmpty, "a request went out over an unverified connection")

            let table = try daemon.dlctl(["status"])
            #expect(table.stdout.contains("failed(tls_untrusted)"), "\(table.stdout)")

            let trusted = try daemon.enqueue(["url": url, "name": "trusted.bin", "ca_file": .string(tls.certificatePath)])
            let done = try daemon.waitForState(trusted, ["completed", "failed", "waiting"])
            #expect(done["state"] == "completed", "\(done.serializedString())")
            #expect(done["tls"]?["ca_file"] == .string(tls.certificatePath))
            try expectOriginBytes(at: daemon.downloadDir + "/trusted.bin", count: 5000)
            let detail = try daemon.dlctl(["status", "\(trusted)"])
            #expect(detail.stdout.contains(tls.certificatePath), "\(detail.stdout)")
        }
    }

    /// A group (a chapter from a home server, say) takes the TLS files as a single job does,
    /// for every member: without them the group fails with its member's `tls_untrusted`; with
    /// `dlctl enqueue --group --ca-file` every file is published.
    @Test func groupTakesTheTLSFilesForEveryMember() async throws {
        let daemon = try DaemonHarness(config: slowRetries)
        let tls = try TLSFiles.selfSigned(in: daemon.root)
        try await withTLSOrigin(tls) { origin in
            try daemon.start()
            defer { daemon.stop() }
            let urls = ["\(origin.baseURL)/bytes/3000", "\(origin.baseURL)/bytes/4000"]
            let refused = try daemon.dlctl(["enqueue", "--group", "plain", "-d", daemon.root + "/dl/plain"] + urls + ["--wait"])
            #expect(refused.status == 1, "\(refused.stdout) \(refused.stderr)")
            let plain = try daemon.call("status", ["group": "plain"])
            #expect(plain["group"]?["state"] == "failed", "\(plain.serializedString())")
            #expect(plain.serializedString().contains("tls_untrusted"), "\(plain.serializedString())")

            let dir = daemon.root + "/dl/trusted"
            let trusted = try daemon.dlctl(
                ["enqueue", "--group", "trusted", "-d", dir, "--ca-file", tls.certificatePath] + urls + ["--wait"])
            #expect(trusted.status == 0, "\(trusted.stdout) \(trusted.stderr)")
            try expectOriginBytes(at: dir + "/3000", count: 3000)
            try expectOriginBytes(at: dir + "/4000", count: 4000)
        }
    }

    /// The trust of the whole daemon: `ca_file` in the config file, and `SSL_CERT_FILE` in its
    /// environment, as OpenSSL-based tools read it.
    @Test func configAndEnvironmentTrust() async throws {
        let byConfig = try DaemonHarness(config: slowRetries)
        let tls = try TLSFiles.selfSigned(in: byConfig.root)
        try (slowRetries + "\nca_file = \"\(tls.certificatePath)\"\n").write(
            toFile: byConfig.root + "/config.toml", atomically: true, encoding: .utf8)
        let byEnvironment = try DaemonHarness(config: slowRetries)
        byEnvironment.extraEnvironment = ["SSL_CERT_FILE": tls.certificatePath, "SSL_CERT_DIR": byEnvironment.root + "/no-such-folder"]
        try await withTLSOrigin(tls) { origin in
            for daemon in [byConfig, byEnvironment] {
                try daemon.start()
                defer { daemon.stop() }
                let id = try daemon.enqueue(["url": .string("\(origin.baseURL)/bytes/2000"), "name": "t.bin"])
                let done = try daemon.waitForState(id, ["completed", "failed", "waiting"])
                #expect(done["state"] == "completed", "\(done.serializedString())\n\(daemon.log.suffix(3000))")
            }
            #expect(
                byEnvironment.log.contains("SSL_CERT_DIR entry \(byEnvironment.root)/no-such-folder does not exist"),
                "\(byEnvironment.log.suffix(3000))")
        }
    }

    /// Certificates from a CA the job trusts, each wrong in one way: for another host name,
    /// expired, not yet valid. Each fails at once with its code; one that is right completes.
    @Test func hostNameExpiredAndNotYetValid() async throws {
        let daemon = try DaemonHarness(config: slowRetries)
        let ca = try TestCA.make(in: daemon.root + "/ca")
        let day: TimeInterval = 86_400
        let cases: [(TLSFiles, String?, String)] = [
            (try ca.issue("good"), nil, ""),
            (
                try ca.issue("other-name", commonName: "files.example", subjectAltName: "DNS:files.example"), "tls_hostname",
                "another host name"
            ),
            (
                try ca.issue("expired", notBefore: Date().addingTimeInterval(-30 * day), notAfter: Date().addingTimeInterval(-2 * day)),
                "tls_expired", "expired on"
            ),
            (
                try ca.issue("future", notBefore: Date().addingTimeInterval(10 * day), notAfter: Date().addingTimeInterval(20 * day)),
                "tls_not_yet_valid", "not valid before"
            ),
        ]
        try daemon.start()
        defer { daemon.stop() }
        for (files, code, words) in cases {
            try await withTLSOrigin(files) { origin in
                let id = try daemon.enqueue([
                    "url": .string("\(origin.baseURL)/bytes/3000"), "name": .string("\(code ?? "good").bin"),
                    "ca_file": .string(ca.certificatePath),
                ])
                let job = try settled(daemon, id)
                guard let code else {
                    #expect(job["state"] == "completed", "\(job.serializedString())")
                    return
                }
                #expect(job["state"] == "failed", "\(job.serializedString())")
                #expect(job["attempts"] == 1)
                #expect(job["error"]?["code"] == .string(code), "\(job.serializedString())")
                let message = job["error"]?["message"]?.stringValue ?? ""
                #expect(message.contains("127.0.0.1") && message.contains(words), "\(message)")
                #expect(origin.requests.isEmpty)
            }
        }
    }

    /// A server that asks every client for a certificate from its CA: without one the job
    /// fails with `tls_client_cert`; with `client_cert` and `client_key` it completes.
    @Test func clientCertificate() async throws {
        let daemon = try DaemonHarness(config: slowRetries)
        let ca = try TestCA.make(in: daemon.root + "/ca")
        var server = try ca.issue("server")
        server.clientCAPath = ca.certificatePath
        let client = try ca.issue("client", commonName: "dld client", subjectAltName: "DNS:client.test")
        try daemon.start()
        defer { daemon.stop() }
        try await withTLSOrigin(server) { origin in
            let url = JSONValue.string("\(origin.baseURL)/bytes/4000")
            let without = try settled(
                daemon, try daemon.enqueue(["url": url, "name": "without.bin", "ca_file": .string(ca.certificatePath)]))
            #expect(without["state"] == "failed", "\(without.serializedString())")
            #expect(without["attempts"] == 1)
            #expect(without["error"]?["code"] == "tls_client_cert", "\(without.serializedString())")
            let message = without["error"]?["message"]?.stringValue ?? ""
            #expect(message.contains("127.0.0.1") && message.contains("client_cert"), "\(message)")

            let with = try daemon.enqueue([
                "url": url, "name": "with.bin", "ca_file": .string(ca.certificatePath),
                "client_cert": .string(client.certificatePath), "client_key": .string(client.keyPath),
            ])
            let done = try daemon.waitForState(with, ["completed", "failed", "waiting"])
            #expect(done["state"] == "completed", "\(done.serializedString())")
            try expectOriginBytes(at: daemon.downloadDir + "/with.bin", count: 4000)
        }
    }

    /// TLS files given at enqueue are checked then: relative, missing, not PEM, a certificate
    /// without its key. Each is `invalid_params` naming the file, and no job is made.
    @Test func tlsParamsAreChecked() throws {
        let daemon = try DaemonHarness(config: slowRetries)
        let tls = try TLSFiles.selfSigned(in: daemon.root)
        let notPEM = daemon.root + "/not.pem"
        try "hello\n".write(toFile: notPEM, atomically: true, encoding: .utf8)
        try daemon.start()
        defer { daemon.stop() }
        let url = JSONValue.string("https://127.0.0.1:1/x")
        let bad: [([String: JSONValue], String)] = [
            (["ca_file": "relative.pem"], "absolute"),
            (["ca_file": .string(daemon.root + "/missing.pem")], daemon.root + "/missing.pem"),
            (["ca_file": .string(notPEM)], notPEM),
            (["ca_dir": .string(notPEM)], "not a folder"),
            (["client_cert": .string(tls.certificatePath)], "together"),
            (["client_cert": .string(tls.certificatePath), "client_key": .string(tls.certificatePath)], tls.certificatePath),
        ]
        for (params, words) in bad {
            let error = try daemon.callError("enqueue", params.merging(["url": url]) { a, _ in a })
            #expect(error.data?["code"] == "invalid_params", "\(params)")
            #expect(error.message.contains(words), "\(error.message)")
        }
        let listed = try daemon.call("list")
        #expect(listed["jobs"]?.arrayValue?.isEmpty == true, "\(listed.serializedString())")
    }
}
