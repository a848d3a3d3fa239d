import DLCore
import FuzzSupport

/// ~/.netrc: never fails; the credentials of every machine it names can be looked up.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ start: UnsafePointer<UInt8>?, _ count: Int) -> CInt {
    let entries = Netrc.parse(fuzzText(start, count))
    for entry in entries.prefix(8) {
        _ = Netrc.credentials(for: entry.machine ?? "example.com", in: entries)
    }
    return 0
}

runFuzzer(fuzz)
