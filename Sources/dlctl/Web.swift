import ArgumentParser
import Foundation

/// `dlctl web`: the login URL of dld's HTTP listener, from the files dld writes in its state
/// folder (`http-url`, `http-token`), opened in a browser when there is a display; with
/// `--extension`, what the browser extension's options page needs instead.
struct Web: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print the login URL of dld's HTTP listener (and open it in a browser).",
        discussion:
            "Reads <state_dir>/http-url and <state_dir>/http-token, which dld writes when it serves HTTP (http_listen). The URL holds the token: whoever has it controls dld. With $DISPLAY or $WAYLAND_DISPLAY set, xdg-open opens it unless --no-open is given. With --extension: the address and the token to paste into the options page of dld's browser extension (extension/, docs/extension.md), and the http_origins line that lets it call dld."
    )
    @Option(name: .customLong("state-dir"), help: "dld's state folder (default: $XDG_STATE_HOME/dld, else ~/.local/state/dld).")
    var stateDir: String?
    @Flag(name: .customLong("no-open"), help: "Only print the URL.") var noOpen = false
    @Flag(
        name: .customLong("extension"),
        help: "Print the address and token for the browser extension's options page, and the http_origins line (opens nothing).")
    var forExtension = false

    /// The Chromium ID of extension/ loaded unpacked: fixed by the `key` of its manifest.json
    /// (the first 32 hex digits of the key's SHA-256, written with a…p).
    static let extensionID = "camfkgjdhnjdalmdbpfcfadjilekeabo"

    func run() throws {
        let environment = ProcessInfo.processInfo.environment
        let folder = stateDir.map(absolute) ?? Self.defaultStateDir(environment)
        guard let url = Self.read(folder + "/http-url") else {
            printError(
                "dld is not serving HTTP: no \(folder)/http-url (is dld running, with http_listen not \"\"? --state-dir if not the default)"
            )
            throw ExitCode(69)
        }
        guard let token = Self.read(folder + "/http-token") else {
            printError("cannot read \(folder)/http-token")
            throw ExitCode(1)
        }
        if forExtension {
            print(Self.extensionText(url: url, token: token))
            return
        }
        let login = (url.hasSuffix("/") ? url : url + "/") + "login?token=" + token
        print(login)
        let display = [environment["DISPLAY"], environment["WAYLAND_DISPLAY"]].contains { !($0 ?? "").isEmpty }
        guard display, !noOpen else { return }
        let opener = Process()
        opener.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        opener.arguments = ["xdg-open", login]
        do {
            try opener.run()
        } catch {
            printError("could not run xdg-open: \(error.localizedDescription)")
        }
    }

    /// What `--extension` prints: the address as the options page takes it (no slash at the
    /// end), the token, and the origin to allow.
    static func extensionText(url: String, token: String) -> String {
        let address = url.hasSuffix("/") ? String(url.dropLast()) : url
        return """
            In the options page of dld's browser extension (docs/extension.md):
              Address: \(address)
              Token:   \(token)
            In dld's config file (~/.config/dld/config.toml), then restart dld:
              http_origins = ["chrome-extension://\(extensionID)"]
            (Firefox: add the moz-extension://… origin that the options page shows to that list.)
            """
    }

    static func defaultStateDir(_ environment: [String: String]) -> String {
        if let state = environment["XDG_STATE_HOME"], state.hasPrefix("/") { return state + "/dld" }
        let home = environment["HOME"].flatMap { $0.hasPrefix("/") ? $0 : nil } ?? NSHomeDirectory()
        return home + "/.local/state/dld"
    }

    private static func read(_ path: String) -> String? {
        (try? String(contentsOfFile: path, encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines)
    }
}
