import DLCore
import Foundation

/// Where an enqueued job's file goes: `path`, or `dir` (+ `name`), or the download folder with
/// a name from the URL. Checks what the filesystem says, so it lives here and not in the core.
enum Destination {
    static func resolve(
        url: String, path: String?, dir: String?, name: String?, downloadDir: String, overwrite: Bool
    ) throws(DLError) -> String {
        let target: String
        if let path {
            guard dir == nil, name == nil else {
                throw .invalidParams("give either \"path\", or \"dir\" and \"name\", not both")
            }
            guard path.hasPrefix("/") else { throw .invalidParams("\"path\" must be absolute, got \(path)") }
            target = normalized(path)
        } else {
            let folder = dir ?? downloadDir
            guard folder.hasPrefix("/") else { throw .invalidParams("\"dir\" must be absolute, got \(folder)") }
            let fileName: String
            if let name {
                guard !name.isEmpty, !name.contains("/"), name != ".", name != "..", !name.contains("\0") else {
                    throw .invalidParams("\"name\" must be a file name without \"/\", got \(name)")
                }
                fileName = name
            } else {
                fileName = FileNames.fromURL(url)
            }
            target = normalized(folder + "/" + fileName)
        }
        let parent = (target as NSString).deletingLastPathComponent
        let name = (target as NSString).lastPathComponent
        guard !name.isEmpty, name != "/" else { throw DLError(.destinationInvalid, "\(target) is not a file path") }
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: parent, isDirectory: &isDirectory), isDirectory.boolValue else {
            throw DLError(.destinationInvalid, "the folder \(parent) does not exist")
        }
        if FileManager.default.fileExists(atPath: target, isDirectory: &isDirectory) {
            if isDirectory.boolValue { throw DLError(.destinationInvalid, "\(target) is a folder") }
            if !overwrite {
                throw DLError(.destinationExists, "\(target) exists already; pass overwrite to replace it")
            }
        }
        return target
    }

    /// Removes `.` and `..` segments and doubled slashes, without touching the filesystem.
    static func normalized(_ path: String) -> String {
        var parts: [Substring] = []
        for part in path.split(separator: "/", omittingEmptySubsequences: true) {
            if part == "." { continue }
            if part == ".." {
                if !parts.isEmpty { parts.removeLast() }
                continue
            }
            parts.append(part)
        }
        return "/" + parts.joined(separator: "/")
    }
}
