// swift-tools-version:6.1
import PackageDescription

// Targets are split by role (see docs/architecture.md): a core of value types with no I/O,
// then store, transfer and RPC, then the daemon services, and two thin executables.
let package = Package(
    name: "dld",
    platforms: [.macOS(.v14)],
    products: [
        .executable(name: "dld", targets: ["dld"]),
        .executable(name: "dlctl", targets: ["dlctl"]),
        // For the fuzz targets in Fuzz/ (their own package, so that `make test` never builds them).
        .library(name: "DLCore", targets: ["DLCore"]),
        .library(name: "DLRPC", targets: ["DLRPC"]),
    ],
    dependencies: [
        .package(url: "https://github.com/swift-server/async-http-client", from: "1.37.0"),
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.3"),
        // Already in the graph through async-http-client; the test origin serves https with it.
        .package(url: "https://github.com/apple/swift-nio-ssl", from: "2.37.6"),
        // Already in the graph through async-http-client; its SOCKS errors name a proxy's failures.
        .package(url: "https://github.com/apple/swift-nio-extras", from: "1.35.2"),
        // Already in the graph through async-http-client; the test origin speaks HTTP/2 with it.
        .package(url: "https://github.com/apple/swift-nio-http2", from: "1.46.0"),
        .package(url: "https://github.com/groue/GRDB.swift", from: "7.10.0"),
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle", from: "2.13.0"),
        .package(url: "https://github.com/vapor/postgres-nio", from: "1.33.2"),
        // The metrics' registry and their text exposition format (`GET /metrics`).
        .package(url: "https://github.com/swift-server/swift-prometheus", from: "2.4.1"),
    ],
    targets: [
        // Plain value types: jobs, states, transitions, errors, policies. No I/O.
        .target(name: "DLCore"),
        // The job table: GRDB DatabasePool, migrations, the one serialized writer.
        .target(
            // The job table's interface: the protocol both backends implement, the rows and
            // commands they exchange with the engine, and how JSON columns are coded. No database.
            name: "DLJobTable",
            dependencies: ["DLCore"]
        ),
        .target(
            name: "DLStore",
            dependencies: [
                "DLCore", "DLJobTable", .product(name: "GRDB", package: "GRDB.swift"),
                // SQLite's C API, which GRDB is built on: bulk inserts bind values in place.
                .product(name: "GRDBSQLite", package: "GRDB.swift"),
            ]
        ),
        // The job table in PostgreSQL (postgres-nio), for a fleet of daemons that share one queue.
        .target(
            name: "DLStorePostgres",
            dependencies: [
                "DLCore", "DLJobTable",
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // OpenSSL's libcrypto from libssl-dev, for streaming digests (EVP).
        .systemLibrary(name: "CCrypto", pkgConfig: "libcrypto", providers: [.apt(["libssl-dev"])]),
        // Linux calls that Swift's Glibc module does not export (fallocate).
        .target(name: "CDLSystem"),
        // HTTP transfers into files: AsyncHTTPClient, redirects, pwrite, digests, atomic publish.
        .target(
            name: "DLTransfer",
            dependencies: [
                "DLCore", "CCrypto", "CDLSystem",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "NIOTLS", package: "swift-nio"),
                // Trust roots, client certificates, and the reasons of a failed handshake.
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "NIOSOCKS", package: "swift-nio-extras"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // JSON-RPC wire types and line framing, shared by daemon and client; the client itself.
        .target(name: "DLRPC", dependencies: ["DLCore"]),
        // The engine: the scheduling state machine and what carries out its actions (transfers,
        // publishing, groups, recovery, fleet leases). It sees the job table only through
        // DLJobTable's interface and knows no wire format: no backend, no DLRPC.
        .target(
            name: "DLEngine",
            dependencies: [
                "DLCore", "DLJobTable", "DLTransfer", "CDLSystem", .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // The daemon services: control server and its dispatcher, config, paths, lock, cache.
        .target(
            name: "DLDaemon",
            dependencies: [
                "DLCore", "DLJobTable", "DLEngine", "DLStore", "DLStorePostgres", "DLTransfer", "DLRPC", "CDLSystem",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                // The HTTP listener (POST /rpc, GET /ws), with TLS beyond loopback.
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOWebSocket", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                // SIGHUP, for a reload of the config file.
                .product(name: "UnixSignals", package: "swift-service-lifecycle"),
                .product(name: "Prometheus", package: "swift-prometheus"),
            ],
            // The dashboard's files, built into the binary: plain HTML, CSS and JavaScript.
            resources: [
                .embedInCode("Dashboard/index.html"), .embedInCode("Dashboard/app.css"), .embedInCode("Dashboard/app.js"),
                .embedInCode("Dashboard/icon.svg"),
            ]
        ),
        // Test origin server (deterministic bytes, Range, throttling, faults) and daemon launcher.
        .target(
            name: "DLTestSupport",
            dependencies: [
                "DLRPC",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOHTTP2", package: "swift-nio-http2"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
            ]
        ),
        .executableTarget(
            name: "dld",
            dependencies: ["DLDaemon", "DLCore", .product(name: "ArgumentParser", package: "swift-argument-parser")]
        ),
        .executableTarget(
            name: "dlctl",
            dependencies: ["DLRPC", "DLCore", .product(name: "ArgumentParser", package: "swift-argument-parser")]
        ),
        // The test origin as a program, for `make bench` when nginx is not installed.
        .executableTarget(
            name: "dld-origin",
            dependencies: ["DLTestSupport", .product(name: "ArgumentParser", package: "swift-argument-parser")]
        ),
        .testTarget(name: "DLCoreTests", dependencies: ["DLCore"]),
        .testTarget(
            name: "DLStoreTests",
            dependencies: [
                "DLJobTable", "DLStore", "DLStorePostgres", "DLCore", "DLTestSupport", .product(name: "Logging", package: "swift-log"),
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
            ]
        ),
        .testTarget(
            name: "DLTransferTests",
            dependencies: [
                "DLTransfer", "DLCore", "DLTestSupport", "CDLSystem",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
            ]
        ),
        .testTarget(
            // The wire: JSON-RPC messages and their params, OpenRPC, Metalink's reader.
            name: "DLRPCTests",
            dependencies: ["DLRPC", "DLCore", "DLTestSupport"]
        ),
        .testTarget(
            // The engine alone, on an in-process store: scheduling and recovery.
            name: "DLEngineTests",
            dependencies: [
                "DLEngine", "DLCore", "DLJobTable", "DLStore", "DLTransfer", "DLTestSupport",
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .testTarget(
            // The daemon's services in process: dispatcher, config, HTTP access, metrics, the
            // engine's loops as the daemon runs them, and the fuzz seeds of the request parser
            // (the JSON writer is checked against Foundation on them).
            name: "DLDaemonTests",
            dependencies: [
                "DLDaemon", "DLEngine", "DLRPC", "DLCore", "DLJobTable", "DLStore", "DLTransfer", "DLTestSupport",
                .product(name: "NIOEmbedded", package: "swift-nio"), .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .testTarget(
            name: "EndToEndTests",
            dependencies: ["DLTestSupport", "DLRPC", "DLCore", "DLTransfer", "DLJobTable", "DLStore"]
        ),
    ],
    swiftLanguageModes: [.v6]
)
