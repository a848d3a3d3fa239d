import DLCore
import Foundation
import Testing

/// Live recording's pure parts: the recipe that grows by media sequence number, the recipe a
/// cancel publishes, and the reload policy (with a test clock).
@Suite struct HLSLiveRecipeTests {
    static let url = "https://live.example/s/index.m3u8"

    /// A live window: segments `first..<end` (`seg-N.ts`, the key `k.key` from `keyFrom` on,
    /// without IV), with or without the end tag.
    static func window(_ first: Int, _ end: Int, endList: Bool = false, keyFrom: Int? = nil) throws -> HLSMedia {
        var lines = ["#EXTM3U", "#EXT-X-TARGETDURATION:2", "#EXT-X-MEDIA-SEQUENCE:\(first)"]
        for n in first..<end {
            if n == keyFrom { lines.append("#EXT-X-KEY:METHOD=AES-128,URI=\"k.key\"") }
            lines += ["#EXTINF:2.0,", "seg-\(n).ts"]
        }
        if endList { lines.append("#EXT-X-ENDLIST") }
        guard case .media(let media) = try HLSParser.parse(Array(lines.joined(separator: "\n").utf8), base: url).get() else {
            throw DLError(.internalError, "not a media playlist")
        }
        return media
    }

    /// Planned with `liveURL`, a playlist without end tag stays open at the next sequence
    /// number; without it (or with the end tag) the recipe is closed.
    @Test func planOpensALiveRecipe() throws {
        let live = try HLSRecipe.plan(Self.window(5, 8), layout: .file, liveURL: Self.url).get()
        #expect(live.live == HLSRecipe.Live(url: Self.url, nextSequence: 8))
        #expect(try HLSRecipe.plan(Self.window(5, 8), layout: .file).get().live == nil)
        #expect(try HLSRecipe.plan(Self.window(5, 8, endList: true), layout: .file, liveURL: Self.url).get().live == nil)
        // Stored and read back (older recipes have no `live`: they decode closed).
        #expect(HLSRecipe.decode(live.encoded()) == live)
        var old = live
        old.live = nil
        #expect(HLSRecipe.decode(old.encoded().replacingOccurrences(of: ",\"live\":null", with: "")) == old)
    }

    /// A reload adds only the segments it has not seen, as new members named on; a sliding
    /// window and an unchanged reload add nothing twice; the end tag closes the recipe.
    @Test func reloadsAddUnseenSegments() throws {
        var recipe = try HLSRecipe.plan(Self.window(0, 3), layout: .file, liveURL: Self.url).get()
        #expect(recipe.reloaded(try Self.window(0, 3)).isEmpty)
        let added = recipe.reloaded(try Self.window(1, 5, keyFrom: 4))
        #expect(added == 3..<6)
        #expect(
            recipe.members.map(\.name) == [
                "seg-000000.ts", "seg-000001.ts", "seg-000002.ts", "seg-000003.ts", "seg-000004.ts", "key-0000.key",
            ])
        #expect(recipe.members[3].url == "https://live.example/s/seg-3.ts")
        #expect(recipe.segments.count == 5)
        #expect(recipe.segments.allSatisfy { !$0.discontinuity })
        // The key's IV is the segment's own media sequence number.
        #expect(recipe.segments[4].key == 5 && recipe.segments[4].iv == String(repeating: "0", count: 31) + "4")
        #expect(recipe.live?.nextSequence == 5)
        #expect(recipe.reloaded(try Self.window(2, 5)).isEmpty)
        let last = recipe.reloaded(try Self.window(3, 6, endList: true))
        #expect(last == 6..<7)
        #expect(recipe.live == nil)
        #expect(recipe.segments.count == 6)
        // Closed: a later reload takes nothing.
        #expect(recipe.reloaded(try Self.window(3, 9)).isEmpty && recipe.segments.count == 6)
    }

    /// Segments that slid out of the window before a reload saw them: the next one starts a
    /// discontinuity.
    @Test func missedSegmentsMarkADiscontinuity() throws {
        var recipe = try HLSRecipe.plan(Self.window(0, 2), layout: .file, liveURL: Self.url).get()
        _ = recipe.reloaded(try Self.window(5, 7))
        #expect(recipe.segments.map(\.discontinuity) == [false, false, true, false])
        #expect(recipe.live?.nextSequence == 7)
    }

    /// Stopped (cancel): only the segments whose members are all complete, in order, closed;
    /// the one after a dropped one starts a discontinuity; a segment whose key is not
    /// complete is dropped.
    @Test func stoppedKeepsCompleteSegments() throws {
        var recipe = try HLSRecipe.plan(Self.window(0, 3), layout: .file, liveURL: Self.url).get()
        _ = recipe.reloaded(try Self.window(0, 6, keyFrom: 5))
        // Members: seg 0…4, then key (5), then seg 5 (6).
        let stopped = recipe.stopped(complete: [0, 2, 3, 6])
        #expect(stopped.live == nil)
        #expect(stopped.segments.map(\.member) == [0, 2, 3])
        #expect(stopped.segments.map(\.discontinuity) == [false, true, false])
        #expect(stopped.pieces()?.map(\.name) == ["seg-000000.ts", "seg-000002.ts", "seg-000003.ts"])
        #expect(recipe.stopped(complete: []).segments.isEmpty)
    }
}

/// The reload policy against a test clock.
@Suite struct HLSLivePolicyTests {
    let start = Date(timeIntervalSince1970: 1_000_000)

    @Test func reloadsEveryTargetDuration() {
        var policy = HLSLivePolicy(targetDuration: 4, start: start)
        #expect(policy.first(at: start) == .reload(at: start.addingTimeInterval(4)))
        #expect(policy.next(after: .grew, at: start.addingTimeInterval(4)) == .reload(at: start.addingTimeInterval(8)))
        // A changed target duration is used from then on; 0 is taken as 1 s.
        #expect(
            policy.next(after: .unchanged, at: start.addingTimeInterval(8), targetDuration: 0) == .reload(at: start.addingTimeInterval(9)))
    }

    /// Ten failures in a row end it; a success in between starts the count again.
    @Test func failuresInARowEndIt() {
        var policy = HLSLivePolicy(targetDuration: 1, start: start)
        var clock = start
        for _ in 0..<9 {
            clock += 1
            #expect(policy.next(after: .failed, at: clock) == .reload(at: clock + 1))
        }
        clock += 1
        #expect(policy.next(after: .grew, at: clock) == .reload(at: clock + 1))
        for _ in 0..<9 {
            clock += 1
            #expect(policy.next(after: .failed, at: clock) == .reload(at: clock + 1))
        }
        clock += 1
        guard case .stop(let reason) = policy.next(after: .failed, at: clock) else {
            Issue.record("ten failures in a row did not end the recording")
            return
        }
        #expect(reason.contains("10 reloads"))
    }

    /// No new segment for 30 target durations (at least 60 s) ends it.
    @Test func aStalePlaylistEndsIt() {
        var short = HLSLivePolicy(targetDuration: 1, start: start)
        #expect(short.next(after: .unchanged, at: start + 59) == .reload(at: start + 60))
        #expect(short.next(after: .unchanged, at: start + 60) == .stop("the playlist gained no segment for 60 s"))
        var long = HLSLivePolicy(targetDuration: 6, start: start)
        #expect(long.next(after: .grew, at: start + 100) == .reload(at: start + 106))
        #expect(long.next(after: .unchanged, at: start + 279) == .reload(at: start + 285))
        #expect(long.next(after: .unchanged, at: start + 280) == .stop("the playlist gained no segment for 180 s"))
    }
}
