import DLRPC
import DLTestSupport
import Foundation
import Testing

/// Live HLS recording against nginx: six one-second MPEG-TS segments made by ffmpeg, and a
/// media playlist the test writes itself (atomically: a temporary file renamed over it) as a
/// live stream would grow: a window without EXT-X-ENDLIST, then a later window, then the end.
struct HLSLiveFixture {
    let www: String
    let playlist: String
    /// ffmpeg's own playlist of all six segments (VOD): the frames dld's file must have.
    let full: String
    var lines: [(duration: String, name: String)] = []
    var header: [String] = []

    init(in folder: String) throws {
        www = folder + "/www"
        let live = www + "/live"
        try FileManager.default.createDirectory(atPath: live, withIntermediateDirectories: true)
        try HLSFixture.run(
            HLSFixture.ffmpeg,
            HLSFixture.source(6, size: "320x240") + [
                "-f", "hls", "-hls_time", "1", "-hls_list_size", "0", "-hls_segment_filename", "s_%03d.ts", "all.m3u8",
            ], in: live)
        full = "/live/all.m3u8"
        playlist = live + "/index.m3u8"
        let text = try String(contentsOfFile: live + "/all.m3u8", encoding: .utf8).split(separator: "\n").map(String.init)
        var pending: String?
        for line in text {
            if line.hasPrefix("#EXTINF") {
                pending = line
            } else if let duration = pending, !line.hasPrefix("#") {
                lines.append((duration, line))
                pending = nil
            } else if line.hasPrefix("#EXT-X-TARGETDURATION") || line.hasPrefix("#EXT-X-VERSION") {
                header.append(line)
            }
        }
    }

    /// Writes the live playlist: segments `window` (media sequence numbers = their indices);
    /// `name`: another playlist of the same segments beside it (a second recording's).
    func publish(_ window: Range<Int>, end: Bool = false, as name: String? = nil) throws {
        var text = ["#EXTM3U"] + header + ["#EXT-X-MEDIA-SEQUENCE:\(window.lowerBound)"]
        for index in window { text += [lines[index].duration, lines[index].name] }
        if end { text.append("#EXT-X-ENDLIST") }
        let path = name.map { www + "/live/" + $0 } ?? playlist
        let temporary = path + ".tmp"
        try (text.joined(separator: "\n") + "\n").write(toFile: temporary, atomically: false, encoding: .utf8)
        guard rename(temporary, path) == 0 else { throw HarnessError("rename of the playlist failed") }
    }
}

@Suite(.serialized) struct HLSLiveTests {
    /// Polls until `condition` holds (or fails after two minutes).
    static func eventually(_ what: String, _ condition: () throws -> Bool) throws {
        let deadline = Date().addingTimeInterval(120)
        while Date() < deadline {
            if try condition() { return }
            usleep(50_000)
        }
        throw HarnessError("timed out waiting for \(what)")
    }

    /// The group's members in `state`.
    static func members(_ daemon: DaemonHarness, _ group: Int64, _ state: String) throws -> Int {
        let jobs = try daemon.call("status", ["group": .int(group)])["jobs"]?.arrayValue ?? []
        return jobs.filter { $0["state"] == .string(state) }.count
    }

    /// `live: true`: the first window is fetched and, complete, not published; dld is killed
    /// and restarted (the reloads resume); a slid window adds its new segments; the end tag
    /// closes the recording. The file has the frames of the whole VOD playlist, and each
    /// segment was fetched once.
    @Test func recordsUntilTheEndTag() throws {
        let daemon = try DaemonHarness()
        let fixture = try HLSLiveFixture(in: daemon.root)
        #expect(fixture.lines.count == 6, "\(fixture.lines)")
        let nginx = try TestNginx(serving: fixture.www, in: daemon.root)
        try fixture.publish(0..<3)
        try daemon.start()
        defer { _ = daemon.stop() }
        let refused = try daemon.callError("enqueue", ["url": .string(nginx.url + "/live/index.m3u8")])
        #expect(refused.stableCode == "hls_live" && refused.message.contains("live: true"), "\(refused)")
        let result = try daemon.call("enqueue", ["url": .string(nginx.url + "/live/index.m3u8"), "live": true, "name": "rec.ts"])
        let group = try #require(result["group"]?["id"]?.int64Value)
        #expect(result["group"]?["hls"]?["live"] == true)
        try Self.eventually("the first window") { try Self.members(daemon, group, "completed") == 3 }
        // Complete but still live: not published.
        let open = try daemon.call("status", ["group": .int(group)])["group"]
        #expect(open?["state"] != "completed", "\(open?.serializedString() ?? "")")
        #expect(open?["hls"]?["live"] == true)
        daemon.crash()
        try daemon.start()
        try fixture.publish(2..<5)
        try Self.eventually("the second window") { try Self.members(daemon, group, "completed") == 5 }
        try fixture.publish(3..<6, end: true)
        let wait = try daemon.dlctl(["wait", "--group", String(group)])
        #expect(wait.status == 0, "\(wait.stdout)\n\(wait.stderr)\n\(daemon.log.suffix(3000))")
        let done = try daemon.call("status", ["group": .int(group)])["group"]
        #expect(done?["state"] == "completed")
        #expect(done?["hls"]?["live"] == false)
        #expect(done?["hls"]?["segments"] == 6)
        let out = daemon.downloadDir + "/rec.ts"
        let expected = try HLSFixture.frames(nginx.url + fixture.full)
        #expect(expected.count > 300)
        #expect(try HLSFixture.frames(out) == expected)
        for line in fixture.lines {
            #expect(nginx.count("/live/" + line.name) == 1, "\(line.name): \(nginx.requests)")
        }
    }

