import DLRPC
import DLTestSupport
import Foundation
import Testing

/// HLS media made at test time by Debian's ffmpeg and served by a real nginx: a master
/// playlist with two variants, an MPEG-TS one with AES-128 and a key rotation (explicit IVs,
/// then the media sequence number), and a single-file fMP4 one (EXT-X-MAP and segments as byte
/// ranges of one file); and playlists dld must refuse.
struct HLSFixture {
    let www: String
    let folder: String

    /// Runs a program; throws with its output when it fails.
    @discardableResult
    static func run(_ program: String, _ arguments: [String], in folder: String? = nil) throws -> ProgramOutput {
        let output = try runProgram(program, arguments, currentDirectory: folder)
        guard output.status == 0 else {
            throw HarnessError("\(program) \(arguments.joined(separator: " ")) failed (\(output.status)):\n\(output.stderr.suffix(2000))")
        }
        return output
    }

    static let ffmpeg = "/usr/bin/ffmpeg"
    static let ffprobe = "/usr/bin/ffprobe"

    /// An encode of `seconds` of test pattern and a 440 Hz tone, `size` pixels.
    static func source(_ seconds: Int, size: String) -> [String] {
        [
            "-v", "error", "-f", "lavfi", "-i", "testsrc=duration=\(seconds):size=\(size):rate=25", "-f", "lavfi", "-i",
            "sine=frequency=440:duration=\(seconds)", "-c:v", "libx264", "-preset", "ultrafast", "-g", "25", "-c:a", "aac",
        ]
    }

