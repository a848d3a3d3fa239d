import DLCore
@testable import DLDaemon
import Foundation
import Testing

/// The table of config keys (`DaemonConfig.table`) and docs/configuration.md agree, so that a
/// key added without its documentation fails here; and the table's parts agree with each other.
/// (`ConfigTests` is in DispatcherTests.swift, with the file parser's tests.)
extension ConfigTests {
    static func configurationText() throws -> String {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        return try String(contentsOf: root.appendingPathComponent("docs/configuration.md"), encoding: .utf8)
    }

    /// The text of a section, from its heading to the next one of its level.
    static func section(_ heading: String, of text: String) throws -> Substring {
        let start = try #require(text.range(of: "\n## \(heading)\n"), "no section \(heading)").upperBound
        let end = text[start...].range(of: "\n## ")?.lowerBound ?? text.endIndex
        return text[start..<end]
    }

    /// The contents of the `code` spans of a text.
    static func codeSpans(_ text: Substring) -> [String] {
        text.split(separator: "`", omittingEmptySubsequences: false).enumerated().filter { $0.offset % 2 == 1 }.map { String($0.element) }
    }

    /// The rows of "Config file keys": each key named in a row's first cell (one row may name
    /// two), with the row's Default cell.
    static func documentedDefaults() throws -> [String: String] {
        var defaults: [String: String] = [:]
        for line in try section("Config file keys", of: configurationText()).split(separator: "\n") where line.hasPrefix("| `") {
            let cells = line.split(separator: "|").map { $0.trimmingCharacters(in: .whitespaces) }
            for key in codeSpans(cells[0][...]) {
                #expect(defaults[key] == nil, "\(key) has two rows")
                defaults[key] = cells[2]
            }
        }
        return defaults
    }

