import DLCore
import DLJobTable
import DLTransfer
import Foundation
import Logging

/// Slots, transfers and their outcomes.
extension Engine {
    /// Starts queued work while slots are free. Slots follow the network (`Lanes`): every
    /// standalone job starts in the light lane (up to `maxLight` at once, beside the bulk
    /// transfers) and takes one of the `maxActive` bulk slots only when its answer tells it is
    /// big (`admit`); a group takes a bulk slot as a whole, and inside it runs up to
    /// `groupParallel` members; no host gets more than its limit (`HostLimits`). Groups that
    /// hold slots are settled here; the free slots are taken by the turn's commit (`flush`),
    /// which writes the turn's rows and claims the next jobs in one transaction
    /// (`JobTable.turn`): a claim marks them running under this worker in one statement (on a
    /// shared table, no other worker gets them), and their transfers start after that commit.
    /// Runs inside `serial`; the caller flushes (which also arms the wake-up of waiting jobs,
    /// once their rows are committed).
    func schedule() async throws(DLError) {
        guard accepting else { return }
        for id in activeGroups.sorted() { try await settle(id) }
        // A fenced worker (its leases unrenewed, `Engine+Fleet`) starts nothing.
        guard configuration.queuePausedReason == nil, !leases.fenced else { return }
        var free = configuration.lanes.free(bulk: scheduling.bulkTaken(), light: scheduling.lightTaken())
        // The ready jobs first: no trip to the table before they start.
        while free > 0, startFromReady() { free -= 1 }
        // Ready jobs left that could not start (their host at its limit, or big with the bulk
        // lane full) pause the claim past them for a while (`Scheduling.claimFree`).
        guard let total = scheduling.claimFree(now: now()) else { return }
        pending.claimFree = total
    }

    /// The claim a turn makes for `free` slots: hosts at their limit are passed over, and
    /// while some host is near it, no more than that host has room for (it might take all of
    /// them from it). Standalone jobs take light slots and groups bulk ones; while every bulk
    /// slot is taken, jobs known to be big are left in the queue.
    func turnClaim(free: Int) -> TurnClaim {
        let (full, room) = scheduling.hostRoom()
        let at = now()
        let lanes = configuration.lanes
        let bulk = scheduling.bulkTaken()
        let light = scheduling.lightTaken()
        let standalone = min(free, lanes.free(bulk: bulk, light: light))
        var claim = TurnClaim(
            free: free, limit: min(standalone, room), excludingGroups: activeGroups, excludingHosts: full,
            worker: configuration.worker, leaseUntil: leaseNow().addingTimeInterval(configuration.lease), now: at)
        claim.standaloneLimit = standalone
        claim.groupLimit = min(free, lanes.freeForGroups(bulk: bulk, light: light))
        claim.lightOnly = lanes.claimFilter(bulk: bulk)
        return claim
    }

    /// After a turn's commit: its claimed jobs start (or wait for an unmetered connection),
    /// the groups it gave slots take them, and standalone slots its claim could not fill in
    /// one go (a host near its limit) are claimed in further steps.
    func startTurn(_ outcome: TurnOutcome, claim: TurnClaim) async throws(DLError) {
        // A claim for free slots that found nothing to start (`schedule` pauses such claims).
        scheduling.claimed(free: claim.free, found: !outcome.claimed.isEmpty || !outcome.groups.isEmpty, now: now())
        let (starting, waiting) = holdForMetered(outcome.claimed)
        pending.launches += starting
        if !waiting.isEmpty {
            _ = try await save(waiting, owned: Set(waiting.map(\.id)), publish: true)
            wakeMayHaveChanged = true
        }
        for groupID in outcome.groups {
            activeGroups.insert(groupID)
            try await settle(groupID)
        }
        let left = outcome.standaloneSlots - starting.count
        if left > 0, outcome.claimed.count == claim.limit { try await self.claim(left, group: nil) }
    }

