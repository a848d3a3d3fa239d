import Foundation

/// Debian's `age` and `age-keygen` (the reference implementation, in Go), the judge of the
/// files dld encrypts at rest: tests make an identity with one and decrypt with the other.
public enum AgeTool {
    /// An identity file and its recipient.
    public struct Identity: Sendable {
        public let path: String
        public let recipient: String
    }

    /// Makes a new identity in `folder` (`age-keygen -o`), and reads its recipient back
    /// (`age-keygen -y`).
    public static func keygen(in folder: String, name: String = "identity.txt") throws -> Identity {
        let path = folder + "/" + name
        _ = try run("age-keygen", ["-o", path])
        let recipient = String(decoding: try run("age-keygen", ["-y", path]), as: UTF8.self)
            .trimmingCharacters(in: .whitespacesAndNewlines)
        guard recipient.hasPrefix("age1") else { throw HarnessError("age-keygen -y printed \(recipient.prefix(200)), not a recipient") }
        return Identity(path: path, recipient: recipient)
    }

    /// The plaintext of an age file, decrypted by `age -d -i identity`; throws with age's own
    /// message when it refuses the file.
    public static func decrypt(_ file: String, identity: Identity) throws -> Data {
        try run("age", ["-d", "-i", identity.path, file])
    }

    @discardableResult
    static func run(_ name: String, _ arguments: [String]) throws -> Data {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: try find(name))
        process.arguments = arguments
        let output = Pipe()
        let errors = Pipe()
        process.standardOutput = output
        process.standardError = errors
        try process.run()
        // Read before waiting: a large plaintext would fill the pipe and block age.
        let data = output.fileHandleForReading.readDataToEndOfFile()
        let message = errors.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        guard process.terminationStatus == 0 else {
            throw HarnessError(
                "\(name) \(arguments.joined(separator: " ")) failed (\(process.terminationStatus)): \(String(decoding: message, as: UTF8.self).prefix(500))"
            )
        }
        return data
    }

    private static func find(_ name: String) throws -> String {
        for dir in ["/usr/bin", "/usr/local/bin"] where FileManager.default.isExecutableFile(atPath: dir + "/" + name) {
            return dir + "/" + name
        }
        throw HarnessError("\(name) is not installed; scripts/deps.sh (run by `make test`) installs it: sudo apt-get install age")
    }
}
