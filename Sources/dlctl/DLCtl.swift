import ArgumentParser
import DLCore
import DLRPC
import Foundation

/// `dlctl`: a thin client of the daemon's socket protocol (docs/protocol.md).
@main
struct DLCtl: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "dlctl",
        abstract: "Control the dld download daemon.",
        discussion:
            "Talks to dld over its Unix socket ($DLD_SOCKET, else the default path). --socket and --json may come before the command too (dlctl --socket S status). Exit status: 0 success, 1 the daemon refused, 64 a usage error, 69 no daemon answers; `wait` also 124 on timeout.",
        version: "dlctl \(DLDVersion.current) (protocol \(DLDVersion.protocolVersion))",
        subcommands: [
            Enqueue.self, Status.self, Watch.self, Wait.self, Pause.self, Resume.self, Cancel.self, Remove.self, Stats.self, Queue.self,
            Speed.self, SetURL.self, Get.self, Unpin.self, CacheList.self, Version.self, Shutdown.self, Web.self, Discover.self,
        ])

    /// The options of every command are taken before the command too, as git and systemctl
    /// take theirs: `dlctl --socket S status` is `dlctl status --socket S`.
    static func main() {
        main(GlobalOptions.moved(Array(CommandLine.arguments.dropFirst())))
    }
}

/// `--socket PATH`, `--socket=PATH` and `--json` before the command, moved after it.
enum GlobalOptions {
    static func moved(_ arguments: [String]) -> [String] {
        var leading: [String] = []
        var index = 0
        while index < arguments.count {
            let word = arguments[index]
            if word == "--json" || word.hasPrefix("--socket=") {
                leading.append(word)
                index += 1
            } else if word == "--socket", index + 1 < arguments.count {
                leading += [word, arguments[index + 1]]
                index += 2
            } else {
                break
            }
        }
        guard !leading.isEmpty else { return arguments }
        var rest = Array(arguments[index...])
        // Before a `--`, after which every word is an argument.
        let end = rest.firstIndex(of: "--") ?? rest.endIndex
        rest.insert(contentsOf: leading, at: end)
        return rest
    }
}

/// Job ids for shell completion (`dlctl pause <TAB>`), asked of the daemon at the socket the
/// command line names (or $DLD_SOCKET, or the default). No daemon, no candidates: completion
/// must never print an error into the user's prompt.
enum JobIDCompletion {
    static func candidates(_ words: [String], states: [String]?) -> [String] {
        var socket = SocketPath.clientPath()
        for (index, word) in words.enumerated() {
            if word == "--socket", index + 1 < words.count { socket = absolute(words[index + 1]) }
            if word.hasPrefix("--socket=") { socket = absolute(String(word.dropFirst("--socket=".count))) }
        }
        let client = RPCClient(socketPath: socket)
        defer { client.close() }
        let params = ListParams(states: states?.compactMap(JobState.init(rawValue:)), limit: 1000)
        guard let result = try? client.call(RPCMethod.list.rawValue, params.params) else { return [] }
        return (result["jobs"]?.arrayValue ?? []).compactMap { $0["id"]?.int64Value.map(String.init) }
    }
}

/// Options every command has.
struct Common: ParsableArguments {
    @Option(help: "Control socket (default: $DLD_SOCKET, else $XDG_RUNTIME_DIR/dld/dld.sock or /tmp/dld-UID/dld.sock).")
    var socket: String?

    @Flag(help: "Print the daemon's JSON result instead of text.")
    var json = false

    var socketPath: String { socket ?? SocketPath.clientPath() }

    /// Calls a method with its params (the types the daemon decodes them into).
    func call(_ method: RPCMethod, _ params: some MethodParams) throws -> JSONValue {
        try call(method.rawValue, params.params)
    }

    func call(_ method: RPCMethod) throws -> JSONValue {
        try call(method.rawValue, [:])
    }

    /// A param dlctl had to read itself (a checksum, a state's name) and that is wrong:
    /// refused with the words and the status the daemon's refusal would have.
    func refuse(_ error: DLError) -> ExitCode {
        printError("\(error.message) [\(RPCError(error).stableCode)]")
        return ExitCode(1)
    }

