import AsyncHTTPClient
import DLCore
import Foundation

/// A proxy server dld sends requests through. The tunnel itself (HTTP `CONNECT`, SOCKS5) is
/// spoken by AsyncHTTPClient; this is only where to find it and how to log in.
public struct ProxyServer: Sendable, Hashable, CustomStringConvertible {
    public enum Kind: String, Sendable, Hashable {
        /// An HTTP proxy, through `CONNECT` (for http URLs too: AsyncHTTPClient always tunnels).
        case http
        /// A SOCKS5 proxy. The host name is sent to the proxy, which resolves it (curl's
        /// `socks5h://`); AsyncHTTPClient has no way to resolve it here first.
        case socks5
    }

    public var kind: Kind
    public var host: String
    public var port: Int
    public var user: String?
    public var password: String?

    public init(kind: Kind, host: String, port: Int, user: String? = nil, password: String? = nil) {
        self.kind = kind
        self.host = host
        self.port = port
        self.user = user
        self.password = password
    }

    /// Reads a proxy URL as curl does: `[scheme://][user[:password]@]host[:port]`; no scheme
    /// means `http://`; the port defaults to 1080 (curl's default for every proxy scheme).
    /// `socks5://` and `socks5h://` are SOCKS5; `https://` (TLS to the proxy), `socks4://`
    /// and SOCKS5 with a password are refused with a message: AsyncHTTPClient speaks none of them.
    public static func parse(_ text: String) throws(ProxyError) -> ProxyServer {
        let trimmed = text.trimmingCharacters(in: .whitespaces)
        guard !trimmed.isEmpty else { throw ProxyError("the proxy URL is empty") }
        let withScheme = trimmed.contains("://") ? trimmed : "http://" + trimmed
        guard let components = URLComponents(string: withScheme), let scheme = components.scheme?.lowercased(),
            let host = components.host, !host.isEmpty
        else {
            throw ProxyError("\(ProxyServer.redacted(trimmed)) is not a proxy URL ([http:// or socks5://][user:password@]host[:port])")
        }
        let kind: Kind
        switch scheme {
        case "http": kind = .http
        case "socks5", "socks5h": kind = .socks5
        case "https":
            throw ProxyError(
                "\(ProxyServer.redacted(trimmed)): a proxy reached over TLS (https://) is not supported; use http:// or socks5://")
        case "socks4", "socks4a":
            throw ProxyError("\(ProxyServer.redacted(trimmed)): SOCKS4 is not supported; use socks5://")
        default:
            throw ProxyError("\(ProxyServer.redacted(trimmed)): unknown proxy scheme \(scheme); use http:// or socks5://")
        }
        guard components.path.isEmpty || components.path == "/" else {
            throw ProxyError("\(ProxyServer.redacted(trimmed)): a proxy URL has no path")
        }
        let port = components.port ?? 1080
        guard (1...65535).contains(port) else { throw ProxyError("\(ProxyServer.redacted(trimmed)): the port must be from 1 to 65535") }
        let user = components.percentEncodedUser.flatMap { $0.removingPercentEncoding }
        let password = components.percentEncodedPassword.flatMap { $0.removingPercentEncoding }
        if kind == .socks5, user != nil || password != nil {
            throw ProxyError(
                "\(ProxyServer.redacted(trimmed)): SOCKS5 with a user name and password is not supported (AsyncHTTPClient does not speak it); use a SOCKS5 proxy without login, or an HTTP proxy"
            )
        }
        // URLComponents keeps an IPv6 host in brackets.
        let bare = host.hasPrefix("[") && host.hasSuffix("]") ? String(host.dropFirst().dropLast()) : host
        return ProxyServer(kind: kind, host: bare, port: port, user: user, password: password)
    }

    /// `http://user:***@host:port`: what logs and `--print-config` show.
    public var description: String {
        let login =
            user.map { ($0.addingPercentEncoding(withAllowedCharacters: .urlUserAllowed) ?? $0) + (password == nil ? "" : ":***") + "@" }
            ?? ""
        let shownHost = host.contains(":") ? "[\(host)]" : host
        return "\(kind.rawValue)://\(login)\(shownHost):\(port)"
    }

