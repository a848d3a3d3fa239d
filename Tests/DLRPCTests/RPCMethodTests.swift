import DLRPC
import Foundation
import Testing

/// The method table (`RPCMethod`) and the public contract agree: docs/protocol.md's "Methods"
/// line lists exactly the table's methods, in its order, and each has a section of its own.
@Suite struct RPCMethodTests {
    static func protocolText() throws -> String {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        return try String(contentsOf: root.appendingPathComponent("docs/protocol.md"), encoding: .utf8)
    }

    @Test func theDocsListExactlyTheTable() throws {
        let text = try Self.protocolText()
        let section = try #require(text.range(of: "## Methods\n"))
        let rest = text[section.upperBound...]
        let line = try #require(rest.range(of: "Methods: ")).upperBound
        let end = try #require(rest[line...].range(of: ". ")).lowerBound
        let listed = rest[line..<end].split(separator: ",").map {
            $0.trimmingCharacters(in: .whitespacesAndNewlines).trimmingCharacters(in: CharacterSet(charactersIn: "`"))
        }
        #expect(listed == RPCMethod.names)
        for method in RPCMethod.allCases {
            #expect(
                text.contains("`\(method.rawValue)`") && text.range(of: "### .*`\(method.rawValue)`", options: .regularExpression) != nil,
                "\(method.rawValue) has no section of its own")
        }
    }
}
