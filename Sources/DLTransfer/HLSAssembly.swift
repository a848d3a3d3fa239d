import CCrypto
import DLCore
import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// Joins an HLS group's staged members into one file: each piece (a member, or a byte range
/// of it) in order, decrypted with AES-128-CBC and PKCS#7 padding (OpenSSL EVP) when it has a
/// key. Reads and writes 1 MiB at a time: memory does not grow with the video.
public enum HLSAssembler {
    static let chunk = 1 << 20

    /// Writes the pieces, read from files in `folder`, into `output` (created or truncated,
    /// mode 0644), and syncs it and its folder: the group is recorded completed next, and a
    /// power cut must not leave that record with a joined file whose name was lost. Errors:
    /// `hls_assembly` (a key of the wrong size, a piece that does not decrypt, a range beyond
    /// its file), `file_error`.
    public static func join(_ pieces: [HLSRecipe.Piece], from folder: String, into output: String) throws(TransferFailure) {
        let out = open(output, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
        guard out >= 0 else { throw fileFailure("create", output, errno) }
        defer { _ = close(out) }
        var keys: [String: [UInt8]] = [:]
        var written: Int64 = 0
        for piece in pieces {
            var key: [UInt8]?
            if let keyName = piece.keyName {
                if let known = keys[keyName] {
                    key = known
                } else {
                    let bytes = try readAll(folder + "/" + keyName, limit: 64)
                    guard bytes.count == 16 else {
                        throw TransferFailure(
                            .permanent, .hlsAssembly,
                            "the AES-128 key \(keyName) is \(bytes.count) bytes, not 16; the server sent something else")
                    }
                    keys[keyName] = bytes
                    key = bytes
                }
            }
            try copy(piece, key: key, from: folder + "/" + piece.name, to: out, output: output, written: &written)
        }
        guard fsync(out) == 0 else { throw fileFailure("sync", output, errno) }
        let code = PartialFile.syncFolder((output as NSString).deletingLastPathComponent)
        guard code == 0 else { throw fileFailure("sync the folder of", output, code) }
    }

    private static func copy(
        _ piece: HLSRecipe.Piece, key: [UInt8]?, from path: String, to out: Int32, output: String, written: inout Int64
    ) throws(TransferFailure) {
        let input = open(path, O_RDONLY | O_CLOEXEC)
        guard input >= 0 else { throw fileFailure("open", path, errno) }
        defer { _ = close(input) }
        var info = stat()
        guard fstat(input, &info) == 0 else { throw fileFailure("read", path, errno) }
        let size = Int64(info.st_size)
        let start = piece.range?.offset ?? 0
        let length = piece.range?.length ?? size
        guard start >= 0, length >= 0, start <= size, length <= size - start else {
            throw TransferFailure(
                .permanent, .hlsAssembly,
                "the byte range \(length)@\(start) of \(piece.name) lies beyond its \(size) bytes; the server's file is not the playlist's")
        }
        var cipher: OpaquePointer?
        if let key {
            guard let iv = piece.iv, iv.count == 16, let context = EVP_CIPHER_CTX_new() else {
                throw TransferFailure(.permanent, .hlsAssembly, "\(piece.name) has no IV to decrypt it with")
            }
            cipher = context
            guard EVP_DecryptInit_ex(context, EVP_aes_128_cbc(), nil, key, iv) == 1 else {
                EVP_CIPHER_CTX_free(context)
                throw TransferFailure(.permanent, .hlsAssembly, "OpenSSL could not start AES-128-CBC")
            }
        }
        defer { if let cipher { EVP_CIPHER_CTX_free(cipher) } }
        var buffer = [UInt8](repeating: 0, count: chunk)
        var plain = [UInt8](repeating: 0, count: chunk + 32)
        var offset = start
        let end = start + length
        while offset < end {
            let want = Int(min(Int64(chunk), end - offset))
            let got = buffer.withUnsafeMutableBytes { pread(input, $0.baseAddress, want, off_t(offset)) }
            guard got > 0 else {
                throw got == 0
                    ? TransferFailure(.permanent, .hlsAssembly, "\(piece.name) ended early") : fileFailure("read", path, errno)
            }
            offset += Int64(got)
            if let cipher {
                var produced: Int32 = 0
                guard EVP_DecryptUpdate(cipher, &plain, &produced, buffer, Int32(got)) == 1 else {
                    throw TransferFailure(.permanent, .hlsAssembly, "\(piece.name) could not be decrypted")
                }
                try write(out, plain, Int(produced), output, &written)
            } else {
                try write(out, buffer, got, output, &written)
            }
        }
        if let cipher {
            var produced: Int32 = 0
            // The last block's PKCS#7 padding: a wrong key or IV shows here.
            guard EVP_DecryptFinal_ex(cipher, &plain, &produced) == 1 else {
                throw TransferFailure(
                    .permanent, .hlsAssembly,
                    "\(piece.name) does not decrypt with its AES-128 key and IV (bad padding): the key or the segment is not the playlist's"
                )
            }
            try write(out, plain, Int(produced), output, &written)
        }
    }

    private static func write(_ fd: Int32, _ bytes: [UInt8], _ count: Int, _ path: String, _ written: inout Int64) throws(TransferFailure) {
        var done = 0
        while done < count {
            let result = bytes.withUnsafeBytes { pwrite(fd, $0.baseAddress.map { $0 + done }, count - done, off_t(written)) }
            guard result > 0 else { throw fileFailure("write", path, errno) }
            done += result
            written += Int64(result)
        }
    }

    /// A small file whole (a key), at most `limit` bytes.
    static func readAll(_ path: String, limit: Int) throws(TransferFailure) -> [UInt8] {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw fileFailure("open", path, errno) }
        defer { _ = close(fd) }
        var buffer = [UInt8](repeating: 0, count: limit + 1)
        let got = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, limit + 1) }
        guard got >= 0 else { throw fileFailure("read", path, errno) }
        return Array(buffer.prefix(got))
    }

    /// Writes `text` to `path` durably: a temporary name, fsync, rename, fsync of the folder.
    public static func writeDurably(_ text: String, to path: String) throws(TransferFailure) {
        let temporary = path + ".tmp"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
        guard fd >= 0 else { throw fileFailure("create", temporary, errno) }
        var written: Int64 = 0
        let bytes = Array(text.utf8)
        do throws(TransferFailure) {
            try write(fd, bytes, bytes.count, temporary, &written)
            guard fsync(fd) == 0 else { throw fileFailure("sync", temporary, errno) }
        } catch {
            _ = close(fd)
            throw error
        }
        _ = close(fd)
        guard rename(temporary, path) == 0 else { throw fileFailure("rename", temporary, errno) }
        PartialFile.syncDirectory(of: path)
    }

    static func fileFailure(_ what: String, _ path: String, _ code: Int32) -> TransferFailure {
        TransferFailure(.permanent, .fileError, "could not \(what) \(path): \(String(cString: strerror(code)))")
    }
}
