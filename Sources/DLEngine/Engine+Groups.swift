import DLCore
import DLJobTable
import DLTransfer
import Foundation
import Logging

/// Groups: files that are complete only together. A group holds one slot; its members stage
/// in a hidden folder and are published together.
extension Engine {
    /// Looks at an active group after a change: fills its slot (up to `groupParallel` big
    /// members, small ones beside them as in the light lane, and the host limit), gives the slot back when nothing of it can run, and publishes it
    /// when every member is complete. While members run here a turn only claims more; else it
    /// reads the group and its counts by state (an index range); members are claimed as
    /// standalone jobs are; all members are read only to publish them.
    func settle(_ groupID: GroupID) async throws(DLError) {
        let active = activeGroups.contains(groupID)
        let busy = scheduling.busy(group: groupID)
        // Members follow the lanes inside the slot: `groupParallel` big ones, small ones beside.
        let free = scheduling.lanes(groupID).free(bulk: scheduling.bulkTaken(group: groupID), light: scheduling.lightTaken(group: groupID))
        var want = active && configuration.queuePausedReason == nil ? free : 0
        if busy > 0 {
            // Members of it run here, so it is open and not finished: a turn only refills its
            // places, from its ready members first, without reading the group (a claim finds
            // no member when none is queued). Members held for a metered connection may leave
            // it nothing to run: look again.
            while want > 0, startFromReady(group: groupID) { want -= 1 }
            if want > 0, try await claim(want, group: groupID) > 0 { try await settle(groupID) }
            return
        }
        let (found, counts) = try await storage { try await store.groupTurn(groupID) }
        guard let group = found, group.closed == nil else {
            activeGroups.remove(groupID)
            return
        }
        if counts[.queued, default: 0] > 0 || counts[.running, default: 0] > 0 || busy > 0 {
            // Members held for a metered connection may leave it nothing to run: look again.
            if want > 0, counts[.queued, default: 0] > 0, try await claim(want, group: groupID) > 0 { try await settle(groupID) }
            return
        }
        activeGroups.remove(groupID)
        let total = counts.values.reduce(0, +)
        if group.error == nil, total > 0, counts[.completed, default: 0] == total {
            // A live HLS recording is not published while it records: more segments come.
            if liveRecordings[groupID] != nil { return }
            let members = try await storage { try await store.members(of: groupID) }
            try await publish(group, members: members)
        } else if counts[.failed, default: 0] > 0 {
            let failed = try await storage { try await store.firstFailedMember(of: groupID) }
            logger.notice("group failed", metadata: ["group": "\(groupID)", "member": "\(failed?.id ?? 0)"])
            pending.notices.append(
                FinishedNotice(
                    jobID: nil, group: group, path: group.dir, url: "", state: "failed",
                    error: failed.flatMap { member in
                        member.error.map { JobError(code: $0.code, message: "member \(member.id) (\(member.name)): \($0.message)") }
                    }))
        }
    }

    /// Publishes a complete group: records it completed (members and group in one
    /// transaction), then moves it from its staging folder into its folder. A folder that does
    /// not exist yet appears whole, in one rename; into an existing folder the files move one by
    /// one, after checking that none would replace a file that is there. Recorded first, so that
    /// the folder never shows files of a group that is not completed; start-up finishes a move
    /// that a crash interrupted (`finishGroupMoves`).
    func publish(_ group: JobGroup, members: [Job]) async throws(DLError) {
        // An HLS download is joined (or gets its local playlist), not moved.
        let withRecipe = try await recipeRead(group)
        if withRecipe.hls != nil {
            try await publishHLS(withRecipe, members: members)
            return
        }
        // Its last members may be recorded completed and not yet linked into the staging folder.
        await linksSettled()
        var group = group
        let fm = FileManager.default
        let alreadyMoved = !fm.fileExists(atPath: group.staging) && members.allSatisfy { fm.fileExists(atPath: $0.path) }
        if !alreadyMoved, fm.fileExists(atPath: group.dir),
            let clash = members.first(where: { !$0.overwrite && fm.fileExists(atPath: $0.path) })
        {
            group.error = JobError(
                code: .destinationExists,
                message: "\(clash.path) exists already; the group stays staged in \(group.staging)")
            group.updatedAt = now()
            try await storage { try await store.saveGroup(group) }
            logger.warning("group not published", metadata: ["group": "\(group.id)", "error": "\(group.error?.message ?? "")"])
            pending.notices.append(FinishedNotice(jobID: nil, group: group, path: group.dir, url: "", state: "failed", error: group.error))
            return
        }
        try await recordCompleted(&group, members: members) { recorded in
            if !alreadyMoved { moveIntoPlace(recorded, members: members) }
        }
        logger.info("group completed", metadata: ["group": "\(group.id)", "files": "\(members.count)", "dir": "\(group.dir)"])
        pending.notices.append(FinishedNotice(jobID: nil, group: group, path: group.dir, url: "", state: "completed", error: nil))
    }