    /// Calls the daemon; prints a clear line and exits with the right status on failure.
    func call(_ method: String, _ params: [String: JSONValue] = [:]) throws -> JSONValue {
        let client = RPCClient(socketPath: socketPath)
        do {
            return try client.call(method, params)
        } catch let error {
            switch error {
            case .unavailable(let path, let reason):
                printError(
                    "no dld daemon is answering at \(path) (\(reason)). Start it with `dld` (or `systemctl --user start dld`), or point --socket / DLD_SOCKET at its socket."
                )
                throw ExitCode(69)
            case .remote(let rpcError):
                printError("\(rpcError.message) [\(rpcError.stableCode)]")
                throw ExitCode(1)
            case .protocolError(let message):
                printError(message)
                throw ExitCode(1)
            case .timedOut:
                printError("dld did not answer in time")
                throw ExitCode(1)
            }
        }
    }

    func emit(_ result: JSONValue, text: () -> String) {
        print(json ? result.pretty() : text())
    }
}

func printError(_ message: String) {
    FileHandle.standardError.write(Data("dlctl: \(message)\n".utf8))
}

/// `7`, `7 8 9`, `--group NAME`, or `--all`.
struct Selection: ParsableArguments {
    @Argument(help: "Job ids.", completion: .custom { words, _, _ in JobIDCompletion.candidates(words, states: nil) })
    var ids: [Int64] = []
    @Option(help: "A group (id or name).") var group: String?
    @Flag(help: "Every job.") var all = false

    func validate() throws {
        let given = (all ? 1 : 0) + (ids.isEmpty ? 0 : 1) + (group == nil ? 0 : 1)
        if given > 1 { throw ValidationError("give job ids, --group or --all, only one of them") }
        if given == 0 { throw ValidationError("give one or more job ids, --group, or --all") }
        if let bad = ids.first(where: { $0 < 1 }) { throw ValidationError("job ids are positive integers, got \(bad)") }
    }

    var selection: JobSelection {
        if let group { return .group(GroupReference(argument: group)) }
        return all ? .all : .ids(ids)
    }
}

/// `-H "Name: value"` options as header fields (a later one of a name replaces an earlier);
/// a usage error (64) for one without a colon. The daemon checks names and values.
func headerFields(_ headers: [String]) throws -> [HeaderField] {
    var fields: [HeaderField] = []
    for header in headers {
        guard let colon = header.firstIndex(of: ":") else {
            printError("header \"\(header)\" must be \"Name: value\"")
            throw ExitCode(64)
        }
        let name = header[..<colon].trimmingCharacters(in: .whitespaces)
        fields.removeAll { $0.name == name }
        fields.append(HeaderField(name: name, value: header[header.index(after: colon)...].trimmingCharacters(in: .whitespaces)))
    }
    return fields
}

