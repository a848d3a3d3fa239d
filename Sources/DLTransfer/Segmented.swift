import AsyncHTTPClient
import DLCore
import Foundation
import NIOCore
import Synchronization

/// How many byte ranges one job fetches at once (segmented downloads), and from what size.
public struct SegmentSettings: Sendable, Equatable {
    /// Ranges fetched at once, at most; 1 fetches one stream. The engine lowers it while the
    /// host is busy: every range holds one of the host's `max_per_host` slots.
    public var count: Int
    /// A file with less than this left to fetch is one stream: a range costs a request.
    public var minSize: Int64
    /// No range is split into pieces smaller than this.
    public var minPiece: Int64

    public init(count: Int = 1, minSize: Int64 = 4 << 20, minPiece: Int64 = 1 << 20) {
        self.count = count
        self.minSize = minSize
        self.minPiece = minPiece
    }
}

/// A ranged request was answered with the whole file (200: the server no longer honours
/// ranges, or the file changed and If-Range said so), or with a range it was not asked for.
/// The attempt goes on as one stream from the start; bytes already written are not trusted.
struct SegmentFallback: Error {
    /// The 200 answer, whose body is the whole file; nil when a new request is needed.
    var response: HTTPClientResponse?
    var reason: String
}

/// An answer open for one range of the planner: its body streams into range `slot`. `end` is
/// where its bytes end when a `206` said so (the rest of the range is asked again); `check` is
/// how many bytes it starts with before the range's `done` that must equal the file's
/// (`OverlapResume`: a resume without a validator), compared and not written.
struct OpenedRange: Sendable {
    var slot: Int
    var response: HTTPClientResponse
    var end: Int64?
    var check: Int64 = 0
    /// How long the request waited for this answer's head (nil: not timed, the attempt's
    /// first answer), for `SegmentPlanner.noteRange`.
    var headWait: Duration? = nil
}

/// The digests of an attempt. The worker that holds the planner's hashing role queues their
/// updates on the attempt's `DigestPipeline`, whose one serial queue runs them in order; the
/// stream drains it before the digests are read, reset or finalized.
final class DigestRole: @unchecked Sendable {
    let digests: Digests
    init(_ digests: Digests) { self.digests = digests }
}

/// What the workers of one attempt share: the planner and the checkpoint in flight.
final class StreamRun: Sendable {
    struct State {
        var planner: SegmentPlanner
        var lastCheckpoint: ContinuousClock.Instant
        var checkpointed: Int64
        /// A sync and commit running off the cooperative threads; at most one.
        var inFlight: Task<Void, any Error>?
        var checkpointing = false
        /// The file's folder was synced by a checkpoint of this attempt (its name is durable).
        var folderSynced = false
        /// A checkpoint that failed (a lost lease, a failed sync): every worker stops.
        var failure: (any Error)?
    }

    let state: Mutex<State>
    let file: PartialFile.Writer
    let digests: DigestRole
    /// The file's size; nil when the server did not say (one stream, to its end).
    let size: Int64?
    let clock = ContinuousClock()
    /// For a job encrypted at rest: every byte goes through it to the file, sealed (one
    /// stream from byte 0); nil: bytes are written as they come, at their offsets.
    let sealed: SealedOutput?
    /// Where the digests are fed, in order, off the receiving threads; nil for a file with
    /// less than `DigestPipeline.worthFrom` left, hashed inline (a thread hop per piece would
    /// cost a small file more than its hash).
    let hashing: DigestPipeline?

    init(planner: SegmentPlanner, file: PartialFile.Writer, digests: DigestRole, size: Int64?, sealed: SealedOutput? = nil) {
        state = Mutex(State(planner: planner, lastCheckpoint: ContinuousClock.now, checkpointed: planner.written))
        self.file = file
        self.digests = digests
        self.size = size
        self.sealed = sealed
        hashing = size.map { $0 - planner.written < DigestPipeline.worthFrom } == true ? nil : DigestPipeline()
    }

    /// Runs `work` on the digests: queued after what came before, or at once without a pipeline.
    func hash(bytes: Int, _ work: @escaping @Sendable () throws(TransferFailure) -> Void) throws(TransferFailure) {
        guard let hashing else { return try work() }
        hashing.submit(bytes: bytes, work)
    }

