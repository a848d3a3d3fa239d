import DLCore
@testable import DLTransfer
import Foundation
import Testing

@Suite struct DigestTests {
    /// Known answers for each algorithm (the empty string and "abc").
    @Test func knownAnswers() throws {
        let abc = Array("abc".utf8)
        let expected: [(DigestAlgorithm, String, String)] = [
            (
                .sha256, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
                "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
            ),
            (.sha1, "da39a3ee5e6b4b0d3255bfef95601890afd80709", "a9993e364706816aba3e25717850c26c9cd0d89d"),
            (.md5, "d41d8cd98f00b204e9800998ecf8427e", "900150983cd24fb0d6963f7d28e17f72"),
            (
                .sha512,
                "cf83e1357eefb8bdf1542850d66d8007d620e4050b5715dc83f4a921d36ce9ce47d0d13c5d85f2b0ff8318d2877eec2f63b931bd47417a81a538327af927da3e",
                "ddaf35a193617abacc417349ae20413112e6fa4e89a97ea20a9eeee64b55d39a2192992a274fc1a836ba3c23a3feebbd454d4423643ce80e2a9ac94fa54ca49f"
            ),
        ]
        for (algorithm, empty, ofABC) in expected {
            let digest = try #require(StreamingDigest(algorithm))
            #expect(digest.finalize() == empty, "\(algorithm)")
            digest.update(abc)
            #expect(digest.finalize() == ofABC, "\(algorithm)")
            // Fed in pieces, the digest is the same.
            digest.update(Array(abc[..<1]))
            digest.update(Array(abc[1...]))
            #expect(digest.finalize() == ofABC, "\(algorithm)")
        }
    }

    /// Rebuilding from a partial file then appending equals hashing the whole at once.
    @Test func rebuildFromPartialFile() throws {
        let path = NSTemporaryDirectory() + "dld-digest-\(UUID().uuidString)"
        defer { unlink(path) }
        let bytes = (0..<3_000_000).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ $0 >> 9) }
        let file = try PartialFile(path: path)
        try bytes.withUnsafeBytes { try file.write(UnsafeRawBufferPointer(rebasing: $0[..<2_000_000]), at: 0) }
        let digests = try #require(Digests(Checksum(algorithm: .md5, hex: String(repeating: "0", count: 32))))
        try digests.rebuild(from: file, upTo: 1_500_000)
        bytes[1_500_000...].withUnsafeBytes { digests.update($0) }
        let whole = try #require(StreamingDigest(.sha256))
        whole.update(bytes)
        #expect(digests.sha256.finalize() == whole.finalize())
        let md5 = try #require(StreamingDigest(.md5))
        md5.update(bytes)
        #expect(digests.requested?.finalize() == md5.finalize())
    }
}

@Suite struct PolicyTests {
    /// Checkpoints: by time, or by bytes once the minimum spacing has passed; never with no bytes.
    @Test func checkpointPolicy() {
        let policy = CheckpointPolicy(interval: 2, bytes: 64 << 20, minInterval: 0.5)
        #expect(!policy.isDue(elapsed: 5, bytesSince: 0))
        #expect(policy.isDue(elapsed: 2, bytesSince: 1))
        #expect(!policy.isDue(elapsed: 1.9, bytesSince: 1 << 20))
        #expect(!policy.isDue(elapsed: 0.4, bytesSince: 1 << 30))
        #expect(policy.isDue(elapsed: 0.5, bytesSince: 64 << 20))
    }

    /// The floor plus what the job still needs must be free.
    @Test func diskSpacePolicy() {
        let policy = DiskSpacePolicy(minFree: 1000)
        #expect(policy.allows(free: 1500, remaining: 500))
        #expect(!policy.allows(free: 1499, remaining: 500))
        #expect(policy.allows(free: 1000, remaining: nil))
        #expect(!policy.allows(free: 999, remaining: nil))
        #expect(policy.allows(free: 1000, remaining: -5))
    }

