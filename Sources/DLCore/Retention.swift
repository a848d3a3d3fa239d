import Foundation

/// How long the records of finished jobs are kept (`keep_finished`, `keep_failed` in
/// docs/configuration.md). Records only: retention never deletes a downloaded file.
public struct RetentionPolicy: Sendable, Equatable {
    /// Seconds a completed or canceled record is kept after it finished; 0 keeps it forever.
    public var keepFinished: TimeInterval
    /// Seconds a failed record is kept after it failed; 0 keeps it forever.
    public var keepFailed: TimeInterval

    public static let defaultKeepFinished: TimeInterval = 30 * 86_400
    public static let defaultKeepFailed: TimeInterval = 90 * 86_400

    public init(keepFinished: TimeInterval = Self.defaultKeepFinished, keepFailed: TimeInterval = Self.defaultKeepFailed) {
        self.keepFinished = keepFinished
        self.keepFailed = keepFailed
    }

    /// One deletion a sweep makes: records in one of `states` that finished at or before `before`.
    public struct Sweep: Sendable, Equatable {
        public var states: [JobState]
        public var before: Date

        public init(states: [JobState], before: Date) {
            self.states = states
            self.before = before
        }
    }

    /// What a sweep at `now` deletes, nothing for a kind kept forever.
    public func sweeps(now: Date) -> [Sweep] {
        var sweeps: [Sweep] = []
        if keepFinished > 0 { sweeps.append(Sweep(states: [.completed, .canceled], before: now.addingTimeInterval(-keepFinished))) }
        if keepFailed > 0 { sweeps.append(Sweep(states: [.failed], before: now.addingTimeInterval(-keepFailed))) }
        return sweeps
    }

    /// Time between two sweeps: a quarter of the shortest keep, from 1 s to 1 h, so a record
    /// goes at most a quarter late (and an hour at most); nil when everything is kept.
    public var interval: TimeInterval? {
        let keeps = [keepFinished, keepFailed].filter { $0 > 0 }
        guard let shortest = keeps.min() else { return nil }
        return min(3600, max(1, shortest / 4))
    }
}

/// When the job table gives its free pages back to the file system: once they are at least
/// `share` of the file and at least `minimumPages`, in steps of `step` pages so that no write
/// waits for more than one step.
public struct CompactionPolicy: Sendable, Equatable {
    public var share: Double = 0.25
    public var minimumPages = 256
    public var step = 1000

    public init() {}

    public func shouldCompact(pages: Int, freePages: Int) -> Bool {
        pages > 0 && freePages >= minimumPages && Double(freePages) >= share * Double(pages)
    }
}

/// Durations as people write them in a config file or on a command line.
public enum DurationText {
    /// "90" or "90s", "15m", "12h", "30d", "2w" (a number, then an optional unit), in seconds;
    /// nil when the text is not one of them or is negative.
    public static func seconds(_ text: String) -> TimeInterval? {
        let trimmed = text.trimmingCharacters(in: .whitespaces).lowercased()
        guard let last = trimmed.last else { return nil }
        let units: [Character: TimeInterval] = ["s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800]
        let (number, unit) = last.isLetter ? (String(trimmed.dropLast()), units[last]) : (trimmed, 1)
        guard let unit, let value = Double(number), value >= 0, (value * unit).isFinite else { return nil }
        return value * unit
    }

    /// The largest whole unit: "30d", "36h", "90s"; "0" for zero. A count too large for an
    /// Int is written as a Double ("1e+20s"), which `seconds` reads back: a config file may
    /// say that much, and printing it must not trap.
    public static func describe(_ seconds: TimeInterval) -> String {
        if seconds <= 0 { return "0" }
        for (unit, size) in [("w", 604_800.0), ("d", 86_400), ("h", 3600), ("m", 60)]
        where seconds.truncatingRemainder(dividingBy: size) == 0 {
            if let count = Int(exactly: seconds / size) { return "\(count)\(unit)" }
        }
        return Int(exactly: seconds).map { "\($0)s" } ?? "\(seconds)s"
    }
}
