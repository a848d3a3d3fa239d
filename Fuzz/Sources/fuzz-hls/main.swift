import DLCore
import FuzzSupport

/// HLS playlists: never trap; whatever parses plans, gives its pieces and a local playlist
/// that parses again with as many segments.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ start: UnsafePointer<UInt8>?, _ count: Int) -> CInt {
    let bytes = fuzzBytes(start, count)
    switch HLSParser.parse(bytes, base: "https://fuzz.example/p/index.m3u8") {
    case .failure: break
    case .success(.master(let master)):
        _ = HLSVariantRequest(maxHeight: 720, maxBandwidth: 1_000_000).choose(from: master.variants)
    case .success(.media(let media)):
        guard case .success(let recipe) = HLSRecipe.plan(media, layout: .folder) else { break }
        fuzzCheck(recipe.pieces() != nil, "a planned recipe has no pieces")
        fuzzCheck(HLSRecipe.decode(recipe.encoded()) == recipe, "a recipe does not round-trip through JSON")
        if case .success(.media(let local)) = HLSParser.parse(Array(recipe.localPlaylist().utf8), base: "https://l/x/index.m3u8") {
            fuzzCheck(local.segments.count == media.segments.count, "the local playlist lost segments")
        } else {
            fuzzCheck(false, "the local playlist does not parse")
        }
    }
    return 0
}

runFuzzer(fuzz)