struct Enqueue: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Add downloads; prints each new job's id.")

    @Argument(help: "http(s) URLs.") var urls: [String] = []
    @Option(
        name: [.customShort("i"), .customLong("input")],
        help: "Read URLs from a file (- for standard input): one per line, # comments, indented out=, dir=, checksum=ALGO=HEX, size= lines."
    ) var input: String?
    @Option(help: "Create a group of this name: its files appear in -d DIR only when all are complete.") var group: String?
    @Option(help: "Expected digest, ALGO:HEX (sha256, sha512, sha1, md5); one URL only.") var checksum: String?
    @Option(help: "Expected size in bytes; one URL only.") var size: Int64?
    @Flag(help: "Wait until the jobs finish (exit 0 if all completed, 1 otherwise), with progress on a terminal.") var wait = false
    @Option(name: .shortAndLong, help: "Destination file (one URL only).") var output: String?
    @Option(name: [.customShort("d"), .long], help: "Destination folder (default: the daemon's download folder).") var dir: String?
    @Option(help: "File name in the folder (one URL only; default: from the URL).") var name: String?
    @Option(help: "Higher runs first (-1000...1000).") var priority: Int?
    @Option(help: "A unique key: enqueueing it again returns the existing job.") var key: String?
    @Option(help: "JSON kept with the job and returned as given.") var meta: String?
    @Option(name: [.customShort("H"), .customLong("header")], help: "A request header, \"Name: value\" (repeatable).") var headers:
        [String] = []
    @Flag(help: "Replace an existing file at the destination.") var overwrite = false
    @Flag(help: "Add the job paused.") var paused = false
    @Option(name: .customLong("ca-file"), help: "Also trust the certificates in this PEM file (an internal CA, a self-signed server).")
    var caFile: String?
    @Option(name: .customLong("client-cert"), help: "A PEM client certificate for servers that ask for one (with --client-key).")
    var clientCert: String?
    @Option(name: .customLong("client-key"), help: "The unencrypted PEM private key of --client-cert.") var clientKey: String?
    @Option(name: .customLong("max-speed"), help: "This job's own speed limit, bytes per second (2M, 512K; 0: none).") var maxSpeed: String?
    @Option(help: "Byte ranges of a big file fetched at once (1...16; 1: one stream; default: the daemon's segments).") var segments: Int?
    @Option(name: .customLong("mirror"), help: "Another URL of the same file; ranges spread across them (repeatable; one URL only).")
    var mirrors: [String] = []
    @Option(
        name: .customLong("encrypt-to"),
        help: "Encrypt the file at rest to this age recipient (age1…; repeatable); it is published as NAME.age, to be read with age -d.")
    var encryptTo: [String] = []
    @Flag(
        inversion: .prefixedNo,
        help: "Download on a metered connection, or wait while the connection is metered (default: the daemon's `metered`).")
    var metered: Bool?
    @Flag(help: "The URL is an HLS playlist: download its media into one NAME.ts or NAME.mp4 (implied by a URL ending in .m3u8).")
    var hls = false
    @Flag(name: .customLong("no-hls"), help: "Download a .m3u8 URL as the file it is, not as HLS.") var noHLS = false
    @Option(name: .customLong("max-height"), help: "HLS: the best variant at most this many pixels high.") var maxHeight: Int?
    @Option(name: .customLong("max-bandwidth"), help: "HLS: the best variant of at most this many bits per second.") var maxBandwidth:
        Int64?
    @Option(help: "HLS: this variant of the master playlist (0-based).") var variant: Int?
    @Option(name: .customLong("hls-layout"), help: "HLS: file (default) or folder (segments and a local index.m3u8 that plays offline).")
    var hlsLayout: String?
    @Flag(help: "HLS: record a live playlist (no EXT-X-ENDLIST) until its end tag or a cancel, which publishes what was fetched.")
    var live = false
    @Option(
        help: "A local Metalink file (.meta4 or v3 .metalink): one file becomes a job, several a group in -d DIR (--name names it).")
    var metalink: String?
    @OptionGroup var common: Common

    func validate() throws {
        if hls && noHLS { throw ValidationError("give --hls or --no-hls, not both") }
        if let hlsLayout, HLSLayout(rawValue: hlsLayout) == nil { throw ValidationError("--hls-layout must be file or folder") }
        if metalink != nil {
            guard urls.isEmpty, input == nil, group == nil, output == nil, key == nil, meta == nil, checksum == nil, size == nil,
                mirrors.isEmpty, maxSpeed == nil
            else {
                throw ValidationError(
                    "--metalink takes no URL, -i, --group, -o, --key, --meta, --checksum, --size, --mirror or --max-speed")
            }
            return
        }
        if let maxSpeed, ByteRate.parse(maxSpeed) == nil { throw ValidationError("--max-speed must be a rate such as 2M, 512K or 100000") }
        if urls.isEmpty && input == nil { throw ValidationError("give URLs, -i FILE or --metalink FILE") }
        if (urls.count > 1 || input != nil)
            && (output != nil || name != nil || key != nil || checksum != nil || size != nil || !mirrors.isEmpty)
        {
            throw ValidationError("-o, --name, --key, --checksum, --size and --mirror apply to one URL at a time")
        }
        if output != nil && (dir != nil || name != nil) { throw ValidationError("give -o, or -d/--name, not both") }
        if group != nil && (dir == nil || output != nil || key != nil || !mirrors.isEmpty) {
            throw ValidationError("--group needs -d DIR (and no -o, --key or --mirror)")
        }
    }

    /// The input list's entries, or a usage error naming the line.
    private func entries() throws -> [InputEntry] {
        var list = urls.map { InputEntry(url: $0, line: 0) }
        guard let input else { return list }
        let data: Data
        if input == "-" {
            data = FileHandle.standardInput.readDataToEndOfFile()
        } else if let read = FileManager.default.contents(atPath: input) {
            data = read
        } else {
            printError("cannot read \(input)")
            throw ExitCode(66)
        }
        switch InputList.parse(String(decoding: data, as: UTF8.self)) {
        case .success(let parsed): list += parsed
        case .failure(let error):
            printError("\(input == "-" ? "standard input" : input): \(error.description); nothing was enqueued")
            throw ExitCode(65)
        }
        if list.isEmpty {
            printError("\(input) holds no URL; nothing was enqueued")
            throw ExitCode(65)
        }
        return list
    }

    func run() throws {
        if let metalink {
            try runMetalink(metalink)
            return
        }
        let entries = try entries()
        if let group {
            try runGroup(group, entries)
            return
        }
        var base = EnqueueSpec(url: "")
        base.path = output.map(absolute)
        base.dir = dir.map(absolute)
        base.name = name
        base.priority = priority ?? 0
        base.key = key
        if let meta {
            guard let value = try? JSONValue.parse(Data(meta.utf8)) else {
                printError("--meta is not valid JSON")
                throw ExitCode(64)
            }
            base.meta = value.serializedString()
        }
        base.headers = try headerFields(headers)
        base.overwrite = overwrite
        base.paused = paused
        let options = self.options
        base.tls = options.tls
        base.segments = options.segments
        base.encryptTo = options.encryptTo
        base.metered = options.metered
        if let checksum {
            switch Checksum.parse(checksum) {
            case .success(let parsed): base.checksum = parsed
            case .failure(let error): throw common.refuse(error)
            }
        }
        base.size = size
        base.mirrors = mirrors.map { JobMirror(url: $0) }
        base.maxSpeed = maxSpeed.flatMap(ByteRate.parse)
        base.kind = hls ? .hls : noHLS ? .file : nil
        base.hls.variant = HLSVariantRequest(index: variant, maxHeight: maxHeight, maxBandwidth: maxBandwidth)
        base.hls.layout = hlsLayout.flatMap(HLSLayout.init(rawValue:)) ?? .file
        base.hls.live = live
        var ids: [Int64] = []
        if entries.count == 1 && input == nil {
            var spec = base
            spec.url = entries[0].url
            let result = try common.call(.enqueue, EnqueueParams.job(spec))
            // An HLS playlist (its segments, published as one file) or a `.meta4` URL of
            // several files is a group.
            if let groupID = result["group"]?["id"]?.int64Value {
                try reportGroup(result, groupID)
                return
            }
            ids = result["job"]?["id"]?.int64Value.map { [$0] } ?? []
            common.emit(result) { describe(result) }
        } else {
            let jobs: [JSONValue] = entries.map { .object($0.spec(over: base, absolute: absolute).params) }
            // A long list goes in several calls, each under the daemon's limits on jobs and
            // bytes per request (docs/protocol.md); each call is atomic on its own.
            var outcomes: [JSONValue] = []
            for chunk in EnqueueChunks.split(jobs) {
                do {
                    let result = try common.call(RPCMethod.enqueue.rawValue, ["jobs": .array(chunk)])
                    outcomes += result["results"]?.arrayValue ?? []
                } catch {
                    if !outcomes.isEmpty { printError("\(outcomes.count) jobs were enqueued before this error; the rest were not") }
                    throw error
                }
            }
            ids = outcomes.compactMap { $0["id"]?.int64Value }
            let result: JSONValue = [
                "count": .int(Int64(outcomes.count)),
                "created": .int(Int64(outcomes.filter { $0["created"]?.boolValue == true }.count)),
                "results": .array(outcomes),
            ]
            common.emit(result) { outcomes.map(describe).joined(separator: "\n") }
        }
        if wait { try waitFor(common: common, ids: ids, group: nil, timeout: nil, showProgress: true) }
    }

    /// `--metalink FILE`: the document is sent as it is (`metalink`); the daemon reads it.
    private func runMetalink(_ file: String) throws {
        guard let data = FileManager.default.contents(atPath: file) else {
            printError("cannot read \(file)")
            throw ExitCode(66)
        }
        var params: [String: JSONValue] = ["metalink": .string(String(decoding: data, as: UTF8.self))]
        if let dir { params["dir"] = .string(absolute(dir)) }
        if let name { params["name"] = .string(name) }
        if let priority { params["priority"] = .int(Int64(priority)) }
        let fields = try headerFields(headers)
        if !fields.isEmpty {
            params["headers"] = .object(Dictionary(fields.map { ($0.name, JSONValue.string($0.value)) }) { _, last in last })
        }
        if overwrite { params["overwrite"] = true }
        if paused { params["paused"] = true }
        JobParamRules.add(options, to: &params)
        let result = try common.call(RPCMethod.enqueue.rawValue, params)
        if let groupID = result["group"]?["id"]?.int64Value {
            try reportGroup(result, groupID)
        } else {
            common.emit(result) { describe(result) }
            let ids = result["job"]?["id"]?.int64Value.map { [$0] } ?? []
            if wait { try waitFor(common: common, ids: ids, group: nil, timeout: nil, showProgress: true) }
        }
    }

    /// A group a Metalink became: its line, then the wait for it with `--wait`.
    private func reportGroup(_ result: JSONValue, _ groupID: Int64) throws {
        common.emit(result) {
            let kind = result["group"]?["hls"].map { $0 == .null ? "" : "HLS " } ?? ""
            return "\(kind)group \(groupID) (\(result["count"]?.int64Value ?? 0) files) → \(result["group"]?["dir"]?.stringValue ?? "")"
        }
        if wait { try waitFor(common: common, ids: [], group: String(groupID), timeout: nil, showProgress: true) }
    }

    /// `--group NAME -d DIR`: one group whose members land in DIR together.
    private func runGroup(_ group: String, _ entries: [InputEntry]) throws {
        let members: [GroupMemberSpec] = try entries.map { entry in
            var member = GroupMemberSpec(url: entry.url)
            let file = entry.name ?? FileNames.fromURL(entry.url)
            if let folder = entry.dir {
                guard !folder.hasPrefix("/") else {
                    printError("line \(entry.line): in a group, dir= must be relative to the group's folder")
                    throw ExitCode(65)
                }
                member.relativePath = folder + "/" + file
            } else {
                member.relativePath = entry.name
            }
            member.checksum = entry.checksum
            member.size = entry.size
            return member
        }
        var request = GroupEnqueue(name: group, dir: absolute(dir ?? "."), members: members)
        request.priority = priority ?? 0
        request.overwrite = overwrite
        request.paused = paused
        request.options = options
        let result = try common.call(.enqueue, EnqueueParams.group(request))
        let groupID = result["group"]?["id"]?.int64Value
        common.emit(result) {
            "group \(groupID.map(String.init) ?? "?") (\(members.count) files) → \(result["group"]?["dir"]?.stringValue ?? "")"
        }
        if wait, let groupID { try waitFor(common: common, ids: [], group: String(groupID), timeout: nil, showProgress: true) }
    }

    /// The TLS files given on the command line (as absolute paths), `--segments`,
    /// `--encrypt-to` and `--metered`: for a job or a group.
    private var options: JobOptions {
        let tls = JobTLS(caFile: caFile.map(absolute), clientCert: clientCert.map(absolute), clientKey: clientKey.map(absolute))
        return JobOptions(
            tls: tls.isEmpty ? nil : tls, segments: segments, metered: metered, encryptTo: encryptTo.isEmpty ? nil : encryptTo)
    }

    private func describe(_ outcome: JSONValue) -> String {
        let id = (outcome["job"]?["id"] ?? outcome["id"])?.int64Value.map(String.init) ?? "?"
        return outcome["created"]?.boolValue == false ? "\(id) (exists already)" : id
    }
}

