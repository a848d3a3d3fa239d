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

    static func progress(_ job: JSONValue) -> String {
        guard let fraction = job["progress"]?.doubleValue else { return "-" }
        return String(format: "%.1f%%", fraction * 100)
    }

    static func size(_ job: JSONValue) -> String {
        if let size = job["size"]?.doubleValue { return bytes(size) }
        if let received = job["received"]?.doubleValue, received > 0 { return bytes(received) + "+" }
        return "?"
    }

    static func table(_ jobs: [JSONValue]) -> String {
        guard !jobs.isEmpty else { return "no jobs" }
        var rows = [["ID", "STATE", "PROGRESS", "SIZE", "SPEED", "NAME"]]
        for job in jobs {
            rows.append([
                job["id"]?.int64Value.map(String.init) ?? "?", state(job), progress(job), size(job),
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
            ("speed", speed(job["speed"]?.doubleValue ?? 0)),
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
        if let key = job["key"]?.stringValue { lines.append(("key", key)) }
        if let meta = job["meta"], !meta.isNull { lines.append(("meta", meta.serializedString())) }
        return lines.map { "\($0.0.padding(toLength: 10, withPad: " ", startingAt: 0)) \($0.1)" }.joined(separator: "\n")
    }
}
