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


/// A netlink socket (NETLINK_ROUTE, non-blocking, close-on-exec) that receives the kernel's
/// notifications of links, addresses and routes (IPv4 and IPv6) coming and going. Returns the
/// descriptor, or -1 with errno set.
int dld_route_monitor_open(void);
