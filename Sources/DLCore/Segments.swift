/// Segmented downloads: one file fetched as several byte ranges in parallel, each written in
/// place into the one partial file. Everything here is a value without I/O; the Downloader
/// carries out what it decides (see docs/architecture.md, "Segmented downloads").

/// One byte range of a file: `[start, end)`. The bytes in `[start, done)` are written.
public struct Segment: Sendable, Equatable {
    public var start: Int64
    /// The next byte to write; `done == end` when the range is finished.
    public var done: Int64
    public var end: Int64

    public init(start: Int64, done: Int64, end: Int64) {
        self.start = start
        self.done = done
        self.end = end
    }

    public var isFinished: Bool { done >= end }
    public var remaining: Int64 { max(0, end - done) }
    public var written: Int64 { done - start }
}

/// The ranges of one file: sorted by `start`, adjacent, covering `[0, size)`. This is what
/// the job table keeps (the `segments` column) so that a resume continues every range where
/// its bytes stopped being synced.
public struct SegmentLayout: Sendable, Equatable {
    public private(set) var size: Int64
    public private(set) var segments: [Segment]

    /// A layout with no byte written: one range over the whole file.
    public init(size: Int64) {
        self.init(size: size, prefix: 0)
    }

    /// One stream that has written `prefix` bytes from the start.
    public init(size: Int64, prefix: Int64) {
        self.size = max(0, size)
        segments = [Segment(start: 0, done: min(max(0, prefix), self.size), end: self.size)]
    }

    /// A segmented download from `prefix` on: the rest cut into ranges of `piece` bytes that
    /// workers take in file order, so that the contiguous prefix (and the digest over it)
    /// advances while the file downloads, and what is read back to be hashed was written
    /// moments before. The first range continues the stream that wrote `prefix`, to `firstEnd`
    /// when given (where the attempt's first answer ends), else for one piece.
    public init(size: Int64, prefix: Int64, piece: Int64, firstEnd: Int64? = nil) {
        self.init(size: size, prefix: prefix)
        let piece = max(1, piece)
        var segments: [Segment] = []
        var start: Int64 = 0
        var end = min(self.size, max(firstEnd ?? (max(prefix, 0) + piece), max(prefix, 0) + 1))
        segments.append(Segment(start: 0, done: min(max(0, prefix), self.size), end: end))
        while end < self.size {
            start = end
            end = min(self.size, start + piece)
            segments.append(Segment(start: start, done: start, end: end))
        }
        self.segments = segments
    }

    /// Untouched ranges longer than `piece` cut into pieces: a resumed download takes them in
    /// file order, as a fresh one does (its stored form merged them).
    public func cut(piece: Int64) -> SegmentLayout {
        guard piece > 0 else { return self }
        var pieces: [Segment] = []
        for segment in segments {
            guard segment.done == segment.start, segment.end - segment.start > piece else {
                pieces.append(segment)
                continue
            }
            var start = segment.start
            while start < segment.end {
                let end = min(segment.end, start + piece)
                pieces.append(Segment(start: start, done: start, end: end))
                start = end
            }
        }
        var copy = self
        copy.segments = pieces
        return copy
    }

    /// The range size for `workers` on a file of `size` bytes: about four ranges per worker
    /// (enough for the prefix to move while they run), between `minPiece` and 32 MiB (each
    /// range is one request on a kept-alive connection).
    public static func pieceSize(size: Int64, workers: Int, minPiece: Int64) -> Int64 {
        max(minPiece, min(32 << 20, size / Int64(4 * max(1, workers))))
    }

    /// Where the first request of an attempt that continues `received` bytes ends (exclusive)
    /// when the rest may be fetched as `workers` ranges: a range with an end, so that no byte
    /// past it is sent (a stream cut where its range ends wastes what was in flight). Its answer
    /// is the first range. The size, when known (an earlier attempt, or the client's), gives
    /// the piece of a fresh layout; unknown, the first `minSize` (a smaller file comes whole in
    /// that one answer, and is not cut). Nil: ask to the end (one stream, or too little left).
    public static func firstRequestEnd(received: Int64, size: Int64?, workers: Int, minSize: Int64, minPiece: Int64) -> Int64? {
        guard workers > 1 else { return nil }
        guard let size else { return received + max(minSize, minPiece, 1) }
        guard size - received >= minSize, size > received else { return nil }
        return min(size, received + pieceSize(size: size - received, workers: workers, minPiece: minPiece))
    }

    /// Checked: nil unless the segments are sorted, adjacent, cover `[0, size)`, and each has
    /// `start <= done <= end`.
    public init?(size: Int64, segments: [Segment]) {
        guard size >= 0, !segments.isEmpty else { return nil }
        var expected: Int64 = 0
        for segment in segments {
            guard segment.start == expected, segment.start <= segment.done, segment.done <= segment.end else { return nil }
            expected = segment.end
        }
        guard expected == size else { return nil }
        self.size = size
        self.segments = segments
    }

    /// Bytes written in all ranges (what `received` shows).
    public var written: Int64 { segments.reduce(0) { $0 + $1.written } }