    var planner: SegmentPlanner { state.withLock { $0.planner } }

    /// The transfer's checkpoint for these ranges: ranges are stored only while they are not
    /// one stream from the start.
    static func checkpoint(_ base: TransferCheckpoint, layout: SegmentLayout, size: Int64?) -> TransferCheckpoint {
        var checkpoint = base
        checkpoint.received = layout.written
        let compact = layout.compacted
        checkpoint.segments = compact.segments.count > 1 ? compact.encoded : nil
        if size != nil { checkpoint.size = layout.size }
        return checkpoint
    }
}

extension Downloader {
    /// Whether the rest of this file is fetched as several ranges: the server takes ranges,
    /// a validator guards them (If-Range), the size is known and enough is left.
    static func segmentable(_ validators: Validators, size: Int64?, received: Int64, settings: SegmentSettings) -> Bool {
        guard settings.count > 1, let size, validators.acceptsRanges, validators.ifRange != nil else { return false }
        return size - received >= settings.minSize
    }

    /// Streams the file into its partial file with up to `workers` ranges at once, from
    /// `layout` on: `first` is an answer already open at the first unfinished byte (its body
    /// is the first range's stream; with `firstCheck`, it starts that many bytes before, to be
    /// compared with the file), else every range starts with a request of its own.
    /// On return `state` holds what is written (not yet synced: the caller syncs).
    func stream(
        _ request: TransferRequest, file: PartialFile, state: inout AttemptState, digests: Digests, layout: SegmentLayout,
        workers: Int, first: HTTPClientResponse?, firstEnd: Int64? = nil, firstCheck: Int64 = 0, progress: TransferProgress,
        checkpoint: @escaping @Sendable (TransferCheckpoint) async throws -> Void
    ) async throws {
        // Encrypted at rest: the file is one stream from 0 (`run` and `attempt` see to it), and
        // it starts with the age header; the plaintext is hashed in memory and never written.
        var sealed: SealedOutput? = nil
        if !request.recipients.isEmpty {
            guard layout.prefix == 0, workers == 1 else {
                throw AgeCrypto.failure("encrypt a download (internal: an encrypted file must be one stream from byte 0)")
            }
            try file.truncate(to: 0)
            sealed = try SealedOutput(recipients: request.recipients, file: file.writer)
        }
        let run = StreamRun(
            planner: SegmentPlanner(layout, minPiece: request.segmentation.minPiece, workers: workers), file: file.writer,
            digests: DigestRole(digests), size: state.size, sealed: sealed)
        let template = state
        let base = state.checkpoint
        // What is written (not synced), for the engine's frequent unsynced records: the ranges
        // as committed to the planner, each after its bytes were handed to pwrite.
        let size = run.size
        progress.setWritten { run.state.withLock { StreamRun.checkpoint(base, layout: $0.planner.layout, size: size) } }
        defer { progress.setWritten(nil) }
        do {
            try await withThrowingTaskGroup(of: Void.self) { group in
                let firstSlot = first == nil ? nil : run.state.withLock { $0.planner.take(whole: true) }
                for worker in 0..<max(1, workers) {
                    let opened =
                        worker == 0
                        ? firstSlot.flatMap { slot in first.map { OpenedRange(slot: slot, response: $0, end: firstEnd, check: firstCheck) }
                        } : nil
                    group.addTask {
                        try await self.work(
                            opened, run: run, request: request, template: template, base: base,
                            progress: progress, checkpoint: checkpoint)
                    }
                }
                try await group.waitForAll()
            }
        } catch let fallback as SegmentFallback {
            // The file is about to be cut to 0: nothing written before may be recorded again.
            progress.setWritten(nil)
            _ = try? await run.state.withLock({ $0.inFlight })?.value
            // The digests start over below: nothing queued may feed them after that.
            try? await run.hashing?.drain()
            let reason = fallback.reason
            logger.notice(
                "the download falls back to one stream from the start", metadata: ["job": "\(request.jobID)", "reason": "\(reason)"])
            // Nothing written so far is trusted: the file starts over, and so do the digests.
            record(run, into: &state)
            startingOver(reason, state: &state, progress: progress, job: request.jobID)
            try file.truncate(to: 0)
            state.received = 0
            state.segments = nil
            digests.sha256.reset()
            digests.requested?.reset()
            let response: HTTPClientResponse
            if let answered = fallback.response {
                response = answered
            } else {
                response = try await fetch(request, state: &state, rangeFrom: 0)
            }
            try expect200(response, host: hostName(state))
            take(response.headers, into: &state)
            if let expected = request.expectedSize, let announced = state.size, expected != announced {
                throw TransferFailure(
                    .permanent, .sizeMismatch, "\(hostName(state)) announces \(announced) bytes, expected \(expected) (size)")
            }
            progress.update(received: 0, size: state.size)
            progress.connections = 1
            if progress.hostConnections != nil {
                progress.hostConnections = [URLRules.hostKey(state.sourceURL ?? request.url): 1]
            }
            try reserveSpace(request, file: file, state: state)
            try await stream(
                request, file: file, state: &state, digests: digests,
                layout: SegmentLayout(size: state.size ?? Int64.max, prefix: 0), workers: 1, first: response,
                progress: progress, checkpoint: checkpoint)
            return
        } catch {
            let inFlight = run.state.withLock { $0.inFlight }
            // A stopped transfer does not wait for a commit that may not come (a shared table
            // that went away): the checkpoint in flight is cancelled (its bytes are synced
            // again before the stop is reported, see `Downloader.run`).
            if Task.isCancelled { inFlight?.cancel() }
            _ = try? await inFlight?.value
            // Queued work reads the file, which the caller closes next.
            try? await run.hashing?.drain()
            record(run, into: &state)
            throw error
        }
        try await run.state.withLock({ $0.inFlight })?.value
        if let failure = run.state.withLock({ $0.failure }) {
            try? await run.hashing?.drain()
            record(run, into: &state)
            throw failure
        }
        // The last bytes may have joined the prefix while another worker held the role.
        do {
            try hashContiguous(run, chunk: nil)
        } catch {
            try? await run.hashing?.drain()
            throw error
        }
        try await run.hashing?.drain()
        record(run, into: &state)
        let planner = run.planner
        if let size = state.size, !planner.isComplete || planner.hashed != size {
            throw TransferFailure(
                .transient(.network), .truncated, "the connections to \(hostName(state)) ended after \(planner.written) of \(size) bytes")
        }
        if state.size == nil { state.size = planner.written }
        // The last chunk is sealed only now that the body has ended: the file is a whole age
        // file from here (not yet synced: the caller syncs).
        try sealed?.finish()
        progress.update(received: state.received, size: state.size)
    }