struct Status: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Show jobs: a table, or one job in detail.")

    @Argument(help: "Job ids (default: all jobs).", completion: .custom { words, _, _ in JobIDCompletion.candidates(words, states: nil) })
    var ids: [Int64] = []
    @Option(help: "Only jobs in this state (repeatable).") var state: [String] = []
    @Option(help: "A group (id or name): its members done/total, bytes, and its jobs.") var group: String?
    @OptionGroup var common: Common

    /// `--state` names, read as the daemon reads them; none: every state.
    private var states: [JobState]? {
        get throws {
            guard !state.isEmpty else { return nil }
            var params = ListParams()
            do throws(DLError) {
                params = try ListParams(["state": .array(state.map { .string($0) })])
            } catch {
                throw common.refuse(error)
            }
            return params.states
        }
    }

    func run() throws {
        if let group {
            let result = try common.call(.status, StatusParams(.group(GroupReference(argument: group))))
            common.emit(result) {
                let g = result["group"] ?? .null
                let total = g["bytes_total"]?.doubleValue.map { Format.bytes($0) } ?? "?"
                var head = "group \(g["id"]?.serializedString() ?? "?") \(g["name"]?.stringValue ?? "")  \(g["state"]?.stringValue ?? "")  "
                head += "\(g["members_done"]?.serializedString() ?? "0")/\(g["members"]?.serializedString() ?? "0") files, "
                head += "\(Format.bytes(g["bytes_done"]?.doubleValue ?? 0)) of \(total)  → \(g["dir"]?.stringValue ?? "")"
                if let error = g["error"], !error.isNull {
                    head += "\nerror: \(error["message"]?.stringValue ?? "") [\(error["code"]?.stringValue ?? "")]"
                }
                return head + "\n" + Format.table(result["jobs"]?.arrayValue ?? [])
            }
            return
        }
        if ids.count == 1 {
            let job = try common.call(.status, StatusParams(.job(ids[0])))
            common.emit(job) { Format.details(job) }
            return
        }
        var jobs: [JSONValue] = []
        if ids.isEmpty {
            let states = try self.states
            var after: Int64 = 0
            while true {
                let page = try common.call(.list, ListParams(states: states, limit: 1000, afterID: after))
                jobs += page["jobs"]?.arrayValue ?? []
                guard let next = page["next_after_id"]?.int64Value else { break }
                after = next
            }
        } else {
            jobs = try common.call(.status, StatusParams(.jobs(ids)))["jobs"]?.arrayValue ?? []
        }
        common.emit(.array(jobs)) { Format.table(jobs) }
    }
}