    /// Bytes written without a gap from the start: what can be hashed.
    public var prefix: Int64 {
        for segment in segments where !segment.isFinished { return segment.done }
        return size
    }

    public var isComplete: Bool { segments.allSatisfy(\.isFinished) }

    /// The end of the last written byte: the partial file need not be longer.
    public var furthest: Int64 { segments.map(\.done).max() ?? 0 }

    /// After a crash, what the file really holds: a range cannot have written past the file's
    /// end (a shorter file lowers it), so each `done` is lowered to `onDisk` when above it.
    public func clamped(toFileSize onDisk: Int64) -> SegmentLayout {
        var copy = self
        for i in copy.segments.indices where copy.segments[i].done > onDisk {
            copy.segments[i].done = max(copy.segments[i].start, onDisk)
        }
        return copy
    }

    /// Finished ranges merged into the range after them, and untouched ranges into one: the
    /// stored form stays short however the file was cut.
    public var compacted: SegmentLayout {
        var merged: [Segment] = []
        for segment in segments {
            if let last = merged.last, last.isFinished {
                merged[merged.count - 1] = Segment(start: last.start, done: segment.done, end: segment.end)
            } else if let last = merged.last, last.done == last.start, segment.done == segment.start {
                merged[merged.count - 1] = Segment(start: last.start, done: last.start, end: segment.end)
            } else {
                merged.append(segment)
            }
        }
        var copy = self
        copy.segments = merged
        return copy
    }

    /// The stored form: `start-done-end` per range, comma-separated, compacted. One finished
    /// or untouched whole file needs no layout at all (the caller stores nil then).
    public var encoded: String {
        compacted.segments.map { "\($0.start)-\($0.done)-\($0.end)" }.joined(separator: ",")
    }

    /// Parses the stored form; nil when it is not a valid layout of `size` bytes (the caller
    /// then starts the file over: nothing unproven is kept).
    public init?(encoded text: String, size: Int64) {
        var segments: [Segment] = []
        for part in text.split(separator: ",", omittingEmptySubsequences: false) {
            let numbers = part.split(separator: "-", omittingEmptySubsequences: false)
            guard numbers.count == 3, let start = Int64(numbers[0]), let done = Int64(numbers[1]), let end = Int64(numbers[2]) else {
                return nil
            }
            segments.append(Segment(start: start, done: done, end: end))
        }
        self.init(size: size, segments: segments)
    }
}

/// The live plan of one segmented attempt: which ranges are being fetched, how they are split
/// when a worker runs out of work, how far the contiguous prefix (the part that can be hashed)
/// goes. A worker names its range by an index that stays valid for the whole attempt.
///
/// A worker's cycle: `take()` a range; for each chunk, `reserve` the bytes it may write (up to
/// its range's end), write them, `commit`; when its range is finished, `release` and `take()`
/// again. A range being fetched is never split: every byte of it is asked for (`bytes=a-b`), so
/// a part taken over would be sent twice. Instead, ranges nobody fetches are cut as they are
/// taken into shares that shrink with what is left (`take`), so that near the end of the
/// file every worker holds a small piece and they end together.
public struct SegmentPlanner: Sendable, Equatable {
    /// A range and whether a worker is fetching it. Stored in creation order: an index stays
    /// valid for the whole attempt.
    struct Slot: Sendable, Equatable {
        var segment: Segment
        /// Bytes after `done` that a write in flight will fill.
        var reserved: Int64 = 0
        var active = false
    }

    private var slots: [Slot]
    public let size: Int64
    /// No split leaves a piece smaller than this: each piece costs a request. It starts at
    /// the configured floor and grows with the link's round trip (`noteRange`).
    public private(set) var minPiece: Int64
    /// The configured floor of `minPiece`.
    public let baseMinPiece: Int64
    /// How far the digest has consumed the file.
    public private(set) var hashed: Int64
    /// Whether a worker is hashing now (one at a time, in order).
    public private(set) var hashing = false
    /// The workers that share the ranges: with more than one, ranges are cut into shares as
    /// they are taken.
    public let workers: Int

    public init(_ layout: SegmentLayout, minPiece: Int64, hashed: Int64? = nil, workers: Int = 1) {
        slots = layout.segments.map { Slot(segment: $0) }
        size = layout.size
        self.minPiece = max(1, minPiece)
        self.baseMinPiece = max(1, minPiece)
        self.hashed = hashed ?? layout.prefix
        self.workers = max(1, workers)
    }

    /// The ranges, sorted by start (what a checkpoint stores).
    public var layout: SegmentLayout {
        let sorted = slots.map(\.segment).sorted { $0.start < $1.start }
        return SegmentLayout(size: size, segments: sorted) ?? SegmentLayout(size: size, prefix: 0)
    }

    public func segment(_ index: Int) -> Segment { slots[index].segment }
    public var activeCount: Int { slots.filter(\.active).count }
    public var isComplete: Bool { slots.allSatisfy { $0.segment.isFinished } }

