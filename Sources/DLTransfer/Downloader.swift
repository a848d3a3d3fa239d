import AsyncHTTPClient
import DLCore
import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import NIOSSL
import Synchronization

/// What one transfer attempt is asked to do.
public struct TransferRequest: Sendable {
    public var jobID: JobID
    /// The job's original URL: every attempt starts here, because redirect targets (signed
    /// URLs) expire.
    public var url: String
    public var headers: [HeaderField]
    public var path: String
    public var overwrite: Bool
    /// The committed offset: bytes before it are on disk and synced.
    public var offset: Int64
    public var size: Int64?
    public var validators: Validators
    /// A digest the finished file must match (besides the SHA-256 always computed).
    public var checksum: Checksum?
    /// The size the client expects; the server must agree.
    public var expectedSize: Int64?
    public var options = JobOptions()
    /// `~/.netrc` entries; credentials for the job's host are used when it has none of its own.
    public var netrc: [NetrcEntry] = []
    public var diskSpace = DiskSpacePolicy()
    public var checkpoints = CheckpointPolicy()
    /// How many ranges at once, from what size (segmented downloads).
    public var segmentation = SegmentSettings()
    /// The ranges a segmented download had synced (`SegmentLayout.encoded`); nil: one stream
    /// of `offset` bytes.
    public var segmentLayout: String?
    /// More URLs of the same file, with what earlier attempts found (dropped ones are not
    /// asked); empty for most jobs.
    public var mirrors: [JobMirror] = []
    /// Why the job's own URL was dropped, when it has mirrors.
    public var urlDropped: String?
    /// With mirrors: connections the ranges may open to each host (`MirrorAllowance`).
    public var hostSlots: [String: Int] = [:]
    /// The file's piece hashes (from a Metalink): each piece is checked once it has landed,
    /// and a bad one fetched again from another source (`PieceCheck`).
    public var pieces: PieceHashes?
    /// The age recipients the file is encrypted to (`options.encryptTo`, parsed by `run`);
    /// empty: the file is stored as served.
    var recipients: [AgeRecipient] = []
    /// Progress written after the committed one but not synced (`UnsyncedProgress`), and the
    /// current boot id: the attempt continues from it when `ResumePoint` trusts it.
    public var unsynced: UnsyncedProgress?
    public var bootID: String?
    /// The file's folder is dld's own (a group's staging folder): made again (durably) when
    /// it is missing, as after a power cut that came before its creation was synced.
    public var ownsFolder = false
    /// On a shared table: this attempt, whose partial file gets an inode of its own
    /// (`PartialFile.isolate`); nil for a daemon with a table of its own.
    public var attempt: PartialAttempt?

    public init(
        jobID: JobID, url: String, headers: [HeaderField], path: String, overwrite: Bool,
        offset: Int64, size: Int64?, validators: Validators, checksum: Checksum? = nil
    ) {
        self.jobID = jobID
        self.url = url
        self.headers = headers
        self.path = path
        self.overwrite = overwrite
        self.offset = offset
        self.size = size
        self.validators = validators
        self.checksum = checksum
    }

    public var partialPath: String { path + ".part" }
}

/// What a transfer knows that the job table should record.
public struct TransferCheckpoint: Sendable, Equatable {
    /// Bytes on disk and synced (with `segments`, in all ranges together).
    public var received: Int64
    /// The ranges of a segmented download that is not finished; nil for one stream.
    public var segments: String?
    public var size: Int64?
    public var validators: Validators
    public var finalURL: String?
    /// Set when the file is complete: its SHA-256, and the requested checksum's digest.
    public var sha256: String?
    public var digest: String?
    /// The sanitized name from Content-Disposition, when the job's name is automatic.
    public var proposedName: String?
    /// For a downloaded file: the name to publish it under first (the job's path, or the
    /// server's proposed name in the same folder).
    public var publishTarget: String?
    /// Set when the attempt had bytes and had to start over from 0: why (`started_over`).
    public var startedOver: JobError?
    /// With mirrors: which sources are dropped, and why (recorded with the attempt's outcome).
    /// Also set for a job without mirrors when the server named some (RFC 6249 `Link:
    /// rel=duplicate`): they are the job's from then on.
    public var mirrors: MirrorColumn?
    /// The SHA-256 the server announced (RFC 3230 `Digest`) for a job that had no checksum:
    /// it becomes the job's.
    public var announcedChecksum: Checksum?

    public init(
        received: Int64, size: Int64?, validators: Validators, finalURL: String?,
        sha256: String? = nil, digest: String? = nil, proposedName: String? = nil
    ) {
        self.proposedName = proposedName
        self.received = received
        self.size = size
        self.validators = validators
        self.finalURL = finalURL
        self.sha256 = sha256
        self.digest = digest
    }
}

/// How an attempt ended. Every case but `downloaded` carries a checkpoint whose bytes are synced.
public enum TransferResult: Sendable, Equatable {
    /// The file is complete and verified in its partial file, but neither synced nor under
    /// its final name: the caller syncs it, records it and publishes it (see `Publisher`).
    /// Its checkpoint's `received` is the whole file, which is not yet durable.
    case downloaded(TransferCheckpoint)
    /// Stopped because its task was cancelled (pause, cancel, shutdown).
    case stopped(TransferCheckpoint)
    case failed(TransferFailure, TransferCheckpoint)
}

/// Settings of the daemon's HTTP client.
public struct DownloaderConfiguration: Sendable {
    public var connectTimeout: TimeAmount = .seconds(20)
    /// No byte for this long is a transient failure; a slow trickle keeps the job alive.
    public var readTimeout: TimeAmount = .seconds(60)
    /// Until the response head has arrived (AsyncHTTPClient's deadline ends there).
    public var headTimeout: TimeAmount = .seconds(90)
    public var maxRedirects = 10
    /// Connections to one host at most (HTTP/1.1): the engine's `max_per_host`. The engine may
    /// start a few more transfers than that (`HostLimits.startLimit`): their requests wait in
    /// the pool and take a kept-alive connection as soon as one is free.
    public var connectionsPerHost = 6
    public var userAgent = "dld/\(DLDVersion.current)"
    /// The daemon's TLS settings (`ca_file`, `ca_dir`, `client_cert`, `client_key` of the config
    /// file); a job's own are merged on top.
    public var tls = TLSSettings()
    /// `SSL_CERT_FILE` and `SSL_CERT_DIR` of dld's environment, or the system store.
    public var systemTrust = SystemTrust()
    /// Which proxy each URL goes through (the config's `proxy`, or `http_proxy` and the rest).
    public var proxies = ProxyRules()
    /// HTTP/2 where a server offers it over TLS (ALPN); false: HTTP/1.1 only (config `http2`).
    public var http2 = true

