import DLCore
import Foundation
import Testing

private let sha256Hex = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"

/// The error of a parse that was expected to fail, or nil.
private func inputError(_ text: String) -> InputListError? {
    if case .failure(let error) = InputList.parse(text) { return error }
    return nil
}

@Suite struct InputListTests {
    /// URL lines become entries in order, each with the options indented below it.
    @Test func urlsWithOptions() throws {
        let text = """
            # my downloads
            https://example.com/a.iso
              out=a.iso
            \tdir=/srv/isos
              checksum=sha-256=\(sha256Hex)
              size=1048576

            http://example.com/b
            """
        let entries = try InputList.parse(text).get()
        #expect(
            entries == [
                InputEntry(
                    url: "https://example.com/a.iso", name: "a.iso", dir: "/srv/isos",
                    checksum: Checksum(algorithm: .sha256, hex: sha256Hex), size: 1_048_576, line: 2),
                InputEntry(url: "http://example.com/b", line: 8),
            ])
    }

    /// An empty file, or one of only comments and blank lines, gives no entries and no error.
    @Test func emptyAndCommentsOnly() throws {
        #expect(try InputList.parse("").get().isEmpty)
        #expect(try InputList.parse("\n  \n# a comment\n   # indented comment\n\t\n").get().isEmpty)
    }

    /// CRLF line endings and a UTF-8 BOM read the same as plain LF text, line numbers included.
    @Test func crlfAndBOM() throws {
        let text = "\u{FEFF}https://example.com/a\r\n  out=a.bin\r\n\r\nhttps://example.com/b\r\n"
        let entries = try InputList.parse(text).get()
        #expect(
            entries == [
                InputEntry(url: "https://example.com/a", name: "a.bin", line: 1),
                InputEntry(url: "https://example.com/b", line: 4),
            ])
        #expect(inputError("\u{FEFF}https://example.com/a\r\n\r\n  nope\r\n")?.line == 3)
    }

    /// Both checksum spellings are accepted: aria2's `ALGO=HEX` and dld's `ALGO:HEX`.
    @Test(arguments: ["sha-256=\(sha256Hex)", "sha256:\(sha256Hex)", "SHA-256=\(sha256Hex.uppercased())"])
    func checksumForms(_ value: String) throws {
        let entries = try InputList.parse("https://example.com/a\n  checksum=\(value)\n").get()
        #expect(entries.first?.checksum == Checksum(algorithm: .sha256, hex: sha256Hex))
    }

    /// Spaces around `=` and at the ends of lines are not part of keys, values or URLs.
    @Test func blanksAroundValues() throws {
        let entries = try InputList.parse("https://example.com/a  \n  out = my file.bin \t\n").get()
        #expect(entries == [InputEntry(url: "https://example.com/a", name: "my file.bin", line: 1)])
    }

    /// Each kind of bad line is an error naming its 1-based line number.
    @Test(arguments: [
        ("  out=a\nhttps://example.com/a", 1, "no URL line above"),
        ("https://example.com/a\n  colour=red", 2, "unknown option"),
        ("https://example.com/a\n  out", 2, "KEY=VALUE"),
        ("https://example.com/a\n  out=", 2, "empty value"),
        ("https://example.com/a\n  out=a\n  out=b", 3, "twice"),
        ("https://example.com/a\n\n  checksum=sha-256=abc", 3, "64 hex digits"),
        ("https://example.com/a\n  checksum=crc32=abcd", 2, "algorithm"),
        ("https://example.com/a\n  checksum=\(sha256Hex)", 2, "ALGO:HEX"),
        ("https://example.com/a\nftp://example.com/b", 2, "only http and https"),
        ("https://example.com/a\nnot a url", 2, "not a valid URL"),
        ("https://example.com/a\n  size=-1", 2, "whole number"),
        ("https://example.com/a\n  size=+5", 2, "whole number"),
        ("https://example.com/a\n  size=1e6", 2, "whole number"),
        ("https://example.com/a\n  size=99999999999999999999", 2, "whole number"),
    ])
    func badLines(_ text: String, _ line: Int, _ fragment: String) {
        let error = inputError(text)
        #expect(error?.line == line, "\(text)")
        #expect(error?.message.contains(fragment) == true, "\(error?.message ?? "no error")")
        #expect(error?.description.hasPrefix("line \(line): ") == true)
    }

    /// The first bad line is the one reported, and nothing is returned with it.
    @Test func firstErrorWins() {
        let text = "https://example.com/a\n  out=a\nfile:///etc/passwd\n  bogus=1\n"
        #expect(
            InputList.parse(text)
                == .failure(
                    InputListError(
                        line: 3, message: "only http and https URLs can be downloaded, not file:")))
    }

    /// Options after a comment or a blank line still belong to the URL above them.
    @Test func optionsAcrossCommentsAndBlanks() throws {
        let entries = try InputList.parse("https://example.com/a\n# note\n\n  size=0\n").get()
        #expect(entries == [InputEntry(url: "https://example.com/a", size: 0, line: 1)])
    }
}

