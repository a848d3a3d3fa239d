import DLCore
import FuzzSupport

/// A server's Content-Disposition header, then the sanitizer the name goes through before it
/// comes near a path: the result is never a separator, a dot name or empty.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ start: UnsafePointer<UInt8>?, _ count: Int) -> CInt {
    guard let name = ContentDisposition.filename(fuzzText(start, count)) else { return 0 }
    let safe = FileNames.sanitize(name)
    fuzzCheck(!safe.isEmpty && !safe.contains("/") && safe != "." && safe != "..", "unsafe name \(safe.debugDescription)")
    return 0
}

runFuzzer(fuzz)
