import Foundation

/// A mount of powercutfs (scripts/powercutfs.c): a FUSE filesystem over a backing folder that
/// keeps in memory what a power cut would lose (data not yet fsynced, names not yet made
/// durable by an fsync of their folder) and drops it on `cut`. Built from its source with
/// `cc` the first time a test needs it (it needs libfuse3-dev and fuse3: scripts/deps.sh).
/// Without /dev/fuse, or without the library, `mount` throws, saying so: the tests that need
/// it fail, never skip.
public final class PowerCutFS: @unchecked Sendable {
    public let root: String
    /// The folder that holds the files for real, between mounts.
    public let backing: String
    /// Where unlinked and replaced files wait until their removal is durable.
    public let trash: String
    public let mountpoint: String
    private var process: Process?
    private var input: FileHandle?
    private var output: Int32 = -1
    private var buffered = Data()
    private var errors: Pipe?
    /// One command and its answer at a time (the workload freezes while the test waits).
    private let lock = NSLock()
    /// What the filesystem refuses, on every mount (`POWERCUTFS_REFUSE`): `"noreplace"`, a
    /// filesystem without RENAME_NOREPLACE; `"noreplace,link"`, without hard links too.
    public var refusing: String?

    /// Under a new temp folder; `folders` are made in the backing folder before the first
    /// mount, so that they exist durably (as if made and synced before the test).
    public init(folders: [String] = []) throws {
        let made = try makeTemporaryFolder("/tmp/dldpc-XXXXXX")
        root = made
        backing = made + "/backing"
        trash = made + "/trash"
        mountpoint = made + "/mnt"
        for dir in [backing, trash, mountpoint] + folders.map({ backing + "/" + $0 }) {
            try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        }
    }

    deinit {
        if let process, process.isRunning {
            _ = try? command("quit")
            process.waitUntilExit()
        }
        umount2(mountpoint, Int32(MNT_DETACH))
        if output >= 0 { close(output) }
        try? FileManager.default.removeItem(atPath: root)
    }

    /// The source, beside this package's other scripts.
    static var source: String { script("powercutfs.c") }

    static func script(_ name: String) -> String {
        let here = URL(fileURLWithPath: #filePath)
        return here.deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("scripts/" + name).path
    }

    /// Compiles powercutfs into .build when it is missing or older than its source.
    public static func binary() throws -> String {
        try compiled(source, as: "powercutfs", flags: "$(pkg-config --cflags --libs fuse3) -lpthread")
    }

    /// The shim that makes dld's `syncfs` of the mount a syncfs powercutfs honours
    /// (scripts/powercutfs_shim.c), compiled into .build like powercutfs.
    public static func shim() throws -> String {
        try compiled(script("powercutfs_shim.c"), as: "powercutfs_shim.so", flags: "-shared -fPIC -ldl")
    }

    /// What dld's environment needs for the shim: preloaded, and told the mount. The file whose
    /// fsync stands for a syncfs is made in the backing folder (there before any cut).
    public func syncfsShimEnvironment() throws -> [String: String] {
        let marker = backing + "/.powercutfs-syncfs"
        if !FileManager.default.fileExists(atPath: marker) {
            guard FileManager.default.createFile(atPath: marker, contents: nil) else { throw HarnessError("cannot create \(marker)") }
        }
        return ["LD_PRELOAD": try Self.shim(), "POWERCUTFS_SHIM_ROOT": mountpoint]
    }

    /// `source` compiled with `cc` into .build/powercutfs/`name` when that is missing or older.
    static func compiled(_ source: String, as name: String, flags: String) throws -> String {
        let build = URL(fileURLWithPath: source).deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent(".build/powercutfs").path
        let binary = build + "/" + name
        let files = FileManager.default
        if let built = (try? files.attributesOfItem(atPath: binary))?[.modificationDate] as? Date,
            let written = (try? files.attributesOfItem(atPath: source))?[.modificationDate] as? Date, built >= written
        {
            return binary
        }
        try files.createDirectory(atPath: build, withIntermediateDirectories: true)
        // Built aside, then renamed: two test processes may build it at once.
        let partial = binary + ".\(getpid())"
        let result = try runProgram("/bin/sh", ["-c", "cc -O2 -Wall -o \"$1\" \"$2\" \(flags)", "sh", partial, source])
        guard result.status == 0, rename(partial, binary) == 0 else {
            throw HarnessError(
                "cannot build \(name) from \(source) (it needs cc, pkg-config and libfuse3-dev: run scripts/deps.sh as root):\n\(result.stderr)"
            )
        }
        return binary
    }

    /// Mounts the backing folder (again, after a cut: a fresh mount, as after a reboot).
    public func mount() throws {
        guard FileManager.default.fileExists(atPath: "/dev/fuse") else {
            throw HarnessError(
                "the power-cut tests need FUSE: /dev/fuse is missing (load the fuse module, or give the container the device)")
        }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: try Self.binary())
        process.arguments = [backing, trash, mountpoint]
        if let refusing { process.environment = ProcessInfo.processInfo.environment.merging(["POWERCUTFS_REFUSE": refusing]) { $1 } }
        let stdin = Pipe()
        let stdout = Pipe()
        let stderr = Pipe()
        process.standardInput = stdin
        process.standardOutput = stdout
        process.standardError = stderr
        try process.run()
        self.process = process
        input = stdin.fileHandleForWriting
        if output >= 0 { close(output) }
        output = dup(stdout.fileHandleForReading.fileDescriptor)
        buffered = Data()
        errors = stderr
        guard let line = readLine(timeout: 20), line == "mounted" else {
            process.terminate()
            process.waitUntilExit()
            let message = String(decoding: stderr.fileHandleForReading.availableData, as: UTF8.self)
            throw HarnessError("powercutfs could not mount \(mountpoint) (it needs /dev/fuse and root): \(message)")
        }
    }

