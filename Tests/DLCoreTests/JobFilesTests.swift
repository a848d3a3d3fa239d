import DLCore
import Testing

/// Which files go with a canceled or deleted row: the rule both store backends ask.
@Suite struct JobFilesTests {
    private func files(_ state: JobState, attempts: Int64 = 1, received: Int64 = 0, staging: String? = nil) -> JobFiles {
        JobFiles(state: state, path: "/data/a.iso", stagingPath: staging, attempts: attempts, received: received)
    }

    /// A completed file is the user's: it goes only when they ask, and never its partial file
    /// (the published file is all there is).
    @Test func completedFileGoesOnlyWhenAsked() {
        #expect(files(.completed).fileDeleted(onRemove: false) == nil)
        #expect(files(.completed).fileDeleted(onRemove: true) == "/data/a.iso")
        #expect(files(.completed, staging: "/data/.g.dld-staging-1/a.iso").fileDeleted(onRemove: true) == "/data/a.iso")
    }

    /// An unfinished or failed job that ever started leaves its partial file, which goes with
    /// the row whatever `delete_file` says; one that never started has none.
    @Test func unfinishedJobsLoseTheirPartialFile() {
        for state in [JobState.queued, .running, .waiting, .paused, .failed] {
            for deleteFile in [false, true] {
                #expect(files(state).fileDeleted(onRemove: deleteFile) == "/data/a.iso.part", "\(state)")
                #expect(files(state, attempts: 0, received: 4096).fileDeleted(onRemove: deleteFile) == "/data/a.iso.part", "\(state)")
                #expect(files(state, attempts: 0).fileDeleted(onRemove: deleteFile) == nil, "never started: \(state)")
            }
        }
    }

    /// A group member's partial file is beside its staged path.
    @Test func memberPartialFileIsStaged() {
        let member = files(.paused, staging: "/data/.g.dld-staging-1/a.iso")
        #expect(member.fileDeleted(onRemove: false) == "/data/.g.dld-staging-1/a.iso.part")
        #expect(member.fileDeletedOnCancel == "/data/.g.dld-staging-1/a.iso.part")
    }

    /// A canceled job's partial file went when it was canceled: removing its row deletes
    /// nothing more.
    @Test func canceledRowsDeleteNothing() {
        #expect(files(.canceled).fileDeleted(onRemove: false) == nil)
        #expect(files(.canceled).fileDeleted(onRemove: true) == nil)
        #expect(files(.queued).fileDeletedOnCancel == "/data/a.iso.part")
        #expect(files(.queued, attempts: 0).fileDeletedOnCancel == nil)
    }

    /// A row without a path (a table edited by hand) never names a file of the daemon's
    /// own folder.
    @Test func rowWithoutPathDeletesNothing() {
        let empty = JobFiles(state: .failed, path: "", stagingPath: nil, attempts: 3, received: 10)
        #expect(empty.fileDeleted(onRemove: true) == nil)
        #expect(empty.fileDeletedOnCancel == nil)
        #expect(JobFiles(state: .completed, path: "", stagingPath: nil, attempts: 1, received: 1).fileDeleted(onRemove: true) == nil)
    }

    /// The partial path is the one the transfer writes (`Job.partialPath`).
    @Test func partialPathIsTheTransfers() {
        let job = Job(
            url: "http://example.com/a", path: "/data/a.iso", createdAt: .distantPast, updatedAt: .distantPast, stagingPath: "/s/a.iso")
        let row = JobFiles(state: .paused, path: job.path, stagingPath: job.stagingPath, attempts: 1, received: 0)
        #expect(row.partial == job.partialPath)
    }
}
