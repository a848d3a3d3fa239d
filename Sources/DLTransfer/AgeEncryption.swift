import CCrypto
import DLCore
import Foundation
import Synchronization

/// The primitives of age v1, each one call into OpenSSL's libcrypto: X25519, HKDF-SHA256,
/// HMAC-SHA256, ChaCha20-Poly1305 and the random generator. Nothing here is a primitive of
/// our own; this file only strings them together as https://age-encryption.org/v1 says.
enum AgeCrypto {
    static func failure(_ step: String) -> TransferFailure {
        TransferFailure(.permanent, .encryptionError, "OpenSSL's libcrypto could not \(step); check dld's OpenSSL installation (libssl)")
    }

    static func random(_ count: Int) throws(TransferFailure) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: count)
        guard RAND_bytes(&out, Int32(count)) == 1 else { throw failure("draw random bytes") }
        return out
    }

    /// X25519(secret, basepoint): the public share of a secret scalar.
    static func x25519Public(secret: [UInt8]) throws(TransferFailure) -> [UInt8] {
        guard secret.count == 32, let key = EVP_PKEY_new_raw_private_key(EVP_PKEY_X25519, nil, secret, 32) else {
            throw failure("make an X25519 key")
        }
        defer { EVP_PKEY_free(key) }
        var out = [UInt8](repeating: 0, count: 32)
        var length = 32
        guard EVP_PKEY_get_raw_public_key(key, &out, &length) == 1, length == 32 else { throw failure("compute an X25519 public key") }
        return out
    }

    /// X25519(secret, peer). A peer of low order (the shared secret would be all zeros, which
    /// age forbids) is refused: OpenSSL refuses the derivation, and the result is checked too.
    static func x25519(secret: [UInt8], peer: [UInt8]) throws(TransferFailure) -> [UInt8] {
        guard secret.count == 32, peer.count == 32,
            let key = EVP_PKEY_new_raw_private_key(EVP_PKEY_X25519, nil, secret, 32)
        else { throw failure("make an X25519 key") }
        defer { EVP_PKEY_free(key) }
        guard let peerKey = EVP_PKEY_new_raw_public_key(EVP_PKEY_X25519, nil, peer, 32) else { throw failure("read an X25519 public key") }
        defer { EVP_PKEY_free(peerKey) }
        guard let context = EVP_PKEY_CTX_new(key, nil) else { throw failure("start an X25519 exchange") }
        defer { EVP_PKEY_CTX_free(context) }
        var out = [UInt8](repeating: 0, count: 32)
        var length = 32
        guard EVP_PKEY_derive_init(context) == 1, EVP_PKEY_derive_set_peer(context, peerKey) == 1,
            EVP_PKEY_derive(context, &out, &length) == 1, length == 32, out.contains(where: { $0 != 0 })
        else {
            throw TransferFailure(
                .permanent, .encryptionError,
                "the age recipient's key is not usable (X25519 with it gives no shared secret: a low-order point)")
        }
        return out
    }

    /// HKDF-SHA256 (extract then expand), `length` bytes.
    static func hkdf(ikm: [UInt8], salt: [UInt8], info: String, length: Int = 32) throws(TransferFailure) -> [UInt8] {
        try hkdfBytes(ikm: ikm, salt: salt, info: Array(info.utf8), length: length)
    }

    static func hkdfBytes(ikm: [UInt8], salt: [UInt8], info: [UInt8], length: Int) throws(TransferFailure) -> [UInt8] {
        guard let context = EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, nil) else { throw failure("start HKDF") }
        defer { EVP_PKEY_CTX_free(context) }
        var out = [UInt8](repeating: 0, count: length)
        var outLength = length
        // No salt is HKDF's salt of zeros (RFC 5869), which is what an empty salt means.
        guard EVP_PKEY_derive_init(context) == 1, EVP_PKEY_CTX_set_hkdf_md(context, EVP_sha256()) == 1,
            EVP_PKEY_CTX_set1_hkdf_key(context, ikm, Int32(ikm.count)) == 1,
            salt.isEmpty || EVP_PKEY_CTX_set1_hkdf_salt(context, salt, Int32(salt.count)) == 1,
            info.isEmpty || EVP_PKEY_CTX_add1_hkdf_info(context, info, Int32(info.count)) == 1,
            EVP_PKEY_derive(context, &out, &outLength) == 1, outLength == length
        else { throw failure("derive a key with HKDF-SHA256") }
        return out
    }

    static func hmacSHA256(key: [UInt8], _ data: [UInt8]) throws(TransferFailure) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: 32)
        var length: UInt32 = 0
        guard HMAC(EVP_sha256(), key, Int32(key.count), data, data.count, &out, &length) != nil, length == 32 else {
            throw failure("compute HMAC-SHA256")
        }
        return out
    }

    /// Unpadded standard base64, as age writes every binary field of its header.
    static func base64(_ bytes: [UInt8]) -> String {
        var text = Data(bytes).base64EncodedString()
        while text.hasSuffix("=") { text.removeLast() }
        return text
    }
}

