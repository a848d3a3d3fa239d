import DLCore
import DLRPC
import Foundation

// MARK: get, unpin, cache_list

extension Dispatcher {
    func requireCache() throws(DLError) -> URLCache {
        guard let cache else { throw DLError(.invalidState, "the URL cache is not available") }
        return cache
    }

    func get(_ params: GetParams) async throws(DLError) -> JSONValue {
        let answer = try await requireCache().get(params.url, pin: params.pin)
        return [
            "path": .string(answer.path), "size": .int(answer.bytes), "sha256": answer.sha256.map { .string($0) } ?? .null,
            "source": .string(answer.source.rawValue), "job": answer.jobID.map { .int($0) } ?? .null,
            "pinned": .bool(answer.pinned), "fresh_until": JobJSON.timestamp(answer.freshUntil),
        ]
    }

    func unpin(_ params: UnpinParams) async throws(DLError) -> JSONValue {
        ["cached": .bool(try await requireCache().unpin(params.url))]
    }

    func cacheList() async throws(DLError) -> JSONValue {
        let entries = try await requireCache().list()
        return [
            "entries": .array(
                entries.map { item -> JSONValue in
                    [
                        "url": .string(URLRules.redacted(item.entry.url)), "path": .string(item.entry.path),
                        "size": .int(item.entry.bytes), "pinned": .bool(item.entry.pinned), "in_use": .bool(item.held),
                        "last_used": JobJSON.timestamp(item.entry.lastUsed), "fresh_until": JobJSON.timestamp(item.freshUntil),
                    ]
                })
        ]
    }

    /// `stats.cache`: counters since dld started, and what the cache holds now.
    func cacheStats() async -> JSONValue {
        guard let cache else { return .null }
        let stats = await cache.stats()
        return [
            "available": .bool(stats.available), "hits": .int(Int64(stats.hits)), "misses": .int(Int64(stats.misses)),
            "revalidations": .int(Int64(stats.revalidations)), "bytes": .int(stats.bytes), "entries": .int(Int64(stats.entries)),
            "pinned": .int(Int64(stats.pinned)), "max_bytes": .int(stats.maxBytes),
        ]
    }
}
