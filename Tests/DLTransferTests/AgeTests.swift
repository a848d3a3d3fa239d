import DLCore
import DLTestSupport
@testable import DLTransfer
import Foundation
import Testing

private func hex(_ text: String) -> [UInt8] { Hex.decode(text) ?? [] }

/// A folder of one test, removed at the end.
private final class Scratch {
    let path: String
    init() throws {
        path = NSTemporaryDirectory() + "dld-age-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    }
    deinit { try? FileManager.default.removeItem(atPath: path) }
}

/// The same bytes every run: a file of `count` bytes that is not one repeated value.
private func sample(_ count: Int) -> [UInt8] {
    (0..<count).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ $0 >> 11) }
}

@Suite struct AgeCryptoTests {
    /// The wrappers over libcrypto give the published known answers (RFC 7748, 5869, 4231).
    @Test func knownAnswers() throws {
        // RFC 7748 §6.1: Alice's public key, and the secret Alice and Bob share.
        let alice = hex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")
        let bobPublic = hex("de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f")
        #expect(try AgeCrypto.x25519Public(secret: alice) == hex("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a"))
        #expect(
            try AgeCrypto.x25519(secret: alice, peer: bobPublic) == hex("4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742"))
        // RFC 5869 test case 1.
        let caseOne = try AgeCrypto.hkdfBytes(
            ikm: [UInt8](repeating: 0x0b, count: 22), salt: hex("000102030405060708090a0b0c"), info: hex("f0f1f2f3f4f5f6f7f8f9"), length: 42
        )
        #expect(caseOne == hex("3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865"))
        // RFC 5869 test case 3: no salt, no info.
        let caseThree = try AgeCrypto.hkdfBytes(ikm: [UInt8](repeating: 0x0b, count: 22), salt: [], info: [], length: 42)
        #expect(caseThree == hex("8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d9d201395faa4b61a96c8"))
        // RFC 4231 test case 2.
        #expect(
            try AgeCrypto.hmacSHA256(key: Array("Jefe".utf8), Array("what do ya want for nothing?".utf8))
                == hex("5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"))
    }

    /// ChaCha20-Poly1305 gives RFC 8439's §2.8.2 answer, and its seal opens again; a changed
    /// byte does not.
    @Test func aead() throws {
        let key = hex("808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9f")
        let nonce = hex("070000004041424344454647")
        let plaintext = Array(
            "Ladies and Gentlemen of the class of '99: If I could offer you only one tip for the future, sunscreen would be it.".utf8)
        let cipher = try ChaChaPoly()
        var sealed: [UInt8] = []
        // The RFC's vector has additional data, which age never uses: its tag differs, so
        // the ciphertext (the keystream) is what is compared.
        try plaintext.withUnsafeBytes { raw in try cipher.seal(key: key, nonce: nonce, raw, into: &sealed) }
        #expect(Array(sealed.prefix(16)) == hex("d31a8d34648e60db7b86afbc53ef7ec2"))
        #expect(sealed.count == plaintext.count + 16)
        #expect(cipher.open(key: key, nonce: nonce, sealed) == plaintext)
        sealed[5] ^= 1
        #expect(cipher.open(key: key, nonce: nonce, sealed) == nil)
    }

    /// A low-order recipient key (here all zeros) is refused: it would share no secret.
    @Test func lowOrderRecipientRefused() throws {
        let zero = try AgeRecipient.parse("age1qqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqq5cu47z").get()
        #expect(zero.publicKey == [UInt8](repeating: 0, count: 32))
        let problem = try #require(AgeEncryptor.check(zero))
        #expect(problem.error.code == "encryption_error")
        #expect(problem.error.message.contains("low-order"))
    }
}

