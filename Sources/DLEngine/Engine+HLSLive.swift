import DLCore
import DLJobTable
import DLTransfer
import Foundation
import Logging

/// Live HLS recording (`live: true`): the group is created with the segments the playlist has
/// at enqueue; a recording task per group then reloads the media playlist every target
/// duration (`HLSLivePolicy`) and adds the segments it has not seen (by media sequence
/// number) as new members, with the recipe, in one transaction (`JobTable.extendGroup`).
/// While the recipe is open (`HLSRecipe.live`) the group is never published; once the
/// playlist has `EXT-X-ENDLIST` (or the policy gives up) the recipe is closed and the group
/// publishes as a VOD one does. `cancel` stops it and publishes the segments fetched already.
/// A restart resumes the reloads of every open recipe (`start`).
extension Engine {
    /// How the members of a recording are fetched: its enqueue's headers and options.
    struct LiveSource: Sendable {
        var headers: [HeaderField]
        var overwrite: Bool
        var options: JobOptions
    }

    /// What one reload did to the recipe.
    enum ReloadResult: Sendable, Equatable {
        case grew, unchanged
        /// The recipe is closed (its end tag), or the recording is no longer this engine's
        /// (canceled, removed, shutting down): the task ends.
        case over
    }

    /// Starts the reloads of a group (once).
    func startRecording(_ groupID: GroupID, targetDuration: Int, source: LiveSource) {
        guard liveRecordings[groupID] == nil else { return }
        logger.info("HLS live recording", metadata: ["group": "\(groupID)", "target_duration": "\(targetDuration)"])
        liveRecordings[groupID] = Task { await self.record(groupID, targetDuration: targetDuration, source: source) }
    }

    /// Stops every recording without closing its recipe (shutdown: the next start resumes them).
    func stopRecordings() {
        for task in liveRecordings.values { task.cancel() }
        liveRecordings = [:]
    }

    /// Starts the recordings of the open groups whose recipe is open (start-up).
    func resumeRecording(_ group: JobGroup) async throws(DLError) {
        guard let recipe = try await storage({ try await store.hlsRecipe(of: group.id) }).flatMap(HLSRecipe.decode),
            recipe.live != nil
        else { return }
        let first = try await storage { try await store.members(of: group.id) }.first
        startRecording(
            group.id, targetDuration: recipe.targetDuration,
            source: LiveSource(headers: first?.headers ?? [], overwrite: first?.overwrite ?? false, options: first?.options ?? JobOptions())
        )
    }

    /// The reload loop of one recording.
    func record(_ groupID: GroupID, targetDuration: Int, source: LiveSource) async {
        var policy = HLSLivePolicy(targetDuration: targetDuration, start: now())
        var next = policy.first(at: now())
        while case .reload(let at) = next {
            let wait = at.timeIntervalSince(now())
            if wait > 0 { try? await Task.sleep(for: .milliseconds(Int64(wait * 1000))) }
            if Task.isCancelled || liveRecordings[groupID] == nil { return }
            let recipe: HLSRecipe?
            do throws(DLError) {
                recipe = try await storage { try await store.hlsRecipe(of: groupID) }.flatMap(HLSRecipe.decode)
            } catch {
                logger.warning("HLS live: the recipe cannot be read", metadata: ["group": "\(groupID)", "error": "\(error.message)"])
                next = policy.next(after: .failed, at: now())
                continue
            }
            guard let live = recipe?.live else {
                finishRecording(groupID)
                return
            }
            var request = TransferRequest(
                jobID: 0, url: live.url, headers: source.headers, path: "", overwrite: false, offset: 0, size: nil,
                validators: Validators())
            request.options = source.options
            request.netrc = currentNetrc()
            var outcome = HLSLivePolicy.Outcome.failed
            var duration: Int?
            do throws(DLError) {
                guard case .media(let media) = try await fetchPlaylist(request) else {
                    throw DLError(.hlsInvalid, "the live playlist became a master playlist")
                }
                if Task.isCancelled { return }
                duration = media.targetDuration
                switch try await addReload(groupID, media, source: source) {
                case .grew: outcome = .grew
                case .unchanged: outcome = .unchanged
                case .over: return
                }
            } catch {
                logger.warning("HLS live: a reload failed", metadata: ["group": "\(groupID)", "error": "\(error.message)"])
            }
            next = policy.next(after: outcome, at: now(), targetDuration: duration)
        }
        if case .stop(let reason) = next {
            logger.notice("HLS live recording ends", metadata: ["group": "\(groupID)", "reason": "\(reason)"])
            do throws(DLError) {
                try await closeRecording(groupID)
            } catch {
                logger.warning("HLS live: the recipe cannot be closed", metadata: ["group": "\(groupID)", "error": "\(error.message)"])
            }
        }
    }

