import AsyncHTTPClient
import DLCore
import Foundation
import NIOCore
import NIOPosix
import NIOSOCKS
import NIOSSL

/// The server an attempt was talking to when it failed, for messages that name it.
struct Target: Sendable, Equatable {
    var host: String
    var port: Int
    var isHTTPS: Bool

    init(host: String, port: Int, isHTTPS: Bool) {
        self.host = host
        self.port = port
        self.isHTTPS = isHTTPS
    }

    init?(url: String) {
        guard let parsed = URL(string: url) else { return nil }
        self.init(parsed: parsed)
    }

    init?(parsed: URL) {
        guard let host = parsed.host, !host.isEmpty else { return nil }
        let https = parsed.scheme?.lowercased() == "https"
        self.init(host: host, port: parsed.port ?? (https ? 443 : 80), isHTTPS: https)
    }

    /// `host:port` as people write it (an IPv6 address in brackets).
    var address: String { (host.contains(":") ? "[\(host)]" : host) + ":\(port)" }
}

/// Turns the errors of the HTTP client, NIO and NIOSSL into job errors with stable codes and
/// messages for people: what happened, with which server, and what can be done. A library's
/// own text (type names, BoringSSL's error stack, build paths) never goes into a message; the
/// caller logs it at debug level.
extension Downloader {
    /// Errors that are not ours: from the HTTP client or the network.
    static func classify(_ error: any Error, target: Target, timeouts: DownloaderConfiguration = DownloaderConfiguration())
        -> TransferFailure
    {
        let host = target.host
        if let clientError = error as? HTTPClientError {
            switch clientError {
            case .connectTimeout:
                return TransferFailure(
                    .transient(.network), .timeout, "could not connect to \(target.address) within \(seconds(timeouts.connectTimeout)) s")
            case .tlsHandshakeTimeout:
                return TransferFailure(.transient(.network), .timeout, "the TLS handshake with \(host) did not finish in time")
            case .readTimeout:
                return TransferFailure(.transient(.network), .timeout, "\(host) sent nothing for \(seconds(timeouts.readTimeout)) s")
            case .deadlineExceeded:
                return TransferFailure(.transient(.network), .timeout, "\(host) did not answer within \(seconds(timeouts.headTimeout)) s")
            case .remoteConnectionClosed:
                return TransferFailure(.transient(.network), .connectionClosed, "\(host) closed the connection")
            case .uncleanShutdown:
                return TransferFailure(.transient(.network), .connectionClosed, "\(host) closed the TLS connection without warning")
            case .invalidURL, .emptyHost, .emptyScheme:
                return TransferFailure(.permanent, .invalidURL, "the URL for \(host) cannot be requested; check it")
            default:
                return TransferFailure(
                    .transient(.network), .networkError, "a network error with \(host) (run dld with log_level = \"debug\" for the details)"
                )
            }
        }
        if let connection = error as? NIOConnectionError {
            if connection.connectionErrors.isEmpty, let dns = connection.dnsAError ?? connection.dnsAAAAError {
                return dnsFailure(dns, host: host)
            }
            // Several addresses (IPv4 and IPv6) may have been tried: a refusal on any of them
            // says that the machine answers but nothing listens.
            let errors = connection.connectionErrors.map(\.error)
            if errors.contains(where: { ($0 as? IOError)?.errnoCode == ECONNREFUSED }) {
                return refused(target)
            }
            if let first = errors.first { return classify(first, target: target, timeouts: timeouts) }
            return TransferFailure(.transient(.network), .networkError, "could not connect to \(target.address)")
        }
        if let unknown = error as? SocketAddressError.UnknownHost {
            return dnsFailure(unknown, host: host)
        }
        if let io = error as? IOError {
            switch io.errnoCode {
            case ECONNREFUSED: return refused(target)
            case ECONNRESET, EPIPE: return TransferFailure(.transient(.network), .connectionClosed, "\(host) reset the connection")
            case ETIMEDOUT: return TransferFailure(.transient(.network), .timeout, "the connection to \(target.address) timed out")
            default:
                return TransferFailure(
                    .transient(.network), .networkError, "could not talk to \(target.address): \(String(cString: strerror(io.errnoCode)))")
            }
        }
        if let channelError = error as? ChannelError {
            switch channelError {
            case .connectTimeout:
                return TransferFailure(
                    .transient(.network), .timeout, "could not connect to \(target.address) within \(seconds(timeouts.connectTimeout)) s")
            case .eof, .ioOnClosedChannel, .alreadyClosed, .outputClosed:
                return TransferFailure(.transient(.network), .connectionClosed, "\(host) closed the connection")
            default:
                break
            }
        }
        if let tls = tlsFailure(error, target: target) { return tls }
        return TransferFailure(
            .transient(.network), .networkError, "a network error with \(host) (run dld with log_level = \"debug\" for the details)")
    }