    init(in folder: String) throws {
        self.folder = folder
        www = folder + "/www"
        let fm = FileManager.default
        for sub in ["ts", "fmp4", "bad"] { try fm.createDirectory(atPath: www + "/" + sub, withIntermediateDirectories: true) }
        let ts = www + "/ts"
        // Two keys: the first three segments with one (ffmpeg writes explicit IVs), the last three
        // with the other, encoded on with continuing timestamps.
        for (index, name) in ["k1", "k2"].enumerated() {
            var key = [UInt8](repeating: 0, count: 16)
            for byte in key.indices { key[byte] = UInt8(truncatingIfNeeded: (index + 1) * 37 + byte * 11) }
            try Data(key).write(to: URL(fileURLWithPath: "\(ts)/\(name).key"))
            try "\(name).key\n\(ts)/\(name).key\n".write(toFile: "\(folder)/\(name).keyinfo", atomically: true, encoding: .utf8)
        }
        try Self.run(
            Self.ffmpeg,
            Self.source(3, size: "320x240") + [
                "-f", "hls", "-hls_time", "1", "-hls_list_size", "0", "-hls_key_info_file", folder + "/k1.keyinfo", "-hls_flags",
                "periodic_rekey", "-hls_segment_filename", "a_%03d.ts", "a.m3u8",
            ], in: ts)
        try Self.run(
            Self.ffmpeg,
            Self.source(3, size: "320x240") + [
                "-output_ts_offset", "3", "-f", "hls", "-hls_time", "1", "-hls_list_size", "0", "-start_number", "3",
                "-hls_key_info_file", folder + "/k2.keyinfo", "-hls_flags", "periodic_rekey", "-hls_segment_filename", "b_%03d.ts",
                "b.m3u8",
            ], in: ts)
        let first = try String(contentsOfFile: ts + "/a.m3u8", encoding: .utf8).split(separator: "\n").filter { $0 != "#EXT-X-ENDLIST" }
        let second = try String(contentsOfFile: ts + "/b.m3u8", encoding: .utf8).split(separator: "\n").filter {
            $0.hasPrefix("#EXTINF") || $0.hasPrefix("b_")
        }
        // The second key without IV: the segments' IVs are then their media sequence numbers
        // (3, 4, 5), which is what ffmpeg encrypted them with.
        let variant = first.joined(separator: "\n") + "\n#EXT-X-KEY:METHOD=AES-128,URI=\"k2.key\"\n" + second.joined(separator: "\n")
        try (variant + "\n#EXT-X-ENDLIST\n").write(toFile: ts + "/v.m3u8", atomically: true, encoding: .utf8)
        try Self.run(
            Self.ffmpeg,
            Self.source(6, size: "640x480") + [
                "-f", "hls", "-hls_time", "1", "-hls_list_size", "0", "-hls_segment_type", "fmp4", "-hls_flags", "single_file",
                "f.m3u8",
            ], in: www + "/fmp4")
        let master = """
            #EXTM3U
            #EXT-X-VERSION:7
            #EXT-X-STREAM-INF:BANDWIDTH=600000,RESOLUTION=320x240,CODECS="avc1.42c00d,mp4a.40.2"
            ts/v.m3u8
            #EXT-X-STREAM-INF:BANDWIDTH=1500000,RESOLUTION=640x480,CODECS="avc1.42c01e,mp4a.40.2"
            fmp4/f.m3u8

            """
        try master.write(toFile: www + "/master.m3u8", atomically: true, encoding: .utf8)
        try variant.replacingOccurrences(of: "METHOD=AES-128", with: "METHOD=SAMPLE-AES").appending("\n#EXT-X-ENDLIST\n")
            .replacingOccurrences(of: "a_0", with: "../ts/a_0").replacingOccurrences(of: "b_0", with: "../ts/b_0")
            .write(toFile: www + "/bad/sample-aes.m3u8", atomically: true, encoding: .utf8)
        // A key that is not the one the segments were encrypted with.
        try Data((0..<16).map { UInt8($0 * 7 + 1) }).write(to: URL(fileURLWithPath: www + "/bad/wrong.key"))
        try variant.replacingOccurrences(of: "URI=\"k1.key\"", with: "URI=\"wrong.key\"")
            .replacingOccurrences(of: "URI=\"k2.key\"", with: "URI=\"../ts/k2.key\"").replacingOccurrences(of: "a_0", with: "../ts/a_0")
            .replacingOccurrences(of: "b_0", with: "../ts/b_0").appending("\n#EXT-X-ENDLIST\n")
            .write(toFile: www + "/bad/wrong-key.m3u8", atomically: true, encoding: .utf8)
        // Live: no EXT-X-ENDLIST (still growing).
        try variant.replacingOccurrences(of: "URI=\"k", with: "URI=\"../ts/k").replacingOccurrences(of: "a_0", with: "../ts/a_0")
            .replacingOccurrences(of: "b_0", with: "../ts/b_0").appending("\n")
            .write(toFile: www + "/bad/live.m3u8", atomically: true, encoding: .utf8)
    }

    /// The frames ffmpeg decodes from `input` (a file, or a playlist's URL): one "stream,hash"
    /// a frame, video and audio, from `-f framemd5`.
    static func frames(_ input: String) throws -> [String] {
        let output = try run(ffmpeg, ["-v", "error"] + playlistOptions(input) + ["-i", input, "-map", "0", "-f", "framemd5", "-"])
        return output.stdout.split(separator: "\n").filter { !$0.hasPrefix("#") }.map { line in
            let fields = line.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }
            return "\(fields.first ?? ""),\(fields.last ?? "")"
        }
    }

    /// The HLS demuxer's option for a playlist (other demuxers refuse it): any segment name.
    static func playlistOptions(_ input: String) -> [String] {
        input.hasSuffix(".m3u8") ? ["-allowed_extensions", "ALL"] : []
    }

    /// The MPEG-TS variant's segments decrypted by the openssl command line, one after the other:
    /// the bytes dld's joined file must hold. The IVs are the RFC's: the first three explicit
    /// (0, 1, 2), the last three their media sequence numbers (3, 4, 5).
    func decryptedByOpenSSL() throws -> Data {
        var joined = Data()
        for index in 0..<6 {
            let key = try Data(contentsOf: URL(fileURLWithPath: www + (index < 3 ? "/ts/k1.key" : "/ts/k2.key")))
            let segment = www + (index < 3 ? "/ts/a_00\(index).ts" : "/ts/b_00\(index).ts")
            let output = folder + "/plain-\(index).ts"
            try Self.run(
                "/usr/bin/openssl",
                [
                    "enc", "-d", "-aes-128-cbc", "-K", key.map { String(format: "%02x", $0) }.joined(), "-iv",
                    String(format: "%032x", index), "-in", segment, "-out", output,
                ])
            joined += try Data(contentsOf: URL(fileURLWithPath: output))
        }
        return joined
    }

    /// ffprobe's duration (seconds) and stream types.
    static func probe(_ input: String) throws -> (duration: Double, streams: [String]) {
        let output = try run(
            ffprobe,
            ["-v", "error"] + playlistOptions(input) + ["-show_entries", "format=duration:stream=codec_type", "-of", "json", input])
        let json = try JSONValue.parse(Data(output.stdout.utf8))
        let duration = Double(json["format"]?["duration"]?.stringValue ?? "") ?? 0
        let streams = (json["streams"]?.arrayValue ?? []).compactMap { $0["codec_type"]?.stringValue }
        return (duration, streams)
    }
}

