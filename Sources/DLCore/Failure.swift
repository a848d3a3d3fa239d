import Foundation

/// How a failure is handled.
public enum FailureKind: Sendable, Equatable {
    /// Waiting clears it: retried with backoff, the job shows `waiting(reason)`.
    case transient(WaitReason)
    /// Retrying will not help: the job fails.
    case permanent
}

/// A classified failure of one transfer attempt.
public struct TransferFailure: Error, Sendable, Equatable {
    public var kind: FailureKind
    public var error: JobError
    /// What the server asked for with `Retry-After`, in seconds.
    public var retryAfter: TimeInterval?
    /// An fsync or fdatasync failed: the bytes written since the last one that succeeded may
    /// be gone from the disk even if the next one succeeds (the kernel reports a writeback
    /// error once, and may drop the pages it could not write), so they are never counted.
    public var failedSync = false

    public init(_ kind: FailureKind, _ code: JobErrorCode, _ message: String, retryAfter: TimeInterval? = nil) {
        self.kind = kind
        self.error = JobError(code: code, message: message)
        self.retryAfter = retryAfter
    }
}

/// Which HTTP statuses are worth retrying.
public enum HTTPFailurePolicy {
    /// Request Timeout, Too Many Requests and server errors pass; other client errors do not.
    public static func kind(forStatus status: Int) -> FailureKind {
        switch status {
        case 408, 429, 500...599: return .transient(.retry)
        default: return .permanent
        }
    }

    /// The message of an `http_status` failure: the host, the status, and what it means for
    /// the user.
    public static func message(host: String, status: Int, reason: String) -> String {
        let answered = "\(host) answered \(status)" + (reason.isEmpty ? "" : " \(reason)")
        switch status {
        case 401:
            return answered + ": it wants credentials; give them in the URL (user:password@), in ~/.netrc or as an Authorization header"
        case 403: return answered + ": it refuses access to this file"
        case 404, 410: return answered + ": the file is not there; check the URL"
        case 407: return answered + ": a proxy wants credentials, which dld cannot give"
        case 408, 429, 500...599: return answered + "; dld tries again later"
        default: return answered
        }
    }

    /// `Retry-After` as seconds from `now`: either delta-seconds or an HTTP-date (`HTTPDate`).
    public static func retryAfter(_ value: String?, now: Date) -> TimeInterval? {
        guard let value = value?.trimmingCharacters(in: .whitespaces), !value.isEmpty else { return nil }
        if let seconds = Int(value) { return seconds >= 0 ? TimeInterval(seconds) : nil }
        guard let date = HTTPDate.parse(value) else { return nil }
        return max(0, date.timeIntervalSince(now))
    }
}

/// How the engine answers a failed attempt: wait and retry, or give up. Pure.
public enum RetryDecision: Sendable, Equatable {
    case wait(WaitReason, until: Date)
    case fail(JobError)

    /// - Parameters:
    ///   - attempts: attempts counted so far, this one included (reset to 1 when it made progress).
    ///   - sinceProgress: time since bytes last arrived (or since the job was created).
    ///   - unit: a random draw in [0, 1) for the jitter.
    public static func decide(
        _ failure: TransferFailure, attempts: Int, sinceProgress: TimeInterval = 0, policy: BackoffPolicy,
        now: Date, unit: Double
    ) -> RetryDecision {
        switch failure.kind {
        case .permanent:
            return .fail(failure.error)
        case .transient(.diskSpace):
            // Not the server's fault and not worth giving up on: look again regularly.
            return .wait(.diskSpace, until: now.addingTimeInterval(policy.diskRecheck))
        case .transient(let reason):
            if policy.shouldGiveUp(attempts: attempts) {
                return .fail(
                    JobError(
                        code: .retriesExhausted,
                        message:
                            "gave up after \(attempts) attempts without progress; last error: \(failure.error.message) (\(failure.error.code))"
                    ))
            }
            if sinceProgress >= policy.giveUpAfter {
                return .fail(
                    JobError(
                        code: .retriesExhausted,
                        message:
                            "gave up after \(Int(sinceProgress)) s without progress; last error: \(failure.error.message) (\(failure.error.code))"
                    ))
            }
            let delay = policy.delay(afterAttempt: attempts, retryAfter: failure.retryAfter, unit: unit)
            return .wait(reason, until: now.addingTimeInterval(delay))
        }
    }
}

/// Which redirects dld follows: http(s) only, never from https down to http.
public enum RedirectPolicy {
    public static func target(from current: URL, location: String) -> Result<URL, TransferFailure> {
        guard let next = URL(string: location, relativeTo: current)?.absoluteURL, let scheme = next.scheme?.lowercased(),
            next.host?.isEmpty == false
        else {
            return .failure(
                TransferFailure(.permanent, .redirectRefused, "redirect to an invalid location: \(URLRules.redacted(location).prefix(200))")
            )
        }
        guard scheme == "http" || scheme == "https" else {
            return .failure(TransferFailure(.permanent, .redirectRefused, "redirect to a \(scheme): URL refused"))
        }
        if scheme == "http" && current.scheme?.lowercased() == "https" {
            // The message is shown and logged: a password in the location is not.
            return .failure(
                TransferFailure(
                    .permanent, .redirectRefused,
                    "redirect from https to http refused: \(URLRules.redacted(next.absoluteString).prefix(200))"))
        }
        return .success(next)
    }
}
