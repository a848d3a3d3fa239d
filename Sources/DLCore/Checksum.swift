/// The digest algorithms a client may ask to verify.
public enum DigestAlgorithm: String, Sendable, CaseIterable, Codable {
    case sha256, sha512, sha1, md5

    /// Hex digits in a digest.
    public var hexLength: Int {
        switch self {
        case .sha256: return 64
        case .sha512: return 128
        case .sha1: return 40
        case .md5: return 32
        }
    }
}

/// An expected digest, `ALGO:HEX` on the wire.
public struct Checksum: Sendable, Equatable, CustomStringConvertible {
    public var algorithm: DigestAlgorithm
    /// Lowercase hex.
    public var hex: String

    public init(algorithm: DigestAlgorithm, hex: String) {
        self.algorithm = algorithm
        self.hex = hex.lowercased()
    }

    /// Parses `sha256:ab12…` (also `sha-256`); nil with a reason when malformed.
    public static func parse(_ text: String) -> Result<Checksum, DLError> {
        guard let colon = text.firstIndex(of: ":") else {
            return .failure(.invalidParams("checksum must be ALGO:HEX, e.g. sha256:9f86d0…"))
        }
        let name = text[..<colon].lowercased().replacingOccurrences(of: "-", with: "")
        let hex = text[text.index(after: colon)...].lowercased()
        guard let algorithm = DigestAlgorithm(rawValue: name) else {
            return .failure(
                .invalidParams(
                    "checksum algorithm must be one of \(DigestAlgorithm.allCases.map(\.rawValue).joined(separator: ", ")), not \(name.prefix(20))"
                ))
        }
        guard hex.count == algorithm.hexLength, hex.allSatisfy({ $0.isHexDigit }) else {
            return .failure(.invalidParams("a \(algorithm.rawValue) checksum has \(algorithm.hexLength) hex digits"))
        }
        return .success(Checksum(algorithm: algorithm, hex: hex))
    }

    public var description: String { "\(algorithm.rawValue):\(hex)" }
}
