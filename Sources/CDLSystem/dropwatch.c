// The drop folder (`watch_dir`): inotify on one folder, and whether a file is still open for
// writing. sys/inotify.h and F_SETLEASE need _GNU_SOURCE, which Swift's Glibc does not set.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/inotify.h>
#include <unistd.h>
#include "cdlsystem.h"

int dld_drop_watch_open(const char *folder) {
    // A probe below takes a read lease for an instant; a writer that opens the file in that
    // instant breaks it, and the kernel then sends SIGIO, whose default action ends the
    // process. dld uses SIGIO for nothing else.
    signal(SIGIO, SIG_IGN);
    int fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (fd < 0) return -1;
    // Only complete files: closed after writing, or renamed into the folder. IN_DONT_FOLLOW
    // and IN_ONLYDIR: the folder itself must be a folder, not a link to one.
    uint32_t mask = IN_CLOSE_WRITE | IN_MOVED_TO | IN_ONLYDIR | IN_DONT_FOLLOW | IN_EXCL_UNLINK;
    if (inotify_add_watch(fd, folder, mask) < 0) {
        int saved = errno;
        close(fd);
        errno = saved;
        return -1;
    }
    return fd;
}

int dld_open_for_writing_elsewhere(int fd) {
    // A read lease is refused (EAGAIN) while any process has the file open for writing; it is
    // given back at once. EACCES (a file of another user) or EINVAL (a filesystem without
    // leases): unknown.
    if (fcntl(fd, F_SETLEASE, F_RDLCK) != 0) return errno == EAGAIN ? 1 : -1;
    fcntl(fd, F_SETLEASE, F_UNLCK);
    return 0;
}