/// pause, resume and cancel share their shape.
protocol SelectionCommand: ParsableCommand {
    static var method: RPCMethod { get }
    static var pastTense: String { get }
    var selection: Selection { get }
    var common: Common { get }
}

extension SelectionCommand {
    func run() throws {
        let result = try common.call(Self.method, SelectionParams(selection.selection))
        common.emit(result) { Format.bulk(result, verb: Self.pastTense) }
    }
}

struct Pause: SelectionCommand {
    static let configuration = CommandConfiguration(abstract: "Pause jobs; they keep their bytes.")
    static let method = RPCMethod.pause
    static let pastTense = "paused"
    @OptionGroup var selection: Selection
    @OptionGroup var common: Common
}

struct Resume: SelectionCommand {
    static let configuration = CommandConfiguration(abstract: "Queue paused, waiting or failed jobs again.")
    static let method = RPCMethod.resume
    static let pastTense = "resumed"
    @OptionGroup var selection: Selection
    @OptionGroup var common: Common
}

struct Cancel: SelectionCommand {
    static let configuration = CommandConfiguration(abstract: "Cancel jobs and delete their partial data.")
    static let method = RPCMethod.cancel
    static let pastTense = "canceled"
    @OptionGroup var selection: Selection
    @OptionGroup var common: Common
}