    /// The task of a recording ended by itself.
    private func finishRecording(_ groupID: GroupID) {
        liveRecordings[groupID] = nil
    }

    /// One reload's segments into the group, under the serial gate.
    func addReload(_ groupID: GroupID, _ media: HLSMedia, source: LiveSource) async throws(DLError) -> ReloadResult {
        try await serial { () async throws(DLError) -> ReloadResult in
            guard liveRecordings[groupID] != nil, !Task.isCancelled else { return .over }
            guard let group = try await storage({ try await store.fetchGroup(groupID) }), group.closed == nil,
                var recipe = try await storage({ try await store.hlsRecipe(of: groupID) }).flatMap(HLSRecipe.decode), recipe.live != nil
            else {
                finishRecording(groupID)
                return .over
            }
            let before = recipe
            let added = recipe.reloaded(media)
            guard recipe != before else { return .unchanged }
            let grew = recipe.segments.count > before.segments.count
            try await extend(group, recipe: recipe, added: recipe.members[added], source: source)
            if recipe.live == nil {
                finishRecording(groupID)
                logger.info("HLS live recording reached its end tag", metadata: ["group": "\(groupID)"])
                try await settle(groupID)
                try await flush()
                return .over
            }
            return grew ? .grew : .unchanged
        }
    }

    /// Writes the recipe and its new members; a group closed meanwhile takes nothing.
    private func extend(_ group: JobGroup, recipe: HLSRecipe, added: ArraySlice<HLSRecipe.Member>, source: LiveSource)
        async throws(DLError)
    {
        if !added.isEmpty {
            let unfinished = try await storage { try await store.unfinishedCount() }
            guard unfinished + added.count <= configuration.maxQueued else {
                throw DLError(
                    .queueFull, "\(unfinished) jobs are unfinished and the limit is \(configuration.maxQueued) (max_queued)")
            }
        }
        var news: [NewJob] = []
        news.reserveCapacity(added.count)
        for member in added {
            var new = NewJob(
                url: member.url, path: group.dir + "/" + member.name, priority: group.priority, headers: source.headers,
                overwrite: source.overwrite, state: .queued)
            new.options = source.options
            news.append(new)
        }
        let text = recipe.encoded()
        guard let jobs = try await storage({ try await store.extendGroup(group, members: news, hls: text, now: now()) }) else {
            finishRecording(group.id)
            return
        }
        if !jobs.isEmpty {
            logger.info("HLS live: segments added", metadata: ["group": "\(group.id)", "members": "\(jobs.count)"])
        }
        try await schedule()
        try await flush()
    }

    /// Closes the recipe as it is (the reload policy gave up): the members added stay, and the
    /// group publishes once they are complete.
    func closeRecording(_ groupID: GroupID) async throws(DLError) {
        try await serial { () async throws(DLError) in
            finishRecording(groupID)
            guard let group = try await storage({ try await store.fetchGroup(groupID) }), group.closed == nil,
                var recipe = try await storage({ try await store.hlsRecipe(of: groupID) }).flatMap(HLSRecipe.decode), recipe.live != nil
            else { return }
            recipe.live = nil
            _ = try await storage { try await store.extendGroup(group, members: [], hls: recipe.encoded(), now: now()) }
            try await settle(groupID)
            try await schedule()
            try await flush()
        }
    }

    /// `cancel` of a recording group, after its unfinished members were canceled: the
    /// recipe is closed with the segments whose members completed, and the group publishes
    /// them (or, with none, is canceled as any group). Runs inside `serial`.
    func publishStoppedRecording(_ group: JobGroup, _ recipe: HLSRecipe) async throws(DLError) -> Bool {
        liveRecordings.removeValue(forKey: group.id)?.cancel()
        await linksSettled()
        let members = try await storage { try await store.members(of: group.id) }
        let completed = members.filter { $0.state == .completed }
        let names = Set(completed.map { ($0.path as NSString).lastPathComponent })
        let complete = Set(recipe.members.indices.filter { names.contains(recipe.members[$0].name) })
        let stopped = recipe.stopped(complete: complete)
        guard !stopped.segments.isEmpty else { return false }
        let text = stopped.encoded()
        guard try await storage({ try await store.extendGroup(group, members: [], hls: text, now: now()) }) != nil else { return false }
        activeGroups.remove(group.id)
        var closed = group
        closed.hls = text
        logger.info(
            "HLS live recording canceled: publishing what was fetched",
            metadata: ["group": "\(group.id)", "segments": "\(stopped.segments.count)", "of": "\(recipe.segments.count)"])
        try await publishHLS(closed, members: completed)
        return true
    }
}
