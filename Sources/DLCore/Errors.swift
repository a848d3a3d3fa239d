/// The application errors of the protocol: a stable snake_case `code` for scripts and a message
/// for people. The numeric JSON-RPC codes live in DLRPC; this is the vocabulary.
public struct DLError: Error, Sendable, Equatable, CustomStringConvertible {
    public var code: Code
    public var message: String

    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { "\(message) (\(code.rawValue))" }

    public enum Code: String, Sendable, CaseIterable {
        case parseError = "parse_error"
        case invalidRequest = "invalid_request"
        case methodNotFound = "method_not_found"
        case invalidParams = "invalid_params"
        case internalError = "internal_error"
        case lineTooLong = "line_too_long"
        case jobNotFound = "job_not_found"
        case groupNotFound = "group_not_found"
        case invalidState = "invalid_state"
        case destinationExists = "destination_exists"
        case destinationInvalid = "destination_invalid"
        case destinationNotAllowed = "destination_not_allowed"
        case queueFull = "queue_full"
        case invalidURL = "invalid_url"
        case shuttingDown = "shutting_down"
        case storageError = "storage_error"
        /// `get`: the download of a URL that was not cached failed or was canceled.
        case downloadFailed = "download_failed"
        /// `enqueue` of HLS: the playlist is not one, or breaks RFC 8216's rules.
        case hlsInvalid = "hls_invalid"
        /// `enqueue` of HLS: `SAMPLE-AES`, `SAMPLE-AES-CTR` or a DRM `KEYFORMAT`.
        case hlsUnsupportedEncryption = "hls_unsupported_encryption"
        /// `enqueue` of HLS: a live playlist (no `EXT-X-ENDLIST`) without `live: true`.
        case hlsLive = "hls_live"
        /// `enqueue` of HLS: something dld cannot join into one file (audio served apart).
        case hlsUnsupported = "hls_unsupported"
        /// `enqueue` of HLS: the playlist could not be fetched.
        case hlsFetchFailed = "hls_fetch_failed"
        /// `enqueue` of a Metalink (`metalink`, or a `.meta4`/`.metalink` URL): the document
        /// cannot be fetched, is not a Metalink, breaks a limit, or names an unsafe file.
        case invalidMetalink = "invalid_metalink"
    }

    public static func invalidParams(_ message: String) -> DLError { DLError(.invalidParams, message) }
}
