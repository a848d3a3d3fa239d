import AsyncHTTPClient
import DLCore
import Foundation
import NIOCore

extension Downloader {
    /// One GET of a small text (an HLS playlist) with the daemon's HTTP clients, TLS settings,
    /// proxies, credentials and redirect rules, as a job's first request is sent: the body
    /// whole, at most `maxBytes`, and the URL after redirects (relative URIs resolve against
    /// it). Any status but 200 is a failure.
    public func fetchText(_ request: TransferRequest, maxBytes: Int) async -> Result<(bytes: [UInt8], url: String), TransferFailure> {
        var state = AttemptState(
            received: 0, size: nil, validators: Validators(), finalURL: nil, target: Target(url: request.url))
        do {
            let response = try await fetch(request, state: &state, rangeFrom: 0)
            let status = Int(response.status.code)
            let host = state.target?.host ?? "the server"
            guard status == 200 else {
                _ = try? await response.body.collect(upTo: 64 << 10)
                return .failure(
                    TransferFailure(
                        HTTPFailurePolicy.kind(forStatus: status), .httpStatus,
                        "\(host) answered \(status) for \(URLRules.redacted(request.url).prefix(200))"))
            }
            if let length = response.headers.first(name: "content-length").flatMap(Int.init), length > maxBytes {
                return .failure(TransferFailure(.permanent, .sizeMismatch, "the playlist is \(length) bytes; at most \(maxBytes) are read"))
            }
            let body: ByteBuffer
            do {
                body = try await response.body.collect(upTo: maxBytes)
            } catch is NIOTooManyBytesError {
                return .failure(TransferFailure(.permanent, .sizeMismatch, "the playlist is larger than \(maxBytes) bytes"))
            }
            return .success((Array(body.readableBytesView), state.finalURL ?? request.url))
        } catch let failure as TransferFailure {
            return .failure(failure)
        } catch {
            logger.debug("playlist fetch error", metadata: ["error": "\(String(reflecting: error))"])
            return .failure(
                Self.classify(error, target: state.target ?? Target(host: "the server", port: 0, isHTTPS: false), timeouts: configuration))
        }
    }
}