    /// Copies what the workers wrote into the attempt's state.
    private func record(_ run: StreamRun, into state: inout AttemptState) {
        let layout = run.planner.layout
        let checkpoint = StreamRun.checkpoint(state.checkpoint, layout: layout, size: run.size)
        state.received = checkpoint.received
        state.segments = checkpoint.segments
    }

    /// One worker: streams its first range, then takes more (the next range nobody fetches, cut
    /// to its share) until none is left.
    private func work(
        _ opened: OpenedRange?, run: StreamRun, request: TransferRequest, template: AttemptState,
        base: TransferCheckpoint, progress: TransferProgress, checkpoint: @escaping @Sendable (TransferCheckpoint) async throws -> Void
    ) async throws {
        var next = opened
        let book = template.sources
        while true {
            let open: OpenedRange
            // With mirrors: the source this range is fetched from.
            var source: Int? = nil
            var host = template.target?.host ?? "the server"
            if let opened = next {
                open = opened
                next = nil
                if let book {
                    let url = template.sourceURL ?? request.url
                    source = book.state.withLock { set in
                        let index = set.sources.firstIndex { $0.url == url }
                        if let index { set.opened(index) }
                        return index
                    }
                }
            } else {
                guard let taken = run.state.withLock({ $0.planner.take() }) else { return }
                if let book {
                    guard let picked = book.state.withLock({ $0.pick(allowance: request.hostSlots) }) else {
                        // No live source has a connection left for this worker: the others go on.
                        run.state.withLock { $0.planner.release(taken) }
                        return
                    }
                    source = picked
                    host = Target(url: book.url(picked))?.host ?? host
                }
                let answer: OpenedRange?
                do {
                    answer = try await rangeRequest(taken, source: source, run: run, request: request, template: template)
                } catch let failure as SourceFailure {
                    guard let book, let source else { throw failure.underlying }
                    book.state.withLock { $0.closed(source) }
                    try await moveOn(failure, source: source, book: book, host: host, request: request)
                    continue
                }
                guard let answer else {
                    if let book, let source { book.state.withLock { $0.closed(source) } }
                    return  // retired: the host refused one more connection; the others go on
                }
                open = answer
            }
            let slot = open.slot
            let bodyFrom = (at: ContinuousClock.now, done: run.state.withLock { $0.planner.segment(slot).done })
            // With piece hashes: which source these bytes came from (what a bad piece blames),
            // then the pieces they completed are checked.
            let noteServed = { () -> Range<Int64> in
                guard let tracker = template.pieceTracker else { return 0..<0 }
                let done = run.state.withLock { $0.planner.segment(slot).done }
                let written = bodyFrom.done..<max(bodyFrom.done, done)
                tracker.served(written, source: source ?? Self.onlySource)
                return written
            }
            do {
                try await receive(open, run: run, request: request, host: host, base: base, progress: progress, checkpoint: checkpoint)
                let written = noteServed()
                if let tracker = template.pieceTracker, run.size != nil {
                    try checkLanded(tracker, written: written, run: run, book: book, request: request)
                }
            } catch let failure as SourceFailure {
                _ = noteServed()
                run.state.withLock { $0.planner.release(slot) }
                guard let book, let source else { throw failure.underlying }
                book.state.withLock { $0.closed(source) }
                try await moveOn(failure, source: source, book: book, host: host, request: request)
                continue
            }
            if let book, let source {
                book.state.withLock { set in
                    set.closed(source)
                    set.delivered(source)
                }
            }
            if let wait = open.headWait {
                let took = ContinuousClock.now - bodyFrom.at
                run.state.withLock { state in
                    let bytes = state.planner.segment(slot).done - bodyFrom.done
                    // A short range says little of the rate.
                    guard bytes >= Self.rateSampleBytes else { return }
                    state.planner.noteRange(roundTrip: Self.seconds(wait), rate: Double(bytes) / max(Self.seconds(took), 1e-6))
                }
            }
            run.state.withLock { $0.planner.release(slot) }
            if run.size == nil { return }
        }
    }