    /// Records a group completed, its members out of staging (each at `path` when given: an
    /// HLS file is every member's), in one transaction; then runs `place` (the move into the
    /// folder) before the events go out, so that a client told "completed" finds the files.
    func recordCompleted(_ group: inout JobGroup, members: [Job], path: String? = nil, then place: (JobGroup) -> Void)
        async throws(DLError)
    {
        let published = members.map { member -> Job in
            var member = member
            member.stagingPath = nil
            if let path { member.path = path }
            member.updatedAt = now()
            return member
        }
        group.closed = .completed
        group.error = nil
        group.updatedAt = now()
        group.finishedAt = now()
        store.holdEvents()
        let events: [StoredEvent]
        do throws(DLError) {
            let saved = group
            events = try await storage { try await store.saveGroup(saved, members: published, publish: false) }
        } catch {
            store.publishEvents([])
            throw error
        }
        place(group)
        store.publishEvents(events)
    }

    /// The move of a recorded group: the staging folder renamed to the group's folder, or, when
    /// that folder exists, each staged file renamed into it (a file that appeared there in the
    /// meantime is not replaced: the member's file stays staged and the log says so).
    func moveIntoPlace(_ group: JobGroup, members: [Job]) {
        let fm = FileManager.default
        if !fm.fileExists(atPath: group.dir), rename(group.staging, group.dir) == 0 {
            PartialFile.syncDirectory(of: group.dir)
            return
        }
        var kept = false
        for member in members {
            let staged = member.stagingPath ?? JobGroup.stagedPath(of: member.path, dir: group.dir, staging: group.staging)
            guard fm.fileExists(atPath: staged) else { continue }
            let folder = (member.path as NSString).deletingLastPathComponent
            try? PartialFile.makeFolders(folder)
            do throws(TransferFailure) {
                try PartialFile.link(staged, to: member.path, overwrite: member.overwrite)
            } catch {
                kept = true
                logger.warning(
                    "a member's file stays staged",
                    metadata: ["group": "\(group.id)", "path": "\(staged)", "error": "\(error.error.message)"])
            }
        }
        Publisher.syncFolders(of: members.map(\.path))
        if !kept { removeStaging(group) }
    }

    /// Deletes a group's staging folder: it holds only dld's own partial and staged files.
    func removeStaging(_ group: JobGroup) {
        guard group.staging.contains(".dld-staging-") else { return }
        try? FileManager.default.removeItem(atPath: group.staging)
    }

    /// A group by id or name (the newest of that name).
    func resolve(_ reference: GroupReference) async throws(DLError) -> JobGroup {
        switch reference {
        case .id(let id):
            guard let group = try await storage({ try await store.fetchGroup(id) }) else {
                throw DLError(.groupNotFound, "no group with id \(id)")
            }
            return group
        case .name(let name):
            guard let group = try await storage({ try await store.fetchGroups(named: name) }).first else {
                throw DLError(.groupNotFound, "no group named \(name)")
            }
            return group
        }
    }

    // MARK: Groups

    /// One member of a group to create (the name tests and older callers know).
    public typealias MemberSpec = GroupMemberSpec

