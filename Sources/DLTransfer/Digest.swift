import CCrypto
import DLCore

/// A streaming digest over OpenSSL's EVP API: bytes are hashed as they arrive, so a verified
/// download reads nothing twice.
public final class StreamingDigest {
    public let algorithm: DigestAlgorithm
    private let context: OpaquePointer

    public init?(_ algorithm: DigestAlgorithm) {
        guard let context = EVP_MD_CTX_new() else { return nil }
        self.algorithm = algorithm
        self.context = context
        guard reset() else {
            EVP_MD_CTX_free(context)
            return nil
        }
    }

    deinit { EVP_MD_CTX_free(context) }

    /// Starts over, as if no byte had been seen.
    @discardableResult
    public func reset() -> Bool {
        let md: OpaquePointer?
        switch algorithm {
        case .sha256: md = EVP_sha256()
        case .sha512: md = EVP_sha512()
        case .sha1: md = EVP_sha1()
        case .md5: md = EVP_md5()
        }
        return EVP_DigestInit_ex(context, md, nil) == 1
    }

    public func update(_ bytes: UnsafeRawBufferPointer) {
        guard let base = bytes.baseAddress, bytes.count > 0 else { return }
        EVP_DigestUpdate(context, base, bytes.count)
    }

    public func update(_ bytes: [UInt8]) {
        bytes.withUnsafeBytes { update($0) }
    }

    /// The digest in lowercase hex. The context is reset afterwards.
    public func finalize() -> String {
        var out = [UInt8](repeating: 0, count: Int(EVP_MAX_MD_SIZE))
        var length: UInt32 = 0
        EVP_DigestFinal_ex(context, &out, &length)
        reset()
        return Hex.encode(out.prefix(Int(length)))
    }
}
