import DLRPC
import Foundation

/// Text for people: sizes in binary units, a table, a detail view.
enum Format {
    static func bytes(_ value: Double) -> String {
        let units = ["B", "KiB", "MiB", "GiB", "TiB"]
        var v = value
        var unit = 0
        while v >= 1024 && unit < units.count - 1 {
            v /= 1024
            unit += 1
        }
        return unit == 0 ? "\(Int(v)) B" : String(format: "%.1f %@", v, units[unit])
    }

    static func speed(_ value: Double) -> String { value > 0 ? bytes(value) + "/s" : "-" }

    static func state(_ job: JSONValue) -> String {
        let state = job["state"]?.stringValue ?? "?"
        if let reason = job["wait_reason"]?.stringValue { return "\(state)(\(reason))" }
        return state
    }

    /// The state with the reason a person needs: the error code of a failed or waiting job
    /// (`failed(tls_untrusted)`, `waiting(dns_error)`), else the wait reason.
    static func stateWithCode(_ job: JSONValue) -> String {
        let state = job["state"]?.stringValue ?? "?"
        if state == "failed" || state == "waiting", let code = job["error"]?["code"]?.stringValue {
            return "\(state)(\(code))"
        }
        return self.state(job)
    }

    static func progress(_ job: JSONValue) -> String {
        guard let fraction = job["progress"]?.doubleValue else { return "-" }
        return String(format: "%.1f%%", fraction * 100)
    }

    static func size(_ job: JSONValue) -> String {
        if let size = job["size"]?.doubleValue { return bytes(size) }
        if let received = job["received"]?.doubleValue, received > 0 { return bytes(received) + "+" }
        return "?"
    }

    /// `7  page-001.jpg  [#########-----------]  45.2%  12.3 MiB/s  ETA 0:32  running`
    static func progressLine(_ job: JSONValue, color: Bool) -> String {
        let width = 24
        let fraction = min(1, max(0, job["progress"]?.doubleValue ?? 0))
        let filled = Int(fraction * Double(width))
        let bar = "[" + String(repeating: "#", count: filled) + String(repeating: "-", count: width - filled) + "]"
        let speed = job["speed"]?.doubleValue ?? 0
        var eta = ""
        if speed > 0, let size = job["size"]?.doubleValue, let received = job["received"]?.doubleValue, size > received {
            let seconds = Int((size - received) / speed)
            eta =
                "ETA "
                + (seconds >= 3600
                    ? String(format: "%d:%02d:%02d", seconds / 3600, seconds / 60 % 60, seconds % 60)
                    : String(format: "%d:%02d", seconds / 60, seconds % 60))
        }
        var stateText = state(job)
        if color {
            let code: String
            switch job["state"]?.stringValue {
            case "completed": code = "32"
            case "failed", "canceled": code = "31"
            case "waiting", "paused": code = "33"
            default: code = "36"
            }
            stateText = "\u{1B}[\(code)m\(stateText)\u{1B}[0m"
        }
        let id = job["id"]?.int64Value.map(String.init) ?? "?"
        let name = String((job["name"]?.stringValue ?? "").prefix(30))
        return
            "\(id.padding(toLength: 5, withPad: " ", startingAt: 0)) \(name.padding(toLength: 30, withPad: " ", startingAt: 0)) \(bar) \(progress(job).padding(toLength: 6, withPad: " ", startingAt: 0)) \(self.speed(speed).padding(toLength: 12, withPad: " ", startingAt: 0)) \(eta.padding(toLength: 11, withPad: " ", startingAt: 0)) \(stateText)"
    }

    /// One plain line per event, for logs and pipes.
    static func eventLine(_ method: String, _ params: JSONValue) -> String {
        let id = params["id"]?.int64Value.map { "job \($0)" } ?? params["group"]?.int64Value.map { "group \($0)" } ?? "-"
        switch method {
        case "job.progress":
            let received = params["received"]?.doubleValue ?? 0
            let size = params["size"]?.doubleValue
            let percent = size.map { $0 > 0 ? String(format: " %.1f%%", received / $0 * 100) : "" } ?? ""
            return "\(id) progress \(bytes(received))\(percent) \(speed(params["speed"]?.doubleValue ?? 0))"
        default:
            var line = "\(id) \(params["state"]?.stringValue ?? method)"
            if let reason = params["wait_reason"]?.stringValue { line += "(\(reason))" }
            if let error = params["error"], !error.isNull {
                line += ": \(error["message"]?.stringValue ?? "") [\(error["code"]?.stringValue ?? "")]"
            }
            return line
        }
    }