/// ChaCha20-Poly1305 (RFC 8439) through EVP, one context reused for every seal.
final class ChaChaPoly {
    static let tagSize = 16
    private let context: OpaquePointer

    init() throws(TransferFailure) {
        guard let context = EVP_CIPHER_CTX_new() else { throw AgeCrypto.failure("start ChaCha20-Poly1305") }
        self.context = context
    }

    deinit { EVP_CIPHER_CTX_free(context) }

    /// Appends the ciphertext of `plaintext` and its 16-byte tag to `out`. `key` is 32 bytes,
    /// `nonce` 12.
    func seal(key: [UInt8], nonce: [UInt8], _ plaintext: UnsafeRawBufferPointer, into out: inout [UInt8]) throws(TransferFailure) {
        guard key.count == 32, nonce.count == 12, EVP_EncryptInit_ex(context, EVP_chacha20_poly1305(), nil, key, nonce) == 1 else {
            throw AgeCrypto.failure("start ChaCha20-Poly1305")
        }
        let start = out.count
        let count = plaintext.count
        out.append(contentsOf: repeatElement(0, count: count + Self.tagSize))
        let context = self.context
        let sealed = out.withUnsafeMutableBufferPointer { buffer -> Bool in
            guard let base = buffer.baseAddress.map({ $0 + start }) else { return false }
            var written: Int32 = 0
            if count > 0 {
                guard let input = plaintext.baseAddress?.assumingMemoryBound(to: UInt8.self),
                    EVP_EncryptUpdate(context, base, &written, input, Int32(count)) == 1, Int(written) == count
                else { return false }
            }
            var final: Int32 = 0
            guard EVP_EncryptFinal_ex(context, base + count, &final) == 1, final == 0 else { return false }
            return EVP_CIPHER_CTX_ctrl(context, EVP_CTRL_AEAD_GET_TAG, Int32(Self.tagSize), base + count) == 1
        }
        guard sealed else {
            out.removeSubrange(start...)
            throw AgeCrypto.failure("encrypt with ChaCha20-Poly1305")
        }
    }

    /// Opens what `seal` made; nil when the tag does not match. For tests and the header check.
    func open(key: [UInt8], nonce: [UInt8], _ sealed: [UInt8]) -> [UInt8]? {
        guard key.count == 32, nonce.count == 12, sealed.count >= Self.tagSize,
            EVP_DecryptInit_ex(context, EVP_chacha20_poly1305(), nil, key, nonce) == 1
        else { return nil }
        let count = sealed.count - Self.tagSize
        var out = [UInt8](repeating: 0, count: count + 1)
        var tag = Array(sealed[count...])
        var written: Int32 = 0
        var final: Int32 = 0
        let context = self.context
        let ok = sealed.withUnsafeBufferPointer { input -> Bool in
            out.withUnsafeMutableBufferPointer { output -> Bool in
                guard let inBase = input.baseAddress, let outBase = output.baseAddress else { return false }
                if count > 0, EVP_DecryptUpdate(context, outBase, &written, inBase, Int32(count)) != 1 { return false }
                guard EVP_CIPHER_CTX_ctrl(context, EVP_CTRL_AEAD_SET_TAG, Int32(Self.tagSize), &tag) == 1 else { return false }
                return EVP_DecryptFinal_ex(context, outBase + Int(written), &final) == 1
            }
        }
        return ok ? Array(out[..<count]) : nil
    }
}

