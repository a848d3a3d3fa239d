import AsyncHTTPClient
import DLCore
import Foundation
import NIOCore
import Synchronization

/// The piece hashes of one attempt (a Metalink's), shared by its range workers: which source
/// served which bytes (what a bad piece blames: a few entries a range, whatever the size),
/// which pieces were checked good as they landed, and the blame so far.
final class PieceTracker: Sendable {
    let pieces: PieceHashes
    private struct State {
        var served: [(bytes: Range<Int64>, source: Int)] = []
        var good: Set<Int> = []
        var checking: Set<Int> = []
        /// Found bad as they landed (their sources are blamed already).
        var bad: Set<Int> = []
        var blame = PieceBlame()
    }
    private let state = Mutex(State())

    init(_ pieces: PieceHashes) { self.pieces = pieces }

    func served(_ bytes: Range<Int64>, source: Int) {
        guard !bytes.isEmpty else { return }
        state.withLock { $0.served.append((bytes, source)) }
    }

    var servedLog: [(bytes: Range<Int64>, source: Int)] { state.withLock { $0.served } }
    var good: Set<Int> { state.withLock { $0.good } }
    var foundBad: Set<Int> { state.withLock { $0.bad } }

    /// Counts a bad piece against `source`; true when that drops it (`PieceBlame`).
    func blame(_ source: Int) -> Bool { state.withLock { $0.blame.blame(source) } }

    /// The pieces near `written` that have landed whole and that nobody checked or checks.
    func claim(near written: Range<Int64>, layout: SegmentLayout) -> [Int] {
        let landed = pieces.landed(near: written, layout: layout)
        return state.withLock { state in
            let mine = landed.filter { !state.good.contains($0) && !state.bad.contains($0) && !state.checking.contains($0) }
            state.checking.formUnion(mine)
            return mine
        }
    }

    /// The file starts over from byte 0: no piece is checked, no byte served (the blame stays).
    func startOver() {
        state.withLock { state in
            state.served = []
            state.good = []
            state.bad = []
        }
    }

    /// Gives a claimed piece back unchecked (its read failed): the end's check reads it.
    func unclaim(_ index: Int) {
        state.withLock { _ = $0.checking.remove(index) }
    }

    func checked(_ index: Int, good: Bool) {
        state.withLock { state in
            state.checking.remove(index)
            if good { state.good.insert(index) } else { state.bad.insert(index) }
        }
    }
}

/// Piece hashes (a Metalink's): each piece is read back and hashed as soon as a range worker
/// has written its last byte (`checkLanded`), and the sources that served a bad one are
/// blamed (`PieceBlame`: dropped with `bad_piece` after three, so that no more ranges go to
/// them). Once every byte has landed, the pieces not yet found good (bad ones, and those of
/// bytes kept from an earlier attempt) are checked (`checkPieces`); a bad one is fetched again
/// from a source that did not serve it. Only when a piece was replaced are the whole-file
/// digests computed again from the file.
extension Downloader {
    /// The source index a request without mirrors counts as.
    static let onlySource = 0

    /// Checks the pieces that the bytes just written in `written` completed. Reads them back
    /// (they were just written: the page cache has them); a bad one blames who served it.
    func checkLanded(_ tracker: PieceTracker, written: Range<Int64>, run: StreamRun, book: SourceBook?, request: TransferRequest)
        throws(TransferFailure)
    {
        let layout = run.state.withLock { $0.planner.layout }
        let claimed = tracker.claim(near: written, layout: layout)
        guard !claimed.isEmpty else { return }
        let pieces = tracker.pieces
        guard let digest = StreamingDigest(pieces.algorithm) else { throw Self.digestFailure(request.path) }
        var buffer = [UInt8](repeating: 0, count: Int(min(pieces.length, 1 << 20)))
        for index in claimed {
            let range = pieces.range(of: index, size: layout.size)
            _ = digest.reset()
            do throws(TransferFailure) {
                try run.file.read(range, buffer: &buffer) { digest.update($0) }
            } catch {
                tracker.unclaim(index)
                throw error
            }
            let good = digest.finalize() == pieces.hashes[index]
            tracker.checked(index, good: good)
            guard !good else { continue }
            logger.notice("a piece does not match its hash", metadata: ["job": "\(request.jobID)", "piece": "\(index)"])
            for source in PieceBlame.suspects(of: range, in: tracker.servedLog) where tracker.blame(source) {
                _ = book?.state.withLock {
                    $0.failed(source, reason: PieceBlame.reason(PieceBlame.maxBadPieces, pieces.algorithm), permanent: true)
                }
            }
        }
    }

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
        let tracker = state.pieceTracker ?? PieceTracker(pieces)
        let good = tracker.good
        var bad: [Int] = []
        for index in pieces.hashes.indices where !good.contains(index) {
            if try !matches(index) { bad.append(index) }
        }
        guard !bad.isEmpty else { return }
        logger.notice("pieces do not match their hashes", metadata: ["job": "\(request.jobID)", "pieces": "\(bad.prefix(20))"])
        let served = tracker.servedLog
        for index in bad {
            let range = pieces.range(of: index, size: size)
            var suspects = PieceBlame.suspects(of: range, in: served)
            if suspects.isEmpty { suspects = [state.sources?.state.withLock { $0.reference } ?? Self.onlySource] }
            // Blamed already if it was found bad as it landed.
            if !tracker.foundBad.contains(index) {
                for source in suspects { drop(source, tracker, pieces.algorithm, state) }
            }
            // Another source than those that served it, else (one URL) the same once more.
            let candidates = state.sources?.state.withLock { set in set.live.filter { !suspects.contains($0) } } ?? []
            var repaired = false
            for source in candidates.isEmpty ? [nil] : candidates.map(Optional.some) {
                let outcome = try await refetch(
                    range, from: source, request: request, state: state, file: file, digest: digest, expected: pieces.hashes[index])
                switch outcome {
                case .good: repaired = true
                case .bad: if let source { drop(source, tracker, pieces.algorithm, state) }
                case .failed(let failure):
                    // A refusal (404) drops the mirror as it would during the transfer.
                    if let source, let book = state.sources, case .permanent = failure.kind {
                        _ = book.state.withLock { $0.failed(source, reason: failure.error.message, permanent: true) }
                    }
                }
                if repaired { break }
            }
            guard repaired else {
                throw TransferFailure(
                    .permanent, .badPiece,
                    "piece \(index) (bytes \(range.lowerBound)-\(range.upperBound - 1)) does not match its \(pieces.algorithm.rawValue) hash from any source; the file is kept at \(request.partialPath) (resume downloads it again)"
                )
            }
        }
        // The streamed digests saw the bad bytes: the whole file is hashed again.
        try digests.rebuild(from: file, upTo: size)
    }

    /// Blames `source` for a bad piece; drops it (with mirrors) once it has served too many.
    private func drop(_ source: Int, _ tracker: PieceTracker, _ algorithm: DigestAlgorithm, _ state: AttemptState) {
        guard tracker.blame(source), let book = state.sources else { return }
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
