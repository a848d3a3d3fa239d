import NIOPosix

/// Threads for the calls that wait for the disk (`fdatasync`, `fsync`, links and folder syncs).
///
/// NIO's shared blocking pool has one thread per core, two on a small machine, so at most two
/// files were synced at once, and many small files took several times as long to `fdatasync`
/// on two threads as on eight (docs/benchmarks.md, "What was tried": a disk pool of 8
/// threads). A thread that waits for the disk costs no CPU, so this pool has more threads than
/// cores, and the CPU-bound work on NIO's pool does not queue behind a slow flush.
public enum DiskPool {
    /// Threads of the pool, and so the most flushes in flight at once.
    public static let threads = 8

    /// Started once, on first use; it lives as long as the process.
    public static let shared: NIOThreadPool = {
        let pool = NIOThreadPool(numberOfThreads: threads)
        pool.start()
        return pool
    }()
}