    public init() {}
}

/// Downloads one job's URL into its partial file, then publishes it. HTTP/2 where the server
/// offers it over TLS (many transfers as streams of one connection), else HTTP/1.1 with
/// kept-alive connections; decompression off (bytes on disk are the bytes served), redirects followed by our own code
/// so that a downgrade to http and non-HTTP schemes are refused.
///
/// One HTTP client per distinct TLS setting (the daemon's; `insecure`; a job's own CA or
/// client certificate) and proxy (chosen per URL: `no_proxy` sends some hosts direct), made
/// when first needed and kept until `shutdown`: jobs with the same settings share its
/// kept-alive connections. The settings people name are few (one per CA or client
/// certificate, one or two proxies), so the clients are too.
public final class Downloader: Sendable {
    public let configuration: DownloaderConfiguration
    private let clients = NIOLockedValueBox(Clients())
    let logger: Logger
    /// The speed limits every transfer of this downloader keeps to (`max_speed`).
    public let limiter = SpeedLimiter()
    /// Told the head of each final answer (after redirects) that carries a body: the URL
    /// cache keeps the freshness headers of its downloads.
    public let responseHeads = ResponseHeadObserver()
    /// Hosts (`URLRules.hostKey`) that answered over HTTP/2: the engine gives them more
    /// transfers at once (`HostLimits`).
    private let multiplexedHosts = Mutex<Set<String>>([])
    /// `max_per_host` now: starts as `configuration.connectionsPerHost`, and follows a
    /// reload. Clients made before a change keep their pools (requests under way go on in
    /// them); requests after it go to clients with the new limit.
    private let perHost: Mutex<Int>

    /// Sets the connections per host of the clients made from now on (a reload).
    public func setConnectionsPerHost(_ count: Int) {
        perHost.withLock { $0 = max(1, count) }
    }

    /// Whether `host` (`URLRules.hostKey`) last answered over HTTP/2.
    public func multiplexed(host: String) -> Bool {
        multiplexedHosts.withLock { $0.contains(host) }
    }

    private struct ClientKey: Hashable {
        var tls: TLSSettings
        var proxy: ProxyServer?
        /// HTTP/1.1 even where the server offers HTTP/2 (the ranges of a big file).
        var http1Only = false
        var perHost: Int
    }

    private struct Clients {
        var byKey: [ClientKey: HTTPClient] = [:]
        /// After `shutdown` no client is made: one made then would never be shut down.
        var isShutDown = false
    }

    public init(configuration: DownloaderConfiguration = DownloaderConfiguration(), logger: Logger) {
        self.configuration = configuration
        self.logger = logger
        self.perHost = Mutex(max(1, configuration.connectionsPerHost))
    }

    /// The client for these TLS settings and this proxy, made on first use; with
    /// `http1Only`, one that never negotiates HTTP/2.
    private func client(for tls: TLSSettings, proxy: ProxyServer?, http1Only: Bool = false) throws -> HTTPClient {
        let key = ClientKey(tls: tls, proxy: proxy, http1Only: http1Only || !configuration.http2, perHost: perHost.withLock { $0 })
        return try clients.withLockedValue { clients in
            if let client = clients.byKey[key] { return client }
            guard !clients.isShutDown else { throw HTTPClientError.alreadyShutdown }
            // Its TLS files are read now, once: one that went away since it was named (a job's
            // own, say) is named here, before the TLS library fails with no name.
            for file in tls.files {
                if let problem = TLSFileCheck.problem(file.path, what: file.what, folder: file.what == "CA folder") {
                    throw TransferFailure(.permanent, .tlsConfig, problem)
                }
            }
            var config = HTTPClient.Configuration(tlsConfiguration: try tls.configuration(system: configuration.systemTrust))
            config.proxy = proxy?.clientProxy
            config.redirectConfiguration = .disallow
            config.decompression = .disabled
            // HTTP/2 where the server offers it (ALPN): the transfers to a host share one
            // connection and one TLS handshake, each a stream, which saves the round trips of
            // new connections (docs/architecture.md, "Two lanes").
            // The ranges of a big file go over connections of their own (`fetch`'s `bulk`).
            config.httpVersion = key.http1Only ? .http1Only : .automatic
            // A refused connection is a failed attempt for our own backoff, not a silent loop
            // inside the client until the deadline.
            config.connectionPool.retryConnectionEstablishment = false
            config.timeout = .init(connect: configuration.connectTimeout, read: configuration.readTimeout)
            config.connectionPool.concurrentHTTP1ConnectionsPerHostSoftLimit = key.perHost
            let limiter = self.limiter
            config.http1_1ConnectionDebugInitializer = { channel in Self.largeReads(channel, limiter: limiter) }
            config.http2ConnectionDebugInitializer = { channel in Self.largeReads(channel, limiter: limiter) }
            let client = HTTPClient(eventLoopGroup: HTTPClient.defaultEventLoopGroup, configuration: config)
            clients.byKey[key] = client
            return client
        }
    }

    /// The TLS settings of one request: the daemon's, with the job's on top.
    func tlsSettings(_ request: TransferRequest) -> TLSSettings {
        configuration.tls.merged(insecure: request.options.insecure, job: request.options.tls)
    }

