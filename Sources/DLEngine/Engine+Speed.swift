import DLCore
import DLJobTable
import DLTransfer
import Foundation

/// Speed limits (`max_speed`, `speed_schedule`, `set_speed`) and changing a job's URL and
/// headers (`change`).
extension Engine {
    /// The global limit in force and where it comes from, for `stats` and `set_speed`.
    public struct SpeedView: Sendable, Equatable {
        /// Bytes per second; 0: no limit.
        public var limit: Int64
        /// `set_speed`, `schedule` or `max_speed`.
        public var source: String
        /// The config file's `max_speed` and `speed_schedule` (normalized; "" when none).
        public var maxSpeed: Int64
        public var schedule: String
        /// When the schedule next changes the limit; nil: never by itself.
        public var nextChange: Date?
    }

    /// Seconds since local midnight: the schedule is written in local time.
    static func secondOfDay(_ date: Date) -> Int {
        let parts = Calendar.current.dateComponents([.hour, .minute, .second], from: date)
        return (parts.hour ?? 0) * 3600 + (parts.minute ?? 0) * 60 + (parts.second ?? 0)
    }

    var speedPolicy: GlobalSpeedPolicy {
        var policy = configuration.speed
        policy.override = speedOverride
        return policy
    }

    public var speedView: SpeedView {
        let at = now()
        let second = Self.secondOfDay(at)
        let policy = speedPolicy
        return SpeedView(
            limit: policy.limit(atSecondOfDay: second), source: policy.source(atSecondOfDay: second),
            maxSpeed: configuration.speed.maxSpeed, schedule: configuration.speed.schedule.text,
            nextChange: policy.secondsUntilChange(fromSecondOfDay: second).map { at.addingTimeInterval(Double($0)) })
    }

    /// Hands the global limit in force to the transfers, and tells the speed loop
    /// (`Engine+Loops`) when the schedule next changes it. Called at start, after a reload,
    /// after `set_speed`, and by that loop.
    func applySpeedLimits() {
        let view = speedView
        downloader.limiter.setGlobal(view.limit)
        let next = accepting ? view.nextChange : nil
        guard next != speedChangeAt else { return }
        speedChangeAt = next
        bells.speed.ring()
    }

    /// `set_speed` with `global`: a rate over the config file's (0: no limit), or nil to go back
    /// to `max_speed` and the schedule. Not kept across a restart.
    public func setGlobalSpeed(_ rate: Int64?) -> SpeedView {
        speedOverride = rate
        applySpeedLimits()
        logger.notice("global speed limit", metadata: ["limit": "\(speedView.limit)", "source": "\(speedView.source)"])
        return speedView
    }

    /// `change` of a job whose transfer runs here (stopped, as `stopped`): the attempt's
    /// progress is committed with its epoch, the change under a new epoch, and the transfer
    /// starts again from that row. A failed write leaves the job as it was, its transfer going
    /// on; a job that another worker took meanwhile is left to it.
    private func restart(_ stopped: Job, with revision: JobRevision) async throws(DLError) -> Job {
        let owner = JobOwner(stopped, worker: configuration.worker)
        let revised: Job?
        do throws(DLError) {
            let answer = try await storage {
                try await store.checkpoint(
                    stopped.id, received: stopped.received, size: stopped.size, validators: stopped.validators,
                    finalURL: stopped.finalURL, segments: stopped.segments, now: now(), owner: owner)
            }
            revised =
                answer.written
                ? try await storage({ try await store.revise(stopped.id, revision, expecting: (.running, stopped.epoch), now: now()) })
                : nil
        } catch {
            // Not written (or in doubt): on one daemon the transfer goes on as it was rather than
            // stay stopped. On a shared table it stays stopped: the job may have been handed over
            // meanwhile (the table was away), and a new attempt of an old epoch would cut back the
            // partial file under the new owner's; the next lease turn queues it again if it is
            // still this worker's.
            if !store.sharesQueue { startTransfer(stopped) }
            throw error
        }
        guard let revised else {
            throw DLError(.invalidState, "job \(stopped.id): another worker took it over meanwhile; it was not changed")
        }
        startTransfer(revised)
        return revised
    }

