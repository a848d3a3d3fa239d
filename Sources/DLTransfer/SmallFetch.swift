import AsyncHTTPClient
import DLCore
import Foundation
import NIOCore

/// A small document fetched whole into memory (a Metalink named by `enqueue`).
public struct SmallDocument: Sendable {
    public var body: Data
    public var contentType: String?
    /// The URL after redirects.
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
        let request0 = request
        let fetched = try? await withThrowingTaskGroup(of: Result<SmallDocument, TransferFailure>?.self) { group in
            group.addTask { await self.fetchSmallOnce(request0, maxBytes: maxBytes) }
            group.addTask {
                try await Task.sleep(for: timeout)
                return nil
            }
            let first = try await group.next() ?? nil
            group.cancelAll()
            return first
        }
        if let fetched = fetched ?? nil { return fetched }
        return .failure(TransferFailure(.transient(.network), .timeout, "\(URLRules.redacted(url)) did not answer whole within \(timeout)"))
    }

    private func fetchSmallOnce(_ request: TransferRequest, maxBytes: Int) async -> Result<SmallDocument, TransferFailure> {
        var state = AttemptState(received: 0, size: nil, validators: Validators(), finalURL: nil, target: Target(url: request.url))
        do {
            let response = try await fetch(request, state: &state, rangeFrom: 0)
            let status = Int(response.status.code)
            guard status == 200 else {
                _ = try? await response.body.collect(upTo: 64 << 10)
                return .failure(
                    TransferFailure(
                        status >= 500 || status == 408 || status == 429 ? .transient(.retry) : .permanent, .httpStatus,
                        "\(URLRules.redacted(request.url)) answered HTTP \(status)"))
            }
            if let length = response.headers.first(name: "content-length").flatMap(Int.init), length > maxBytes {
                return .failure(
                    TransferFailure(
                        .permanent, .lengthMismatch, "\(URLRules.redacted(request.url)) is \(length) bytes; at most \(maxBytes)"))
            }
            var body = Data()
            for try await chunk in response.body {
                guard body.count + chunk.readableBytes <= maxBytes else {
                    return .failure(
                        TransferFailure(.permanent, .lengthMismatch, "\(URLRules.redacted(request.url)) is more than \(maxBytes) bytes"))
                }
                body.append(contentsOf: chunk.readableBytesView)
            }
            return .success(
                SmallDocument(
                    body: body, contentType: response.headers.first(name: "content-type"), finalURL: state.finalURL ?? request.url))
        } catch let failure as TransferFailure {
            return .failure(failure)
        } catch {
            return .failure(
                Self.classify(error, target: state.target ?? Target(host: "the server", port: 0, isHTTPS: false), timeouts: configuration))
        }
    }
}
