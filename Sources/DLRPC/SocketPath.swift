import Foundation

/// Where the control socket is, as daemon and clients agree on it: `DLD_SOCKET` (clients),
/// else `$XDG_RUNTIME_DIR/dld/dld.sock`, else `/tmp/dld-<uid>/dld.sock` (as tmux does when there
/// is no runtime dir: containers, ssh sessions).
public enum SocketPath {
    public static func defaultPath(environment: [String: String] = ProcessInfo.processInfo.environment) -> String {
        if let runtime = environment["XDG_RUNTIME_DIR"], runtime.hasPrefix("/") {
            return runtime + "/dld/dld.sock"
        }
        return "/tmp/dld-\(getuid())/dld.sock"
    }

    /// For clients: `DLD_SOCKET` wins over the default.
    public static func clientPath(environment: [String: String] = ProcessInfo.processInfo.environment) -> String {
        if let explicit = environment["DLD_SOCKET"], !explicit.isEmpty { return explicit }
        return defaultPath(environment: environment)
    }
}
