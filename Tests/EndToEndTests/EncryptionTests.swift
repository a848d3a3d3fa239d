import DLCore
import DLRPC
import DLTestSupport
import DLTransfer
import Foundation
import Testing

/// Encryption at rest (issue 11): a job or group encrypted to age recipients is written as
/// ciphertext only, published as `<name>.age`, and decrypted by Debian's `age -d` to the exact
/// bytes the server sent.
@Suite(.serialized) struct EncryptionTests {
    /// The SHA-256 of the origin's first `count` bytes, as dld reports it.
    static func originSHA256(_ count: Int) throws -> String {
        let digest = try #require(StreamingDigest(.sha256))
        digest.update(TestOrigin.bytes(count: count))
        return digest.finalize()
    }

    /// Pieces of the plaintext that no file in `folder` may contain: its start, and 64 bytes at
    /// each MiB. Ciphertext holds no 64 bytes of it by chance.
    static func probes(_ size: Int) -> [Data] {
        stride(from: 0, to: size - 64, by: 1 << 20).map { Data(TestOrigin.bytes(from: Int64($0), count: 64)) }
    }

    /// Every regular file under `folder`: none holds a piece of the plaintext; returns the
    /// names seen.
    static func expectNoPlaintext(in folder: String, probes: [Data], sourceLocation: SourceLocation = #_sourceLocation) throws -> [String] {
        var names: [String] = []
        guard let walker = FileManager.default.enumerator(atPath: folder) else { return [] }
        while let name = walker.nextObject() as? String {
            let path = folder + "/" + name
            var isDirectory: ObjCBool = false
            guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory), !isDirectory.boolValue,
                let data = FileManager.default.contents(atPath: path)
            else { continue }
            names.append(name)
            for probe in probes where data.range(of: probe) != nil {
                Issue.record("\(name) holds plaintext", sourceLocation: sourceLocation)
            }
        }
        return names
    }

    /// A file encrypted by dld decrypts with `age -d -i` to the exact bytes; during the
    /// transfer the folder holds only ciphertext (an age header, never a piece of the file);
    /// the checksum given is verified on the plaintext; one connection, whatever `segments`.
    @Test func encryptedDownloadDecryptsWithAge() async throws {
        try await withOrigin { origin in
            // A read timeout of 30 s, not quickRetries' 1 s: on a loaded machine the origin can
            // pause for a second, and a retry would start the stream again.
            let daemon = try DaemonHarness(config: "retry_base = 0.05\nread_timeout = 30\nmin_free = 0\nsegments = 4\n")
            try daemon.start()
            defer { daemon.stop() }
            let identity = try AgeTool.keygen(in: daemon.root)
            let size = 6 << 20
            let id = try daemon.enqueue([
                "url": .string("\(origin.baseURL)/bytes/\(size)?rate=3000000"), "name": "secret.bin",
                "encrypt_to": [.string(identity.recipient)], "checksum": .string("sha256:" + (try Self.originSHA256(size))),
            ])
            let enqueued = try daemon.job(id)
            #expect(enqueued["path"]?.stringValue == daemon.downloadDir + "/secret.bin.age")
            #expect(enqueued["encrypt_to"] == [.string(identity.recipient)])
            // While it runs, the folder is looked at again and again: only the partial file,
            // starting with the age header, and never a piece of the plaintext.
            let probes = Self.probes(size)
            var looks = 0
            var sawPartial = false
            // 6 MiB at 3 MB/s takes about 2 s; the deadline only keeps a stuck job from
            // hanging the run.
            let deadline = Date().addingTimeInterval(120)
            while try daemon.job(id)["state"] != "completed" {
                guard Date() < deadline else {
                    Issue.record("the job did not complete within 120 s: \(try daemon.job(id).serializedString())")
                    return
                }
                let names = try Self.expectNoPlaintext(in: daemon.downloadDir, probes: probes)
                #expect(names.allSatisfy { $0 == "secret.bin.age.part" || $0 == "secret.bin.age" }, "\(names)")
                if let part = FileManager.default.contents(atPath: daemon.downloadDir + "/secret.bin.age.part"), part.count > 1 << 20 {
                    #expect(part.starts(with: Data("age-encryption.org/v1\n-> X25519 ".utf8)))
                    sawPartial = true
                }
                looks += 1
                #expect(try daemon.job(id)["state"] != "failed")
                if try daemon.job(id)["state"] == "failed" { break }
                usleep(100_000)
            }
            #expect(sawPartial, "the transfer was never seen with a partial file (\(looks) looks)")
            let done = try daemon.job(id)
            #expect(done["sha256"]?.stringValue == (try Self.originSHA256(size)))
            #expect(done["size"]?.int64Value == Int64(size))
            let path = daemon.downloadDir + "/secret.bin.age"
            let onDisk = try FileManager.default.attributesOfItem(atPath: path)[.size] as? Int
            #expect(onDisk.map(Int64.init) == AgeLayout.encryptedSize(plaintext: Int64(size), recipients: 1))
            _ = try Self.expectNoPlaintext(in: daemon.downloadDir, probes: probes)
            #expect(!FileManager.default.fileExists(atPath: daemon.downloadDir + "/secret.bin"))
            #expect(try AgeTool.decrypt(path, identity: identity) == Data(TestOrigin.bytes(count: size)))
            // One stream: no ranged request although the file is large enough for four.
            #expect(origin.requests.count == 1, "\(origin.requests.map { $0.header("range") ?? "-" })")
            #expect(origin.requests.allSatisfy { $0.header("range") == nil })
        }
    }

    /// A recipient that is not one is refused at enqueue with invalid params and a reason.
    @Test func badRecipientIsRefused() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness()
            try daemon.start()
            defer { daemon.stop() }
            let identity = try AgeTool.keygen(in: daemon.root)
            var typo = Array(identity.recipient)
            typo[20] = typo[20] == "q" ? "p" : "q"
            let url = JSONValue.string("\(origin.baseURL)/bytes/1000")
            let mistyped = try daemon.callError("enqueue", ["url": url, "encrypt_to": [.string(String(typo))]])
            #expect(mistyped.code == -32602)
            #expect(mistyped.message.contains("encrypt_to") && mistyped.message.contains("checksum"), "\(mistyped.message)")
            let secret = try String(contentsOfFile: identity.path, encoding: .utf8).split(separator: "\n").first {
                $0.hasPrefix("AGE-SECRET-KEY-")
            }
            let identityGiven = try daemon.callError("enqueue", ["url": url, "encrypt_to": .string(String(try #require(secret)))])
            #expect(identityGiven.code == -32602)
            #expect(identityGiven.message.contains("secret identity"), "\(identityGiven.message)")
            #expect(!identityGiven.message.contains(String(try #require(secret))), "the secret is not echoed back")
            let notString = try daemon.callError("enqueue", ["url": url, "encrypt_to": [1]])
            #expect(notString.code == -32602)
            let empty = try daemon.callError("enqueue", ["url": url, "encrypt_to": []])
            #expect(empty.message.contains("at least one"), "\(empty.message)")
            let group = try daemon.callError(
                "enqueue",
                [
                    "group": ["name": "g", "dir": .string(daemon.downloadDir + "/g")], "jobs": [["url": url]], "encrypt_to": "age1nope",
                ])
            #expect(group.code == -32602)
            #expect(try daemon.call("list")["jobs"]?.arrayValue?.isEmpty == true)
        }
    }

    /// A checksum that the plaintext does not match fails the job, and nothing is published;
    /// what stays in the partial file is ciphertext.
    @Test func checksumMismatchPublishesNothing() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: quickRetries)
            try daemon.start()
            defer { daemon.stop() }
            let identity = try AgeTool.keygen(in: daemon.root)
            let size = 300_000
            let id = try daemon.enqueue([
                "url": .string("\(origin.baseURL)/bytes/\(size)"), "name": "wrong.bin", "encrypt_to": [.string(identity.recipient)],
                "checksum": .string("sha256:" + String(repeating: "0", count: 64)),
            ])
            let failed = try daemon.waitForState(id, ["completed", "failed"])
            #expect(failed["state"] == "failed")
            #expect(failed["error"]?["code"] == "checksum_mismatch", "\(failed.serializedString())")
            #expect(!FileManager.default.fileExists(atPath: daemon.downloadDir + "/wrong.bin.age"))
            #expect(!FileManager.default.fileExists(atPath: daemon.downloadDir + "/wrong.bin"))
            let names = try Self.expectNoPlaintext(in: daemon.downloadDir, probes: [Data(TestOrigin.bytes(count: 64))])
            // The partial file is there (a failed job keeps its bytes), and it is ciphertext:
            // an empty folder would prove nothing.
            #expect(names == ["wrong.bin.age.part"], "\(names)")
            let part = try #require(FileManager.default.contents(atPath: daemon.downloadDir + "/wrong.bin.age.part"))
            #expect(part.starts(with: Data("age-encryption.org/v1\n-> X25519 ".utf8)))
            #expect(part.count > size, "\(part.count) bytes: the whole file, encrypted")
        }
    }

    /// `encrypt_to` on a group encrypts every member: each is published as `<name>.age` and
    /// decrypts to its bytes.
    @Test func groupEncryptionAppliesToMembers() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: quickRetries)
            try daemon.start()
            defer { daemon.stop() }
            let identity = try AgeTool.keygen(in: daemon.root)
            let dir = daemon.downloadDir + "/lesson"
            let result = try daemon.call(
                "enqueue",
                [
                    "group": ["name": "lesson", "dir": .string(dir)], "encrypt_to": [.string(identity.recipient)],
                    "jobs": [
                        ["url": .string("\(origin.baseURL)/bytes/70000"), "name": "video.bin"],
                        ["url": .string("\(origin.baseURL)/bytes/0"), "path": "notes/empty.json"],
                    ],
                ])
            let groupID = try #require(result["group"]?["id"]?.int64Value)
            let paths = result["results"]?.arrayValue?.compactMap { $0["path"]?.stringValue } ?? []
            #expect(paths == [dir + "/video.bin.age", dir + "/notes/empty.json.age"])
            let deadline = Date().addingTimeInterval(60)
            while Date() < deadline, try daemon.call("status", ["group": .int(groupID)])["group"]?["state"] != "completed" {
                usleep(50_000)
            }
            let status = try daemon.call("status", ["group": .int(groupID)])
            #expect(status["group"]?["state"] == "completed", "\(status.serializedString())")
            #expect(try AgeTool.decrypt(dir + "/video.bin.age", identity: identity) == Data(TestOrigin.bytes(count: 70000)))
            #expect(try AgeTool.decrypt(dir + "/notes/empty.json.age", identity: identity).isEmpty)
            #expect(!FileManager.default.fileExists(atPath: dir + "/video.bin"))
        }
    }

    /// A paused encrypted job starts over when resumed, and says so (`started_over`): its file
    /// key was only in memory. The file still decrypts to the exact bytes.
    @Test func resumeStartsOver() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: quickRetries)
            try daemon.start()
            defer { daemon.stop() }
            let identity = try AgeTool.keygen(in: daemon.root)
            let size = 4 << 20
            let id = try daemon.enqueue([
                "url": .string("\(origin.baseURL)/bytes/\(size)?rate=2000000"), "name": "again.bin",
                "encrypt_to": [.string(identity.recipient)],
            ])
            _ = try daemon.waitForJob(id) { ($0["received"]?.int64Value ?? 0) > 0 && $0["state"] == "running" }
            _ = try daemon.call("pause", ["id": .int(id)])
            // A pause syncs and keeps the bytes received: the resume has something to drop.
            let paused = try daemon.job(id)
            #expect(paused["state"] == "paused")
            #expect((paused["received"]?.int64Value ?? 0) > 0, "\(paused.serializedString())")
            _ = try daemon.call("resume", ["id": .int(id)])
            let over = try daemon.waitForJob(id) {
                $0["error"]?["code"] == "started_over" || $0["state"] == "completed" || $0["state"] == "failed"
            }
            #expect(over["error"]?["code"] == "started_over", "\(over.serializedString())")
            #expect(over["error"]?["message"]?.stringValue?.contains("encrypted") == true)
            let done = try daemon.waitForState(id, ["completed", "failed"])
            #expect(done["state"] == "completed", "\(done.serializedString())")
            #expect(try AgeTool.decrypt(daemon.downloadDir + "/again.bin.age", identity: identity) == Data(TestOrigin.bytes(count: size)))
            // Every byte came again from the start: the second request had no Range.
            // (More than two when a loaded machine made a request time out and retry: each is whole.)
            #expect(origin.requests.count >= 2)
            #expect(origin.requests.allSatisfy { $0.header("range") == nil }, "\(origin.requests.map { $0.header("range") ?? "-" })")
        }
    }
    /// SIGKILL mid-encryption leaves nothing under the final name, only ciphertext in the
    /// partial file; the restarted daemon starts the file over and it decrypts exactly.
    @Test func crashMidEncryption() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: quickRetries + "\ncheckpoint_interval = 0.2\n")
            try daemon.start()
            defer { daemon.stop() }
            let identity = try AgeTool.keygen(in: daemon.root)
            let size = 4 << 20
            let id = try daemon.enqueue([
                "url": .string("\(origin.baseURL)/bytes/\(size)?rate=2000000"), "name": "crash.bin",
                "encrypt_to": [.string(identity.recipient)],
            ])
            _ = try daemon.waitForJob(id) { ($0["received"]?.int64Value ?? 0) > 1 << 20 }
            daemon.crash()
            #expect(!FileManager.default.fileExists(atPath: daemon.downloadDir + "/crash.bin.age"))
            #expect(!FileManager.default.fileExists(atPath: daemon.downloadDir + "/crash.bin"))
            let names = try Self.expectNoPlaintext(in: daemon.downloadDir, probes: Self.probes(size))
            #expect(names == ["crash.bin.age.part"], "\(names)")
            try daemon.start()
            let done = try daemon.waitForState(id, ["completed", "failed"])
            #expect(done["state"] == "completed", "\(done.serializedString())")
            #expect(try AgeTool.decrypt(daemon.downloadDir + "/crash.bin.age", identity: identity) == Data(TestOrigin.bytes(count: size)))
            #expect(origin.requests.allSatisfy { $0.header("range") == nil })
        }
    }
    /// `dlctl enqueue --encrypt-to` passes the recipients (repeatable); a bad one is refused
    /// with the daemon's reason and exit status 1.
    @Test func dlctlEncryptTo() async throws {
        try await withOrigin { origin in
            let daemon = try DaemonHarness(config: quickRetries)
            try daemon.start()
            defer { daemon.stop() }
            let first = try AgeTool.keygen(in: daemon.root, name: "one.txt")
            let second = try AgeTool.keygen(in: daemon.root, name: "two.txt")
            let added = try daemon.dlctl([
                "enqueue", "--json", "--encrypt-to", first.recipient, "--encrypt-to", second.recipient, "--name", "cli.bin",
                "\(origin.baseURL)/bytes/5000",
            ])
            #expect(added.status == 0, "\(added.stderr)")
            let id = try #require(try JSONValue.parse(Data(added.stdout.utf8))["job"]?["id"]?.int64Value, "\(added.stdout)")
            let done = try daemon.waitForState(id, ["completed", "failed"])
            #expect(done["state"] == "completed", "\(done.serializedString())")
            #expect(done["encrypt_to"] == [.string(first.recipient), .string(second.recipient)])
            for identity in [first, second] {
                #expect(try AgeTool.decrypt(daemon.downloadDir + "/cli.bin.age", identity: identity) == Data(TestOrigin.bytes(count: 5000)))
            }
            let refused = try daemon.dlctl(["enqueue", "--encrypt-to", "age1typo", "\(origin.baseURL)/bytes/10"])
            #expect(refused.status == 1)
            #expect(refused.stderr.contains("encrypt_to"), "\(refused.stderr)")
        }
    }
}
