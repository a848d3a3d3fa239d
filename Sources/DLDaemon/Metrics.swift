import DLCore
import DLEngine
import Prometheus
import Synchronization

/// dld's metrics, rendered in Prometheus's text exposition format for `GET /metrics`
/// (docs/operations.md, "Metrics"). What happens once per job (a job finished, a turn
/// committed) is counted as it happens; what the engine and the cache count already (bytes
/// received, cache hits) and what the job table holds (jobs by state) are read when scraped,
/// so nothing is counted twice, a job costs the same however long the queue, and a scrape
/// reads the table as `stats` does (its counts by state), no more.
public final class Metrics: Sendable {
    let registry = PrometheusCollectorRegistry()
    private let engine: Engine
    private let cache: URLCache?

    private let downloadedBytes: Counter
    private let jobsCompleted: Counter
    private let jobs: [JobState: Gauge]
    private let activeTransfers: Gauge
    private let speed: Gauge
    private let queueDepth: Gauge
    private let cacheHits: Counter
    private let cacheMisses: Counter
    private let commitDuration: DurationHistogram

    /// The totals that the engine and the cache keep, as the counters last took them: each
    /// scrape adds what they grew by since.
    private struct Taken {
        var bytes: Int64 = 0
        var hits = 0
        var misses = 0
    }
    private let taken = Mutex(Taken())

    /// The commit latencies the histogram tells apart: an fsync on a disk takes milliseconds.
    static let commitBuckets: [Duration] = [
        .microseconds(500), .milliseconds(1), .milliseconds(2), .milliseconds(5), .milliseconds(10),
        .milliseconds(25), .milliseconds(50), .milliseconds(100), .milliseconds(250), .milliseconds(500),
        .seconds(1), .seconds(2.5),
    ]

    /// `dld_<name>_<unit>`, with its help line.
    static func named(_ name: String, unit: String = "", _ help: String) -> MetricNameDescriptor {
        MetricNameDescriptor(namespace: "dld", metricName: name, unitName: unit, helpText: help)
    }

    /// Computed, not stored: the descriptor is not `Sendable`.
    static var failures: MetricNameDescriptor {
        named("job_failures", unit: "total", "Jobs and groups that failed, by the code of their error.")
    }

    public init(engine: Engine, cache: URLCache?) {
        self.engine = engine
        self.cache = cache
        let registry = self.registry
        downloadedBytes = registry.makeCounter(
            descriptor: Self.named(
                "downloaded", unit: "bytes_total", "Bytes received by transfers since dld started (again after a start-over)."))
        jobsCompleted = registry.makeCounter(
            descriptor: Self.named("jobs_completed", unit: "total", "Jobs and groups completed since dld started (a group counts once)."))
        // Every documented code, so that each series exists from the start (at 0).
        for code in JobErrorCode.documented {
            _ = registry.makeCounter(descriptor: Self.failures, labels: [("code", code.rawValue)])
        }
        var jobs: [JobState: Gauge] = [:]
        let jobsName = Self.named("jobs", "Jobs in the job table, by state.")
        for state in JobState.allCases {
            jobs[state] = registry.makeGauge(descriptor: jobsName, labels: [("state", state.rawValue)])
        }
        self.jobs = jobs
        activeTransfers = registry.makeGauge(descriptor: Self.named("active_transfers", "Transfers running in this daemon."))
        speed = registry.makeGauge(
            descriptor: Self.named(
                "download_speed", unit: "bytes_per_second", "The running transfers' speeds over their last second, added up."))
        queueDepth = registry.makeGauge(descriptor: Self.named("queue_depth", "Jobs queued or waiting to be retried."))
        cacheHits = registry.makeCounter(
            descriptor: Self.named("cache_hits", unit: "total", "URL cache lookups (get) answered from the cache."))
        cacheMisses = registry.makeCounter(
            descriptor: Self.named("cache_misses", unit: "total", "URL cache lookups (get) that downloaded."))
        commitDuration = registry.makeDurationHistogram(
            descriptor: Self.named("commit_duration", unit: "seconds", "How long the transaction of a turn of the engine's queue took."),
            buckets: Self.commitBuckets)
        let build = registry.makeGauge(
            descriptor: Self.named("build_info", "dld's version, in its label; always 1."), labels: [("version", DLDVersion.current)])
        build.set(to: 1)
    }

    /// Counts a job or group that finished (the engine's `onFinished`).
    public func finished(_ notice: Engine.FinishedNotice) {
        switch notice.state {
        case "completed":
            jobsCompleted.increment()
        case "failed":
            let code = notice.error?.code ?? "unknown"
            registry.makeCounter(descriptor: Self.failures, labels: [("code", code)]).increment()
        default:
            break
        }
    }

    /// Records how long a turn's transaction took (the engine's `onCommit`).
    public func committed(_ duration: Duration) {
        commitDuration.record(duration)
    }

    /// The metrics in the text exposition format (version 0.0.4), after reading what is read
    /// at scrape time. A job table that cannot be read leaves the jobs' gauges as they were.
    /// The gauges are read before the counters are emitted: a job that finishes in between is
    /// counted in this scrape and in `dld_jobs` from the next one.
    public func render() async -> String {
        if let stats = try? await engine.stats() {
            for state in JobState.allCases { jobs[state]?.set(to: Double(stats.counts[state, default: 0])) }
            queueDepth.set(to: Double(stats.counts[.queued, default: 0] + stats.counts[.waiting, default: 0]))
            activeTransfers.set(to: Double(stats.active))
            speed.set(to: stats.speed)
        }
        let bytes = engine.receivedBytes.total
        let lookups = await cache?.lookups()
        taken.withLock { taken in
            // Under the lock: two scrapes at once do not add the same growth twice.
            if bytes > taken.bytes {
                downloadedBytes.increment(by: bytes - taken.bytes)
                taken.bytes = bytes
            }
            if let lookups {
                if lookups.hits > taken.hits {
                    cacheHits.increment(by: Int64(lookups.hits - taken.hits))
                    taken.hits = lookups.hits
                }
                if lookups.misses > taken.misses {
                    cacheMisses.increment(by: Int64(lookups.misses - taken.misses))
                    taken.misses = lookups.misses
                }
            }
        }
        return registry.emitToString()
    }
}
