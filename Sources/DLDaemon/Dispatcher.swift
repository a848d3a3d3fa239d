import DLCore
import DLEngine
import DLRPC
import DLJobTable
import DLTransfer
import Foundation

/// Turns request lines into response lines: JSON-RPC framing rules, then one method each.
/// Holds no socket, so every rule here is tested without one.
public struct Dispatcher: Sendable {
    public typealias Limits = RPCLimits

    let engine: Engine
    /// The URL cache behind `get`; nil: `get` is refused (tests of other methods).
    let cache: URLCache?
    let limits: Limits

    public init(engine: Engine, cache: URLCache? = nil, limits: Limits = Limits()) {
        self.engine = engine
        self.cache = cache
        self.limits = limits
    }

    /// What to do with one request line.
    public struct Reply: Sendable {
        /// The response line, or nil when nothing is to be sent back (only notifications).
        public var data: Data?
        /// A `shutdown` request succeeded: stop once the reply is sent.
        public var shutdown = false
        /// A `subscribe` request: the connection becomes an event stream.
        public var subscription: Subscription?
    }

    public struct Subscription: Sendable {
        public var id: JSONValue
        public var filter: EventHub.Filter
        public var since: Int64?
    }

    public func handle(line: Data) async -> Reply {
        var reply = Reply()
        switch RPCIncoming.parse(line) {
        case .invalid(let response):
            reply.data = response.json.serialized()
        case .single(.success(let request)) where request.method == RPCMethod.subscribe.rawValue:
            do {
                reply.subscription = try await subscription(request)
            } catch {
                reply.data = RPCResponse(id: request.id ?? .null, result: .failure(RPCError(error))).json.serialized()
            }
        case .single(let parsed):
            reply.data = await respond(parsed, &reply.shutdown)?.json.serialized()
        case .batch(let elements):
            var responses: [JSONValue] = []
            for element in elements {
                if let response = await respond(element, &reply.shutdown) { responses.append(response.json) }
            }
            reply.data = responses.isEmpty ? nil : JSONValue.array(responses).serialized()
        }
        return reply
    }

    private func respond(_ parsed: Result<RPCRequest, RPCResponse>, _ shutdown: inout Bool) async -> RPCResponse? {
        switch parsed {
        case .failure(let response):
            return response
        case .success(let request):
            let result: Result<JSONValue, RPCError>
            do throws(DLError) {
                if request.positional { throw DLError(.invalidParams, "params must be named (an object), not positional") }
                result = .success(try await call(request.method, request.params))
            } catch {
                result = .failure(RPCError(error))
            }
            if request.method == RPCMethod.shutdown.rawValue, case .success = result { shutdown = true }
            guard let id = request.id else { return nil }
            return RPCResponse(id: id, result: result)
        }
    }

    private func subscription(_ request: RPCRequest) async throws(DLError) -> Subscription {
        guard let id = request.id else { throw DLError(.invalidRequest, "subscribe must be a request with an id, not a notification") }
        let params = try SubscribeParams(request.params, limits: limits)
        var filter = EventHub.Filter()
        filter.ids = params.ids
        if let reference = params.group { filter.group = try await engine.groupID(reference) }
        return Subscription(id: id, filter: filter, since: params.since)
    }

    /// One method, by the protocol's table: its params decoded by their type, then answered.
    func call(_ name: String, _ raw: [String: JSONValue]) async throws(DLError) -> JSONValue {
        guard let method = RPCMethod(rawValue: name) else {
            throw DLError(.methodNotFound, "unknown method \"\(name.prefix(100))\"; methods: \(RPCMethod.names.joined(separator: ", "))")
        }
        switch method {
        case .enqueue: return try await enqueue(EnqueueParams(raw, limits: limits))
        case .pause: return Self.bulkReply(try await engine.pause(SelectionParams(raw, limits: limits).selection))
        case .resume: return Self.bulkReply(try await engine.resume(SelectionParams(raw, limits: limits).selection))
        case .cancel: return Self.bulkReply(try await engine.cancel(SelectionParams(raw, limits: limits).selection))
        case .remove: return try await remove(RemoveParams(raw, limits: limits))
        case .status: return try await status(StatusParams(raw, limits: limits))
        case .list: return try await list(ListParams(raw, limits: limits))
        case .stats:
            _ = try NoParams(raw, limits: limits)
            return try await stats()
        case .queue: return try await queue(QueueParams(raw, limits: limits))
        case .setSpeed: return try await setSpeed(SetSpeedParams(raw, limits: limits))
        case .change: return try await change(ChangeParams(raw, limits: limits))
        case .get: return try await get(GetParams(raw, limits: limits))
        case .unpin: return try await unpin(UnpinParams(raw, limits: limits))
        case .cacheList:
            _ = try NoParams(raw, limits: limits)
            return try await cacheList()
        case .subscribe:
            throw DLError(.invalidRequest, "subscribe must be sent alone, not in a batch")
        case .version:
            _ = try NoParams(raw, limits: limits)
            return ["version": .string(DLDVersion.current), "protocol": .int(Int64(DLDVersion.protocolVersion))]
        case .shutdown:
            _ = try NoParams(raw, limits: limits)
            return ["ok": true]
        case .discover:
            _ = try NoParams(raw, limits: limits)
            return OpenRPC.document
        }
    }

    /// The reply of a bulk command: how many jobs changed and the first of their ids, so that
    /// it stays small whatever the count (docs/protocol.md, "Bulk commands").
    static func bulkReply(_ outcome: BulkOutcome, alsoAs alias: String? = nil) -> JSONValue {
        let ids = JSONValue.array(outcome.ids.map { .int($0) })
        var reply: [String: JSONValue] = [
            "count": .int(Int64(outcome.count)), "ids": ids, "more": .bool(outcome.count > outcome.ids.count),
            "requested": .int(Int64(outcome.requested)),
        ]
        if let alias { reply[alias] = ids }
        return .object(reply)
    }
}
