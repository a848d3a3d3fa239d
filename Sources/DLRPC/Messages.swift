import DLCore
import Foundation

/// A JSON-RPC 2.0 request with named params. `id == nil` means a notification (no reply).
public struct RPCRequest: Sendable, Equatable {
    public var method: String
    public var params: [String: JSONValue]
    public var id: JSONValue?
    /// The params were an array: refused, since dld takes named params only.
    public var positional = false

    public init(method: String, params: [String: JSONValue] = [:], id: JSONValue? = nil) {
        self.method = method
        self.params = params
        self.id = id
    }

    public var json: JSONValue {
        var object: [String: JSONValue] = ["jsonrpc": "2.0", "method": .string(method)]
        if !params.isEmpty { object["params"] = .object(params) }
        if let id { object["id"] = id }
        return .object(object)
    }
}

/// A JSON-RPC error object. Every error dld sends carries `data.code`, a stable string.
public struct RPCError: Error, Sendable, Equatable, CustomStringConvertible {
    public var code: Int
    public var message: String
    public var data: JSONValue?

    public init(code: Int, message: String, data: JSONValue? = nil) {
        self.code = code
        self.message = message
        self.data = data
    }

    public init(_ error: DLError) {
        self.init(code: error.code.rpcCode, message: error.message, data: ["code": .string(error.code.rawValue)])
    }

    /// The stable snake_case code from `data.code`.
    public var stableCode: String { data?["code"]?.stringValue ?? "error_\(code)" }

    public var json: JSONValue {
        var object: [String: JSONValue] = ["code": .int(Int64(code)), "message": .string(message)]
        if let data { object["data"] = data }
        return .object(object)
    }

    public var description: String { "\(message) (\(stableCode))" }
}

extension DLError.Code {
    /// The JSON-RPC numeric code: the standard ones, then application codes in -32000...-32099.
    public var rpcCode: Int {
        switch self {
        case .parseError: return -32700
        case .invalidRequest, .lineTooLong: return -32600
        case .methodNotFound: return -32601
        case .invalidParams: return -32602
        case .internalError, .storageError: return -32603
        case .jobNotFound: return -32001
        case .invalidState: return -32002
        case .destinationExists: return -32003
        case .destinationInvalid: return -32004
        case .invalidURL: return -32005
        case .shuttingDown: return -32007
        case .groupNotFound: return -32008
        case .destinationNotAllowed: return -32009
        case .queueFull: return -32010
        case .downloadFailed: return -32020
        case .hlsInvalid: return -32021
        case .hlsUnsupportedEncryption: return -32022
        case .hlsLive: return -32023
        case .hlsUnsupported: return -32024
        case .hlsFetchFailed: return -32025
        case .invalidMetalink: return -32011
        }
    }
}

/// A response to one request. It is an `Error` too, so that a request that cannot be served
/// carries the response to send back.
public struct RPCResponse: Error, Sendable, Equatable {
    public var id: JSONValue
    public var result: Result<JSONValue, RPCError>

    public init(id: JSONValue, result: Result<JSONValue, RPCError>) {
        self.id = id
        self.result = result
    }

    public var json: JSONValue {
        switch result {
        case .success(let value): return ["jsonrpc": "2.0", "id": id, "result": value]
        case .failure(let error): return ["jsonrpc": "2.0", "id": id, "error": error.json]
        }
    }

    /// Reads a response object; nil if it is not one.
    public init?(json: JSONValue) {
        guard case .object(let object) = json, object["jsonrpc"] == "2.0" else { return nil }
        self.id = object["id"] ?? .null
        if let error = object["error"]?.objectValue {
            let code = error["code"]?.int64Value.map { Int($0) } ?? -32603
            let message = error["message"]?.stringValue ?? "unknown error"
            self.result = .failure(RPCError(code: code, message: message, data: error["data"]))
        } else if let result = object["result"] {
            self.result = .success(result)
        } else {
            return nil
        }
    }
}

/// What one line from a client holds, once parsed.
public enum RPCIncoming: Sendable {
    /// One request, or the error to send back for it (with the id when it could be read).
    case single(Result<RPCRequest, RPCResponse>)
    /// A batch: each element parsed on its own.
    case batch([Result<RPCRequest, RPCResponse>])
    /// Not JSON, or an empty batch: one error response.
    case invalid(RPCResponse)

    /// Parses one line (without its newline).
    public static func parse(_ line: Data) -> RPCIncoming {
        let value: JSONValue
        do {
            value = try JSONValue.parse(line)
        } catch {
            return .invalid(RPCResponse(id: .null, result: .failure(RPCError(DLError(.parseError, "parse error: not valid JSON")))))
        }
        switch value {
        case .array(let elements):
            guard !elements.isEmpty else {
                return .invalid(
                    RPCResponse(id: .null, result: .failure(RPCError(DLError(.invalidRequest, "invalid request: empty batch")))))
            }
            return .batch(elements.map(request(from:)))
        default:
            return .single(request(from: value))
        }
    }

    static func request(from value: JSONValue) -> Result<RPCRequest, RPCResponse> {
        func invalid(_ message: String, id: JSONValue = .null) -> Result<RPCRequest, RPCResponse> {
            .failure(RPCResponse(id: id, result: .failure(RPCError(DLError(.invalidRequest, "invalid request: " + message)))))
        }
        guard case .object(let object) = value else { return invalid("a request must be a JSON object") }
        var id: JSONValue? = nil
        if let rawID = object["id"] {
            switch rawID {
            case .int, .string, .null, .double: id = rawID
            default: return invalid("id must be a string, a number or null")
            }
        }
        guard object["jsonrpc"] == "2.0" else { return invalid("\"jsonrpc\" must be \"2.0\"", id: id ?? .null) }
        guard let method = object["method"]?.stringValue else {
            return invalid("\"method\" must be a string", id: id ?? .null)
        }
        for key in object.keys where !["jsonrpc", "method", "params", "id"].contains(key) {
            return invalid("unknown member \"\(key)\"", id: id ?? .null)
        }
        var params: [String: JSONValue] = [:]
        switch object["params"] {
        case nil, .some(.null): break
        case .some(.object(let given)): params = given
        case .some(.array):
            // Still a request: a notification gets no answer, even to say its params are wrong.
            var request = RPCRequest(method: method, params: [:], id: id)
            request.positional = true
            return .success(request)
        case .some(let other):
            return invalid("params must be an object, not \(other.typeName)", id: id ?? .null)
        }
        return .success(RPCRequest(method: method, params: params, id: id))
    }
}
