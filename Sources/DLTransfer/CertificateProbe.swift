import Foundation
import NIOCore
import NIOPosix
import NIOSSL
import NIOTLS

/// Why a server's certificate was refused. The handshake error says only "certificate verify
/// failed"; BoringSSL's reason (expired, untrusted, …) does not reach us through the HTTP
/// client. So after such a failure dld connects once more to look: it reads the certificate
/// without verifying it (nothing is sent), and asks BoringSSL again whether the certificate
/// would pass with itself as the only trust root (then it is self-signed). Only on that
/// failure path, which ends the job: it costs one or two handshakes, once.
enum CertificateProbe {
    enum Finding: Equatable {
        case expired(Date)
        case notYetValid(Date)
        case selfSigned
        case unknownIssuer
    }

    /// What is wrong with the certificate `host` presents; nil when it cannot be learned (the
    /// server went away, say).
    static func diagnose(host: String, port: Int, tls: TLSConfiguration, group: any EventLoopGroup, timeout: TimeAmount, now: Date = Date())
        async -> Finding?
    {
        var unverified = tls
        unverified.certificateVerification = .none
        guard case .success(let presented) = await handshake(host: host, port: port, tls: unverified, group: group, timeout: timeout),
            let leaf = presented
        else { return nil }
        let notAfter = Date(timeIntervalSince1970: TimeInterval(leaf.notValidAfter))
        let notBefore = Date(timeIntervalSince1970: TimeInterval(leaf.notValidBefore))
        if notAfter < now { return .expired(notAfter) }
        if notBefore > now { return .notYetValid(notBefore) }
        var pinned = tls
        pinned.certificateVerification = .noHostnameVerification
        pinned.trustRoots = .certificates([leaf])
        pinned.additionalTrustRoots = []
        if case .success = await handshake(host: host, port: port, tls: pinned, group: group, timeout: timeout) {
            return .selfSigned
        }
        return .unknownIssuer
    }

    /// One TLS handshake; the server's leaf certificate when it completes.
    static func handshake(host: String, port: Int, tls: TLSConfiguration, group: any EventLoopGroup, timeout: TimeAmount) async -> Result<
        NIOSSLCertificate?, any Error
    > {
        let context: NIOSSLContext
        do {
            context = try NIOSSLContext(configuration: tls)
        } catch {
            return .failure(error)
        }
        // SNI takes a name, never an address.
        let serverName = (try? SocketAddress(ipAddress: host, port: 0)) == nil ? host : nil
        let loop = group.next()
        let promise = loop.makePromise(of: NIOSSLCertificate?.self)
        let bootstrap = ClientBootstrap(group: loop)
            .connectTimeout(timeout)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(NIOSSLClientHandler(context: context, serverHostname: serverName))
                    try channel.pipeline.syncOperations.addHandler(HandshakeWatcher(promise: promise))
                }
            }
        do {
            let channel = try await bootstrap.connect(host: host, port: port).get()
            let timer = loop.scheduleTask(in: timeout) { promise.fail(ChannelError.connectTimeout(timeout)) }
            defer {
                timer.cancel()
                channel.close(promise: nil)
            }
            return .success(try await promise.futureResult.get())
        } catch {
            // Every path completes the promise: NIO reports a promise that is dropped unfulfilled.
            promise.fail(error)
            return .failure(error)
        }
    }

    /// Completes the promise with the peer's certificate when the handshake is done, or with
    /// the error that stopped it.
    private final class HandshakeWatcher: ChannelInboundHandler {
        typealias InboundIn = ByteBuffer
        let promise: EventLoopPromise<NIOSSLCertificate?>

        init(promise: EventLoopPromise<NIOSSLCertificate?>) {
            self.promise = promise
        }

        func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
            if let event = event as? TLSUserEvent, case .handshakeCompleted = event {
                let handler = try? context.pipeline.syncOperations.handler(type: NIOSSLClientHandler.self)
                promise.succeed(handler?.peerCertificate)
            }
            context.fireUserInboundEventTriggered(event)
        }

        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            promise.fail(error)
            context.close(promise: nil)
        }

        func channelInactive(context: ChannelHandlerContext) {
            promise.fail(ChannelError.eof)
            context.fireChannelInactive()
        }
    }
}
