/// Concurrency that follows the network (docs/architecture.md, "Two lanes"). Pure: no clock,
/// no I/O, so every rule is unit-tested.
///
/// A transfer is *bound by round trips* while what it has left is small: a small file, or any
/// file whose size is not known yet. Such transfers wait for the network, not for bandwidth,
/// so they must not queue behind the ones that move bulk data. Two lanes:
///
/// - the **bulk lane**: `maxActive` transfers at most that have more than `lightBytes` left.
///   They share the bandwidth; a group takes one of these slots as a whole;
/// - the **light lane**: up to `maxLight` transfers beside them. Every job starts in it (its
///   size is unknown until the answer's head, or it is known small). When the head tells the
///   transfer has more than `lightBytes` left, it moves to a free bulk slot, or it is *parked*:
///   it stops before writing a byte and goes back to the queue, its size now known, and starts
///   again only when a bulk slot is free.
///
/// `maxActive = 1` keeps its meaning, strictly one transfer at a time: the light lane is off.
/// The host limits (`HostLimits`) apply to both lanes together.
public struct Lanes: Sendable, Equatable {
    /// Bulk transfers at once (config `max_active`).
    public var maxActive: Int
    /// Round-trip-bound transfers at once beside them (config `max_light`); unused when
    /// `maxActive` is 1.
    public var maxLight: Int
    /// A transfer with at most this many bytes left is light.
    public var lightBytes: Int64

    public static let defaultMaxLight = 64
    public static let defaultLightBytes: Int64 = 2 << 20

    public init(maxActive: Int, maxLight: Int = Lanes.defaultMaxLight, lightBytes: Int64 = Lanes.defaultLightBytes) {
        self.maxActive = max(1, maxActive)
        self.maxLight = max(0, maxLight)
        self.lightBytes = lightBytes
    }

    /// One transfer at a time, of any size: no light lane.
    public var strict: Bool { maxActive == 1 || maxLight == 0 }

    /// Whether a transfer with `remaining` bytes left (nil: not known) that has `received`
    /// bytes on disk is bound by round trips. Not knowing the size counts as small until the
    /// file on disk is larger than `lightBytes` (a long stream of unknown length is bulk).
    public func isLight(remaining: Int64?, received: Int64) -> Bool {
        if let remaining { return remaining <= lightBytes }
        return received <= lightBytes
    }

    /// How many transfers may start now, with `bulk` bulk slots taken (bulk transfers and
    /// groups) and `light` transfers in the light lane (every transfer starting counts there).
    public func free(bulk: Int, light: Int) -> Int {
        if strict { return max(0, maxActive - bulk - light) }
        return max(0, maxLight - light)
    }

    /// How many groups may take a slot now: a group is bulk work (many files, one slot).
    public func freeForGroups(bulk: Int, light: Int) -> Int {
        if strict { return max(0, maxActive - bulk - light) }
        return max(0, maxActive - bulk)
    }

    /// Whether a bulk slot is free.
    public func bulkFree(bulk: Int) -> Bool { bulk < maxActive }

    /// What a transfer whose answer just told its size does.
    public enum Admission: Sendable, Equatable {
        /// It stays in the light lane.
        case light
        /// It takes a free bulk slot.
        case bulk
        /// No bulk slot is free: it stops before writing and waits in the queue.
        case park
    }

    /// The admission of a light transfer that now has `remaining` bytes left (nil: unknown)
    /// and `received` on disk, while `bulk` bulk slots are taken (not counting it).
    public func admit(remaining: Int64?, received: Int64, bulk: Int) -> Admission {
        // Strictly one at a time: the transfer that runs is the only one, whatever its size.
        if strict { return .bulk }
        if isLight(remaining: remaining, received: received) { return .light }
        return bulkFree(bulk: bulk) ? .bulk : .park
    }

    /// Whether a queued job (its `size`, nil when unknown, and `received`) may start now: a
    /// job known to be bulk starts only when a bulk slot is free (else it would be parked at
    /// once); any other job starts in the light lane.
    public func mayStart(size: Int64?, received: Int64, bulk: Int) -> Bool {
        if strict || bulkFree(bulk: bulk) { return true }
        return isLight(remaining: size.map { max(0, $0 - received) }, received: received)
    }

    /// The claim's filter: while every bulk slot is taken, only jobs that are not known to be
    /// bulk may be claimed; nil when any job may be.
    public func claimFilter(bulk: Int) -> Int64? {
        strict || bulkFree(bulk: bulk) ? nil : lightBytes
    }
}

/// Transfers to one host at once. Over HTTP/1.1 each transfer in flight needs a connection of
/// its own, and `maxPerHost` (6, as browsers) keeps dld polite to small servers. Over HTTP/2
/// the transfers are streams of one connection, so a host that answered in HTTP/2 takes up to
/// `maxStreams` (config `max_streams_per_host`; the server's own `SETTINGS_MAX_CONCURRENT_STREAMS` still applies below it: the
/// client queues requests over it).
public struct HostLimits: Sendable, Equatable {
    public var maxPerHost: Int
    public var maxStreams: Int

    public static let defaultMaxStreams = 64

    public init(maxPerHost: Int, maxStreams: Int = HostLimits.defaultMaxStreams) {
        self.maxPerHost = max(1, maxPerHost)
        self.maxStreams = max(1, maxStreams)
    }

    /// The limit of a host that answered over HTTP/2 (`multiplexed`) or not (yet): streams,
    /// or connections. Ranges of a segmented download count against it.
    public func limit(multiplexed: Bool) -> Int {
        multiplexed ? maxStreams : maxPerHost
    }

    /// Transfers to a host that may be under way at once, counting those whose request waits
    /// for a connection. Over HTTP/1.1 a connection carries one request at a time, and the
    /// next one is sent only when a transfer ends and the engine starts the next job: that
    /// costs the engine's turnaround (the end, the hand-off, opening the next `.part`) once
    /// per file and connection, on top of each round trip. So while a connection is held by a
    /// transfer that will soon let it go, one more request may wait behind it in the client's
    /// pool, which sends it the moment the connection is free. The pool still opens at most
    /// `maxPerHost` connections (politeness is unchanged); only transfers that hold theirs
    /// for long (`long`: bulk ones and ranges) get nobody queued behind them.
    public func startLimit(multiplexed: Bool, long: Int) -> Int {
        multiplexed ? maxStreams : maxPerHost + max(0, maxPerHost - long)
    }
}
