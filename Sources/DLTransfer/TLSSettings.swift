import DLCore
import Foundation
import NIOSSL

/// Where the daemon's trust comes from before any `ca_file`: the system store, or the files
/// named by `SSL_CERT_FILE` and `SSL_CERT_DIR` in dld's environment, which replace the system
/// bundle file and folder as they do for OpenSSL-based tools (curl, wget, git).
public struct SystemTrust: Sendable, Hashable {
    /// `SSL_CERT_FILE`: a PEM bundle instead of the system's bundle file.
    public var certFile: String?
    /// `SSL_CERT_DIR` (colon-separated): folders of certificates instead of the system's folder.
    public var certDirs: [String] = []

    public init(certFile: String? = nil, certDirs: [String] = []) {
        self.certFile = certFile
        self.certDirs = certDirs
    }

    /// Reads `SSL_CERT_FILE` and `SSL_CERT_DIR`. A path that does not exist is left out and
    /// reported in `ignored` (OpenSSL skips it silently; dld says so in its log).
    public static func fromEnvironment(_ environment: [String: String]) -> (trust: SystemTrust, ignored: [String]) {
        var trust = SystemTrust()
        var ignored: [String] = []
        if let file = environment["SSL_CERT_FILE"], !file.isEmpty {
            if TLSFileCheck.isRegularFile(file) { trust.certFile = file } else { ignored.append("SSL_CERT_FILE=\(file)") }
        }
        if let dirs = environment["SSL_CERT_DIR"], !dirs.isEmpty {
            for dir in dirs.split(separator: ":").map(String.init) where !dir.isEmpty {
                if TLSFileCheck.isDirectory(dir) { trust.certDirs.append(dir) } else { ignored.append("SSL_CERT_DIR entry \(dir)") }
            }
        }
        return (trust, ignored)
    }

    /// The system bundle file and folder NIOSSL looks for on Linux (Debian and Fedora layouts).
    static let systemFiles = ["/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt"]
    static let systemDirs = ["/etc/ssl/certs"]

    var isSystemDefault: Bool { certFile == nil && certDirs.isEmpty }
}

/// The TLS settings of one HTTP client: the daemon's (config file) merged with a job's own.
/// Hashable: the downloader keeps one client per distinct value.
public struct TLSSettings: Sendable, Hashable {
    /// Certificates are not verified (a job's `insecure`).
    public var insecure = false
    /// Added to the system trust (`ca_file`, `ca_dir` of the config file and of the job).
    public var caFiles: [String] = []
    public var caDirs: [String] = []
    /// Sent when a server asks for a client certificate.
    public var clientCert: String?
    public var clientKey: String?

    public init(insecure: Bool = false, caFiles: [String] = [], caDirs: [String] = [], clientCert: String? = nil, clientKey: String? = nil)
    {
        self.insecure = insecure
        self.caFiles = caFiles
        self.caDirs = caDirs
        self.clientCert = clientCert
        self.clientKey = clientKey
    }

    /// The daemon's settings with a job's on top: its CA files are trusted besides the
    /// daemon's, its client certificate replaces the daemon's.
    public func merged(insecure: Bool, job: JobTLS?) -> TLSSettings {
        var settings = self
        settings.insecure = insecure
        guard let job else { return settings }
        if let file = job.caFile, !settings.caFiles.contains(file) { settings.caFiles.append(file) }
        if let dir = job.caDir, !settings.caDirs.contains(dir) { settings.caDirs.append(dir) }
        if let cert = job.clientCert, let key = job.clientKey {
            settings.clientCert = cert
            settings.clientKey = key
        }
        return settings
    }

    /// The files these settings read, with what each is, for a message that names the one
    /// that cannot be read.
    var files: [(path: String, what: String)] {
        caFiles.map { ($0, "CA file") } + caDirs.map { ($0, "CA folder") }
            + (clientCert.map { [($0, "client certificate")] } ?? []) + (clientKey.map { [($0, "client key")] } ?? [])
    }

