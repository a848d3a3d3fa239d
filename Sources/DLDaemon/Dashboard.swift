import Foundation

/// The dashboard's files, served by the HTTP listener at `/`, `/app.css` and `/app.js`. They
/// are built into the binary (`Package.swift`: `embedInCode`), so a dld serves the page of its
/// own version, and there is nothing to install or to find at run time.
public enum Dashboard {
    public struct File: Sendable {
        public let contentType: String
        public let bytes: [UInt8]
    }

    /// By request path.
    public static let files: [String: File] = [
        "/": File(contentType: "text/html; charset=utf-8", bytes: PackageResources.index_html),
        "/index.html": File(contentType: "text/html; charset=utf-8", bytes: PackageResources.index_html),
        "/app.css": File(contentType: "text/css; charset=utf-8", bytes: PackageResources.app_css),
        "/app.js": File(contentType: "text/javascript; charset=utf-8", bytes: PackageResources.app_js),
        "/icon.svg": File(contentType: "image/svg+xml", bytes: PackageResources.icon_svg),
    ]

    /// Only the page's own files and connections back to dld: no inline script or style, no
    /// other origin, no frames around it.
    public static let contentSecurityPolicy =
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
        + "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

    /// Headers a dashboard response carries besides the listener's own (`no-store`, `nosniff`).
    public static let headers: [(String, String)] = [
        ("Content-Security-Policy", contentSecurityPolicy), ("Referrer-Policy", "no-referrer"), ("X-Frame-Options", "DENY"),
    ]
}
