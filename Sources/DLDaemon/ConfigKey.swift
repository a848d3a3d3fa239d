import DLCore
import DLStorePostgres
import DLTransfer
import Foundation
import Logging

/// One key of the config file, as an entry of `DaemonConfig.table`: its name, how a value is
/// read into the configuration (the builder used says the type: `.int`, `.path`, …), how
/// `--print-config` writes it, whether a reload applies it, and one line of help. Defaults
/// are the initial values of `DaemonConfig`'s properties (four come from the environment).
public struct ConfigKey: Sendable {
    /// Whether a reload (SIGHUP) applies a changed value at once, or only at the next start
    /// because the running daemon holds it: the socket and the state folder are in use, the job
    /// table and the cache are open, the HTTP clients hold their TLS files, proxies and
    /// timeouts, and a worker's name and lease are known to the others.
    public enum Reload: Sendable { case live, restart }

    public let name: String
    public let reload: Reload
    /// One line for people reading the table; docs/configuration.md says the rest.
    public let help: String
    /// Reads the file's value into the configuration; throws a message that names the key.
    let parse: @Sendable (ConfigValue, inout DaemonConfig) throws -> Void
    /// The value as the file would write it; nil when unset, which `--print-config` leaves out.
    let render: @Sendable (DaemonConfig) -> String?
    /// Copies this key's value from the first configuration into the second (a reload keeps
    /// the running values of the restart keys).
    let copy: @Sendable (DaemonConfig, inout DaemonConfig) -> Void

    /// Where a key's value is kept in the configuration.
    typealias Field<Value> = WritableKeyPath<DaemonConfig, Value> & Sendable

    /// A key stored at `path`: `parse` makes the value from the file's, `render` writes it.
    init<Value>(
        _ name: String, _ path: Field<Value>, _ reload: Reload, _ help: String,
        parse: @escaping @Sendable (ConfigValue) throws -> Value, render: @escaping @Sendable (DaemonConfig) -> String?
    ) {
        self.name = name
        self.reload = reload
        self.help = help
        self.parse = { value, config in config[keyPath: path] = try parse(value) }
        self.render = render
        self.copy = { source, config in config[keyPath: path] = source[keyPath: path] }
    }
}

// The builders of the common types, so that most entries of the table are one line.
extension ConfigKey {
    static func path(_ name: String, _ path: Field<String>, _ reload: Reload, _ help: String) -> Self {
        Self(name, path, reload, help, parse: { try $0.path() }, render: { TOMLText.quote($0[keyPath: path]) })
    }

    /// An integer within `range` (as the error message says it).
    static func int<Integer: FixedWidthInteger & Sendable>(
        _ name: String, _ path: Field<Integer>, _ range: ClosedRange<Int64>, _ reload: Reload, _ help: String
    ) -> Self {
        Self(name, path, reload, help, parse: { Integer(clamping: try $0.int(range)) }, render: { "\($0[keyPath: path])" })
    }

    /// Seconds as a number, at least `minimum` (0 unless said) and at most `maximum` if given.
    static func seconds(
        _ name: String, _ path: Field<Double>, atLeast minimum: Double = 0, atMost maximum: Double? = nil, _ reload: Reload, _ help: String
    ) -> Self {
        Self(
            name, path, reload, help, parse: { try $0.seconds(atLeast: minimum, atMost: maximum) },
            render: { TOMLText.number($0[keyPath: path]) })
    }

    /// Seconds as a number or as text with a unit ("30d"); printed with the unit.
    static func duration(_ name: String, _ path: Field<Double>, _ reload: Reload, _ help: String) -> Self {
        Self(name, path, reload, help, parse: { try $0.duration() }, render: { TOMLText.quote(DurationText.describe($0[keyPath: path])) })
    }

    static func bool(_ name: String, _ path: Field<Bool>, _ reload: Reload, _ help: String) -> Self {
        Self(name, path, reload, help, parse: { try $0.bool() }, render: { "\($0[keyPath: path])" })
    }

    /// An absolute path to a TLS file or folder, checked when read (`problem` says what is
    /// wrong with it); printed when set.
    static func tlsPath(
        _ name: String, _ path: Field<String?>, _ reload: Reload, _ help: String, problem: @escaping @Sendable (String) -> String?
    ) -> Self {
        Self(name, path, reload, help, parse: { try $0.checkedPath(problem) }, render: { $0[keyPath: path].map(TOMLText.quote) })
    }

