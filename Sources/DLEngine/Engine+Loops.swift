import DLCore
import DLTransfer
import Foundation

/// The engine's timed work: progress reports, unsynced progress, waiting jobs due again, the
/// speed schedule, retention sweeps and, on a shared table, the fleet's leases. All of it runs
/// as children of `runLoops`, which the daemon runs as a service of its group, so shutdown
/// ends them together and in order (after the transfers stopped, before the table closes).
///
/// An idle engine sleeps: a loop whose work comes only with transfers, or at a deadline, sleeps
/// on its bell until a transfer starts or the deadline it is given comes; nothing polls
/// (docs/architecture.md, "Processes and tasks"; `make bench PARTS=idle` measures it).
extension Engine {
    /// One bell per loop (a bell wakes one loop).
    struct Bells {
        /// `start` is done.
        let started = Doorbell()
        /// A transfer started: the progress reports run while transfers do.
        let progress = Doorbell()
        /// A transfer started: unsynced progress is recorded while transfers run.
        let unsynced = Doorbell()
        /// `wakeAt` changed.
        let wake = Doorbell()
        /// `speedChangeAt` changed.
        let speed = Doorbell()
        /// A section of the serial queue ran (the systemd heartbeat's status line).
        let activity = Doorbell()
    }

    /// Rings after every section of the serial queue but the heartbeat's own read: what may
    /// change the status line shown by `systemctl status`.
    public nonisolated var activity: Doorbell { bells.activity }

    /// Runs the timed work until cancelled. It begins once `start` is done; before, nothing is
    /// due. `report` is handed the live progress of the running transfers every
    /// `progressEvery` (job.progress events are coalesced to that rate).
    public func runLoops(
        progressEvery: Duration = .milliseconds(500), unsyncedEvery: Duration = Engine.unsyncedInterval,
        report: @escaping @Sendable ([Job], [TransferProgress.Snapshot]) -> Void
    ) async {
        while !started {
            guard !Task.isCancelled else { return }
            await bells.started.wait()
        }
        let recordsUnsynced = configuration.bootID != nil
        if !recordsUnsynced {
            logger.notice("the boot id cannot be read: a resume after a kill continues from the last checkpoint")
        }
        await withDiscardingTaskGroup { group in
            group.addTask { await self.reportProgress(every: progressEvery, report) }
            if recordsUnsynced { group.addTask { await self.recordUnsyncedProgress(every: unsyncedEvery) } }
            group.addTask { await self.wakeWaitingJobs() }
            group.addTask { await self.followSpeedSchedule() }
            group.addTask { await self.sweepFinished() }
            if store.sharesQueue { group.addTask { await self.runFleet() } }
        }
    }

    /// Marks the engine started: its loops begin.
    func markStarted() {
        started = true
        bells.started.ring()
    }

    /// A transfer started: the loops that run while transfers do are woken.
    func transfersRun() {
        bells.progress.ring()
        bells.unsynced.ring()
    }

    /// Each time a loop wakes (from a sleep or its bell): the trace log shows what wakes an
    /// engine, and a test counts these lines on an idle one.
    private nonisolated func woke(_ loop: String) {
        logger.trace("loop woke", metadata: ["loop": "\(loop)"])
    }

    /// Off the actor: handing progress to every subscriber must not hold the serial queue's
    /// actor, only the read of the snapshots does.
    private nonisolated func reportProgress(every interval: Duration, _ report: @Sendable ([Job], [TransferProgress.Snapshot]) -> Void)
        async
    {
        while !Task.isCancelled {
            if await running.isEmpty {
                await bells.progress.wait()
                woke("progress")
                continue
            }
            try? await Task.sleep(for: interval)
            woke("progress")
            let (jobs, snapshots) = await liveSnapshots()
            if !jobs.isEmpty { report(jobs, snapshots) }
        }
    }

    private func liveSnapshots() -> ([Job], [TransferProgress.Snapshot]) {
        let entries = running.values.sorted { $0.job.id < $1.job.id }
        return (entries.map(\.job), entries.map { $0.progress.snapshot })
    }

    private func recordUnsyncedProgress(every interval: Duration) async {
        while !Task.isCancelled {
            if running.isEmpty {
                await bells.unsynced.wait()
                woke("unsynced")
                continue
            }
            try? await Task.sleep(for: interval)
            woke("unsynced")
            await recordUnsynced()
        }
    }

    /// Sleeps until the earliest `next_attempt_at` (`wakeAt`, kept by `armWakeUp`), then
    /// queues what is due again. With no waiting job it sleeps until one waits.
    private func wakeWaitingJobs() async {
        while !Task.isCancelled {
            guard let at = wakeAt else {
                await bells.wake.wait()
                woke("wake")
                continue
            }
            // 10 ms past it: the job's time has then passed on the engine's clock too, and a
            // wake-up that queues nothing cannot come back at once.
            let delay = max(0, at.timeIntervalSince(now()))
            let rung = await bells.wake.wait(until: .now + .milliseconds(Int64(delay * 1000) + 10))
            woke("wake")
            // A new earliest time was set meanwhile: sleep until that one.
            if rung { continue }
            await wake()
        }
    }

    /// Applies the speed schedule's next limit when it is due (`applySpeedLimits` sets the
    /// time). With no schedule it sleeps until a reload or `set_speed` sets one.
    private func followSpeedSchedule() async {
        while !Task.isCancelled {
            guard let next = speedChangeAt else {
                await bells.speed.wait()
                woke("speed")
                continue
            }
            // At most a minute at a time: the local clock may jump (daylight saving, a manual set).
            let delay = min(max(next.timeIntervalSince(now()), 0.5), 60)
            let rung = await bells.speed.wait(until: .now + .milliseconds(Int64(delay * 1000)))
            woke("speed")
            if rung { continue }
            applySpeedLimits()
        }
    }

    /// Sweeps by the retention policy at once, then every `RetentionPolicy.interval` (an hour
    /// with the defaults; the policy may change at a reload).
    private func sweepFinished() async {
        while !Task.isCancelled {
            let interval = await sweep()
            try? await Task.sleep(for: .seconds(interval))
            woke("retention")
        }
    }
}
