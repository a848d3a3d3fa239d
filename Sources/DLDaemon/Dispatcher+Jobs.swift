import DLCore
import DLEngine
import DLJobTable
import DLRPC
import DLTransfer
import Foundation

// MARK: enqueue, remove, status, list

extension Dispatcher {
    func enqueue(_ params: EnqueueParams) async throws(DLError) -> JSONValue {
        switch params {
        case .job(let spec) where spec.isHLS:
            try Self.checkOnDisk(spec.options)
            let (created, jobs) = try await engine.enqueueHLS(spec)
            let summary = GroupSummary.summarize(created, members: jobs, active: false)
            return [
                "group": JobJSON.encodeGroup(created, summary), "count": .int(Int64(jobs.count)),
                "results": .array(jobs.map { ["id": .int($0.id), "created": true, "path": .string($0.path)] }),
            ]
        case .job(let spec):
            try Self.checkOnDisk(spec.options)
            let outcomes = try await engine.enqueue([spec])
            guard let outcome = outcomes.first else { throw DLError(.internalError, "enqueue returned nothing") }
            return ["job": JobJSON.encode(outcome.job), "created": .bool(outcome.created)]
        case .jobs(let specs):
            for (index, spec) in specs.enumerated() where spec.tls != nil || spec.encryptTo != nil {
                do throws(DLError) {
                    try Self.checkOnDisk(spec.options)
                } catch {
                    throw DLError(error.code, "jobs[\(index)]: \(error.message)")
                }
            }
            let outcomes = try await engine.enqueue(specs)
            // One short entry a job, not the whole job: 10 000 of them stay well under the
            // line limit (a client asks `status` for more). Written as text at once: an object
            // a job cost megabytes for a call of thousands (the daemon's budget is 64 MiB).
            var results: [UInt8] = [UInt8(ascii: "[")]
            results.reserveCapacity(outcomes.count * 96)
            for (index, outcome) in outcomes.enumerated() {
                if index > 0 { results.append(UInt8(ascii: ",")) }
                JSONValue.writeObject(
                    [("created", .bool(outcome.created)), ("id", .int(outcome.job.id)), ("path", .string(outcome.job.path))],
                    into: &results)
            }
            results.append(UInt8(ascii: "]"))
            return [
                "count": .int(Int64(outcomes.count)),
                "created": .int(Int64(outcomes.reduce(0) { $1.created ? $0 + 1 : $0 })),
                "results": .raw(RawJSON(results)),
            ]
        case .group(let request):
            try Self.checkOnDisk(request.options)
            var isNew = true
            var made: (JobGroup, [Job])
            if let key = request.key, let existing = try await engine.existingGroup(key: key) {
                made = existing
                isNew = false
            } else {
                made = try await engine.enqueueGroup(
                    name: request.name, dir: request.dir, priority: request.priority, headers: request.headers,
                    overwrite: request.overwrite, paused: request.paused, options: request.options, members: request.members,
                    key: request.key)
            }
            let (created, jobs) = made
            let summary = GroupSummary.summarize(created, members: jobs, active: false)
            return [
                "group": JobJSON.encodeGroup(created, summary), "count": .int(Int64(jobs.count)),
                "results": .array(jobs.map { ["id": .int($0.id), "created": .bool(isNew), "path": .string($0.path)] }),
            ]
        case .metalink(let request):
            return try await enqueueMetalink(request)
        }
    }

    /// What a job's params name on this machine, checked now so that a typo fails the
    /// `enqueue` and not the job hours later: the TLS files (`ca_file`, `ca_dir`, `client_cert`,
    /// `client_key`, absolute paths dld can read that hold what they should; read again when a
    /// transfer starts), and each `encrypt_to` recipient's key.
    static func checkOnDisk(_ options: JobOptions) throws(DLError) {
        if let tls = options.tls {
            let problems = [
                tls.caFile.flatMap { TLSFileCheck.certificates($0, what: "ca_file") },
                tls.caDir.flatMap { TLSFileCheck.folder($0, what: "ca_dir") },
                tls.clientCert.flatMap { TLSFileCheck.certificates($0, what: "client_cert") },
                tls.clientKey.flatMap { TLSFileCheck.privateKey($0, what: "client_key") },
            ]
            if let problem = problems.compactMap({ $0 }).first { throw .invalidParams(problem) }
        }
        for text in options.encryptTo ?? [] {
            guard case .success(let recipient) = AgeRecipient.parse(text) else { continue }
            if let problem = AgeEncryptor.check(recipient) {
                throw .invalidParams("\"encrypt_to\": \(recipient.text) cannot be encrypted to: \(problem.error.message)")
            }
        }
    }

    func remove(_ params: RemoveParams) async throws(DLError) -> JSONValue {
        let outcome: BulkOutcome
        switch params.target {
        case .jobs(let selection, let deleteFile):
            outcome = try await engine.remove(selection, deleteFile: deleteFile)
        case .finished(let states, let olderThan):
            outcome = try await engine.removeFinished(states, olderThan: olderThan.map(TimeInterval.init))
        }
        // `removed`, the list protocol 1 answered with, stays: the same ids.
        return Self.bulkReply(outcome, alsoAs: "removed")
    }

    func status(_ params: StatusParams) async throws(DLError) -> JSONValue {
        switch params.target {
        case .job(let id):
            guard let view = try await engine.status([id]).first else { throw DLError(.jobNotFound, "no job with id \(id)") }
            return JobJSON.encode(view)
        case .jobs(let ids):
            return ["jobs": .array(try await engine.status(ids).map(JobJSON.encode))]
        case .group(let reference):
            let (group, summary, jobs) = try await engine.groupStatus(reference)
            // Members as JSON text, not objects: a group of 2000 small files took megabytes of
            // dictionaries for one `status`, the daemon's peak.
            return ["group": JobJSON.encodeGroup(group, summary), "jobs": .array(JobJSON.raw(jobs))]
        }
    }

    func list(_ params: ListParams) async throws(DLError) -> JSONValue {
        if let reference = params.group {
            let (_, _, jobs) = try await engine.groupStatus(reference, states: params.states)
            return ["jobs": .array(JobJSON.raw(jobs)), "next_after_id": .null]
        }
        // A page holds at most `maxPage` jobs whatever the limit: a page of 10 000 whole jobs
        // cost more than the daemon's memory budget to build; `next_after_id` continues where it
        // stopped.
        let limit = min(limits.maxPage, params.limit ?? 1000)
        var page = try await engine.list(states: params.states, afterID: params.afterID, limit: limit + 1)
        let more = page.jobs.count > limit
        if more { page.jobs.removeLast(page.jobs.count - limit) }
        let next: JSONValue = more ? (page.jobs.last.map { .int($0.id) } ?? .null) : .null
        // Each job as JSON text: building and sorting each job's object took most of a page's time.
        return ["jobs": .array(JobJSON.raw(page)), "next_after_id": next]
    }
}

extension EnqueueSpec {
    /// The options `checkOnDisk` looks at.
    var options: JobOptions { JobOptions(tls: tls, encryptTo: encryptTo) }
}
