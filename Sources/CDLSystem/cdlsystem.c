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

#include <errno.h>
#include <unistd.h>

int dld_syncfs(int fd) {
    return syncfs(fd);
}

int dld_written_back(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return errno;
    int code = 0;
    if (sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER) != 0) code = errno;
    close(fd);
    return code;
}

#include <sys/vfs.h>

long dld_filesystem_type(int fd) {
    struct statfs info;
    if (fstatfs(fd, &info) != 0) return 0;
    return (long)info.f_type;
}

#include <sys/socket.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <string.h>
#include <unistd.h>

int dld_route_monitor_open(void) {
    int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC | SOCK_NONBLOCK, NETLINK_ROUTE);
    if (fd < 0) return -1;
    struct sockaddr_nl address;
    memset(&address, 0, sizeof address);
    address.nl_family = AF_NETLINK;
    address.nl_groups = RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR | RTMGRP_IPV4_ROUTE | RTMGRP_IPV6_ROUTE;
    if (bind(fd, (struct sockaddr *)&address, sizeof address) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}
