import DLCore
import DLEngine
import DLRPC
import DLTransfer
import Foundation

// MARK: - enqueue of a Metalink

extension Dispatcher {
    /// How long the fetch of a Metalink may take in all: it holds the `enqueue` request.
    static let metalinkFetchTimeout: Duration = .seconds(30)

    /// Reads the Metalink (fetching it when the request names its URL), then enqueues its
    /// files as `enqueue` of one job or of a group would.
    func enqueueMetalink(_ request: MetalinkEnqueue) async throws(DLError) -> JSONValue {
        try Self.checkOnDisk(request.options)
        let metalink: Metalink
        var sourceURL: String? = nil
        switch request.source {
        case .document(let read, _):
            metalink = read
        case .url(let url):
            sourceURL = url
            let limits = MetalinkLimits()
            let fetched = await engine.fetchDocument(
                url: url, headers: request.headers, options: request.options, maxBytes: limits.maxBytes, timeout: Self.metalinkFetchTimeout)
            switch fetched {
            case .success(let document):
                metalink = try MetalinkReader.parse(Data(document.body), limits: limits)
            case .failure(let failure):
                throw Metalink.invalid(
                    "\(URLRules.redacted(url).prefix(200)) could not be fetched: \(failure.error.message) (\(failure.error.code))")
            }
        }
        let settings = await engine.metalinkSettings()
        let resolved = request.resolved(
            metalink, preferredLocation: settings.location, downloadDir: settings.downloadDir, sourceURL: sourceURL)
        if case .metalink = resolved { throw DLError(.internalError, "a Metalink resolved to a Metalink") }
        return try await enqueue(resolved)
    }
}