@Suite struct AgeEncryptorTests {
    /// Files dld encrypts decrypt with the reference `age -d` to the exact bytes, at the sizes
    /// where chunking has edges: empty, one byte, a chunk less one, exactly one and two chunks,
    /// one more than a chunk; and their size is `AgeLayout.encryptedSize`.
    @Test func decryptsWithAge() throws {
        let folder = try Scratch()
        let identity = try AgeTool.keygen(in: folder.path)
        let recipient = try AgeRecipient.parse(identity.recipient).get()
        for size in [0, 1, 65_535, 65_536, 65_537, 131_072, 200_000] {
            let plaintext = sample(size)
            let encryptor = try AgeEncryptor(recipients: [recipient])
            var file = encryptor.header
            // Fed in uneven pieces, as a body arrives.
            var at = 0
            var piece = 1
            while at < plaintext.count {
                let end = min(plaintext.count, at + piece)
                try plaintext[at..<end].withUnsafeBytes { raw in try encryptor.update(raw, into: &file) }
                at = end
                piece = piece * 3 + 7
            }
            try encryptor.finish(into: &file)
            #expect(Int64(file.count) == AgeLayout.encryptedSize(plaintext: Int64(size), recipients: 1), "size \(size)")
            let path = folder.path + "/file-\(size).age"
            try Data(file).write(to: URL(fileURLWithPath: path))
            let decrypted = try AgeTool.decrypt(path, identity: identity)
            #expect(decrypted == Data(plaintext), "size \(size)")
        }
    }

    /// With two recipients, each identity decrypts the file alone; the header holds one stanza
    /// each, and its MAC covers them (age checks it).
    @Test func twoRecipients() throws {
        let folder = try Scratch()
        let first = try AgeTool.keygen(in: folder.path, name: "one.txt")
        let second = try AgeTool.keygen(in: folder.path, name: "two.txt")
        let recipients = try AgeRecipient.parseList([first.recipient, second.recipient]).get()
        let encryptor = try AgeEncryptor(recipients: recipients)
        var file = encryptor.header
        let plaintext = sample(70_000)
        try plaintext.withUnsafeBytes { raw in try encryptor.update(raw, into: &file) }
        try encryptor.finish(into: &file)
        #expect(Int64(file.count) == AgeLayout.encryptedSize(plaintext: 70_000, recipients: 2))
        #expect(String(decoding: encryptor.header.prefix(22), as: UTF8.self) == "age-encryption.org/v1\n")
        let path = folder.path + "/two.age"
        try Data(file).write(to: URL(fileURLWithPath: path))
        #expect(try AgeTool.decrypt(path, identity: first) == Data(plaintext))
        #expect(try AgeTool.decrypt(path, identity: second) == Data(plaintext))
    }

    /// A file cut short (a chunk lost) or with a flipped byte is refused by age: the chunks are
    /// authenticated and the last one is marked as last.
    @Test func tamperedFilesAreRefused() throws {
        let folder = try Scratch()
        let identity = try AgeTool.keygen(in: folder.path)
        let encryptor = try AgeEncryptor(recipients: [try AgeRecipient.parse(identity.recipient).get()])
        var file = encryptor.header
        try sample(150_000).withUnsafeBytes { raw in try encryptor.update(raw, into: &file) }
        try encryptor.finish(into: &file)
        let cut = folder.path + "/cut.age"
        try Data(file.prefix(encryptor.header.count + 2 * (65_536 + 16))).write(to: URL(fileURLWithPath: cut))
        #expect(throws: HarnessError.self) { try AgeTool.decrypt(cut, identity: identity) }
        var flipped = file
        flipped[encryptor.header.count + 100] ^= 0x20
        let changed = folder.path + "/flipped.age"
        try Data(flipped).write(to: URL(fileURLWithPath: changed))
        #expect(throws: HarnessError.self) { try AgeTool.decrypt(changed, identity: identity) }
    }

    /// With the same random values the same bytes come out, however the plaintext is cut:
    /// chunking does not depend on how the body arrives.
    @Test func piecesDoNotMatter() throws {
        let recipient = try AgeRecipient.parse("age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p").get()
        func encrypt(_ plaintext: [UInt8], pieces: Int) throws -> [UInt8] {
            let encryptor = try AgeEncryptor(
                recipients: [recipient], fileKey: [UInt8](repeating: 7, count: 16), ephemeralSecrets: [[UInt8](repeating: 9, count: 32)],
                payloadNonce: [UInt8](repeating: 5, count: 16))
            var out = encryptor.header
            let step = max(1, plaintext.count / pieces)
            var at = 0
            while at < plaintext.count {
                let end = min(plaintext.count, at + step)
                try plaintext[at..<end].withUnsafeBytes { raw in try encryptor.update(raw, into: &out) }
                at = end
            }
            try encryptor.finish(into: &out)
            return out
        }
        let plaintext = sample(300_000)
        let whole = try encrypt(plaintext, pieces: 1)
        #expect(try encrypt(plaintext, pieces: 7) == whole)
        #expect(try encrypt(plaintext, pieces: 4_000) == whole)
    }
}
