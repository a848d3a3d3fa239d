import CDLSystem
import DLCore
import Dispatch
import Foundation
import Logging

/// Tells when this machine gains or loses its route to a network, from the kernel's netlink
/// notifications (no polling): after a burst of link, address or route messages has settled
/// (50 ms), the route tables are read again (`Routes.hasNetwork`) and a change is reported.
/// Everything runs on its own serial queue, which owns the mutable state.
final class RouteMonitor: @unchecked Sendable {
    private let queue = DispatchQueue(label: "dld.routes")
    private let source: DispatchSourceRead
    private let onChange: @Sendable (Bool) -> Void
    private var online: Bool
    private var settling = false

    /// Nil when the netlink socket cannot be opened (then dld behaves as if always online).
    init?(logger: Logger, onChange: @escaping @Sendable (Bool) -> Void) {
        let fd = dld_route_monitor_open()
        guard fd >= 0 else {
            logger.warning(
                "cannot watch the network's routes (netlink); jobs will not wait for the network to come back",
                metadata: ["errno": "\(errno)"])
            return nil
        }
        self.onChange = onChange
        online = Routes.hasNetwork()
        source = DispatchSource.makeReadSource(fileDescriptor: fd, queue: queue)
        source.setEventHandler { [weak self] in self?.drain(fd) }
        source.setCancelHandler { close(fd) }
        source.resume()
    }

    func cancel() { source.cancel() }

    private func drain(_ fd: Int32) {
        var buffer = [UInt8](repeating: 0, count: 16 << 10)
        while buffer.withUnsafeMutableBytes({ recv(fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }) > 0 {}
        guard !settling else { return }
        settling = true
        queue.asyncAfter(deadline: .now() + .milliseconds(50)) { [weak self] in self?.settle() }
    }

    private func settle() {
        settling = false
        let now = Routes.hasNetwork()
        guard now != online else { return }
        online = now
        onChange(now)
    }
}