@Suite struct NetrcTests {
    /// Machines, logins and passwords are read across any layout of whitespace and newlines.
    @Test func basicEntries() {
        let text = """
            machine example.com login alice password s3cret
            machine other.org
                login bob
                account ignored
                password "pass word"
            default login anon password guest
            """
        #expect(
            Netrc.parse(text) == [
                NetrcEntry(machine: "example.com", login: "alice", password: "s3cret"),
                NetrcEntry(machine: "other.org", login: "bob", password: "pass word"),
                NetrcEntry(machine: nil, login: "anon", password: "guest"),
            ])
    }

    /// Hosts match without case; `default` is used only when no machine matches.
    @Test func credentialsLookup() throws {
        let entries = Netrc.parse("default login anon password guest\nmachine Example.COM login a password p\n")
        let exact = try #require(Netrc.credentials(for: "example.com", in: entries))
        #expect(exact.login == "a" && exact.password == "p")
        let fqdn = try #require(Netrc.credentials(for: "EXAMPLE.com.", in: entries))
        #expect(fqdn.login == "a")
        let fallback = try #require(Netrc.credentials(for: "elsewhere.net", in: entries))
        #expect(fallback.login == "anon" && fallback.password == "guest")
        #expect(Netrc.credentials(for: "elsewhere.net", in: Netrc.parse("machine x login a password b")) == nil)
    }

    /// The first block for a host wins, and an incomplete one does not fall through to `default`.
    @Test func firstMatchAndIncompleteBlocks() throws {
        let entries = Netrc.parse(
            """
            machine h login first password one
            machine h login second password two
            machine k login only
            default login anon password guest
            """)
        #expect(try #require(Netrc.credentials(for: "h", in: entries)).login == "first")
        #expect(Netrc.credentials(for: "k", in: entries) == nil)
    }

    /// Comments run to the end of the line, but a `#` inside a token is part of it.
    @Test func comments() {
        let text = """
            # my hosts
            machine a login u password pa#ss # trailing comment
            #machine b login v password w
            machine c login "#x" password y
            """
        #expect(
            Netrc.parse(text) == [
                NetrcEntry(machine: "a", login: "u", password: "pa#ss"),
                NetrcEntry(machine: "c", login: "#x", password: "y"),
            ])
    }

    /// Quoted values keep spaces and take backslash escapes; a quoted keyword is a plain value.
    @Test func quoting() {
        let text = #"machine "h" login "a b" password "q\"u\\o\tt\ne" machine h2 login "machine" password x"#
        #expect(
            Netrc.parse(text) == [
                NetrcEntry(machine: "h", login: "a b", password: "q\"u\\o\tt\ne"),
                NetrcEntry(machine: "h2", login: "machine", password: "x"),
            ])
    }

    /// A macro body is skipped up to the first empty line, whatever words it holds.
    @Test func macdefSkipped() {
        let text = "machine a login u password p\nmacdef init\ncd /pub\nmachine evil login x password y\n\r\nmachine b login v password w\n"
        #expect(
            Netrc.parse(text) == [
                NetrcEntry(machine: "a", login: "u", password: "p"),
                NetrcEntry(machine: "b", login: "v", password: "w"),
            ])
    }

    /// What cannot be read is skipped, never fatal: a broken quote drops only its own block.
    @Test func brokenInput() {
        #expect(Netrc.parse("").isEmpty)
        #expect(Netrc.parse("login x password y").isEmpty)
        #expect(
            Netrc.parse("machine a login u password p\nmachine b login v password \"unterminated")
                == [NetrcEntry(machine: "a", login: "u", password: "p")])
        #expect(Netrc.parse("machine a login u password") == [])
        #expect(
            Netrc.parse("machine a login u password p frobnicate machine") == [
                NetrcEntry(machine: "a", login: "u", password: "p")
            ])
        #expect(
            Netrc.parse("machine a login u password p\nmacdef m\nno end") == [
                NetrcEntry(machine: "a", login: "u", password: "p")
            ])
    }
}