    /// Reads of up to 256 KiB instead of NIO's 64 KiB: a fast body arrives in fewer chunks, so
    /// fewer wake-ups, pwrites and digest calls per byte. Memory stays bounded by the body
    /// stream's backpressure. 1 MiB reads were no faster, and four connections' buffers put a
    /// segmented download's peak RSS over 64 MiB (docs/benchmarks.md, "What was tried": 256 KiB
    /// reads). While a speed limit is set, reads are cut to its `readCap`.
    static func largeReads(_ channel: any Channel, limiter: SpeedLimiter) -> EventLoopFuture<Void> {
        // Over TLS each read is decrypted into a plaintext buffer of its size as well: reads
        // of up to 64 KiB keep four TLS connections' buffers small: a lower peak RSS than with
        // 256 KiB reads, in the same time (docs/benchmarks.md, "What was tried": reads of at most
        // 64 KiB on TLS).
        channel.pipeline.handler(type: NIOSSLClientHandler.self).map { _ in true }.recover { _ in false }.flatMap { tls in
            channel.setOption(
                ChannelOptions.recvAllocator,
                value: LimitedReads(
                    adaptive: AdaptiveRecvByteBufferAllocator(minimum: 4096, initial: 64 << 10, maximum: tls ? 64 << 10 : 256 << 10),
                    limiter: limiter))
        }
    }

    public func shutdown() async {
        let all = clients.withLockedValue { clients in
            clients.isShutDown = true
            return Array(clients.byKey.values)
        }
        for client in all { try? await client.shutdown() }
    }

    /// Runs one attempt. `checkpoint` records synced progress (a committed transaction);
    /// it is called at most every `checkpointInterval`.
    public func run(
        _ request: TransferRequest,
        progress: TransferProgress,
        checkpoint: @escaping @Sendable (TransferCheckpoint) async throws -> Void
    ) async -> TransferResult {
        var state = AttemptState(
            received: request.offset, size: request.size, validators: request.validators, finalURL: nil,
            target: Target(url: request.url))
        if !request.mirrors.isEmpty {
            state.sources = SourceBook(MirrorSet(url: request.url, urlDropped: request.urlDropped, mirrors: request.mirrors))
        }
        if let pieces = request.pieces, request.options.encryptTo?.isEmpty != false { state.pieceTracker = PieceTracker(pieces) }
        var request = request
        if let texts = request.options.encryptTo, !texts.isEmpty {
            switch AgeRecipient.parseList(texts) {
            case .success(let recipients): request.recipients = recipients
            case .failure(let error):
                return .failed(TransferFailure(.permanent, .encryptionError, error.message), state.checkpoint)
            }
            // One stream: the age payload is a sequence of chunks sealed in order, and the
            // file key exists only in this attempt's memory (docs/architecture.md).
            request.segmentation.count = 1
        }
        let file: PartialFile
        var kept = false
        do {
            if request.ownsFolder { try PartialFile.makeFolders((request.partialPath as NSString).deletingLastPathComponent) }
            if let attempt = request.attempt {
                kept = try PartialFile.isolate(request.partialPath, for: attempt)
                if !kept, request.offset > 0 || request.segmentLayout != nil || request.unsynced != nil {
                    startingOver(
                        "the partial file here is not the one the job table counts (written by \(attempt.trusted ?? "no attempt")): another machine's folder, or an older attempt's file",
                        state: &state, progress: progress, job: request.jobID)
                    request.offset = 0
                    request.segmentLayout = nil
                    request.unsynced = nil
                    state.received = 0
                }
            }
            file = try PartialFile(path: request.partialPath)
        } catch {
            return .failed(error, state.checkpoint)
        }
        defer { file.close() }
        guard let digests = Digests(request.checksum) else {
            return .failed(Self.digestFailure(request.path), state.checkpoint)
        }
        // An encrypted file never continues (its key is gone), so its unsynced bytes are not used.
        if request.recipients.isEmpty {
            request = await continuingUnsynced(request, file: file, state: &state)
        }
        if kept {
            // The carried bytes are this attempt's file now: the row names it at once, so that
            // an attempt that ends before its first checkpoint does not cost the next one them.
            var first = state.checkpoint
            first.segments = request.segmentLayout
            try? await checkpoint(first)
        }
        // What is durable: where the attempt starts, then each checkpoint committed.
        let durable = NIOLockedValueBox(state.checkpoint)
        let checkpoint: @Sendable (TransferCheckpoint) async throws -> Void = { progress in
            try await checkpoint(progress)
            durable.withLockedValue { $0 = progress }
        }
        do {
            try await attempt(request, file: file, state: &state, digests: digests, progress: progress, checkpoint: checkpoint)
            if let pieces = request.pieces, request.recipients.isEmpty {
                try await checkPieces(pieces, request: request, file: file, state: &state, digests: digests)
            }
            var done = state.checkpoint
            done.sha256 = digests.sha256.finalize()
            done.digest = digests.requested?.finalize() ?? (request.checksum != nil ? done.sha256 : nil)
            // The server's own Digest (RFC 3230) first: it names what the file should be.
            var mismatch: TransferFailure? = announcedMismatch(request, state: state, sha256: done.sha256)
            // For an encrypted file, the checksum and the size are the plaintext's, the bytes
            // the server sent; what is kept in the partial file is ciphertext either way.
            if mismatch == nil, let expected = request.checksum, let actual = done.digest, actual != expected.hex {
                mismatch = TransferFailure(
                    .permanent, .checksumMismatch,
                    "the file from \(hostName(state)) does not match the checksum: its \(expected.algorithm.rawValue) is \(actual), expected \(expected.hex); it is kept at \(request.partialPath) (resume downloads it again)"
                )
            } else if mismatch == nil, let size = request.expectedSize, size != state.received {
                mismatch = TransferFailure(
                    .permanent, .sizeMismatch,
                    "the file from \(hostName(state)) is \(state.received) bytes, expected \(size) (size); it is kept at \(request.partialPath) (resume downloads it again)"
                )
            }
            if let mismatch {
                // The bytes stay in the partial file, never under the final name; they are
                // synced because the offset reported is committed.
                try await file.syncOffThread()
                return .failed(mismatch, done)
            }
            // Complete and verified. Syncing and publishing are the caller's, in batches
            // (Publisher): a finished file does not hold its slot while the disk flushes.
            done.publishTarget = Self.publishTarget(request, proposed: state.proposedName)
            return .downloaded(done)
        } catch {
            // A sync failed (fsyncgate): the kernel may have dropped the bytes it could not
            // write, and another sync would succeed without them. Nothing written since the
            // last durable point is counted: the attempt reports that point (nothing, if the
            // file was started over since), and the next one cuts the file back to it.
            if let failure = Self.failedSync(error) {
                var kept = durable.withLockedValue { $0 }
                if state.startedOver != nil && kept.startedOver == nil {
                    kept.received = 0
                    kept.segments = nil
                }
                return .failed(failure, kept)
            }
            // Whatever happened, the bytes counted so far are made durable before they are
            // reported, so the caller may commit them.
            do {
                try file.syncData()
                // And its name, so that the offset reported is not lost with the file in a power
                // cut (a `.part` created since its folder was last synced).
                if state.received > 0 { try file.syncFolder() }
            } catch let syncFailure {
                state.received = 0
                state.segments = nil
                return .failed(syncFailure, state.checkpoint)
            }
            if Task.isCancelled { return .stopped(state.checkpoint) }
            if (error as? HTTPClientError) == .getConnectionFromPoolTimeout {
                progress.waitedForConnection = true
            }
            if error is TransferParked || progress.waitedForConnection {
                if state.received == 0 {
                    file.close()
                    unlink(request.partialPath)
                }
                return .stopped(state.checkpoint)
            }
            if state.received == 0 {
                // Nothing was kept: leave no empty partial file behind.
                file.close()
                unlink(request.partialPath)
            }
            if let failure = error as? TransferFailure { return .failed(failure, state.checkpoint) }
            return .failed(await explain(error, request: request, target: state.target, proxy: state.proxy), state.checkpoint)
        }
    }

