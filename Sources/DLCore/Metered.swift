/// Downloads on a metered connection (a phone's hotspot, a capped plan): a job or group
/// enqueued with `metered: false` does not transfer while NetworkManager says the connection
/// is metered. Pure, so that it is tested without a bus.
public enum MeteredPolicy {
    /// Whether NetworkManager's `Metered` value counts as metered. NMMetered: 0 unknown,
    /// 1 yes, 2 no, 3 guess-yes, 4 guess-no; nil when NetworkManager is not there (or the bus,
    /// or libsystemd): then nothing is metered, as on a machine without NetworkManager.
    /// Guesses count as NetworkManager meant them (guess-yes is a phone's hotspot it
    /// recognised); unknown and values of a newer NetworkManager do not.
    public static func isMetered(_ networkManagerValue: Int?) -> Bool {
        networkManagerValue == 1 || networkManagerValue == 3
    }

    /// Whether a job may start, or a running one go on. `job` is the job's own `metered`
    /// setting (nil when it did not say); `allowedByDefault` is the config's `metered`, for
    /// jobs that did not say. On a connection that is not metered every job may transfer.
    public static func mayTransfer(connectionMetered: Bool, job: Bool?, allowedByDefault: Bool) -> Bool {
        !connectionMetered || (job ?? allowedByDefault)
    }
}