@Suite struct ContentDispositionTests {
    /// Plain `filename=` is read as a token or as a quoted-string with escapes.
    @Test(arguments: [
        ("attachment; filename=report.pdf", "report.pdf"),
        ("attachment; filename=\"my report.pdf\"", "my report.pdf"),
        (#"attachment; filename="a\"b\\c.txt""#, #"a"b\c.txt"#),
        ("attachment;filename=\"semi;colon.txt\";size=3", "semi;colon.txt"),
        ("inline; FILENAME = x.bin ", "x.bin"),
        ("attachment; filename=my file.zip", "my file.zip"),
        ("filename=bare.txt", "bare.txt"),
        ("attachment; foo; filename=after-junk.txt", "after-junk.txt"),
        ("attachment; filename=first.txt; filename=second.txt", "first.txt"),
        ("attachment; filename=\"%2e%2e%2fx\"", "%2e%2e%2fx"),
    ])
    func plainFilename(_ header: String, _ expected: String) {
        #expect(ContentDisposition.filename(header) == expected)
    }

    /// `filename*=` is percent-decoded in its charset and wins over `filename=`, wherever it is.
    @Test(arguments: [
        ("attachment; filename=\"fallback.txt\"; filename*=UTF-8''%E2%82%AC%20rates.txt", "€ rates.txt"),
        ("attachment; filename*=utf-8'en'caf%C3%A9.txt; filename=cafe.txt", "café.txt"),
        ("attachment; filename*=ISO-8859-1''caf%E9.txt", "café.txt"),
        ("attachment; filename*=\"UTF-8''quoted.txt\"", "quoted.txt"),
        ("attachment; filename*=UTF-8''%2e%2e%2fx", "../x"),
    ])
    func extendedFilename(_ header: String, _ expected: String) {
        #expect(ContentDisposition.filename(header) == expected)
    }

    /// A malformed `filename*` falls back to `filename`; with nothing usable the answer is nil.
    @Test(arguments: [
        ("attachment; filename*=UTF-8''%ZZ.txt; filename=ok.txt", "ok.txt"),
        ("attachment; filename*=UTF-8''%C3%28.txt; filename=ok.txt", "ok.txt"),
        ("attachment; filename*=KOI8-R''x; filename=ok.txt", "ok.txt"),
        ("attachment; filename*=no-quotes; filename=ok.txt", "ok.txt"),
    ])
    func malformedExtendedFallsBack(_ header: String, _ expected: String) {
        #expect(ContentDisposition.filename(header) == expected)
    }

    /// Headers without a usable name give nil.
    @Test(arguments: [
        "", "attachment", "inline; size=10", "attachment; filename=", "attachment; filename=\"\"",
        "attachment; filename=\"unterminated", "attachment; filename=\"ends in backslash\\",
        "attachment; filename*=UTF-8''%4", "attachment filename=x",
    ])
    func noName(_ header: String) {
        #expect(ContentDisposition.filename(header) == nil)
    }
}

@Suite struct HostileNameTests {
    /// The checks every name that reaches the disk must pass.
    static func expectSafe(_ name: String, _ comment: Comment? = nil) {
        #expect(!name.contains("/"), comment)
        #expect(!name.hasPrefix("."), comment)
        #expect(!name.isEmpty, comment)
        #expect(name.utf8.count <= FileNames.maxLength, comment)
        #expect(!name.unicodeScalars.contains { $0.value < 0x20 || $0.value == 0x7F }, comment)
    }

    static let long = String(repeating: "a", count: 10_000)
    static let longWide = String(repeating: "\u{E9}", count: 10_000)

