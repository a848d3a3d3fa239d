import Foundation

/// Transfer rates people write: `"2M"`, `"512K"`, `"1.5G"`, `"100000"`. Bytes per second; the
/// suffixes are powers of 1024, as curl's `--limit-rate` and aria2's limits read them. `0` means
/// no limit.
public enum ByteRate {
    /// The rate, or nil when the text is not one.
    public static func parse(_ text: String) -> Int64? {
        var digits = text.trimmingCharacters(in: .whitespaces)
        var unit: Double = 1
        if let last = digits.last, let power = ["k": 1.0, "m": 2.0, "g": 3.0][Character(last.lowercased())] {
            unit = pow(1024, power)
            digits.removeLast()
        }
        guard !digits.isEmpty, digits.allSatisfy({ $0.isASCII && ($0.isNumber || $0 == ".") }),
            digits.filter({ $0 == "." }).count <= 1, digits.first != ".", digits.last != ".",
            let value = Double(digits)
        else { return nil }
        let bytes = (value * unit).rounded()
        // Up to 1 TiB/s: more is not a limit anybody means, and keeps the arithmetic far from overflow.
        guard bytes >= 0, bytes <= Double(1 << 40) else { return nil }
        return Int64(bytes)
    }

    /// A rate as people read it: `2M`, `512K`, `1000`.
    public static func format(_ rate: Int64) -> String {
        for (suffix, unit) in [("G", Int64(1) << 30), ("M", Int64(1) << 20), ("K", Int64(1) << 10)] where rate >= unit && rate % unit == 0 {
            return "\(rate / unit)\(suffix)"
        }
        return String(rate)
    }
}

/// A token bucket in bytes, on the caller's clock (seconds). Tokens may go below zero: a chunk
/// that has already arrived is let through at once on the books, and the transfer that took it
/// waits until the debt is paid back at `rate` before it reads more. So over any window of W
/// seconds at most `burst + rate·W` bytes pass, whatever the chunk sizes, and transfers that
/// share a bucket are served in the order they asked.
public struct TokenBucket: Sendable, Equatable {
    /// Bytes per second, > 0.
    public private(set) var rate: Double
    /// What may pass without waiting after a quiet spell: a tenth of a second of the rate, so
    /// that a 10 s window goes over by 1 % at most (at least 16 KiB, one small read).
    public private(set) var burst: Double
    /// Bytes that may pass now; negative: owed.
    public private(set) var tokens: Double
    private var updatedAt: Double

    public static func burst(for rate: Double) -> Double { max(rate / 10, 16 * 1024) }

    public init(rate: Int64, now: Double) {
        self.rate = Double(max(rate, 1))
        burst = Self.burst(for: self.rate)
        tokens = burst
        updatedAt = now
    }

    private mutating func refill(now: Double) {
        if now > updatedAt {
            tokens = min(burst, tokens + (now - updatedAt) * rate)
            updatedAt = now
        }
    }

    /// Takes `bytes`; returns how long (seconds) the taker waits before it goes on, 0 if at once.
    public mutating func take(_ bytes: Int64, now: Double) -> Double {
        refill(now: now)
        tokens -= Double(bytes)
        return tokens >= 0 ? 0 : -tokens / rate
    }

    /// A new rate applies from now: what was earned so far at the old rate stays earned, and
    /// what is owed is paid back at the new one.
    public mutating func setRate(_ rate: Int64, now: Double) {
        refill(now: now)
        self.rate = Double(max(rate, 1))
        burst = Self.burst(for: self.rate)
        tokens = min(tokens, burst)
    }
}

/// The limits in force: one bucket shared by every transfer (the global rate), and one per job
/// that has its own `max_speed`. A chunk passes both: its taker waits for the longer of the
/// two. No limit at all is no bucket (`isUnlimited`), which the transfer side checks first so
/// that an unlimited daemon pays nothing per chunk.
public struct SpeedLimits: Sendable, Equatable {
    public private(set) var global: TokenBucket?
    public private(set) var jobs: [JobID: TokenBucket] = [:]