    /// The fewest bytes of a range whose time tells its connection's rate.
    static let rateSampleBytes: Int64 = 256 << 10

    static func seconds(_ duration: Duration) -> Double {
        Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18
    }

    /// A range failed on a source: recorded, and the worker goes on with another source (its
    /// range, released, is taken again from where its bytes stopped), or the attempt fails
    /// when no source is left.
    private func moveOn(_ failure: SourceFailure, source: Int, book: SourceBook, host: String, request: TransferRequest) async throws {
        if failure.underlying is CancellationError || Task.isCancelled { throw failure.underlying }
        let target = Target(url: book.url(source))
        let explained = await sourceFailure(failure.underlying, request: request, target: target)
        try sourceFailed(source, explained, book: book, request: request)
    }

    /// Asks for the unwritten part of range `slot` (If-Range: the same file, or all of it);
    /// returns the answer and the end of the bytes it announces (a server may send less than
    /// was asked). Without a validator (one stream continued after a bounded first answer),
    /// it asks from up to 64 KiB before, to be compared with the file (`OverlapResume`).
    /// Nil when this worker should stop: the server refused one more connection for
    /// now while other workers still fetch (they take its range when theirs is done).
    private func rangeRequest(
        _ slot: Int, source: Int?, run: StreamRun, request: TransferRequest, template: AttemptState
    ) async throws -> OpenedRange? {
        let segment = run.state.withLock { $0.planner.segment(slot) }
        let overlap = template.validators.ifRange == nil ? min(OverlapResume.length, segment.done - segment.start) : 0
        var local = template
        let response: HTTPClientResponse
        let book = template.sources
        let asked = ContinuousClock.now
        do {
            response = try await fetch(
                request, state: &local, rangeFrom: segment.done - overlap, rangeEnd: segment.end, source: source.flatMap { book?.url($0) },
                bulk: true)
        } catch {
            run.state.withLock { $0.planner.release(slot) }
            throw SourceFailure(underlying: error)
        }
        let host = local.target?.host ?? "the server"
        let status = Int(response.status.code)
        // A mirror's first answer must be the same file as the reference's (the first answer of
        // the attempt, or the validators the bytes on disk came with); the reference's own
        // answers keep the rules of one server below.
        if let book, let source, book.hasMirrors, source != book.state.withLock({ $0.reference }) {
            if let reason = mirrorDisagreement(response, status: status, source: source, book: book, run: run, template: template) {
                // Its body is another file's: not read (the connection is closed).
                run.state.withLock { $0.planner.release(slot) }
                throw SourceFailure(underlying: TransferFailure(.permanent, .mirrorDisagrees, reason))
            }
        }
        switch status {
        case 206:
            let range = ContentRange(response.headers.first(name: "content-range"))
            if overlap > 0, let size = run.size,
                let refusal = OverlapResume.refusal(start: range?.start, total: range?.total, from: segment.done - overlap, size: size)
            {
                throw SegmentFallback(response: nil, reason: refusal)
            }
            guard let range, range.start == segment.done - overlap, range.total == run.size else {
                throw SegmentFallback(response: nil, reason: "\(host) answered a range request with another range")
            }
            return OpenedRange(slot: slot, response: response, end: range.end.map { $0 + 1 }, check: overlap, headWait: .now - asked)
        case 200:
            var answered = AttemptState(received: 0, size: nil, validators: Validators(), finalURL: nil, target: nil)
            take(response.headers, into: &answered)
            let changed = answered.validators.ifRange != template.validators.ifRange
            throw SegmentFallback(
                response: response,
                reason: changed
                    ? "the file on \(host) changed (its validators differ): starting over"
                    : "\(host) stopped honouring ranges")
        case 416:
            throw SegmentFallback(response: nil, reason: "\(host) refused a range of the file (416): the file may have changed")
        default:
            let failure = statusFailure(Int(response.status.code), response.status.reasonPhrase, response.headers, host: host)
            _ = try? await response.body.collect(upTo: 64 << 10)
            if failure.kind != .permanent {
                let retired = run.state.withLock { state in
                    guard state.planner.activeCount > 1 else { return false }
                    state.planner.release(slot)
                    return true
                }
                if retired {
                    logger.debug(
                        "a range worker stops: the server refused one more connection",
                        metadata: ["job": "\(request.jobID)", "status": "\(response.status.code)"])
                    return nil
                }
            }
            run.state.withLock { $0.planner.release(slot) }
            throw SourceFailure(underlying: failure)
        }
    }

