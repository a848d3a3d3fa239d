import AsyncHTTPClient
import DLCore
import Foundation
import NIOConcurrencyHelpers
import NIOHTTP1

extension CacheHeaders {
    /// The headers of an answer that the URL cache keeps.
    init(_ headers: HTTPHeaders) {
        self.init(
            cacheControl: Self.joined(headers, "cache-control"), expires: headers.first(name: "expires"),
            date: headers.first(name: "date"), age: headers.first(name: "age"), etag: headers.first(name: "etag"),
            lastModified: headers.first(name: "last-modified"))
    }

    /// A header sent several times is one comma-separated list (RFC 9110 §5.3).
    private static func joined(_ headers: HTTPHeaders, _ name: String) -> String? {
        let values = headers[name]
        return values.isEmpty ? nil : values.joined(separator: ", ")
    }
}

/// Keeps the head of the last answer with a body for each destination the URL cache asked
/// about (the cache folder's files), so the cache can store the freshness headers of a
/// download that ran as an ordinary job. Other destinations cost one lock and a prefix test.
public final class ResponseHeadObserver: Sendable {
    private struct State {
        var folder: String?
        var heads: [String: CacheHeaders] = [:]
    }

    private let state = NIOLockedValueBox(State())

    public init() {}

    /// Heads of answers for files in `folder` (ending in `/`) are kept from now on.
    public func watch(folder: String) {
        state.withLockedValue { $0.folder = folder.hasSuffix("/") ? folder : folder + "/" }
    }

    func report(path: String, _ headers: HTTPHeaders) {
        state.withLockedValue { state in
            guard let folder = state.folder, path.hasPrefix(folder) else { return }
            state.heads[path] = CacheHeaders(headers)
        }
    }

    /// The last head seen for `path`, forgotten once taken.
    public func take(path: String) -> CacheHeaders? {
        state.withLockedValue { $0.heads.removeValue(forKey: path) }
    }
}

/// What the server says of a cached copy asked about with `If-None-Match`/`If-Modified-Since`.
public enum Revalidation: Sendable, Equatable {
    /// `304 Not Modified`: the copy is good; the 304's headers refresh the stored ones. No body
    /// was transferred.
    case notModified(CacheHeaders)
    /// Any other answer (a `200` with the new version, an error status): the copy must be
    /// downloaded again. The answer's body is not read; its connection is closed.
    case modified(status: Int)
    /// The server could not be asked (network, TLS, redirects refused).
    case failed(TransferFailure)
}

extension Downloader {
    /// One conditional GET of `url` with the daemon's HTTP clients, proxies and redirect rules,
    /// as a job's first request is sent.
    public func revalidate(url: String, conditions: [HeaderField]) async -> Revalidation {
        let request = TransferRequest(
            jobID: 0, url: url, headers: conditions, path: "", overwrite: false, offset: 0, size: nil, validators: Validators())
        var state = AttemptState(received: 0, size: nil, validators: Validators(), finalURL: nil, target: Target(url: url))
        do {
            let response = try await fetch(request, state: &state, rangeFrom: 0)
            let status = Int(response.status.code)
            if status == 304 { return .notModified(CacheHeaders(response.headers)) }
            return .modified(status: status)
        } catch let failure as TransferFailure {
            return .failed(failure)
        } catch {
            logger.debug("revalidation error", metadata: ["error": "\(String(reflecting: error))"])
            return .failed(
                Self.classify(error, target: state.target ?? Target(host: "the server", port: 0, isHTTPS: false), timeouts: configuration))
        }
    }
}
