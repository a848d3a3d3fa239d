/// Small builders for JSON Schema (draft 2020-12, the subset OpenRPC 1.3 uses), so that each
/// method's params and result read as a few lines next to the code that decodes or writes them
/// (see `OpenRPC`).
public enum Schema {
    /// An object with exactly these members (`additionalProperties: false`: the daemon refuses
    /// unknown params, and its replies carry no others), `required` among them.
    public static func object(_ properties: [String: JSONValue], required: [String] = []) -> JSONValue {
        var schema: [String: JSONValue] = [
            "type": "object", "properties": .object(properties), "additionalProperties": false,
        ]
        if !required.isEmpty { schema["required"] = .array(required.sorted().map { .string($0) }) }
        return .object(schema)
    }

    /// An object whose members are all present, always (a reply's shape).
    public static func record(_ properties: [String: JSONValue]) -> JSONValue {
        object(properties, required: Array(properties.keys))
    }

    public static func integer(min: Int64? = nil, max: Int64? = nil) -> JSONValue {
        var schema: [String: JSONValue] = ["type": "integer"]
        if let min { schema["minimum"] = .int(min) }
        if let max { schema["maximum"] = .int(max) }
        return .object(schema)
    }

    public static func number(min: Int64? = nil, max: Int64? = nil) -> JSONValue {
        var schema: [String: JSONValue] = ["type": "number"]
        if let min { schema["minimum"] = .int(min) }
        if let max { schema["maximum"] = .int(max) }
        return .object(schema)
    }

    public static func string(minLength: Int? = nil, maxLength: Int? = nil, pattern: String? = nil) -> JSONValue {
        var schema: [String: JSONValue] = ["type": "string"]
        if let minLength { schema["minLength"] = .int(Int64(minLength)) }
        if let maxLength { schema["maxLength"] = .int(Int64(maxLength)) }
        if let pattern { schema["pattern"] = .string(pattern) }
        return .object(schema)
    }

    public static let boolean: JSONValue = ["type": "boolean"]
    public static let null: JSONValue = ["type": "null"]
    /// Any JSON value.
    public static let any: JSONValue = [:]

    /// Exactly this value.
    public static func constant(_ value: JSONValue) -> JSONValue { ["const": value] }

    /// One of these strings.
    public static func names(_ names: [String]) -> JSONValue {
        ["type": "string", "enum": .array(names.map { .string($0) })]
    }

    public static func array(_ items: JSONValue, minItems: Int? = nil, maxItems: Int? = nil) -> JSONValue {
        var schema: [String: JSONValue] = ["type": "array", "items": items]
        if let minItems { schema["minItems"] = .int(Int64(minItems)) }
        if let maxItems { schema["maxItems"] = .int(Int64(maxItems)) }
        return .object(schema)
    }

    /// A fixed-length array, each position its own schema.
    public static func tuple(_ items: [JSONValue]) -> JSONValue {
        let count = JSONValue.int(Int64(items.count))
        return ["type": "array", "prefixItems": .array(items), "items": false, "minItems": count, "maxItems": count]
    }

    /// The value matches at least one of the schemas.
    public static func anyOf(_ schemas: JSONValue...) -> JSONValue { ["anyOf": .array(schemas)] }

    /// The schema, or null.
    public static func nullable(_ schema: JSONValue) -> JSONValue { anyOf(schema, null) }

    /// A schema of `components.schemas` in the OpenRPC document.
    public static func ref(_ name: String) -> JSONValue { ["$ref": .string("#/components/schemas/\(name)")] }

    /// `2026-11-22T16:30:08Z`: UTC, whole seconds.
    public static let timestamp = string(pattern: #"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z$"#)
    /// A job id.
    public static let jobID = integer(min: 1)
    /// A group by id, or by name (the newest group of that name).
    public static let groupReference = anyOf(integer(min: 1), string())
}

extension JSONValue {
    /// The same schema with a `description` (only objects take one; anything else is returned as it is).
    public func described(_ text: String) -> JSONValue {
        guard case .object(var object) = self else { return self }
        object["description"] = .string(text)
        return .object(object)
    }
}
