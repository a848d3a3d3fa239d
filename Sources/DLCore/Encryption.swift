/// Encryption at rest to age recipients (https://age-encryption.org/v1): the pure parts, with
/// no I/O and no cryptography. Recipients are parsed and checked here, and the size of an
/// encrypted file is computed here; the sealing itself is `AgeEncryptor` in DLTransfer, over
/// OpenSSL's libcrypto.

/// An age X25519 recipient, `age1…`: a Bech32 string (HRP `age`) that holds a 32-byte
/// Curve25519 public key.
public struct AgeRecipient: Sendable, Hashable, CustomStringConvertible {
    /// The recipient as the user gave it, in lowercase: what the job shows.
    public let text: String
    /// The X25519 public key, 32 bytes.
    public let publicKey: [UInt8]

    public var description: String { text }

    /// Parses `age1…`; the error says what is wrong, for an `invalid_params` reply.
    public static func parse(_ text: String) -> Result<AgeRecipient, DLError> {
        let shown = text.count > 100 ? String(text.prefix(100)) + "…" : text
        func refuse(_ why: String) -> Result<AgeRecipient, DLError> {
            .failure(
                .invalidParams(
                    "\"encrypt_to\": \(shown) is not an age recipient: \(why) (an X25519 recipient looks like age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p; age-keygen -y prints it)"
                ))
        }
        if text.hasPrefix("AGE-SECRET-KEY-") {
            // Said plainly: an identity given where a recipient goes would otherwise be
            // stored in the job table, which is exactly what encryption at rest avoids.
            return .failure(
                .invalidParams(
                    "\"encrypt_to\" takes a recipient (age1…), and this is a secret identity (AGE-SECRET-KEY-…): keep it away from dld; age-keygen -y prints its recipient"
                ))
        }
        let decoded: (hrp: String, data: [UInt8])
        switch Bech32.decode(text) {
        case .success(let value): decoded = value
        case .failure(let reason): return refuse(reason.message)
        }
        guard decoded.hrp == "age" else {
            return refuse(
                "its prefix is \"\(decoded.hrp.prefix(20))1\", age recipients start with \"age1\" (plugin and SSH recipients are not supported)"
            )
        }
        guard decoded.data.count == 32 else {
            return refuse("it holds \(decoded.data.count) bytes, an X25519 key has 32")
        }
        return .success(AgeRecipient(text: text.lowercased(), publicKey: decoded.data))
    }

    /// A list of recipients from a request: one to 16, none twice.
    public static func parseList(_ texts: [String]) -> Result<[AgeRecipient], DLError> {
        guard !texts.isEmpty else { return .failure(.invalidParams("\"encrypt_to\" must name at least one age recipient")) }
        guard texts.count <= maxRecipients else {
            return .failure(.invalidParams("\"encrypt_to\" names \(texts.count) recipients; at most \(maxRecipients)"))
        }
        var out: [AgeRecipient] = []
        for text in texts {
            switch parse(text) {
            case .success(let recipient):
                if !out.contains(recipient) { out.append(recipient) }
            case .failure(let error): return .failure(error)
            }
        }
        return .success(out)
    }

    /// Each recipient adds 98 bytes to every file's header and one X25519 exchange per attempt.
    public static let maxRecipients = 16
}

/// The age v1 file's layout: what an encrypted file's size is for a given plaintext, so that
/// start-up can tell a complete encrypted partial file from a cut one without reading it.
public enum AgeLayout {
    /// Plaintext bytes per payload chunk (64 KiB); each chunk carries a 16-byte tag.
    public static let chunkSize = 65_536
    public static let tagSize = 16
    /// The payload nonce written right after the header.
    public static let payloadNonceSize = 16
    /// The published name's suffix.
    public static let suffix = ".age"

    /// The header's bytes: the version line (22), one X25519 stanza a recipient (its two
    /// lines: `-> X25519 ` + 43 + `\n`, then 43 + `\n`), and the MAC line (`--- ` + 43 + `\n`).
    /// Every base64 field is of 32 bytes, 43 characters unpadded, so the size is fixed.
    public static func headerSize(recipients: Int) -> Int64 {
        22 + Int64(recipients) * 98 + 48
    }

    /// The payload's chunks: an empty plaintext is one empty final chunk; otherwise only the
    /// last may be short, and a plaintext of whole chunks ends with a full one.
    public static func chunks(plaintext: Int64) -> Int64 {
        plaintext == 0 ? 1 : (plaintext + Int64(chunkSize) - 1) / Int64(chunkSize)
    }