    /// Hostile server names decode, then sanitize to one safe, non-empty file name.
    @Test(arguments: [
        "attachment; filename=\"../../.ssh/authorized_keys\"",
        "attachment; filename=/etc/passwd",
        "attachment; filename=..",
        "attachment; filename=.bashrc",
        "attachment; filename=\"...\"",
        "attachment; filename*=UTF-8''a%00b",
        "attachment; filename*=UTF-8''%00",
        "attachment; filename*=UTF-8''evil%0Aname%0D.txt",
        "attachment; filename*=UTF-8''%2e%2e%2fx",
        "attachment; filename*=UTF-8''..%2F..%2F.ssh%2Fauthorized_keys",
        "attachment; filename*=UTF-8''%2F",
        "attachment; filename*=UTF-8''%5C..%5Cwin.ini",
        "attachment; filename=\"\\..\\..\\x\"",
        "attachment; filename=\"%2e%2e%2f%2e%2e%2fx\"",
        "attachment; filename*=UTF-8''%E2%80%AEfdp.exe",
        "attachment; filename=\"\(long)\"",
        "attachment; filename=\"\(longWide)\"",
        "attachment; filename*=UTF-8''\(long)",
        "attachment; filename=\"   \"",
        "attachment; filename=\" .hidden\"",
    ])
    func hostileHeaders(_ header: String) {
        let name = FileNames.sanitize(ContentDisposition.filename(header) ?? FileNames.fallback)
        Self.expectSafe(name, "\(header.prefix(80)) → \(name.prefix(80))")
    }

    /// Known values come out as expected: separators replaced, leading dots gone.
    @Test func sanitizedExamples() {
        func through(_ header: String) -> String {
            FileNames.sanitize(ContentDisposition.filename(header) ?? FileNames.fallback)
        }
        #expect(through("attachment; filename=\"../../.ssh/authorized_keys\"") == "_.._.ssh_authorized_keys")
        #expect(through("attachment; filename=/etc/passwd") == "_etc_passwd")
        #expect(through("attachment; filename=..") == FileNames.fallback)
        #expect(through("attachment; filename=.bashrc") == "bashrc")
        #expect(through("attachment; filename*=UTF-8''%2e%2e%2fx") == "_x")
        #expect(through("attachment; filename*=UTF-8''a%00b%0Ac%0Dd") == "a_b_c_d")
        #expect(through("attachment; filename=\"\(Self.long)\"") == String(repeating: "a", count: FileNames.maxLength))
        #expect(through("attachment; filename=\"\(Self.longWide)\"").utf8.count == FileNames.maxLength)
    }

    /// Raw hostile names (not from a header) are made safe the same way.
    @Test(arguments: [
        "../../.ssh/authorized_keys", "/etc/passwd", "..", ".", ".bashrc", "", "\u{0}", "a\nb", "a\rb",
        "\u{202E}gpj.exe", "\(long)", "\u{1F600}" + String(repeating: "\u{301}", count: 300), "....//....//",
    ])
    func hostileRawNames(_ raw: String) {
        Self.expectSafe(FileNames.sanitize(raw), "\(raw.prefix(40).debugDescription)")
    }

    /// Bidi controls such as U+202E are replaced: they make `gpj.exe` display as `exe.jpg`.
    @Test(arguments: ["\u{202E}gpj.exe", "a\u{200F}b", "a\u{2066}b\u{2069}", "a\u{061C}b"])
    func bidiControlsRemoved(_ raw: String) {
        let name = FileNames.sanitize(raw)
        #expect(
            !name.unicodeScalars.contains {
                [
                    0x061C, 0x200E, 0x200F, 0x202A, 0x202B, 0x202C, 0x202D, 0x202E,
                    0x2066, 0x2067, 0x2068, 0x2069,
                ].contains($0.value)
            })
    }

    /// C1 controls (U+0080–U+009F, e.g. U+009B, a terminal's CSI) are replaced too.
    @Test func c1ControlsRemoved() {
        let name = FileNames.sanitize("a\u{9B}31mb\u{85}c")
        #expect(!name.unicodeScalars.contains { (0x80...0x9F).contains($0.value) })
    }

    /// A name of only dots and spaces becomes the fallback, not a name of spaces and dots.
    @Test(arguments: [". .", ".  .", ". . ."])
    func dotsAndSpaces(_ raw: String) {
        #expect(FileNames.sanitize(raw) == FileNames.fallback)
    }
}

@Suite struct PathPolicyTests {
    let homeRoot = PathPolicy(allowedRoots: ["/home/u"], home: "/home/u")
    let downloads = PathPolicy(allowedRoots: ["/home/u/Downloads", "/srv/data/"], home: "/home/u")