@Suite(.serialized) struct HLSTests {
    /// A master playlist: the highest bandwidth (the fMP4 variant) by default; `dlctl enqueue
    /// URL.m3u8 -o OUT --wait` exits 0 and OUT has the frames ffmpeg reads from the variant,
    /// video and audio, 6 s long, one request for the single file of all its segments.
    @Test func masterDefaultsToHighestBandwidthFMP4() throws {
        let daemon = try DaemonHarness()
        let fixture = try HLSFixture(in: daemon.root)
        let nginx = try TestNginx(serving: fixture.www, in: daemon.root)
        try daemon.start()
        defer { _ = daemon.stop() }
        let out = daemon.downloadDir + "/video.mp4"
        let result = try daemon.dlctl(["enqueue", nginx.url + "/master.m3u8", "-o", out, "--wait"])
        #expect(result.status == 0, "\(result.stdout)\n\(result.stderr)\n\(daemon.log.suffix(3000))")
        let expected = try HLSFixture.frames(nginx.url + "/fmp4/f.m3u8")
        #expect(expected.count > 300)
        #expect(try HLSFixture.frames(out) == expected)
        let probe = try HLSFixture.probe(out)
        #expect(abs(probe.duration - 6) < 0.3, "\(probe)")
        #expect(probe.streams.sorted() == ["audio", "video"])
        #expect(nginx.count("/fmp4/f.m4s") == 1, "\(nginx.requests)")
        let group = try daemon.call("status", ["group": 1])["group"]
        #expect(group?["state"] == "completed")
        #expect(group?["hls"]?["variant"]?["index"] == 1)
        #expect(group?["hls"]?["variant"]?["height"] == 480)
        #expect(group?["hls"]?["container"] == "mp4")
        // Nothing else is left beside it: no staging folder.
        #expect(try FileManager.default.contentsOfDirectory(atPath: daemon.downloadDir) == ["video.mp4"])
    }