    /// Why the answer of mirror `source` to a range request is not usable, or nil: it must be
    /// a 206 of the asked range, and its first answer must agree with the file on size and
    /// validators (`FileIdentity.disagreement`), else the mirror is dropped for good.
    private func mirrorDisagreement(
        _ response: HTTPClientResponse, status: Int, source: Int, book: SourceBook, run: StreamRun, template: AttemptState
    ) -> String? {
        let headers = response.headers
        let etag = headers.first(name: "etag").flatMap { $0.hasPrefix("W/") ? nil : $0 }
        let reference = FileIdentity(size: run.size, etag: template.validators.etag, lastModified: template.validators.lastModified)
        switch status {
        case 206:
            let total = ContentRange(headers.first(name: "content-range"))?.total
            let answer = FileIdentity(size: total, etag: etag, lastModified: headers.first(name: "last-modified"))
            return book.state.withLock { $0.check(source, answer: answer, reference: reference) }
        case 200:
            let length = headers.first(name: "content-length").flatMap { Int64($0) }
            let answer = FileIdentity(size: length, etag: etag, lastModified: headers.first(name: "last-modified"))
            return reference.disagreement(answer)
                ?? "it answered a range request with the whole file (200): it does not take ranges, or its validators differ"
        case 416:
            return "it refused a range of the file (416): its file is another"
        default:
            return nil  // a failure status: handled as the reference's
        }
    }

