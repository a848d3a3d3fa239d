import AsyncHTTPClient
import DLCore
import Foundation
import NIOCore
import Synchronization

/// Which source served which bytes of an attempt: what a bad piece blames. A few entries a
/// range (one each time a worker's request ends), whatever the file's size.
final class ServedLog: Sendable {
    private let entries = Mutex<[(bytes: Range<Int64>, source: Int)]>([])

    func add(_ bytes: Range<Int64>, source: Int) {
        guard !bytes.isEmpty else { return }
        entries.withLock { $0.append((bytes, source)) }
    }

    var all: [(bytes: Range<Int64>, source: Int)] { entries.withLock { $0 } }
}

/// Piece hashes (a Metalink's): once every byte of the file has landed, each piece is read
/// back and hashed; a bad one is fetched again from a source that did not serve it, and the
/// sources that served it are blamed (`PieceBlame`: dropped with `bad_piece` after three).
/// Only when a piece was replaced are the whole-file digests computed again from the file.
extension Downloader {
    /// The source index a request without mirrors counts as.
    static let onlySource = 0

    func checkPieces(
        _ pieces: PieceHashes, request: TransferRequest, file: PartialFile, state: inout AttemptState, digests: Digests
    ) async throws {
        guard let size = state.size, PieceHashes.count(size: size, length: pieces.length) == pieces.hashes.count else {
            throw TransferFailure(
                .permanent, .badPiece,
                "the file is \(state.size.map(String.init) ?? "of unknown size") bytes, which \(pieces.hashes.count) pieces of \(pieces.length) bytes do not cover"
            )
        }
        guard let digest = StreamingDigest(pieces.algorithm) else { throw Self.digestFailure(request.path) }
        let writer = file.writer
        var buffer = [UInt8](repeating: 0, count: Int(min(pieces.length, 1 << 20)))
        func matches(_ index: Int) throws(TransferFailure) -> Bool {
            _ = digest.reset()
            try writer.read(pieces.range(of: index, size: size), buffer: &buffer) { digest.update($0) }
            return digest.finalize() == pieces.hashes[index]
        }
        var bad: [Int] = []
        for index in pieces.hashes.indices where try !matches(index) { bad.append(index) }
        guard !bad.isEmpty else { return }
        logger.notice("pieces do not match their hashes", metadata: ["job": "\(request.jobID)", "pieces": "\(bad.prefix(20))"])
        let served = state.served?.all ?? []
        var blame = state.pieceBlame
        for index in bad {
            let range = pieces.range(of: index, size: size)
            var suspects = PieceBlame.suspects(of: range, in: served)
            if suspects.isEmpty { suspects = [state.sources?.state.withLock { $0.reference } ?? Self.onlySource] }
            for source in suspects { drop(source, &blame, pieces.algorithm, state) }
            // Another source than those that served it, else (one URL) the same once more.
            let candidates = state.sources?.state.withLock { set in set.live.filter { !suspects.contains($0) } } ?? []
            var repaired = false
            for source in candidates.isEmpty ? [nil] : candidates.map(Optional.some) {
                let outcome = try await refetch(
                    range, from: source, request: request, state: state, file: file, digest: digest, expected: pieces.hashes[index])
                switch outcome {
                case .good: repaired = true
                case .bad: if let source { drop(source, &blame, pieces.algorithm, state) }
                case .failed(let failure):
                    // A refusal (404) drops the mirror as it would during the transfer.
                    if let source, let book = state.sources, case .permanent = failure.kind {
                        _ = book.state.withLock { $0.failed(source, reason: failure.error.message, permanent: true) }
                    }
                }
                if repaired { break }
            }
            guard repaired else {
                state.pieceBlame = blame
                throw TransferFailure(
                    .permanent, .badPiece,
                    "piece \(index) (bytes \(range.lowerBound)-\(range.upperBound - 1)) does not match its \(pieces.algorithm.rawValue) hash from any source; the file is kept at \(request.partialPath) (resume downloads it again)"
                )
            }
        }
        state.pieceBlame = blame
        // The streamed digests saw the bad bytes: the whole file is hashed again.
        try digests.rebuild(from: file, upTo: size)
    }

    /// Blames `source` for a bad piece; drops it (with mirrors) once it has served too many.
    private func drop(_ source: Int, _ blame: inout PieceBlame, _ algorithm: DigestAlgorithm, _ state: AttemptState) {
        guard blame.blame(source), let book = state.sources else { return }
        _ = book.state.withLock { $0.failed(source, reason: PieceBlame.reason(PieceBlame.maxBadPieces, algorithm), permanent: true) }
    }

    /// What asking a source for a piece again gave.
    enum Refetch {
        /// The piece matches its hash and is written.
        case good
        /// The source served other bytes.
        case bad
        /// The source did not serve the piece.
        case failed(TransferFailure)
    }

    /// Fetches `range` from `source` (nil: the job's URL), and writes it at its offset if it
    /// matches `expected`.
    private func refetch(
        _ range: Range<Int64>, from source: Int?, request: TransferRequest, state: AttemptState, file: PartialFile,
        digest: StreamingDigest, expected: String
    ) async throws -> Refetch {
        var local = state
        let url = source.flatMap { state.sources?.url($0) }
        let body: ByteBuffer
        do {
            let response = try await fetch(
                request, state: &local, rangeFrom: range.lowerBound, rangeEnd: range.upperBound, source: url, bulk: true)
            let status = Int(response.status.code)
            guard status == 206, ContentRange(response.headers.first(name: "content-range"))?.start == range.lowerBound else {
                _ = try? await response.body.collect(upTo: 64 << 10)
                if status == 206 || status == 200 { return .bad }
                return .failed(statusFailure(status, response.status.reasonPhrase, response.headers, host: hostName(local)))
            }
            body = try await response.body.collect(upTo: Int(range.count))
        } catch let failure as TransferFailure {
            return .failed(failure)
        } catch {
            if error is CancellationError || Task.isCancelled { throw error }
            logger.debug("a piece could not be fetched again", metadata: ["job": "\(request.jobID)", "error": "\(error)"])
            return .failed(TransferFailure(.transient(.network), .networkError, "the piece could not be fetched again"))
        }
        guard Int64(body.readableBytes) == Int64(range.count) else { return .bad }
        _ = digest.reset()
        body.withUnsafeReadableBytes { digest.update($0) }
        guard digest.finalize() == expected else { return .bad }
        try body.withUnsafeReadableBytes { bytes throws(TransferFailure) in try file.write(bytes, at: range.lowerBound) }
        return .good
    }
}