    /// Claims up to `wanted` queued jobs (standalone, or members of `group`) for this turn,
    /// within the host limit: hosts at their limit are passed over, and while some host is
    /// near it, a claim takes no more than that host has room for (it might take all from it).
    /// Returns how many of the claimed jobs were held for a metered connection instead.
    @discardableResult
    func claim(_ wanted: Int, group: GroupID?) async throws(DLError) -> Int {
        scheduling.dropReady(group: group)
        // Jobs started from the lists are still `queued` until their claims are committed:
        // committed first, so that this claim does not take them a second time.
        await commitStarted(scheduling.takeStartedEarly())
        var left = wanted
        var held = 0
        while left > 0 {
            let (full, room) = scheduling.hostRoom()
            let batch = min(left, room)
            let at = now()
            let lightOnly = scheduling.lanes(group).claimFilter(bulk: scheduling.bulkTaken(group: group))
            let claimed = try await storage {
                try await store.claim(
                    limit: batch, worker: configuration.worker, leaseUntil: leaseNow().addingTimeInterval(configuration.lease),
                    excludingHosts: full, lightOnly: lightOnly, group: group, now: at)
            }
            // Jobs that may not download on a metered connection wait instead of starting:
            // committed at once, so that a group's next look sees them waiting.
            let (starting, waiting) = holdForMetered(claimed)
            pending.launches += starting
            left -= starting.count
            if !waiting.isEmpty {
                _ = try await save(waiting, owned: Set(waiting.map(\.id)), publish: true)
                wakeMayHaveChanged = true
                held += waiting.count
            }
            if claimed.count < batch { return held }
        }
        return held
    }

    /// Starts the transfers of claimed jobs whose `running` rows are committed, once every
    /// older attempt of the same jobs has ended here (`endStaleAttempts`).
    func launch(_ claimed: [Job]) async {
        await endStaleAttempts(of: claimed)
        startTransfers(claimed)
    }

    /// On a shared table a claim may return a job whose older attempt still runs here: another
    /// worker's command paused or requeued it and it was queued again before this worker saw
    /// the change (its listener deaf, say). The claim gave the row a new epoch, so nothing the
    /// old attempt writes can land any more; it is stopped and awaited here, so that the new
    /// attempt never shares the partial file with it. A job whose older attempt's file is
    /// being published here is not started now: its publish can no longer commit (the epoch
    /// moved), and the orphan turn queues it again once that publish is over.
    func endStaleAttempts(of claimed: [Job]) async {
        for job in claimed {
            guard let entry = running[job.id], entry.job.epoch != job.epoch else { continue }
            logger.notice(
                "claimed again while an older attempt runs here: that attempt stops first",
                metadata: ["job": "\(job.id)", "epoch": "\(job.epoch)", "old_epoch": "\(entry.job.epoch)"])
            _ = await stopTransfer(job.id, intent: .lost)
        }
    }

    /// Starts the transfers of claimed jobs whose `running` rows are committed. Each may take
    /// more of its host's slots for ranges (segmented downloads), but never those that the
    /// jobs after it in the batch need: every claimed job gets at least its one.
    func startTransfers(_ claimed: [Job]) {
        guard !claimed.isEmpty else { return }
        let jobs = claimed.filter { job in
            guard running[job.id] != nil || publisher.batch.contains(job.id) || publisher.queue.contains(where: { $0.job.id == job.id })
            else { return true }
            logger.notice("claimed again while an older attempt runs or is published here: not started now", metadata: ["job": "\(job.id)"])
            return false
        }
        // The load is read once and kept up to date here, not recounted (every running job's
        // URL parsed again) for each job of the batch.
        var load = scheduling.hostLoad()
        let hosts = jobs.map { URLRules.hostKey($0.url) }
        var waiting: [String: Int] = [:]
        for host in hosts { waiting[host, default: 0] += 1 }
        for (job, host) in zip(jobs, hosts) {
            waiting[host, default: 1] -= 1
            let free = scheduling.hostLimit(host) - load[host, default: 0] - waiting[host, default: 0]
            // An encrypted file is one stream (its chunks are sealed in order): one connection.
            let wanted = job.options.isEncrypted ? 1 : job.options.segments ?? configuration.segments
            if !job.mirrors.isEmpty {
                // Each mirror's ranges hold slots of its own host.
                // The live sources' hosts; all of them when every URL was dropped (a resume,
                // which asks them all again: MirrorSet).
                let allDropped = job.urlDropped != nil && job.mirrors.allSatisfy { $0.dropped != nil }
                let hosts = [host] + job.mirrors.filter { allDropped || $0.dropped == nil }.map { URLRules.hostKey($0.url) }
                var frees: [String: Int] = [:]
                for other in hosts {
                    frees[other] = scheduling.hostLimit(other) - load[other, default: 0] - waiting[other, default: 0]
                }
                frees[host] = free
                let allowance = MirrorAllowance.slots(wanted: wanted, hosts: hosts, free: frees)
                startTransfer(job, slots: allowance.values.reduce(0, +), host: host, hostSlots: allowance)
                for (other, count) in allowance { load[other, default: 0] += count }
                continue
            }
            let slots = SegmentAllowance.slots(wanted: wanted, free: free)
            startTransfer(job, slots: slots, host: host)
            load[host, default: 0] += slots
        }
    }

