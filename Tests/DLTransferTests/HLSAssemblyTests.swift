import DLCore
import DLTestSupport
import DLTransfer
import Foundation
import Testing

/// `HLSAssembler.join` on real files: ranges sliced, AES-128-CBC decrypted (the ciphertext made
/// by the openssl command line, not by dld), and each fault a clear `hls_assembly`.
@Suite struct HLSAssemblyTests {
    let folder: String

    init() throws {
        folder = try makeTemporaryFolder("/tmp/dld-hls-XXXXXX")
    }

    func write(_ name: String, _ bytes: [UInt8]) throws {
        try Data(bytes).write(to: URL(fileURLWithPath: folder + "/" + name))
    }

    func read(_ name: String) throws -> [UInt8] {
        [UInt8](try Data(contentsOf: URL(fileURLWithPath: folder + "/" + name)))
    }

    static func hex(_ bytes: [UInt8]) -> String { Hex.encode(bytes) }

    /// Encrypts `name` into `name.enc` with the openssl command line.
    func encrypt(_ name: String, key: [UInt8], iv: [UInt8]) throws {
        let result = try runProgram(
            "/usr/bin/openssl",
            [
                "enc", "-aes-128-cbc", "-K", Self.hex(key), "-iv", Self.hex(iv), "-in", folder + "/" + name, "-out",
                folder + "/" + name + ".enc",
            ])
        guard result.status == 0 else { throw HarnessError("openssl failed: \(result.stderr)") }
    }

    /// Pieces in order: an init section (a range), ranges of one file, a whole encrypted file
    /// (a size that is not a multiple of 16, so padding matters), keys read once.
    @Test func joinsRangesAndDecrypts() throws {
        defer { try? FileManager.default.removeItem(atPath: folder) }
        var rng = SplitMix64(state: 0x4C5)
        let single = (0..<100_000).map { _ in UInt8.random(in: 0...255, using: &rng) }
        let plain = (0..<70_001).map { _ in UInt8.random(in: 0...255, using: &rng) }
        let key = (0..<16).map { UInt8($0 * 3) }
        let iv = HLSParser.sequenceIV(7)
        try write("single.mp4", single)
        try write("plain.ts", plain)
        try write("k.key", key)
        try encrypt("plain.ts", key: key, iv: iv)
        let pieces = [
            HLSRecipe.Piece(name: "single.mp4", range: HLSByteRange(offset: 0, length: 500)),
            HLSRecipe.Piece(name: "single.mp4", range: HLSByteRange(offset: 500, length: 40_000)),
            HLSRecipe.Piece(name: "single.mp4", range: HLSByteRange(offset: 60_000, length: 40_000)),
            HLSRecipe.Piece(name: "plain.ts.enc", keyName: "k.key", iv: iv),
            HLSRecipe.Piece(name: "plain.ts.enc", keyName: "k.key", iv: iv),
        ]
        try HLSAssembler.join(pieces, from: folder, into: folder + "/out")
        let expected = Array(single[0..<40_500]) + Array(single[60_000..<100_000]) + plain + plain
        #expect(try read("out") == expected)
    }

    /// A range past the file's end, a key that is not 16 bytes, a wrong key: `hls_assembly`,
    /// with the member named.
    @Test func faults() throws {
        defer { try? FileManager.default.removeItem(atPath: folder) }
        try write("a.ts", [UInt8](repeating: 7, count: 1000))
        try write("short.key", [UInt8](repeating: 1, count: 15))
        let key = [UInt8](repeating: 9, count: 16)
        try write("good.key", key)
        try write("wrong.key", [UInt8](repeating: 8, count: 16))
        try encrypt("a.ts", key: key, iv: HLSParser.sequenceIV(0))
        let cases: [(HLSRecipe.Piece, String)] = [
            (HLSRecipe.Piece(name: "a.ts", range: HLSByteRange(offset: 900, length: 101)), "beyond its 1000 bytes"),
            (HLSRecipe.Piece(name: "a.ts.enc", keyName: "short.key", iv: HLSParser.sequenceIV(0)), "is 15 bytes, not 16"),
            (HLSRecipe.Piece(name: "a.ts.enc", keyName: "wrong.key", iv: HLSParser.sequenceIV(0)), "does not decrypt"),
        ]
        for (piece, words) in cases {
            do {
                try HLSAssembler.join([piece], from: folder, into: folder + "/out")
                Issue.record("\(piece.name) joined")
            } catch {
                #expect(error.error.code == JobErrorCode.hlsAssembly.rawValue)
                #expect(error.error.message.contains(words), "\(error.error.message)")
            }
        }
        try HLSAssembler.join(
            [HLSRecipe.Piece(name: "a.ts.enc", keyName: "good.key", iv: HLSParser.sequenceIV(0))], from: folder, into: folder + "/out")
        #expect(try read("out") == [UInt8](repeating: 7, count: 1000))
    }
}
