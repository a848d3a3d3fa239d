import DLCore
import Testing

@Suite struct MirrorPolicyTests {
    private let reference = FileIdentity(size: 100, etag: "\"v1\"", lastModified: "Mon, 01 Jan 2024 00:00:00 GMT")

    /// Another size, then another strong ETag, then another Last-Modified (only when neither
    /// ETag decides) make a mirror another file; what one side does not say is not held
    /// against it.
    @Test func disagreementOnSizeAndValidators() {
        #expect(reference.disagreement(FileIdentity(size: 101, etag: "\"v1\"", lastModified: nil)) == "size differs: 101 vs 100")
        #expect(
            reference.disagreement(FileIdentity(size: 100, etag: "\"v2\"", lastModified: nil))?.hasPrefix("validator differs: ETag") == true
        )
        #expect(reference.disagreement(FileIdentity(size: 100, etag: "\"v1\"", lastModified: "Tue, 02 Jan 2024 00:00:00 GMT")) == nil)
        #expect(
            reference.disagreement(FileIdentity(size: 100, etag: nil, lastModified: "Tue, 02 Jan 2024 00:00:00 GMT"))?
                .hasPrefix("validator differs: Last-Modified") == true)
        #expect(reference.disagreement(FileIdentity(size: 100, etag: nil, lastModified: nil)) == nil)
        #expect(reference.disagreement(FileIdentity(size: nil, etag: "\"v1\"", lastModified: nil)) == nil)
    }

    /// Requests go round the live sources, within each host's allowance, fewest open first.
    @Test func pickSpreadsWithinAllowance() {
        var set = MirrorSet(url: "http://a:1/f", urlDropped: nil, mirrors: [JobMirror(url: "http://b:2/f")])
        let allowance = ["a:1": 2, "b:2": 1]
        let picks = (0..<4).map { _ in set.pick(allowance: allowance) }
        #expect(picks == [0, 1, 0, nil])
        #expect(set.connectionsByHost == ["a:1": 2, "b:2": 1])
        set.closed(1)
        #expect(set.pick(allowance: allowance) == 1)
    }

    /// A permanent failure drops a mirror for good; transient ones set it aside after three
    /// in a row (bytes in between start the count again); work moves elsewhere while a source
    /// is live.
    @Test func failuresDropOrBench() {
        var set = MirrorSet(url: "http://a/f", urlDropped: nil, mirrors: [JobMirror(url: "http://b/f"), JobMirror(url: "http://c/f")])
        #expect(set.failed(1, reason: "404", permanent: true) == .elsewhere)
        #expect(set.sources[1].dropped == "404")
        #expect(set.failed(2, reason: "reset", permanent: false) == .elsewhere)
        set.delivered(2)
        #expect(set.failed(2, reason: "reset", permanent: false) == .elsewhere)
        #expect(set.failed(2, reason: "reset", permanent: false) == .elsewhere)
        #expect(set.sources[2].isLive)
        #expect(set.failed(2, reason: "reset", permanent: false) == .elsewhere)
        #expect(!set.sources[2].isLive)
        #expect(set.sources[2].dropped == nil)
        #expect(set.live == [0])
        // Only the benched source is left besides the dropped one: transient.
        for _ in 0..<2 { #expect(set.failed(0, reason: "reset", permanent: false) == .elsewhere) }
        #expect(set.failed(0, reason: "reset", permanent: false) == .exhausted(permanent: false))
        // The record keeps drops for good, not what was set aside.
        #expect(
            set.column
                == MirrorColumn(mirrors: [JobMirror(url: "http://b/f", dropped: "404"), JobMirror(url: "http://c/f")], urlDropped: nil))
        #expect(set.reasons.contains("http://b/f: 404"))
    }

    /// Every source dropped for good is a permanent failure; a job run again after that (a
    /// resume) tries them all again. With one URL nothing is recorded.
    @Test func allDroppedIsPermanentAndResumeRevives() {
        var set = MirrorSet(url: "http://a/f", urlDropped: nil, mirrors: [JobMirror(url: "http://b/f")])
        #expect(set.failed(0, reason: "404", permanent: true) == .elsewhere)
        #expect(set.failed(1, reason: "size differs: 2 vs 1", permanent: true) == .exhausted(permanent: true))
        let column = set.column
        let again = MirrorSet(url: "http://a/f", urlDropped: column.urlDropped, mirrors: column.mirrors)
        #expect(again.live == [0, 1])
        var single = MirrorSet(url: "http://a/f", urlDropped: nil, mirrors: [])
        #expect(single.failed(0, reason: "404", permanent: true) == .exhausted(permanent: true))
        #expect(single.sources[0].dropped == nil)
    }

    /// A mirror's first answer is checked once: a disagreeing one is dropped with the reason.
    @Test func firstAnswerIsChecked() {
        var set = MirrorSet(url: "http://a/f", urlDropped: nil, mirrors: [JobMirror(url: "http://b/f"), JobMirror(url: "http://c/f")])
        #expect(
            set.check(1, answer: FileIdentity(size: 101, etag: nil, lastModified: nil), reference: reference) == "size differs: 101 vs 100")
        #expect(set.sources[1].dropped == "size differs: 101 vs 100")
        #expect(set.check(2, answer: FileIdentity(size: 100, etag: "\"v1\"", lastModified: nil), reference: reference) == nil)
        #expect(set.sources[2].verified)
    }

    /// The allowance gives the job's host its claimed slot, then spreads the rest across the
    /// hosts with free slots, mirrors first; a full host gets none.
    @Test func allowanceSpreadsAcrossHosts() {
        #expect(MirrorAllowance.slots(wanted: 4, hosts: ["a", "b"], free: ["a": 4, "b": 4]) == ["a": 2, "b": 2])
        #expect(MirrorAllowance.slots(wanted: 4, hosts: ["a", "b"], free: ["a": 1, "b": 0]) == ["a": 1])
        #expect(MirrorAllowance.slots(wanted: 3, hosts: ["a", "b", "c"], free: ["a": 4, "b": 4, "c": 4]) == ["a": 1, "b": 1, "c": 1])
        #expect(MirrorAllowance.slots(wanted: 1, hosts: ["a", "b"], free: ["a": 0, "b": 4]) == ["a": 1])
    }
}
