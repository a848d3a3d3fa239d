import DLCore

extension Engine {
    /// Settings of a reloaded config file, applied in a turn of the serial queue: transfers
    /// that run go on; a larger `max_active` starts queued jobs at once, a smaller one lets
    /// the running finish and starts fewer after them.
    public func reconfigure(_ update: @escaping @Sendable (inout EngineConfiguration) -> Void) async throws(DLError) {
        try await serial { () async throws(DLError) in
            let meteredByDefault = configuration.meteredByDefault
            update(&configuration)
            downloader.setConnectionsPerHost(configuration.maxPerHost)
            applySpeedLimits()
            if configuration.meteredByDefault != meteredByDefault, connectionMetered {
                // The jobs that do not say follow the new default at once.
                if configuration.meteredByDefault {
                    try await requeueHeldForMetered()
                } else {
                    await holdRunningForMetered()
                    try await flush()
                }
            }
            try await schedule()
            try await flush()
        }
    }

    /// The live settings now, for a reload's log and tests.
    public var liveConfiguration: EngineConfiguration { configuration }
}