    /// Starts the transfer of a job whose `running` row is committed, with up to `slots`
    /// connections to its host.
    func startTransfer(_ started: Job, slots: Int = 1, host: String? = nil, hostSlots: [String: Int]? = nil) {
        let progress = TransferProgress(received: started.received, size: started.size, counter: receivedBytes)
        progress.connections = slots
        if !started.mirrors.isEmpty {
            let allowance = hostSlots ?? [URLRules.hostKey(started.url): slots]
            progress.hostConnections = allowance
        }
        var request = TransferRequest(
            jobID: started.id, url: started.url, headers: started.headers, path: started.downloadPath,
            overwrite: started.overwrite, offset: started.received, size: started.size, validators: started.validators,
            checksum: started.checksum)
        request.expectedSize = started.expectedSize
        request.diskSpace = configuration.diskSpace
        request.checkpoints = configuration.checkpoints
        request.segmentation = SegmentSettings(count: slots, minSize: configuration.segmentMinSize)
        request.segmentLayout = started.segments
        request.mirrors = started.mirrors
        request.urlDropped = started.urlDropped
        request.pieces = started.pieces.flatMap(PieceHashes.init(encoded:))
        request.hostSlots = progress.hostConnections ?? [:]
        request.unsynced = started.unsynced
        request.bootID = configuration.bootID
        request.ownsFolder = started.stagingPath != nil
        if store.sharesQueue {
            request.attempt = PartialAttempt(worker: configuration.worker, epoch: started.epoch, trusted: started.partialTag)
        }
        request.options = started.options
        if started.groupID != nil { request.options.automaticName = false }
        request.netrc = currentNetrc()
        if started.options.insecure {
            logger.warning("TLS certificates are not verified for this job (insecure)", metadata: ["job": "\(started.id)"])
        }
        let store = self.store
        let downloader = self.downloader
        let attempt = scheduling.nextAttempt()
        let id = started.id
        // Jobs start in the light lane (of their group's slot, for members); the answer's size
        // decides (`admit`).
        progress.setAdmission(scheduling.lanes(started.groupID)) { [weak self] remaining, received in
            await self?.admit(id, attempt: attempt, remaining: remaining, received: received) ?? false
        }
        // Set before the transfer starts, removed when it has ended (a restart awaits the end
        // of the transfer it replaces, so the two never overlap).
        downloader.limiter.setJob(started.id, started.options.maxSpeed)
        let owner = JobOwner(started, worker: configuration.worker)
        let shared = store.sharesQueue
        let logger = self.logger
        // The transfer hands its outcome to the serial queue itself when it ends. A transfer
        // stopped by a command is handled by that command, and the queue finds it gone.
        // A command that waits for this worker, heard in a checkpoint's answer.
        let heard: @Sendable () async -> Void = { [weak self] in await self?.changesSoon() }
        let task = Task { [weak self] in
            let result = await downloader.run(request, progress: progress) { checkpoint in
                let answer: CheckpointAnswer
                do {
                    let write = { @Sendable in
                        try await store.checkpoint(
                            id, received: checkpoint.received, size: checkpoint.size, validators: checkpoint.validators,
                            finalURL: checkpoint.finalURL, segments: checkpoint.segments, now: Date(), owner: owner)
                    }
                    // A shared table may be away (its pool waits up to a minute): a stop
                    // (the fence) must not wait for the checkpoint.
                    answer = shared ? try await Self.abandonedOnCancel(write) : try await write()
                } catch  where shared {
                    // A shared table that cannot be reached: the transfer goes on (its lease
                    // holds for a while, see `fence`) and the next checkpoint commits.
                    logger.warning("checkpoint not written; the transfer goes on", metadata: ["job": "\(id)", "error": "\(error)"])
                    return
                }
                // Written only while the job is still this attempt's: else the transfer ends.
                guard answer.written else { throw TransferFailure(.transient(.retry), .leaseLost, "job \(id) is no longer this worker's") }
                // A command waits for this worker (one whose signal was missed is heard here).
                if answer.stopRequest != nil { await heard() }
            }
            downloader.limiter.setJob(id, nil)
            await self?.transferEnded(id, attempt: attempt, result: result)
            return result
        }
        scheduling.started(
            started, transfer: Transfer(progress: progress, task: task), host: host ?? URLRules.hostKey(started.url), attempt: attempt)
        transfersRun()
    }

