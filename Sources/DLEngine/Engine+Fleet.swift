import DLCore
import DLJobTable
import Foundation
import Logging
import Synchronization

/// A worker of a shared queue (the job table in PostgreSQL, several daemons): it renews the
/// leases of what it runs, queues again the jobs of workers whose leases ran out, and stops
/// the transfers of jobs that other daemons paused, canceled or took, within moments of the
/// change (`JobTable.changes`). On SQLite there is one daemon and none of this runs.
/// This worker's leases on a shared table: when they were last renewed, the fence, and the
/// table's clock and counts as last read.
struct LeaseBook {
    /// When this worker last renewed its leases: the engine's clock for `stats`, and the
    /// monotonic clock (taken before the renewal was sent) for the fence.
    var renewedAt: Date?
    var renewedInstant: ContinuousClock.Instant?
    /// Since when this worker's transfers are fenced: its leases went unrenewed for most of a
    /// lease; nil while they are renewed.
    var fencedSince: Date?
    /// How many times this worker was fenced since it started.
    var fences = 0
    /// The shared table's clock minus this engine's (seconds), as last measured: leases are
    /// reckoned on the table's clock, so a worker whose clock is wrong neither takes jobs whose
    /// leases still run nor gives out leases that others see as ended.
    var clockSkew: TimeInterval = 0
    /// The last `stats` read from the table, answered again (with the reason) when a shared
    /// table does not answer in time.
    var lastTableStats: Engine.TableStats?
    /// The daemon's worker lock (one daemon per worker id) went with its connection: fenced
    /// until it is held again, whatever the leases say.
    var lockLost = false

    /// Whether this worker may start nothing and must stop what runs.
    var fenced: Bool { fencedSince != nil || lockLost }
}

extension Engine {
    /// Waits between two looks after a change signal: the changes of that moment, seen once.
    static let changesSettle: Duration = .milliseconds(100)

    /// The worker's loops (shared table only), children of the engine's loops (`runLoops`):
    /// they end when the service group ends those.
    func runFleet() async {
        guard store.sharesQueue else { return }
        leases.renewedAt = now()
        leases.renewedInstant = .now
        let period = Duration.milliseconds(Int64(configuration.lease * 1000 / 3))
        // The fence looks often, and never through the serial queue: a renewal that hangs on
        // a table that went away holds that queue, and the fence is what must not wait for it.
        let look = Duration.milliseconds(Int64(min(configuration.lease * 1000 / 20, 250)))
        let changes = store.changes()
        await withDiscardingTaskGroup { group in
            group.addTask {
                while !Task.isCancelled {
                    try? await Task.sleep(for: look)
                    await self.fenceIfLeasesRunOut()
                }
            }
            // The first turn at once: the worker shows among the live ones from the start.
            group.addTask {
                while !Task.isCancelled {
                    await self.leaseTurn()
                    try? await Task.sleep(for: period)
                }
            }
            group.addTask {
                for await _ in changes {
                    try? await Task.sleep(for: Self.changesSettle)
                    guard !Task.isCancelled else { return }
                    await self.changesTurn()
                }
            }
        }
    }

    /// This worker's leases, for `stats` (nil on SQLite).
    public struct LeaseView: Sendable, Equatable {
        /// The lease, in seconds.
        public var seconds: Double
        /// When the leases were last renewed.
        public var renewedAt: Date?
        /// Since when this worker is fenced (its transfers stopped, none started); nil: not.
        public var fencedSince: Date?
        /// Times this worker was fenced since it started.
        public var fences: Int
        /// The table's clock minus this worker's, in seconds, as last measured.
        public var clockSkew: Double
    }

    var leaseView: LeaseView? {
        guard store.sharesQueue else { return nil }
        return LeaseView(
            seconds: configuration.lease, renewedAt: leases.renewedAt, fencedSince: leases.fencedSince, fences: leases.fences,
            clockSkew: leases.clockSkew)
    }

    /// `body`'s outcome, or nil when it did not come within `limit`; it is then cancelled and
    /// left to end on its own (a pool that waits for a server does not hold the caller).
    static func within<T: Sendable>(_ limit: Duration, _ body: @escaping @Sendable () async throws -> T) async -> Result<T, any Error>? {
        let once = OneShot<Result<T, any Error>?>()
        let work = run(body, into: once)
        let timer = Task {
            try? await Task.sleep(for: limit)
            work.cancel()
            once.resume(nil)
        }
        defer { timer.cancel() }
        return await once.wait()
    }

