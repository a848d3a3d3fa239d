// swift-tools-version:6.1
import PackageDescription

// libFuzzer targets for the parsers of untrusted text (see docs/architecture.md, "Fuzzing and
// sanitizers"). A package of its own that depends on dld by path, so that `make test` never
// builds them; `make fuzz` builds them with
//     swift build -c release -Xswiftc -sanitize=fuzzer
// and runs each on its seed corpus in corpus/<target>/. Each target needs only DLCore (and
// DLRPC for JSON): no NIO, no database, so the build is short.
let package = Package(
    name: "dld-fuzz",
    // The name, not the directory's (a checkout may be called anything), names the package.
    dependencies: [.package(name: "dld", path: "..")],
    targets: [
        .target(name: "CFuzzDriver", path: "Sources/CFuzzDriver"),
        .target(name: "FuzzSupport", dependencies: ["CFuzzDriver"], path: "Sources/FuzzSupport"),
        .executableTarget(name: "fuzz-json", dependencies: ["FuzzSupport", .product(name: "DLRPC", package: "dld")], path: "Sources/fuzz-json"),
        .executableTarget(name: "fuzz-toml", dependencies: ["FuzzSupport", .product(name: "DLCore", package: "dld")], path: "Sources/fuzz-toml"),
        .executableTarget(
            name: "fuzz-content-disposition", dependencies: ["FuzzSupport", .product(name: "DLCore", package: "dld")],
            path: "Sources/fuzz-content-disposition"),
        .executableTarget(name: "fuzz-input-list", dependencies: ["FuzzSupport", .product(name: "DLCore", package: "dld")], path: "Sources/fuzz-input-list"),
        .executableTarget(name: "fuzz-netrc", dependencies: ["FuzzSupport", .product(name: "DLCore", package: "dld")], path: "Sources/fuzz-netrc"),
        .executableTarget(
            name: "fuzz-http-response", dependencies: ["FuzzSupport", .product(name: "DLCore", package: "dld")],
            path: "Sources/fuzz-http-response"),
        .executableTarget(name: "fuzz-hls", dependencies: ["FuzzSupport", .product(name: "DLCore", package: "dld")], path: "Sources/fuzz-hls"),
        .executableTarget(
            name: "fuzz-metalink", dependencies: ["FuzzSupport", .product(name: "DLRPC", package: "dld"), .product(name: "DLCore", package: "dld")],
            path: "Sources/fuzz-metalink"),
    ],
    swiftLanguageModes: [.v6]
)
