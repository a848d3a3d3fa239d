import DLTestSupport
import Foundation
import Testing

/// `make install` as packagers and users run it (issue 10): every file in its place under
/// DESTDIR and PREFIX, units that `systemd-analyze verify` accepts, manual pages that `man`
/// renders, completion scripts that load in bash, and `make uninstall` taking them all away.
/// The binaries of this build are installed (`make install-files BIN=…`, the part of
/// `make install` after its release build).
@Suite(.serialized) struct InstallTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .path

    static let files: [(path: String, mode: Int)] = [
        ("bin/dld", 0o755), ("bin/dlctl", 0o755),
        ("share/systemd/user/dld.service", 0o644), ("share/systemd/user/dld.socket", 0o644),
        ("share/systemd/user/dld-http.socket", 0o644),
        ("share/man/man1/dld.1", 0o644), ("share/man/man1/dlctl.1", 0o644), ("share/man/man5/dld.conf.5", 0o644),
        ("share/bash-completion/completions/dld", 0o644), ("share/bash-completion/completions/dlctl", 0o644),
        ("share/zsh/site-functions/_dld", 0o644), ("share/zsh/site-functions/_dlctl", 0o644),
        ("share/fish/vendor_completions.d/dld.fish", 0o644), ("share/fish/vendor_completions.d/dlctl.fish", 0o644),
        ("share/doc/dld/README.md", 0o644), ("share/doc/dld/configuration.md", 0o644), ("share/doc/dld/operations.md", 0o644),
    ]

    func make(_ arguments: [String]) throws -> ProgramOutput {
        let generator = BuiltProducts.folder + "/generate-manual"
        guard FileManager.default.isExecutableFile(atPath: generator) else {
            throw HarnessError("\(generator) is missing: `make test` builds it (swift build --product generate-manual)")
        }
        return try runProgram("/usr/bin/make", ["-C", Self.root, "--no-print-directory"] + arguments + ["BIN=\(BuiltProducts.folder)"])
    }

    func mode(_ path: String) -> Int? {
        (try? FileManager.default.attributesOfItem(atPath: path)[.posixPermissions] as? Int) ?? nil
    }

    /// DESTDIR and PREFIX as a package build uses them: the files under DESTDIR, the units'
    /// ExecStart naming PREFIX (where they will be), and nothing outside DESTDIR.
    @Test func installPutsEveryFileInPlaceAndUninstallRemovesThem() throws {
        let daemon = try DaemonHarness()
        let dest = daemon.root + "/dest"
        let installed = try make(["install-files", "DESTDIR=\(dest)", "PREFIX=/usr"])
        #expect(installed.status == 0, "\(installed.stdout)\(installed.stderr)")
        for file in Self.files {
            #expect(mode(dest + "/usr/" + file.path) == file.mode, "\(file.path)")
        }
        let unit = try String(contentsOfFile: dest + "/usr/share/systemd/user/dld.service", encoding: .utf8)
        #expect(unit.contains("ExecStart=/usr/bin/dld\n") && !unit.contains(dest) && !unit.contains("@BINDIR@"), "\(unit)")

        for page in ["man1/dld.1", "man1/dlctl.1", "man5/dld.conf.5"] {
            let rendered = try runProgram(
                "/usr/bin/man", ["-l", dest + "/usr/share/man/" + page],
                environment: ["MANWIDTH": "100", "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"])
            #expect(rendered.status == 0 && rendered.stderr.isEmpty, "\(page): \(rendered.stderr)")
            #expect(rendered.stdout.contains("NAME") && rendered.stdout.contains("DESCRIPTION"), "\(page)")
        }
        let dlctlPage = try runProgram(
            "/usr/bin/man", ["-l", dest + "/usr/share/man/man1/dlctl.1"], environment: ["MANWIDTH": "100", "PATH": "/usr/bin:/bin"])
        #expect(
            dlctlPage.stdout.contains("enqueue") && dlctlPage.stdout.contains("--socket"), "the page is not generated from the commands")
        let confPage = try runProgram(
            "/usr/bin/man", ["-l", dest + "/usr/share/man/man5/dld.conf.5"], environment: ["MANWIDTH": "100", "PATH": "/usr/bin:/bin"])
        #expect(confPage.stdout.contains("max_active") && confPage.stdout.contains("no_proxy"), "dld.conf(5) lacks the keys")

        for tool in ["dld", "dlctl"] {
            let loaded = try runProgram(
                "/bin/bash", ["-c", "source '\(dest)/usr/share/bash-completion/completions/\(tool)' && complete -p \(tool)"])
            #expect(loaded.status == 0 && loaded.stdout.contains("-F _\(tool) \(tool)"), "\(tool): \(loaded.stdout)\(loaded.stderr)")
        }

        let removed = try make(["uninstall", "DESTDIR=\(dest)", "PREFIX=/usr"])
        #expect(removed.status == 0, "\(removed.stderr)")
        for file in Self.files {
            #expect(!FileManager.default.fileExists(atPath: dest + "/usr/" + file.path), "\(file.path) left after uninstall")
        }
    }

    /// A user's install (PREFIX only, where the files really are): `systemd-analyze --user
    /// verify` passes on both units without a word, which needs the ExecStart binary and the
    /// Documentation= pages to exist. It needs a runtime folder (`XDG_RUNTIME_DIR`) and finds
    /// the pages through MANPATH, as a user with ~/.local/share/man would.
    @Test func unitsVerify() throws {
        let daemon = try DaemonHarness()
        let prefix = daemon.root + "/prefix"
        let runtime = daemon.root + "/run"
        try FileManager.default.createDirectory(atPath: runtime, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        let installed = try make(["install-files", "PREFIX=\(prefix)"])
        #expect(installed.status == 0, "\(installed.stderr)")
        let units = prefix + "/share/systemd/user"
        let verified = try runProgram(
            "/usr/bin/systemd-analyze", ["--user", "verify", units + "/dld.service", units + "/dld.socket", units + "/dld-http.socket"],
            environment: ["XDG_RUNTIME_DIR": runtime, "MANPATH": prefix + "/share/man", "PATH": "/usr/bin:/bin", "HOME": daemon.root])
        #expect(verified.status == 0, "\(verified.stdout)\(verified.stderr)")
        #expect(verified.stdout.isEmpty && verified.stderr.isEmpty, "\(verified.stdout)\(verified.stderr)")
    }
}