    /// `body`, or a `CancellationError` as soon as the caller is cancelled, without waiting
    /// for `body` to end (it is cancelled too, and left to end on its own): a transfer that a
    /// fence stops must not wait for a checkpoint that a pool holds while the server is away.
    static func abandonedOnCancel<T: Sendable>(_ body: @escaping @Sendable () async throws -> T) async throws -> T {
        let once = OneShot<Result<T, any Error>?>()
        let work = run(body, into: once)
        let outcome = await withTaskCancellationHandler {
            await once.wait()
        } onCancel: {
            work.cancel()
            once.resume(nil)
        }
        guard let outcome else { throw CancellationError() }
        return try outcome.get()
    }

    /// Runs `body` in a task of its own that hands its outcome to `once`.
    private static func run<T: Sendable>(_ body: @escaping @Sendable () async throws -> T, into once: OneShot<Result<T, any Error>?>)
        -> Task<Void, Never>
    {
        Task {
            do {
                once.resume(.success(try await body()))
            } catch {
                once.resume(.failure(error))
            }
        }
    }

    /// The share of a lease after which a worker that could not renew stops its transfers:
    /// the rest of the lease is the margin for stopping them before other workers may take
    /// the jobs (`requeueExpired`, on the table's clock).
    static let fenceAt = 0.8

    /// Now on the shared table's clock (as last measured), for leases.
    func leaseNow() -> Date {
        now().addingTimeInterval(leases.clockSkew)
    }

    /// Reads the table's clock (PostgreSQL's `clock_timestamp()`), half-way through the trip.
    func measureTableClock() async {
        let before = now()
        do {
            guard let server = try await store.serverClock() else { return }
            let after = now()
            let skew = server.timeIntervalSince(before.addingTimeInterval(after.timeIntervalSince(before) / 2))
            if abs(skew - leases.clockSkew) > 1 {
                logger.notice(
                    "this worker's clock differs from the job table's; leases are reckoned on the table's",
                    metadata: [
                        "seconds": "\((skew * 1000).rounded() / 1000)"
                    ])
            }
            leases.clockSkew = skew
        } catch {
            logger.warning("could not read the job table's clock", metadata: ["error": "\(Self.storageText(error))"])
        }
    }

    /// Renews this worker's leases, stops transfers whose jobs are no longer its own, queues
    /// again what it holds but does not run (claims of a turn that failed) and the jobs of
    /// workers whose leases ran out, then fills free slots.
    func leaseTurn() async {
        do {
            try await serial { () async throws(DLError) in
                // Without the worker lock another daemon may be this worker now (it took the
                // lock while this one was cut off): renewing "its" leases and queueing again the
                // jobs it runs and this one does not was each requeueing the other's jobs
                // (`make fleet-chaos`). Nothing is written as this worker until the lock is held
                // again (`workerLockRegained` runs a turn then).
                guard accepting, !leases.lockLost else { return }
                await measureTableClock()
                let sent = ContinuousClock.now
                let at = leaseNow()
                let owned: [JobID: Int64]
                do {
                    owned = try await store.renewLeases(
                        worker: configuration.worker, until: at.addingTimeInterval(configuration.lease), now: at)
                } catch {
                    await fenceIfLeasesRunOut()
                    logger.warning("lease renewal failed", metadata: ["error": "\(Self.storageText(error))"])
                    throw DLError(.storageError, "could not renew this worker's leases in the shared job table: \(Self.storageText(error))")
                }
                leases.renewedAt = now()
                leases.renewedInstant = sent
                if let since = leases.fencedSince, !leases.lockLost {
                    leases.fencedSince = nil
                    logger.notice(
                        "the job table answers again and the leases are renewed: this worker takes jobs again",
                        metadata: [
                            "fenced_for": "\(Int(now().timeIntervalSince(since).rounded())) s"
                        ])
                }
                // A transfer whose job this worker no longer holds under the same epoch stops.
                await stopLost(running.filter { owned[$0.key] != $0.value.job.epoch }.map(\.key))
                try await requeueOrphans(Set(owned.keys))
                let expired = try await storage { try await store.expireLeases(now: leaseNow()) }
                for path in expired.files { removePartial(at: path) }
                if expired.count > 0 {
                    logger.notice("handed over the jobs of workers whose leases ran out", metadata: ["jobs": "\(expired.count)"])
                    try await finishPublishes(since: at.addingTimeInterval(-3 * configuration.lease))
                }
                try await schedule()
                try await flush()
            }
        } catch {
            logger.warning("lease turn failed", metadata: ["error": "\(error)"])
        }
    }