    /// A failure of the proxy rather than of the server: the proxy could not be reached, wants
    /// credentials, or could not open the tunnel to the server. Nil for other errors (those of
    /// the server, seen through the tunnel, are classified as without a proxy).
    static func proxyFailure(
        _ error: any Error, proxy: ProxyServer, target: Target,
        timeouts: DownloaderConfiguration = DownloaderConfiguration()
    ) -> TransferFailure? {
        let via = "the \(proxy.kind == .socks5 ? "SOCKS5" : "HTTP") proxy \(proxy.address)"
        func unreachable(_ why: String) -> TransferFailure {
            TransferFailure(
                .transient(.network), .proxyError,
                "could not reach \(via): \(why); check the proxy setting (or http_proxy, https_proxy, all_proxy)")
        }
        if let clientError = error as? HTTPClientError {
            switch clientError {
            case .proxyAuthenticationRequired:
                return TransferFailure(
                    .permanent, .proxyAuth,
                    "\(via) wants a user name and password, or refused the ones given (user:password@ in the proxy URL)")
            case .invalidProxyResponse:
                return TransferFailure(
                    .transient(.network), .proxyError,
                    "\(via) did not open a tunnel to \(target.address) (it may be unable to reach it, or not allow it)")
            case .httpProxyHandshakeTimeout, .socksHandshakeTimeout:
                return TransferFailure(.transient(.network), .proxyError, "\(via) did not answer in time")
            case .connectTimeout:
                return unreachable("no connection within \(seconds(timeouts.connectTimeout)) s")
            default:
                return nil
            }
        }
        if let socks = error as? SOCKSError.ConnectionFailed {
            return TransferFailure(
                .transient(.network), .proxyError,
                "\(via) could not connect to \(target.address) (SOCKS reply \(socks.reply.value))")
        }
        if error is SOCKSError.NoValidAuthenticationMethod {
            return TransferFailure(
                .permanent, .proxyAuth, "\(via) wants a login, which dld cannot give a SOCKS5 proxy; use one without login")
        }
        // Connecting is the proxy's part: every connection goes to it, never to the server.
        if let connection = error as? NIOConnectionError {
            if connection.connectionErrors.isEmpty, (connection.dnsAError ?? connection.dnsAAAAError) != nil {
                return unreachable("its host name does not resolve")
            }
            if connection.connectionErrors.contains(where: { ($0.error as? IOError)?.errnoCode == ECONNREFUSED }) {
                return unreachable("nothing listens there")
            }
            return unreachable("the connection failed")
        }
        if error is SocketAddressError.UnknownHost { return unreachable("its host name does not resolve") }
        if let io = error as? IOError, io.errnoCode == ECONNREFUSED { return unreachable("nothing listens there") }
        return nil
    }

    private static func seconds(_ amount: TimeAmount) -> Int64 { amount.nanoseconds / 1_000_000_000 }

    private static func refused(_ target: Target) -> TransferFailure {
        TransferFailure(
            .transient(.network), .connectionRefused,
            "\(target.address) refused the connection: no server is listening there (it may be down or starting)")
    }

    private static func dnsFailure(_ error: any Error, host: String) -> TransferFailure {
        // getaddrinfo's own words ("Name or service not known", "Temporary failure in name
        // resolution") are plain and tell a typo from a network without DNS.
        let reason = (error as? SocketAddressError.UnknownHost).map { ": " + $0.errorDescription.lowercased() } ?? ""
        return TransferFailure(
            .transient(.network), .dnsError,
            "could not resolve the host name \(host)\(reason); check the name and the network's DNS")
    }

    /// The error texts of BoringSSL inside a NIOSSL error, for matching reason names such as
    /// `CERTIFICATE_VERIFY_FAILED` (NIOSSL exposes no codes for them).
    static func boringSSLReasons(_ error: any Error) -> String? {
        if let ssl = error as? NIOSSLError {
            if case .handshakeFailed(let inner) = ssl { return String(describing: inner) }
            return nil
        }
        if let boring = error as? BoringSSLError { return String(describing: boring) }
        return nil
    }

    /// The handshake failed because the server's certificate did not verify: which of the
    /// TLS codes applies is learned by `CertificateProbe`.
    static func isCertificateVerifyFailure(_ error: any Error) -> Bool {
        boringSSLReasons(error)?.contains("CERTIFICATE_VERIFY_FAILED") == true
    }

