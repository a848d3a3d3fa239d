import DLCore
import DLRPC
import DLTestSupport
import Foundation
import Testing

/// Log lines for the journal (issue 10): when `$JOURNAL_STREAM` names dld's stderr, each line
/// starts with its syslog priority (`<6>` info, `<4>` warning) so that `journalctl -p` works;
/// when it names another stream (stderr redirected), lines stay as they are.
@Suite(.serialized) struct JournalTests {
    /// The shell that starts dld sets `JOURNAL_STREAM` to its stderr's device and inode, as
    /// systemd does for a unit whose output goes to the journal.
    @Test func priorityPrefixesOnlyWhenStderrIsTheJournal() throws {
        let daemon = try DaemonHarness()
        // A state folder open to others: dld tightens it and says so as a warning.
        try FileManager.default.createDirectory(atPath: daemon.stateDir, withIntermediateDirectories: true)
        chmod(daemon.stateDir, 0o755)
        daemon.launcher = ["/bin/sh", "-c", "export JOURNAL_STREAM=$(stat -L -c %d:%i /proc/self/fd/2); exec \"$0\" \"$@\""]
        try daemon.start()
        let lines = daemon.log.split(separator: "\n").filter { $0.contains(" dld: ") }
        #expect(lines.contains { $0.hasPrefix("<6>info dld: ") && $0.contains("listening") }, "\(daemon.log)")
        #expect(lines.contains { $0.hasPrefix("<4>warning dld: ") && $0.contains("state folder had mode 755") }, "\(daemon.log)")
        #expect(lines.contains { $0.hasPrefix("<7>debug dld: ") }, "\(daemon.log)")
        #expect(lines.allSatisfy { $0.hasPrefix("<") }, "\(daemon.log)")
        daemon.stop()
        #expect(daemon.log.contains("<6>info dld: [DLDaemon] stopped"), "\(daemon.log.suffix(1000))")

        let elsewhere = try DaemonHarness()
        elsewhere.extraEnvironment["JOURNAL_STREAM"] = "8:12345"
        try elsewhere.start()
        elsewhere.stop()
        let plain = elsewhere.log.split(separator: "\n").filter { $0.contains(" dld: ") }
        #expect(!plain.isEmpty && plain.allSatisfy { !$0.hasPrefix("<") && $0.hasPrefix("20") }, "\(elsewhere.log)")
    }
}
