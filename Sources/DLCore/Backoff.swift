import Foundation

/// Retry timing for transient failures: exponential backoff with full jitter, a cap, and a
/// server's `Retry-After` honoured up to the cap. Pure: the caller passes the random draw.
public struct BackoffPolicy: Sendable, Equatable {
    public var base: TimeInterval
    public var cap: TimeInterval
    /// Attempts without progress before a job gives up.
    public var maxAttempts: Int

    public init(base: TimeInterval = 2, cap: TimeInterval = 600, maxAttempts: Int = 10) {
        self.base = base
        self.cap = cap
        self.maxAttempts = maxAttempts
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
