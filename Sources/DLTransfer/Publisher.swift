import DLCore
import Foundation
import NIOPosix

/// The last steps of finished files, done in batches so that many small files cost a few
/// disk flushes and not several each: sync their data in parallel, choose their names, and,
/// after the caller has committed them as completed, link them and sync each folder once.
///
/// The order is what makes a crash harmless (durability rule 4, docs/architecture.md):
/// data synced → row committed as `completed` with its final path → name linked → folder
/// synced. A crash before the commit leaves a running job (requeued, and cut back to its
/// committed offset); a crash after it leaves a completed job whose `.part` start-up
/// reconciliation links. A file is never under its name while its job is not completed.
public enum Publisher {
    /// Files synced at once: as many as the disk pool has threads.
    static let parallelSyncs = DiskPool.threads

    /// `fdatasync` of every file, several at a time, on the disk pool. Returns the
    /// failures by path; the others are durable.
    public static func syncAll(_ paths: [String]) async -> [String: TransferFailure] {
        await withTaskGroup(of: (String, TransferFailure?).self) { group in
            var failures: [String: TransferFailure] = [:]
            var next = paths.makeIterator()
            func add(_ path: String) {
                group.addTask {
                    let code = (try? await DiskPool.shared.runIfActive { () -> Int32 in
                        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
                        guard fd >= 0 else { return errno }
                        defer { close(fd) }
                        return fdatasync(fd) == 0 ? 0 : errno
                    }) ?? ECANCELED
                    return (path, code == 0 ? nil : PartialFile.failure("sync", path, code))
                }
            }
            for _ in 0..<parallelSyncs { if let path = next.next() { add(path) } }
            while let (path, failure) = await group.next() {
                if let failure { failures[path] = failure }
                if let path = next.next() { add(path) }
            }
            return failures
        }
    }

    /// The name a finished file takes: its target (the server's proposed name when the job's
    /// name is automatic), else the job's path; with `renameIfTaken`, `name (N).ext` when
    /// those are taken. Without `overwrite`, a name that is taken is never chosen.
    public static func chooseName(path: String, target: String?, overwrite: Bool, renameIfTaken: Bool,
                                  taken: (String) -> Bool = { access($0, F_OK) == 0 }) -> Result<String, TransferFailure> {
        // A name the server chose never replaces a file: if it is taken, it is numbered (when
        // the job takes `name (N)`), else the job's own name is used.
        if let target, target != path {
            if !taken(target) { return .success(target) }
            if renameIfTaken, let numbered = firstFree(like: target, taken: taken) { return .success(numbered) }
        }
        if overwrite || !taken(path) { return .success(path) }
        guard renameIfTaken else {
            return .failure(TransferFailure(.permanent, "destination_exists", "\(path) appeared while downloading; it was not replaced (the download is kept at \(path).part)"))
        }
        guard let numbered = firstFree(like: path, taken: taken) else {
            return .failure(TransferFailure(.permanent, "destination_exists", "no free name like \(path) (the download is kept at \(path).part)"))
        }
        return .success(numbered)
    }

    /// `name (2).ext`, `name (3).ext`, … up to 999: the first that is free.
    static func firstFree(like path: String, taken: (String) -> Bool) -> String? {
        let folder = (path as NSString).deletingLastPathComponent
        let name = (path as NSString).lastPathComponent
        for n in 2..<1000 {
            let candidate = folder + "/" + FileNames.numbered(name, n)
            if !taken(candidate) { return candidate }
        }
        return nil
    }

    /// A file to move to its final name.
    public struct Link: Sendable {
        public var partial: String
        public var final: String
        public var overwrite: Bool

        public init(partial: String, final: String, overwrite: Bool) {
            self.partial = partial
            self.final = final
            self.overwrite = overwrite
        }
    }

    /// Links every file under its name, then syncs each folder that gained one, on the
    /// disk pool: whoever awaits it is not held by the disk (here, when the pool has
    /// stopped). Returns a failure, or nil, for each link in order.
    public static func linkAll(_ links: [Link]) async -> [TransferFailure?] {
        guard !links.isEmpty else { return [] }
        if let done = try? await DiskPool.shared.runIfActive({ linkNow(links) }) { return done }
        return linkNow(links)
    }

    static func linkNow(_ links: [Link]) -> [TransferFailure?] {
        var failures: [TransferFailure?] = []
        for link in links {
            do throws(TransferFailure) {
                try PartialFile.link(link.partial, to: link.final, overwrite: link.overwrite)
                failures.append(nil)
            } catch {
                failures.append(error)
            }
        }
        syncFolders(of: zip(links, failures).filter { $0.1 == nil }.map(\.0.final))
        return failures
    }

    /// fsync of each folder once.
    public static func syncFolders(of paths: some Sequence<String>) {
        var synced: Set<String> = []
        for path in paths where synced.insert((path as NSString).deletingLastPathComponent).inserted {
            PartialFile.syncDirectory(of: path)
        }
    }
}