    /// `cancel` during a recording publishes the segments fetched so far: a file ffprobe
    /// reads, shorter than the whole; the recording stops: once its playlist has grown, a
    /// second recording (of a copy of the playlist, which reloads as often) is seen to reload
    /// its own twice and take the new segments, while the canceled one's playlist was fetched
    /// no more since the cancel and its group gained no member.
    @Test func cancelPublishesWhatWasFetched() throws {
        let daemon = try DaemonHarness()
        let fixture = try HLSLiveFixture(in: daemon.root)
        let nginx = try TestNginx(serving: fixture.www, in: daemon.root)
        try fixture.publish(0..<3)
        try fixture.publish(0..<3, as: "control.m3u8")
        try daemon.start()
        defer { _ = daemon.stop() }
        let cli = try daemon.dlctl(["enqueue", nginx.url + "/live/index.m3u8", "--live", "--name", "part.ts"])
        #expect(cli.status == 0, "\(cli.stdout)\n\(cli.stderr)")
        let group: Int64 = 1
        try Self.eventually("the first window") { try Self.members(daemon, group, "completed") == 3 }
        _ = try daemon.call("cancel", ["group": .int(group)])
        // A reload under way when the cancel began was answered while the cancel published.
        let fetched = nginx.count("/live/index.m3u8")
        let members = try daemon.call("status", ["group": .int(group)])["jobs"]?.arrayValue?.count ?? -1

        // The second recording, of a copy of the playlist: it reloads as often as the first.
        let result = try daemon.call(
            "enqueue", ["url": .string(nginx.url + "/live/control.m3u8"), "live": true, "name": "control.ts"])
        let control = try #require(result["group"]?["id"]?.int64Value)
        try Self.eventually("the second recording's first window") { try Self.members(daemon, control, "completed") == 3 }
        // Both playlists grow; the second recording reloads twice (a reload interval passes
        // between two) and takes the new segments.
        try fixture.publish(0..<6)
        try fixture.publish(0..<6, as: "control.m3u8")
        let grown = nginx.count("/live/control.m3u8")
        try Self.eventually("two reloads of the grown playlist") {
            try nginx.count("/live/control.m3u8") >= grown + 2 && Self.members(daemon, control, "completed") == 6
        }
        #expect(nginx.count("/live/index.m3u8") == fetched, "the canceled recording still reloads: \(nginx.requests)")
        let after = try daemon.call("status", ["group": .int(group)])
        #expect(after["jobs"]?.arrayValue?.count == members, "the canceled recording gained members: \(after.serializedString())")

        let done = after["group"]
        #expect(done?["state"] == "completed", "\(done?.serializedString() ?? "")")
        #expect(done?["hls"]?["live"] == false)
        let out = daemon.downloadDir + "/part.ts"
        let probe = try HLSFixture.probe(out)
        #expect(probe.duration > 0.5 && probe.duration < 5, "\(probe)")
        #expect(probe.streams.sorted() == ["audio", "video"])
        #expect(try HLSFixture.frames(out).count > 50)
        // No staging folder is left: once the second recording is canceled too, the folder
        // holds the two files and nothing else.
        _ = try daemon.call("cancel", ["group": .int(control)])
        #expect(try FileManager.default.contentsOfDirectory(atPath: daemon.downloadDir).sorted() == ["control.ts", "part.ts"])
    }
}