    @Test func theTableNamesEachKeyOnce() {
        #expect(Set(DaemonConfig.keys).count == DaemonConfig.keys.count, "\(DaemonConfig.keys)")
        for key in DaemonConfig.table { #expect(!key.help.isEmpty && !key.help.contains("\n"), "\(key.name): one line of help") }
    }

    @Test func theDocsListExactlyTheTablesKeys() throws {
        let documented = Set(try Self.documentedDefaults().keys)
        let table = Set(DaemonConfig.keys)
        #expect(table.subtracting(documented).isEmpty, "keys without a row in docs/configuration.md")
        #expect(documented.subtracting(table).isEmpty, "rows in docs/configuration.md for keys dld does not know")
    }

    /// A default that depends on the environment (it differs between two) may be said in
    /// words; any other must be written as `--print-config` writes it ("—" when it prints
    /// nothing), with the home folder as `~`.
    @Test func theDocsGiveTheDefaults() throws {
        let documented = try Self.documentedDefaults()
        let here = DaemonConfig.defaults(environment: ["HOME": "/home/u"])
        let elsewhere = DaemonConfig.defaults(environment: ["HOME": "/home/v", "XDG_RUNTIME_DIR": "/run/user/9", "XDG_CACHE_HOME": "/c"])
        for key in DaemonConfig.table {
            let cell = try #require(documented[key.name], "\(key.name) has no row")
            let value = key.render(here)
            guard value == key.render(elsewhere) else {
                #expect(!cell.hasPrefix("—"), "\(key.name): printed always")
                continue
            }
            guard let value else {
                #expect(cell.hasPrefix("—"), "\(key.name) is printed only when set, so its default is —, not \(cell)")
                continue
            }
            let written = cell.hasPrefix("`") ? Self.codeSpans(cell[...]).first ?? "" : String(cell.prefix { $0 != " " })
            #expect(written == value.replacingOccurrences(of: here.home, with: "~"), "\(key.name)'s default in the docs")
        }
    }

    /// "Reloading" names the keys that take effect at once, then those that wait for the next
    /// start; each group must be the table's `.live` and `.restart` keys.
    @Test func theDocsSayWhichKeysReloadLive() throws {
        let text = try Self.section("Reloading", of: Self.configurationText()).replacingOccurrences(of: "\n", with: " ")[...]
        let split = try #require(text.range(of: "at the next start"), "Reloading no longer says which keys wait for the next start")
        let names = Set(DaemonConfig.keys)
        let live = Set(Self.codeSpans(text[..<split.lowerBound])).intersection(names)
        let restart = Set(Self.codeSpans(text[split.upperBound...])).intersection(names)
        let tableLive = Set(DaemonConfig.table.filter { $0.reload == .live }.map(\.name))
        #expect(
            live == tableLive,
            "live in the docs, not in the table: \(live.subtracting(tableLive).sorted()); the reverse: \(tableLive.subtracting(live).sorted())"
        )
        let tableRestart = DaemonConfig.restartKeys
        #expect(
            restart == tableRestart,
            "restart in the docs, not in the table: \(restart.subtracting(tableRestart).sorted()); the reverse: \(tableRestart.subtracting(restart).sorted())"
        )
    }

    /// The example of `--print-config` shows the keys printed by default, in the table's order.
    @Test func theDocsShowWhatPrintConfigPrints() throws {
        let text = try Self.section("`dld --print-config`", of: Self.configurationText())
        let start = try #require(text.range(of: "$ dld --print-config\n")).upperBound
        let example = text[start...].prefix { $0 != "`" }.split(separator: "\n").filter { !$0.hasPrefix("#") }
        let printed = DaemonConfig.defaults().rendered().split(separator: "\n").filter { !$0.hasPrefix("#") }
        #expect(example.map { $0.prefix { $0 != " " } } == printed.map { $0.prefix { $0 != " " } })
    }

    /// The defaults with `settings` read over them, what `--print-config` prints for them, and
    /// that printout read back over the defaults.
    static func readBack(_ settings: String) throws -> (config: DaemonConfig, printed: String, reread: DaemonConfig) {
        let folder = NSTemporaryDirectory() + "dld-config-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: folder) }
        try settings.write(toFile: folder + "/set.toml", atomically: true, encoding: .utf8)
        var config = DaemonConfig.defaults()
        try config.apply(file: folder + "/set.toml")
        let printed = config.rendered()
        try printed.write(toFile: folder + "/printed.toml", atomically: true, encoding: .utf8)
        var reread = DaemonConfig.defaults()
        try reread.apply(file: folder + "/printed.toml")
        return (config, printed, reread)
    }

    /// `--print-config` writes a file that reads back as the same configuration: each entry's
    /// render and parse agree.
    @Test func printedConfigReadsBackTheSame() throws {
        let (config, printed, reread) = try Self.readBack(
            """
            on_complete = ["/bin/echo", "done \\"quoted\\""]
            speed_schedule = "08:00-18:00 2M"
            max_speed = "3M"
            proxy = "http://proxy.lan:3128"
            no_proxy = "localhost,.lan"
            retry_base = 2.5
            keep_failed = "12h"
            """)
        #expect(DaemonConfig.changedKeys(config, reread).isEmpty, "\(printed)")
    }

    /// Seconds too many for an Int64 are printed (by `--print-config`, and by a reload, which
    /// compares what the old and new values print) as a Double that reads back, not trapped on.
    @Test func hugeSecondsPrintAndReadBack() throws {
        let (config, printed, reread) = try Self.readBack("retry_max_delay = 1e19\nkeep_finished = \"1e20s\"\n")
        #expect(printed.contains("retry_max_delay = 1e+19\n") && printed.contains("keep_finished = \"1e+20s\"\n"), "\(printed)")
        #expect(DaemonConfig.changedKeys(config, reread).isEmpty, "\(printed)")
        #expect(DaemonConfig.changedKeys(DaemonConfig.defaults(), config) == ["keep_finished", "retry_max_delay"])
    }

    /// A reload keeps exactly the table's `.restart` keys as they were.
    @Test func aReloadKeepsTheRestartKeys() throws {
        let running = DaemonConfig.defaults()
        var read = running
        try read.set("max_active", .integer(7))
        try read.set("worker_name", .string("renamed"))
        try read.set("http2", .bool(false))
        #expect(DaemonConfig.changedKeys(running, read) == ["http2", "max_active", "worker_name"])
        #expect(DaemonConfig.changedKeys(running, read.keepingRestartKeys(of: running)) == ["max_active"])
        #expect(DaemonConfig.restartKeys.isSuperset(of: ["http2", "worker_name", "socket", "database"]))
    }
}

extension ConfigTests {
    /// `watch_dir` is an absolute folder (not "/"), or "" for none; printed only when set, and
    /// it waits for the next start.
    @Test func watchDir() throws {
        var config = DaemonConfig.defaults(environment: ["HOME": "/home/u"])
        try config.set("watch_dir", .string("/home/u/drop"))
        #expect(config.watchDir == "/home/u/drop")
        #expect(config.rendered().contains("watch_dir = \"/home/u/drop\""))
        try config.set("watch_dir", .string(""))
        #expect(config.watchDir.isEmpty && !config.rendered().contains("watch_dir"))
        for bad: TOMLLite.Value in [.string("drop"), .string("/"), .integer(1)] {
            #expect(throws: DaemonError.self) { try config.set("watch_dir", bad) }
        }
        #expect(DaemonConfig.restartKeys.contains("watch_dir"))
    }
}