/// Encrypts one file to age recipients (age v1, X25519 stanzas) as its plaintext streams in.
/// The file key, drawn at random for each file, lives only in this object: nothing that
/// could decrypt is written anywhere, and a file whose encryptor is gone cannot be continued.
///
/// The payload is cut into 64 KiB chunks, each sealed with its counter and a last-chunk flag
/// in the nonce. A full chunk is kept until more bytes come, because only then is it known
/// not to be the last (a plaintext of whole chunks ends with a full final chunk).
///
/// Not safe to use from two threads at once: `SealedOutput` keeps it behind its lock, which is
/// what the unchecked conformance relies on.
public final class AgeEncryptor: @unchecked Sendable {
    /// The file's first bytes: the header and the payload nonce.
    public let header: [UInt8]
    private let payloadKey: [UInt8]
    private let cipher: ChaChaPoly
    /// Plaintext of the chunk not yet sealed: at most one chunk.
    private var pending: [UInt8] = []
    private var counter: UInt64 = 0
    public private(set) var isFinished = false
    /// Plaintext bytes taken so far.
    public private(set) var plaintextCount: Int64 = 0

    public convenience init(recipients: [AgeRecipient]) throws(TransferFailure) {
        var secrets: [[UInt8]] = []
        for _ in recipients { secrets.append(try AgeCrypto.random(32)) }
        try self.init(recipients: recipients, fileKey: AgeCrypto.random(16), ephemeralSecrets: secrets, payloadNonce: AgeCrypto.random(16))
    }

    /// With the random values given: for tests, which must see the same file twice.
    init(recipients: [AgeRecipient], fileKey: [UInt8], ephemeralSecrets: [[UInt8]], payloadNonce: [UInt8]) throws(TransferFailure) {
        guard !recipients.isEmpty, fileKey.count == 16, payloadNonce.count == AgeLayout.payloadNonceSize,
            ephemeralSecrets.count == recipients.count
        else { throw AgeCrypto.failure("start an age file (internal: bad sizes)") }
        let cipher = try ChaChaPoly()
        var text = "age-encryption.org/v1\n"
        for (recipient, secret) in zip(recipients, ephemeralSecrets) {
            let share = try AgeCrypto.x25519Public(secret: secret)
            let shared = try AgeCrypto.x25519(secret: secret, peer: recipient.publicKey)
            let wrapKey = try AgeCrypto.hkdf(ikm: shared, salt: share + recipient.publicKey, info: "age-encryption.org/v1/X25519")
            var body: [UInt8] = []
            try fileKey.withRawBytes { (raw) throws(TransferFailure) in
                try cipher.seal(key: wrapKey, nonce: [UInt8](repeating: 0, count: 12), raw, into: &body)
            }
            // 32-byte fields are 43 base64 characters: each body is one line shorter than 64.
            text += "-> X25519 \(AgeCrypto.base64(share))\n\(AgeCrypto.base64(body))\n"
        }
        text += "---"
        let macKey = try AgeCrypto.hkdf(ikm: fileKey, salt: [], info: "header")
        let mac = try AgeCrypto.hmacSHA256(key: macKey, Array(text.utf8))
        text += " \(AgeCrypto.base64(mac))\n"
        header = Array(text.utf8) + payloadNonce
        payloadKey = try AgeCrypto.hkdf(ikm: fileKey, salt: payloadNonce, info: "payload")
        self.cipher = cipher
        pending.reserveCapacity(AgeLayout.chunkSize)
    }

    /// Takes plaintext; appends the chunks it completes, sealed, to `out` (often nothing).
    public func update(_ bytes: UnsafeRawBufferPointer, into out: inout [UInt8]) throws(TransferFailure) {
        guard !isFinished else { throw AgeCrypto.failure("encrypt (internal: bytes after the last chunk)") }
        var rest = bytes[...]
        while !rest.isEmpty {
            if pending.count == AgeLayout.chunkSize { try seal(last: false, into: &out) }
            let take = min(AgeLayout.chunkSize - pending.count, rest.count)
            pending.append(contentsOf: UnsafeRawBufferPointer(rebasing: rest.prefix(take)))
            rest = rest.dropFirst(take)
        }
        plaintextCount += Int64(bytes.count)
    }