    public init() {}

    public var isUnlimited: Bool { global == nil && jobs.isEmpty }

    /// Sets the shared rate; nil or 0: no global limit.
    public mutating func setGlobal(_ rate: Int64?, now: Double) {
        global = Self.updated(global, rate, now: now)
    }

    /// Sets one job's rate; nil or 0: the job has no limit of its own.
    public mutating func setJob(_ id: JobID, _ rate: Int64?, now: Double) {
        jobs[id] = Self.updated(jobs[id], rate, now: now)
    }

    private static func updated(_ bucket: TokenBucket?, _ rate: Int64?, now: Double) -> TokenBucket? {
        guard let rate, rate > 0 else { return nil }
        guard var bucket else { return TokenBucket(rate: rate, now: now) }
        bucket.setRate(rate, now: now)
        return bucket
    }

    /// Takes `bytes` for a transfer of job `id`; returns the seconds it waits before going on.
    public mutating func take(_ bytes: Int64, job id: JobID, now: Double) -> Double {
        let shared = global?.take(bytes, now: now) ?? 0
        let own = jobs[id]?.take(bytes, now: now) ?? 0
        return max(shared, own)
    }
}

/// Global limits by time of day (`speed_schedule` in the config file), for example full speed
/// at night and 2 MiB/s by day: `"08:00-18:00 2M, 18:00-08:00 0"`. Each entry is a range of
/// local time `HH:MM-HH:MM` (from the first, up to the second; a range that ends before it
/// starts goes past midnight; `00:00-00:00` is the whole day) and a rate (`ByteRate`; `0`: no
/// limit). Ranges may not overlap. A time no range covers uses `max_speed`.
public struct SpeedSchedule: Sendable, Equatable {
    public struct Entry: Sendable, Equatable {
        /// Minutes after midnight, local time.
        public var start: Int
        public var end: Int
        /// Bytes per second; 0: no limit.
        public var rate: Int64
    }

    public private(set) var entries: [Entry] = []
    /// The entry (its index) that covers each minute of the day, or nil.
    private var byMinute: [Int?] = []

    public static let empty = SpeedSchedule()

    public init() {}

    public var isEmpty: Bool { entries.isEmpty }

    /// Reads `"HH:MM-HH:MM RATE, …"`; an empty text is an empty schedule.
    public static func parse(_ text: String) -> Result<SpeedSchedule, ScheduleError> {
        var schedule = SpeedSchedule()
        var cover = [Int?](repeating: nil, count: minutesPerDay)
        for part in text.split(separator: ",", omittingEmptySubsequences: false) {
            let item = part.trimmingCharacters(in: .whitespaces)
            if item.isEmpty {
                if text.trimmingCharacters(in: .whitespaces).isEmpty { break }
                return .failure(ScheduleError("an empty entry; write \"HH:MM-HH:MM RATE\" entries separated by commas"))
            }
            let words = item.split(separator: " ", omittingEmptySubsequences: true)
            guard words.count == 2 else {
                return .failure(ScheduleError("\"\(item.prefix(60))\" is not \"HH:MM-HH:MM RATE\" (for example \"08:00-18:00 2M\")"))
            }
            let bounds = words[0].split(separator: "-", omittingEmptySubsequences: false)
            guard bounds.count == 2, let start = minute(bounds[0]), let end = minute(bounds[1]) else {
                return .failure(ScheduleError("\"\(words[0].prefix(30))\" is not a range of times HH:MM-HH:MM (00:00 to 23:59)"))
            }
            guard let rate = ByteRate.parse(String(words[1])) else {
                return .failure(
                    ScheduleError("\"\(words[1].prefix(30))\" is not a rate in bytes per second (for example 2M, 512K, 0 for no limit)"))
            }
            let index = schedule.entries.count
            schedule.entries.append(Entry(start: start, end: end, rate: rate))
            let length = end > start ? end - start : end + minutesPerDay - start
            for offset in 0..<length {
                let m = (start + offset) % minutesPerDay
                if let other = cover[m] {
                    let o = schedule.entries[other]
                    return .failure(ScheduleError("\(clock(start))-\(clock(end)) overlaps \(clock(o.start))-\(clock(o.end))"))
                }
                cover[m] = index
            }
        }
        if !schedule.entries.isEmpty { schedule.byMinute = cover }
        return .success(schedule)
    }

