import AsyncHTTPClient
import DLCore
import Foundation
import Synchronization

/// The sources of one attempt with mirrors (`MirrorSet`, pure, in DLCore), shared by the
/// attempt's range workers behind a lock.
final class SourceBook: Sendable {
    let state: Mutex<MirrorSet>

    init(_ set: MirrorSet) { self.state = Mutex(set) }

    var column: MirrorColumn { state.withLock { $0.column } }
    var hasMirrors: Bool { state.withLock { $0.hasMirrors } }
    func url(_ index: Int) -> String { state.withLock { $0.sources[index].url } }
}

/// A failure that came from the source of a request (its connection, its status, its body),
/// not from this machine: with mirrors, another source takes the work over.
struct SourceFailure: Error {
    var underlying: any Error
}

extension Downloader {
    /// The attempt's first request, at the committed offset: to the job's URL, or with mirrors
    /// to each live source in turn until one answers with something else than a failure. Its
    /// answer is the reference the other sources' first answers must agree with. A source that
    /// refuses the file (a permanent status) is dropped with the reason; when none is left the
    /// attempt fails with every reason.
    /// It asks from `from` (the committed offset unless an overlap is checked), to `end` when
    /// one is given (the first range of a segmented download).
    func probe(_ request: TransferRequest, state: inout AttemptState, from: Int64? = nil, end: Int64? = nil) async throws
        -> HTTPClientResponse
    {
        let from = from ?? state.received
        guard let book = state.sources else {
            return try await fetch(request, state: &state, rangeFrom: from, rangeEnd: end)
        }
        let candidates = book.state.withLock { $0.live }
        var last: TransferFailure? = nil
        for index in candidates {
            let url = book.url(index)
            do {
                let response = try await fetch(request, state: &state, rangeFrom: from, rangeEnd: end, source: url)
                let status = Int(response.status.code)
                if [200, 206, 416].contains(status) {
                    state.sourceURL = url
                    book.state.withLock { $0.delivered(index) }
                    return response
                }
                let failure = statusFailure(status, response.status.reasonPhrase, response.headers, host: hostName(state))
                _ = try? await response.body.collect(upTo: 64 << 10)
                last = failure
                if try sourceFailed(index, failure, book: book, request: request) { continue }
            } catch let failure as TransferFailure {
                last = failure
                if try sourceFailed(index, failure, book: book, request: request) { continue }
            } catch {
                if error is CancellationError || Task.isCancelled { throw error }
                let failure = await explain(error, request: request, target: state.target, proxy: state.proxy)
                last = failure
                if try sourceFailed(index, failure, book: book, request: request) { continue }
            }
        }
        throw noSourceLeft(book, last: last)
    }

    /// Records a failure of source `index`; true when another source may take the work over,
    /// else throws the attempt's failure.
    @discardableResult
    func sourceFailed(_ index: Int, _ failure: TransferFailure, book: SourceBook, request: TransferRequest) throws -> Bool {
        let url = book.url(index)
        let outcome = book.state.withLock { $0.failed(index, reason: failure.error.message, permanent: failure.kind == .permanent) }
        logger.notice(
            "a source of the file failed",
            metadata: [
                "job": "\(request.jobID)", "url": "\(URLRules.redacted(url))", "error": "\(failure.error.message)",
                "permanent": "\(failure.kind == .permanent)",
            ])
        switch outcome {
        case .elsewhere: return true
        case .exhausted: throw noSourceLeft(book, last: failure)
        }
    }

    /// The failure of an attempt that has no source left: permanent (`no_mirror_left`) when
    /// every one was dropped for good, else the last transient failure's kind, so that the job
    /// is retried later (the next attempt asks the sources set aside again).
    func noSourceLeft(_ book: SourceBook, last: TransferFailure?) -> TransferFailure {
        let (permanent, reasons) = book.state.withLock { set in (set.sources.allSatisfy { $0.dropped != nil }, set.reasons) }
        let kind: FailureKind = permanent ? .permanent : (last?.kind ?? .transient(.retry))
        return TransferFailure(kind, .noMirrorLeft, "no URL of the file is left: \(reasons)", retryAfter: last?.retryAfter)
    }

    /// A failure of a range request or body as the job's error: the source's failure when it
    /// is one (`TransferFailure`), else explained as any transfer error is.
    func sourceFailure(_ error: any Error, request: TransferRequest, target: Target?) async -> TransferFailure {
        if let failure = error as? TransferFailure { return failure }
        return await explain(error, request: request, target: target, proxy: nil)
    }
}
