/// Resuming from a server that names no validator (no strong ETag, no Last-Modified): If-Range
/// cannot guard the request, so the bytes on disk are checked against the server's instead of
/// being trusted or dropped blindly. One request, `Range: bytes=(offset - overlap)-`: its answer
/// must be a `206` from exactly there with the total the file was fetched with, and its first
/// `overlap` bytes must equal the file's last `overlap` bytes on disk; the rest of the body is
/// the resume. Anything else starts the file over, with the reason. Pure: the Downloader
/// carries it out (see docs/architecture.md, "Resume without validators").
public enum OverlapResume {
    /// How much is asked again before the kept offset and compared: the last 64 KiB on disk.
    public static let length: Int64 = 64 << 10

    /// What a resume of `received` kept bytes without a validator does.
    public enum Plan: Sendable, Equatable {
        /// Ask from `from` (`Range: bytes=from-`), compare the first `overlap` bytes.
        case check(from: Int64, overlap: Int64)
        /// The bytes cannot be checked: start over from 0, for this reason.
        case startOver(String)
    }

    /// The plan for `received` bytes kept from a file of `size` bytes (nil: the server never
    /// said). The total of the answer is what proves the file's length, so a size is needed;
    /// and a server that did not say it takes ranges is not asked for one.
    public static func plan(received: Int64, size: Int64?, acceptsRanges: Bool, overlap: Int64 = length) -> Plan {
        guard acceptsRanges else {
            return .startOver(
                "the server gave no ETag or Last-Modified and did not say it takes byte ranges, so the bytes on disk cannot be checked")
        }
        guard let size else {
            return .startOver("the server gave no ETag or Last-Modified and no size, so the bytes on disk cannot be checked")
        }
        guard received > 0, received <= size else {
            return .startOver("the \(received) bytes on disk do not fit the \(size)-byte file the server announced")
        }
        let length = min(max(1, overlap), received)
        return .check(from: received - length, overlap: length)
    }

    /// Why the answer to the overlap request cannot continue the file, or nil when its bytes are
    /// to be compared: it must be a `206` starting at `from` with the recorded total.
    /// (`200` is the caller's: it means start over, with the body that came.)
    public static func refusal(start: Int64?, total: Int64?, from: Int64, size: Int64) -> String? {
        guard let start, start == from else {
            return
                "the server gave no ETag or Last-Modified, and its answer to the range from byte \(from) starts \(start.map { "at byte \($0)" } ?? "nowhere it says")"
        }
        guard let total, total == size else {
            return
                "the server gave no ETag or Last-Modified, and the file is \(total.map { "\($0) bytes" } ?? "of no stated size") now; the bytes on disk came from a \(size)-byte file"
        }
        return nil
    }

    /// The reason to start over when the bytes served before the kept offset differ from the
    /// file: `at` is the first byte that differs.
    public static func changed(at: Int64, offset: Int64) -> String {
        "the file changed: the server gave no ETag or Last-Modified, and the bytes it sent again before byte \(offset) differ from the file on disk (from byte \(at))"
    }

    /// The first index where `served` differs from `disk` (compared over the shorter), or nil.
    public static func firstDifference(_ disk: UnsafeRawBufferPointer, _ served: UnsafeRawBufferPointer) -> Int? {
        let count = min(disk.count, served.count)
        for i in 0..<count where disk[i] != served[i] { return i }
        return nil
    }
}
