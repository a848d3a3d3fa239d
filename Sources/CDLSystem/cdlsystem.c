#define _GNU_SOURCE
#include <fcntl.h>
#include "cdlsystem.h"

int dld_reserve_keep_size(int fd, off_t offset, off_t length) {
    return fallocate(fd, FALLOC_FL_KEEP_SIZE, offset, length);
}
