import Foundation

/// Safe file names from untrusted text (URLs now, server headers later).
public enum FileNames {
    /// Used when nothing usable is left of a name.
    public static let fallback = "download"
    /// Bytes; most Linux filesystems allow 255, and ".part" must still fit.
    public static let maxLength = 200

    /// The last path segment of `url`, percent-decoded and sanitized; `fallback` if none.
    public static func fromURL(_ url: String) -> String {
        guard let components = URLComponents(string: url) else { return fallback }
        let path = components.percentEncodedPath
        let last = path.split(separator: "/", omittingEmptySubsequences: true).last.map(String.init) ?? ""
        let decoded = last.removingPercentEncoding ?? last
        return sanitize(decoded)
    }

    /// Bidirectional controls: `\u{202E}gpj.exe` shows as `exe.jpg`.
    static let bidiControls: Set<UInt32> = [0x061C, 0x200E, 0x200F, 0x202A, 0x202B, 0x202C, 0x202D, 0x202E, 0x2066, 0x2067, 0x2068, 0x2069]

    /// No separators, no control characters (C0, DEL, C1, bidi), no leading dots or spaces, no
    /// `.part` ending (that suffix is dld's own partial files), bounded length.
    public static func sanitize(_ raw: String) -> String {
        var scalars = String.UnicodeScalarView()
        for scalar in raw.unicodeScalars {
            let v = scalar.value
            if scalar == "/" || scalar == "\\" || v < 0x20 || (0x7F...0x9F).contains(v) || bidiControls.contains(v) {
                scalars.append("_")
            } else {
                scalars.append(scalar)
            }
        }
        var name = String(scalars)
        while let first = name.first, first == "." || first.isWhitespace { name.removeFirst() }
        while let last = name.last, last.isWhitespace { name.removeLast() }
        while name.utf8.count > maxLength { name.removeLast() }
        if name.lowercased().hasSuffix(".part") { name += "_" }
        return name.isEmpty ? fallback : name
    }
}

extension FileNames {
    /// `report.pdf` → `report (2).pdf`; `archive.tar.gz` → `archive (2).tar.gz`; `README` →
    /// `README (2)`. The style browsers use for a name that is taken.
    public static func numbered(_ name: String, _ n: Int) -> String {
        let lower = name.lowercased()
        var stem = name
        var ext = ""
        for double in [".tar.gz", ".tar.bz2", ".tar.xz", ".tar.zst"] where lower.hasSuffix(double) && lower.count > double.count {
            stem = String(name.dropLast(double.count))
            ext = String(name.suffix(double.count))
        }
        if ext.isEmpty, let dot = name.lastIndex(of: "."), dot != name.startIndex {
            stem = String(name[..<dot])
            ext = String(name[dot...])
        }
        return "\(stem) (\(n))\(ext)"
    }
}

/// What to do when the destination's name is taken.
public enum ExistingFilePolicy: String, Sendable, CaseIterable {
    /// Refuse with `destination_exists` (the default): nothing is touched.
    case error
    /// Use the first free `name (N).ext`.
    case rename
}

/// Checks on what a client asks to download.
public enum URLRules {
    public static let maxLength = 8192

    /// What the per-host limit counts: the lowercased host, with the port when one is given
    /// (`example.org`, `127.0.0.1:8080`). Empty when the URL has no host.
    public static func hostKey(_ url: String) -> String {
        guard let components = URLComponents(string: url) else { return "" }
        return hostKey(components)
    }

    private static func hostKey(_ components: URLComponents) -> String {
        guard let host = components.host else { return "" }
        return hostKey(host: host, port: components.port)
    }

    private static func hostKey(host: String, port: Int?) -> String {
        let host = host.lowercased()
        return port.map { "\(host):\($0)" } ?? host
    }

    /// `https://user:secret@host/x` → `https://user:***@host/x`, for anything shown or logged.
    public static func redacted(_ url: String) -> String {
        // No user info without an "@": most URLs are returned without being parsed.
        guard url.utf8.contains(UInt8(ascii: "@")) else { return url }
        guard var components = URLComponents(string: url), components.password != nil else { return url }
        components.password = "***"
        return components.string ?? url
    }

    /// The URL if it is an absolute http(s) URL with a host, else a message saying why not.
    public static func validate(_ text: String) -> Result<URL, DLError> {
        checked(text).map(\.url)
    }

    /// `validate`, and the URL's `hostKey` from the same parse (an enqueue of 5000 jobs
    /// parses each URL once).
    public static func checked(_ text: String) -> Result<(url: URL, host: String), DLError> {
        guard text.utf8.count <= maxLength else {
            return .failure(DLError(.invalidURL, "URL is longer than \(maxLength) bytes"))
        }
        guard let components = URLComponents(string: text), let scheme = components.scheme?.lowercased() else {
            return .failure(DLError(.invalidURL, "not a valid URL: \(text.prefix(200))"))
        }
        guard scheme == "http" || scheme == "https" else {
            return .failure(DLError(.invalidURL, "only http and https URLs can be downloaded, not \(scheme):"))
        }
        // The host is read once: each read of it decodes it again (IDNA).
        guard let host = components.host, !host.isEmpty, let url = components.url else {
            return .failure(DLError(.invalidURL, "URL has no host: \(text.prefix(200))"))
        }
        return .success((url, hostKey(host: host, port: components.port)))
    }
}
