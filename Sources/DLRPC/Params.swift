import DLCore
import Foundation

/// Typed access to a request's named params. Unknown names are rejected up front, because a
/// typo such as `priorty` must not pass silently.
public struct Params: Sendable {
    public let values: [String: JSONValue]

    public init(_ values: [String: JSONValue], allowed: Set<String>) throws(DLError) {
        if values.keys.contains(where: { !allowed.contains($0) }) {
            let unknown = values.keys.filter { !allowed.contains($0) }.sorted()
            let list = unknown.map { "\"\($0)\"" }.joined(separator: ", ")
            let known = allowed.sorted().joined(separator: ", ")
            throw .invalidParams("unknown param \(list); this method takes: \(known.isEmpty ? "no params" : known)")
        }
        self.values = values
    }

    /// The value of `key`, nil when absent or null. A job of an `enqueue` gives a few of the
    /// two dozen names asked for: a few entries are compared one by one, which is quicker than
    /// hashing the name (the hashes were most of an enqueue's look-ups).
    public func value(_ key: String) -> JSONValue? {
        var found: JSONValue? = nil
        if values.count <= 6 {
            for (name, value) in values where name == key {
                found = value
                break
            }
        } else {
            found = values[key]
        }
        guard let found, !found.isNull else { return nil }
        return found
    }

    public func has(_ key: String) -> Bool {
        value(key) != nil
    }

    public func string(_ key: String) throws(DLError) -> String? {
        guard let value = value(key) else { return nil }
        guard let s = value.stringValue else { throw mistyped(key, "a string", value) }
        return s
    }

    public func requiredString(_ key: String) throws(DLError) -> String {
        guard let s = try string(key) else { throw .invalidParams("missing param \"\(key)\"") }
        return s
    }

    public func int(_ key: String, in range: ClosedRange<Int64> = Int64.min...Int64.max) throws(DLError) -> Int64? {
        guard let value = value(key) else { return nil }
        guard let i = value.int64Value else { throw mistyped(key, "an integer", value) }
        guard range.contains(i) else {
            throw .invalidParams("param \"\(key)\" must be between \(range.lowerBound) and \(range.upperBound), got \(i)")
        }
        return i
    }

    public func bool(_ key: String) throws(DLError) -> Bool? {
        guard let value = value(key) else { return nil }
        guard let b = value.boolValue else { throw mistyped(key, "true or false", value) }
        return b
    }

    public func array(_ key: String) throws(DLError) -> [JSONValue]? {
        guard let value = value(key) else { return nil }
        guard let a = value.arrayValue else { throw mistyped(key, "an array", value) }
        return a
    }

    public func object(_ key: String) throws(DLError) -> [String: JSONValue]? {
        guard let value = value(key) else { return nil }
        guard let o = value.objectValue else { throw mistyped(key, "an object", value) }
        return o
    }

    /// `id`, `ids`, `group` or `all: true`: exactly one of them.
    public func selection() throws(DLError) -> JobSelection {
        let options = ["id", "ids", "all"] + (values.keys.contains("group") ? ["group"] : [])
        let given = options.filter { has($0) }
        guard given.count == 1 else {
            let list = options.map { "\"\($0)\"" }.joined(separator: ", ")
            throw .invalidParams(given.isEmpty ? "give one of \(list)" : "give only one of \(list)")
        }
        if let group = try groupReference() { return .group(group) }
        if let id = try int("id", in: 1...Int64.max) { return .ids([id]) }
        if let ids = try array("ids") {
            var out: [JobID] = []
            for element in ids {
                guard let id = element.int64Value, id >= 1 else {
                    throw .invalidParams("param \"ids\" must be an array of job ids (positive integers)")
                }
                out.append(id)
            }
            guard !out.isEmpty else { throw .invalidParams("param \"ids\" must not be empty") }
            return .ids(out)
        }
        guard try bool("all") == true else { throw .invalidParams("param \"all\" must be true when given") }
        return .all
    }

    /// `group`: a group id (integer) or name (string).
    public func groupReference() throws(DLError) -> GroupReference? {
        guard let value = value("group") else { return nil }
        if let id = value.int64Value, id >= 1 { return .id(id) }
        if let name = value.stringValue, !name.isEmpty { return .name(name) }
        throw .invalidParams("param \"group\" must be a group id or name")
    }

    private func mistyped(_ key: String, _ expected: String, _ value: JSONValue) -> DLError {
        .invalidParams("param \"\(key)\" must be \(expected), not \(value.typeName)")
    }
}
