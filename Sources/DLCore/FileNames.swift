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

    /// No separators, no control characters, no leading dots, bounded length.
    public static func sanitize(_ raw: String) -> String {
        var scalars = String.UnicodeScalarView()
        for scalar in raw.unicodeScalars {
            if scalar == "/" || scalar == "\\" || scalar.value < 0x20 || scalar.value == 0x7F {
                scalars.append("_")
            } else {
                scalars.append(scalar)
            }
        }
        var name = String(scalars).trimmingCharacters(in: .whitespaces)
        while name.hasPrefix(".") { name.removeFirst() }
        while name.utf8.count > maxLength { name.removeLast() }
        return name.isEmpty ? fallback : name
    }
}

/// Checks on what a client asks to download.
public enum URLRules {
    public static let maxLength = 8192

    /// The URL if it is an absolute http(s) URL with a host, else a message saying why not.
    public static func validate(_ text: String) -> Result<URL, DLError> {
        guard text.utf8.count <= maxLength else {
            return .failure(DLError(.invalidURL, "URL is longer than \(maxLength) bytes"))
        }
        guard let components = URLComponents(string: text), let scheme = components.scheme?.lowercased() else {
            return .failure(DLError(.invalidURL, "not a valid URL: \(text.prefix(200))"))
        }
        guard scheme == "http" || scheme == "https" else {
            return .failure(DLError(.invalidURL, "only http and https URLs can be downloaded, not \(scheme):"))
        }
        guard let host = components.host, !host.isEmpty, let url = components.url else {
            return .failure(DLError(.invalidURL, "URL has no host: \(text.prefix(200))"))
        }
        return .success(url)
    }
}
