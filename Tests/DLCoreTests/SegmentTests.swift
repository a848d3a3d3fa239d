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

    /// Idle workers split the range with the most left in half: four workers on one stream end
    /// with four equal quarters.
    @Test func splitsIntoEqualQuarters() throws {
        var planner = SegmentPlanner(SegmentLayout(size: 64 * mib), minPiece: mib)
        var taken: [Int] = []
        for _ in 0..<4 { taken.append(try take(&planner)) }
        #expect(Set(taken).count == 4)
        let ranges = planner.layout.segments.map { $0.end - $0.start }
        #expect(ranges == [16 * mib, 16 * mib, 16 * mib, 16 * mib])
        #expect(planner.activeCount == 4)
    }

    /// A finished worker takes half of the largest remaining range; never a piece below the
    /// minimum.
    @Test func dynamicSplitTakesHalfOfTheLargestRemaining() throws {
        var planner = SegmentPlanner(SegmentLayout(size: 8 * mib), minPiece: mib)
        let a = try take(&planner)
        let b = try take(&planner)  // a: [0,4), b: [4,8)
        #expect(planner.segment(b).start == 4 * mib)
        // a finishes its half; b has written 1 MiB of its 4.
        #expect(reserve(&planner, a, count: 5 * mib) == 4 * mib)  // clipped at its end
        planner.commit(a)
        #expect(planner.isFinished(a))
        planner.release(a)
        #expect(reserve(&planner, b, count: mib) == mib)
        planner.commit(b)
        let c = try take(&planner)  // half of b's remaining 3 MiB
        #expect(planner.segment(b).end == 6 * mib + mib / 2)
        #expect(planner.segment(c).start == 6 * mib + mib / 2)
        #expect(planner.segment(c).end == 8 * mib)
        // b and c have 1.5 MiB left each: a split would leave a piece below 1 MiB.
        let none = planner.take()
        #expect(none == nil)
        // A worker that gave up frees its range: the next take resumes it, split or not.
        planner.release(c)
        let again = planner.take()
        #expect(again == c)
    }

    /// A write in flight keeps its bytes: a split starts after what is reserved.
    @Test func splitNeverHandsOutReservedBytes() throws {
        var planner = SegmentPlanner(SegmentLayout(size: 8 * mib), minPiece: mib)
        let a = try take(&planner)
        #expect(reserve(&planner, a, count: 2 * mib) == 2 * mib)
        let b = try take(&planner)
        #expect(planner.segment(b).start == 5 * mib)  // 2 + (8 - 2) / 2
        planner.commit(a)
        #expect(planner.segment(a).done == 2 * mib)
        #expect(planner.segment(a).end == 5 * mib)
    }

    /// The prefix grows only over contiguous written bytes; a later range's bytes join it when
    /// the gap before them is filled. One worker hashes at a time.
    @Test func prefixAndHashing() throws {
        var planner = SegmentPlanner(SegmentLayout(size: 4 * mib), minPiece: mib)
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

    /// Resumed ranges are taken again before anything is split, in file order.
    @Test func resumedRangesComeFirst() throws {
        let layout = try #require(SegmentLayout(size: 12 * mib, segments: [
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
        let split = try take(&planner)
        // The range with the most left (3 MiB against 2) is split.
        #expect(planner.segment(split).start == 6 * mib + mib / 2)
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
        let layout = try #require(SegmentLayout(size: 100, segments: [
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
        let layout = try #require(SegmentLayout(size: 100, segments: [
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
