// Linux calls that Swift's Glibc module does not export (they need _GNU_SOURCE).
#pragma once
#include <sys/types.h>

/// fallocate(fd, FALLOC_FL_KEEP_SIZE, offset, length): reserve blocks, keep the file size.
/// Returns 0, or -1 with errno set.
int dld_reserve_keep_size(int fd, off_t offset, off_t length);

/// mallopt(M_ARENA_MAX, arenas): at most this many glibc malloc arenas. Returns 1 on success.
int dld_limit_malloc_arenas(int arenas);

/// mallopt(M_MMAP_THRESHOLD, mmap) and mallopt(M_TRIM_THRESHOLD, trim): blocks of `mmap` bytes
/// and more are mapped on their own, and the heap's top is returned past `trim` bytes free.
/// Either setting also stops glibc from moving both thresholds by itself. Returns 1 on success.
int dld_malloc_thresholds(int mmap, int trim);

/// malloc_trim(0): gives the free memory at the top of glibc's heaps and whole free pages
/// inside them back to the system. Returns 1 when memory was released.
int dld_trim_malloc(void);

/// renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE): rename that fails with EEXIST
/// instead of replacing. Returns 0, or -1 with errno set (EINVAL or ENOSYS where the
/// filesystem or kernel cannot do it).
int dld_rename_noreplace(const char *from, const char *to);

/// syncfs(fd): writes back and flushes everything of the filesystem that holds `fd`, and
/// returns a writeback error of that filesystem since `fd` was opened (Linux 5.8 and later).
/// Returns 0, or -1 with errno set.
int dld_syncfs(int fd);

/// Opens `path` (not following a symbolic link), waits for its data to be written back
/// (sync_file_range, without a journal commit or a cache flush), and returns 0, or the errno
/// of opening it or of a writeback error of the file that this call is the first to see.
int dld_written_back(const char *path);

/// The filesystem type (statfs f_type) of the one that holds `fd`, or 0 when unknown.
long dld_filesystem_type(int fd);

/// A netlink socket (NETLINK_ROUTE, non-blocking, close-on-exec) that receives the kernel's
/// notifications of links, addresses and routes (IPv4 and IPv6) coming and going. Returns the
/// descriptor, or -1 with errno set.
int dld_route_monitor_open(void);

/// A watch on NetworkManager's `Metered` property over the system D-Bus, through sd-bus from
/// libsystemd.so.0, loaded at run time (dlopen): building dld needs no libsystemd-dev, and a
/// machine without libsystemd, without a system bus or without NetworkManager runs dld the
/// same, as if never metered. `DBUS_SYSTEM_BUS_ADDRESS` names another bus (tests use a
/// private one). Not thread-safe: one thread (or serial queue) uses a watch at a time.
typedef struct dld_nm_watch dld_nm_watch;

/// Loads libsystemd, connects to the system bus, subscribes to NetworkManager's property
/// changes and to its name coming and going, and reads `Metered` once. Returns NULL, with the
/// reason in `why` (NUL-terminated, cut to `why_size`), when libsystemd or the bus is missing.
dld_nm_watch *dld_nm_open(char *why, unsigned long why_size);

/// NetworkManager's `Metered` value as last read (NMMetered: 0 unknown, 1 yes, 2 no,
/// 3 guess-yes, 4 guess-no), or -1 while NetworkManager is not on the bus.
int dld_nm_metered(const dld_nm_watch *watch);

/// The bus connection's descriptor: when it is readable, call `dld_nm_process`.
int dld_nm_fd(const dld_nm_watch *watch);

/// Handles everything the bus sent; when a signal said NetworkManager's properties or its
/// owner changed, reads `Metered` again. Returns 0, or a negative errno when the connection
/// to the bus is lost (the watch is then of no further use; close it).
int dld_nm_process(dld_nm_watch *watch);

/// Closes the connection and frees the watch. NULL is allowed.
void dld_nm_close(dld_nm_watch *watch);

/// The inotify events of the drop folder (values of <sys/inotify.h>).
#define DLD_IN_CLOSE_WRITE 0x00000008u
#define DLD_IN_MOVED_TO 0x00000080u
#define DLD_IN_Q_OVERFLOW 0x00004000u
#define DLD_IN_IGNORED 0x00008000u
#define DLD_IN_ISDIR 0x40000000u

/// An inotify descriptor (non-blocking, close-on-exec) watching `folder` (not followed if a
/// symbolic link) for files closed after writing and files renamed into it. Also ignores
/// SIGIO for the process (see `dld_open_for_writing_elsewhere`). Returns the descriptor, or
/// -1 with errno set.
int dld_drop_watch_open(const char *folder);

/// Whether a process has the file of `fd` (opened read-only, by its owner) open for writing:
/// 1 yes, 0 no, -1 unknown (not the owner, or a filesystem without leases).
int dld_open_for_writing_elsewhere(int fd);

/// Copies the data extents of `in` into `out` at the same offsets (copy_file_range, or pread
/// and pwrite where it cannot), holes left as holes, and gives `out` the size of `in`. Returns
/// 0, or -1 with errno set.
int dld_copy_data(int in, int out);

/// Sets the extended attribute `user.dld.attempt` of the file to `tag`. Returns 0, or -1 with
/// errno set (ENOTSUP where the filesystem has no user attributes).
int dld_set_attempt(int fd, const char *tag);

/// Reads `user.dld.attempt` into `buffer`: its length, or -1 with errno set (ENODATA when the
/// file has none, ENOTSUP where the filesystem has no user attributes).
long dld_get_attempt(int fd, char *buffer, size_t size);