    /// The encrypted file's size for `plaintext` bytes.
    public static func encryptedSize(plaintext: Int64, recipients: Int) -> Int64 {
        headerSize(recipients: recipients) + Int64(payloadNonceSize) + plaintext + Int64(tagSize) * chunks(plaintext: plaintext)
    }

    /// The published path: `.age` appended, always (a name that ends in `.age` already gets
    /// a second one: one rule, whatever the name, and the file is then encrypted twice).
    public static func encryptedName(_ path: String) -> String { path + suffix }
}

/// Bech32 (BIP 173) decoding with its checksum, the encoding of age recipients. An encoding,
/// not cryptography.
public enum Bech32 {
    static let charset = Array("qpzry9x8gf2tvdw0s3jn54khce6mua7l".utf8)
    static let generator: [UInt32] = [0x3b6a_57b2, 0x2650_8e6d, 0x1ea1_19fa, 0x3d42_33dd, 0x2a14_62b3]

    /// The human-readable part and the data, converted from 5-bit groups to bytes.
    public static func decode(_ text: String) -> Result<(hrp: String, data: [UInt8]), DLError> {
        let bytes = Array(text.utf8)
        guard bytes.count <= 1000 else { return .failure(.invalidParams("it is too long")) }
        guard bytes.allSatisfy({ $0 >= 33 && $0 <= 126 }) else {
            return .failure(.invalidParams("it has spaces or characters outside printable ASCII"))
        }
        let hasLower = bytes.contains { $0 >= UInt8(ascii: "a") && $0 <= UInt8(ascii: "z") }
        let hasUpper = bytes.contains { $0 >= UInt8(ascii: "A") && $0 <= UInt8(ascii: "Z") }
        guard !(hasLower && hasUpper) else { return .failure(.invalidParams("it mixes upper and lower case")) }
        let lower = bytes.map { $0 >= UInt8(ascii: "A") && $0 <= UInt8(ascii: "Z") ? $0 + 32 : $0 }
        guard let separator = lower.lastIndex(of: UInt8(ascii: "1")), separator > 0 else {
            return .failure(.invalidParams("it has no \"1\" separator after a prefix"))
        }
        guard lower.count - separator - 1 >= 6 else { return .failure(.invalidParams("it is too short")) }
        let hrp = Array(lower[..<separator])
        var values: [UInt8] = []
        values.reserveCapacity(lower.count - separator - 1)
        for character in lower[(separator + 1)...] {
            guard let value = charset.firstIndex(of: character) else {
                return .failure(.invalidParams("\"\(Character(Unicode.Scalar(character)))\" is not a Bech32 character"))
            }
            values.append(UInt8(value))
        }
        guard polymod(expand(hrp) + values) == 1 else {
            return .failure(.invalidParams("its checksum is wrong (a character was mistyped or lost)"))
        }
        guard let data = regroup(values.dropLast(6)) else {
            return .failure(.invalidParams("its data has bad padding"))
        }
        return .success((String(decoding: hrp, as: UTF8.self), data))
    }

    static func expand(_ hrp: [UInt8]) -> [UInt8] {
        hrp.map { $0 >> 5 } + [0] + hrp.map { $0 & 31 }
    }

    static func polymod(_ values: [UInt8]) -> UInt32 {
        var check: UInt32 = 1
        for value in values {
            let top = check >> 25
            check = (check & 0x1ff_ffff) << 5 ^ UInt32(value)
            for i in 0..<5 where (top >> UInt32(i)) & 1 == 1 { check ^= generator[i] }
        }
        return check
    }

    /// 5-bit groups to bytes; the leftover bits (fewer than 5) must be zero.
    static func regroup(_ values: ArraySlice<UInt8>) -> [UInt8]? {
        var accumulator: UInt32 = 0
        var bits = 0
        var out: [UInt8] = []
        out.reserveCapacity(values.count * 5 / 8)
        for value in values {
            accumulator = (accumulator << 5) | UInt32(value)
            bits += 5
            if bits >= 8 {
                bits -= 8
                out.append(UInt8(truncatingIfNeeded: accumulator >> UInt32(bits)))
            }
        }
        guard bits < 5, accumulator & ((1 << UInt32(bits)) - 1) == 0 else { return nil }
        return out
    }
}
