import CFuzzDriver

#if canImport(Glibc)
import Glibc
#endif

/// Runs libFuzzer with the process's arguments (`-max_total_time=60 corpus/json`, …) on
/// `callback`, the target's LLVMFuzzerTestOneInput, and exits with its status.
public func runFuzzer(_ callback: @convention(c) (UnsafePointer<UInt8>?, Int) -> CInt) -> Never {
    var argc = CommandLine.argc
    var argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>? = CommandLine.unsafeArgv
    exit(LLVMFuzzerRunDriver(&argc, &argv, callback))
}

/// The bytes libFuzzer gives a target, as dld receives text: invalid UTF-8 is repaired, as
/// `String(decoding:as:)` does for headers and files read by dld.
public func fuzzText(_ start: UnsafePointer<UInt8>?, _ count: Int) -> String {
    String(decoding: fuzzBytes(start, count), as: UTF8.self)
}

public func fuzzBytes(_ start: UnsafePointer<UInt8>?, _ count: Int) -> [UInt8] {
    guard let start, count > 0 else { return [] }
    return Array(UnsafeBufferPointer(start: start, count: count))
}

/// A broken invariant of the code under test: libFuzzer records the input as a crash. Only the
/// harness traps; dld's own code must never do so on input.
public func fuzzCheck(_ condition: Bool, _ message: @autoclosure () -> String) {
    if !condition {
        print("fuzz invariant broken: \(message())")
        abort()
    }
}