    /// The failed sync that ended an attempt, if that is what ended it.
    static func failedSync(_ error: any Error) -> TransferFailure? {
        if let failure = error as? TransferFailure { return failure.failedSync ? failure : nil }
        if let wrapped = error as? SourceFailure { return failedSync(wrapped.underlying) }
        return nil
    }

    /// The request as it continues from the unsynced progress recorded after its committed
    /// offset, when `ResumePoint` trusts it (same boot, the file long enough): dld alone
    /// stopped, and the page cache still holds those bytes. They are synced first, so that
    /// whatever this attempt reports is durable as a committed offset must be (rule 2).
    /// Otherwise the request as it was: the committed offset, and the file is cut back to it.
    func continuingUnsynced(_ request: TransferRequest, file: PartialFile, state: inout AttemptState) async -> TransferRequest {
        guard let unsynced = request.unsynced else { return request }
        let choice = ResumePoint.choose(synced: request.offset, unsynced: unsynced, bootID: request.bootID, fileLength: try? file.size())
        guard case .unsynced(let record) = choice else {
            logger.debug("unsynced progress not used", metadata: ["job": "\(request.jobID)", "why": "\(choice)"])
            return request
        }
        do {
            try await file.syncOffThread()
        } catch {
            return request
        }
        logger.info(
            "continuing from bytes written but not synced before the last stop (same boot)",
            metadata: ["job": "\(request.jobID)", "committed": "\(request.offset)", "from": "\(record.received)"])
        var continued = request
        continued.offset = record.received
        continued.segmentLayout = record.segments
        continued.size = record.size
        continued.validators = record.validators
        continued.unsynced = nil
        state.received = record.received
        state.size = record.size
        state.validators = record.validators
        return continued
    }

    /// The job error for an error of the network or the HTTP client. The library's own
    /// description, which a developer may need, goes to the log at debug level only.
    func explain(_ error: any Error, request: TransferRequest, target: Target?, proxy: ProxyServer?) async -> TransferFailure {
        logger.debug("transfer error", metadata: ["job": "\(request.jobID)", "error": "\(String(reflecting: error))"])
        let target = target ?? Target(host: "the server", port: 0, isHTTPS: false)
        if let proxy, let failure = Self.proxyFailure(error, proxy: proxy, target: target, timeouts: configuration) { return failure }
        let tls = tlsSettings(request)
        if Self.isCertificateVerifyFailure(error) {
            // Which of the certificate's faults it is: the handshake error does not say.
            var finding: CertificateProbe.Finding? = nil
            if let config = try? tls.configuration(system: configuration.systemTrust) {
                finding = await CertificateProbe.diagnose(
                    host: target.host, port: target.port, tls: config, group: HTTPClient.defaultEventLoopGroup,
                    timeout: configuration.connectTimeout)
            }
            return Self.untrusted(target.host, finding: finding)
        }
        if let failure = Self.tlsFailure(error, target: target, clientCertificate: tls.clientCert != nil) { return failure }
        return Self.classify(error, target: target, timeouts: configuration)
    }

    struct AttemptState {
        var received: Int64
        /// A segmented download's ranges (stored form); nil for one stream of `received` bytes.
        var segments: String?
        var size: Int64?
        var validators: Validators
        var finalURL: String?
        var proposedName: String?
        /// The server of the request in flight (after redirects), named by error messages.
        var target: Target?
        /// The proxy the request in flight goes through, if any.
        var proxy: ProxyServer?
        var startedOver: JobError?
        /// With mirrors: the sources of the attempt, shared by every copy of this state (the
        /// range workers' too).
        var sources: SourceBook?
        /// The source the first request went to (the job's URL unless it failed or was
        /// dropped); later requests of one stream go there too.
        var sourceURL: String?
        /// With piece hashes (and not encrypted at rest): which source served which bytes,
        /// which pieces were found good as they landed, the blame (`PieceCheck`).
        var pieceTracker: PieceTracker?
        /// RFC 6249: the other copies the first answer named (`Link: rel=duplicate`, the
        /// job's own URL left out), and the SHA-256 it announced (RFC 3230 `Digest`).
        var duplicates: [String] = []
        var announced: Checksum?
        var checkpoint: TransferCheckpoint {
            var checkpoint = TransferCheckpoint(
                received: received, size: size, validators: validators, finalURL: finalURL.map(URLRules.redacted),
                proposedName: proposedName)
            checkpoint.startedOver = startedOver
            checkpoint.segments = segments
            checkpoint.mirrors = sources?.column
            if !duplicates.isEmpty {
                let known = checkpoint.mirrors ?? MirrorColumn(mirrors: [], urlDropped: nil)
                let merged = RFC6249.merged(known.mirrors, url: "", found: duplicates)
                if merged != known.mirrors { checkpoint.mirrors = MirrorColumn(mirrors: merged, urlDropped: known.urlDropped) }
            }
            checkpoint.announcedChecksum = announced
            return checkpoint
        }
    }