    /// Disk space waits recheck on a fixed period and never give up; time without progress does.
    @Test func retryDecisions() {
        let now = Date(timeIntervalSince1970: 1_800_000_000)
        let policy = BackoffPolicy(base: 2, cap: 600, maxAttempts: 3, giveUpAfter: 3600, diskRecheck: 30)
        let disk = TransferFailure(.transient(.diskSpace), .diskSpace, "full")
        #expect(
            RetryDecision.decide(disk, attempts: 99, sinceProgress: 99_999, policy: policy, now: now, unit: 0.5)
                == .wait(.diskSpace, until: now.addingTimeInterval(30)))
        let flaky = TransferFailure(.transient(.network), .networkError, "reset")
        guard case .fail(let error) = RetryDecision.decide(flaky, attempts: 1, sinceProgress: 3600, policy: policy, now: now, unit: 0.5)
        else {
            Issue.record("expected give-up after give_up_after")
            return
        }
        #expect(error.code == "retries_exhausted")
        #expect(
            RetryDecision.decide(flaky, attempts: 2, sinceProgress: 10, policy: policy, now: now, unit: 0.5)
                == .wait(.network, until: now.addingTimeInterval(2)))
    }

    /// Redirects: relative locations resolve; other schemes and https → http are refused.
    @Test func redirectPolicy() throws {
        let https = try #require(URL(string: "https://a.example/x/y?q=1"))
        #expect(try RedirectPolicy.target(from: https, location: "/z").get().absoluteString == "https://a.example/z")
        #expect(try RedirectPolicy.target(from: https, location: "w").get().absoluteString == "https://a.example/x/w")
        #expect(try RedirectPolicy.target(from: https, location: "https://b.example/").get().host == "b.example")
        for bad in ["http://a.example/z", "ftp://a.example/z", "file:///etc/passwd", "javascript:alert(1)"] {
            guard case .failure(let failure) = RedirectPolicy.target(from: https, location: bad) else {
                Issue.record("followed \(bad)")
                continue
            }
            #expect(failure.error.code == "redirect_refused")
            #expect(failure.kind == .permanent)
        }
        let http = try #require(URL(string: "http://a.example/"))
        #expect(try RedirectPolicy.target(from: http, location: "https://a.example/s").get().scheme == "https")
        // A refused location's password is not in the message, which status and logs show.
        guard case .failure(let downgrade) = RedirectPolicy.target(from: https, location: "http://u:hunter2@b.example/") else {
            Issue.record("followed a downgrade")
            return
        }
        #expect(!downgrade.error.message.contains("hunter2"))
        #expect(downgrade.error.message.contains("u:***@b.example"))
    }

    /// Content-Range parsing.
    @Test func contentRange() {
        #expect(ContentRange("bytes 100-199/1000") == ContentRange(start: 100, end: 199, total: 1000))
        #expect(ContentRange("bytes */1000")?.total == 1000)
        #expect(ContentRange("bytes 100-199/*")?.total == nil)
        #expect(ContentRange("items 1-2/3") == nil)
        #expect(ContentRange(nil) == nil)
        #expect(ContentRange("bytes x-y/z") == nil)
    }

    /// Checksums parse as ALGO:HEX, with sha-256 spelled either way.
    @Test func checksums() throws {
        let hex = String(repeating: "ab", count: 32)
        #expect(try Checksum.parse("sha256:\(hex)").get() == Checksum(algorithm: .sha256, hex: hex))
        #expect(try Checksum.parse("SHA-256:\(hex.uppercased())").get().hex == hex)
        for bad in ["sha256", "sha3:\(hex)", "sha256:abc", "md5:\(hex)", "sha1:zz\(String(repeating: "0", count: 38))"] {
            guard case .failure(let error) = Checksum.parse(bad) else {
                Issue.record("accepted \(bad)")
                continue
            }
            #expect(error.code == .invalidParams)
        }
    }
}

/// What a transfer's progress adds to the daemon's count of received bytes (the metrics'
/// `dld_downloaded_bytes_total`).
@Suite struct ReceivedBytesTests {
    @Test func countsGrowthPastTheResumeOffsetAndBytesReceivedAgain() {
        let counter = ByteCounter()
        // Resumed at 100: those bytes came with an earlier transfer.
        let progress = TransferProgress(received: 100, size: 1000, counter: counter)
        #expect(counter.total == 0)
        progress.update(received: 150, size: 1000)
        progress.update(received: 150, size: 1000)
        #expect(counter.total == 50)
        // Started over from 0 (the server ignored the range): what comes again counts again.
        progress.update(received: 0, size: 1000)
        #expect(counter.total == 50)
        progress.update(received: 30, size: 1000)
        #expect(counter.total == 80)
        // Several transfers add to one counter.
        let other = TransferProgress(received: 0, size: nil, counter: counter)
        other.update(received: 20, size: nil)
        #expect(counter.total == 100)
    }
}
