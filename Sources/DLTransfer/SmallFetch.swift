import AsyncHTTPClient
import DLCore
import Foundation
import NIOCore

/// A small document fetched whole into memory (an HLS playlist, a Metalink named by `enqueue`).
public struct SmallDocument: Sendable {
    public var body: [UInt8]
    public var contentType: String?
    /// The URL after redirects (relative URIs in the document resolve against it).
    public var finalURL: String
}

extension Downloader {
    /// One GET of `url` with the daemon's HTTP clients, proxies, TLS and redirect rules (as a
    /// job's first request is sent), its body read whole: at most `maxBytes`, within `timeout`
    /// in all. Only a 200 is a document; anything else is a failure that says why.
    public func fetchSmall(
        url: String, headers: [HeaderField] = [], options: JobOptions = JobOptions(), maxBytes: Int, timeout: Duration
    ) async -> Result<SmallDocument, TransferFailure> {
        var request = TransferRequest(
            jobID: 0, url: url, headers: headers, path: "", overwrite: false, offset: 0, size: nil, validators: Validators())
        request.options = options
        return await fetchSmall(request, maxBytes: maxBytes, timeout: timeout)
    }

    /// The same for a request built by the caller (its URL, headers and options).
    public func fetchSmall(_ request: TransferRequest, maxBytes: Int, timeout: Duration) async -> Result<SmallDocument, TransferFailure> {
        let fetched = await withTaskGroup(of: Result<SmallDocument, TransferFailure>?.self) { group in
            group.addTask { await self.fetchSmallOnce(request, maxBytes: maxBytes) }
            group.addTask {
                try? await Task.sleep(for: timeout)
                return nil
            }
            let first = await group.next() ?? nil
            group.cancelAll()
            return first
        }
        if let fetched { return fetched }
        return .failure(
            TransferFailure(.transient(.network), .timeout, "\(URLRules.redacted(request.url)) did not answer whole within \(timeout)"))
    }

    private func fetchSmallOnce(_ request: TransferRequest, maxBytes: Int) async -> Result<SmallDocument, TransferFailure> {
        var state = AttemptState(received: 0, size: nil, validators: Validators(), finalURL: nil, target: Target(url: request.url))
        let url = URLRules.redacted(request.url).prefix(200)
        do {
            let response = try await fetch(request, state: &state, rangeFrom: 0)
            let status = Int(response.status.code)
            guard status == 200 else {
                _ = try? await response.body.collect(upTo: 64 << 10)
                return .failure(TransferFailure(HTTPFailurePolicy.kind(forStatus: status), .httpStatus, "\(url) answered HTTP \(status)"))
            }
            if let length = response.headers.first(name: "content-length").flatMap(Int.init), length > maxBytes {
                return .failure(TransferFailure(.permanent, .lengthMismatch, "\(url) is \(length) bytes; at most \(maxBytes) are read"))
            }
            let body: ByteBuffer
            do {
                body = try await response.body.collect(upTo: maxBytes)
            } catch is NIOTooManyBytesError {
                return .failure(TransferFailure(.permanent, .lengthMismatch, "\(url) is more than \(maxBytes) bytes"))
            }
            return .success(
                SmallDocument(
                    body: Array(body.readableBytesView), contentType: response.headers.first(name: "content-type"),
                    finalURL: state.finalURL ?? request.url))
        } catch let failure as TransferFailure {
            return .failure(failure)
        } catch {
            logger.debug("small document fetch error", metadata: ["error": "\(String(reflecting: error))"])
            return .failure(
                Self.classify(error, target: state.target ?? Target(host: "the server", port: 0, isHTTPS: false), timeouts: configuration))
        }
    }
}
