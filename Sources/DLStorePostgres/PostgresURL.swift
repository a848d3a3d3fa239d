import Foundation
import NIOSSL
import PostgresNIO

/// A PostgreSQL connection string, in libpq's URL form:
/// `postgresql://[user[:password]@][host][:port][/database][?param=value&...]`.
///
/// Parameters understood: `host` (a folder, for a Unix socket: `?host=/run/postgresql`),
/// `port`, `user`, `password`, `dbname`, `sslmode` (`disable`, `prefer`, `require`; `require`
/// verifies the server's certificate). The password is never shown: print `redacted`.
public struct PostgresURL: Sendable, Equatable {
    public enum TLSMode: String, Sendable {
        case disable, prefer, require
    }

    public var user: String
    public var password: String?
    /// A TCP host name or address; nil with a Unix socket.
    public var host: String?
    /// The folder of the server's Unix socket (libpq's `host=/folder`); nil over TCP.
    public var socketFolder: String?
    public var port: Int
    public var database: String?
    public var tls: TLSMode

    /// The socket file in `socketFolder`, named after the port as the server names it.
    public var socketPath: String? { socketFolder.map { $0 + "/.s.PGSQL.\(port)" } }

    /// Parses a connection string. `defaultUser` is who connects when the string names no
    /// one (libpq's default is the login name).
    public static func parse(_ text: String, defaultUser: String) throws(PostgresURLError) -> PostgresURL {
        let lower = text.lowercased()
        guard lower.hasPrefix("postgresql://") || lower.hasPrefix("postgres://"),
            let components = URLComponents(string: text)
        else {
            throw PostgresURLError("not a PostgreSQL URL (postgresql://user@host/database): \(redacted(text))")
        }
        var query: [String: String] = [:]
        for item in components.queryItems ?? [] {
            guard let value = item.value else { throw PostgresURLError("parameter \(item.name) has no value in \(redacted(text))") }
            query[item.name] = value
        }
        let known: Set<String> = ["host", "port", "user", "password", "dbname", "sslmode"]
        if let unknown = query.keys.sorted().first(where: { !known.contains($0) }) {
            throw PostgresURLError("unknown parameter \(unknown) in \(redacted(text)); known: \(known.sorted().joined(separator: ", "))")
        }
        var url = PostgresURL(
            user: query["user"] ?? components.user ?? defaultUser,
            password: query["password"] ?? components.password,
            host: nil, socketFolder: nil, port: 5432, database: nil, tls: .prefer)
        if let portText = query["port"] ?? components.port.map(String.init) {
            guard let port = Int(portText), (1...65535).contains(port) else {
                throw PostgresURLError("invalid port \(portText) in \(redacted(text))")
            }
            url.port = port
        }
        let host = query["host"] ?? components.host.flatMap { $0.isEmpty ? nil : $0 }
        if let host, host.hasPrefix("/") {
            url.socketFolder = host
            url.tls = .disable
        } else {
            url.host = host ?? "localhost"
        }
        let path = components.path.hasPrefix("/") ? String(components.path.dropFirst()) : components.path
        url.database = query["dbname"] ?? (path.isEmpty ? nil : path)
        if let mode = query["sslmode"] {
            guard let tls = TLSMode(rawValue: mode) else {
                throw PostgresURLError("sslmode must be disable, prefer or require, not \(mode)")
            }
            url.tls = tls
        }
        if url.socketFolder != nil, url.tls == .require {
            throw PostgresURLError("sslmode=require needs a TCP host, not a Unix socket")
        }
        return url
    }

    /// The postgres-nio client configuration for this URL.
    public var configuration: PostgresClient.Configuration {
        if let socketPath {
            return PostgresClient.Configuration(unixSocketPath: socketPath, username: user, password: password, database: database)
        }
        let tls: PostgresClient.Configuration.TLS
        switch self.tls {
        case .disable: tls = .disable
        case .prefer: tls = .prefer(.makeClientConfiguration())
        case .require: tls = .require(.makeClientConfiguration())
        }
        return PostgresClient.Configuration(
            host: host ?? "localhost", port: port, username: user, password: password, database: database, tls: tls)
    }

    /// The same, for one connection outside the pool. Throws when the TLS context cannot be
    /// made (no system trust store).
    public func connectionConfiguration() throws -> PostgresConnection.Configuration {
        if let socketPath {
            return PostgresConnection.Configuration(unixSocketPath: socketPath, username: user, password: password, database: database)
        }
        let tls: PostgresConnection.Configuration.TLS
        switch self.tls {
        case .disable: tls = .disable
        case .prefer: tls = .prefer(try NIOSSLContext(configuration: .makeClientConfiguration()))
        case .require: tls = .require(try NIOSSLContext(configuration: .makeClientConfiguration()))
        }
        return PostgresConnection.Configuration(
            host: host ?? "localhost", port: port, username: user, password: password, database: database, tls: tls)
    }

    /// The connection string with its password replaced by `***`, for logs, errors and status:
    /// `postgresql://user:secret@host/db` → `postgresql://user:***@host/db`, and the same for a
    /// `password=` parameter (also in libpq's `key=value` form). Works on text that does not
    /// parse, which is when it is most often printed.
    public static func redacted(_ text: String) -> String {
        var result = text
        if let scheme = result.range(of: "://") {
            let authorityEnd = result[scheme.upperBound...].firstIndex(where: { $0 == "/" || $0 == "?" || $0 == "#" }) ?? result.endIndex
            // The last "@" ends the user info: a password may hold an unescaped "@".
            if let at = result[scheme.upperBound..<authorityEnd].lastIndex(of: "@"),
                let colon = result[scheme.upperBound..<at].firstIndex(of: ":")
            {
                result.replaceSubrange(result.index(after: colon)..<at, with: "***")
            }
        }
        var output = ""
        var rest = Substring(result)
        while let found = rest.range(of: "password=", options: .caseInsensitive) {
            let before = found.lowerBound == rest.startIndex ? nil : rest[rest.index(before: found.lowerBound)]
            output += rest[..<found.upperBound]
            rest = rest[found.upperBound...]
            // Only a parameter of its own (`?password=`, `&password=`, ` password=`), not a
            // name that ends in "password".
            guard before == nil || before == "?" || before == "&" || before == " " || before == "\t" else { continue }
            let end = rest.firstIndex(where: { $0 == "&" || $0 == "#" || $0 == " " || $0 == "\t" }) ?? rest.endIndex
            output += "***"
            rest = rest[end...]
        }
        return output + rest
    }
}

public struct PostgresURLError: Error, Sendable, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}
