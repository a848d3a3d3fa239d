import DLCore
import DLJobTable
import DLStore
import Foundation
import Testing

/// Groups: created with their members in one transaction, scheduled as one unit, closed with
/// one event, removed after their members. On every backend.
@Suite struct GroupStoreTests {
    /// A turn of a group reads whether members are queued or running (two look-ups, whatever
    /// the group's size), and counts every state only once none is; standalone jobs are found
    /// past any number of queued members.
    @Test(arguments: Backend.allCases)
    func groupTurnCountsOnlyWhenNothingRuns(_ backend: Backend) async throws {
        try await withStore(backend) { store, _ in
            let news = (1...300).map { NewJob(url: "https://e.com/p\($0)", path: "/tmp/g/big/p\($0).jpg") }
            let (group, _) = try await store.insertGroup(name: "big", dir: "/tmp/g/big", priority: 0, members: news, now: t0)
            let single = try await store.insert([NewJob(url: "https://e.com/s", path: "/tmp/g/s", priority: -5)], now: t0)[0].job
            #expect(try await store.nextQueued(limit: 2, excludingGroups: [group.id]).jobs.map(\.id) == [single.id])
            let lease = t0.addingTimeInterval(30)
            #expect(try await store.claim(limit: 1, worker: "w", leaseUntil: lease, excludingHosts: [], now: t0).map(\.id) == [single.id])
            let claimed = try await store.claim(limit: 2, worker: "w", leaseUntil: lease, excludingHosts: [], group: group.id, now: t0)
            #expect(try await store.groupTurn(group.id).counts == [.queued: 1, .running: 1])
            var members = try await store.members(of: group.id)
            for index in members.indices {
                members[index].state = index == 7 ? .failed : .completed
            }
            try await store.save(members, publish: true)
            #expect(claimed.count == 2)
            #expect(try await store.groupTurn(group.id).counts == [.completed: 299, .failed: 1])
        }
    }

    /// An HLS group's recipe is written with its row, read back by `hlsRecipe` (and by no
    /// generic group read), unchanged by the group's closing; other groups have none.
    @Test(arguments: Backend.allCases)
    func hlsRecipeIsKeptWithTheGroup(_ backend: Backend) async throws {
        try await withStore(backend) { store, fixture in
            let recipe = #"{"layout":"file","segments":[{"member":0}],"note":"ünïcode \\ \"quoted\""}"#
            let news = [NewJob(url: "https://e.com/s0.ts", path: "/tmp/g/v.ts/seg-000000.ts")]
            let (group, _) = try await store.insertGroup(name: "v.ts", dir: "/tmp/g/v.ts", priority: 0, members: news, hls: recipe, now: t0)
            #expect(group.hls == recipe)
            #expect(try await store.hlsRecipe(of: group.id) == recipe)
            // The generic reads (a group's turns) leave it out.
            #expect(try await store.fetchGroup(group.id)?.hls == nil)
            #expect(try await store.fetchGroups(named: "v.ts").first?.hls == nil)
            var closed = group
            closed.closed = .completed
            closed.finishedAt = t0
            try await store.saveGroup(closed)
            // A restarted daemon reads it too.
            let reopened = try await fixture.open()
            #expect(try await reopened.hlsRecipe(of: group.id) == recipe)
            #expect(try await reopened.fetchGroup(group.id)?.closed == .completed)
            let (plain, _) = try await store.insertGroup(
                name: "p", dir: "/tmp/g/p", priority: 0, members: [NewJob(url: "https://e.com/p", path: "/tmp/g/p/p")], now: t0)
            #expect(try await store.hlsRecipe(of: plain.id) == nil)
        }
    }

