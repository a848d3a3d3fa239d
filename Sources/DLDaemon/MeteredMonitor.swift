import CDLSystem
import DLCore
import Dispatch
import Foundation
import Logging

/// Tells whether the connection is metered, from NetworkManager's `Metered` property on the
/// system D-Bus (sd-bus, through `dld_nm_*`): a dispatch source on the bus connection wakes
/// when NetworkManager's properties change or its name comes or goes, and the property is read
/// again (no polling). Without libsystemd, a system bus or NetworkManager, the connection is
/// not metered; that is logged once. A bus that goes away stops the watch (not metered from
/// then on). Everything runs on the monitor's serial queue, which owns the mutable state.
final class MeteredMonitor: @unchecked Sendable {
    private let queue = DispatchQueue(label: "dld.metered")
    private let logger: Logger
    private var watch: OpaquePointer?
    private var source: DispatchSourceRead?
    private var onChange: (@Sendable (Bool) -> Void)?
    /// NetworkManager's value as last reported (nil: NetworkManager is not on the bus).
    private var value: Int?
    /// Whether the connection was metered when the monitor was opened.
    let initiallyMetered: Bool

    /// Opens the bus and reads the state once; `start` begins watching.
    init(logger: Logger) {
        self.logger = logger
        var why = [CChar](repeating: 0, count: 256)
        let opened = why.withUnsafeMutableBufferPointer { dld_nm_open($0.baseAddress, UInt($0.count)) }
        guard let opened else {
            let reason = String(decoding: why.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
            logger.info("the connection counts as not metered: the metered state cannot be read (\(reason))")
            initiallyMetered = false
            return
        }
        watch = opened
        let read = Int(dld_nm_metered(opened))
        value = read < 0 ? nil : read
        initiallyMetered = MeteredPolicy.isMetered(value)
        if value == nil {
            logger.info("NetworkManager is not on the system bus: the connection counts as not metered until it is")
        } else {
            logger.info("the connection is \(initiallyMetered ? "" : "not ")metered (NetworkManager)", metadata: ["nm_metered": "\(read)"])
        }
    }

    /// Reports every change of the metered state from now on, on the monitor's queue.
    func start(onChange: @escaping @Sendable (Bool) -> Void) {
        queue.sync {
            guard let watch, source == nil else { return }
            self.onChange = onChange
            let fd = dld_nm_fd(watch)
            guard fd >= 0 else {
                lost(Int32(-fd))
                return
            }
            let source = DispatchSource.makeReadSource(fileDescriptor: fd, queue: queue)
            source.setEventHandler { [weak self] in self?.process() }
            // The bus closes its descriptor itself, once the source no longer watches it.
            source.setCancelHandler { dld_nm_close(watch) }
            self.source = source
            source.resume()
            // Signals read during the opening calls are queued inside sd-bus, not on the socket.
            queue.async { [weak self] in self?.process() }
        }
    }

    func cancel() {
        queue.sync {
            stopWatching()
            onChange = nil
        }
    }

    /// Closes the bus connection (through the source's cancel handler when there is one).
    private func stopWatching() {
        if let source {
            source.cancel()
        } else if let watch {
            dld_nm_close(watch)
        }
        source = nil
        watch = nil
    }

    private func process() {
        guard let watch, source != nil else { return }
        let result = dld_nm_process(watch)
        guard result >= 0 else {
            lost(-result)
            return
        }
        let read = Int(dld_nm_metered(watch))
        let now: Int? = read < 0 ? nil : read
        guard now != value else { return }
        let was = MeteredPolicy.isMetered(value)
        if (now == nil) != (value == nil) {
            logger.info(
                now == nil
                    ? "NetworkManager left the system bus: the connection counts as not metered"
                    : "NetworkManager is on the system bus", metadata: ["nm_metered": "\(read)"])
        } else {
            logger.debug("NetworkManager's metered state changed", metadata: ["nm_metered": "\(read)"])
        }
        value = now
        let metered = MeteredPolicy.isMetered(now)
        if metered != was { onChange?(metered) }
    }

    /// The bus connection broke: the watch ends, and the connection counts as not metered.
    private func lost(_ errorNumber: Int32) {
        logger.info(
            "lost the system bus: the connection counts as not metered from now on",
            metadata: [
                "error": "\(String(cString: strerror(errorNumber)))"
            ])
        let wasMetered = MeteredPolicy.isMetered(value)
        value = nil
        stopWatching()
        if wasMetered { onChange?(false) }
    }
}