    /// The fence. While the table cannot be reached to renew the leases, transfers go on as
    /// long as the leases hold; once `fenceAt` of a lease has passed since the last renewal
    /// was sent (a monotonic clock: a renewal that hangs counts as none), the other workers
    /// may soon take the jobs, so every transfer here stops (nothing of it is recorded: the
    /// table has what was committed), nothing is published twice, and nothing starts until a
    /// renewal succeeds. Runs on its own timer, outside the serial queue.
    func fenceIfLeasesRunOut() async {
        guard accepting, let renewedInstant = leases.renewedInstant else { return }
        if leases.lockLost {
            if !running.isEmpty { await stopLost(Array(running.keys)) }
            return
        }
        let unrenewed = ContinuousClock.now - renewedInstant
        guard unrenewed > .milliseconds(Int64(configuration.lease * Self.fenceAt * 1000)) else { return }
        if leases.fencedSince == nil {
            leases.fencedSince = now()
            leases.fences += 1
            logger.error(
                "the job table is unreachable and the leases are running out: this worker is fenced, its transfers stop and it starts none",
                metadata: [
                    "jobs": "\(running.count)", "unrenewed": "\(unrenewed)",
                ])
        }
        guard !running.isEmpty else { return }
        await stopLost(Array(running.keys))
    }

    /// A worker whose lease ran out may have died between recording files as completed and
    /// linking them: the files of jobs completed since `since` (its last moments, and more)
    /// that are still `.part` where this worker sees them are linked here. A folder this
    /// machine does not share is left to that worker's next start.
    private func finishPublishes(since: Date) async throws(DLError) {
        let recent = try await storage { try await store.completed(since: since, limit: Self.finishPublishLimit) }
        let linked = recent.filter { access($0.downloadPath, F_OK) != 0 && finishPublish($0) }.count
        if linked > 0 {
            logger.notice("linked files that a worker recorded as completed before it stopped", metadata: ["files": "\(linked)"])
        }
    }

    /// Recent completions looked at after a lease ran out, at most.
    static let finishPublishLimit = 5000

    /// Looks at the rows of what runs here after other daemons changed the table: a transfer
    /// whose job is no longer this attempt's stops; a command that waits for this worker (a
    /// pause, cancel or remove sent to another) is carried out; a new speed limit applies.
    func changesTurn() async {
        do {
            try await serial { () async throws(DLError) in
                changesScheduled = false
                guard accepting else { return }
                let ids = running.keys.sorted()
                if !ids.isEmpty {
                    let rows = try await storage { try await store.fetch(ids) }
                    var mine: Set<JobID> = []
                    var requests: [(Job, StopRequest)] = []
                    for row in rows {
                        guard let entry = running[row.id],
                            JobOwnership.owns(
                                state: row.state.rawValue, worker: row.worker, epoch: row.epoch, job: entry.job, owner: configuration.worker
                            )
                        else { continue }
                        mine.insert(row.id)
                        if let request = row.stopRequest { requests.append((row, request)) }
                        if row.options.maxSpeed != entry.job.options.maxSpeed {
                            running[row.id]?.job.options.maxSpeed = row.options.maxSpeed
                            downloader.limiter.setJob(row.id, row.options.maxSpeed)
                        }
                    }
                    await stopLost(ids.filter { !mine.contains($0) })
                    for (row, request) in requests { try await carryOut(request, running: row) }
                }
                try await schedule()
                try await flush()
            }
        } catch {
            logger.warning("could not look at the table's changes", metadata: ["error": "\(error)"])
        }
    }

    /// A changes turn soon, once (a checkpoint's answer carried a command for this worker).
    func changesSoon() {
        guard !changesScheduled else { return }
        changesScheduled = true
        Task { [weak self] in await self?.changesTurn() }
    }