    /// Work for an idle worker: the first range nobody fetches (resumed ranges first, in file
    /// order), cut to its share unless `whole` (the range an open answer already covers). Nil
    /// when every unfinished range is being fetched: those bytes are asked for already.
    public mutating func take(whole: Bool = false) -> Int? {
        let idle = slots.indices
            .filter { !slots[$0].active && !slots[$0].segment.isFinished }
            .min { slots[$0].segment.start < slots[$1].segment.start }
        guard let idle else { return nil }
        if !whole { cutShare(idle) }
        slots[idle].active = true
        return idle
    }

    /// Round trips of a connection's bytes that one piece is worth at least (`noteRange`).
    public static let roundTripsPerPiece = 4.0
    /// The largest floor the round trip may set: a piece of the first takes (`pieceSize`).
    public static let maxRoundTripPiece: Int64 = 32 << 20

    /// The shortest wait for an answer's head seen in this attempt (seconds): a round trip
    /// on a kept-alive connection (a new connection's first wait includes its handshakes).
    public private(set) var roundTrip: Double?

    /// A range ended: its request waited `roundTrip` seconds for the answer's head, then its
    /// body came at `rate` bytes per second. Every piece costs its connection one idle round
    /// trip (the next request leaves only when the range before it on that connection has
    /// ended), so over a link with round trips small pieces waste a share of the time: the
    /// floor of a piece becomes `roundTripsPerPiece` round trips of that connection's bytes
    /// (at most a fifth of each piece's time is then spent waiting), from the shortest wait
    /// seen and the latest rate. Loopback keeps the configured floor.
    public mutating func noteRange(roundTrip: Double, rate: Double) {
        guard roundTrip.isFinite, rate.isFinite, roundTrip > 0, rate > 0 else { return }
        let trip = min(self.roundTrip ?? roundTrip, roundTrip)
        self.roundTrip = trip
        let worth = min(Self.roundTripsPerPiece * trip * rate, Double(Self.maxRoundTripPiece))
        minPiece = max(baseMinPiece, Int64(worth.rounded()))
    }

    /// The share of one take: what nobody fetches, over twice the workers (guided
    /// self-scheduling), at least `minPiece`. Range `index` keeps its share from its `done`; the
    /// rest becomes a range of its own, taken later. The shares shrink as the file ends, so the
    /// last ones are small and the workers end together.
    private mutating func cutShare(_ index: Int) {
        guard workers > 1 else { return }
        let untaken = slots.filter { !$0.active }.reduce(Int64(0)) { $0 + $1.segment.remaining }
        let share = max(minPiece, untaken / Int64(2 * workers))
        let segment = slots[index].segment
        guard segment.remaining >= share + minPiece else { return }
        let cut = segment.done + share
        slots[index].segment.end = cut
        slots.append(Slot(segment: Segment(start: cut, done: cut, end: segment.end)))
    }

    /// The worker of `index` received `count` bytes at its `done`: how many of them belong to
    /// its range (the rest is past its end: a server that sent more than it was asked).
    public mutating func reserve(_ index: Int, count: Int64) -> Int64 {
        let granted = max(0, min(count, slots[index].segment.remaining - slots[index].reserved))
        slots[index].reserved += granted
        return granted
    }

    /// The reserved bytes of `index` are written.
    public mutating func commit(_ index: Int) {
        slots[index].segment.done += slots[index].reserved
        slots[index].reserved = 0
    }

    /// The worker of `index` stopped (its range finished, or it failed): the range is free for
    /// `take`. Unwritten reservations are dropped.
    public mutating func release(_ index: Int) {
        slots[index].reserved = 0
        slots[index].active = false
    }

    /// Whether the range of `index` is written to its end (which a split may have lowered).
    public func isFinished(_ index: Int) -> Bool { slots[index].segment.isFinished }

    /// Bytes written without a gap from the start.
    public var prefix: Int64 {
        var end: Int64 = 0
        for segment in slots.map(\.segment).sorted(by: { $0.start < $1.start }) {
            guard segment.start == end else { break }
            end = segment.done
            if !segment.isFinished { break }
        }
        return end
    }

    /// The range a worker should hash now, and the role of hasher with it; nil when nothing
    /// new is contiguous or another worker is hashing.
    public mutating func startHashing() -> Range<Int64>? {
        guard !hashing else { return nil }
        let upTo = prefix
        guard upTo > hashed else { return nil }
        hashing = true
        return hashed..<upTo
    }

    /// The hasher consumed the file up to `offset` and gives up the role.
    public mutating func finishHashing(at offset: Int64) {
        hashed = max(hashed, offset)
        hashing = false
    }

    /// Bytes written in all ranges.
    public var written: Int64 { slots.reduce(0) { $0 + $1.segment.written } }
}

/// How many connections a job may hold to its host for its ranges.
public enum SegmentAllowance {
    /// `wanted` ranges at most, within the host's `free` slots, and always the one slot its
    /// claim already counted.
    public static func slots(wanted: Int, free: Int) -> Int {
        max(1, min(wanted, free))
    }
}