    /// The bytes on disk cannot be continued: says why (the job's `error`, `started_over`, live
    /// in `status` and kept if the attempt ends early), before the caller cuts the file to 0.
    func startingOver(_ reason: String, state: inout AttemptState, progress: TransferProgress, job: JobID) {
        // The bytes are fetched again: what was checked of them, and who served them, is old.
        state.pieceTracker?.startOver()
        guard state.received > 0 else { return }
        let error = JobError(
            code: .startedOver,
            message: "downloading again from byte 0 from \(hostName(state)) (\(state.received) bytes dropped): \(reason)")
        logger.notice("starting over", metadata: ["job": "\(job)", "reason": "\(reason)"])
        state.startedOver = error
        progress.note(error)
    }

    /// Why a range answer does not continue the bytes on disk, or nil when its validators agree
    /// with the ones they were fetched under: the strong ETag when both have one, else
    /// Last-Modified (the total is compared by the caller).
    static func validatorMismatch(_ headers: HTTPHeaders, _ stored: Validators) -> String? {
        let etag = headers.first(name: "etag").flatMap { $0.hasPrefix("W/") ? nil : $0 }
        if let old = stored.etag {
            if let etag, etag != old { return "the server's ETag is \(etag.prefix(80)), the bytes on disk came with \(old.prefix(80))" }
            if etag != nil { return nil }
        }
        if let old = stored.lastModified, let new = headers.first(name: "last-modified"), new != old {
            return "the server's Last-Modified is \(new.prefix(60)), the bytes on disk came with \(old.prefix(60))"
        }
        return nil
    }

    /// The job's path, or the server's proposed name in the same folder when the job's name
    /// was automatic.
    static func publishTarget(_ request: TransferRequest, proposed: String?) -> String {
        guard request.options.automaticName, let proposed, !proposed.isEmpty else { return request.path }
        let name = request.options.isEncrypted ? AgeLayout.encryptedName(proposed) : proposed
        return (request.path as NSString).deletingLastPathComponent + "/" + name
    }

