import DLCore
import DLRPC
import Foundation
import Testing

/// `enqueue`'s Metalink form: which requests take it, and the jobs a document becomes.
@Suite struct MetalinkEnqueueTests {
    static func decode(_ raw: [String: JSONValue]) throws(DLError) -> EnqueueParams {
        try EnqueueParams(raw, limits: RPCLimits())
    }

    /// `metalink` or a `.meta4` URL alone is the form; its other params are refused by name.
    @Test func whichRequestsAreMetalinks() throws {
        guard case .metalink(let inline) = try Self.decode(["metalink": .string(MetalinkReaderTests.v4), "dir": "/tmp/x"]) else {
            Issue.record("inline not read as a Metalink")
            return
        }
        #expect(inline.dir == "/tmp/x")
        guard case .metalink(let byURL) = try Self.decode(["url": "http://h/a.meta4?x=1"]) else {
            Issue.record("a .meta4 URL not read as a Metalink")
            return
        }
        #expect(byURL.source == .url("http://h/a.meta4?x=1"))
        guard case .job = try Self.decode(["url": "http://h/a.iso"]) else {
            Issue.record("an ordinary URL read as a Metalink")
            return
        }
        guard case .jobs = try Self.decode(["jobs": [["url": "http://h/a.meta4"]]]) else {
            Issue.record("a batch read as a Metalink")
            return
        }
        #expect(throws: DLError.self) { try Self.decode(["url": "http://h/a.meta4", "checksum": "md5:00"]) }
        #expect(throws: DLError.self) { try Self.decode(["url": "http://h/a.meta4", "metalink": "<x/>"]) }
        do {
            _ = try Self.decode(["metalink": "<metalink xmlns=\"urn:ietf:params:xml:ns:metalink\"><file name=\"../x\"/></metalink>"])
            Issue.record("a hostile inline document was accepted")
        } catch {
            #expect(error.code == .invalidMetalink)
            #expect(error.message.contains("leaves the destination folder"))
        }
        // The params say the request again.
        let again = try Self.decode(EnqueueParams.metalink(inline).params)
        #expect(again == .metalink(inline))
    }

    /// One file: a job with its ordered URLs as url and mirrors, the strongest hash, the size,
    /// the pieces. Several: a group in `dir` (or download_dir), each member likewise.
    @Test func resolvedJobs() throws {
        let metalink = try MetalinkReader.parse(MetalinkReaderTests.v4)
        var request = MetalinkEnqueue(source: .document(metalink, text: MetalinkReaderTests.v4))
        request.priority = 5
        guard
            case .group(let group) = request.resolved(metalink, preferredLocation: nil, downloadDir: "/dl", sourceURL: "http://h/set.meta4")
        else {
            Issue.record("several files are not a group")
            return
        }
        #expect(group.name == "set" && group.dir == "/dl" && group.priority == 5)
        #expect(group.members.map(\.relativePath) == ["dir/example.iso", "b.txt"])
        let first = try #require(group.members.first)
        #expect(first.url == "https://de.example/example.iso")
        #expect(first.mirrors.map(\.url) == ["http://us.example/example.iso", "http://last.example/example.iso"])
        #expect(first.checksum?.algorithm == .sha256 && first.size == 10 && first.pieces?.hashes.count == 2)

        let one = Metalink(version: .v4, files: [try #require(metalink.files.first)])
        request.dir = "/x"
        guard case .job(let spec) = request.resolved(one, preferredLocation: "us", downloadDir: "/dl") else {
            Issue.record("one file is not a job")
            return
        }
        #expect(spec.name == "example.iso" && spec.dir == "/x" && spec.priority == 5)
        #expect(spec.url == "https://de.example/example.iso")
        #expect(spec.checksum?.algorithm == .sha256 && spec.size == 10 && spec.pieces?.length == 8)
        // 20 URLs: the job keeps the first 17 (its URL and 16 mirrors).
        var many = try #require(metalink.files.first)
        many.urls = (0..<20).map { MetalinkURL(url: "http://m\($0).example/f", priority: 20 - $0) }
        guard case .job(let capped) = request.resolved(Metalink(version: .v4, files: [many]), preferredLocation: nil, downloadDir: "/dl")
        else { return }
        #expect(capped.url == "http://m19.example/f" && capped.mirrors.count == 16)
    }
}