    public struct ScheduleError: Error, Equatable, CustomStringConvertible {
        public var description: String
        init(_ description: String) { self.description = description }
    }

    static let minutesPerDay = 24 * 60

    private static func minute(_ text: Substring) -> Int? {
        let parts = text.split(separator: ":", omittingEmptySubsequences: false)
        guard parts.count == 2, parts.allSatisfy({ $0.count == 2 && $0.allSatisfy(\.isASCII) }),
            let h = Int(parts[0]), let m = Int(parts[1]), (0..<24).contains(h), (0..<60).contains(m)
        else { return nil }
        return h * 60 + m
    }

    static func clock(_ minute: Int) -> String {
        let h = minute / 60, m = minute % 60
        return (h < 10 ? "0" : "") + "\(h):" + (m < 10 ? "0" : "") + "\(m)"
    }

    /// The schedule as written (normalized), for `--print-config`.
    public var text: String {
        entries.map { "\(Self.clock($0.start))-\(Self.clock($0.end)) \(ByteRate.format($0.rate))" }.joined(separator: ", ")
    }

    /// The rate of the entry that covers this second of the (local) day; nil: none covers it.
    public func rate(atSecondOfDay second: Int) -> Int64? {
        guard !byMinute.isEmpty else { return nil }
        let m = ((second / 60) % Self.minutesPerDay + Self.minutesPerDay) % Self.minutesPerDay
        return byMinute[m].map { entries[$0].rate }
    }

    /// Seconds from this second of the day until the rate changes (to another entry's, or to
    /// none); nil when it never changes (no entries, or one rate all day).
    public func secondsUntilChange(fromSecondOfDay second: Int) -> Int? {
        guard !byMinute.isEmpty else { return nil }
        let day = Self.minutesPerDay
        let s = ((second % (day * 60)) + day * 60) % (day * 60)
        let here = rate(atSecondOfDay: s)
        let minute = s / 60
        for ahead in 1...day {
            if rate(atSecondOfDay: ((minute + ahead) % day) * 60) != here {
                return (minute + ahead) * 60 - s
            }
        }
        return nil
    }
}

/// Which global rate is in force: a rate set over the socket (`set_speed` with `global`) wins
/// until it is cleared; else the schedule's entry for the time of day; else `max_speed`.
/// 0 is no limit.
public struct GlobalSpeedPolicy: Sendable, Equatable {
    public var maxSpeed: Int64 = 0
    public var schedule = SpeedSchedule.empty
    public var override: Int64?

    public init(maxSpeed: Int64 = 0, schedule: SpeedSchedule = .empty, override: Int64? = nil) {
        self.maxSpeed = maxSpeed
        self.schedule = schedule
        self.override = override
    }

    public func limit(atSecondOfDay second: Int) -> Int64 {
        override ?? schedule.rate(atSecondOfDay: second) ?? maxSpeed
    }

    /// Where the limit in force comes from: `set_speed`, `schedule` or `max_speed`.
    public func source(atSecondOfDay second: Int) -> String {
        if override != nil { return "set_speed" }
        if schedule.rate(atSecondOfDay: second) != nil { return "schedule" }
        return "max_speed"
    }

    /// Seconds until the limit may change by itself (the schedule's next boundary); nil: never.
    public func secondsUntilChange(fromSecondOfDay second: Int) -> Int? {
        override == nil ? schedule.secondsUntilChange(fromSecondOfDay: second) : nil
    }
}

/// Printed (in a logged configuration, say) as written, not as its table of minutes.
extension SpeedSchedule: CustomStringConvertible, CustomDebugStringConvertible {
    public var description: String { text }
    public var debugDescription: String { "\"\(text)\"" }
}
