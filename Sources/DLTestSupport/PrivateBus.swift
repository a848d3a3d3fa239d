import Foundation

/// A D-Bus daemon of the test's own, on a Unix socket in a temporary folder, that a `dld`
/// started with `DBUS_SYSTEM_BUS_ADDRESS = address` takes for the system bus. The config lets
/// everyone connect, own any name and send anything: it is the test's alone. Stopped (by its
/// pid) by `stop()` or when the value goes away.
public final class PrivateBus: @unchecked Sendable {
    public let folder: String
    /// The bus's address, as dbus-daemon printed it.
    public let address: String
    private let process: Process
    private let output: CollectedOutput

    static let config = """
        <!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
         "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
        <busconfig>
          <listen>unix:path=SOCKET</listen>
          <auth>EXTERNAL</auth>
          <policy context="default">
            <allow user="*"/>
            <allow own="*"/>
            <allow send_destination="*" eavesdrop="true"/>
            <allow receive_sender="*"/>
          </policy>
        </busconfig>

        """

    /// Starts `dbus-daemon --nofork` and returns once it printed its address.
    public static func start(timeout: TimeInterval = 30) throws -> PrivateBus {
        let folder = try temporaryFolder("dld-bus")
        do {
            let configFile = folder + "/bus.conf"
            try config.replacingOccurrences(of: "SOCKET", with: folder + "/bus")
                .write(toFile: configFile, atomically: true, encoding: .utf8)
            let output = CollectedOutput()
            let process = try output.run(
                "/usr/bin/dbus-daemon", ["--config-file=\(configFile)", "--print-address", "--nofork"])
            guard let line = output.waitForLine(timeout: timeout, where: { $0.hasPrefix("unix:") }) else {
                output.stop(process)
                throw HarnessError("dbus-daemon did not print its address within \(timeout) s: \(output.text)")
            }
            return PrivateBus(folder: folder, address: line, process: process, output: output)
        } catch {
            try? FileManager.default.removeItem(atPath: folder)
            throw error
        }
    }

    private init(folder: String, address: String, process: Process, output: CollectedOutput) {
        self.folder = folder
        self.address = address
        self.process = process
        self.output = output
    }

    public func stop() {
        output.stop(process)
        try? FileManager.default.removeItem(atPath: folder)
    }

    deinit { stop() }
}

/// A stand-in for NetworkManager on a `PrivateBus`: a script for /usr/bin/python3 (with
/// python3-dbus and GObject) that owns `org.freedesktop.NetworkManager` and exports, on
/// `/org/freedesktop/NetworkManager`, the `Metered` property (NMMetered, a `u`) of interface
/// `org.freedesktop.NetworkManager` through `org.freedesktop.DBus.Properties` `Get` and
/// `GetAll`, as NetworkManager documents it. `setMetered` changes it and emits
/// `PropertiesChanged`, as NetworkManager does.
public final class FakeNetworkManager: @unchecked Sendable {
    private let process: Process
    private let output: CollectedOutput
    private var switches = 0

    /// SIGUSR1 makes the connection metered (1, yes), SIGUSR2 not metered (2, no); each
    /// switch prints `switched N` once its signal is sent.
    static let script = """
        import signal, sys
        import dbus, dbus.bus, dbus.service, dbus.mainloop.glib
        from gi.repository import GLib

        NAME = "org.freedesktop.NetworkManager"
        PATH = "/org/freedesktop/NetworkManager"

        class NetworkManager(dbus.service.Object):
            def __init__(self, bus, metered):
                super().__init__(bus, PATH)
                self.metered = metered
                self.switches = 0

            @dbus.service.method(dbus.PROPERTIES_IFACE, in_signature="ss", out_signature="v")
            def Get(self, interface, name):
                if interface == NAME and name == "Metered":
                    return dbus.UInt32(self.metered)
                raise dbus.exceptions.DBusException("no property " + name, name="org.freedesktop.DBus.Error.UnknownProperty")

            @dbus.service.method(dbus.PROPERTIES_IFACE, in_signature="s", out_signature="a{sv}")
            def GetAll(self, interface):
                return {"Metered": dbus.UInt32(self.metered)} if interface == NAME else {}

            @dbus.service.signal(dbus.PROPERTIES_IFACE, signature="sa{sv}as")
            def PropertiesChanged(self, interface, changed, invalidated):
                pass

            def switch(self, value):
                self.metered = value
                self.PropertiesChanged(NAME, {"Metered": dbus.UInt32(value)}, [])
                self.switches += 1
                print("switched", self.switches, flush=True)
                return True

        # A test process may have blocked signals, and its children inherit the mask.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM})
        dbus.mainloop.glib.DBusGMainLoop(set_as_default=True)
        bus = dbus.bus.BusConnection(sys.argv[1])
        manager = NetworkManager(bus, int(sys.argv[2]))
        name = dbus.service.BusName(NAME, bus, do_not_queue=True)
        loop = GLib.MainLoop()
        GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, signal.SIGUSR1, lambda: manager.switch(1))
        GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, signal.SIGUSR2, lambda: manager.switch(2))
        GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, signal.SIGTERM, lambda: loop.quit() or False)
        print("ready", flush=True)
        loop.run()

        """

