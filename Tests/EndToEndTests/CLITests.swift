import DLCore
import DLRPC
import DLTestSupport
import Foundation
import Testing

/// dlctl's shell habits (issue 10): `--version`, the options of every command given before
/// the command as in git and systemctl, and job ids completed by asking the daemon.
@Suite(.serialized) struct CLITests {
    /// `--version` needs no daemon; `--socket` and `--json` work before the command, in both
    /// spellings, and reach the daemon named (not `$DLD_SOCKET`).
    @Test func versionAndOptionsBeforeTheCommand() throws {
        let daemon = try DaemonHarness()
        var environment = daemon.environment
        environment["DLD_SOCKET"] = daemon.root + "/nothing-here.sock"
        let dlctl = try BuiltProducts.path("dlctl")
        let version = try runProgram(dlctl, ["--version"], environment: environment)
        #expect(version.status == 0 && version.stdout.contains("dlctl \(DLDVersion.current)"), "\(version.stdout)\(version.stderr)")
        let dldVersion = try runProgram(try BuiltProducts.path("dld"), ["--version"], environment: environment)
        #expect(dldVersion.status == 0 && dldVersion.stdout.contains("dld \(DLDVersion.current)"), "\(dldVersion.stdout)")

        try daemon.start()
        defer { daemon.stop() }
        let id = try daemon.enqueue(["url": "http://127.0.0.1:9/x", "name": "x.bin", "paused": true])
        let status = try runProgram(dlctl, ["--socket", daemon.socket, "--json", "status", "\(id)"], environment: environment)
        #expect(status.status == 0, "\(status.stderr)")
        let parsed = try JSONValue.parse(Data(status.stdout.utf8))
        #expect(parsed["id"]?.int64Value == id && parsed["state"] == "paused", "\(status.stdout)")
        let canceled = try runProgram(dlctl, ["--json", "--socket=\(daemon.socket)", "cancel", "\(id)"], environment: environment)
        #expect(canceled.status == 0, "\(canceled.stderr)")
        #expect(try daemon.job(id)["state"] == "canceled")
        // After the command they work as before; without them $DLD_SOCKET is used (nobody there).
        #expect(try runProgram(dlctl, ["stats", "--socket", daemon.socket], environment: environment).status == 0)
        #expect(try runProgram(dlctl, ["stats"], environment: environment).status == 69)
    }

    /// bash completion, loaded from the script dlctl generates: `dlctl pause <TAB>` offers the
    /// ids of the daemon's jobs; with no daemon it offers nothing and prints nothing.
    /// `dlctl discover`: a line for every method the daemon answers, and with --json the
    /// OpenRPC document itself.
    @Test func discoverListsEveryMethod() throws {
        let daemon = try DaemonHarness()
        try daemon.start()
        defer { daemon.stop() }
        let text = try daemon.dlctl(["discover"])
        #expect(text.status == 0, "\(text.stderr)")
        let lines = text.stdout.split(separator: "\n").map(String.init)
        #expect(lines.first?.hasPrefix("OpenRPC 1.3") == true, "\(text.stdout)")
        for method in RPCMethod.allCases {
            #expect(
                lines.contains { $0 == method.rawValue || $0.hasPrefix(method.rawValue + "  ") },
                "\(method.rawValue) missing:\n\(text.stdout)")
        }
        let json = try daemon.dlctl(["discover", "--json"])
        let document = try JSONValue.parse(Data(json.stdout.utf8))
        #expect(document["methods"]?.arrayValue?.count == RPCMethod.allCases.count, "\(json.stdout.prefix(300))")
    }

    @Test func jobIDsCompleteFromTheDaemon() throws {
        let daemon = try DaemonHarness()
        try daemon.start()
        defer { daemon.stop() }
        let first = try daemon.enqueue(["url": "http://127.0.0.1:9/a", "name": "a.bin", "paused": true])
        let second = try daemon.enqueue(["url": "http://127.0.0.1:9/b", "name": "b.bin", "paused": true])
        let dlctl = try BuiltProducts.path("dlctl")
        let script = try runProgram(dlctl, ["--generate-completion-script", "bash"], environment: daemon.environment)
        #expect(script.status == 0)
        let scriptPath = daemon.root + "/dlctl.bash"
        try script.stdout.write(toFile: scriptPath, atomically: true, encoding: .utf8)
        // The script calls `dlctl` by name: the folder of this build goes first on PATH.
        var environment = daemon.environment
        environment["PATH"] = BuiltProducts.folder + ":" + (environment["PATH"] ?? "/usr/bin:/bin")
        func complete(_ words: [String]) throws -> ProgramOutput {
            let quoted = words.map { "'\($0)'" }.joined(separator: " ")
            return try runProgram(
                "/bin/bash",
                [
                    "-c",
                    """
                    source '\(scriptPath)' || exit 3
                    COMP_WORDS=(\(quoted)); COMP_CWORD=\(words.count - 1); COMP_LINE="${COMP_WORDS[*]}"; COMP_POINT=${#COMP_LINE}
                    _dlctl
                    printf '%s\\n' "${COMPREPLY[@]}"
                    """,
                ], environment: environment)
        }
        let pause = try complete(["dlctl", "pause", ""])
        #expect(pause.status == 0, "\(pause.stderr)")
        let offered = Set(pause.stdout.split(separator: "\n").map(String.init))
        #expect(offered.contains("\(first)") && offered.contains("\(second)"), "\(pause.stdout)")
        let commands = try complete(["dlctl", "pa"])
        #expect(commands.stdout.contains("pause"), "\(commands.stdout)")
        daemon.stop()
        let none = try complete(["dlctl", "status", ""])
        #expect(none.status == 0 && none.stderr.isEmpty, "\(none.stderr)")
        #expect(!none.stdout.contains("\(first)"))
    }
}