    /// `host:port`, for messages.
    var address: String { (host.contains(":") ? "[\(host)]" : host) + ":\(port)" }

    /// A proxy URL with its password replaced by `***` (also one that does not parse).
    public static func redacted(_ text: String) -> String {
        let withScheme = text.contains("://") ? text : "http://" + text
        guard let at = withScheme.lastIndex(of: "@"), let schemeEnd = withScheme.range(of: "://") else { return text }
        let userInfo = withScheme[schemeEnd.upperBound..<at]
        guard let colon = userInfo.firstIndex(of: ":") else { return text }
        let shown = withScheme[..<colon] + ":***" + withScheme[at...]
        return text.contains("://") ? String(shown) : String(shown.dropFirst("http://".count))
    }

    /// AsyncHTTPClient's form of it.
    var clientProxy: HTTPClient.Configuration.Proxy {
        switch kind {
        case .socks5:
            return .socksServer(host: host, port: port)
        case .http:
            let authorization = user.map { HTTPClient.Authorization.basic(username: $0, password: password ?? "") }
            return .server(host: host, port: port, authorization: authorization)
        }
    }
}

public struct ProxyError: Error, CustomStringConvertible, Sendable {
    public let description: String
    init(_ description: String) { self.description = description }
}

/// Which proxy each URL goes through: curl's rules. A proxy for the URL's scheme
/// (`http_proxy` for http, `https_proxy` for https), else `all_proxy`; none for a host that
/// `no_proxy` names. The config's `proxy` replaces the environment's variables for every
/// scheme, and its `no_proxy` replaces the environment's.
public struct ProxyRules: Sendable, Hashable {
    public var http: ProxyServer?
    public var https: ProxyServer?
    public var all: ProxyServer?
    public var noProxy: NoProxy

    public init(http: ProxyServer? = nil, https: ProxyServer? = nil, all: ProxyServer? = nil, noProxy: NoProxy = NoProxy("")) {
        self.http = http
        self.https = https
        self.all = all
        self.noProxy = noProxy
    }

    public var isEmpty: Bool { http == nil && https == nil && all == nil }

    /// Where the rules came from, for the log and `--print-config`.
    public enum Source: Sendable, Hashable {
        case none
        case environment
        case config
    }

    /// The rules for dld: the config's `proxy` (`""` turns proxies off, whatever the
    /// environment says) and `no_proxy` if set, else the environment's variables. As curl:
    /// `http_proxy` is read in lower case only (an upper-case `HTTP_PROXY` can be set by a CGI
    /// request's `Proxy:` header, "httpoxy"); the others in lower case first, then upper case.
    /// A variable that does not parse is left out and reported in `ignored`.
    public static func resolve(
        configProxy: String?, configNoProxy: String?, environment: [String: String]
    ) throws(ProxyError) -> (rules: ProxyRules, source: Source, ignored: [String]) {
        func variable(_ name: String, upperToo: Bool = true) -> (name: String, value: String)? {
            if let value = environment[name], !value.isEmpty { return (name, value) }
            if upperToo, let value = environment[name.uppercased()], !value.isEmpty { return (name.uppercased(), value) }
            return nil
        }
        let noProxyText = configNoProxy ?? variable("no_proxy")?.value ?? ""
        if let configProxy {
            var rules = ProxyRules(noProxy: NoProxy(noProxyText))
            if configProxy.isEmpty { return (rules, .none, []) }
            rules.all = try ProxyServer.parse(configProxy)
            return (rules, .config, [])
        }
        var rules = ProxyRules(noProxy: NoProxy(noProxyText))
        var ignored: [String] = []
        func read(_ name: String, upperToo: Bool = true) -> ProxyServer? {
            guard let found = variable(name, upperToo: upperToo) else { return nil }
            do {
                return try ProxyServer.parse(found.value)
            } catch {
                ignored.append("\(found.name): \(error.description)")
                return nil
            }
        }
        rules.http = read("http_proxy", upperToo: false)
        rules.https = read("https_proxy")
        rules.all = read("all_proxy")
        return (rules, rules.isEmpty ? .none : .environment, ignored)
    }