    static func table(_ jobs: [JSONValue]) -> String {
        guard !jobs.isEmpty else { return "no jobs" }
        var rows = [["ID", "STATE", "PROGRESS", "SIZE", "SPEED", "NAME"]]
        for job in jobs {
            rows.append([
                job["id"]?.int64Value.map(String.init) ?? "?", stateWithCode(job), progress(job), size(job),
                speed(job["speed"]?.doubleValue ?? 0), job["name"]?.stringValue ?? "",
            ])
        }
        let widths = (0..<5).map { column in rows.map { $0[column].count }.max() ?? 0 }
        return rows.map { row in
            (0..<5).map { row[$0].padding(toLength: widths[$0], withPad: " ", startingAt: 0) }.joined(separator: "  ")
                + "  " + row[5]
        }.joined(separator: "\n")
    }

    static func details(_ job: JSONValue) -> String {
        var lines: [(String, String)] = [
            ("id", job["id"]?.serializedString() ?? "?"),
            ("state", state(job)),
            ("url", job["url"]?.stringValue ?? ""),
            ("path", job["path"]?.stringValue ?? ""),
            ("progress", "\(progress(job)) (\(bytes(job["received"]?.doubleValue ?? 0)) of \(size(job)))"),
            ("speed", speed(job["speed"]?.doubleValue ?? 0) + (job["max_speed"]?.doubleValue.map { " (limit \(bytes($0))/s)" } ?? "")),
            ("priority", job["priority"]?.serializedString() ?? "0"),
            ("attempts", job["attempts"]?.serializedString() ?? "0"),
            ("created", job["created_at"]?.stringValue ?? ""),
        ]
        if let error = job["error"], !error.isNull {
            lines.append(("error", "\(error["message"]?.stringValue ?? "") [\(error["code"]?.stringValue ?? "")]"))
        }
        if let next = job["next_attempt_at"]?.stringValue { lines.append(("next try", next)) }
        if let finished = job["finished_at"]?.stringValue { lines.append(("finished", finished)) }
        if let finalURL = job["final_url"]?.stringValue, finalURL != job["url"]?.stringValue { lines.append(("final url", finalURL)) }
        if let sha256 = job["sha256"]?.stringValue { lines.append(("sha256", sha256)) }
        if let checksum = job["checksum"]?.stringValue {
            lines.append(
                (
                    "checksum",
                    checksum + (job["digest"]?.stringValue == checksum.split(separator: ":").last.map(String.init) ? " (verified)" : "")
                ))
        }
        if let group = job["group"]?.int64Value { lines.append(("group", String(group))) }
        if let worker = job["worker"]?.stringValue { lines.append(("worker", worker)) }
        if job["insecure"] == true { lines.append(("tls", "NOT verified (insecure)")) }
        if let metered = job["metered"]?.boolValue {
            lines.append(("metered", metered ? "may download on a metered connection" : "not on a metered connection"))
        }
        if let tls = job["tls"], !tls.isNull {
            for (key, label) in [("ca_file", "tls ca"), ("ca_dir", "tls ca dir"), ("client_cert", "tls cert"), ("client_key", "tls key")] {
                if let path = tls[key]?.stringValue { lines.append((label, path)) }
            }
        }
        if let key = job["key"]?.stringValue { lines.append(("key", key)) }
        if let meta = job["meta"], !meta.isNull { lines.append(("meta", meta.serializedString())) }
        return lines.map { "\($0.0.padding(toLength: 10, withPad: " ", startingAt: 0)) \($0.1)" }.joined(separator: "\n")
    }

    /// The text of a bulk command's reply: how many jobs changed, and their ids when few.
    static func bulk(_ result: JSONValue, verb: String) -> String {
        let count = result["count"]?.int64Value ?? 0
        guard count > 0 else { return "no job \(verb == "removed" ? "removed" : "changed")" }
        let ids = (result["ids"]?.arrayValue ?? []).compactMap(\.int64Value)
        let shown = ids.prefix(20).map(String.init).joined(separator: " ")
        let jobs = count == 1 ? "1 job" : "\(count) jobs"
        return "\(verb) \(jobs): \(shown)\(count > 20 ? " …" : "")"
    }
}