    /// A command and its arguments (a hook); printed when set.
    static func command(_ name: String, _ path: Field<[String]?>, _ reload: Reload, _ help: String) -> Self {
        Self(name, path, reload, help, parse: { try $0.command() }, render: { $0[keyPath: path].map(TOMLText.array) })
    }
}

/// A value of the config file with its key, read as the type the key wants. A wrong type or
/// an out-of-range value throws a message that names the key and what it must be.
struct ConfigValue {
    let key: String
    let value: TOMLLite.Value

    func string() throws -> String {
        guard case .string(let s) = value else { throw DaemonError("\(key) must be a string") }
        return s
    }

    func path() throws -> String {
        let s = try string()
        guard s.hasPrefix("/") else { throw DaemonError("\(key) must be an absolute path") }
        return s
    }

    func int(_ range: ClosedRange<Int64>) throws -> Int64 {
        guard case .integer(let i) = value, range.contains(i) else {
            throw DaemonError("\(key) must be an integer from \(range.lowerBound) to \(range.upperBound)")
        }
        return i
    }

    func seconds(atLeast minimum: Double, atMost maximum: Double?) throws -> Double {
        let seconds: Double
        switch value {
        case .integer(let i) where i >= 0: seconds = Double(i)
        case .float(let d) where d >= 0: seconds = d
        default: throw DaemonError("\(key) must be a number of seconds ≥ 0")
        }
        if let maximum, !(minimum...maximum).contains(seconds) {
            throw DaemonError("\(key) must be from \(TOMLText.number(minimum)) to \(TOMLText.number(maximum)) seconds")
        }
        guard seconds >= minimum else { throw DaemonError("\(key) must be at least \(TOMLText.number(minimum)) seconds") }
        return seconds
    }

    /// Seconds, as a number or as text with a unit ("30d", "12h").
    func duration() throws -> Double {
        switch value {
        case .integer(let i) where i >= 0: return Double(i)
        case .string(let text):
            if let seconds = DurationText.seconds(text) { return seconds }
        default: break
        }
        throw DaemonError("\(key) must be a duration: seconds, or a number with s, m, h, d or w (\"30d\"); 0 keeps forever")
    }

    func bool() throws -> Bool {
        guard case .bool(let b) = value else { throw DaemonError("\(key) must be true or false") }
        return b
    }

    func checkedPath(_ problem: (String) -> String?) throws -> String {
        let file = try path()
        if let problem = problem(file) { throw DaemonError("\(key): \(problem)") }
        return file
    }

    func command() throws -> [String] {
        guard case .array(let items) = value, !items.isEmpty else {
            throw DaemonError("\(key) must be a non-empty array of strings: the command and its arguments")
        }
        return try items.map {
            guard case .string(let s) = $0 else { throw DaemonError("\(key) must be an array of strings") }
            return s
        }
    }

    func absolutePaths() throws -> [String] {
        guard case .array(let items) = value else { throw DaemonError("\(key) must be an array of absolute paths") }
        return try items.map {
            guard case .string(let s) = $0, s.hasPrefix("/") else { throw DaemonError("\(key) must be an array of absolute paths") }
            return s
        }
    }

    /// Bytes as an integer up to `maximum`, or as a rate's text ("2M"); `expected` ends the
    /// error message.
    func bytes(atMost maximum: Int64, _ expected: String) throws -> Int64 {
        switch value {
        case .integer(let i) where (0...maximum).contains(i): return i
        case .string(let s):
            if let bytes = ByteRate.parse(s) { return bytes }
        default: break
        }
        throw DaemonError("\(key) must be \(expected)")
    }
}

/// Values written as the config file's TOML.
enum TOMLText {
    static func quote(_ s: String) -> String {
        "\"" + s.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "\"", with: "\\\"") + "\""
    }

    static func array(_ items: [String]) -> String { "[\(items.map(quote).joined(separator: ", "))]" }

    /// Whole numbers without a fraction ("2", not "2.0"), as they were most likely written;
    /// one too large for an Int64 as a Double ("1e+19"), which reads back (and does not trap).
    static func number(_ d: Double) -> String { Int64(exactly: d).map(String.init) ?? String(d) }
}