    private func attempt(
        _ request: TransferRequest,
        file: PartialFile,
        state: inout AttemptState,
        digests: Digests,
        progress: TransferProgress,
        checkpoint: @escaping @Sendable (TransferCheckpoint) async throws -> Void
    ) async throws {
        if !request.recipients.isEmpty, state.received > 0 || request.segmentLayout != nil {
            // The file key of the bytes on disk lived only in the memory of the attempt that
            // wrote them: nothing can continue them, by design.
            startingOver(
                "an encrypted download cannot continue its file: its key was kept only in memory, and it is gone",
                state: &state, progress: progress, job: request.jobID)
            try file.truncate(to: 0)
            state.received = 0
            state.segments = nil
        }
        if request.recipients.isEmpty, let stored = request.segmentLayout {
            if let size = state.size, let layout = SegmentLayout(encoded: stored, size: size),
                state.validators.acceptsRanges, state.validators.ifRange != nil
            {
                try await resumeRanges(
                    request, layout: layout, file: file, state: &state, digests: digests, progress: progress, checkpoint: checkpoint)
                return
            }
            // Ranges that cannot be read back prove nothing: the file starts over.
            logger.info("stored ranges unusable; starting over", metadata: ["job": "\(request.jobID)"])
            try file.truncate(to: 0)
            state.received = 0
        }
        // Durability rule 3: the partial file is cut back to the committed offset; bytes past
        // it were never recorded and may be garbage.
        let onDisk = try file.size()
        if onDisk > state.received {
            try file.truncate(to: state.received)
        } else if onDisk < state.received {
            state.received = onDisk
        }
        // A resume is guarded by a validator (If-Range), else the bytes could belong to another
        // version: without one, the last bytes on disk are asked again in the same request and
        // compared before the rest is taken (`OverlapResume`); `overlap` is how many.
        var overlap: Int64 = 0
        if state.received > 0 && state.validators.ifRange == nil {
            switch OverlapResume.plan(received: state.received, size: state.size, acceptsRanges: state.validators.acceptsRanges) {
            case .check(_, let length):
                overlap = length
            case .startOver(let reason):
                startingOver(reason, state: &state, progress: progress, job: request.jobID)
                try file.truncate(to: 0)
                state.received = 0
            }
        } else if state.received > 0 && !state.validators.acceptsRanges {
            startingOver(
                "the server did not say it takes byte ranges, so the bytes on disk cannot be continued",
                state: &state, progress: progress, job: request.jobID)
            try file.truncate(to: 0)
            state.received = 0
        }

        // When the rest may be fetched in ranges, the first request has an end too: its answer is
        // the first range, and nothing past it is sent (`SegmentLayout.firstRequestEnd`).
        let firstEnd =
            overlap > 0
            ? nil
            : SegmentLayout.firstRequestEnd(
                received: state.received, size: state.size ?? request.expectedSize, workers: request.segmentation.count,
                minSize: request.segmentation.minSize, minPiece: request.segmentation.minPiece)
        // Where the first answer's bytes end when it is a range that stops before the file does.
        var answerEnd: Int64? = nil
        var response = try await probe(request, state: &state, from: state.received - overlap, end: firstEnd)
        let status = Int(response.status.code)
        let headers = response.headers
        switch status {
        case 206:
            let range = ContentRange(headers.first(name: "content-range"))
            let total = range?.total ?? state.size
            let refusal: String?
            let length = headers.first(name: "content-length").flatMap { Int64($0) }
            if firstEnd != nil, range?.total == nil {
                refusal =
                    "the server's range answer (\(headers.first(name: "content-range")?.prefix(80) ?? "none")) does not say the file's size"
            } else if firstEnd != nil, let range, let end = range.end, let length, length != end - range.start + 1 {
                // Its framing and its range disagree: neither is trusted, the whole file is asked for.
                refusal =
                    "the server's range answer (\(headers.first(name: "content-range")?.prefix(80) ?? "none")) comes with a length of \(length) bytes"
            } else if overlap > 0, let size = state.size {
                refusal = OverlapResume.refusal(start: range?.start, total: range?.total, from: state.received - overlap, size: size)
            } else if let range, range.start == state.received, state.size == nil || total == state.size {
                refusal = Self.validatorMismatch(headers, state.validators)
            } else {
                refusal =
                    Self.validatorMismatch(headers, state.validators)
                    ?? "the server's range answer (\(headers.first(name: "content-range")?.prefix(80) ?? "none")) does not continue the \(state.size.map { "\($0)-byte " } ?? "")file at byte \(state.received)"
            }
            guard let refusal else {
                if state.received == 0 && overlap == 0 {
                    // A fresh download's first range: its head names the file, as a 200's does.
                    take(headers, into: &state)
                    state.validators.acceptsRanges = true
                }
                state.size = total
                if let end = range?.end, let total, end + 1 < total { answerEnd = end + 1 }
                break
            }
            // The server sent another part, disagrees on the total, or on the validators: start over.
            overlap = 0
            response = try await restartFromZero(refusal, request: request, file: file, state: &state, progress: progress)
        case 200:
            // The whole file: nothing is compared, its body is the new start.
            overlap = 0
            if state.received > 0 {
                // Range ignored, or the validators changed: start over from zero.
                startingOver(
                    Self.validatorMismatch(headers, state.validators).map { "the file changed: " + $0 }
                        ?? "the server sent the whole file instead of the rest (it ignored the range, or the file changed)",
                    state: &state, progress: progress, job: request.jobID)
                try file.truncate(to: 0)
                state.received = 0
            }
            take(headers, into: &state)
        case 416:
            if overlap == 0, let total = ContentRange(headers.first(name: "content-range"))?.total, total == state.received, total > 0 {
                // Everything is on disk already: verified from the file, not fetched again.
                state.size = total
                try digests.rebuild(from: file, upTo: state.received)
                return
            }
            let from = state.received - overlap
            overlap = 0
            response = try await restartFromZero(
                "the server refused the range from byte \(from) (416)", request: request, file: file, state: &state, progress: progress)
        default:
            throw statusFailure(status, response.status.reasonPhrase, headers, host: hostName(state))
        }
        if overlap > 0, let size = state.size, state.received == size {
            // Every byte is on disk already: the answer is the overlap alone, compared here.
            let served = try await response.body.collect(upTo: Int(overlap) + 1)
            if let at = try Self.firstDifference(served, at: size - overlap, file: file.writer) {
                overlap = 0
                response = try await restartFromZero(
                    OverlapResume.changed(at: at, offset: size), request: request, file: file, state: &state, progress: progress)
            } else {
                try digests.rebuild(from: file, upTo: size)
                return
            }
        }
        if let expected = request.expectedSize, let announced = state.size, expected != announced {
            throw TransferFailure(.permanent, .sizeMismatch, "\(hostName(state)) announces \(announced) bytes, expected \(expected) (size)")
        }
        progress.update(received: state.received, size: state.size)
        // The answer told the size: the transfer stays in its lane, moves to the bulk lane or
        // waits for a bulk slot, before a byte of the body is written.
        try await progress.admit(remaining: state.size.map { $0 - state.received }, received: state.received)
        try reserveSpace(request, file: file, state: state)
        // Digests continue over the bytes already on disk, read back once per attempt.
        try digests.rebuild(from: file, upTo: state.received)

        // Ranges only after a first answer that is a range: a whole body cut where its range
        // ends would waste what was in flight.
        let workers =
            answerEnd != nil
                && Self.segmentable(state.validators, size: state.size, received: state.received, settings: request.segmentation)
            ? request.segmentation.count : 1
        // The host's other slots are given back at once when the file is one stream.
        progress.connections = workers
        if workers == 1, progress.hostConnections != nil {
            progress.hostConnections = [URLRules.hostKey(state.sourceURL ?? request.url): 1]
        }
        let layout: SegmentLayout
        if workers > 1, let size = state.size {
            layout = SegmentLayout(
                size: size, prefix: state.received,
                piece: SegmentLayout.pieceSize(size: size - state.received, workers: workers, minPiece: request.segmentation.minPiece),
                firstEnd: answerEnd)
        } else {
            layout = SegmentLayout(size: state.size ?? Int64.max, prefix: state.received)
        }
        try await streamExplained(
            request, file: file, state: &state, digests: digests, layout: layout, workers: workers, first: response,
            firstEnd: answerEnd, firstCheck: overlap, progress: progress, checkpoint: checkpoint)
    }

    /// The bytes on disk cannot be continued (`reason`): the file is cut to 0, and the whole
    /// file is asked for again from the job's URL; its answer must be a `200`.
    private func restartFromZero(
        _ reason: String, request: TransferRequest, file: PartialFile, state: inout AttemptState, progress: TransferProgress
    ) async throws -> HTTPClientResponse {
        startingOver(reason, state: &state, progress: progress, job: request.jobID)
        try file.truncate(to: 0)
        state.received = 0
        state.size = nil
        state.validators = Validators()
        let response = try await fetch(request, state: &state, rangeFrom: 0)
        try expect200(response, host: hostName(state))
        take(response.headers, into: &state)
        return response
    }

    /// A segmented download resumed: every range continues from its own synced offset, each
    /// with its own ranged request (If-Range: the same file, or the whole of it).
    private func resumeRanges(
        _ request: TransferRequest, layout stored: SegmentLayout, file: PartialFile, state: inout AttemptState, digests: Digests,
        progress: TransferProgress, checkpoint: @escaping @Sendable (TransferCheckpoint) async throws -> Void
    ) async throws {
        // Durability rule 3, per range: bytes past a range's synced offset are overwritten by
        // its next request; a file shorter than a range's offset lowers it.
        let onDisk = try file.size()
        var layout = stored.clamped(toFileSize: onDisk)
        if onDisk > layout.furthest { try file.truncate(to: layout.furthest) }
        // The ranges nobody started are taken in file order again, as in a fresh download.
        let workers = max(1, request.segmentation.count)
        if workers > 1 {
            layout = layout.cut(
                piece: SegmentLayout.pieceSize(
                    size: layout.size - layout.written, workers: workers, minPiece: request.segmentation.minPiece))
        }
        state.received = layout.written
        state.segments = layout.encoded
        if let book = state.sources {
            // No first request: the first live source defines the file (the stored validators
            // must match its answers, If-Range), the others' answers must agree with them.
            guard
                let first = book.state.withLock({ set -> Int? in
                    set.reference = set.first
                    return set.first
                })
            else { throw noSourceLeft(book, last: nil) }
            state.sourceURL = book.url(first)
        }
        progress.update(received: state.received, size: state.size)
        try await progress.admit(remaining: state.size.map { $0 - state.received }, received: state.received)
        try reserveSpace(request, file: file, state: state, from: layout.prefix)
        // The digests continue over the contiguous prefix, read back once per attempt.
        try digests.rebuild(from: file, upTo: layout.prefix)
        try await streamExplained(
            request, file: file, state: &state, digests: digests, layout: layout, workers: workers,
            first: nil, progress: progress, checkpoint: checkpoint)
    }

