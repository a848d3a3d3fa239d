import DLCore
import DLJobTable
import DLTransfer
import Foundation
import Logging

/// HLS downloads: a playlist becomes a group whose members are its segments, keys and init
/// sections (each distinct URL once), with its recipe stored on the group's row. The group
/// runs as any other (one slot, staging, resume, retries, host limits); only its publish
/// differs: the members are joined into one file (or get a local playlist) instead of moved.
extension Engine {
    /// How long fetching the playlists of one enqueue may take, in all.
    static let playlistTimeout: Duration = .seconds(60)

    /// Fetches the playlist (and, for a master, the chosen variant's), checks it, plans the
    /// recipe and creates the group. The network part runs before the serial gate is taken,
    /// so that a slow server holds up no other command.
    public func enqueueHLS(_ spec: EnqueueSpec) async throws(DLError) -> (JobGroup, [Job]) {
        try requireAccepting()
        var request = TransferRequest(
            jobID: 0, url: spec.url, headers: spec.headers, path: "", overwrite: false, offset: 0, size: nil, validators: Validators())
        request.options = JobOptions(insecure: spec.insecure, tls: spec.tls)
        request.netrc = currentNetrc()
        let fetch = { (request: TransferRequest) async throws(DLError) -> HLSPlaylist in try await self.fetchPlaylist(request) }
        var variant: HLSVariant?
        var variantIndex: Int?
        var media: HLSMedia
        var mediaURL = spec.url
        switch try await fetch(request) {
        case .media(let found):
            media = found
        case .master(let master):
            let index = try spec.hls.variant.choose(from: master.variants).get()
            let chosen = master.variants[index]
            if let audio = chosen.audio, master.separateAudioGroups.contains(audio) {
                throw DLError(
                    .hlsUnsupported,
                    "variant \(index) plays with audio served apart from it (EXT-X-MEDIA group \(audio.prefix(100))), which dld cannot join into one file"
                )
            }
            var second = request
            second.url = chosen.url
            guard case .media(let found) = try await fetch(second) else {
                throw DLError(.hlsInvalid, "variant \(index) of the master playlist is a master playlist itself")
            }
            media = found
            mediaURL = chosen.url
            variant = chosen
            variantIndex = index
        }
        guard media.endList || spec.hls.live else {
            throw DLError(
                .hlsLive,
                "the playlist has no EXT-X-ENDLIST: it is live (still growing); pass live: true (dlctl enqueue --live) to record it until its end tag"
            )
        }
        let recipe = try HLSRecipe.plan(
            media, layout: spec.hls.layout, variant: variant, variantIndex: variantIndex, liveURL: spec.hls.live ? mediaURL : nil
        ).get()
        let output: String
        if let path = spec.path {
            output = path
        } else {
            let folder = spec.dir ?? configuration.downloadDir
            var name = spec.name ?? FileNames.fromURL(spec.url)
            if spec.name == nil {
                if name.lowercased().hasSuffix(".m3u8") { name = String(name.dropLast(5)) }
                if name.isEmpty { name = "video" }
                if spec.hls.layout == .file { name += "." + recipe.container }
            }
            output = folder + "/" + name
        }
        let name = (output as NSString).lastPathComponent
        var members: [MemberSpec] = []
        members.reserveCapacity(recipe.members.count)
        for member in recipe.members {
            var spec = MemberSpec(url: member.url)
            spec.relativePath = member.name
            members.append(spec)
        }
        var options = JobOptions(insecure: spec.insecure, tls: spec.tls, segments: spec.segments, metered: spec.metered)
        options.encryptTo = nil
        logger.info(
            "HLS playlist read",
            metadata: [
                "url": "\(URLRules.redacted(spec.url))", "segments": "\(recipe.segments.count)", "members": "\(recipe.members.count)",
                "variant": "\(variantIndex.map(String.init) ?? "-")",
            ])
        let created = try await enqueueGroup(
            name: name, dir: output, priority: spec.priority, headers: spec.headers, overwrite: spec.overwrite, paused: spec.paused,
            options: options, members: members, hls: recipe)
        if recipe.live != nil {
            startRecording(
                created.0.id, targetDuration: recipe.targetDuration,
                source: LiveSource(headers: spec.headers, overwrite: spec.overwrite, options: options))
        }
        return created
    }

    /// Fetches and reads one playlist (at most `HLSLimits.maxPlaylistBytes`, within
    /// `playlistTimeout`), with the request's headers and TLS settings.
    func fetchPlaylist(_ request: TransferRequest) async throws(DLError) -> HLSPlaylist {
        switch await downloader.fetchSmall(request, maxBytes: HLSLimits.maxPlaylistBytes, timeout: Self.playlistTimeout) {
        case .failure(let failure):
            throw DLError(.hlsFetchFailed, "the playlist could not be fetched: \(failure.error.message)")
        case .success(let document):
            return try HLSParser.parse(document.body, base: document.finalURL).get()
        }
    }

    /// The group with its HLS recipe read (one indexed read; nil `hls` for other groups).
    func recipeRead(_ group: JobGroup) async throws(DLError) -> JobGroup {
        guard group.hls == nil else { return group }
        var group = group
        group.hls = try await storage { try await store.hlsRecipe(of: group.id) }
        return group
    }

    // MARK: Publishing

    /// The file of the file layout while it is built: inside the staging folder, so that it
    /// goes with it and never shows under the group's name half-written.
    static func builtPath(_ group: JobGroup) -> String { group.staging + "/.dld-hls-output" }

