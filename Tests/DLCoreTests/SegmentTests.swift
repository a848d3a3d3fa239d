import DLCore
import Testing

@Suite struct SegmentTests {
    private let mib: Int64 = 1 << 20

    /// `take`, which must find work.
    private func take(_ planner: inout SegmentPlanner, sourceLocation: SourceLocation = #_sourceLocation) throws -> Int {
        let taken = planner.take()
        return try #require(taken, sourceLocation: sourceLocation)
    }

    private func reserve(_ planner: inout SegmentPlanner, _ index: Int, count: Int64) -> Int64 {
        planner.reserve(index, count: count)
    }

    /// Ranges nobody fetches are cut as they are taken, into shares of what is left over twice
    /// the workers (at least the minimum piece): taken in file order, shrinking towards the end.
    @Test func takesSharesThatShrinkTowardsTheEnd() throws {
        var planner = SegmentPlanner(SegmentLayout(size: 64 * mib), minPiece: mib, workers: 4)
        var taken: [Int] = []
        for _ in 0..<4 { taken.append(try take(&planner)) }
        #expect(Set(taken).count == 4)
        let shares = taken.map { planner.segment($0) }
        #expect(shares.map(\.start) == [0, 8 * mib, 15 * mib, 21 * mib + 1 * mib / 8])
        #expect(shares[0].end - shares[0].start == 8 * mib)  // 64 / 8
        #expect(zip(shares, shares.dropFirst()).allSatisfy { $0.end == $1.start && $0.end - $0.start >= $1.end - $1.start })
        #expect(planner.activeCount == 4)
        // Taken to the end: every range a worker took stays as it was taken.
        var ends = planner.layout.segments.map(\.end)
        while let next = planner.take() {
            #expect(reserve(&planner, next, count: 64 * mib) == planner.segment(next).remaining)
            planner.commit(next)
            ends = planner.layout.segments.map(\.end)
        }
        #expect(ends.last == 64 * mib)
        let last = planner.layout.segments.suffix(3).map { $0.end - $0.start }
        #expect(last.allSatisfy { $0 <= 2 * mib }, "\(last)")
    }

    /// Over a link with round trips, a piece is worth `roundTripsPerPiece` round trips of a
    /// connection's bytes: from the shortest head wait seen (a new connection's first wait
    /// holds its handshakes) and the latest rate; loopback keeps the configured floor; the
    /// shares of later takes keep to the new floor, so a file over a 40 ms link is fetched
    /// in fewer requests.
    @Test func piecesFollowTheRoundTrip() throws {
        var loopback = SegmentPlanner(SegmentLayout(size: 200 * mib), minPiece: mib, workers: 4)
        loopback.noteRange(roundTrip: 0.000_2, rate: 1e9)
        #expect(loopback.minPiece == mib, "loopback: \(loopback.minPiece)")
        var planner = SegmentPlanner(SegmentLayout(size: 200 * mib), minPiece: mib, workers: 4)
        planner.noteRange(roundTrip: 0.12, rate: 40e6)
        #expect(planner.minPiece == 19_200_000)
        planner.noteRange(roundTrip: 0.04, rate: 40e6)
        #expect(planner.minPiece == 6_400_000)
        planner.noteRange(roundTrip: 0.08, rate: 40e6)
        #expect(planner.minPiece == 6_400_000, "a longer wait later does not count: \(planner.minPiece)")
        planner.noteRange(roundTrip: 0.04, rate: 1e12)
        #expect(planner.minPiece == SegmentPlanner.maxRoundTripPiece)
        planner.noteRange(roundTrip: .nan, rate: 40e6)
        planner.noteRange(roundTrip: 0.04, rate: 0)
        #expect(planner.minPiece == SegmentPlanner.maxRoundTripPiece)

        func requests(_ noted: Bool) -> Int {
            var planner = SegmentPlanner(SegmentLayout(size: 200 * mib), minPiece: mib, workers: 4)
            if noted { planner.noteRange(roundTrip: 0.04, rate: 40e6) }
            var count = 0
            while let next = planner.take() {
                count += 1
                let piece = planner.segment(next).remaining
                if planner.layout.segments.last?.end != planner.segment(next).end || piece > 0 {
                    #expect(piece >= planner.minPiece || planner.segment(next).end == 200 * mib, "piece \(piece)")
                }
                _ = planner.reserve(next, count: piece)
                planner.commit(next)
                planner.release(next)
            }
            return count
        }
        let fine = requests(false)
        let coarse = requests(true)
        #expect(coarse < fine, "requests with the round trip \(coarse), without \(fine)")
    }

