import Foundation

/// A certificate authority of the tests' own, made with /usr/bin/openssl in a folder: it issues
/// server certificates for any names and dates (expired, not yet valid, for another host) and
/// client certificates, so that every way a TLS handshake can fail is shown with real
/// certificates.
public struct TestCA: Sendable {
    public let folder: String
    /// The CA's certificate (PEM): what a client is given as `ca_file` to trust the CA.
    public let certificatePath: String
    let keyPath: String

    /// A new CA in `folder` (created if missing).
    public static func make(in folder: String, name: String = "dld test CA") throws -> TestCA {
        try FileManager.default.createDirectory(atPath: folder + "/issued", withIntermediateDirectories: true)
        let ca = TestCA(folder: folder, certificatePath: folder + "/ca.pem", keyPath: folder + "/ca-key.pem")
        try openssl([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3", "-subj", "/CN=\(name)",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
            "-keyout", ca.keyPath, "-out", ca.certificatePath,
        ])
        try "".write(toFile: folder + "/index.txt", atomically: true, encoding: .utf8)
        try "1000\n".write(toFile: folder + "/serial", atomically: true, encoding: .utf8)
        // `openssl ca` is the one tool of OpenSSL 3.0 that sets any validity dates.
        let config = """
            [ ca ]
            default_ca = test
            [ test ]
            database = \(folder)/index.txt
            new_certs_dir = \(folder)/issued
            serial = \(folder)/serial
            certificate = \(ca.certificatePath)
            private_key = \(ca.keyPath)
            default_md = sha256
            policy = any
            copy_extensions = copy
            unique_subject = no
            [ any ]
            commonName = supplied
            """
        try config.write(toFile: folder + "/ca.cnf", atomically: true, encoding: .utf8)
        return ca
    }

    /// Issues a certificate and key named `name` (files `name.pem`, `name-key.pem`).
    /// - Parameters:
    ///   - subjectAltName: e.g. `IP:127.0.0.1,DNS:localhost`.
    ///   - notBefore, notAfter: validity; by default from an hour ago to two days ahead.
    public func issue(
        _ name: String, commonName: String = "127.0.0.1", subjectAltName: String = "IP:127.0.0.1,DNS:localhost",
        notBefore: Date = Date().addingTimeInterval(-3600), notAfter: Date = Date().addingTimeInterval(2 * 86_400)
    ) throws -> TLSFiles {
        let files = TLSFiles(certificatePath: folder + "/\(name).pem", keyPath: folder + "/\(name)-key.pem")
        let request = folder + "/\(name).csr"
        try Self.openssl([
            "req", "-new", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=\(commonName)",
            "-addext", "subjectAltName=\(subjectAltName)", "-keyout", files.keyPath, "-out", request,
        ])
        try Self.openssl([
            "ca", "-batch", "-notext", "-config", folder + "/ca.cnf", "-in", request, "-out", files.certificatePath,
            "-startdate", Self.stamp(notBefore), "-enddate", Self.stamp(notAfter),
        ])
        return files
    }

    /// `YYYYMMDDHHMMSSZ`, the form `openssl ca` takes.
    static func stamp(_ date: Date) -> String {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "UTC")
        formatter.dateFormat = "yyyyMMddHHmmss"
        return formatter.string(from: date) + "Z"
    }

    static func openssl(_ arguments: [String]) throws {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/openssl")
        process.arguments = arguments
        let output = Pipe()
        process.standardOutput = output
        process.standardError = output
        do {
            try process.run()
        } catch {
            throw TestOriginError.certificate("/usr/bin/openssl cannot run: \(error)")
        }
        let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        guard process.terminationStatus == 0 else {
            throw TestOriginError.certificate("openssl \(arguments.first ?? "") exited with \(process.terminationStatus): \(text)")
        }
    }
}