struct Remove: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "rm", abstract: "Delete job records (a finished file stays unless --delete-file).",
        discussion:
            "--finished (completed and canceled) and --failed, optionally with --older-than, take the records of jobs outside groups; a group goes whole with --group."
    )
    @Argument(help: "Job ids.", completion: .custom { words, _, _ in JobIDCompletion.candidates(words, states: nil) })
    var ids: [Int64] = []
    @Option(help: "A group (id or name).") var group: String?
    @Flag(help: "Every job.") var all = false
    @Flag(help: "Completed and canceled jobs.") var finished = false
    @Flag(help: "Failed jobs.") var failed = false
    @Option(name: .customLong("older-than"), help: "Only jobs that finished at least this long ago: seconds, or 90s, 15m, 12h, 30d, 2w.")
    var olderThan: String?
    @Flag(name: .customLong("delete-file"), help: "Also delete the downloaded file of completed jobs.") var deleteFile = false
    @OptionGroup var common: Common

    func validate() throws {
        let byState = finished || failed
        if olderThan != nil && !byState { throw ValidationError("--older-than goes with --finished or --failed") }
        if byState {
            if all || group != nil || !ids.isEmpty {
                throw ValidationError("--finished and --failed do not go with job ids, --group or --all")
            }
            if deleteFile { throw ValidationError("--delete-file does not go with --finished or --failed: their files stay") }
            if let olderThan, DurationText.seconds(olderThan) == nil {
                throw ValidationError("--older-than must be seconds, or a number with s, m, h, d or w (30d), got \(olderThan)")
            }
            return
        }
        let given = (all ? 1 : 0) + (ids.isEmpty ? 0 : 1) + (group == nil ? 0 : 1)
        if given > 1 { throw ValidationError("give job ids, --group or --all, only one of them") }
        if given == 0 { throw ValidationError("give one or more job ids, --group, --all, --finished or --failed") }
        if let bad = ids.first(where: { $0 < 1 }) { throw ValidationError("job ids are positive integers, got \(bad)") }
    }

    func run() throws {
        let target: RemoveParams.Target
        if finished || failed {
            let states: [JobState] = (finished ? [.completed, .canceled] : []) + (failed ? [.failed] : [])
            let seconds = olderThan.flatMap(DurationText.seconds).map { Int64(min($0, Double(Int32.max))) }
            target = .finished(states: states, olderThan: seconds)
        } else if let group {
            target = .jobs(.group(GroupReference(argument: group)), deleteFile: deleteFile)
        } else {
            target = .jobs(all ? .all : .ids(ids), deleteFile: deleteFile)
        }
        let result = try common.call(.remove, RemoveParams(target))
        common.emit(result) { Format.bulk(result, verb: "removed") }
    }
}