    /// A range being fetched is never split: all its bytes are asked for, so taking a part of
    /// it over would have them sent twice. A worker with nothing left to take stops; a range
    /// given up is taken again from its `done`.
    @Test func aRangeInFlightIsNeverSplit() throws {
        var planner = SegmentPlanner(SegmentLayout(size: 8 * mib), minPiece: mib, workers: 2)
        let whole = planner.take(whole: true)
        let a = try #require(whole)
        #expect(planner.segment(a) == Segment(start: 0, done: 0, end: 8 * mib))
        #expect(reserve(&planner, a, count: mib) == mib)
        planner.commit(a)
        // a has 7 MiB left, all asked for: nothing is handed out, and a keeps its end.
        let none = planner.take()
        #expect(none == nil)
        #expect(planner.segment(a).end == 8 * mib)
        // a gave up: its rest is taken again from its done, cut to a share (7 MiB over 4).
        planner.release(a)
        let again = planner.take()
        #expect(again == a)
        #expect(planner.segment(a) == Segment(start: 0, done: mib, end: mib + 7 * mib / 4))
        let rest = try take(&planner)
        #expect(planner.segment(rest).start == mib + 7 * mib / 4)
        #expect(reserve(&planner, a, count: 8 * mib) == 7 * mib / 4)  // clipped at its end
    }

    /// `whole` takes the range an open answer covers as it is.
    @Test func theFirstAnswersRangeIsTakenWhole() throws {
        var planner = SegmentPlanner(
            SegmentLayout(size: 64 * mib, prefix: 0, piece: 4 * mib, firstEnd: 16 * mib), minPiece: mib, workers: 4)
        let whole = planner.take(whole: true)
        let first = try #require(whole)
        #expect(planner.segment(first) == Segment(start: 0, done: 0, end: 16 * mib))
        #expect(planner.layout.segments.map(\.end).prefix(3) == [16 * mib, 20 * mib, 24 * mib])
    }

    /// The first request of an attempt has an end when the rest may be fetched in ranges.
    @Test func firstRequestEnd() {
        // Unknown size: the first segment_min_size (a smaller file comes whole).
        #expect(SegmentLayout.firstRequestEnd(received: 0, size: nil, workers: 4, minSize: 4 * mib, minPiece: mib) == 4 * mib)
        // Known: one piece of the rest.
        #expect(SegmentLayout.firstRequestEnd(received: 0, size: 64 * mib, workers: 4, minSize: 4 * mib, minPiece: mib) == 4 * mib)
        #expect(SegmentLayout.firstRequestEnd(received: mib, size: 1 << 30, workers: 4, minSize: 4 * mib, minPiece: mib) == 33 * mib)
        // One stream, or too little left: to the end.
        #expect(SegmentLayout.firstRequestEnd(received: 0, size: nil, workers: 1, minSize: 4 * mib, minPiece: mib) == nil)
        #expect(SegmentLayout.firstRequestEnd(received: 0, size: 3 * mib, workers: 4, minSize: 4 * mib, minPiece: mib) == nil)
        #expect(SegmentLayout.firstRequestEnd(received: 60 * mib, size: 62 * mib, workers: 4, minSize: 4 * mib, minPiece: mib) == nil)
    }

    /// The prefix grows only over contiguous written bytes; a later range's bytes join it when
    /// the gap before them is filled. One worker hashes at a time.
    @Test func prefixAndHashing() throws {
        var planner = SegmentPlanner(SegmentLayout(size: 4 * mib, prefix: 0, piece: 2 * mib), minPiece: mib)
        let a = try take(&planner)
        let b = try take(&planner)  // a: [0,2), b: [2,4)
        #expect(reserve(&planner, b, count: mib) == mib)
        planner.commit(b)
        #expect(planner.prefix == 0)
        let nothing = planner.startHashing()
        #expect(nothing == nil)
        #expect(reserve(&planner, a, count: mib) == mib)
        planner.commit(a)
        let started = planner.startHashing()
        let first = try #require(started)
        #expect(first == 0..<mib)
        let busy = planner.startHashing()
        #expect(busy == nil)  // one hasher at a time
        #expect(reserve(&planner, a, count: mib) == mib)
        planner.commit(a)
        planner.finishHashing(at: first.upperBound)
        // a is finished: the prefix runs through b's written MiB.
        let next = planner.startHashing()
        let second = try #require(next)
        #expect(second == mib..<(3 * mib))
        planner.finishHashing(at: second.upperBound)
        #expect(planner.hashed == 3 * mib)
    }