    /// Carries out a command that another worker recorded for a job that runs here: the
    /// transfer stops and syncs, and its row takes the command's state with this attempt's
    /// epoch (a remove: canceled, then deleted); its partial file goes for a cancel or a remove.
    func carryOut(_ request: StopRequest, running row: Job) async throws(DLError) {
        let intent: StopIntent = request == .pause ? .pause : (request == .cancel ? .cancel : .remove)
        guard var job = await stopTransfer(row.id, intent: intent) else { return }
        job.stopRequest = nil
        try await settle(request, of: job)
    }

    /// Commits what `request` makes of `job`, a row of this worker's attempt (its transfer
    /// stopped, or none running here): paused, canceled or removed, only with that epoch.
    func settle(_ request: StopRequest, of job: Job) async throws(DLError) {
        let event: JobEvent = request == .pause ? .pause : .cancel
        guard let next = try? StateMachine.apply(event, to: job, now: now()) else { return }
        let (_, lost) = try await save([next], owned: [job.id], publish: true)
        guard !lost.contains(job.id) else { return }
        logger.notice("carried out a command sent to another worker", metadata: ["job": "\(job.id)", "command": "\(request.rawValue)"])
        guard request != .pause else { return }
        if let partial = JobFiles(
            state: .canceled, path: job.path, stagingPath: job.stagingPath, attempts: Int64(job.attempts), received: job.received
        ).partial {
            removePartial(at: partial)
        }
        if request == .remove {
            try await storage { try await store.delete(.ids([job.id]), deleteFiles: false, owner: nil, now: now()) }
        }
    }

    /// The worker lock was lost (the table's server restarted, or its connection was cut): a
    /// second daemon with this worker id could now run beside this one, renewing and
    /// releasing the same jobs. Every transfer stops (nothing recorded), nothing starts, until
    /// `workerLockRegained`.
    public func workerLockLost() async {
        guard !leases.lockLost else { return }
        leases.lockLost = true
        leases.fences += 1
        if leases.fencedSince == nil { leases.fencedSince = now() }
        await stopLost(Array(running.keys))
    }

    /// The worker lock is held again: the worker takes jobs again once its leases are renewed
    /// (its next lease turn, which also queues again the jobs it held and no longer runs).
    public func workerLockRegained() async {
        leases.lockLost = false
        await leaseTurn()
    }

    /// Stops transfers of jobs this worker no longer holds; writes nothing.
    func stopLost(_ ids: [JobID]) async {
        guard !ids.isEmpty else { return }
        logger.notice("jobs changed by another worker or command: their transfers stop here", metadata: ["jobs": "\(ids.sorted())"])
        // All of them at once, then each awaited: one at a time, a transfer slow to end (its
        // checkpoint waiting for a table that went away) kept the others streaming, and
        // starting new ranges, for seconds after the fence (seen in `make fleet-chaos`, seed 2).
        for id in ids {
            guard var entry = running[id] else { continue }
            entry.stop = max(entry.stop ?? .lost, .lost)
            running[id] = entry
            entry.task.cancel()
        }
        for id in ids {
            _ = await stopTransfer(id, intent: .lost)
        }
    }

    /// Jobs committed as running under this worker that nothing here runs, syncs or is about
    /// to start: queued again.
    private func requeueOrphans(_ owned: Set<JobID>) async throws(DLError) {
        let busy = Set(running.keys).union(publisher.batch).union(publisher.queue.map(\.job.id)).union(pending.launches.map(\.id))
        let orphans = owned.subtracting(busy)
        guard !orphans.isEmpty else { return }
        let rows = try await storage { try await store.fetch(orphans.sorted()) }
        for var job in rows where job.state == .running {
            if let request = job.stopRequest {
                try await settle(request, of: job)
                continue
            }
            job.state = .queued
            job.updatedAt = now()
            pending.saves.append(job)
            pending.owned.insert(job.id)
        }
        logger.notice("queued again jobs claimed here that did not start", metadata: ["jobs": "\(orphans.sorted())"])
    }

    /// The workers seen within two leases (this one first when it has not renewed yet).
    func liveWorkers() async throws(DLError) -> [(id: String, seenAt: Date)] {
        guard store.sharesQueue else { return [(configuration.worker, now())] }
        // Heartbeats are written on the table's clock (`renewLeases` gets `leaseNow()`).
        let seen = try await storage { try await store.workers(seenSince: leaseNow().addingTimeInterval(-2 * configuration.lease)) }
        return seen.contains { $0.id == configuration.worker } ? seen : [(configuration.worker, startedAt)] + seen
    }
}
