import DLCore
@testable import DLDaemon
@testable import DLEngine
import DLJobTable
import DLStore
import DLTestSupport
import DLTransfer
import Foundation
import Logging
import Synchronization
import Testing

/// The loops' "loop woke" trace lines (`Engine+Loops`), by loop.
final class WakeLog: Sendable {
    private let wakes = Mutex<[String]>([])
    var all: [String] { wakes.withLock { $0 } }
    func add(_ loop: String) { wakes.withLock { $0.append(loop) } }
}

struct WakeLogHandler: LogHandler {
    let log: WakeLog
    var metadata: Logger.Metadata = [:]
    var metadataProvider: Logger.MetadataProvider?
    var logLevel: Logger.Level = .trace

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        guard event.message.description == "loop woke" else { return }
        log.add(event.metadata?["loop"].map { "\($0)" } ?? "?")
    }
}

/// The engine's timed work (`Engine.runLoops`): nothing wakes an idle engine, the loops that
/// run with transfers go back to sleep after them, a waiting job is queued again at its time,
/// and cancelling the one task ends every loop. Not timings: the loops that tick with
/// transfers tick here every 20 ms, so in a window of a second a loop that polled instead of
/// sleeping on its bell would wake dozens of times where the engine may wake it once.
@Suite struct EngineLoopTests {
    final class Fixture: Sendable {
        let folder = NSTemporaryDirectory() + "dld-loops-\(UUID().uuidString)"
        let store: SQLiteJobStore
        let engine: Engine
        let wakes = WakeLog()
        /// Jobs seen by the progress reports.
        let reports = Counter()
        let loopsEnded = Counter()
        let loops: Task<Void, Never>

        /// The progress and unsynced loops tick every `tick` while transfers run.
        init(tick: Duration = .milliseconds(20)) throws {
            try FileManager.default.createDirectory(atPath: folder + "/dl", withIntermediateDirectories: true)
            store = try SQLiteJobStore(path: folder + "/jobs.sqlite")
            let wakes = self.wakes
            let logger = Logger(label: "test") { _ in WakeLogHandler(log: wakes) }
            var configuration = EngineConfiguration(downloadDir: folder + "/dl")
            // Unsynced progress is recorded only with a boot id: its loop runs too.
            configuration.bootID = "loop-tests"
            let engine = Engine(store: store, downloader: Downloader(logger: logger), configuration: configuration, logger: logger)
            self.engine = engine
            let reports = self.reports
            let loopsEnded = self.loopsEnded
            loops = Task {
                await engine.runLoops(progressEvery: tick, unsyncedEvery: tick) { jobs, _ in reports.add(jobs.count) }
                loopsEnded.add(1)
            }
        }

        deinit { try? FileManager.default.removeItem(atPath: folder) }

        /// Ends the loops (cancelling their one task must end them all) and the engine.
        func close() async {
            loops.cancel()
            #expect(await loopsEnded.reaches(1), "the loops went on once cancelled")
            await engine.shutdown()
        }

        func state(_ id: JobID) async -> JobState? {
            (try? await store.fetch(id))?.state
        }

        /// Waits (at most `seconds`) until the job is in one of `states`. Generous: in `make
        /// test` this engine shares the process's two cooperative threads with every other
        /// suite, some of which block them (one run took 20 s to see a 1 s retry through).
        func wait(_ id: JobID, for states: Set<JobState>, seconds: Double = 90) async -> JobState? {
            let deadline = Date().addingTimeInterval(seconds)
            var last = await state(id)
            while let now = last, !states.contains(now), Date() < deadline {
                try? await Task.sleep(for: .milliseconds(20))
                last = await state(id)
            }
            return last
        }
    }

    /// The wake-ups of each loop among `wakes`.
    static func byLoop(_ wakes: ArraySlice<String>) -> [String: Int] {
        wakes.reduce(into: [:]) { $0[$1, default: 0] += 1 }
    }

    @Test func anIdleEngineSleeps() async throws {
        let f = try Fixture()
        do { try await f.engine.start() } catch { Issue.record(error, "the engine did not start") }
        // A window, not a timing: nothing at all is expected in it, whatever its length; a loop
        // that polled at its tick would wake about fifty times in it.
        try? await Task.sleep(for: .seconds(1))
        let seen = f.wakes.all
        #expect(seen.isEmpty, "an idle engine's loops woke: \(Self.byLoop(seen[...]))")
        await f.close()
    }

    @Test func loopsFollowTransfersAndWaitingJobs() async throws {
        let f = try Fixture()
        let origin = try await TestOrigin.start()
        do {
            try await f.engine.start()
            // A 503 with Retry-After: 1 first: the job waits, and the wake-up loop queues it
            // again; then a transfer of about a second, which the progress reports see.
            var spec = EnqueueSpec(url: origin.baseURL + "/fail_first/1/bytes/400000?rate=400000")
            spec.name = "one.bin"
            let id = try #require(try await f.engine.enqueue([spec]).first?.job.id)
            // The deadlines only keep a stuck job from hanging the run. The whole suite on two
            // cores stretched this second to more than 20, and once to over 120: blocking
            // end-to-end tests held both cooperative threads, and `anIdleEngineSleeps`, whose
            // wait is one second, took 517 s in the same run.
            #expect(await f.wait(id, for: [.waiting, .completed, .failed], seconds: 600) == .waiting)
            let end = await f.wait(id, for: [.completed, .failed], seconds: 600)
            #expect(end == .completed)
            #expect(f.reports.value > 0, "no progress report while the transfer ran")
            if end == .completed {
                // Once no transfer runs, each loop that ran with the transfer ticks at most once
                // more (it was asleep for its tick), then sleeps on its bell; the others sleep.
                let deadline = Date().addingTimeInterval(600)
                while await !f.engine.running.isEmpty, Date() < deadline { try? await Task.sleep(for: .milliseconds(20)) }
                #expect(await f.engine.running.isEmpty)
                let before = f.wakes.all.count
                try? await Task.sleep(for: .seconds(1))
                let after = Self.byLoop(f.wakes.all[before...])
                #expect(after.keys.allSatisfy { ["progress", "unsynced"].contains($0) }, "loops woke after the transfer: \(after)")
                #expect(after.values.allSatisfy { $0 <= 1 }, "loops woke after the transfer: \(after)")
            }
        } catch {
            Issue.record(error)
        }
        try? await origin.shutdown()
        await f.close()
    }
}
