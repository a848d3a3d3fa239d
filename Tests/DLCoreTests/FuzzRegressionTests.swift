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
}