    /// `stream`, with the client's errors told as a user needs them: a body cut short is
    /// `truncated`, whatever way the client reports it.
    private func streamExplained(
        _ request: TransferRequest, file: PartialFile, state: inout AttemptState, digests: Digests, layout: SegmentLayout,
        workers: Int, first: HTTPClientResponse?, firstEnd: Int64? = nil, firstCheck: Int64 = 0, progress: TransferProgress,
        checkpoint: @escaping @Sendable (TransferCheckpoint) async throws -> Void
    ) async throws {
        do {
            try await stream(
                request, file: file, state: &state, digests: digests, layout: layout, workers: workers, first: first,
                firstEnd: firstEnd, firstCheck: firstCheck, progress: progress, checkpoint: checkpoint)
        } catch {
            if error is TransferFailure || error is CancellationError || Task.isCancelled { throw error }
            let classified = await explain(error, request: request, target: state.target, proxy: state.proxy)
            if let size = state.size, state.received < size, classified.error.code != JobErrorCode.timeout.rawValue,
                classified.kind != .permanent
            {
                throw TransferFailure(
                    .transient(.network), .truncated,
                    "the connection to \(hostName(state)) ended after \(state.received) of \(size) bytes (\(classified.error.message))")
            }
            throw classified
        }
    }

    static func digestFailure(_ path: String) -> TransferFailure {
        TransferFailure(
            .permanent, .digestError, "OpenSSL's libcrypto could not start a digest for \(path); check dld's OpenSSL installation (libssl)")
    }

    func hostName(_ state: AttemptState) -> String { state.target?.host ?? "the server" }

    /// Sends the request for `from` onwards, following redirects ourselves.
    /// With `rangeEnd`, asks for `[offset, rangeEnd)` only (a range of a segmented download).
    /// With `bulk` (the ranges of a segmented download, the rest of a big file), over
    /// HTTP/1.1 connections of its own even where the server offers HTTP/2: streams of one
    /// connection share its TCP window and AsyncHTTPClient's HTTP/2 flow control, which over a
    /// link with 40 ms round trips was slower than four connections (docs/benchmarks.md, "What
    /// was tried": ranges over HTTP/1.1 connections of their own).
    func fetch(
        _ request: TransferRequest, state: inout AttemptState, rangeFrom offset: Int64, rangeEnd: Int64? = nil, source: String? = nil,
        bulk: Bool = false
    ) async throws -> HTTPClientResponse {
        // A mirror's credentials (its user info, ~/.netrc) are its own host's, as the job's are.
        let start = source ?? state.sourceURL ?? request.url
        var current = start
        var hops = 0
        let origin = URL(string: start)?.host?.lowercased()
        let jobHost = URL(string: request.url)?.host?.lowercased()
        // user:password in the URL, else ~/.netrc, become Basic credentials for the job's own
        // host; the URL sent has no user info (it would reach logs and other hosts).
        var basic: String? = nil
        if var components = URLComponents(string: current), components.user != nil || components.password != nil {
            let user = components.user ?? ""
            let password = components.password ?? ""
            basic = Data("\(user):\(password)".utf8).base64EncodedString()
            components.user = nil
            components.password = nil
            current = components.string ?? current
        } else if let host = origin, let credentials = Netrc.credentials(for: host, in: request.netrc) {
            basic = Data("\(credentials.login):\(credentials.password)".utf8).base64EncodedString()
        }
        let hasOwnAuthorization = request.headers.contains { $0.name.lowercased() == "authorization" }
        // A job's own User-Agent (a browser's, sent by the extension; aria2's `user-agent`)
        // replaces dld's: two would be one header too many.
        let hasOwnUserAgent = request.headers.contains { $0.name.lowercased() == "user-agent" }
        let tls = tlsSettings(request)
        while true {
            let parsed = URL(string: current)
            state.target = parsed.flatMap(Target.init(parsed:)) ?? state.target
            // Chosen for each hop: a redirect may lead to a host that `no_proxy` names.
            let proxy = parsed.flatMap(configuration.proxies.proxy(for:))
            state.proxy = proxy
            let client = try client(for: tls, proxy: proxy, http1Only: bulk)
            var http = HTTPClientRequest(url: current)
            http.method = .GET
            if !hasOwnUserAgent { http.headers.add(name: "User-Agent", value: configuration.userAgent) }
            // Credentials are for the host they were given for: a redirect to another host
            // does not carry them, and the job's credential headers (given for its URL) never
            // go to a mirror on another host; a URL's own user info goes to that URL's host.
            let host = URL(string: current)?.host?.lowercased()
            let jobsHost = host == jobHost
            for header in request.headers where jobsHost || !header.isCredential {
                http.headers.add(name: header.name, value: header.value)
            }
            if host == origin, !(hasOwnAuthorization && jobsHost), let basic {
                http.headers.replaceOrAdd(name: "Authorization", value: "Basic \(basic)")
            }
            http.headers.replaceOrAdd(name: "Accept-Encoding", value: "identity")
            if offset > 0 || rangeEnd != nil {
                let last = rangeEnd.map { String($0 - 1) } ?? ""
                http.headers.replaceOrAdd(name: "Range", value: "bytes=\(offset)-\(last)")
                if let validator = state.validators.ifRange {
                    http.headers.replaceOrAdd(name: "If-Range", value: validator)
                }
            }
            let response = try await client.execute(http, timeout: configuration.headTimeout, logger: logger)
            // Bulk requests never ask for HTTP/2: their answers say nothing of the host.
            if !bulk { noteVersion(response.version, of: current) }
            let status = Int(response.status.code)
            guard [301, 302, 303, 307, 308].contains(status), let location = response.headers.first(name: "location") else {
                state.finalURL = current
                if status == 200 || status == 206 {
                    responseHeads.report(path: request.path, response.headers)
                    noteAnnouncements(response.headers, request: request, state: &state)
                }
                return response
            }
            // Redirect bodies are short; reading a little lets the connection be reused.
            _ = try? await response.body.collect(upTo: 64 << 10)
            hops += 1
            guard hops <= configuration.maxRedirects else {
                throw TransferFailure(
                    .permanent, .tooManyRedirects,
                    "more than \(configuration.maxRedirects) redirects from \(URLRules.redacted(start)); the server sends dld in circles")
            }
            guard let base = URL(string: current) else {
                throw TransferFailure(
                    .permanent, .invalidURL, "the URL \(URLRules.redacted(current).prefix(200)) cannot be requested; check it")
            }
            current = try RedirectPolicy.target(from: base, location: location).get().absoluteString
        }
    }

