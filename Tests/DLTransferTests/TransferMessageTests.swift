import AsyncHTTPClient
import DLCore
import DLTestSupport
@testable import DLTransfer
import Foundation
import NIOCore
import Testing

/// The job errors that no real part of the tests can cause (a full disk, a libcrypto that
/// cannot start a digest, a network error of no known kind, a URL the HTTP client refuses
/// after dld accepted it), built by the functions that make them, under the same rules as the
/// others (ErrorMessageTests): the host or file named, no type names or library dumps.
@Suite struct TransferMessageTests {
    let target = Target(host: "files.example", port: 443, isHTTPS: true)

    @Test func codesNoRealPartCauses() {
        let cases: [(TransferFailure, String, String)] = [
            (PartialFile.failure("write", "/srv/x.part", ENOSPC), "disk_full", "/srv/x.part"),
            (PartialFile.failure("open", "/srv/y.part", EACCES), "file_error", "/srv/y.part"),
            (Downloader.digestFailure("/srv/z"), "digest_error", "/srv/z"),
            (Downloader.classify(CancellationError(), target: target), "network_error", "files.example"),
            (Downloader.classify(HTTPClientError.invalidURL, target: target), "invalid_url", "files.example"),
            (Downloader.classify(HTTPClientError.readTimeout, target: target), "timeout", "files.example"),
            (
                Downloader.classify(IOError(errnoCode: ECONNREFUSED, reason: "connect"), target: target), "connection_refused",
                "files.example:443"
            ),
            (Downloader.classify(IOError(errnoCode: ENETUNREACH, reason: "connect"), target: target), "network_error", "files.example:443"),
        ]
        for (failure, code, name) in cases {
            #expect(failure.error.code == code)
            let problems = MessageRules.problems(failure.error.message, mustName: [name])
            #expect(problems.isEmpty, "\(code): \(problems): \(failure.error.message)")
        }
    }

    /// Only certificate faults and refusals are permanent; a broken connection stays transient.
    @Test func tlsKinds() {
        #expect(Downloader.untrusted("h", finding: .expired(Date())).kind == .permanent)
        #expect(Downloader.untrusted("h", finding: .selfSigned).error.message.contains("self-signed"))
        #expect(Downloader.classify(IOError(errnoCode: ECONNRESET, reason: "read"), target: target).kind == .transient(.network))
        #expect(Downloader.classify(HTTPClientError.tlsHandshakeTimeout, target: target).error.code == "timeout")
    }
}
