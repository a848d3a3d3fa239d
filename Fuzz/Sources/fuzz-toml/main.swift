import DLCore
import FuzzSupport

/// The configuration file (TOMLLite): any text either parses or throws a ParseError that names
/// a line of the text.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ start: UnsafePointer<UInt8>?, _ count: Int) -> CInt {
    let text = fuzzText(start, count)
    do {
        _ = try TOMLLite.parse(text)
    } catch let error as TOMLLite.ParseError {
        fuzzCheck(error.line >= 1, "error names line \(error.line)")
        _ = error.description
    } catch {
        fuzzCheck(false, "unexpected error \(error)")
    }
    return 0
}

runFuzzer(fuzz)
