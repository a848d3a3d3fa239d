@testable import DLCore
import Testing

@Suite struct EncryptionTests {
    static let example = "age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p"

    /// An age recipient parses to its 32-byte key, in either case, and is kept in lowercase.
    @Test func recipientParses() throws {
        let recipient = try AgeRecipient.parse(Self.example).get()
        #expect(recipient.publicKey.count == 32)
        #expect(recipient.text == Self.example)
        let upper = try AgeRecipient.parse(Self.example.uppercased()).get()
        #expect(upper == recipient)
    }

    /// What is not a recipient is refused with a reason a person can act on.
    @Test func badRecipientsAreRefused() {
        func message(_ text: String) -> String {
            if case .failure(let error) = AgeRecipient.parse(text) {
                #expect(error.code == .invalidParams)
                return error.message
            }
            Issue.record("\(text) parsed")
            return ""
        }
        // One character changed: the checksum catches it.
        var typo = Array(Self.example)
        typo[10] = typo[10] == "q" ? "p" : "q"
        #expect(message(String(typo)).contains("checksum"))
        #expect(message(String(Self.example.dropLast())).contains("checksum"))
        #expect(message("age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8P").contains("mixes upper and lower case"))
        #expect(message("AGE-SECRET-KEY-1QQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQQ").contains("secret identity"))
        // Valid Bech32 (BIP 173's vector), but not age's prefix.
        #expect(message("abcdef1qpzry9x8gf2tvdw0s3jn54khce6mua7lmqqqxw").contains("\"abcdef1\""))
        // Valid Bech32 with age's prefix but no key in it.
        #expect(message("age1qqqqqqqqqqqqqqqqqqqq") != "")
        #expect(message("not a key").contains("spaces"))
        #expect(message("ssh-ed25519") != "")
        #expect(message("") != "")
    }

    /// BIP 173's valid strings decode, its invalid ones do not.
    @Test func bech32Vectors() {
        for valid in [
            "A12UEL5L", "a12uel5l", "abcdef1qpzry9x8gf2tvdw0s3jn54khce6mua7lmqqqxw",
            "split1checkupstagehandshakeupstreamerranterredcaperred2y9e3w",
        ] {
            guard case .success = Bech32.decode(valid) else {
                Issue.record("\(valid) should decode")
                continue
            }
        }
        for invalid in ["pzry9x0s0muk", "1pzry9x0s0muk", "x1b4n0q5v", "li1dgmt3", "A1G7SGD8", "10a06t8", "1qzzfhee"] {
            if case .success = Bech32.decode(invalid) { Issue.record("\(invalid) should not decode") }
        }
    }

    /// A list: duplicates once, none is an error, and there is a ceiling.
    @Test func recipientLists() throws {
        #expect(try AgeRecipient.parseList([Self.example, Self.example.uppercased()]).get().count == 1)
        #expect(throws: DLError.self) { try AgeRecipient.parseList([]).get() }
        #expect(throws: DLError.self) { try AgeRecipient.parseList(Array(repeating: Self.example, count: 17)).get() }
    }

    /// The encrypted size: a header of fixed size, the payload nonce, and a tag per 64 KiB
    /// chunk; an empty file has one empty chunk, a file of whole chunks no extra one.
    @Test func encryptedSizes() {
        #expect(AgeLayout.headerSize(recipients: 1) == 168)
        #expect(AgeLayout.encryptedSize(plaintext: 0, recipients: 1) == 200)
        #expect(AgeLayout.encryptedSize(plaintext: 1, recipients: 1) == 201)
        #expect(AgeLayout.encryptedSize(plaintext: 65_536, recipients: 1) == 168 + 16 + 65_536 + 16)
        #expect(AgeLayout.encryptedSize(plaintext: 65_537, recipients: 1) == 168 + 16 + 65_537 + 32)
        #expect(AgeLayout.encryptedSize(plaintext: 65_537, recipients: 3) == 168 + 196 + 16 + 65_537 + 32)
        #expect(AgeLayout.encryptedName("/d/a.bin") == "/d/a.bin.age")
    }
}
