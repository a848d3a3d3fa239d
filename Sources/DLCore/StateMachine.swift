import Foundation

/// Something that happens to a job: a user command or an outcome of its transfer.
public enum JobEvent: Sendable, Equatable {
    /// The scheduler gave the job a slot.
    case start
    /// The transfer finished and the file is published under its final name.
    case complete
    /// The transfer hit a problem that waiting will clear.
    case wait(WaitReason, JobError, until: Date)
    /// A waiting job's time has come.
    case due
    /// The transfer hit a problem that retrying will not fix.
    case fail(JobError)
    /// User commands.
    case pause
    case resume
    case cancel
}

/// Why an event cannot be applied.
public struct TransitionError: Error, Sendable, Equatable, CustomStringConvertible {
    public let from: JobState
    public let event: String

    public init(from: JobState, event: String) {
        self.from = from
        self.event = event
    }

    public var description: String { "cannot \(event) a job that is \(from)" }
}

/// The job state machine as a pure function: no clock, no I/O. Callers pass `now`.
///
/// ```
/// queued → running → completed
/// running → waiting(reason) → queued
/// queued|running|waiting → paused → queued   (user)
/// running|waiting → failed(code); failed → queued (resume)
/// any but completed/canceled → canceled        (user)
/// ```
public enum StateMachine {
    public static func apply(_ event: JobEvent, to job: Job, now: Date) throws(TransitionError) -> Job {
        var next = job
        next.updatedAt = now
        switch (job.state, event) {
        case (.queued, .start):
            next.state = .running
            next.attempts = job.attempts + 1
        case (.running, .complete):
            next.state = .completed
            next.error = nil
            next.finishedAt = now
            next.waitReason = nil
            next.nextAttemptAt = nil
        case (.running, .wait(let reason, let error, let until)):
            next.state = .waiting
            next.waitReason = reason
            next.error = error
            next.nextAttemptAt = until
        case (.waiting, .due):
            next.state = .queued
            next.waitReason = nil
            next.nextAttemptAt = nil
        case (.running, .fail(let error)), (.waiting, .fail(let error)), (.queued, .fail(let error)):
            next.state = .failed
            next.error = error
            next.finishedAt = now
            next.waitReason = nil
            next.nextAttemptAt = nil
        case (.queued, .pause), (.running, .pause), (.waiting, .pause):
            next.state = .paused
            next.waitReason = nil
            next.nextAttemptAt = nil
        case (.paused, .resume), (.waiting, .resume), (.failed, .resume):
            // A user's resume is a fresh start: the retry budget and the old reason go.
            next.state = .queued
            next.waitReason = nil
            next.nextAttemptAt = nil
            next.finishedAt = nil
            next.attempts = 0
            if job.state == .failed { next.error = nil }
            // After a failure that makes the partial file untrustworthy, the bytes go: the
            // download starts over from zero (the bulk statements write the same).
            if let code = job.error?.code, JobErrorCode.startOver.contains(JobErrorCode(rawValue: code)) {
                next.received = 0
                next.segments = nil
                next.unsynced = nil
                next.validators = Validators()
                next.sha256 = nil
                next.digest = nil
            }
        case (.queued, .cancel), (.running, .cancel), (.waiting, .cancel), (.paused, .cancel),
            (.failed, .cancel):
            next.state = .canceled
            next.finishedAt = now
            next.waitReason = nil
            next.nextAttemptAt = nil
        default:
            throw TransitionError(from: job.state, event: event.verb)
        }
        // A worker holds a job only while it runs it.
        if next.state != .running {
            next.worker = nil
            next.leaseUntil = nil
            next.stopRequest = nil
        }
        return next
    }

    /// Whether `event` may be applied to a job in `state`, without building the result.
    public static func allows(_ event: JobEvent, from state: JobState) -> Bool {
        let probe = Job(url: "", path: "", state: state, createdAt: .distantPast, updatedAt: .distantPast)
        do {
            _ = try apply(event, to: probe, now: .distantPast)
            return true
        } catch {
            return false
        }
    }
}

extension JobEvent {
    /// The word used in error messages ("cannot pause a job that is completed").
    public var verb: String {
        switch self {
        case .start: return "start"
        case .complete: return "complete"
        case .wait: return "wait"
        case .due: return "requeue"
        case .fail: return "fail"
        case .pause: return "pause"
        case .resume: return "resume"
        case .cancel: return "cancel"
        }
    }
}