    /// `max_height` picks the MPEG-TS variant, whose segments are AES-128 encrypted with a key
    /// rotation: the file has the frames ffmpeg decrypts from the playlist.
    @Test func aes128WithKeyRotation() throws {
        let daemon = try DaemonHarness()
        let fixture = try HLSFixture(in: daemon.root)
        let nginx = try TestNginx(serving: fixture.www, in: daemon.root)
        try daemon.start()
        defer { _ = daemon.stop() }
        let result = try daemon.dlctl(["enqueue", nginx.url + "/master.m3u8", "--max-height", "300", "--name", "clip.ts", "--wait"])
        #expect(result.status == 0, "\(result.stdout)\n\(result.stderr)\n\(daemon.log.suffix(3000))")
        let out = daemon.downloadDir + "/clip.ts"
        // Byte for byte what openssl decrypts (a wrong IV spoils only a segment's first block,
        // which the frames would not show).
        #expect(try Data(contentsOf: URL(fileURLWithPath: out)) == (try fixture.decryptedByOpenSSL()))
        let expected = try HLSFixture.frames(nginx.url + "/ts/v.m3u8")
        #expect(expected.count > 300)
        #expect(try HLSFixture.frames(out) == expected)
        let probe = try HLSFixture.probe(out)
        #expect(abs(probe.duration - 6) < 0.3, "\(probe)")
        #expect(probe.streams.sorted() == ["audio", "video"])
        let group = try daemon.call("status", ["group": 1])["group"]
        #expect(group?["hls"]?["variant"]?["index"] == 0)
        #expect(group?["hls"]?["container"] == "ts")
        #expect(group?["members"] == 8, "six segments and two keys")
        #expect(nginx.count("/ts/k1.key") == 1 && nginx.count("/ts/k2.key") == 1)
    }

    /// `hls_layout: "folder"`: the segments, keys and a local playlist, which plays from disk
    /// with nginx stopped and gives the same frames.
    @Test func folderLayoutPlaysOffline() throws {
        let daemon = try DaemonHarness()
        let fixture = try HLSFixture(in: daemon.root)
        let nginx = try TestNginx(serving: fixture.www, in: daemon.root)
        try daemon.start()
        defer { _ = daemon.stop() }
        let result = try daemon.call(
            "enqueue", ["url": .string(nginx.url + "/ts/v.m3u8"), "hls_layout": "folder", "name": "lesson"])
        let groupID = try #require(result["group"]?["id"]?.int64Value)
        let done = try daemon.dlctl(["wait", "--group", String(groupID)])
        #expect(done.status == 0, "\(done.stdout)\n\(done.stderr)")
        let expected = try HLSFixture.frames(nginx.url + "/ts/v.m3u8")
        nginx.stop()
        let local = daemon.downloadDir + "/lesson/index.m3u8"
        let playlist = try String(contentsOfFile: local, encoding: .utf8)
        #expect(!playlist.contains("http"), "\(playlist)")
        #expect(try HLSFixture.frames(local) == expected)
        let probe = try HLSFixture.probe(local)
        #expect(abs(probe.duration - 6) < 0.3, "\(probe)")
        #expect(probe.streams.sorted() == ["audio", "video"])
    }

    /// SIGKILL while segments download slowly (8 kB/s, about 5 s a segment); after a restart the download completes, with
    /// the same frames, and no segment that had completed before the kill is fetched again.
    @Test func killMidDownloadRefetchesNoFinishedSegment() throws {
        let daemon = try DaemonHarness(config: "group_parallel = 2\n")
        let fixture = try HLSFixture(in: daemon.root)
        let nginx = try TestNginx(serving: fixture.www, in: daemon.root, limitRate: 8_000)
        try daemon.start()
        defer { _ = daemon.stop() }
        let result = try daemon.call("enqueue", ["url": .string(nginx.url + "/ts/v.m3u8"), "name": "slow.ts"])
        let groupID = try #require(result["group"]?["id"]?.int64Value)
        var finished: [String] = []
        let deadline = Date().addingTimeInterval(120)
        while Date() < deadline {
            let jobs = try daemon.call("status", ["group": .int(groupID)])["jobs"]?.arrayValue ?? []
            let done = jobs.filter { $0["state"] == "completed" && ($0["url"]?.stringValue ?? "").hasSuffix(".ts") }
            let left = jobs.filter { $0["state"] != "completed" && ($0["url"]?.stringValue ?? "").hasSuffix(".ts") }
            if !done.isEmpty, !left.isEmpty {
                finished = done.compactMap { $0["url"]?.stringValue.flatMap { URL(string: $0)?.path } }
                break
            }
            usleep(20_000)
        }
        #expect(!finished.isEmpty, "no segment completed while others were left")
        daemon.crash()
        try daemon.start()
        let wait = try daemon.dlctl(["wait", "--group", String(groupID)])
        #expect(wait.status == 0, "\(wait.stdout)\n\(wait.stderr)\n\(daemon.log.suffix(3000))")
        for path in finished {
            #expect(nginx.count(path) == 1, "\(path) was fetched again: \(nginx.requests)")
        }
        #expect(try HLSFixture.frames(daemon.downloadDir + "/slow.ts") == (try HLSFixture.frames(nginx.url + "/ts/v.m3u8")))
    }

