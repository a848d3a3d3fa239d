import Foundation

/// The rules every job error message and every command error message follows (issue 13):
/// words for a person, never a Swift type name, a library's error dump or a path of the build.
public enum MessageRules {
    /// What must never appear in a message.
    public static let forbidden = [
        "NIOSSL", "BoringSSL", "OPENSSL_internal", "SocketAddressError", "NIOConnectionError", "HTTPClientError",
        "IOError", "ChannelError", "DatabaseError", "PSQLError", ".build/", ".swift", "Error Domain=", "error:1", "Optional(",
    ]

    /// The problems of `message`: empty, a forbidden text, or a name it should hold missing.
    public static func problems(_ message: String, mustName names: [String]) -> [String] {
        var problems: [String] = []
        if message.trimmingCharacters(in: .whitespaces).isEmpty { problems.append("empty message") }
        for text in forbidden where message.contains(text) { problems.append("holds \"\(text)\"") }
        for name in names where !message.contains(name) { problems.append("does not name \(name)") }
        return problems
    }
}