    /// Sends one command and returns its answer line.
    @discardableResult
    public func command(_ line: String, timeout: TimeInterval = 60) throws -> String {
        lock.lock()
        defer { lock.unlock() }
        guard let input, let process, process.isRunning else { throw HarnessError("powercutfs is not running") }
        try input.write(contentsOf: Data((line + "\n").utf8))
        guard let answer = readLine(timeout: timeout) else { throw HarnessError("powercutfs did not answer \(line)") }
        if answer.hasPrefix("error") { throw HarnessError("powercutfs: \(answer)") }
        return answer
    }

    /// Freezes the filesystem at the `count`-th operation of one of `kinds` on a path that
    /// contains `pattern` (nil: any), before it is applied or after. With `minUnsynced`, only
    /// operations on a file that has at least that many bytes written since its last sync
    /// count: a point inside a transaction that big, not in a small one beside it.
    public func arm(_ kinds: String, _ pattern: String?, count: Int, after: Bool, minUnsynced: Int = 0) throws {
        try command("arm \(kinds) \(pattern ?? "-") \(count) \(after ? "after" : "before") \(minUnsynced)")
    }

    /// Freezes at once (SIGUSR1), even while another thread waits for an answer.
    public func freeze() {
        if let process, process.isRunning { kill(process.processIdentifier, SIGUSR1) }
    }

    /// Whether the filesystem froze within `timeout`; the operation it froze at: its kind, its
    /// path and what that file had written since its last sync ("write /state/jobs.sqlite-wal
    /// unsynced=1310720"; "signal - unsynced=0" for `freeze`).
    public func waitFrozen(timeout: TimeInterval) throws -> Frozen? {
        let answer = try command("wait \(Int(timeout * 1000))", timeout: timeout + 30)
        guard answer.hasPrefix("frozen ") else { return nil }
        let fields = answer.dropFirst("frozen ".count).split(separator: " ")
        guard fields.count >= 3, let bytes = Int(fields[fields.count - 1].dropFirst("unsynced=".count)) else {
            throw HarnessError("powercutfs: a frozen answer without its operation: \(answer)")
        }
        return Frozen(kind: String(fields[0]), path: fields[1..<(fields.count - 1)].joined(separator: " "), unsynced: bytes)
    }

    /// The operation a cut froze at.
    public struct Frozen: Sendable, CustomStringConvertible {
        public var kind: String
        public var path: String
        /// The bytes its file had written since its last sync (before the operation, for a
        /// cut before it).
        public var unsynced: Int
        public var description: String { "\(kind) \(path) (\(unsynced) bytes unsynced)" }
    }

    /// Makes operations fail with `errno` (`count` times; 0: until `clear`).
    public func fail(_ kinds: String, _ pattern: String?, errno code: Int32, count: Int = 0) throws {
        try command("fail \(kinds) \(pattern ?? "-") \(code) \(count)")
    }

    public func clearFailures() throws { try command("clear") }

    /// What a power cut leaves of what was not durable (scripts/powercutfs.c, `cut`).
    public enum CutMode: String, Sendable {
        /// Files as at their last sync, size included; names as at their folder's last sync.
        case plain
        /// Data written and not synced reads as zeros, and a grown size stays (a filesystem
        /// that wrote the size but not the data).
        case zeros
        /// Every other unsynced write reached the disk anyway (the kernel's own writeback of
        /// some pages): a later write kept, an earlier one lost (zeros past the old end), so a
        /// torn append is left.
        case torn
        /// A journal commit just before the cut: every name change is durable, whatever folder
        /// was synced; data as at its last sync.
        case names
    }

    /// The power cut: every operation waits, what is not durable is undone (as `mode` says),
    /// and what waits fails. Throws when an undo failed (the disk is not what the model says).
    /// Returns the number of records undone.
    @discardableResult
    public func cut(_ mode: CutMode = .plain) throws -> Int {
        let answer = try command(mode == .plain ? "cut" : "cut \(mode.rawValue)")
        return Int(answer.split(separator: " ").last ?? "") ?? 0
    }

    /// Unmounts and waits for the program to end.
    public func unmount() throws {
        guard let process else { return }
        if process.isRunning { _ = try? command("quit", timeout: 10) }
        let deadline = Date().addingTimeInterval(20)
        while process.isRunning && Date() < deadline { usleep(10_000) }
        if process.isRunning {
            process.terminate()
            process.waitUntilExit()
        }
        umount2(mountpoint, Int32(MNT_DETACH))
        self.process = nil
    }

    private func readLine(timeout: TimeInterval) -> String? {
        let deadline = Date().addingTimeInterval(timeout)
        while true {
            if let newline = buffered.firstIndex(of: UInt8(ascii: "\n")) {
                let line = String(decoding: buffered[buffered.startIndex..<newline], as: UTF8.self)
                buffered.removeSubrange(buffered.startIndex...newline)
                return line
            }
            let left = deadline.timeIntervalSinceNow
            guard left > 0 else { return nil }
            var poller = pollfd(fd: output, events: Int16(POLLIN), revents: 0)
            let ready = poll(&poller, 1, Int32(min(left, 1) * 1000))
            if ready < 0 && errno != EINTR { return nil }
            if ready <= 0 { continue }
            var chunk = [UInt8](repeating: 0, count: 4096)
            let n = read(output, &chunk, chunk.count)
            if n <= 0 { return nil }
            buffered.append(contentsOf: chunk[0..<n])
        }
    }
}
