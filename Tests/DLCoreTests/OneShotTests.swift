import DLCore
import Testing

@Suite struct OneShotTests {
    /// The first value handed over is the one waited for, whether it comes before or after
    /// the wait; later ones are dropped.
    @Test func theFirstValueWins() async {
        let early = OneShot<Int>()
        early.resume(1)
        early.resume(2)
        #expect(await early.wait() == 1)

        let late = OneShot<Int>()
        async let value = late.wait()
        Task {
            late.resume(3)
            late.resume(4)
        }
        #expect(await value == 3)
    }
}