    /// The proxy for this URL, or nil to connect directly.
    public func proxy(for url: URL) -> ProxyServer? {
        guard !isEmpty, let host = url.host, !noProxy.matches(host: host) else { return nil }
        switch url.scheme?.lowercased() {
        case "http": return http ?? all
        case "https": return https ?? all
        default: return all
        }
    }

    /// One line per proxy in force, for the log and `--print-config` (passwords as `***`).
    public var summary: [String] {
        var lines: [String] = []
        if let http { lines.append("http URLs through \(http)") }
        if let https { lines.append("https URLs through \(https)") }
        if let all { lines.append("\(http == nil && https == nil ? "all" : "other") URLs through \(all)") }
        if !isEmpty && !noProxy.entries.isEmpty { lines.append("not for \(noProxy.entries.joined(separator: ","))") }
        return lines
    }
}

/// `no_proxy` as curl reads it: names separated by commas (or spaces); `*` alone matches every
/// host; a name matches itself and its subdomains (a leading dot is ignored); an IP address
/// matches itself, and `ADDRESS/BITS` a range (IPv4 or IPv6). Case does not matter; ports are
/// not looked at.
public struct NoProxy: Sendable, Hashable {
    public let entries: [String]

    public init(_ text: String) {
        entries = text.split(whereSeparator: { $0 == "," || $0 == " " || $0 == "\t" }).map { $0.lowercased() }.filter { !$0.isEmpty }
    }

    public func matches(host rawHost: String) -> Bool {
        var host = rawHost.lowercased()
        if host.hasPrefix("["), host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        if host.hasSuffix(".") { host.removeLast() }
        let hostAddress = ipAddressBytes(host)
        for entry in entries {
            if entry == "*" { return true }
            var pattern = entry
            if pattern.hasPrefix("["), let close = pattern.firstIndex(of: "]") {
                pattern = String(pattern[pattern.index(after: pattern.startIndex)..<close]) + pattern[pattern.index(after: close)...]
            }
            if let hostAddress {
                let parts = pattern.split(separator: "/", maxSplits: 1)
                guard let first = parts.first, let network = ipAddressBytes(String(first)), network.count == hostAddress.count else {
                    continue
                }
                let bits = parts.count == 2 ? Int(parts[1]) ?? -1 : network.count * 8
                if (0...network.count * 8).contains(bits), Self.samePrefix(hostAddress, network, bits: bits) { return true }
                continue
            }
            if pattern.hasPrefix(".") { pattern.removeFirst() }
            if pattern.hasSuffix(".") { pattern.removeLast() }
            if pattern.isEmpty { continue }
            if host == pattern || host.hasSuffix("." + pattern) { return true }
        }
        return false
    }

    private static func samePrefix(_ a: [UInt8], _ b: [UInt8], bits: Int) -> Bool {
        var left = bits
        for (x, y) in zip(a, b) where left > 0 {
            let take = min(8, left)
            let mask = UInt8(truncatingIfNeeded: 0xFF << (8 - take))
            if x & mask != y & mask { return false }
            left -= take
        }
        return true
    }
}

/// The bytes of an IPv4 or IPv6 address written as text, or nil for a host name.
private func ipAddressBytes(_ text: String) -> [UInt8]? {
    var v4 = in_addr()
    if inet_pton(AF_INET, text, &v4) == 1 { return withUnsafeBytes(of: &v4) { Array($0) } }
    var v6 = in6_addr()
    if inet_pton(AF_INET6, text, &v6) == 1 { return withUnsafeBytes(of: &v6) { Array($0) } }
    return nil
}
