import DLCore
import DLRPC
import Foundation
import Testing

/// The OpenRPC document (`rpc.discover`) is the method table: every method the daemon answers,
/// nothing else, each with the params its type takes, and it has OpenRPC's shape. Whether real
/// replies match its schemas, an end-to-end test checks (EndToEndTests, OpenRPCTests).
@Suite struct OpenRPCTests {
    let document = OpenRPC.document

    var methods: [JSONValue] { document["methods"]?.arrayValue ?? [] }

    @Test func everyMethodOfTheTableAndNothingElse() {
        #expect(methods.map { $0["name"]?.stringValue ?? "?" } == RPCMethod.names)
        #expect(RPCMethod.names.contains("rpc.discover"))
    }

    /// Each method's params are its params type's `keys`, with `required` from its schema.
    @Test func paramsAreWhatEachTypeTakes() throws {
        for (method, entry) in zip(RPCMethod.allCases, methods) {
            let params = try #require(entry["params"]?.arrayValue, "\(method)")
            #expect(Set(params.compactMap { $0["name"]?.stringValue }) == method.params.keys, "\(method)")
            #expect(params.count == method.params.keys.count, "\(method)")
            let schema = try #require(method.params.schema.objectValue, "\(method)")
            #expect(schema["additionalProperties"] == false, "\(method): unknown params are refused")
            for param in params {
                #expect(param["schema"]?.objectValue != nil && param["required"]?.boolValue != nil, "\(method): \(param)")
                #expect(param["description"]?.stringValue?.isEmpty == false, "\(method): \(param["name"] ?? nil) has no description")
            }
        }
        let enqueue = try #require(methods.first)
        let url = try #require(enqueue["params"]?.arrayValue?.first { $0["name"] == "url" })
        #expect(url["required"] == false, "batches and groups have no url")
        let change = try #require(methods.first { $0["name"] == "change" })
        #expect(change["params"]?.arrayValue?.first { $0["name"] == "id" }?["required"] == true)
    }

    /// OpenRPC 1.3's shape: the members it requires, schemas that are objects, `$ref`s that
    /// resolve, errors with unique codes per method.
    @Test func theDocumentHasOpenRPCsShape() throws {
        let version = try #require(document["openrpc"]?.stringValue)
        #expect(version.hasPrefix("1.3.") && version.split(separator: ".").count == 3)
        #expect(document["info"]?["title"]?.stringValue == "dld")
        #expect(document["info"]?["version"]?.stringValue == String(DLDVersion.protocolVersion))
        for method in methods {
            let name = method["name"]?.stringValue ?? "?"
            #expect(method["summary"]?.stringValue?.isEmpty == false, "\(name)")
            #expect(method["paramStructure"] == "by-name", "\(name)")
            #expect(method["result"]?["name"]?.stringValue != nil, "\(name)")
            #expect(method["result"]?["schema"]?.objectValue != nil, "\(name)")
            let errors = method["errors"]?.arrayValue ?? []
            let codes = try errors.map { reference -> Int64 in
                let error = try #require(resolve(reference["$ref"]), "\(name): \(reference)")
                let code = try #require(error["code"]?.int64Value)
                #expect(error["message"]?.stringValue != nil && error["data"]?["code"]?.stringValue != nil)
                return code
            }
            #expect(Set(codes).count == codes.count, "\(name): OpenRPC wants unique error codes per method")
        }
        let components = try #require(document["components"]?["errors"]?.objectValue)
        #expect(Set(components.keys) == Set(DLError.Code.allCases.map(\.rawValue)))
        for code in DLError.Code.allCases {
            #expect(components[code.rawValue]?["code"]?.int64Value == Int64(code.rpcCode), "\(code)")
            #expect(components[code.rawValue]?["data"] == ["code": .string(code.rawValue)])
        }
        var references: [String] = []
        collectReferences(document, into: &references)
        #expect(!references.isEmpty)
        for reference in references { #expect(resolve(.string(reference)) != nil, "\(reference) does not resolve") }
        for (name, schema) in document["components"]?["schemas"]?.objectValue ?? [:] {
            #expect(schema.objectValue != nil, "\(name)")
        }
    }

    /// The job's schema names exactly the members a job object has.
    @Test func theJobSchemaNamesEveryMember() throws {
        let job = Job(url: "https://example.com/a", path: "/tmp/a", createdAt: Date(), updatedAt: Date())
        let members = try #require(JobJSON.encode(job).objectValue).keys
        let schema = try #require(resolve("#/components/schemas/Job"))
        #expect(Set(schema["properties"]?.objectValue.map { Array($0.keys) } ?? []) == Set(members))
        #expect(Set(schema["required"]?.arrayValue?.compactMap(\.stringValue) ?? []) == Set(members))
    }

    /// `rpc.discover` takes no params and its own result is the document.
    @Test func discoverDescribesItself() throws {
        let discover = try #require(methods.last)
        #expect(discover["name"] == "rpc.discover")
        #expect(discover["params"] == [])
        #expect(ObjectIdentifier(RPCMethod.discover.params) == ObjectIdentifier(NoParams.self))
    }

    func resolve(_ reference: JSONValue?) -> JSONValue? {
        guard let text = reference?.stringValue, text.hasPrefix("#/") else { return nil }
        var node: JSONValue? = document
        for part in text.dropFirst(2).split(separator: "/") { node = node?[String(part)] }
        return node
    }

    func collectReferences(_ value: JSONValue, into references: inout [String]) {
        switch value {
        case .object(let object):
            if let reference = object["$ref"]?.stringValue { references.append(reference) }
            for member in object.values { collectReferences(member, into: &references) }
        case .array(let array):
            for element in array { collectReferences(element, into: &references) }
        default: break
        }
    }
}

/// Each method's errors in the document (`RPCMethod.errors`) are the ones its section of
/// docs/protocol.md names after "Errors: "; a method whose section names none has none of its own.
@Suite struct MethodErrorsTests {
    static func backticked<S: StringProtocol>(_ text: S) -> [String] {
        text.split(separator: "`", omittingEmptySubsequences: false).enumerated().filter { $0.offset % 2 == 1 }.map { String($0.element) }
    }

    @Test func eachMethodsErrorsAreTheDocs() throws {
        let text = try RPCMethodTests.protocolText()
        let start = try #require(text.range(of: "\n## Methods\n")).upperBound
        let end = try #require(text.range(of: "\n## Errors\n")).lowerBound
        let codes = Set(DLError.Code.allCases.map(\.rawValue))
        var documented: [RPCMethod: Set<String>] = [:]
        for section in text[start..<end].components(separatedBy: "\n### ").dropFirst() {
            let methods = Self.backticked(section.prefix { $0 != "\n" }).compactMap(RPCMethod.init(rawValue:))
            guard let errors = section.range(of: "Errors: ") else { continue }
            let rest = section[errors.upperBound...]
            let sentence = rest[..<(rest.range(of: #"\.(\s|$)"#, options: .regularExpression)?.lowerBound ?? rest.endIndex)]
            for method in methods { documented[method] = Set(Self.backticked(sentence)).intersection(codes) }
        }
        #expect(documented.count >= 10, "\(documented)")
        for method in RPCMethod.allCases {
            #expect(Set(method.errors.map(\.rawValue)) == documented[method] ?? [], "\(method.rawValue)")
        }
    }
}