struct Stats: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Counts by state, active transfers, total speed; the live workers of a shared queue.")
    @OptionGroup var common: Common

    func run() throws {
        let result = try common.call(.stats)
        common.emit(result) {
            let counts = JobState.allCases.map { "\($0.rawValue) \(result["counts"]?[$0.rawValue]?.int64Value ?? 0)" }
            return """
                jobs    \(result["total"]?.int64Value ?? 0): \(counts.joined(separator: ", "))
                active  \(result["active"]?.int64Value ?? 0) of \(result["max_active"]?.int64Value ?? 0) slots
                speed   \(Format.speed(result["speed"]?.doubleValue ?? 0))
                table   \(Format.bytes(Double(result["database_bytes"]?.int64Value ?? 0)))
                limit   \(Speed.describe(result["max_speed"] ?? .null))
                """ + (result["accepting"]?.boolValue == false ? "\nshutting down" : "")
                    + (result["queue_paused_reason"]?.stringValue.map { "\nqueue   paused: \($0)" } ?? "")
                    + workers(result) + cache(result["cache"])
        }
    }

    /// The URL cache's counters since dld started, when it is available.
    private func cache(_ cache: JSONValue?) -> String {
        guard let cache, cache["available"]?.boolValue == true else { return "" }
        func n(_ key: String) -> Int64 { cache[key]?.int64Value ?? 0 }
        let budget = n("max_bytes") > 0 ? " of \(Format.bytes(Double(n("max_bytes"))))" : ""
        return "\ncache   \(n("entries")) entries (\(n("pinned")) pinned), \(Format.bytes(Double(n("bytes"))))\(budget); "
            + "\(n("hits")) hits, \(n("misses")) misses, \(n("revalidations")) revalidations"
    }

    /// The live workers, when the table is shared with other daemons.
    private func workers(_ result: JSONValue) -> String {
        let ids = (result["workers"]?.arrayValue ?? []).compactMap { $0["id"]?.stringValue }
        guard ids.count > 1 || ids.first.map({ $0 != result["worker"]?.stringValue }) == true else { return "" }
        let this = result["worker"]?.stringValue
        return "\nworkers " + ids.map { $0 == this ? "\($0) (this one)" : $0 }.joined(separator: ", ")
    }
}

struct Queue: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Stop or restart the whole queue (jobs keep their states).",
        discussion:
            "While the queue is paused no job starts; transfers already running go on. dld starts with it paused after three starts in a row that did not last."
    )

    enum Action: String, ExpressibleByArgument, CaseIterable { case pause, resume }
    @Argument(help: "pause or resume; none to show the queue's state.") var action: Action?
    @OptionGroup var common: Common

    func run() throws {
        let result = try common.call(.queue, QueueParams(paused: action.map { $0 == .pause }))
        common.emit(result) {
            result["paused"]?.boolValue == true ? "queue paused: \(result["reason"]?.stringValue ?? "")" : "queue running"
        }
    }
}

struct Version: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "The daemon's version and protocol version.")
    @OptionGroup var common: Common

    func run() throws {
        let result = try common.call(.version)
        common.emit(result) {
            "dld \(result["version"]?.stringValue ?? "?") (protocol \(result["protocol"]?.int64Value ?? 0)); dlctl \(DLDVersion.current)"
        }
    }
}