    /// Publishes a complete HLS group: builds the result inside the staging folder (the joined
    /// file, synced; or the local playlist), records the group completed, then renames it into
    /// place and syncs the folder. Built before it is recorded, so that a crash after the
    /// commit finds the result whole in the staging folder and start-up only renames it
    /// (`finishHLS`); a crash before the commit leaves an open group that is built again.
    func publishHLS(_ group: JobGroup, members: [Job]) async throws(DLError) {
        await linksSettled()
        var group = group
        guard let recipe = group.hls.flatMap(HLSRecipe.decode) else {
            try await failPublish(&group, JobError(code: .hlsAssembly, message: "the group's HLS recipe cannot be read"))
            return
        }
        if recipe.live != nil {
            // Still recording: more segments are to come (`Engine+HLSLive` settles it again
            // once the recipe is closed).
            logger.debug("HLS group still recording", metadata: ["group": "\(group.id)"])
            return
        }
        let overwrite = members.first?.overwrite ?? false
        if FileManager.default.fileExists(atPath: group.dir), recipe.layout == .folder || !overwrite {
            try await failPublish(
                &group,
                JobError(code: .destinationExists, message: "\(group.dir) exists already; the segments stay staged in \(group.staging)"))
            return
        }
        do throws(TransferFailure) {
            try await Self.build(group, recipe)
        } catch {
            try await failPublish(&group, error.error)
            return
        }
        let output = group.dir
        // The file layout's members are the joined file: `remove` with delete_file deletes it,
        // and start-up finds it where the member says.
        try await recordCompleted(&group, members: members, path: recipe.layout == .file ? output : nil) { recorded in
            finishHLS(recorded, recipe: recipe, overwrite: overwrite)
        }
        logger.info(
            "HLS download completed",
            metadata: ["group": "\(group.id)", "segments": "\(recipe.segments.count)", "path": "\(output)"])
        pending.notices.append(FinishedNotice(jobID: nil, group: group, path: output, url: "", state: "completed", error: nil))
    }

    /// Builds the result in the staging folder, off the actor (a video is read and written whole).
    static func build(_ group: JobGroup, _ recipe: HLSRecipe) async throws(TransferFailure) {
        let staging = group.staging
        let built = builtPath(group)
        let result: Result<Void, TransferFailure> = await Task.detached {
            do throws(TransferFailure) {
                switch recipe.layout {
                case .file:
                    guard let pieces = recipe.pieces() else {
                        throw TransferFailure(.permanent, .hlsAssembly, "the group's HLS recipe names a member it does not have")
                    }
                    try HLSAssembler.join(pieces, from: staging, into: built)
                case .folder:
                    try HLSAssembler.writeDurably(recipe.localPlaylist(), to: staging + "/" + HLSRecipe.playlistName)
                }
                return .success(())
            } catch {
                return .failure(error)
            }
        }.value
        try result.get()
    }

    /// The rename of a recorded HLS group: the built file to its name (or the staging folder
    /// to the group's folder), a sync of the folder, then the staging folder removed. Start-up
    /// calls it for a group recorded completed whose staging folder is still there.
    func finishHLS(_ group: JobGroup, recipe: HLSRecipe, overwrite: Bool) {
        let fm = FileManager.default
        switch recipe.layout {
        case .file:
            let built = Self.builtPath(group)
            guard fm.fileExists(atPath: built) else {
                // Renamed already (a crash before the staging folder was removed).
                if fm.fileExists(atPath: group.dir) {
                    removeStaging(group)
                    return
                }
                logger.warning("the joined HLS file is not in the staging folder", metadata: ["group": "\(group.id)", "path": "\(built)"])
                return
            }
            do throws(TransferFailure) {
                try PartialFile.link(built, to: group.dir, overwrite: overwrite)
                PartialFile.syncDirectory(of: group.dir)
                removeStaging(group)
            } catch {
                logger.warning(
                    "the joined HLS file stays staged",
                    metadata: ["group": "\(group.id)", "path": "\(built)", "error": "\(error.error.message)"])
            }
        case .folder:
            if !fm.fileExists(atPath: group.dir), rename(group.staging, group.dir) == 0 {
                PartialFile.syncDirectory(of: group.dir)
            } else {
                logger.warning("the HLS folder stays staged", metadata: ["group": "\(group.id)", "path": "\(group.staging)"])
            }
        }
    }

    /// Start-up's `finishHLS`. A joined file that is neither staged nor in place (a daemon
    /// whose join did not make its name durable before the record, as older ones did not) is
    /// built again from the staged members first, which were synced as they completed.
    func finishHLSAfterRestart(_ group: JobGroup, recipe: HLSRecipe, overwrite: Bool) async {
        let fm = FileManager.default
        if recipe.layout == .file, !fm.fileExists(atPath: Self.builtPath(group)), !fm.fileExists(atPath: group.dir) {
            do throws(TransferFailure) {
                try await Self.build(group, recipe)
                logger.notice("built the joined HLS file again from its staged segments", metadata: ["group": "\(group.id)"])
            } catch {
                logger.warning(
                    "the joined HLS file is lost and cannot be built again; its segments stay staged",
                    metadata: ["group": "\(group.id)", "path": "\(group.staging)", "error": "\(error.error.message)"])
                return
            }
        }
        finishHLS(group, recipe: recipe, overwrite: overwrite)
    }

    /// Records why a group could not be published: it shows `failed` with `error` until resumed.
    func failPublish(_ group: inout JobGroup, _ error: JobError) async throws(DLError) {
        group.error = error
        group.updatedAt = now()
        try await storage { try await store.saveGroup(group) }
        logger.warning("group not published", metadata: ["group": "\(group.id)", "error": "\(error.message)"])
        pending.notices.append(FinishedNotice(jobID: nil, group: group, path: group.dir, url: "", state: "failed", error: error))
    }
}