    /// Paths inside an allowed root may be written, at any depth.
    @Test(arguments: ["/home/u/Downloads/x", "/home/u/Downloads/a/b/c.iso", "/srv/data/x", "/home/u/Downloads/..x"])
    func allowed(_ path: String) {
        #expect(downloads.refusal(for: path) == nil)
    }

    /// Paths outside every root are refused, including prefix tricks and the root itself.
    @Test(arguments: [
        "/etc/passwd", "/home/u/Downloads2/x", "/home/u/Download", "/home/u/Downloads",
        "/home/u/x", "/srv/database/x", "/srv/data", "/",
    ])
    func outside(_ path: String) {
        #expect(downloads.refusal(for: path) != nil)
    }

    /// `$HOME` as a root does not open its hidden folders or hidden files.
    @Test(arguments: [
        "/home/u/.ssh/authorized_keys", "/home/u/.config/dld/x", "/home/u/.bashrc",
        "/home/u/.local/share/x",
    ])
    func hiddenUnderHome(_ path: String) {
        let reason = homeRoot.refusal(for: path)
        #expect(reason != nil)
        #expect(reason?.contains("hidden") == true, "\(reason ?? "")")
    }

    /// A root at or inside a hidden folder opens that folder, and only below the root.
    @Test func hiddenFolderListedAsRoot() {
        let policy = PathPolicy(allowedRoots: ["/home/u", "/home/u/.local/share"], home: "/home/u")
        #expect(policy.refusal(for: "/home/u/.local/share/x") == nil)
        #expect(policy.refusal(for: "/home/u/.local/share/dld/y.bin") == nil)
        #expect(policy.refusal(for: "/home/u/.local/bin/x") != nil)
        #expect(policy.refusal(for: "/home/u/.local/share2/x") != nil)
        #expect(policy.refusal(for: "/home/u/Videos/x") == nil)
        let whole = PathPolicy(allowedRoots: ["/home/u/.cache/"], home: "/home/u")
        #expect(whole.refusal(for: "/home/u/.cache/dld/x") == nil)
    }

    /// A root above home (like `/`) does not open home's hidden folders either.
    @Test func rootAboveHome() {
        let policy = PathPolicy(allowedRoots: ["/"], home: "/home/u")
        #expect(policy.refusal(for: "/etc/passwd") == nil)
        #expect(policy.refusal(for: "/home/u/.ssh/authorized_keys") != nil)
        #expect(policy.refusal(for: "/home/u/notes.txt") == nil)
        #expect(policy.refusal(for: "/home/v/.ssh/authorized_keys") == nil)
    }

    /// Relative and unnormalized paths are refused whatever the roots.
    @Test(arguments: [
        "x", "Downloads/x", "/home/u/Downloads/../.ssh/x", "/home/u/Downloads/./x",
        "/home/u/Downloads/..", "/home/u//Downloads/x", "/home/u/Downloads/x/", "",
        "/home/u/Downloads/a\u{0}b",
    ])
    func malformed(_ path: String) {
        #expect(PathPolicy(allowedRoots: ["/"], home: "/home/u").refusal(for: path) != nil)
    }

    /// No roots, or only unusable ones, allow nothing; without a home only the roots count.
    @Test func edgeRoots() {
        #expect(PathPolicy(allowedRoots: [], home: nil).refusal(for: "/tmp/x") != nil)
        #expect(PathPolicy(allowedRoots: ["tmp", "/tmp/../etc"], home: nil).refusal(for: "/etc/x") != nil)
        #expect(PathPolicy(allowedRoots: ["/home/u"], home: nil).refusal(for: "/home/u/.ssh/x") == nil)
    }
}

@Suite struct TOMLLiteEscapeTests {
    /// `\u` and `\U` take exactly 4 or 8 hex digits; a sign is not one (UInt32(_:radix:) took
    /// "\u-000" as U+0000 and "\u+041" as "A").
    @Test func unicodeEscapesAreHexDigitsOnly() throws {
        #expect(try TOMLLite.parse(#"a = "\u00e9\U0001F600""#).first?.value == .string("é😀"))
        for bad in [#"a = "\u-000""#, #"a = "\u+041""#, #"a = "\U+0001F60""#, #"a = "\u00g1""#] {
            #expect(throws: TOMLLite.ParseError.self, "\(bad)") { try TOMLLite.parse(bad) }
        }
    }
}