    /// Starts the stand-in with `Metered` at `metered` (1 yes, 2 no, …) and returns once it
    /// owns its name on the bus.
    public static func start(on bus: PrivateBus, metered: UInt32, timeout: TimeInterval = 30) throws -> FakeNetworkManager {
        let scriptFile = bus.folder + "/fake-networkmanager.py"
        try script.write(toFile: scriptFile, atomically: true, encoding: .utf8)
        let output = CollectedOutput()
        // /usr/bin/python3: the system's, which has python3-dbus and GObject.
        let process = try output.run("/usr/bin/python3", [scriptFile, bus.address, String(metered)])
        guard output.waitForLine(timeout: timeout, where: { $0 == "ready" }) != nil else {
            output.stop(process)
            throw HarnessError("the fake NetworkManager did not start within \(timeout) s: \(output.text)")
        }
        return FakeNetworkManager(process: process, output: output)
    }

    private init(process: Process, output: CollectedOutput) {
        self.process = process
        self.output = output
    }

    /// Switches `Metered` to yes (1) or no (2) and returns once `PropertiesChanged` is sent.
    public func setMetered(_ metered: Bool, timeout: TimeInterval = 30) throws {
        switches += 1
        let expected = "switched \(switches)"
        kill(process.processIdentifier, metered ? SIGUSR1 : SIGUSR2)
        guard output.waitForLine(timeout: timeout, where: { $0 == expected }) != nil else {
            throw HarnessError("the fake NetworkManager did not switch within \(timeout) s: \(output.text)")
        }
    }

    public func stop() { output.stop(process) }

    deinit { stop() }
}

/// The output of a child process, collected as it comes, and the process's end by its pid.
final class CollectedOutput: @unchecked Sendable {
    private let lock = NSLock()
    private var data = Data()
    private var pipe: Pipe?

    var text: String {
        lock.lock()
        defer { lock.unlock() }
        return String(decoding: data, as: UTF8.self)
    }

    func run(_ path: String, _ arguments: [String]) throws -> Process {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: path)
        process.arguments = arguments
        let pipe = Pipe()
        process.standardOutput = pipe
        process.standardError = pipe
        pipe.fileHandleForReading.readabilityHandler = { [weak self] handle in
            let chunk = handle.availableData
            guard let self, !chunk.isEmpty else { return }
            self.lock.lock()
            self.data.append(chunk)
            self.lock.unlock()
        }
        self.pipe = pipe
        try process.run()
        return process
    }

    /// Waits until a whole line matches; returns it.
    func waitForLine(timeout: TimeInterval, where matches: (String) -> Bool) -> String? {
        let deadline = Date().addingTimeInterval(timeout)
        repeat {
            let lines = text.split(separator: "\n", omittingEmptySubsequences: true).dropLast(text.hasSuffix("\n") ? 0 : 1)
            if let line = lines.map(String.init).first(where: matches) { return line }
            usleep(20_000)
        } while Date() < deadline
        return nil
    }

    /// SIGTERM to the process, SIGKILL if it is still there after 10 s; waits for its end.
    func stop(_ process: Process) {
        if process.isRunning {
            kill(process.processIdentifier, SIGTERM)
            let deadline = Date().addingTimeInterval(10)
            while process.isRunning && Date() < deadline { usleep(10_000) }
            if process.isRunning {
                kill(process.processIdentifier, SIGKILL)
                process.waitUntilExit()
            }
        }
        pipe?.fileHandleForReading.readabilityHandler = nil
    }
}

/// A new folder under the temporary folder, `prefix-XXXXXX`, with a short path (socket paths
/// are limited to 107 bytes).
func temporaryFolder(_ prefix: String) throws -> String {
    var template = Array(("/tmp/\(prefix)-XXXXXX").utf8CString)
    let made = template.withUnsafeMutableBufferPointer { buffer -> String? in
        guard let base = buffer.baseAddress, mkdtemp(base) != nil else { return nil }
        return String(cString: base)
    }
    guard let made else { throw HarnessError("cannot create a temporary folder: \(String(cString: strerror(errno)))") }
    return made
}