    /// Remembers whether the host of `url` answered over HTTP/2.
    private func noteVersion(_ version: HTTPVersion, of url: String) {
        let host = URLRules.hostKey(url)
        let multiplexed = version.major >= 2
        multiplexedHosts.withLock { hosts in
            if multiplexed { hosts.insert(host) } else { hosts.remove(host) }
        }
    }

    /// Before the body: the low-space floor plus what the job still needs must be free, and a
    /// known size is reserved with fallocate, so a full disk shows now and not at 99 %.
    func reserveSpace(_ request: TransferRequest, file: PartialFile, state: AttemptState, from start: Int64? = nil) throws {
        let remaining = state.size.map { $0 - state.received }
        let folder = (request.path as NSString).deletingLastPathComponent
        if let free = FileSystem.freeBytes(folder), !request.diskSpace.allows(free: free, remaining: remaining) {
            throw TransferFailure(
                .transient(.diskSpace), .diskSpace,
                "\(folder) has \(free) bytes free; this job needs \(remaining.map(String.init) ?? "an unknown number of") more and \(request.diskSpace.minFree) must stay free"
            )
        }
        let from = start ?? state.received
        if let size = state.size, size > from {
            try file.reserve(from: from, length: size - from)
        }
    }

    /// While the body streams: the floor must hold (another program may fill the disk).
    func checkFloor(_ request: TransferRequest) throws {
        let folder = (request.path as NSString).deletingLastPathComponent
        if let free = FileSystem.freeBytes(folder), free < request.diskSpace.minFree {
            throw TransferFailure(
                .transient(.diskSpace), .diskSpace,
                "\(folder) has \(free) bytes free, below the floor of \(request.diskSpace.minFree)")
        }
    }

    func expect200(_ response: HTTPClientResponse, host: String) throws {
        let status = Int(response.status.code)
        guard status == 200 else { throw statusFailure(status, response.status.reasonPhrase, response.headers, host: host) }
    }

    func take(_ headers: HTTPHeaders, into state: inout AttemptState) {
        state.size = headers.first(name: "content-length").flatMap { Int64($0) }
        if let disposition = headers.first(name: "content-disposition"), let name = ContentDisposition.filename(disposition) {
            // Untrusted: no separators, control or bidi characters, leading dots, or .part.
            state.proposedName = FileNames.sanitize(name)
        }
        var validators = Validators()
        if let etag = headers.first(name: "etag"), !etag.hasPrefix("W/") { validators.etag = etag }
        validators.lastModified = headers.first(name: "last-modified")
        validators.acceptsRanges = headers.first(name: "accept-ranges")?.lowercased() == "bytes"
        state.validators = validators
    }

    func statusFailure(_ status: Int, _ reason: String, _ headers: HTTPHeaders, host: String) -> TransferFailure {
        TransferFailure(
            HTTPFailurePolicy.kind(forStatus: status), .httpStatus,
            HTTPFailurePolicy.message(host: host, status: status, reason: reason),
            retryAfter: HTTPFailurePolicy.retryAfter(headers.first(name: "retry-after"), now: Date()))
    }
}

/// The SHA-256 every completed job records, and the digest a client asked for when it is
/// another algorithm.
final class Digests {
    let sha256: StreamingDigest
    let requested: StreamingDigest?

    init?(_ checksum: Checksum?) {
        guard let sha256 = StreamingDigest(.sha256) else { return nil }
        self.sha256 = sha256
        if let algorithm = checksum?.algorithm, algorithm != .sha256 {
            guard let other = StreamingDigest(algorithm) else { return nil }
            requested = other
        } else {
            requested = nil
        }
    }

    func update(_ bytes: UnsafeRawBufferPointer) {
        sha256.update(bytes)
        requested?.update(bytes)
    }

    /// Starts over and hashes the first `length` bytes of the file.
    func rebuild(from file: PartialFile, upTo length: Int64) throws(TransferFailure) {
        sha256.reset()
        requested?.reset()
        try file.read(upTo: length) { update($0) }
    }
}

extension Duration {
    var seconds: TimeInterval { Double(components.seconds) + Double(components.attoseconds) / 1e18 }
}

/// `Content-Range: bytes START-END/TOTAL`.
struct ContentRange: Equatable {
    var start: Int64
    var end: Int64?
    var total: Int64?

    init(start: Int64, end: Int64?, total: Int64?) {
        self.start = start
        self.end = end
        self.total = total
    }

    init?(_ header: String?) {
        guard let header, header.lowercased().hasPrefix("bytes ") else { return nil }
        let spec = header.dropFirst(6)
        let parts = spec.split(separator: "/", maxSplits: 1)
        guard parts.count == 2 else { return nil }
        total = Int64(parts[1])
        if parts[0] == "*" {
            start = 0
            end = nil
            return
        }
        let bounds = parts[0].split(separator: "-", maxSplits: 1)
        guard bounds.count == 2, let first = Int64(bounds[0]), let last = Int64(bounds[1]) else { return nil }
        start = first
        end = last
    }
}
