import DLCore
import DLEngine
import DLRPC
import Foundation

// MARK: stats, queue, set_speed, change

extension Dispatcher {
    func stats() async throws(DLError) -> JSONValue {
        let stats = try await engine.stats()
        var counts: [String: JSONValue] = [:]
        for state in JobState.allCases { counts[state.rawValue] = .int(Int64(stats.counts[state] ?? 0)) }
        return [
            "counts": .object(counts),
            "total": .int(Int64(stats.counts.values.reduce(0, +))),
            "active": .int(Int64(stats.active)),
            "speed": .int(Int64(stats.speed.rounded())),
            "max_active": .int(Int64(stats.maxActive)),
            "accepting": .bool(stats.accepting),
            "uptime": .int(Int64(stats.uptime.rounded())),
            "queue_paused": .bool(stats.queuePausedReason != nil),
            "queue_paused_reason": stats.queuePausedReason.map { .string($0) } ?? .null,
            "worker": .string(stats.worker),
            "workers": .array(stats.workers.map { ["id": .string($0.id), "seen_at": JobJSON.timestamp($0.seenAt)] }),
            "database_bytes": .int(stats.databaseBytes),
            "table_unreachable": stats.tableUnreachable.map { .string($0) } ?? .null,
            "lease": stats.lease.map(Self.leaseReply) ?? .null,
            "max_speed": Self.speedReply(await engine.speedView),
            "cache": await cacheStats(),
        ]
    }

    func queue(_ params: QueueParams) async throws(DLError) -> JSONValue {
        let reason: String?
        if let paused = params.paused {
            reason = try await engine.setQueuePaused(paused)
        } else {
            reason = try await engine.stats().queuePausedReason
        }
        return ["paused": .bool(reason != nil), "reason": reason.map { .string($0) } ?? .null]
    }

    /// `stats.lease`: a worker of a shared table's leases and fence.
    static func leaseReply(_ lease: Engine.LeaseView) -> JSONValue {
        [
            "seconds": .double(lease.seconds),
            "renewed_at": lease.renewedAt.map(JobJSON.timestamp) ?? .null,
            "fenced": .bool(lease.fencedSince != nil),
            "fenced_since": lease.fencedSince.map(JobJSON.timestamp) ?? .null,
            "fences": .int(Int64(lease.fences)),
            "clock_skew": .double((lease.clockSkew * 1000).rounded() / 1000),
        ]
    }

    /// The global limit as `stats` and `set_speed` show it.
    static func speedReply(_ view: Engine.SpeedView) -> JSONValue {
        [
            "limit": .int(view.limit),
            "source": .string(view.source),
            "config": .int(view.maxSpeed),
            "schedule": view.schedule.isEmpty ? .null : .string(view.schedule),
            "next_change_at": view.nextChange.map(JobJSON.timestamp) ?? .null,
        ]
    }

    func setSpeed(_ params: SetSpeedParams) async throws(DLError) -> JSONValue {
        switch params.target {
        case .job(let id): JobJSON.encode(try await engine.setJobSpeed(id, params.maxSpeed))
        case .global: Self.speedReply(await engine.setGlobalSpeed(params.maxSpeed))
        }
    }

    func change(_ params: ChangeParams) async throws(DLError) -> JSONValue {
        JobJSON.encode(try await engine.change(params.id, url: params.url, headers: params.headers))
    }
}
