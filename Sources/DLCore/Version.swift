/// dld's version, reported by `version` and in the User-Agent.
public enum DLDVersion {
    public static let current = "0.2.0"
    /// The protocol's version: bumped when docs/protocol.md changes incompatibly.
    public static let protocolVersion = 3
}
