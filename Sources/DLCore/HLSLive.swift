import Foundation

/// When a live recording reloads its playlist, and when it gives up. Pure (the caller passes
/// the clock's time): the engine runs one per recording.
///
/// - A reload every target duration (`EXT-X-TARGETDURATION`, at least 1 s), whatever the
///   last one gave: a failed one (a network error, a status other than 200, a playlist that
///   does not parse) is tried again at the next.
/// - The recording ends, and what was fetched is published, after `maxFailures` failed
///   reloads in a row, or when the playlist gained no segment for `staleLimit` (30 target
///   durations, at least 60 s): a stream that stopped without its end tag.
public struct HLSLivePolicy: Sendable, Equatable {
    /// Failed reloads in a row that end the recording.
    public static let maxFailures = 10

    public enum Outcome: Sendable, Equatable {
        /// The playlist has segments the recording did not have.
        case grew
        /// Read, with nothing new.
        case unchanged
        /// Not fetched or not read.
        case failed
    }

    public enum Next: Sendable, Equatable {
        case reload(at: Date)
        /// The recording ends; the reason is logged.
        case stop(String)
    }

    public private(set) var targetDuration: Int
    public private(set) var failures = 0
    public private(set) var lastGrowth: Date

    public init(targetDuration: Int, start: Date) {
        self.targetDuration = targetDuration
        lastGrowth = start
    }

    /// Seconds between reloads.
    public var interval: TimeInterval { TimeInterval(max(1, targetDuration)) }
    /// Seconds without a new segment that end the recording.
    public var staleLimit: TimeInterval { max(60, 30 * interval) }

    /// The first reload, one interval after the playlist was read at enqueue (or at start-up).
    public func first(at now: Date) -> Next { .reload(at: now.addingTimeInterval(interval)) }

    /// After a reload at `now`: the next one, or the end. `targetDuration` is the playlist's
    /// as last read (it may change).
    public mutating func next(after outcome: Outcome, at now: Date, targetDuration: Int? = nil) -> Next {
        if let targetDuration { self.targetDuration = targetDuration }
        switch outcome {
        case .grew:
            failures = 0
            lastGrowth = now
        case .unchanged:
            failures = 0
        case .failed:
            failures += 1
            if failures >= Self.maxFailures {
                return .stop("\(failures) reloads of the playlist failed in a row")
            }
        }
        if now.timeIntervalSince(lastGrowth) >= staleLimit {
            return .stop("the playlist gained no segment for \(Int(staleLimit)) s")
        }
        return .reload(at: now.addingTimeInterval(interval))
    }
}
