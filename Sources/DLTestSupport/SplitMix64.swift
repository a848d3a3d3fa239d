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

/// Mutations of a valid input for the seeded fuzz tests: 1 to 4 of a byte changed, a byte
/// inserted, up to 8 removed, an `interesting` piece inserted, a run of up to `maxRepeat`
/// doubled, or the rest cut off.
public enum Mutator {
    public static func mutate(
        _ input: [UInt8], interesting: [[UInt8]], maxRepeat: Int, using rng: inout SplitMix64
    ) -> [UInt8] {
        var bytes = input
        for _ in 0..<Int.random(in: 1...4, using: &rng) {
            let position = bytes.isEmpty ? 0 : Int.random(in: 0..<bytes.count, using: &rng)
            switch Int.random(in: 0..<6, using: &rng) {
            case 0 where !bytes.isEmpty: bytes[position] = UInt8.random(in: 0...255, using: &rng)
            case 1: bytes.insert(UInt8.random(in: 0...255, using: &rng), at: position)
            case 2 where !bytes.isEmpty:
                bytes.removeSubrange(position..<min(bytes.count, position + Int.random(in: 1...8, using: &rng)))
            case 3 where !interesting.isEmpty:
                bytes.insert(contentsOf: interesting[Int.random(in: 0..<interesting.count, using: &rng)], at: position)
            case 4 where !bytes.isEmpty:
                let end = min(bytes.count, position + Int.random(in: 1...maxRepeat, using: &rng))
                bytes.insert(contentsOf: bytes[position..<end], at: position)
            default: bytes = Array(bytes.prefix(position))
            }
        }
        return bytes
    }
}
