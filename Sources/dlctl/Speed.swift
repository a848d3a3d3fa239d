import ArgumentParser
import DLCore
import DLRPC
import Foundation

/// `dlctl speed`: shows the global limit; `dlctl speed RATE` sets it; `dlctl speed ID RATE`
/// sets one job's.
struct Speed: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Show or set speed limits: the global one, or a job's.",
        discussion: """
            RATE is bytes per second: 2M, 512K, 100000 (K, M, G are powers of 1024); 0 for no limit. \
            `dlctl speed` shows the global limit in force; `dlctl speed RATE` sets it until dld stops \
            (over max_speed and speed_schedule of the config file); `dlctl speed config` goes back to them; \
            `dlctl speed ID RATE` sets job ID's own limit, kept with the job.
            """)

    @Argument(help: "[ID] RATE, or `config`.") var words: [String] = []
    @OptionGroup var common: Common

    func validate() throws {
        guard words.count <= 2 else { throw ValidationError("give at most a job id and a rate") }
        if words.count == 2 {
            guard let id = Int64(words[0]), id >= 1 else { throw ValidationError("\(words[0]) is not a job id") }
            _ = id
        }
        if let rate = words.last, !(words.count == 1 && rate == "config"), ByteRate.parse(rate) == nil {
            throw ValidationError("\(rate) is not a rate: write bytes per second such as 2M, 512K or 100000, or 0 for no limit")
        }
    }

    func run() throws {
        switch words.count {
        case 0:
            let result = try common.call(.stats)["max_speed"] ?? .null
            common.emit(result) { Self.describe(result) }
        case 1:
            let rate = words[0] == "config" ? nil : ByteRate.parse(words[0]) ?? 0
            let result = try common.call(.setSpeed, SetSpeedParams(.global, maxSpeed: rate))
            common.emit(result) { Self.describe(result) }
        default:
            let id = Int64(words[0]) ?? 0
            let job = try common.call(.setSpeed, SetSpeedParams(.job(id), maxSpeed: ByteRate.parse(words[1]) ?? 0))
            common.emit(job) {
                "job \(id): " + (job["max_speed"]?.int64Value.map { "at most \(ByteRate.format($0))/s" } ?? "no limit of its own")
            }
        }
    }

    /// `2M/s (schedule; max_speed 0, schedule 08:00-18:00 2M, 18:00-08:00 0, changes at …)`.
    static func describe(_ speed: JSONValue) -> String {
        guard let limit = speed["limit"]?.int64Value else { return "-" }
        var text = limit == 0 ? "none" : "\(ByteRate.format(limit))/s"
        var parts = ["from \(speed["source"]?.stringValue ?? "?")"]
        if let config = speed["config"]?.int64Value, config > 0 { parts.append("max_speed \(ByteRate.format(config))") }
        if let schedule = speed["schedule"]?.stringValue { parts.append("schedule \(schedule)") }
        if let next = speed["next_change_at"]?.stringValue { parts.append("changes at \(next)") }
        text += " (" + parts.joined(separator: "; ") + ")"
        return text
    }
}

/// `dlctl set-url ID [URL] [-H "Name: value"]…`: a new URL and/or headers for an unfinished job.
struct SetURL: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "set-url",
        abstract: "Give an unfinished job a new URL and/or headers (an expired signed URL, a new token).",
        discussion:
            "The bytes already downloaded are kept when the server shows the same file (strong ETag, or Last-Modified and size); otherwise the download starts over and `dlctl status ID` says why. -H replaces all the job's headers; --clear-headers removes them."
    )

    @Argument(help: "The job.") var id: Int64
    @Argument(help: "The new http(s) URL.") var url: String?
    @Option(
        name: [.customShort("H"), .customLong("header")],
        help: "A request header, \"Name: value\" (repeatable); replaces the job's headers.") var headers: [String] = []
    @Flag(name: .customLong("clear-headers"), help: "Remove the job's headers.") var clearHeaders = false
    @OptionGroup var common: Common

    func validate() throws {
        if id < 1 { throw ValidationError("job ids are positive integers, got \(id)") }
        if url == nil && headers.isEmpty && !clearHeaders { throw ValidationError("give a URL, -H headers or --clear-headers") }
        if clearHeaders && !headers.isEmpty { throw ValidationError("give -H or --clear-headers, not both") }
    }

    func run() throws {
        let fields = clearHeaders ? [] : try headerFields(headers)
        let job = try common.call(.change, ChangeParams(id: id, url: url, headers: clearHeaders || !headers.isEmpty ? fields : nil))
        common.emit(job) { Format.details(job) }
    }
}