    /// Seals the last chunk (short, full, or empty for an empty file) into `out`.
    public func finish(into out: inout [UInt8]) throws(TransferFailure) {
        guard !isFinished else { return }
        try seal(last: true, into: &out)
        isFinished = true
    }

    private func seal(last: Bool, into out: inout [UInt8]) throws(TransferFailure) {
        // Nonce: an 11-byte big-endian chunk counter, then the last-chunk flag.
        var nonce = [UInt8](repeating: 0, count: 12)
        for i in 0..<8 { nonce[3 + i] = UInt8(truncatingIfNeeded: counter >> UInt64(8 * (7 - i))) }
        nonce[11] = last ? 1 : 0
        let cipher = self.cipher
        let key = payloadKey
        try pending.withRawBytes { (raw) throws(TransferFailure) in
            try cipher.seal(key: key, nonce: nonce, raw, into: &out)
        }
        pending.removeAll(keepingCapacity: true)
        counter += 1
    }

    /// Whether X25519 with this recipient works (not a low-order point): asked at enqueue, so
    /// that a useless key fails the request and not the transfer.
    public static func check(_ recipient: AgeRecipient) -> TransferFailure? {
        do {
            _ = try AgeCrypto.x25519(secret: try AgeCrypto.random(32), peer: recipient.publicKey)
            return nil
        } catch {
            return error
        }
    }
}

/// An attempt's encrypted output: the partial file gets the header, then the sealed chunks,
/// appended in order. It never sees a plaintext byte. One stream writes it (encrypted jobs are
/// never segmented); the lock only makes it safe to hand between tasks.
final class SealedOutput: Sendable {
    private struct State {
        var encryptor: AgeEncryptor
        /// Where the next ciphertext byte goes.
        var position: Int64
        var buffer: [UInt8] = []
    }

    private let state: Mutex<State>
    private let file: PartialFile.Writer

    /// Writes the header at the start of `file` (which the caller truncated to 0).
    init(recipients: [AgeRecipient], file: PartialFile.Writer) throws(TransferFailure) {
        let encryptor = try AgeEncryptor(recipients: recipients)
        let header = encryptor.header
        try header.withRawBytes { (raw) throws(TransferFailure) in try file.write(raw, at: 0) }
        state = Mutex(State(encryptor: encryptor, position: Int64(header.count)))
        self.file = file
    }

    /// Encrypts `plaintext` and writes what it completes.
    func write(_ plaintext: UnsafeRawBufferPointer) throws(TransferFailure) {
        let file = self.file
        try state.withLock { (state) throws(TransferFailure) in
            state.buffer.removeAll(keepingCapacity: true)
            try state.encryptor.update(plaintext, into: &state.buffer)
            try Self.flush(&state, to: file)
        }
    }

    /// Seals and writes the last chunk: the file is then a complete age file.
    func finish() throws(TransferFailure) {
        let file = self.file
        try state.withLock { (state) throws(TransferFailure) in
            state.buffer.removeAll(keepingCapacity: true)
            try state.encryptor.finish(into: &state.buffer)
            try Self.flush(&state, to: file)
        }
    }

    private static func flush(_ state: inout State, to file: PartialFile.Writer) throws(TransferFailure) {
        guard !state.buffer.isEmpty else { return }
        let at = state.position
        try state.buffer.withRawBytes { (raw) throws(TransferFailure) in try file.write(raw, at: at) }
        state.position += Int64(state.buffer.count)
    }
}

extension Array where Element == UInt8 {
    /// `withUnsafeBytes` with the typed throws of this file (the standard one rethrows untyped).
    fileprivate func withRawBytes<R>(_ body: (UnsafeRawBufferPointer) throws(TransferFailure) -> R) throws(TransferFailure) -> R {
        let result: Result<R, TransferFailure> = withUnsafeBytes { raw -> Result<R, TransferFailure> in
            do throws(TransferFailure) {
                return .success(try body(raw))
            } catch {
                return .failure(error)
            }
        }
        return try result.get()
    }
}
