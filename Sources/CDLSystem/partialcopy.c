// A partial file's own inode for each attempt of a job on a shared table
// (PartialFile.isolate): its data extents copied into a new file (copy_file_range shares or
// copies them in the kernel; btrfs, XFS and NFS 4.2 share blocks), and the attempt's tag in an
// extended attribute. copy_file_range and SEEK_DATA need _GNU_SOURCE.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>
#include "cdlsystem.h"

static const char *attempt_attribute = "user.dld.attempt";

/// Copies `length` bytes at `offset` with pread and pwrite, where copy_file_range cannot.
static int copy_plainly(int in, int out, off_t offset, off_t length) {
    enum { chunk = 1 << 20 };
    char *buffer = malloc(chunk);
    if (!buffer) return -1;
    while (length > 0) {
        ssize_t got = pread(in, buffer, length < chunk ? (size_t)length : chunk, offset);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) { free(buffer); return got == 0 ? 0 : -1; }
        ssize_t done = 0;
        while (done < got) {
            ssize_t put = pwrite(out, buffer + done, (size_t)(got - done), offset + done);
            if (put < 0 && errno == EINTR) continue;
            if (put <= 0) { free(buffer); return -1; }
            done += put;
        }
        offset += got;
        length -= got;
    }
    free(buffer);
    return 0;
}

int dld_copy_data(int in, int out) {
    struct stat info;
    if (fstat(in, &info) != 0) return -1;
    off_t size = info.st_size, position = 0;
    while (position < size) {
        off_t data = lseek(in, position, SEEK_DATA);
        if (data < 0 && errno == ENXIO) break;  // only a hole is left
        if (data < 0) data = position;          // no SEEK_DATA here: everything is data
        off_t hole = lseek(in, data, SEEK_HOLE);
        if (hole < 0 || hole > size) hole = size;
        off_t from = data, to = data;
        while (from < hole) {
            ssize_t copied = copy_file_range(in, &from, out, &to, (size_t)(hole - from), 0);
            if (copied < 0 && errno == EINTR) continue;
            if (copied < 0 && (errno == EXDEV || errno == ENOSYS || errno == EINVAL || errno == EOPNOTSUPP)) {
                if (copy_plainly(in, out, from, hole - from) != 0) return -1;
                break;
            }
            if (copied < 0) return -1;
            if (copied == 0) break;  // the file got shorter meanwhile
        }
        position = hole;
    }
    return ftruncate(out, size);
}

int dld_set_attempt(int fd, const char *tag) {
    return fsetxattr(fd, attempt_attribute, tag, strlen(tag), 0);
}

long dld_get_attempt(int fd, char *buffer, size_t size) {
    return (long)fgetxattr(fd, attempt_attribute, buffer, size);
}
