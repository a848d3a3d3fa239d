import DLCore
import DLRPC
import Foundation
import FuzzSupport

/// Metalink documents (MetalinkReader: FoundationXML, then Metalink.read): any bytes are a
/// Metalink or an `invalid_metalink` error, and what is read keeps its promises: safe relative
/// names, an http(s) URL for each file, pieces that cover the size.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ start: UnsafePointer<UInt8>?, _ count: Int) -> CInt {
    let metalink: Metalink
    do {
        metalink = try MetalinkReader.parse(Data(fuzzBytes(start, count)))
    } catch {
        fuzzCheck(error.code == .invalidMetalink, "an error other than invalid_metalink: \(error)")
        return 0
    }
    for file in metalink.files {
        fuzzCheck(!file.name.hasPrefix("/") && !file.name.split(separator: "/").contains(".."), "unsafe name \(file.name)")
        fuzzCheck(!file.urls.isEmpty, "a file without URL")
        if let pieces = file.pieces, let size = file.size {
            fuzzCheck(pieces.hashes.count == PieceHashes.count(size: size, length: pieces.length), "pieces do not cover the size")
        }
    }
    return 0
}

runFuzzer(fuzz)