/// `rpc.discover`: the protocol as the daemon serves it, for tools that read OpenRPC.
struct Discover: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "The daemon's protocol as an OpenRPC 1.3 document (JSON), from its own method table.",
        discussion: "Without --json, one line per method: its name and summary. With --json, the whole document.")
    @OptionGroup var common: Common

    func run() throws {
        let result = try common.call(.discover)
        common.emit(result) {
            let methods = result["methods"]?.arrayValue ?? []
            let lines = methods.map { method in
                let name = method["name"]?.stringValue ?? "?"
                let summary = method["summary"]?.stringValue ?? ""
                return summary.isEmpty ? name : "\(name)  \(summary)"
            }
            return
                ([
                    "OpenRPC \(result["openrpc"]?.stringValue ?? "?"): \(result["info"]?["title"]?.stringValue ?? "dld"), protocol \(result["info"]?["version"]?.stringValue ?? "?")"
                ] + lines).joined(separator: "\n")
        }
    }
}

struct Shutdown: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Stop the daemon; running jobs resume at its next start.")
    @OptionGroup var common: Common

    func run() throws {
        let result = try common.call(.shutdown)
        common.emit(result) { "dld is stopping" }
    }
}

func absolute(_ path: String) -> String {
    let expanded = (path as NSString).expandingTildeInPath
    if expanded.hasPrefix("/") { return expanded }
    return FileManager.default.currentDirectoryPath + "/" + expanded
}

/// Splits an enqueue list into calls the daemon accepts: at most `maxJobs` jobs and about
/// `maxBytes` of JSON each (the daemon's defaults are 10 000 jobs and 4 MiB lines). Calls of
/// 2000 keep the daemon's memory for one call small (calls of 5000 took its peak with a
/// 100 000-line list up to its memory budget) and take about as long in all
/// (docs/benchmarks.md, the `scale` part: `dlctl enqueue -i`).
enum EnqueueChunks {
    static let maxJobs = 2000
    static let maxBytes = 1 << 20

    static func split(_ jobs: [JSONValue]) -> [[JSONValue]] {
        var chunks: [[JSONValue]] = []
        var current: [JSONValue] = []
        var bytes = 0
        for job in jobs {
            let size = job.serialized().count + 1
            if !current.isEmpty && (current.count >= maxJobs || bytes + size > maxBytes) {
                chunks.append(current)
                current = []
                bytes = 0
            }
            current.append(job)
            bytes += size
        }
        if !current.isEmpty { chunks.append(current) }
        return chunks
    }
}

struct Get: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print the path of a local copy of URL, from the cache or downloaded into it first.",
        discussion:
            "A fresh cached copy answers at once; a stale one is revalidated with the server (a 304 costs no body); otherwise the URL is downloaded as an ordinary job (see `dlctl status`) and the path is printed when it completes. The copy stays until the cache evicts it (cache_max_bytes, cache_max_age); --pin keeps it until `dlctl unpin URL`."
    )
    @Argument(help: "An http or https URL.") var url: String
    @Flag(help: "Keep the copy whatever the cache's budgets, until `dlctl unpin URL`.") var pin = false
    @OptionGroup var common: Common

    func run() throws {
        let result = try common.call(.get, GetParams(url: url, pin: pin))
        common.emit(result) { result["path"]?.stringValue ?? "" }
    }
}

struct Unpin: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Let the cache evict a URL that `dlctl get --pin` kept.")
    @Argument(help: "The URL, as given to get.") var url: String
    @OptionGroup var common: Common

    func run() throws {
        let result = try common.call(.unpin, UnpinParams(url: url))
        common.emit(result) { result["cached"]?.boolValue == true ? "unpinned" : "not cached" }
    }
}

struct CacheList: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "cache-ls", abstract: "List the URL cache's entries, least recently used first.")
    @OptionGroup var common: Common

    func run() throws {
        let result = try common.call(.cacheList)
        common.emit(result) {
            (result["entries"]?.arrayValue ?? []).map { entry in
                let flags = [entry["pinned"]?.boolValue == true ? "pinned" : nil, entry["in_use"]?.boolValue == true ? "in use" : nil]
                    .compactMap { $0 }.joined(separator: ",")
                return
                    "\(Format.bytes(Double(entry["size"]?.int64Value ?? 0)))\t\(flags.isEmpty ? "-" : flags)\t\(entry["url"]?.stringValue ?? "")\t\(entry["path"]?.stringValue ?? "")"
            }.joined(separator: "\n")
        }
    }
}