    /// A job that is `running` in the table but has no transfer here is finishing (its file
    /// being published) or runs under another worker: commands that change it wait.
    private func unfinishedHere(_ id: JobID, verb: String) async throws(DLError) -> Job {
        guard let job = try await storage({ try await store.fetch(id) }) else {
            throw DLError(.jobNotFound, "no job with id \(id)")
        }
        if job.state == .completed || job.state == .canceled {
            throw DLError(.invalidState, "job \(id): cannot \(verb) a job that is \(job.state.rawValue)")
        }
        if job.state == .running && running[id] == nil {
            let situation =
                job.worker.map { $0 == configuration.worker ? "is being completed" : "runs under the worker \($0)" } ?? "is being completed"
            throw DLError(.invalidState, "job \(id): cannot \(verb) it now: it \(situation); pause it first")
        }
        return job
    }

    /// `set_speed` with `id`: the job's own limit (nil or 0: none), kept in its row (only its
    /// options: what the job's worker owns, its state, offsets and lease, is not written); a
    /// running transfer keeps to it from its next chunk, here or, for a job that another
    /// worker runs, there once it sees the change.
    public func setJobSpeed(_ id: JobID, _ rate: Int64?) async throws(DLError) -> JobView {
        try await serial { () async throws(DLError) in
            try requireAccepting()
            guard let stored = try await storage({ try await store.fetch(id) }) else {
                throw DLError(.jobNotFound, "no job with id \(id)")
            }
            if stored.state == .completed || stored.state == .canceled {
                throw DLError(.invalidState, "job \(id): cannot set the speed of a job that is \(stored.state.rawValue)")
            }
            let value = rate.flatMap { $0 > 0 ? $0 : nil }
            var options = stored.options
            options.maxSpeed = value
            guard let job = try await storage({ try await store.revise(id, JobRevision(options: options), expecting: nil, now: now()) })
            else {
                throw DLError(.jobNotFound, "no job with id \(id)")
            }
            if running[id] != nil {
                // The outcome of the transfer is recorded over the row it started with: it
                // carries the new limit too.
                running[id]?.job.options.maxSpeed = value
                downloader.limiter.setJob(id, value)
            }
            logger.notice("job speed limit", metadata: ["job": "\(id)", "limit": "\(value ?? 0)"])
            return view(job)
        }
    }

    /// `change`: new URL and/or headers for a job that is not completed or canceled. A running
    /// transfer stops (its bytes synced and committed) and starts again at once with them; the
    /// next response decides whether the bytes on disk are kept (its validators match the
    /// ones they came with, `If-Range`) or dropped with the reason in the job's `error`
    /// (`started_over`). Other states stay as they are.
    public func change(_ id: JobID, url: String?, headers: [HeaderField]?) async throws(DLError) -> JobView {
        try await serial { () async throws(DLError) in
            try requireAccepting()
            let found = try await unfinishedHere(id, verb: "change")
            let revision = JobRevision(url: url, headers: headers)
            let wasRunning = running[id] != nil
            let job: Job
            if wasRunning, let stopped = await stopTransfer(id, intent: .pause) {
                job = try await restart(stopped, with: revision)
            } else {
                // Only while the row is as read: a compare-and-set on its state and epoch, so
                // that a job another worker claimed meanwhile is never written back.
                guard
                    let revised = try await storage({
                        try await store.revise(id, revision, expecting: (found.state, found.epoch), now: now())
                    })
                else {
                    throw DLError(.invalidState, "job \(id) changed meanwhile (another worker started or stopped it); try again")
                }
                job = revised
            }
            logger.notice(
                "job changed",
                metadata: [
                    "job": "\(id)", "url": "\(URLRules.redacted(job.url))",
                    "headers": "\(job.headers.map(\.name).joined(separator: ","))", "restarted": "\(wasRunning)",
                ])
            return view(job)
        }
    }
}
