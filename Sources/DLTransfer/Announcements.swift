import DLCore
import NIOHTTP1

// MARK: - RFC 6249 and RFC 3230: mirrors and a digest named by the server

extension Downloader {
    /// Notes what the attempt's answer says of other copies (`Link: <URL>; rel=duplicate`) and
    /// of the file's SHA-256 (`Digest: SHA-256=…`). Only the attempt's own state keeps them:
    /// the first answer's, which defines the file.
    func noteAnnouncements(_ headers: HTTPHeaders, request: TransferRequest, state: inout AttemptState) {
        let links = headers["link"]
        if !links.isEmpty {
            let own = Set([request.url] + request.mirrors.map(\.url))
            let found = RFC6249.duplicates(links).filter { !own.contains($0) }
            if !found.isEmpty { state.duplicates = found }
        }
        if let announced = RFC6249.sha256(digest: headers.first(name: "digest")) { state.announced = announced }
    }

    /// The failure when the file disagrees with the SHA-256 its server announced: a job
    /// without a checksum is checked against it; a job whose own SHA-256 checksum differs from
    /// it fails (the server and the client disagree on the file: neither is taken).
    func announcedMismatch(_ request: TransferRequest, state: AttemptState, sha256: String?) -> TransferFailure? {
        guard let announced = state.announced else { return nil }
        if let expected = request.checksum {
            guard expected.algorithm == .sha256, expected.hex != announced.hex else { return nil }
            return TransferFailure(
                .permanent, .checksumMismatch,
                "\(hostName(state)) announces the file's sha256 as \(announced.hex) (Digest header), but the job's checksum is \(expected.hex); it is kept at \(request.partialPath)"
            )
        }
        guard let sha256, sha256 != announced.hex else { return nil }
        return TransferFailure(
            .permanent, .checksumMismatch,
            "the file from \(hostName(state)) does not match the sha256 its Digest header announced: it is \(sha256), announced \(announced.hex); it is kept at \(request.partialPath) (resume downloads it again)"
        )
    }
}