    /// The receive loop of every range: each chunk is written at its offset, hashed when it
    /// continues the contiguous prefix, and counted; checkpoints start from here. Returns when
    /// the range is written to its end, or to
    /// `announcedEnd`, where a 206 said its bytes end (the rest of the range is asked again).
    private func receive(
        _ opened: OpenedRange, run: StreamRun, request: TransferRequest, host: String,
        base: TransferCheckpoint, progress: TransferProgress, checkpoint: @escaping @Sendable (TransferCheckpoint) async throws -> Void
    ) async throws {
        let slot = opened.slot
        let announcedEnd = opened.end
        var checking = opened.check
        var chunks = opened.response.body.makeAsyncIterator()
        while true {
            let next: ByteBuffer?
            do {
                next = try await chunks.next()
            } catch {
                throw SourceFailure(underlying: error)
            }
            guard var chunk = next else { break }
            // The one place a transfer meets the speed limits, for every range of every job: it
            // sleeps here (reading nothing more) while it is ahead of them.
            try await limiter.take(chunk.readableBytes, job: request.jobID)
            if checking > 0 {
                // The bytes before the range's `done`, asked again: compared with the file, never
                // written. One that differs means the file changed: it starts over.
                let length = Int(min(checking, Int64(chunk.readableBytes)))
                let done = run.state.withLock { $0.planner.segment(slot).done }
                let served = chunk.readSlice(length: length) ?? ByteBuffer()
                if let at = try Self.firstDifference(served, at: done - checking, file: run.file) {
                    throw SegmentFallback(response: nil, reason: OverlapResume.changed(at: at, offset: done))
                }
                checking -= Int64(length)
                if chunk.readableBytes == 0 { continue }
            }
            let count = Int64(chunk.readableBytes)
            let (offset, granted) = run.state.withLock { state in
                let at = state.planner.segment(slot).done
                return (at, state.planner.reserve(slot, count: count))
            }
            if granted > 0 {
                try chunk.withUnsafeReadableBytes { bytes throws(TransferFailure) in
                    let part = UnsafeRawBufferPointer(rebasing: bytes[..<Int(granted)])
                    if let sealed = run.sealed {
                        try sealed.write(part)
                    } else {
                        try run.file.write(part, at: offset)
                    }
                }
            }
            let now = run.clock.now
            let (due, failure) = run.state.withLock { state -> (TransferCheckpoint?, (any Error)?) in
                state.planner.commit(slot)
                let written = state.planner.written
                // Under the planner's lock, so that the live count never goes back when
                // workers report in another order than they committed.
                progress.update(received: written, size: run.size)
                var due: TransferCheckpoint? = nil
                if !state.checkpointing, state.failure == nil,
                    request.checkpoints.isDue(elapsed: (now - state.lastCheckpoint).seconds, bytesSince: written - state.checkpointed)
                {
                    state.checkpointing = true
                    state.lastCheckpoint = now
                    state.checkpointed = written
                    due = StreamRun.checkpoint(base, layout: state.planner.layout, size: run.size)
                }
                return (due, state.failure)
            }
            if let failure { throw failure }
            // Only the bytes of this range: the rest of the chunk may be past its end.
            try hashContiguous(
                run,
                chunk: granted > 0
                    ? (offset: offset, buffer: chunk.getSlice(at: chunk.readerIndex, length: Int(granted)) ?? ByteBuffer()) : nil)
            await run.hashing?.waitForRoom()
            if let due {
                startCheckpoint(due, run: run, commit: checkpoint)
                try checkFloor(request)
            }
            if granted < count {
                let end = run.state.withLock { $0.planner.segment(slot).end }
                if let size = run.size, end == size {
                    throw SourceFailure(
                        underlying: TransferFailure(
                            .transient(.retry), .lengthMismatch, "\(host) sent more than the \(size) bytes it announced"))
                }
                // The rest of this answer is another range's: the server sent more than it was
                // asked (the connection is closed, the other range asks for its own bytes).
                return
            }
        }
        if checking > 0 {
            throw SourceFailure(
                underlying: TransferFailure(
                    .transient(.network), .truncated, "the connection to \(host) ended before the bytes to compare with the file had come"))
        }
        let segment = run.state.withLock { $0.planner.segment(slot) }
        if let announcedEnd, segment.done >= announcedEnd { return }
        if let size = run.size, !segment.isFinished {
            let written = run.state.withLock { $0.planner.written }
            throw SourceFailure(
                underlying: TransferFailure(
                    .transient(.network), .truncated, "the connection to \(host) ended after \(written) of \(size) bytes"))
        }
    }