    /// A light transfer's answer told its size (`remaining` bytes left, nil when unknown, with
    /// `received` on disk): it stays light, takes a free bulk slot, or is parked (false: it
    /// stops before writing and goes back to the queue). A light slot freed by a transfer
    /// that moved to the bulk lane is filled at once.
    func admit(_ id: JobID, attempt: UInt64, remaining: Int64?, received: Int64) -> Bool {
        switch scheduling.admit(id, attempt: attempt, remaining: remaining, received: received) {
        case nil, .light:
            return true
        case .bulk:
            if !startFromReady(group: running[id]?.job.groupID) { scheduleTurn() }
            return true
        case .park:
            logger.debug(
                "parked until a bulk slot is free", metadata: ["job": "\(id)", "remaining": "\(remaining.map(String.init) ?? "unknown")"])
            return false
        }
    }

    /// A turn that fills free slots, soon (a slot freed outside of a turn).
    func scheduleTurn() {
        guard !refillScheduled else { return }
        refillScheduled = true
        // A hop, not a loop: one turn once the caller's section of the queue is over.
        Task { [weak self] in await self?.refill() }
    }

    private func refill() async {
        do {
            try await serial(turn: true) { () async throws(DLError) in
                refillScheduled = false
                try await schedule()
                try await flush()
            }
        } catch {
            logger.error("could not start queued jobs", metadata: ["error": "\(error)"])
        }
    }

    /// The `~/.netrc` entries as the file is now: read again only when its size, times or
    /// inode changed (a `stat`), not for each of thousands of small transfers.
    func currentNetrc() -> [NetrcEntry] {
        guard let path = configuration.netrcPath else { return [] }
        var info = stat()
        guard stat(path, &info) == 0 else {
            netrcCache = nil
            return []
        }
        let key = [
            Int(info.st_ino), Int(info.st_size), info.st_mtim.tv_sec, info.st_mtim.tv_nsec, info.st_ctim.tv_sec, info.st_ctim.tv_nsec,
        ]
        if let cached = netrcCache, cached.key == key { return cached.entries }
        guard let text = try? String(contentsOfFile: path, encoding: .utf8) else { return [] }
        let entries = Netrc.parse(text)
        netrcCache = (key, entries)
        return entries
    }

    /// Buffers the outcome; one turn of the queue records every outcome buffered by then.
    /// The slot of a standalone transfer that ended on its own goes to the next ready job at
    /// once.
    func transferEnded(_ id: JobID, attempt: UInt64, result: TransferResult) {
        ended.append((id, attempt, result))
        let slot = scheduling.ended(id, attempt: attempt)
        if slot.free { _ = startFromReady(group: slot.group) }
        guard !drainScheduled else { return }
        drainScheduled = true
        // A hop, not a loop: one turn for every outcome buffered by the time it runs.
        Task { [weak self] in await self?.drainEnded() }
    }

    /// Starts the first ready job (`ready`) whose host has room, if a standalone slot is free
    /// counting the transfers that ended but wait for the queue, without waiting for the next
    /// turn, which commits its claim (`TurnClaim.started`). With `group`, the first ready member
    /// of that group (which holds a slot), if one of its `group_parallel` places is free. Only
    /// while the queue runs as usual: not paused, not shutting down, not on a metered
    /// connection (whose jobs may have to wait), not on a table other workers share.
    func startFromReady(group: GroupID? = nil) -> Bool {
        let open = accepting && configuration.queuePausedReason == nil && !connectionMetered && !store.sharesQueue
        guard let job = scheduling.handOff(group: group, open: open, worker: configuration.worker, lease: configuration.lease, now: now())
        else { return false }
        startTransfers([job])
        return true
    }

