import Foundation

/// Retry timing for transient failures: exponential backoff with full jitter, a cap, and a
/// server's `Retry-After` honoured up to the cap. Pure: the caller passes the random draw.
public struct BackoffPolicy: Sendable, Equatable {
    public var base: TimeInterval
    public var cap: TimeInterval
    /// Attempts without progress before a job gives up.
    public var maxAttempts: Int
    /// Time without any progress before a job gives up, whatever the attempts.
    public var giveUpAfter: TimeInterval
    /// How often a job waiting for disk space looks again.
    public var diskRecheck: TimeInterval

    public init(
        base: TimeInterval = 2, cap: TimeInterval = 600, maxAttempts: Int = 10,
        giveUpAfter: TimeInterval = 86_400, diskRecheck: TimeInterval = 30
    ) {
        self.base = base
        self.cap = cap
        self.maxAttempts = maxAttempts
        self.giveUpAfter = giveUpAfter
        self.diskRecheck = diskRecheck
    }

    /// The delay before attempt `attempt + 1`, where `attempt` (≥ 1) attempts have failed.
    /// `unit` is a random draw in [0, 1): full jitter picks uniformly in [0, min(cap, base·2^(n-1))].
    public func delay(afterAttempt attempt: Int, retryAfter: TimeInterval?, unit: Double) -> TimeInterval {
        if let retryAfter, retryAfter >= 0 { return min(retryAfter, cap) }
        let exponent = Double(max(0, min(attempt - 1, 30)))
        let ceiling = min(cap, base * pow(2, exponent))
        return ceiling * min(max(unit, 0), 1)
    }

    public func shouldGiveUp(attempts: Int) -> Bool { attempts >= maxAttempts }
}

/// When a running transfer records its progress: every `interval`, or sooner once `bytes` have
/// arrived, but never more often than `minInterval`. Each checkpoint costs an fdatasync and a
/// commit; the bytes after the last one are fetched again after a crash.
public struct CheckpointPolicy: Sendable, Equatable {
    public var interval: TimeInterval
    public var bytes: Int64
    public var minInterval: TimeInterval

    public init(interval: TimeInterval = 2, bytes: Int64 = 64 << 20, minInterval: TimeInterval = 0.5) {
        self.interval = interval
        self.bytes = bytes
        self.minInterval = min(minInterval, interval)
    }

    public func isDue(elapsed: TimeInterval, bytesSince: Int64) -> Bool {
        guard bytesSince > 0 else { return false }
        if elapsed >= interval { return true }
        return elapsed >= minInterval && bytesSince >= bytes
    }
}

/// The low-space floor: a job may use the disk only while at least `minFree` bytes stay free.
public struct DiskSpacePolicy: Sendable, Equatable {
    public var minFree: Int64

    public init(minFree: Int64 = 1 << 30) { self.minFree = minFree }

    /// Whether `free` bytes are enough for a job that still needs `remaining` bytes (nil when its
    /// size is unknown: then only the floor counts).
    public func allows(free: Int64, remaining: Int64?) -> Bool {
        free >= minFree + max(0, remaining ?? 0)
    }
}