    /// Resumed ranges are taken again in file order; ranges in flight are never split.
    @Test func resumedRangesComeFirst() throws {
        let layout = try #require(
            SegmentLayout(
                size: 12 * mib,
                segments: [
                    Segment(start: 0, done: 4 * mib, end: 4 * mib),
                    Segment(start: 4 * mib, done: 5 * mib, end: 8 * mib),
                    Segment(start: 8 * mib, done: 10 * mib, end: 12 * mib),
                ]))
        var planner = SegmentPlanner(layout, minPiece: mib)
        #expect(planner.hashed == 5 * mib)
        let first = planner.take()
        #expect(first == 1)
        let second = planner.take()
        #expect(second == 2)
        let none = planner.take()
        #expect(none == nil)
        #expect(planner.written == 7 * mib)
    }

    /// A fresh layout is cut into pieces taken in file order: the prefix moves while the file
    /// downloads; untouched pieces are stored as one range.
    @Test func piecesAreTakenInFileOrder() throws {
        let piece = SegmentLayout.pieceSize(size: 64 * mib, workers: 4, minPiece: mib)
        #expect(piece == 4 * mib)
        #expect(SegmentLayout.pieceSize(size: 4 * mib, workers: 4, minPiece: mib) == mib)
        #expect(SegmentLayout.pieceSize(size: 8 << 30, workers: 4, minPiece: mib) == 32 * mib)
        let layout = SegmentLayout(size: 18 * mib, prefix: mib, piece: piece)
        #expect(layout.segments.map(\.end) == [5 * mib, 9 * mib, 13 * mib, 17 * mib, 18 * mib])
        #expect(layout.segments[0].done == mib)
        #expect(layout.encoded == "0-\(mib)-\(5 * mib),\(5 * mib)-\(5 * mib)-\(18 * mib)")
        var planner = SegmentPlanner(layout, minPiece: mib)
        var starts: [Int64] = []
        for _ in 0..<3 { starts.append(planner.segment(try take(&planner)).start) }
        #expect(starts == [0, 5 * mib, 9 * mib])
        #expect(reserve(&planner, 0, count: 4 * mib) == 4 * mib)
        planner.commit(0)
        #expect(planner.prefix == 5 * mib)
        // Resumed from the stored form, the untouched ranges are cut again.
        let resumed = try #require(SegmentLayout(encoded: layout.encoded, size: 18 * mib)).cut(piece: piece)
        #expect(resumed == layout)
    }

    /// The stored form round-trips, compacts finished ranges, and rejects anything that is not
    /// a layout of the file.
    @Test func encodingRoundTripsAndRejectsGarbage() throws {
        let layout = try #require(
            SegmentLayout(
                size: 100,
                segments: [
                    Segment(start: 0, done: 25, end: 25),
                    Segment(start: 25, done: 40, end: 50),
                    Segment(start: 50, done: 75, end: 75),
                    Segment(start: 75, done: 80, end: 100),
                ]))
        #expect(layout.encoded == "0-40-50,50-80-100")
        let decoded = try #require(SegmentLayout(encoded: layout.encoded, size: 100))
        #expect(decoded.written == layout.written)
        #expect(decoded.prefix == 40)
        #expect(decoded == layout.compacted)
        for bad in ["", "0-10-50", "0-10-50,60-60-100", "0-60-50,50-50-100", "x-1-100", "0-1-100,", "0-1-2-100", "5-5-100"] {
            #expect(SegmentLayout(encoded: bad, size: 100) == nil, "\(bad)")
        }
        #expect(SegmentLayout(encoded: "0-10-100", size: 99) == nil)
    }

    /// After a crash, ranges cannot claim bytes past the end of the file.
    @Test func clampedToTheFile() throws {
        let layout = try #require(
            SegmentLayout(
                size: 100,
                segments: [
                    Segment(start: 0, done: 30, end: 50), Segment(start: 50, done: 90, end: 100),
                ]))
        let clamped = layout.clamped(toFileSize: 60)
        #expect(clamped.segments.map(\.done) == [30, 60])
        #expect(layout.clamped(toFileSize: 10).segments.map(\.done) == [10, 50])
        #expect(layout.furthest == 90)
    }

    /// A range cannot take more than its file: bytes past the end are not granted.
    @Test func reserveClipsAtTheEnd() throws {
        var planner = SegmentPlanner(SegmentLayout(size: 10), minPiece: 1)
        let a = try take(&planner)
        #expect(reserve(&planner, a, count: 8) == 8)
        planner.commit(a)
        #expect(reserve(&planner, a, count: 8) == 2)
        planner.commit(a)
        #expect(planner.isComplete)
        #expect(reserve(&planner, a, count: 1) == 0)
    }
}