    /// NIOSSL's configuration: TLS 1.2 at least, the trust above, the client certificate
    /// (read now: a client made from it keeps it until dld restarts).
    func configuration(system: SystemTrust) throws(TransferFailure) -> TLSConfiguration {
        var tls = TLSConfiguration.makeClientConfiguration()
        // TLS 1.0 and 1.1 are deprecated (RFC 8996); no server worth trusting needs them.
        tls.minimumTLSVersion = .tlsv12
        if insecure {
            tls.certificateVerification = .none
        }
        // NIOSSL reads a folder only as the main trust root (with OpenSSL's hashed lookup);
        // added roots must be files or certificates, so other folders are read here.
        var additional: [NIOSSLAdditionalTrustRoots] = []
        if !system.isSystemDefault {
            // As OpenSSL: each variable replaces its own half of the default store.
            let file = system.certFile ?? SystemTrust.systemFiles.first(where: TLSFileCheck.isRegularFile)
            let dirs = system.certDirs.isEmpty ? SystemTrust.systemDirs.filter(TLSFileCheck.isDirectory) : system.certDirs
            if let first = dirs.first {
                tls.trustRoots = .file(first)
                additional += file.map { [.file($0)] } ?? []
            } else if let file {
                tls.trustRoots = .file(file)
            }
            additional += dirs.dropFirst().map { .certificates(TLSFileCheck.certificates(inFolder: $0)) }
        }
        additional += caFiles.map { .file($0) } + caDirs.map { .certificates(TLSFileCheck.certificates(inFolder: $0)) }
        tls.additionalTrustRoots = additional
        if let clientCert, let clientKey {
            guard let chain = try? NIOSSLCertificate.fromPEMFile(clientCert), !chain.isEmpty else {
                throw TransferFailure(
                    .permanent, .tlsConfig,
                    TLSFileCheck.certificates(clientCert, what: "client certificate")
                        ?? "the client certificate \(clientCert) cannot be loaded")
            }
            guard let key = try? NIOSSLPrivateKey(file: clientKey, format: .pem) else {
                throw TransferFailure(
                    .permanent, .tlsConfig,
                    TLSFileCheck.privateKey(clientKey, what: "client key")
                        ?? "the client key \(clientKey) cannot be loaded")
            }
            tls.certificateChain = chain.map { .certificate($0) }
            tls.privateKey = .privateKey(key)
        }
        return tls
    }
}

/// Checks of the TLS files a user names, with messages that say what is wrong with which file.
public enum TLSFileCheck {
    static func isRegularFile(_ path: String) -> Bool {
        var info = stat()
        return stat(path, &info) == 0 && (info.st_mode & S_IFMT) == S_IFREG
    }

    static func isDirectory(_ path: String) -> Bool {
        var info = stat()
        return stat(path, &info) == 0 && (info.st_mode & S_IFMT) == S_IFDIR
    }

    /// Why `path` cannot be used as `what`; nil when it can. `folder`: a directory is wanted.
    static func problem(_ path: String, what: String, folder: Bool = false) -> String? {
        guard path.hasPrefix("/") else { return "the \(what) \(path) must be an absolute path" }
        var info = stat()
        guard stat(path, &info) == 0 else { return "the \(what) \(path) cannot be read: \(String(cString: strerror(errno)))" }
        let isFolder = (info.st_mode & S_IFMT) == S_IFDIR
        if folder && !isFolder { return "the \(what) \(path) is not a folder" }
        if !folder && (info.st_mode & S_IFMT) != S_IFREG { return "the \(what) \(path) is not a regular file" }
        guard access(path, folder ? (R_OK | X_OK) : R_OK) == 0 else {
            return "the \(what) \(path) cannot be read: \(String(cString: strerror(errno)))"
        }
        return nil
    }

    /// A PEM file with at least one certificate (a CA bundle or a client certificate chain).
    public static func certificates(_ path: String, what: String) -> String? {
        if let problem = problem(path, what: what) { return problem }
        guard let certificates = try? NIOSSLCertificate.fromPEMFile(path), !certificates.isEmpty else {
            return "the \(what) \(path) holds no PEM certificate (\"-----BEGIN CERTIFICATE-----\")"
        }
        return nil
    }

    /// A folder of PEM certificates (`/etc/ssl/certs`, or one made with `openssl rehash`).
    public static func folder(_ path: String, what: String) -> String? {
        if let problem = problem(path, what: what, folder: true) { return problem }
        guard !certificates(inFolder: path).isEmpty else { return "the \(what) \(path) holds no PEM certificate" }
        return nil
    }

    /// Every certificate in the folder's PEM files (links followed); files that are not PEM
    /// certificates are passed over, as OpenSSL does.
    static func certificates(inFolder path: String) -> [NIOSSLCertificate] {
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: path) else { return [] }
        return names.sorted().flatMap { name -> [NIOSSLCertificate] in
            let file = path + "/" + name
            guard isRegularFile(file) else { return [] }
            return (try? NIOSSLCertificate.fromPEMFile(file)) ?? []
        }
    }

    /// An unencrypted PEM private key.
    public static func privateKey(_ path: String, what: String) -> String? {
        if let problem = problem(path, what: what) { return problem }
        guard (try? NIOSSLPrivateKey(file: path, format: .pem)) != nil else {
            return
                "the \(what) \(path) holds no unencrypted PEM private key (an encrypted key cannot be used: dld has no way to ask for its passphrase)"
        }
        return nil
    }
}
