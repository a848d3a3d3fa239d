import DLCore
import DLRPC
import Foundation
import Testing

/// The params types are what dlctl sends and what the daemon decodes: a value sent must come
/// back as itself, for every method, and a method refuses what its type does not name.
@Suite struct MethodParamsTests {
    static func roundTrip<P: MethodParams>(_ value: P, _ sourceLocation: SourceLocation = #_sourceLocation) throws {
        let wire = try JSONValue.parse(Data(JSONValue.object(value.params).serialized()))
        let decoded = try P(try #require(wire.objectValue), limits: RPCLimits())
        #expect(decoded == value, sourceLocation: sourceLocation)
        #expect(Set(value.params.keys).isSubset(of: P.keys), sourceLocation: sourceLocation)
    }

    @Test func everyMethodsParamsComeBackAsSent() throws {
        var spec = EnqueueSpec(url: "https://example.com/a.iso")
        spec.host = "example.com"
        spec.path = "/tmp/a.iso"
        spec.priority = 7
        spec.key = "k"
        spec.meta = #"{"n":1}"#
        spec.headers = [HeaderField(name: "X-A", value: "1")]
        spec.overwrite = true
        spec.paused = true
        spec.checksum = try Checksum.parse("sha256:" + String(repeating: "ab", count: 32)).get()
        spec.size = 42
        spec.onExists = .rename
        spec.tls = JobTLS(caFile: "/etc/ca.pem")
        spec.segments = 4
        spec.metered = false
        spec.maxSpeed = 1000
        spec.mirrors = [JobMirror(url: "https://mirror.example.org/a.iso")]
        var plain = EnqueueSpec(url: "http://example.com/b")
        plain.host = "example.com"
        try Self.roundTrip(EnqueueParams.job(spec))
        try Self.roundTrip(EnqueueParams.jobs([spec, plain]))
        var member = GroupMemberSpec(url: "https://example.com/c")
        member.relativePath = "sub/c"
        member.size = 3
        var group = GroupEnqueue(name: "g", dir: "/tmp/g", members: [member, GroupMemberSpec(url: "https://example.com/d")])
        group.priority = -3
        group.paused = true
        group.options = JobOptions(segments: 2, metered: true)
        try Self.roundTrip(EnqueueParams.group(group))

        for selection in [JobSelection.ids([1]), .ids([1, 2]), .all, .group(.id(3)), .group(.name("x"))] {
            try Self.roundTrip(SelectionParams(selection))
            try Self.roundTrip(RemoveParams(.jobs(selection, deleteFile: true)))
        }
        try Self.roundTrip(RemoveParams(.finished(states: [.completed, .canceled, .failed], olderThan: 60)))
        try Self.roundTrip(RemoveParams(.finished(states: [.failed], olderThan: nil)))
        for target in [StatusParams.Target.job(5), .jobs([5, 6]), .group(.name("g"))] { try Self.roundTrip(StatusParams(target)) }
        try Self.roundTrip(ListParams())
        try Self.roundTrip(ListParams(states: [.queued, .paused], limit: 10, afterID: 99))
        try Self.roundTrip(ListParams(states: [.failed], group: .id(2)))
        try Self.roundTrip(QueueParams(paused: true))
        try Self.roundTrip(QueueParams(paused: nil))
        try Self.roundTrip(SubscribeParams(ids: [1, 2], since: 10))
        try Self.roundTrip(SubscribeParams(group: .name("g")))
        try Self.roundTrip(SetSpeedParams(.global, maxSpeed: nil))
        try Self.roundTrip(SetSpeedParams(.job(4), maxSpeed: 2048))
        try Self.roundTrip(ChangeParams(id: 4, url: "https://example.com/new"))
        try Self.roundTrip(ChangeParams(id: 4, headers: []))
        try Self.roundTrip(GetParams(url: "https://example.com/x", pin: true))
        try Self.roundTrip(UnpinParams(url: "https://example.com/x"))
        try Self.roundTrip(NoParams())
    }

    /// Each method refuses a name its type does not take, and names the ones it does.
    @Test func eachMethodRefusesNamesItsTypeDoesNotTake() {
        for method in RPCMethod.allCases {
            let type = method.params
            #expect(throws: DLError.self, "\(method)") { _ = try type.init(["priorty": 1], limits: RPCLimits()) }
            do {
                _ = try type.init(["priorty": 1], limits: RPCLimits())
            } catch {
                #expect(error.code == .invalidParams, "\(method)")
                #expect(error.message.contains("unknown param \"priorty\""), "\(method): \(error.message)")
            }
        }
    }

    /// A typo in an `enqueue` is answered with the names of the form it was in.
    @Test func enqueueNamesTheFormsParams() {
        for (raw, listed, unlisted) in [
            (["url": "https://example.com/a", "priorty": 1] as [String: JSONValue], "checksum", "jobs"),
            (["jobs": [["url": "https://example.com/a"]], "priorty": 1], "jobs", "checksum"),
            (["group": ["name": "g", "dir": "/tmp/g"], "jobs": [], "priorty": 1], "encrypt_to", "checksum"),
        ] {
            do {
                _ = try EnqueueParams(raw)
                Issue.record("accepted \(raw)")
            } catch {
                let known = error.message.components(separatedBy: "this method takes: ").last ?? ""
                #expect(known.contains(listed) && !known.contains(unlisted), "\(error.message)")
            }
        }
    }

    /// One job's rules whatever the form: the same bad checksum gets the same words alone, in
    /// a batch and as a group member (the batch and the group also say which job).
    @Test func oneJobsRulesInEveryForm() {
        let bad: JSONValue = ["url": "https://example.com/a", "checksum": "sha256:zz"]
        var messages: [String] = []
        for raw: [String: JSONValue] in [
            bad.objectValue ?? [:], ["jobs": [bad]], ["group": ["name": "g", "dir": "/tmp/g"], "jobs": [bad]],
        ] {
            do {
                _ = try EnqueueParams(raw)
                Issue.record("accepted \(raw)")
            } catch {
                messages.append(error.message.replacingOccurrences(of: "jobs[0]: ", with: ""))
            }
        }
        #expect(messages.count == 3 && Set(messages).count == 1, "\(messages)")
    }
}
