/// The code of a job's error (`error.code` on the wire): a stable word that scripts may rely
/// on. Every code dld gives a job is a static member here, and docs/protocol.md's "Job error
/// codes" table lists exactly `documented` (a test checks it). The wire carries the raw
/// string; a row read back keeps whatever code it holds.
public struct JobErrorCode: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: String

    public init(rawValue: String) { self.rawValue = rawValue }

    public var description: String { rawValue }

    /// The server answered with a status dld cannot use: 408, 429 and 5xx are transient
    /// (`Retry-After` is honoured), other statuses permanent.
    public static let httpStatus = JobErrorCode(rawValue: "http_status")
    /// The connection ended before the announced length.
    public static let truncated = JobErrorCode(rawValue: "truncated")
    /// The server sent more bytes than it announced.
    public static let lengthMismatch = JobErrorCode(rawValue: "length_mismatch")
    /// Connecting, the TLS handshake, the response head or the next byte (`read_timeout`)
    /// took too long.
    public static let timeout = JobErrorCode(rawValue: "timeout")
    /// The server closed or reset the connection (also during the TLS handshake).
    public static let connectionClosed = JobErrorCode(rawValue: "connection_closed")
    /// The host name could not be resolved.
    public static let dnsError = JobErrorCode(rawValue: "dns_error")
    /// The host answered, but nothing listens on the port.
    public static let connectionRefused = JobErrorCode(rawValue: "connection_refused")
    /// The proxy could not be reached, did not answer in time, or could not open the tunnel.
    public static let proxyError = JobErrorCode(rawValue: "proxy_error")
    /// The proxy wants a user name and password, or refused the ones in its URL.
    public static let proxyAuth = JobErrorCode(rawValue: "proxy_auth")
    /// Any other network failure (details in the log at `debug` level).
    public static let networkError = JobErrorCode(rawValue: "network_error")
    /// The server's certificate is not trusted (self-signed, or an authority not in the
    /// trust store).
    public static let tlsUntrusted = JobErrorCode(rawValue: "tls_untrusted")
    /// The server's certificate has expired.
    public static let tlsExpired = JobErrorCode(rawValue: "tls_expired")
    /// The server's certificate is not valid yet (or this machine's clock is wrong).
    public static let tlsNotYetValid = JobErrorCode(rawValue: "tls_not_yet_valid")
    /// The server's certificate is for another host name than the URL's.
    public static let tlsHostname = JobErrorCode(rawValue: "tls_hostname")
    /// The server wants a client certificate, or refused the one given.
    public static let tlsClientCert = JobErrorCode(rawValue: "tls_client_cert")
    /// Any other failed TLS handshake.
    public static let tlsHandshake = JobErrorCode(rawValue: "tls_handshake")
    /// A TLS file of the job or the config cannot be read or loaded when the transfer starts.
    public static let tlsConfig = JobErrorCode(rawValue: "tls_config")
    /// More than 10 redirects.
    public static let tooManyRedirects = JobErrorCode(rawValue: "too_many_redirects")
    /// A redirect to a non-HTTP scheme, from `https` to `http`, or to an invalid location.
    public static let redirectRefused = JobErrorCode(rawValue: "redirect_refused")
    /// The HTTP client refused the URL.
    public static let invalidURL = JobErrorCode(rawValue: "invalid_url")
    /// A local file operation failed (open, write, read, truncate, sync, link, rename).
    public static let fileError = JobErrorCode(rawValue: "file_error")
    /// The connection is metered and the job may not download on it.
    public static let metered = JobErrorCode(rawValue: "metered")
    /// The disk or quota is full (`ENOSPC`, `EDQUOT`).
    public static let diskFull = JobErrorCode(rawValue: "disk_full")
    /// Free space would drop below `min_free` (plus what the job still needs).
    public static let diskSpace = JobErrorCode(rawValue: "disk_space")
    /// A file appeared at the destination during the download; the download stays in `<path>.part`.
    public static let destinationExists = JobErrorCode(rawValue: "destination_exists")
    /// The file does not match `checksum`; `resume` starts over from byte 0.
    public static let checksumMismatch = JobErrorCode(rawValue: "checksum_mismatch")
    /// The announced or final size differs from `size`; `resume` starts over from byte 0.
    public static let sizeMismatch = JobErrorCode(rawValue: "size_mismatch")
    /// OpenSSL could not start a digest.
    public static let digestError = JobErrorCode(rawValue: "digest_error")
    /// A file to be encrypted at rest could not be (libcrypto failed, or a recipient cannot
    /// be used).
    public static let encryptionError = JobErrorCode(rawValue: "encryption_error")
    /// `max_attempts` attempts, or `give_up_after` seconds, without progress.
    public static let retriesExhausted = JobErrorCode(rawValue: "retries_exhausted")
    /// At start-up: a completed job's file was deleted or moved (the job stays `completed`).
    public static let fileMissing = JobErrorCode(rawValue: "file_missing")
    /// A job with `mirrors`: no URL of the file is left.
    public static let noMirrorLeft = JobErrorCode(rawValue: "no_mirror_left")
    /// An HLS group's segments could not be joined into its file: a key is not 16 bytes, a
    /// segment does not decrypt (wrong key or IV), or a byte range is beyond its file.
    public static let hlsAssembly = JobErrorCode(rawValue: "hls_assembly")
    /// A piece of a file with piece hashes (a Metalink's) matches its hash from no source.
    public static let badPiece = JobErrorCode(rawValue: "bad_piece")
    /// Not a failure: bytes on disk could not be continued, and the transfer started over.
    public static let startedOver = JobErrorCode(rawValue: "started_over")
    /// A transfer's checkpoint found the job no longer this worker's (a shared table): the
    /// transfer ends and nothing of it is written, so no job shows it.
    public static let leaseLost = JobErrorCode(rawValue: "lease_lost")
    /// A mirror's answer is another file (its size or validators differ): that mirror is
    /// dropped, and the reason shows in `no_mirror_left`'s message, never as a job's code.
    public static let mirrorDisagrees = JobErrorCode(rawValue: "mirror_disagrees")

    /// The codes a job may show, in the order of docs/protocol.md's table.
    public static let documented: [JobErrorCode] = [
        .httpStatus,
        .truncated,
        .lengthMismatch,
        .timeout,
        .connectionClosed,
        .dnsError,
        .connectionRefused,
        .proxyError,
        .proxyAuth,
        .networkError,
        .tlsUntrusted,
        .tlsExpired,
        .tlsNotYetValid,
        .tlsHostname,
        .tlsClientCert,
        .tlsHandshake,
        .tlsConfig,
        .tooManyRedirects,
        .redirectRefused,
        .invalidURL,
        .fileError,
        .metered,
        .diskFull,
        .diskSpace,
        .destinationExists,
        .checksumMismatch,
        .sizeMismatch,
        .digestError,
        .encryptionError,
        .retriesExhausted,
        .fileMissing,
        .noMirrorLeft,
        .hlsAssembly,
        .badPiece,
        .startedOver,
    ]

    /// Failures after which the partial file cannot be trusted: a `resume` starts over from
    /// byte 0 (`StateMachine`, and the bulk statements of both job tables).
    public static let startOver: Set<JobErrorCode> = [.checksumMismatch, .sizeMismatch, .badPiece]

    /// Codes of failures that end inside dld and are never recorded on a job.
    public static let neverRecorded: [JobErrorCode] = [.leaseLost, .mirrorDisagrees]
}

extension JobError {
    public init(code: JobErrorCode, message: String) {
        self.init(code: code.rawValue, message: message)
    }
}
