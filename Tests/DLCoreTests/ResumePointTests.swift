import DLCore
import Testing

/// Where a resume continues after dld stopped: unsynced progress is trusted only in the boot
/// that wrote it, ahead of the synced offset, over a partial file that holds it.
@Suite struct ResumePointTests {
    private let boot = "5b1c0f3e-2d7a-4c1b-9a55-0e8d1f2a3b4c"
    private let validators = Validators(etag: "\"v1\"", acceptsRanges: true)

    private func record(
        _ received: Int64, segments: String? = nil, size: Int64? = 64 << 20, boot: String? = nil,
        validators: Validators? = nil
    ) -> UnsyncedProgress {
        UnsyncedProgress(
            bootID: boot ?? self.boot, received: received, segments: segments, size: size,
            validators: validators ?? self.validators, finalURL: "http://127.0.0.1/f")
    }

    /// Same boot, ahead of the synced offset, the file long enough: the unsynced bytes count.
    @Test func sameBootAndLongEnoughFileIsTrusted() {
        let unsynced = record(30 << 20)
        #expect(ResumePoint.choose(synced: 10 << 20, unsynced: unsynced, bootID: boot, fileLength: 30 << 20) == .unsynced(unsynced))
        #expect(ResumePoint.choose(synced: 10 << 20, unsynced: unsynced, bootID: boot, fileLength: 64 << 20) == .unsynced(unsynced))
    }

    /// After a reboot or a power loss (another boot id), or with no boot id now, only the
    /// synced offset counts, whatever the file's length.
    @Test func anotherBootIsNeverTrusted() {
        let unsynced = record(30 << 20)
        #expect(
            ResumePoint.choose(synced: 10 << 20, unsynced: unsynced, bootID: "another-boot", fileLength: 64 << 20) == .synced(.otherBoot))
        #expect(ResumePoint.choose(synced: 10 << 20, unsynced: unsynced, bootID: nil, fileLength: 64 << 20) == .synced(.otherBoot))
        #expect(ResumePoint.choose(synced: 10 << 20, unsynced: unsynced, bootID: "", fileLength: 64 << 20) == .synced(.otherBoot))
        #expect(
            ResumePoint.choose(synced: 0, unsynced: record(30 << 20, boot: ""), bootID: "", fileLength: 64 << 20) == .synced(.otherBoot))
    }

    /// A file shorter than the record (cut, or gone) proves the bytes are not there.
    @Test func shorterOrMissingFileIsNotTrusted() {
        let unsynced = record(30 << 20)
        #expect(ResumePoint.choose(synced: 10 << 20, unsynced: unsynced, bootID: boot, fileLength: (30 << 20) - 1) == .synced(.fileShorter))
        #expect(ResumePoint.choose(synced: 10 << 20, unsynced: unsynced, bootID: boot, fileLength: nil) == .synced(.fileShorter))
    }

    /// A record that is not ahead of the synced bytes (older than the last checkpoint) gives
    /// nothing; no record means the synced offset.
    @Test func recordNotAheadOrAbsentUsesSynced() {
        #expect(ResumePoint.choose(synced: 30 << 20, unsynced: record(30 << 20), bootID: boot, fileLength: 64 << 20) == .synced(.notAhead))
        #expect(ResumePoint.choose(synced: 40 << 20, unsynced: record(30 << 20), bootID: boot, fileLength: 64 << 20) == .synced(.notAhead))
        #expect(ResumePoint.choose(synced: 0, unsynced: nil, bootID: boot, fileLength: 64 << 20) == .synced(.none))
    }

    /// Without a validator (If-Range) the bytes are continued with the overlap check, which
    /// needs the size; without byte ranges they cannot be continued at all.
    @Test func recordWithoutValidatorNeedsItsSize() {
        let noValidator = record(30 << 20, validators: Validators(acceptsRanges: true))
        #expect(ResumePoint.choose(synced: 0, unsynced: noValidator, bootID: boot, fileLength: 64 << 20) == .unsynced(noValidator))
        let noValidatorNoSize = record(30 << 20, size: nil, validators: Validators(acceptsRanges: true))
        #expect(ResumePoint.choose(synced: 0, unsynced: noValidatorNoSize, bootID: boot, fileLength: 64 << 20) == .synced(.unusable))
        let noRanges = record(30 << 20, validators: Validators(etag: "\"v1\"", acceptsRanges: false))
        #expect(ResumePoint.choose(synced: 0, unsynced: noRanges, bootID: boot, fileLength: 64 << 20) == .synced(.unusable))
    }

    /// A segmented record needs the file to reach its furthest written byte, and ranges that
    /// read back and agree with its byte count.
    @Test func segmentedRecordNeedsItsFurthestByte() {
        let mib: Int64 = 1 << 20
        // [0,8) written 6; [8,16) written 3; [16,64) untouched: 9 MiB, the furthest at 11 MiB.
        let layout = "0-\(6 * mib)-\(8 * mib),\(8 * mib)-\(11 * mib)-\(16 * mib),\(16 * mib)-\(16 * mib)-\(64 * mib)"
        let unsynced = record(9 * mib, segments: layout)
        #expect(unsynced.requiredLength == 11 * mib)
        #expect(ResumePoint.choose(synced: 2 * mib, unsynced: unsynced, bootID: boot, fileLength: 11 * mib) == .unsynced(unsynced))
        #expect(ResumePoint.choose(synced: 2 * mib, unsynced: unsynced, bootID: boot, fileLength: 10 * mib) == .synced(.fileShorter))
        let wrongCount = record(10 * mib, segments: layout)
        #expect(ResumePoint.choose(synced: 2 * mib, unsynced: wrongCount, bootID: boot, fileLength: 64 * mib) == .synced(.unusable))
        let garbage = record(9 * mib, segments: "not-a-layout")
        #expect(ResumePoint.choose(synced: 2 * mib, unsynced: garbage, bootID: boot, fileLength: 64 * mib) == .synced(.unusable))
        let noSize = record(9 * mib, segments: layout, size: nil)
        #expect(ResumePoint.choose(synced: 2 * mib, unsynced: noSize, bootID: boot, fileLength: 64 * mib) == .synced(.unusable))
    }

    /// The stored form reads back as the same record; anything else reads as none.
    @Test func storedFormRoundTrips() {
        let full = UnsyncedProgress(
            bootID: boot, received: 123, segments: "0-100-200,200-223-300", size: 300,
            validators: Validators(etag: "\"a|b\"", lastModified: "Mon, 01 Jan 2024 00:00:00 GMT", acceptsRanges: true),
            finalURL: "https://example.com/a?b=c")
        #expect(UnsyncedProgress(encoded: full.encoded) == full)
        let bare = UnsyncedProgress(bootID: boot, received: 0)
        #expect(UnsyncedProgress(encoded: bare.encoded) == bare)
        #expect(UnsyncedProgress(encoded: "") == nil)
        #expect(UnsyncedProgress(encoded: "{\"received\":1}") == nil)
    }
}
