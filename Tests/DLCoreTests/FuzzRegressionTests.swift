import DLCore
import Foundation
import Testing

/// Inputs that crashed a parser (found with the fuzz targets in Fuzz/, `make fuzz`), each kept
/// here so that the bug stays fixed. Each must now be an error or a value, never a trap.
@Suite struct FuzzRegressionTests {
    /// `a = [[[[…`: every `[` was a recursive call, and 200 000 of them overflowed the stack
    /// (SIGSEGV in TOMLLite.Scanner.array) of whoever read the config file.
    @Test func tomlDeeplyNestedArrays() throws {
        let crashing = "a = " + String(repeating: "[", count: 200_000)
        #expect(throws: TOMLLite.ParseError.self) { try TOMLLite.parse(crashing) }
        do {
            _ = try TOMLLite.parse(crashing)
        } catch let error as TOMLLite.ParseError {
            #expect(error.line == 1)
            #expect(error.message.contains("nested deeper than \(TOMLLite.maxDepth)"))
        }
        // Up to the limit, nesting still parses.
        let deepest = String(repeating: "[", count: TOMLLite.maxDepth) + "1" + String(repeating: "]", count: TOMLLite.maxDepth)
        var expected = TOMLLite.Value.integer(1)
        for _ in 0..<TOMLLite.maxDepth { expected = .array([expected]) }
        #expect(try TOMLLite.parse("a = " + deepest).first?.value == expected)
        #expect(throws: TOMLLite.ParseError.self) { try TOMLLite.parse("a = [" + deepest + "]") }
    }

    /// A 503 whose `Retry-After` was "t\u{313}…" (a combining mark, as a server can send any
    /// bytes): Foundation's DateFormatter trapped with "Incorrect range CFRange(location: 0,
    /// length: 1)", which took the daemon down. Found by fuzz-http-response.
    @Test func retryAfterWithCombiningMark() {
        let now = Date(timeIntervalSince1970: 1_700_000_000)
        let crashing = "t\u{313}\u{FFFD}g\u{FFFD}+12 y\u{1B}"
        #expect(HTTPFailurePolicy.retryAfter(crashing, now: now) == nil)
        #expect(HTTPFailurePolicy.retryAfter("Thu\u{301}, 01 Jan 2099 00:00:00 GMT", now: now) == nil)
        // The cache reads Date, Expires and Last-Modified with the same parser.
        #expect(HTTPDate.parse(crashing) == nil)
        // Dates and seconds still count.
        #expect(HTTPFailurePolicy.retryAfter("120", now: now) == 120)
        #expect(HTTPFailurePolicy.retryAfter("Tue, 14 Nov 2023 22:13:27 GMT", now: now) == 7)
    }
}