    private func drainEnded() async {
        do {
            try await serial(turn: true) { () async throws(DLError) in
                drainScheduled = false
                let batch = ended
                ended = []
                var finished = 0
                for (id, attempt, result) in batch {
                    guard let entry = scheduling.settle(id, attempt: attempt) else { continue }
                    record(result, for: entry.job, parked: entry.parked || entry.progress.waitedForConnection)
                    finished += 1
                }
                guard finished > 0 || !scheduling.startedEarly.isEmpty else { return }
                try await schedule()
                if deferStartedClaims() { return }
                try await flush()
            }
        } catch {
            logger.error("could not record the end of transfers", metadata: ["error": "\(error)"])
        }
    }

    /// Whether this turn may leave its commit to a later one: it has nothing to write but the
    /// claims of jobs started from the ready lists, and the lists still hold a job for every
    /// slot, so the next ends need no turn either. The claims then wait for the next commit (any
    /// turn that writes, and every section of `serial` that is not a turn, commits them first),
    /// for the publisher (a completion is written after its claim), or for `claimDelay`,
    /// whichever comes first; a small file's slot then costs no transaction of its own
    /// (docs/benchmarks.md, "What was tried": a turn that only commits claims is left out).
    func deferStartedClaims() -> Bool {
        switch scheduling.deferClaims() {
        case .commitNow: return false
        case .wait: return true
        case .arm:
            // One timer, armed only while transfers end (many times a second in a run of small
            // files: a task is cheaper there than a ring of a loop), and cancelled by shutdown.
            claimFlushTask = Task { [weak self] in
                try? await Task.sleep(for: Self.claimDelay)
                guard !Task.isCancelled else { return }
                await self?.commitDeferredClaims()
            }
            return true
        }
    }

    /// Claims of jobs started from the ready lists wait at most this long for a commit: far
    /// below the first checkpoint of a transfer (`CheckpointPolicy.minInterval`), which is
    /// written only while the job is this worker's `running` job.
    static let claimDelay: Duration = .milliseconds(20)

    private func commitDeferredClaims() async {
        do {
            try await serial(turn: true) { () async throws(DLError) in
                claimFlushTask = nil
                guard scheduling.claimTimerFired() else { return }
                try await schedule()
                try await flush()
            }
        } catch {
            logger.error("could not record the start of transfers", metadata: ["error": "\(error)"])
        }
    }

    /// Records what a transfer reported into this turn's changes. `started` is the row as it
    /// was committed when the transfer began; the checkpoint carries everything since.
    func record(_ result: TransferResult, for started: Job, parked: Bool = false) {
        var job = started
        pending.owned.insert(started.id)
        if parked {
            // Parked for a bulk slot (`admit`): not an attempt. It waits in the queue with its
            // size known, and is claimed again when a bulk slot is free.
            job.attempts = max(0, job.attempts - 1)
        }
        switch result {
        case .downloaded(let checkpoint):
            apply(checkpoint, to: &job, startedAt: started.received)
            enqueuePublish(
                PublishItem(
                    job: job, partialPath: started.partialPath, checkpoint: checkpoint, committed: started.received,
                    committedSegments: started.segments))
        case .stopped(let checkpoint):
            apply(checkpoint, to: &job, startedAt: started.received)
            job.state = .queued
            job.updatedAt = now()
            pending.saves.append(job)
        case .failed(let failure, let checkpoint):
            apply(checkpoint, to: &job, startedAt: started.received)
            fail(job, failure)
        }
    }

    /// A failed attempt: waiting (with backoff) or failed, by the failure's kind.
    func fail(_ job: Job, _ failure: TransferFailure) {
        var job = job
        if failure.kind == .transient(.diskSpace) {
            // A full disk is not the server's fault: it does not use up the retry budget.
            job.attempts = max(0, job.attempts - 1)
        }
        if failedOffline(failure) {
            // Nor is a machine without a network: the job waits until a route comes back.
            job.attempts = max(0, job.attempts - 1)
            logger.notice("waiting for the network", metadata: ["job": "\(job.id)", "error": "\(failure.error.message)"])
            do throws(DLError) {
                try transition(job, .wait(.network, failure.error, until: now().addingTimeInterval(Self.offlineRecheck)))
            } catch {
                logger.error("could not record a failed attempt", metadata: ["job": "\(job.id)", "error": "\(error.message)"])
            }
            return
        }
        let sinceProgress = now().timeIntervalSince(job.progressAt ?? job.createdAt)
        let decision = RetryDecision.decide(
            failure, attempts: job.attempts, sinceProgress: sinceProgress, policy: configuration.backoff,
            now: now(), unit: Double.random(in: 0..<1))
        do throws(DLError) {
            switch decision {
            case .wait(let reason, let until):
                logger.notice(
                    "waiting", metadata: ["job": "\(job.id)", "reason": "\(reason.rawValue)", "error": "\(failure.error.message)"])
                try transition(job, .wait(reason, failure.error, until: until))
            case .fail(let error):
                logger.notice("failed", metadata: ["job": "\(job.id)", "code": "\(error.code)", "error": "\(error.message)"])
                let failed = try transition(job, .fail(error))
                if failed.groupID == nil {
                    pending.notices.append(
                        FinishedNotice(
                            jobID: failed.id, group: nil, path: failed.path, url: failed.url, state: "failed", error: failed.error))
                }
            }
        } catch {
            logger.error("could not record a failed attempt", metadata: ["job": "\(job.id)", "error": "\(error.message)"])
        }
    }

