#define _GNU_SOURCE
#include <fcntl.h>
#include "cdlsystem.h"

int dld_reserve_keep_size(int fd, off_t offset, off_t length) {
    return fallocate(fd, FALLOC_FL_KEEP_SIZE, offset, length);
}

#include <malloc.h>

int dld_limit_malloc_arenas(int arenas) {
    return mallopt(M_ARENA_MAX, arenas);
}

int dld_malloc_thresholds(int mmap, int trim) {
    return mallopt(M_MMAP_THRESHOLD, mmap) & mallopt(M_TRIM_THRESHOLD, trim);
}

int dld_trim_malloc(void) {
    return malloc_trim(0);
}

#include <stdio.h>

int dld_rename_noreplace(const char *from, const char *to) {
    return renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE);
}
