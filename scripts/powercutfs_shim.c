// The power-cut tests' shim, LD_PRELOADed into dld (docs/architecture.md, "Proven under power
// loss"): it makes powercutfs a filesystem whose syncfs(2) dld trusts and whose syncfs makes
// things durable, so that dld's batch publish with one syncfs (`Publisher.syncFilesystems`)
// is cut like its other paths. Without it that path is never taken on a FUSE mount: the
// kernel answers syncfs for FUSE without asking the server, and dld syncs each file there.
//
// For a descriptor on the mount named by POWERCUTFS_SHIM_ROOT (compared by device):
//  - fstatfs answers the type of ext4, where dld uses syncfs for a batch;
//  - syncfs is an fsync of the mount's `.powercutfs-syncfs`, which powercutfs takes as a
//    syncfs of the whole filesystem (its operation kind `syncfs`).
// Any other descriptor, or without POWERCUTFS_SHIM_ROOT, gets the real calls.
//
// Built by the test support with `cc -shared -fPIC` (DLTestSupport/PowerCutFS.swift).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#define EXT4_SUPER_MAGIC 0xEF53

// Whether `fd` is on the mount (a new stat of the mount each time: the daemon is started
// against one mount, and a stat is cheap next to what a sync costs).
static int on_mount(int fd, const char **root) {
    *root = getenv("POWERCUTFS_SHIM_ROOT");
    if (!*root || !**root) return 0;
    struct stat mount, file;
    int saved = errno;
    int same = stat(*root, &mount) == 0 && fstat(fd, &file) == 0 && mount.st_dev == file.st_dev;
    errno = saved;
    return same;
}

int syncfs(int fd) {
    const char *root;
    if (on_mount(fd, &root)) {
        char path[PATH_MAX];
        if (snprintf(path, sizeof path, "%s/.powercutfs-syncfs", root) >= (int)sizeof path) {
            errno = ENAMETOOLONG;
            return -1;
        }
        int file = open(path, O_RDONLY | O_CLOEXEC);
        if (file < 0) return -1;
        int rc = fsync(file);
        int saved = errno;
        close(file);
        errno = saved;
        return rc;
    }
    int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, "syncfs");
    if (!real) {
        errno = ENOSYS;
        return -1;
    }
    return real(fd);
}

// The real call's answer, with ext4's type for a descriptor on the mount.
#define AS_EXT4(name, type)                                                          \
    int name(int fd, type *info) {                                                   \
        int (*real)(int, type *) = (int (*)(int, type *))dlsym(RTLD_NEXT, #name);    \
        if (!real) {                                                                 \
            errno = ENOSYS;                                                          \
            return -1;                                                               \
        }                                                                            \
        int rc = real(fd, info);                                                     \
        const char *root;                                                            \
        if (rc == 0 && on_mount(fd, &root)) info->f_type = EXT4_SUPER_MAGIC;          \
        return rc;                                                                   \
    }

AS_EXT4(fstatfs, struct statfs)
AS_EXT4(fstatfs64, struct statfs64)
