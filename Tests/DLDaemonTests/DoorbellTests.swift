@testable import DLDaemon
@testable import DLEngine
import Synchronization
import Testing

/// The loops' wake-up: a ring is kept until a wait takes it; a wait ends with its task.
@Suite struct DoorbellTests {
    @Test func aRingBeforeTheWaitIsKept() async {
        let bell = Doorbell()
        bell.ring()
        bell.ring()
        await bell.wait()
        // Two rings before one wait are one: the next wait sleeps until its deadline.
        let rung = await bell.wait(until: .now + .milliseconds(50))
        #expect(!rung)
    }

    @Test func aRingWakesAWaiter() async {
        let bell = Doorbell()
        async let woken: Bool = bell.wait(until: .now + .seconds(60))
        try? await Task.sleep(for: .milliseconds(50))
        bell.ring()
        #expect(await woken)
    }

    @Test func cancellationEndsAWait() async {
        let bell = Doorbell()
        let ended = Counter()
        let waiter = Task {
            await bell.wait()
            ended.add(1)
        }
        try? await Task.sleep(for: .milliseconds(50))
        waiter.cancel()
        #expect(await ended.reaches(1), "a cancelled wait went on")
        // A wait that starts cancelled ends at once.
        let cancelled = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            await bell.wait()
            ended.add(1)
        }
        #expect(await ended.reaches(2), "a wait that started cancelled went on")
        // Whatever happened, the waits end, and so does the test.
        bell.ring()
        bell.ring()
        await waiter.value
        await cancelled.value
    }
}

final class Counter: Sendable {
    private let count = Atomic(0)
    var value: Int { count.load(ordering: .relaxed) }
    func add(_ n: Int) { count.add(n, ordering: .relaxed) }

    /// Waits up to a minute for the count to reach `n`; a test that fails then ends instead of
    /// hanging on a task that does not. Not a timing: in `make test` the process's two
    /// cooperative threads are shared with every suite, and a CI run once took more than 10 s
    /// to let cancelled loops see their cancellation (`anIdleEngineSleeps`).
    func reaches(_ n: Int) async -> Bool {
        let deadline = ContinuousClock.now + .seconds(60)
        while value < n, ContinuousClock.now < deadline { try? await Task.sleep(for: .milliseconds(10)) }
        return value >= n
    }
}
