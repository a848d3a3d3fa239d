import Foundation

/// Whether this machine has a route to a network other than itself, read from the kernel's
/// route tables as text (/proc/net/route and /proc/net/ipv6_route): a route that is up, not a
/// reject route, not a route to one of this machine's own addresses, on an interface other
/// than loopback, to somewhere other than IPv6 link-local or multicast addresses (which every
/// interface has and which reach no network). Pure, so it is tested
/// on sample tables.
public enum Routes {
    public static func hasNetwork(ipv4 routeTable: String, ipv6 ipv6Table: String) -> Bool {
        // Iface Destination Gateway Flags RefCnt Use Metric Mask …; a header line first.
        for line in routeTable.split(separator: "\n").dropFirst() {
            let fields = line.split(whereSeparator: { $0 == " " || $0 == "\t" })
            guard fields.count >= 4, fields[0] != "lo", let flags = UInt32(fields[3], radix: 16) else { continue }
            if flags & 0x1 != 0 && flags & 0x200 == 0 { return true }  // RTF_UP, not RTF_REJECT
        }
        // destination prefix-length source source-length next-hop metric refcnt use flags iface
        for line in ipv6Table.split(separator: "\n") {
            let fields = line.split(separator: " ", omittingEmptySubsequences: true)
            guard fields.count >= 10, fields[9] != "lo", let flags = UInt32(fields[8], radix: 16) else { continue }
            // RTF_UP, and neither RTF_REJECT nor RTF_LOCAL (an address of this machine).
            guard flags & 0x1 != 0, flags & 0x200 == 0, flags & 0x8000_0000 == 0 else { continue }
            let destination = fields[0].lowercased()
            if destination.hasPrefix("fe8") || destination.hasPrefix("fe9") || destination.hasPrefix("fea")
                || destination.hasPrefix("feb") || destination.hasPrefix("ff")
            {
                continue
            }
            return true
        }
        return false
    }

    /// The tables of this machine (of dld's network namespace); true when they cannot be read,
    /// so that a machine without /proc never counts as offline.
    public static func hasNetwork() -> Bool {
        guard let ipv4 = try? String(contentsOfFile: "/proc/net/route", encoding: .utf8) else { return true }
        let ipv6 = (try? String(contentsOfFile: "/proc/net/ipv6_route", encoding: .utf8)) ?? ""
        return hasNetwork(ipv4: ipv4, ipv6: ipv6)
    }
}
