import DLRPC
import Foundation
import FuzzSupport

/// JSON-RPC requests (JSONParser through JSONValue.parse): any bytes either parse or throw, and
/// what parses serializes to JSON that parses again to the same value.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ start: UnsafePointer<UInt8>?, _ count: Int) -> CInt {
    guard let value = try? JSONValue.parse(Data(fuzzBytes(start, count))) else { return 0 }
    let text = value.serialized()
    let again = try? JSONValue.parse(text)
    fuzzCheck(again != nil, "serialized value does not parse: \(String(decoding: text, as: UTF8.self))")
    return 0
}

runFuzzer(fuzz)
