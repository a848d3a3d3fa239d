import Foundation

/// A small deterministic generator, so that a randomized test can be replayed from its seed.
public struct SplitMix64: RandomNumberGenerator, Sendable {
    public var state: UInt64

    public init(state: UInt64) { self.state = state }

    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    /// The seed of a randomized test: `DLD_TEST_SEED` when set (to replay a failure whose
    /// message gave the seed), else a new one for each run. Tests put it in their failure
    /// messages.
    public static func testSeed() -> UInt64 {
        if let text = ProcessInfo.processInfo.environment["DLD_TEST_SEED"], let seed = UInt64(text) { return seed }
        return UInt64.random(in: 0...UInt64.max)
    }
}
