import DLCore
import Foundation
import FuzzSupport

/// A response head from the bytes (status line and header lines, read as an HTTP/1.1 parser
/// would give them to dld), then what dld does with a response that is not a 200: the failure
/// kind of the status, its message, `Retry-After`, a redirect's `Location`, and the name a
/// `Content-Disposition` proposes — as `Downloader.statusFailure` and `take(_:into:)` do — and
/// the engine's retry decision on that failure.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ start: UnsafePointer<UInt8>?, _ count: Int) -> CInt {
    // Split on scalars: as Characters, "\r\n" is one grapheme and no "\n" would be found.
    let lines = fuzzText(start, count).unicodeScalars.split(separator: "\n", omittingEmptySubsequences: false)
        .map { Substring($0.last == "\r" ? $0.dropLast() : $0) }
    guard let statusLine = lines.first else { return 0 }
    // "HTTP/1.1 503 Service Unavailable": a status of three digits, as llhttp insists on.
    let parts = statusLine.split(separator: " ", maxSplits: 2, omittingEmptySubsequences: false)
    guard parts.count >= 2, parts[1].count == 3, parts[1].allSatisfy({ $0.isASCII && $0.isNumber }), let status = Int(parts[1]) else {
        return 0
    }
    let reason = parts.count > 2 ? String(parts[2]) : ""
    var headers: [(name: String, value: String)] = []
    for line in lines.dropFirst() {
        if line.isEmpty { break }
        guard let colon = line.firstIndex(of: ":") else { continue }
        headers.append((line[..<colon].lowercased(), line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)))
    }
    func first(_ name: String) -> String? { headers.first { $0.name == name }?.value }

    let kind = HTTPFailurePolicy.kind(forStatus: status)
    let transient = status == 408 || status == 429 || (500...599).contains(status)
    fuzzCheck((kind == .transient(.retry)) == transient, "status \(status) classified \(kind)")
    let message = HTTPFailurePolicy.message(host: "example.com", status: status, reason: reason)
    fuzzCheck(message.hasPrefix("example.com answered \(status)"), "message \(message)")
    let now = Date(timeIntervalSince1970: 1_700_000_000)
    let delay = HTTPFailurePolicy.retryAfter(first("retry-after"), now: now)
    if let delay { fuzzCheck(delay.isFinite && delay >= 0, "Retry-After gave \(delay)") }
    // The engine's answer: a server's Retry-After is honoured up to the cap, never more.
    let policy = BackoffPolicy()
    switch RetryDecision.decide(
        TransferFailure(kind, .httpStatus, message, retryAfter: delay), attempts: 1, policy: policy, now: now, unit: 0.5)
    {
    case .wait(_, let until):
        fuzzCheck(transient && until >= now && until.timeIntervalSince(now) <= policy.cap, "waits until \(until)")
    case .fail:
        fuzzCheck(!transient, "status \(status) gave up at once")
    }
    if (300...399).contains(status), let location = first("location"), let current = URL(string: "https://example.com/dir/file") {
        if case .success(let next) = RedirectPolicy.target(from: current, location: location) {
            fuzzCheck(next.scheme?.lowercased() == "https", "https redirected to \(next)")
        }
    }
    if let disposition = first("content-disposition"), let name = ContentDisposition.filename(disposition) {
        _ = FileNames.sanitize(name)
    }
    _ = first("content-length").flatMap { Int64($0) }
    // The URL cache's freshness headers go through the same HTTP-date parser.
    for name in ["date", "expires", "last-modified"] { _ = HTTPDate.parse(first(name)) }
    return 0
}

runFuzzer(fuzz)