    /// Stops a running transfer for a command, waits for it, and returns its row with the
    /// transfer's last synced checkpoint applied (still `running`: the command decides what it
    /// becomes). Nil when no transfer of that job runs.
    func stopTransfer(_ id: JobID, intent: StopIntent) async -> Job? {
        guard var entry = running[id] else { return nil }
        entry.stop = max(entry.stop ?? intent, intent)
        running[id] = entry
        entry.task.cancel()
        let result = await entry.task.value
        running[id] = nil
        var job = entry.job
        switch result {
        case .stopped(let checkpoint), .failed(_, let checkpoint):
            apply(checkpoint, to: &job, startedAt: entry.job.received)
        case .downloaded(var checkpoint):
            // It finished just before it could be stopped. Its bytes are kept only once synced.
            if intent == .pause || intent == .shutdown, await Publisher.syncAll([entry.job.partialPath]).isEmpty {
                checkpoint.publishTarget = nil
            } else {
                checkpoint.received = entry.job.received
                checkpoint.segments = entry.job.segments
            }
            apply(checkpoint, to: &job, startedAt: entry.job.received)
        }
        return job
    }

    /// Records a transfer's checkpoint in the row. `startedAt` is the offset the attempt
    /// began from.
    func apply(_ checkpoint: TransferCheckpoint, to job: inout Job, startedAt: Int64) {
        // Progress resets the retry budget: an attempt that moved bytes counts as the first.
        if checkpoint.received > startedAt {
            job.attempts = 1
            job.progressAt = now()
        }
        job.received = checkpoint.received
        // The attempt's bytes are synced now (every outcome's are): nothing unsynced is left.
        job.unsynced = nil
        if let startedOver = checkpoint.startedOver { job.error = startedOver }
        job.segments = checkpoint.segments
        job.size = checkpoint.size
        job.validators = checkpoint.validators
        if let finalURL = checkpoint.finalURL { job.finalURL = finalURL }
        if let sha256 = checkpoint.sha256 { job.sha256 = sha256 }
        if let digest = checkpoint.digest { job.digest = digest }
        // A job without mirrors gets some when its server named other copies (RFC 6249).
        if let mirrors = checkpoint.mirrors, !job.mirrors.isEmpty || !mirrors.mirrors.isEmpty {
            job.mirrors = mirrors.mirrors
            job.urlDropped = mirrors.urlDropped
        }
        // And the SHA-256 its server announced (RFC 3230 `Digest`), when it has no checksum.
        if job.checksum == nil, let announced = checkpoint.announcedChecksum { job.checksum = announced }
    }

    // MARK: Waiting jobs

    /// Sets the earliest `next_attempt_at` for the wake-up loop (`Engine+Loops`), which then
    /// requeues what is due. Asks the table only when a job may have started or stopped
    /// waiting since it last asked.
    func armWakeUp() async throws(DLError) {
        guard wakeMayHaveChanged else { return }
        wakeMayHaveChanged = false
        let next = try await storage { try await store.nextWakeUp() }
        guard next != wakeAt else { return }
        wakeAt = next
        bells.wake.ring()
    }

    func wake() async {
        do {
            try await serial { () async throws(DLError) in
                wakeAt = nil
                wakeMayHaveChanged = true
                guard accepting else { return }
                _ = try await storage { try await store.requeueDue(now: now()) }
                try await schedule()
                try await flush()
            }
        } catch {
            logger.error("could not requeue waiting jobs", metadata: ["error": "\(error)"])
        }
    }
}
