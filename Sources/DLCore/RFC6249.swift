import Foundation

/// What a server says of other copies of a file and of its digest, in the headers of its
/// answer: RFC 6249 (Metalink/HTTP) `Link: <URL>; rel=duplicate` for mirrors, and RFC 3230
/// `Digest: SHA-256=<base64>` for the instance's digest. Pure parsing; the transfer notes them
/// and the engine records them on the job.
public enum RFC6249 {
    /// The URLs of every `rel=duplicate` link in these `Link` header values (a value may hold
    /// several links, comma separated; `rel` may be a quoted list). Other relations (`describedby`
    /// for a Metalink, `alternate`) and links that are not absolute http(s) URLs are left.
    public static func duplicates(_ values: [String]) -> [String] {
        var urls: [String] = []
        for value in values {
            var rest = Substring(value)
            while let open = rest.firstIndex(of: "<") {
                guard let close = rest[open...].firstIndex(of: ">") else { break }
                let url = String(rest[rest.index(after: open)..<close]).trimmingCharacters(in: .whitespaces)
                // The parameters run to the next link (a comma outside quotes, then `<`).
                var params = Substring(rest[rest.index(after: close)...])
                var end = params.endIndex
                var quoted = false
                for index in params.indices {
                    let c = params[index]
                    if c == "\"" { quoted.toggle() }
                    if c == ",", !quoted, params[params.index(after: index)...].drop(while: { $0 == " " }).first == "<" {
                        end = index
                        break
                    }
                }
                params = params[..<end]
                rest = end == rest.endIndex ? rest[rest.endIndex...] : rest[rest.index(after: end)...]
                let relations = parameter("rel", in: params)?.lowercased().split(separator: " ") ?? []
                guard relations.contains("duplicate"), case .success = URLRules.checked(url) else { continue }
                urls.append(url)
            }
        }
        return urls
    }

    /// `name=value` or `name="value"` among `; `-separated link parameters.
    static func parameter(_ name: String, in params: Substring) -> String? {
        for part in params.split(separator: ";") {
            let pair = part.split(separator: "=", maxSplits: 1).map { $0.trimmingCharacters(in: .whitespaces) }
            guard pair.count == 2, pair[0].lowercased() == name else { continue }
            return pair[1].trimmingCharacters(in: CharacterSet(charactersIn: "\""))
        }
        return nil
    }

    /// The SHA-256 of an RFC 3230 `Digest` header value (`SHA-256=<base64>`, among others
    /// comma separated); nil when it names none, or a malformed one.
    public static func sha256(digest value: String?) -> Checksum? {
        guard let value else { return nil }
        for part in value.split(separator: ",") {
            let pair = part.split(separator: "=", maxSplits: 1)
            guard pair.count == 2, pair[0].trimmingCharacters(in: .whitespaces).lowercased() == "sha-256" else { continue }
            guard let bytes = Data(base64Encoded: pair[1].trimmingCharacters(in: .whitespaces)), bytes.count == 32 else { return nil }
            return Checksum(algorithm: .sha256, hex: Hex.encode(bytes))
        }
        return nil
    }

    /// `found` added to a job's mirrors: each checked as `mirrors` are, none twice nor the
    /// job's own URL, at most `limit` mirrors in all.
    public static func merged(_ mirrors: [JobMirror], url: String, found: [String], limit: Int = 16) -> [JobMirror] {
        var merged = mirrors
        var seen = Set([url] + mirrors.map(\.url))
        for candidate in found where merged.count < limit && seen.insert(candidate).inserted {
            guard case .success = URLRules.checked(candidate) else { continue }
            merged.append(JobMirror(url: candidate))
        }
        return merged
    }
}