    /// Creates a group and its members in one transaction; with `hls`, an HLS download whose
    /// `dir` is the file (or folder) it is published as, and whose recipe is written with the
    /// group's row.
    public func enqueueGroup(
        name: String, dir: String, priority: Int, headers: [HeaderField], overwrite: Bool, paused: Bool,
        options: JobOptions = JobOptions(), members: [MemberSpec], hls: HLSRecipe? = nil, key: String? = nil
    ) async throws(DLError) -> (JobGroup, [Job]) {
        try await serial { () async throws(DLError) in
            try requireAccepting()
            guard dir.hasPrefix("/") else { throw .invalidParams("group \"dir\" must be absolute, got \(dir)") }
            let unfinished = try await storage { try await store.unfinishedCount() }
            guard unfinished + members.count <= configuration.maxQueued else {
                throw DLError(.queueFull, "\(unfinished) jobs are unfinished and the limit is \(configuration.maxQueued) (max_queued)")
            }
            let destination = Destination(downloadDir: configuration.downloadDir, policy: configuration.pathPolicy)
            let normalized = Destination.normalized(dir)
            let folder =
                try destination.resolvedFolder((normalized as NSString).deletingLastPathComponent)
                + "/" + (normalized as NSString).lastPathComponent
            var isDirectory: ObjCBool = false
            if let hls {
                // Published whole under its name: a folder never merges into one that exists,
                // and a file replaces one only with overwrite.
                if FileManager.default.fileExists(atPath: folder, isDirectory: &isDirectory),
                    hls.layout == .folder || isDirectory.boolValue || !overwrite
                {
                    throw DLError(
                        .destinationExists,
                        "\(folder) exists already" + (hls.layout == .file && !isDirectory.boolValue ? "; pass overwrite to replace it" : "")
                    )
                }
            } else if FileManager.default.fileExists(atPath: folder, isDirectory: &isDirectory), !isDirectory.boolValue {
                throw DLError(.destinationInvalid, "\(folder) is a file, not a folder")
            }
            var seen: Set<String> = []
            var news: [NewJob] = []
            for (index, member) in members.enumerated() {
                do throws(DLError) {
                    _ = try URLRules.validate(member.url).get()
                    var relative = try RelativePath.validate(member.relativePath ?? FileNames.fromURL(member.url)).get()
                    // Encrypted members are published as `<name>.age`, like standalone jobs.
                    if options.isEncrypted { relative = AgeLayout.encryptedName(relative) }
                    guard seen.insert(relative).inserted else {
                        throw DLError(.destinationExists, "two members of the group are both named \(relative)")
                    }
                    let path = folder + "/" + relative
                    try destination.check(relative, in: folder)
                    if (path as NSString).lastPathComponent.lowercased().hasSuffix(".part") {
                        throw DLError(.destinationInvalid, "\(relative): names ending in .part are kept for partial files")
                    }
                    if !overwrite && FileManager.default.fileExists(atPath: path) {
                        throw DLError(.destinationExists, "\(path) exists already; pass overwrite to replace it")
                    }
                    var new = NewJob(
                        url: member.url, path: path, priority: priority, meta: member.meta, headers: headers,
                        overwrite: overwrite, state: paused ? .paused : .queued, checksum: member.checksum, expectedSize: member.size)
                    // The group's TLS settings and `insecure` are every member's.
                    new.options = options
                    new.mirrors = member.mirrors
                    new.pieces = member.pieces?.encoded
                    // A group's key is its first member's (`existingGroup(key:)` finds it).
                    if index == 0 { new.key = key }
                    news.append(new)
                } catch {
                    throw DLError(error.code, "jobs[\(index)]: \(error.message)")
                }
            }
            let (group, jobs) = try await storage {
                try await store.insertGroup(
                    name: name, dir: folder, priority: priority, members: news,
                    hls: hls.map { recipe in
                        var recipe = recipe
                        recipe.output = folder
                        return recipe.encoded()
                    }, now: now())
            }
            // Staged members keep their relative folders. Each new folder is made durable: its
            // members' files are committed there, and must not vanish with it in a power cut.
            for folder in Set(jobs.map { ($0.downloadPath as NSString).deletingLastPathComponent }) {
                try? PartialFile.makeFolders(folder)
            }
            logger.info("enqueued group", metadata: ["group": "\(group.id)", "members": "\(jobs.count)"])
            try await schedule()
            try await flush()
            return (group, jobs)
        }
    }

    /// The group whose first member has `key` (a Metalink's group enqueued with a key), with
    /// its members; nil when no job has the key.
    public func existingGroup(key: String) async throws(DLError) -> (JobGroup, [Job])? {
        guard let job = try await settledJob(key: key) else { return nil }
        guard let groupID = job.groupID else {
            throw DLError(.invalidParams, "key \(key.prefix(200)) is job \(job.id)'s, which is not in a group")
        }
        let group = try await recipeRead(try await resolve(.id(groupID)))
        let members = try await storage { try await store.members(of: group.id) }
        return (group, members)
    }

    /// The group, its summary and its members (those in `states`, when given).
    public func groupStatus(_ reference: GroupReference, states: [JobState]? = nil) async throws(DLError) -> (
        JobGroup, GroupSummary, JobViews
    ) {
        await linksSettled()
        let group = try await recipeRead(try await resolve(reference))
        let members = try await storage { try await store.members(of: group.id) }
        let summary = GroupSummary.summarize(group, members: members, active: activeGroups.contains(group.id))
        let wanted = states.map(Set.init)
        return (
            group, summary, views(wanted.map { wanted in members.filter { wanted.contains($0.state) } } ?? members)
        )
    }

    /// The id of the group a reference names.
    public func groupID(_ reference: GroupReference) async throws(DLError) -> GroupID {
        try await resolve(reference).id
    }

    // MARK: Events

    public func lastEventSeq() async throws(DLError) -> Int64 {
        try await storage { try await store.lastEventSeq() }
    }

    public func events(after seq: Int64) async throws(DLError) -> [StoredEvent] {
        try await storage { try await store.events(after: seq) }
    }

}
