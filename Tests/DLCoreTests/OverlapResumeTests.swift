import DLCore
import Testing

/// A resume from a server without validators: the last bytes on disk are asked again in the
/// same request and compared; the answer must start there and agree on the total.
@Suite struct OverlapResumeTests {
    private let kib: Int64 = 1 << 10

    @Test func asksTheLast64KiBAgain() {
        #expect(
            OverlapResume.plan(received: 1_000_000, size: 2_000_000, acceptsRanges: true)
                == .check(from: 1_000_000 - 64 * kib, overlap: 64 * kib))
    }

    /// Fewer bytes than the overlap on disk: all of them are compared.
    @Test func comparesWhatThereIs() {
        #expect(OverlapResume.plan(received: 1000, size: 5000, acceptsRanges: true) == .check(from: 0, overlap: 1000))
        #expect(OverlapResume.plan(received: 5000, size: 5000, acceptsRanges: true, overlap: 100) == .check(from: 4900, overlap: 100))
    }

    /// No ranges, no size to check the total against, or more bytes than the file: start over,
    /// saying why.
    @Test func startsOverWhenNothingCanBeChecked() {
        guard case .startOver(let ranges) = OverlapResume.plan(received: 1000, size: 5000, acceptsRanges: false) else {
            Issue.record("a server without ranges is not asked for one")
            return
        }
        #expect(ranges.contains("byte ranges"))
        guard case .startOver(let size) = OverlapResume.plan(received: 1000, size: nil, acceptsRanges: true) else {
            Issue.record("without a size the total cannot be checked")
            return
        }
        #expect(size.contains("no size"))
        guard case .startOver = OverlapResume.plan(received: 6000, size: 5000, acceptsRanges: true) else {
            Issue.record("more bytes than the file cannot be continued")
            return
        }
    }

    /// The answer must start where asked and announce the recorded total.
    @Test func theAnswerMustStartThereWithTheSameTotal() {
        #expect(OverlapResume.refusal(start: 900, total: 5000, from: 900, size: 5000) == nil)
        let elsewhere = OverlapResume.refusal(start: 0, total: 5000, from: 900, size: 5000)
        #expect(elsewhere?.contains("starts at byte 0") == true, "\(elsewhere ?? "nil")")
        let resized = OverlapResume.refusal(start: 900, total: 6000, from: 900, size: 5000)
        #expect(resized?.contains("6000 bytes") == true && resized?.contains("5000-byte") == true, "\(resized ?? "nil")")
        #expect(OverlapResume.refusal(start: 900, total: nil, from: 900, size: 5000) != nil)
        #expect(OverlapResume.refusal(start: nil, total: 5000, from: 900, size: 5000) != nil)
    }

    @Test func findsTheFirstDifference() {
        let disk: [UInt8] = [1, 2, 3, 4, 5]
        let same: [UInt8] = [1, 2, 3, 4, 5]
        let other: [UInt8] = [1, 2, 9, 4, 0]
        disk.withUnsafeBytes { d in
            same.withUnsafeBytes { #expect(OverlapResume.firstDifference(d, $0) == nil) }
            other.withUnsafeBytes { #expect(OverlapResume.firstDifference(d, $0) == 2) }
        }
        #expect(OverlapResume.changed(at: 70, offset: 100).contains("changed"))
    }
}