    /// A segment that does not decrypt with its key (wrong key: bad padding) fails the group
    /// with `hls_assembly`; nothing appears under the file's name and the members stay staged.
    @Test func undecryptableSegmentFailsTheGroup() throws {
        let daemon = try DaemonHarness()
        let fixture = try HLSFixture(in: daemon.root)
        let nginx = try TestNginx(serving: fixture.www, in: daemon.root)
        try daemon.start()
        defer { _ = daemon.stop() }
        let result = try daemon.call("enqueue", ["url": .string(nginx.url + "/bad/wrong-key.m3u8"), "name": "broken.ts"])
        let groupID = try #require(result["group"]?["id"]?.int64Value)
        let wait = try daemon.dlctl(["wait", "--group", String(groupID)])
        #expect(wait.status == 1, "\(wait.stdout)\n\(wait.stderr)")
        let group = try daemon.call("status", ["group": .int(groupID)])["group"]
        #expect(group?["state"] == "failed", "\(group?.serializedString() ?? "")")
        #expect(group?["error"]?["code"] == "hls_assembly")
        let message = group?["error"]?["message"]?.stringValue ?? ""
        #expect(message.contains("seg-000000.ts") && message.contains("does not decrypt"), "\(message)")
        #expect(!FileManager.default.fileExists(atPath: daemon.downloadDir + "/broken.ts"))
        let staged = try FileManager.default.contentsOfDirectory(atPath: daemon.downloadDir).filter { $0.contains(".dld-staging-") }
        #expect(staged.count == 1)
    }

    /// SAMPLE-AES is refused with its code; a live playlist (no EXT-X-ENDLIST) too, unless
    /// `live: true` (`HLSLiveTests`), which the message names; nothing is created.
    @Test func refusals() throws {
        let daemon = try DaemonHarness()
        let fixture = try HLSFixture(in: daemon.root)
        let nginx = try TestNginx(serving: fixture.www, in: daemon.root)
        try daemon.start()
        defer { _ = daemon.stop() }
        let sample = try daemon.callError("enqueue", ["url": .string(nginx.url + "/bad/sample-aes.m3u8")])
        #expect(sample.stableCode == "hls_unsupported_encryption", "\(sample)")
        #expect(sample.message.contains("SAMPLE-AES"))
        let live = try daemon.callError("enqueue", ["url": .string(nginx.url + "/bad/live.m3u8")])
        #expect(live.stableCode == "hls_live", "\(live)")
        #expect(live.message.contains("live: true") && live.message.contains("--live"), "\(live.message)")
        let missing = try daemon.callError("enqueue", ["url": .string(nginx.url + "/nope.m3u8")])
        #expect(missing.stableCode == "hls_fetch_failed", "\(missing)")
        // kind "file" downloads the playlist itself, as a plain job.
        let plain = try daemon.enqueue(["url": .string(nginx.url + "/bad/live.m3u8"), "kind": "file"])
        #expect(try daemon.waitForState(plain, ["completed", "failed"])["state"] == "completed")
        #expect(try daemon.call("list")["jobs"]?.arrayValue?.count == 1)
        let cli = try daemon.dlctl(["enqueue", nginx.url + "/bad/sample-aes.m3u8"])
        #expect(cli.status == 1 && cli.stderr.contains("SAMPLE-AES"), "\(cli.stderr)")
    }
}