    /// Where `served` differs from the file's bytes at `offset` (the file offset of the first byte
    /// that differs), or nil when they are equal.
    static func firstDifference(_ served: ByteBuffer, at offset: Int64, file: PartialFile.Writer) throws(TransferFailure) -> Int64? {
        let count = served.readableBytes
        guard count > 0 else { return nil }
        var buffer = [UInt8](repeating: 0, count: count)
        var position = 0
        var found: Int? = nil
        try file.read(offset..<offset + Int64(count), buffer: &buffer) { disk in
            guard found == nil else { return }
            served.withUnsafeReadableBytes { bytes in
                let part = UnsafeRawBufferPointer(rebasing: bytes[position..<position + disk.count])
                found = OverlapResume.firstDifference(disk, part).map { position + $0 }
            }
            position += disk.count
        }
        return found.map { offset + Int64($0) }
    }

    /// Syncs then commits `due` off the cooperative threads, while the bodies keep streaming.
    private func startCheckpoint(
        _ due: TransferCheckpoint, run: StreamRun, commit: @escaping @Sendable (TransferCheckpoint) async throws -> Void
    ) {
        let file = run.file
        run.state.withLock { state in
            let previous = state.inFlight
            state.inFlight = Task {
                _ = try? await previous?.value
                do {
                    let folder = run.state.withLock { !$0.folderSynced }
                    try await PartialFile.syncData(fd: file.fd, path: file.path, due, folder: folder, then: commit)
                    run.state.withLock {
                        $0.checkpointing = false
                        $0.folderSynced = true
                    }
                } catch {
                    run.state.withLock { state in
                        state.checkpointing = false
                        if state.failure == nil { state.failure = error }
                    }
                    throw error
                }
            }
        }
    }

    /// Feeds the digests what joined the contiguous prefix, in order (queued on the attempt's
    /// `DigestPipeline`, or at once for a small file):
    /// from `chunk` when it is the next piece (the usual case, nothing is read twice), else
    /// read back from the file, where other ranges wrote it moments ago (still in the page
    /// cache). The planner counts a range hashed once it is queued; the stream drains the
    /// pipeline before it trusts the digests. One worker at a time.
    func hashContiguous(_ run: StreamRun, chunk: (offset: Int64, buffer: ByteBuffer)?) throws(TransferFailure) {
        while let range = run.state.withLock({ $0.planner.startHashing() }) {
            var at = range.lowerBound
            let role = run.digests
            do throws(TransferFailure) {
                if let chunk, chunk.offset == at {
                    let length = Int(min(Int64(chunk.buffer.readableBytes), range.upperBound - at))
                    let piece = chunk.buffer.getSlice(at: chunk.buffer.readerIndex, length: length) ?? ByteBuffer()
                    try run.hash(bytes: length) {
                        piece.withUnsafeReadableBytes { role.digests.update($0) }
                    }
                    at += Int64(length)
                }
                if at < range.upperBound {
                    // An encrypted file holds ciphertext: its plaintext is hashed from memory
                    // only (one stream, so the chunk is always the next piece).
                    guard run.sealed == nil else {
                        throw AgeCrypto.failure("hash an encrypted download (internal: its bytes must be hashed as they arrive)")
                    }
                    let rest = at..<range.upperBound
                    let file = run.file
                    try run.hash(bytes: 0) { () throws(TransferFailure) in
                        var buffer = [UInt8](repeating: 0, count: Int(min(rest.upperBound - rest.lowerBound, 1 << 20)))
                        try file.read(rest, buffer: &buffer) { role.digests.update($0) }
                    }
                }
            } catch {
                run.state.withLock { $0.planner.finishHashing(at: range.lowerBound) }
                throw error
            }
            run.state.withLock { $0.planner.finishHashing(at: range.upperBound) }
        }
    }
}
