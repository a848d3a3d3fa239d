import DLCore
import FuzzSupport

/// An input file (`dlctl add -i`): parses or fails with an error that names a line of the text.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ start: UnsafePointer<UInt8>?, _ count: Int) -> CInt {
    switch InputList.parse(fuzzText(start, count)) {
    case .success(let entries):
        for entry in entries { fuzzCheck(entry.line >= 1, "entry on line \(entry.line)") }
    case .failure(let error):
        fuzzCheck(error.line >= 1, "error on line \(error.line)")
    }
    return 0
}

runFuzzer(fuzz)
