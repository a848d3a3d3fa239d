import DLCore
import DLTransfer

// MARK: - Metalink

extension Engine {
    /// What `enqueue` of a Metalink needs of the configuration now: the folder of a group that
    /// names none, and `metalink_location`.
    public func metalinkSettings() -> (downloadDir: String, location: String?) {
        (configuration.downloadDir, configuration.metalinkLocation)
    }

    /// Fetches a small document (a Metalink) whole with the daemon's HTTP clients, proxies, TLS
    /// and redirect rules: no job, no file.
    public nonisolated func fetchDocument(
        url: String, headers: [HeaderField], options: JobOptions, maxBytes: Int, timeout: Duration
    ) async -> Result<SmallDocument, TransferFailure> {
        await downloader.fetchSmall(url: url, headers: headers, options: options, maxBytes: maxBytes, timeout: timeout)
    }
}