    /// A live recording's reload: new members staged as the group's others and the recipe
    /// replaced, in one transaction; a closed group takes nothing (nil), and a member whose
    /// path an unfinished one has rolls the recipe back with it.
    @Test(arguments: Backend.allCases)
    func extendGroupAddsMembersWithTheRecipe(_ backend: Backend) async throws {
        try await withStore(backend) { store, fixture in
            let news = [NewJob(url: "https://e.com/s0.ts", path: "/tmp/g/l.ts/seg-000000.ts")]
            let (group, first) = try await store.insertGroup(
                name: "l.ts", dir: "/tmp/g/l.ts", priority: 3, members: news, hls: "r1", now: t0)
            let more = [
                NewJob(url: "https://e.com/s1.ts", path: "/tmp/g/l.ts/seg-000001.ts", priority: 3),
                NewJob(url: "https://e.com/s2.ts", path: "/tmp/g/l.ts/seg-000002.ts", priority: 3),
            ]
            let added = try #require(try await store.extendGroup(group, members: more, hls: "r2", now: t0))
            #expect(added.map(\.url) == ["https://e.com/s1.ts", "https://e.com/s2.ts"])
            #expect(added.allSatisfy { $0.groupID == group.id && $0.state == .queued })
            #expect(added.map(\.stagingPath) == more.map { JobGroup.stagedPath(of: $0.path, dir: group.dir, staging: group.staging) })
            #expect(try await store.members(of: group.id).map(\.id) == [first[0].id] + added.map(\.id))
            #expect(try await store.hlsRecipe(of: group.id) == "r2")
            // The same path again (an unfinished member has it): nothing is written.
            await #expect(throws: (any Error).self) {
                _ = try await store.extendGroup(group, members: [more[0]], hls: "r3", now: t0)
            }
            #expect(try await store.hlsRecipe(of: group.id) == "r2")
            #expect(try await store.members(of: group.id).count == 3)
            // Only the recipe (a cancel's).
            #expect(try await store.extendGroup(group, members: [], hls: "r4", now: t0) == [])
            var closed = group
            closed.closed = .completed
            try await store.saveGroup(closed)
            #expect(
                try await store.extendGroup(group, members: [NewJob(url: "https://e.com/s9.ts", path: "/tmp/g/l.ts/x")], hls: "r5", now: t0)
                    == nil)
            let reopened = try await fixture.open()
            #expect(try await reopened.hlsRecipe(of: group.id) == "r4")
            #expect(try await reopened.members(of: group.id).count == 3)
        }
    }

    /// A group's whole life as the engine drives it, read back through every group query.
    @Test(arguments: Backend.allCases)
    func groupLifecycle(_ backend: Backend) async throws {
        try await withStore(backend) { store, _ in
            let dir = "/tmp/g/book"
            let news = (1...3).map { NewJob(url: "https://e.com/p\($0)", path: dir + "/p\($0).jpg") }
            let (group, jobs) = try await store.insertGroup(name: "book", dir: dir, priority: 2, members: news, now: t0)
            #expect(group.id == 1)
            #expect(group.staging == "/tmp/g/.book.dld-staging-1")
            #expect(jobs.map(\.stagingPath) == (1...3).map { "/tmp/g/.book.dld-staging-1/p\($0).jpg" })
            #expect(jobs.allSatisfy { $0.groupID == group.id && $0.state == .queued })
            #expect(try await store.fetchGroup(group.id) == group)
            #expect(try await store.members(of: group.id) == jobs)
            #expect(try await store.events(after: 0).map(\.groupID) == [1, 1, 1], "one job.state event a member")
            let single = try await store.insert([NewJob(url: "https://e.com/s", path: "/tmp/g/s", priority: 1)], now: t0)[0].job

            // The queue: standalone jobs by themselves, the group placed by its first queued member.
            let next = try await store.nextQueued(limit: 10, excludingGroups: [])
            #expect(next.jobs.map(\.id) == [single.id])
            #expect(next.groups.map(\.groupID) == [1])
            #expect(next.groups.first?.entry == QueueEntry(id: jobs[0].id, priority: 2))
            #expect(try await store.nextQueued(limit: 10, excludingGroups: [1]).groups.isEmpty)
            let turn = try await store.groupTurn(1)
            #expect(turn.group == group)
            #expect(turn.counts == [.queued: 1], "while members are queued, only whether any is")
            #expect(try await store.groupTurn(99).group == nil)

            // A member fails; the group's publish fails once (one event), then it is published.
            var failed = jobs[1]
            failed.state = .failed
            failed.error = JobError(code: "http_status", message: "404")
            try await store.save(failed)
            #expect(try await store.firstFailedMember(of: 1)?.id == jobs[1].id)
            #expect(try await store.memberCounts(of: 1) == [.queued: 2, .failed: 1])
            var closing = group
            closing.error = JobError(code: "destination_exists", message: "p1.jpg appeared")
            closing.updatedAt = t0.addingTimeInterval(1)
            let failedEvents = try await store.saveGroup(closing, members: [], publish: false)
            #expect(failedEvents.map(\.state) == ["failed"])
            #expect(failedEvents.first?.kind == .groupState)
            #expect(failedEvents.first?.groupID == 1)
            #expect(try await store.saveGroup(closing, members: [], publish: false).isEmpty, "still failed: no new event")
            let done = jobs.map { job -> Job in
                var job = job
                job.state = .completed
                job.stagingPath = nil
                return job
            }
            closing.error = nil
            closing.closed = .completed
            closing.updatedAt = t0.addingTimeInterval(2)
            closing.finishedAt = t0.addingTimeInterval(2)
            let published = try await store.saveGroup(closing, members: done, publish: false)
            #expect(published.map(\.state) == ["completed"])
            #expect(published.first?.at == t0.addingTimeInterval(2))
            #expect(try await store.fetchGroup(1) == closing)
            #expect(try await store.members(of: 1) == done)
            #expect(try await store.openGroups().isEmpty)
            #expect(try await store.nextQueued(limit: 10, excludingGroups: []).groups.isEmpty)

            // Names are not unique: newest first.
            let (second, _) = try await store.insertGroup(
                name: "book", dir: "/tmp/g/book2", priority: 0, members: [NewJob(url: "https://e.com/a", path: "/tmp/g/book2/a")], now: t0)
            #expect(try await store.fetchGroups(named: "book").map(\.id) == [second.id, 1])
            #expect(try await store.fetchGroups(named: "none").isEmpty)
            #expect(try await store.openGroups() == [second.id])
            let folders = try await store.groupFolders()
            #expect(folders.map(\.id) == [1, second.id])
            #expect(folders.map(\.dir) == [dir, "/tmp/g/book2"])
            #expect(folders.map(\.closed) == [.completed, nil])

            // Removed: the members (their files with delete_file), then the group.
            let before = try await store.lastEventSeq()
            let removed = try await store.delete(.group(1), deleteFiles: true, now: t0.addingTimeInterval(3))
            #expect(removed.count == 3)
            #expect(removed.ids == jobs.map(\.id))
            #expect(removed.files.sorted() == jobs.map(\.path).sorted())
            try await store.deleteGroup(1, now: t0.addingTimeInterval(3))
            #expect(try await store.fetchGroup(1) == nil)
            let events = try await store.events(after: before)
            #expect(events.map(\.kind) == [.jobRemoved, .jobRemoved, .jobRemoved, .groupState])
            #expect(events.map(\.groupID) == [1, 1, 1, 1])
            #expect(events.map(\.jobID) == jobs.map(\.id) + [nil])
            #expect(events.last?.state == "removed")
            #expect(events.map(\.seq) == Array((before + 1)...(before + 4)))
            _ = try await store.delete(.ids([single.id]), deleteFiles: false, now: t0)
            let last = try await store.events(after: before + 4)
            #expect(last.map(\.jobID) == [single.id])
            #expect(last.first?.groupID == nil)
        }
    }

    /// A member path already used by an unfinished job refuses the whole group.
    @Test(arguments: Backend.allCases)
    func groupWithATakenPathIsRefused(_ backend: Backend) async throws {
        try await withStore(backend) { store, _ in
            _ = try await store.insert([NewJob(url: "https://e.com/x", path: "/tmp/g/b/x")], now: t0)
            await #expect(throws: StoreError.pathInUse(path: "/tmp/g/b/x", by: 1)) {
                _ = try await store.insertGroup(
                    name: "b", dir: "/tmp/g/b", priority: 0,
                    members: [NewJob(url: "https://e.com/w", path: "/tmp/g/b/w"), NewJob(url: "https://e.com/x", path: "/tmp/g/b/x")],
                    now: t0)
            }
            #expect(try await store.fetchGroups(named: "b").isEmpty)
            #expect(try await store.list().count == 1)
        }
    }
}