    /// TLS failures. A certificate that does not verify, a name that does not match, a server
    /// that wants a client certificate or that speaks no TLS dld accepts: retrying changes
    /// nothing, so they are permanent. A connection that breaks during the handshake is not
    /// one of these (it is an I/O error or an unclean shutdown, above).
    static func tlsFailure(_ error: any Error, target: Target, clientCertificate: Bool = false) -> TransferFailure? {
        let host = target.host
        if let extra = error as? NIOSSLExtraError, extra == .failedToValidateHostname {
            return TransferFailure(
                .permanent, .tlsHostname,
                "the certificate of \(host) was issued for another host name, not \(host); use the name the certificate names in the URL")
        }
        if let ssl = error as? NIOSSLError {
            switch ssl {
            case .uncleanShutdown:
                return TransferFailure(.transient(.network), .connectionClosed, "\(host) closed the TLS connection without warning")
            case .noSuchFilesystemObject, .failedToLoadCertificate, .failedToLoadPrivateKey:
                return TransferFailure(
                    .permanent, .tlsConfig,
                    "the TLS files for \(host) could not be loaded (ca_file, ca_dir, client_cert, client_key, SSL_CERT_FILE or SSL_CERT_DIR): each must be readable PEM"
                )
            default:
                break
            }
        }
        guard let reasons = boringSSLReasons(error) else { return nil }
        if reasons.contains("CERTIFICATE_VERIFY_FAILED") {
            return untrusted(host, finding: nil)
        }
        if reasons.contains("CERTIFICATE_REQUIRED") {
            return TransferFailure(
                .permanent, .tlsClientCert,
                "\(host) asks for a client certificate; give one with client_cert and client_key")
        }
        if [
            "ALERT_UNKNOWN_CA", "ALERT_BAD_CERTIFICATE", "ALERT_CERTIFICATE_UNKNOWN", "ALERT_ACCESS_DENIED", "ALERT_CERTIFICATE_REVOKED",
            "ALERT_CERTIFICATE_EXPIRED", "ALERT_UNSUPPORTED_CERTIFICATE",
        ].contains(where: reasons.contains) {
            // The server sent a certificate alert: it is about the certificate dld sent, since
            // dld checks the server's itself.
            return TransferFailure(
                .permanent, .tlsClientCert,
                clientCertificate
                    ? "\(host) refused the client certificate (client_cert): it is not one the server accepts"
                    : "\(host) refused the TLS handshake for want of a client certificate; give one with client_cert and client_key")
        }
        if reasons.contains("UNSUPPORTED_PROTOCOL") || reasons.contains("PROTOCOL_VERSION") {
            return TransferFailure(
                .permanent, .tlsHandshake,
                "\(host) does not speak TLS 1.2 or newer, the oldest version dld accepts")
        }
        if reasons.contains("WRONG_VERSION_NUMBER") || reasons.contains("HTTP_REQUEST") {
            return TransferFailure(
                .permanent, .tlsHandshake,
                "\(target.address) does not speak TLS; is the URL's port for http, not https?")
        }
        if reasons.contains("HANDSHAKE_FAILURE") || reasons.contains("NO_SHARED_CIPHER") || reasons.contains("NO_CIPHERS") {
            return TransferFailure(
                .permanent, .tlsHandshake,
                clientCertificate
                    ? "\(host) refused the TLS handshake: it may not accept the client certificate, or offers no cipher dld accepts"
                    : "\(host) refused the TLS handshake: it may want a client certificate (client_cert), or offers no cipher dld accepts")
        }
        return TransferFailure(
            .permanent, .tlsHandshake,
            "the TLS handshake with \(host) failed (run dld with log_level = \"debug\" for the details)")
    }

    /// The message for a certificate that did not verify, as precise as the probe allowed.
    static func untrusted(_ host: String, finding: CertificateProbe.Finding?) -> TransferFailure {
        let formatter = ISO8601DateFormatter()
        switch finding {
        case .expired(let date):
            return TransferFailure(
                .permanent, .tlsExpired,
                "the certificate of \(host) expired on \(formatter.string(from: date)); the server must renew it")
        case .notYetValid(let date):
            return TransferFailure(
                .permanent, .tlsNotYetValid,
                "the certificate of \(host) is not valid before \(formatter.string(from: date)); check this machine's clock")
        case .selfSigned:
            return TransferFailure(
                .permanent, .tlsUntrusted,
                "the certificate of \(host) is not trusted (self-signed); to trust it, give it as ca_file")
        case .unknownIssuer:
            return TransferFailure(
                .permanent, .tlsUntrusted,
                "the certificate of \(host) is not trusted (issued by an authority dld does not know); give that authority's certificate as ca_file"
            )
        case nil:
            return TransferFailure(
                .permanent, .tlsUntrusted,
                "the certificate of \(host) is not trusted; give its authority's certificate as ca_file")
        }
    }
}
