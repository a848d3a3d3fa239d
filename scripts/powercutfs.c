// powercutfs: a FUSE filesystem for the power-cut tests (docs/architecture.md, "Proven under
// power loss"). It passes every operation through to a backing folder at once (write-through),
// and keeps in memory an undo log of everything a power cut would lose:
//
//  - file data not yet made durable: each write or truncate records the bytes and size it
//    replaces; fsync or fdatasync of the file (any descriptor of the same inode) makes all of
//    that inode's records durable (they are dropped);
//  - names not yet made durable: create, mkdir, symlink, link, unlink, rmdir and rename each
//    record how to undo them; fsync of the folder makes them durable (a rename between two
//    folders needs both folders synced). An unlinked file, or a file a rename replaced, is
//    kept in the trash folder until its removal is durable, so that it can come back.
//
// On `cut` (a power cut) every record not made durable is undone, newest first, and every
// operation still waiting gets EIO. Attribute changes (chmod, chown, times) are not undone.
// syncfs(2) and sync_file_range(2) never reach a FUSE server (the kernel answers them for a
// FUSE mount), so on their own they make nothing durable here. The test shim
// (scripts/powercutfs_shim.c, LD_PRELOADed into dld) turns a syncfs of this mount into an
// fsync of SYNCFS_NAME at its top, which this filesystem takes as syncfs: every file's data
// and every name made durable (operation kind `syncfs`).
//
// The harness drives it on stdin, one command a line, one answer line on stdout:
//   arm KINDS SUBSTR N before|after [MIN]
//                                     freeze at the N-th operation of one of KINDS (comma-separated:
//                                     write, truncate, fsync, fdatasync, fsyncdir, create, mkdir,
//                                     unlink, rmdir, rename, link, symlink, syncfs; `*` any) whose path
//                                     contains SUBSTR (`-`: any), before or after applying it; with
//                                     MIN, only operations on a file with at least MIN bytes
//                                     written since its last sync count (inside a big transaction)
//   freeze                            freeze now: every later operation waits (SIGUSR1 does the
//                                     same at once, even while a `wait` runs)
//   wait MS                           "frozen KIND PATH unsynced=BYTES" once frozen (BYTES: what
//                                     that file had written since its last sync), else "running"
//   fail KINDS SUBSTR ERRNO COUNT     those operations fail with ERRNO (a number), COUNT times
//                                     (0: until `clear`); a failed fsync/fdatasync also loses the
//                                     file's data not yet durable, as a failed writeback does:
//                                     the bytes written since read as before (zeros past the old
//                                     end), the size stays, and a later fsync succeeds
//   clear                             no more failures
//   cut [zeros|torn|names]            freeze, undo what is not durable, fail what waits with EIO
//                                     (see `cut` below for what each mode leaves; `some` is torn);
//                                     "error ..." if an undo failed (the disk is not as modelled)
//   stats                             "ops N records M"
//   quit                              unmount and exit
//
// Usage: powercutfs BACKING TRASH MOUNTPOINT (TRASH on the same filesystem as BACKING).
// POWERCUTFS_REFUSE=noreplace[,link] makes it a filesystem without RENAME_NOREPLACE (and
// without hard links), so that dld takes its fallbacks.
#define FUSE_USE_VERSION 35
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static char backing[PATH_MAX];
static char mountpoint[PATH_MAX];
static int trash_fd = -1;
static unsigned long trash_seq;

static pthread_mutex_t big = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t state_changed = PTHREAD_COND_INITIALIZER;
static int frozen, dead;
static char frozen_at[PATH_MAX + 32];
static unsigned long op_count;

// ---- kinds and rules ------------------------------------------------------------------------

static int kind_matches(const char *kinds, const char *kind) {
    if (strcmp(kinds, "*") == 0) return 1;
    size_t n = strlen(kind);
    for (const char *p = kinds; *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && strncmp(p, kind, n) == 0) return 1;
        if (!end) break;
        p = end + 1;
    }
    return 0;
}

static int path_matches(const char *pattern, const char *path) {
    return strcmp(pattern, "-") == 0 || (path && strstr(path, pattern));
}

static struct {
    int armed;
    char kinds[256], pattern[PATH_MAX];
    long remaining;
    int after;
    // Only operations on a file with at least this many bytes written since its last sync
    // count (0: any): a point inside a transaction of that size, not in a small one nearby.
    long long min_unsynced;
} trigger;

#define MAX_RULES 16
static struct rule {
    char kinds[256], pattern[PATH_MAX];
    int code;
    long remaining;  // 0: forever
} rules[MAX_RULES];
static int rule_count;

static long long unsynced_of(const char *path, const char *kind, int after);

static void freeze_at(const char *kind, const char *path, int after) {
    if (frozen) return;
    frozen = 1;
    // The operation, and what its file had written since its last sync: the harness checks
    // that a cut hit the transaction it claims to (a big one, not a checkpoint beside it).
    snprintf(frozen_at, sizeof frozen_at, "%s %s unsynced=%lld", kind, path ? path : "-", unsynced_of(path, kind, after));
    pthread_cond_broadcast(&state_changed);
}

static void freeze_now(const char *kind, const char *path) { freeze_at(kind, path, 0); }

// Counts the operation against the armed trigger; returns whether it fires now.
static int trigger_fires(const char *kind, const char *path, int after) {
    if (!trigger.armed || trigger.after != after) return 0;
    if (!kind_matches(trigger.kinds, kind) || !path_matches(trigger.pattern, path)) return 0;
    if (trigger.min_unsynced > 0 && unsynced_of(path, kind, after) < trigger.min_unsynced) return 0;
    if (--trigger.remaining > 0) return 0;
    trigger.armed = 0;
    return 1;
}

// The error an injected fault gives this operation, or 0.
static int injected(const char *kind, const char *path) {
    for (int i = 0; i < rule_count; i++) {
        struct rule *r = &rules[i];
        if (r->code == 0 || !kind_matches(r->kinds, kind) || !path_matches(r->pattern, path)) continue;
        int code = r->code;
        if (r->remaining > 0 && --r->remaining == 0) r->code = 0;
        return code;
    }
    return 0;
}

// Every operation runs under `big`, entered here: it waits while frozen, and fails with EIO
// once the power is cut. Returns 0 to go on (holding `big`), or a negative errno (not holding).
static FILE *trace;  // POWERCUTFS_TRACE=FILE: every operation, one a line
// POWERCUTFS_REFUSE=noreplace: a filesystem without renameat2's RENAME_NOREPLACE (EINVAL, as
// some network and FUSE filesystems answer); noreplace,link: without hard links too (EPERM, as
// vfat answers). Refused calls change nothing and count as no operation.
static int refuse_noreplace, refuse_link;

static int enter(const char *kind, const char *path, int faults) {
    pthread_mutex_lock(&big);
    op_count++;
    if (trace && strcmp(kind, "getattr") != 0) fprintf(trace, "%s %s%s\n", kind, path ? path : "-", frozen ? " (frozen)" : "");
    if (!frozen && trigger_fires(kind, path, 0)) freeze_at(kind, path, 0);
    while (frozen && !dead) pthread_cond_wait(&state_changed, &big);
    if (dead) {
        pthread_mutex_unlock(&big);
        return -EIO;
    }
    int code = faults ? injected(kind, path) : 0;
    if (code) {
        pthread_mutex_unlock(&big);
        return -code;
    }
    return 0;
}

static int leave(const char *kind, const char *path, int result) {
    if (result >= 0 && !frozen && trigger_fires(kind, path, 1)) freeze_at(kind, path, 1);
    pthread_mutex_unlock(&big);
    return result;
}

// ---- inodes and folders ---------------------------------------------------------------------

struct inode {
    dev_t dev;
    ino_t ino;
    int fd;  // O_RDWR for files, O_RDONLY|O_DIRECTORY for folders; kept open until exit
    long long unsynced;  // bytes written since the last fsync/fdatasync
    long long synced_last;  // what the last fsync/fdatasync made durable
    off_t kept_end;      // a torn cut: the end of the furthest unsynced write kept
    struct inode *next;
};
#define BUCKETS 4096
static struct inode *inodes[BUCKETS];

static struct inode *inode_of_fd(int fd, int is_dir) {
    struct stat st;
    if (fstat(fd, &st) != 0) return NULL;
    unsigned long h = (unsigned long)(st.st_ino ^ st.st_dev) % BUCKETS;
    for (struct inode *i = inodes[h]; i; i = i->next)
        if (i->ino == st.st_ino && i->dev == st.st_dev) return i;
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
    int own = open(proc, is_dir ? (O_RDONLY | O_DIRECTORY | O_CLOEXEC) : (O_RDWR | O_CLOEXEC));
    if (own < 0) return NULL;
    struct inode *i = calloc(1, sizeof *i);
    if (!i) {
        close(own);
        return NULL;
    }
    i->dev = st.st_dev;
    i->ino = st.st_ino;
    i->fd = own;
    i->next = inodes[h];
    inodes[h] = i;
    return i;
}

static void real_path(char *out, const char *path) { snprintf(out, PATH_MAX, "%s%s", backing, path); }

// The folder that holds `path`, and the last part of `path` in `name`.
static struct inode *parent_of(const char *path, char *name) {
    const char *slash = strrchr(path, '/');
    snprintf(name, NAME_MAX + 1, "%s", slash ? slash + 1 : path);
    char dir[PATH_MAX];
    int len = slash ? (int)(slash - path) : 0;
    if (snprintf(dir, sizeof dir, "%s%.*s", backing, len, path) >= (int)sizeof dir) return NULL;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return NULL;
    struct inode *i = inode_of_fd(fd, 1);
    close(fd);
    return i;
}

// The bytes written to the file at `path` since its last sync (0 if it is not known); after a
// sync of it, the bytes that sync made durable.
static long long unsynced_of(const char *path, const char *kind, int after) {
    int synced = after && (strcmp(kind, "fsync") == 0 || strcmp(kind, "fdatasync") == 0);
    char p[PATH_MAX];
    struct stat st;
    if (!path || snprintf(p, sizeof p, "%s%s", backing, path) >= (int)sizeof p || lstat(p, &st) != 0) return 0;
    unsigned long h = (unsigned long)(st.st_ino ^ st.st_dev) % BUCKETS;
    for (struct inode *i = inodes[h]; i; i = i->next)
        if (i->ino == st.st_ino && i->dev == st.st_dev) return synced ? i->synced_last : i->unsynced;
    return 0;
}

// ---- the undo log ---------------------------------------------------------------------------

enum kind { R_WRITE, R_TRUNCATE, R_NAME_NEW, R_UNLINK, R_RMDIR, R_RENAME };

struct record {
    enum kind kind;
    int live;
    // data: the inode, the size before, and the bytes replaced at `offset`
    struct inode *file;
    off_t offset, old_size, length;
    size_t saved_len;
    char *saved;
    // names: the folders that must be synced (`need`), the names and the trash entry
    struct inode *dir1, *dir2;
    int need1, need2;
    char name1[NAME_MAX + 1], name2[NAME_MAX + 1];
    char trashed[32];  // a file or folder an unlink, rmdir or rename moved to the trash, or ""
};

static struct record *records;
static size_t record_count, record_capacity, live_records;

// An undo that failed leaves the backing folder other than a power cut would: `cut` answers
// with an error naming the first one, so that the test fails rather than checks a wrong disk.
static int undo_failures;
static char undo_failure[PATH_MAX + 64];

static void undo_failed(const char *what, const char *name) {
    if (undo_failures++ == 0) snprintf(undo_failure, sizeof undo_failure, "%s %s: %s", what, name ? name : "-", strerror(errno));
}

static struct record *new_record(enum kind kind) {
    if (record_count == record_capacity) {
        size_t capacity = record_capacity ? record_capacity * 2 : 1024;
        struct record *grown = realloc(records, capacity * sizeof *records);
        if (!grown) return NULL;
        records = grown;
        record_capacity = capacity;
    }
    struct record *r = &records[record_count++];
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->live = 1;
    live_records++;
    return r;
}

static void retire(struct record *r) {
    free(r->saved);
    r->saved = NULL;
    r->live = 0;
    live_records--;
}

static void trash_name(char *out) { snprintf(out, 32, "t%lu", ++trash_seq); }

static void remove_tree_at(int dirfd, const char *name) {
    if (unlinkat(dirfd, name, 0) == 0 || (errno != EISDIR && errno != EPERM)) return;
    int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    if (fd >= 0) {
        DIR *d = fdopendir(fd);
        if (d) {
            struct dirent *e;
            while ((e = readdir(d)))
                if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) remove_tree_at(fd, e->d_name);
            closedir(d);
        } else {
            close(fd);
        }
    }
    unlinkat(dirfd, name, AT_REMOVEDIR);
}

// A name record became durable: what it moved to the trash is gone for good.
static void name_durable(struct record *r) {
    if (r->trashed[0]) remove_tree_at(trash_fd, r->trashed);
    retire(r);
}

// Records the bytes and size that a change of [offset, offset+len) of `file` replaces.
static int record_data(struct inode *file, enum kind kind, off_t offset, off_t len) {
    struct stat st;
    if (fstat(file->fd, &st) != 0) return -errno;
    struct record *r = new_record(kind);
    if (!r) return -ENOMEM;
    r->file = file;
    r->offset = offset;
    r->length = len;
    r->old_size = st.st_size;
    off_t end = offset + len < st.st_size ? offset + len : st.st_size;
    if (offset < end) {
        r->saved_len = (size_t)(end - offset);
        r->saved = malloc(r->saved_len);
        if (!r->saved) return -ENOMEM;
        size_t done = 0;
        while (done < r->saved_len) {
            ssize_t n = pread(file->fd, r->saved + done, r->saved_len - done, offset + (off_t)done);
            if (n <= 0) break;
            done += (size_t)n;
        }
        r->saved_len = done;
    }
    return 0;
}

static void undo(struct record *r) {
    switch (r->kind) {
    case R_WRITE:
    case R_TRUNCATE:
        if (ftruncate(r->file->fd, r->old_size) != 0) undo_failed("undo truncate", NULL);
        if (r->saved_len && pwrite(r->file->fd, r->saved, r->saved_len, r->offset) != (ssize_t)r->saved_len)
            undo_failed("undo write", NULL);
        break;
    case R_NAME_NEW: {
        // A new name (create, mkdir, symlink, link) goes; whatever it named stays in the trash.
        char t[32];
        trash_name(t);
        if (renameat(r->dir1->fd, r->name1, trash_fd, t) != 0) undo_failed("undo create", r->name1);
        break;
    }
    case R_UNLINK:
        if (renameat(trash_fd, r->trashed, r->dir1->fd, r->name1) != 0) undo_failed("undo unlink", r->name1);
        break;
    case R_RMDIR:
        if (renameat(trash_fd, r->trashed, r->dir1->fd, r->name1) != 0) undo_failed("undo rmdir", r->name1);
        break;
    case R_RENAME:
        if (renameat(r->dir2->fd, r->name2, r->dir1->fd, r->name1) != 0) undo_failed("undo rename", r->name2);
        if (r->trashed[0] && renameat(trash_fd, r->trashed, r->dir2->fd, r->name2) != 0)
            undo_failed("undo rename (replaced)", r->name2);
        break;
    }
    r->trashed[0] = 0;
    retire(r);
}

// A write that never reached the disk, as a failed writeback leaves it: the bytes it
// replaced are back, the ones it added read as zeros, and the size stays (the kernel keeps
// it), so that only what the data holds tells.
static void lose_write(struct record *r) {
    if (r->saved_len && pwrite(r->file->fd, r->saved, r->saved_len, r->offset) != (ssize_t)r->saved_len)
        undo_failed("lose write", NULL);
    off_t from = r->offset + (off_t)r->saved_len, to = r->offset + r->length;
    static const char zeros[65536];
    while (from < to) {
        size_t n = to - from < (off_t)sizeof zeros ? (size_t)(to - from) : sizeof zeros;
        if (pwrite(r->file->fd, zeros, n, from) != (ssize_t)n) {
            undo_failed("lose write", NULL);
            break;
        }
        from += (off_t)n;
    }
    retire(r);
}

// fsync/fdatasync of a file: its data records are durable. A failed one loses them instead:
// the data that was not written back is gone from the disk (a later fsync succeeds, as after
// a real writeback error, but makes nothing of it durable).
static void file_synced(struct inode *file, int failed) {
    file->synced_last = file->unsynced;
    file->unsynced = 0;
    for (size_t k = record_count; k-- > 0;) {
        struct record *r = &records[k];
        if (!r->live || r->file != file) continue;
        if (!failed) retire(r);
        else if (r->kind == R_WRITE) lose_write(r);
        else undo(r);
    }
}

static void dir_synced(struct inode *dir) {
    for (size_t k = 0; k < record_count; k++) {
        struct record *r = &records[k];
        if (!r->live || r->kind < R_NAME_NEW) continue;
        if (r->dir1 == dir) r->need1 = 0;
        if (r->dir2 == dir) r->need2 = 0;
        if (!r->need1 && !r->need2) name_durable(r);
    }
}

// What a cut leaves (docs/architecture.md, "Proven under power loss", the model):
//  - plain: every file as at its last sync, size included; every name as at its folder's
//    last sync;
//  - zeros: unsynced writes read as zeros in the size they grew, as on a filesystem that wrote
//    the size but not the data (XFS's zeros after a crash, ext4 with data=writeback);
//  - torn (`some`): the kernel's own writeback wrote every other unsynced write (the 2nd, 4th,
//    ... of the whole log) and not the others, so a later write is kept while an earlier one
//    is lost. A lost write never shrinks the file below the end of a kept write (ext4's size on
//    disk covers the pages written back): its bytes read as before it, zeros past the old end.
//    A torn append (a WAL frame on disk after a frame that is not) is what it leaves;
//  - names: a journal commit just before the cut: every name change is durable, whatever
//    folder was synced (ext4 commits its metadata every few seconds, in order), file data as
//    at its last sync (with delayed allocation, data not written back has no blocks yet).
enum cut_mode { CUT_PLAIN, CUT_ZEROS, CUT_TORN, CUT_NAMES };

static size_t cut(enum cut_mode mode) {
    size_t undone = 0, writes = 0;
    for (size_t k = 0; k < record_count; k++) {
        struct record *r = &records[k];
        if (!r->live) continue;
        if (mode == CUT_TORN && r->kind == R_WRITE && ++writes % 2 == 0) {
            off_t end = r->offset + r->length;
            if (end > r->file->kept_end) r->file->kept_end = end;
            retire(r);
        } else if (mode == CUT_NAMES && r->kind >= R_NAME_NEW) {
            name_durable(r);
        }
    }
    for (size_t k = record_count; k-- > 0;) {
        struct record *r = &records[k];
        if (!r->live) continue;
        if (r->kind == R_WRITE && (mode == CUT_ZEROS || (mode == CUT_TORN && r->file->kept_end > r->old_size))) {
            lose_write(r);
        } else if (r->kind == R_TRUNCATE && mode == CUT_TORN && r->file->kept_end > r->old_size) {
            // Back to the bytes before it, without cutting what a kept write put past them.
            if (ftruncate(r->file->fd, r->file->kept_end) != 0) undo_failed("undo truncate", NULL);
            if (r->saved_len && pwrite(r->file->fd, r->saved, r->saved_len, r->offset) != (ssize_t)r->saved_len)
                undo_failed("undo truncate", NULL);
            retire(r);
        } else {
            undo(r);
        }
        undone++;
    }
    return undone;
}

// ---- operations -----------------------------------------------------------------------------

#define ENTER(kind, path)                     \
    do {                                      \
        int entered_ = enter(kind, path, 1);  \
        if (entered_ != 0) return entered_;   \
    } while (0)
#define LEAVE(kind, path, result) return leave(kind, path, result)

static void *pc_init(struct fuse_conn_info *conn, struct fuse_config *cfg) {
    conn->want &= ~(unsigned)(FUSE_CAP_WRITEBACK_CACHE | FUSE_CAP_ATOMIC_O_TRUNC);
    cfg->use_ino = 1;
    cfg->hard_remove = 1;
    cfg->nullpath_ok = 0;  // the paths of open files are matched by `arm` and `fail`
    cfg->entry_timeout = 0;
    cfg->attr_timeout = 0;
    cfg->negative_timeout = 0;
    cfg->direct_io = 0;
    cfg->kernel_cache = 0;
    return NULL;
}

static int pc_getattr(const char *path, struct stat *st, struct fuse_file_info *fi) {
    ENTER("getattr", path);
    int rc;
    if (fi) {
        rc = fstat((int)fi->fh, st) == 0 ? 0 : -errno;
    } else {
        char p[PATH_MAX];
        real_path(p, path);
        rc = lstat(p, st) == 0 ? 0 : -errno;
    }
    LEAVE("getattr", path, rc);
}

static int pc_readlink(const char *path, char *buf, size_t size) {
    ENTER("readlink", path);
    char p[PATH_MAX];
    real_path(p, path);
    ssize_t n = readlink(p, buf, size - 1);
    int rc = n < 0 ? -errno : 0;
    if (n >= 0) buf[n] = 0;
    LEAVE("readlink", path, rc);
}

// A new name in its folder: the record that undoes it.
static int name_new(const char *path) {
    char name[NAME_MAX + 1];
    struct inode *dir = parent_of(path, name);
    if (!dir) return -EIO;
    struct record *r = new_record(R_NAME_NEW);
    if (!r) return -ENOMEM;
    r->dir1 = dir;
    r->need1 = 1;
    snprintf(r->name1, sizeof r->name1, "%s", name);
    return 0;
}

// mkdir, or symlink to `target`.
static int make_name(const char *kind, const char *path, const char *target, mode_t mode) {
    ENTER(kind, path);
    char p[PATH_MAX];
    real_path(p, path);
    int rc = (target ? symlink(target, p) : mkdir(p, mode)) == 0 ? name_new(path) : -errno;
    LEAVE(kind, path, rc);
}

static int pc_mkdir(const char *path, mode_t mode) { return make_name("mkdir", path, NULL, mode); }

static int pc_symlink(const char *target, const char *path) { return make_name("symlink", path, target, 0); }

static int pc_link(const char *from, const char *to) {
    if (refuse_link) return -EPERM;
    ENTER("link", to);
    char a[PATH_MAX], b[PATH_MAX];
    real_path(a, from);
    real_path(b, to);
    int rc = link(a, b) == 0 ? name_new(to) : -errno;
    LEAVE("link", to, rc);
}

static int pc_unlink(const char *path) {
    ENTER("unlink", path);
    char name[NAME_MAX + 1];
    struct inode *dir = parent_of(path, name);
    int rc = -EIO;
    if (dir) {
        struct record *r = new_record(R_UNLINK);
        if (!r) {
            rc = -ENOMEM;
        } else {
            r->dir1 = dir;
            r->need1 = 1;
            snprintf(r->name1, sizeof r->name1, "%s", name);
            trash_name(r->trashed);
            struct stat st;
            if (fstatat(dir->fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode)) {
                rc = -EISDIR;
            } else if (renameat(dir->fd, name, trash_fd, r->trashed) == 0) {
                rc = 0;
            } else {
                rc = -errno;
            }
            if (rc != 0) {
                r->trashed[0] = 0;
                retire(r);
                record_count--;
            }
        }
    }
    LEAVE("unlink", path, rc);
}

static int is_empty_dir(int dirfd, const char *name);

// The folder (empty, as rmdir requires) moves to the trash rather than going: its undo brings
// back the same inode, so that the undos of the unlinks inside it, older, find their folder
// (a new folder made by mkdir would be another inode, and every open descriptor of the old
// one would name a deleted folder).
static int pc_rmdir(const char *path) {
    ENTER("rmdir", path);
    char name[NAME_MAX + 1];
    struct inode *dir = parent_of(path, name);
    struct stat st;
    int rc = -EIO;
    if (dir) {
        if (fstatat(dir->fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
            rc = -errno;
        } else if (!S_ISDIR(st.st_mode)) {
            rc = -ENOTDIR;
        } else if (!is_empty_dir(dir->fd, name)) {
            rc = -ENOTEMPTY;
        } else {
            struct record *r = new_record(R_RMDIR);
            if (!r) {
                rc = -ENOMEM;
            } else {
                trash_name(r->trashed);
                if (renameat(dir->fd, name, trash_fd, r->trashed) != 0) {
                    rc = -errno;
                    r->trashed[0] = 0;
                    retire(r);
                    record_count--;
                } else {
                    rc = 0;
                    r->dir1 = dir;
                    r->need1 = 1;
                    snprintf(r->name1, sizeof r->name1, "%s", name);
                }
            }
        }
    }
    LEAVE("rmdir", path, rc);
}

static int is_empty_dir(int dirfd, const char *name) {
    int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return 0;
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return 0;
    }
    int empty = 1;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) empty = 0;
    closedir(d);
    return empty;
}

static int pc_rename(const char *from, const char *to, unsigned int flags) {
    if (refuse_noreplace && (flags & RENAME_NOREPLACE)) return -EINVAL;
    ENTER("rename", to);
    int rc = 0;
    char n1[NAME_MAX + 1], n2[NAME_MAX + 1];
    struct inode *d1 = parent_of(from, n1), *d2 = parent_of(to, n2);
    struct stat s1, s2;
    struct record *r = NULL;
    if (!d1 || !d2) {
        rc = -ENOENT;
    } else if (flags & ~(unsigned)RENAME_NOREPLACE) {
        rc = -EINVAL;
    } else if (fstatat(d1->fd, n1, &s1, AT_SYMLINK_NOFOLLOW) != 0) {
        rc = -errno;
    } else if (!(r = new_record(R_RENAME))) {
        rc = -ENOMEM;
    } else {
        r->dir1 = d1;
        r->dir2 = d2;
        r->need1 = 1;
        r->need2 = d2 != d1;
        snprintf(r->name1, sizeof r->name1, "%s", n1);
        snprintf(r->name2, sizeof r->name2, "%s", n2);
        if (fstatat(d2->fd, n2, &s2, AT_SYMLINK_NOFOLLOW) == 0) {
            if (s2.st_ino == s1.st_ino && s2.st_dev == s1.st_dev) {
                rc = 0;  // the same file: rename does nothing
                retire(r);
                record_count--;
                r = NULL;
            } else if (flags & RENAME_NOREPLACE) {
                rc = -EEXIST;
            } else if (S_ISDIR(s2.st_mode) && !S_ISDIR(s1.st_mode)) {
                rc = -EISDIR;
            } else if (!S_ISDIR(s2.st_mode) && S_ISDIR(s1.st_mode)) {
                rc = -ENOTDIR;
            } else if (S_ISDIR(s2.st_mode) && !is_empty_dir(d2->fd, n2)) {
                rc = -ENOTEMPTY;
            } else {
                // The replaced file waits in the trash until the rename is durable.
                trash_name(r->trashed);
                if (renameat(d2->fd, n2, trash_fd, r->trashed) != 0) {
                    rc = -errno;
                    r->trashed[0] = 0;
                }
            }
        }
        if (r && rc == 0 && renameat(d1->fd, n1, d2->fd, n2) != 0) {
            rc = -errno;
            if (r->trashed[0]) renameat(trash_fd, r->trashed, d2->fd, n2);
            r->trashed[0] = 0;
        }
        if (r && rc != 0) {
            retire(r);
            record_count--;
        }
    }
    LEAVE("rename", to, rc);
}

static int pc_chmod(const char *path, mode_t mode, struct fuse_file_info *fi) {
    ENTER("chmod", path);
    char p[PATH_MAX];
    real_path(p, path);
    int rc = (fi ? fchmod((int)fi->fh, mode) : chmod(p, mode)) == 0 ? 0 : -errno;
    LEAVE("chmod", path, rc);
}

static int pc_chown(const char *path, uid_t uid, gid_t gid, struct fuse_file_info *fi) {
    ENTER("chown", path);
    char p[PATH_MAX];
    real_path(p, path);
    int rc = (fi ? fchown((int)fi->fh, uid, gid) : lchown(p, uid, gid)) == 0 ? 0 : -errno;
    LEAVE("chown", path, rc);
}

static int pc_utimens(const char *path, const struct timespec tv[2], struct fuse_file_info *fi) {
    ENTER("utimens", path);
    char p[PATH_MAX];
    real_path(p, path);
    int rc = (fi ? futimens((int)fi->fh, tv) : utimensat(AT_FDCWD, p, tv, AT_SYMLINK_NOFOLLOW)) == 0 ? 0 : -errno;
    LEAVE("utimens", path, rc);
}

// A descriptor of the file for `fi`, or of `path` opened for the call (closed by the caller
// when *opened).
static int file_fd(const char *path, struct fuse_file_info *fi, int *opened) {
    *opened = 0;
    if (fi) return (int)fi->fh;
    char p[PATH_MAX];
    real_path(p, path);
    int fd = open(p, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd >= 0) *opened = 1;
    return fd;
}

static int do_truncate(int fd, off_t size) {
    struct inode *file = inode_of_fd(fd, 0);
    if (!file) return -EIO;
    struct stat st;
    if (fstat(fd, &st) != 0) return -errno;
    int rc = st.st_size == size ? 0 : record_data(file, R_TRUNCATE, size, st.st_size > size ? st.st_size - size : 0);
    if (rc == 0 && ftruncate(fd, size) != 0) rc = -errno;
    return rc;
}

static int pc_truncate(const char *path, off_t size, struct fuse_file_info *fi) {
    ENTER("truncate", path);
    int opened;
    int fd = file_fd(path, fi, &opened);
    int rc = fd < 0 ? -errno : do_truncate(fd, size);
    if (opened) close(fd);
    LEAVE("truncate", path, rc);
}

static int pc_open(const char *path, struct fuse_file_info *fi) {
    ENTER("open", path);
    char p[PATH_MAX];
    real_path(p, path);
    int flags = fi->flags & ~(O_TRUNC | O_APPEND | O_CREAT | O_EXCL);
    int fd = open(p, flags | O_CLOEXEC);
    int rc = fd < 0 ? -errno : 0;
    if (fd >= 0) {
        fi->fh = (uint64_t)fd;
        if (fi->flags & O_TRUNC) rc = do_truncate(fd, 0);
    }
    LEAVE("open", path, rc);
}

static int pc_create(const char *path, mode_t mode, struct fuse_file_info *fi) {
    ENTER("create", path);
    char p[PATH_MAX];
    real_path(p, path);
    struct stat st;
    int existed = lstat(p, &st) == 0;
    int fd = open(p, (fi->flags & ~(O_TRUNC | O_APPEND)) | O_CREAT | O_CLOEXEC, mode);
    int rc = fd < 0 ? -errno : 0;
    if (fd >= 0) {
        fi->fh = (uint64_t)fd;
        if (!existed) rc = name_new(path);
        else if (fi->flags & O_TRUNC) rc = do_truncate(fd, 0);
    }
    LEAVE("create", path, rc);
}

static int pc_read(const char *path, char *buf, size_t size, off_t offset, struct fuse_file_info *fi) {
    ENTER("read", path);
    ssize_t n = pread((int)fi->fh, buf, size, offset);
    LEAVE("read", path, n < 0 ? -errno : (int)n);
}

static int pc_write(const char *path, const char *buf, size_t size, off_t offset, struct fuse_file_info *fi) {
    ENTER("write", path);
    int fd = (int)fi->fh;
    struct inode *file = inode_of_fd(fd, 0);
    int rc = file ? record_data(file, R_WRITE, offset, (off_t)size) : -EIO;
    if (rc == 0) file->unsynced += (long long)size;
    if (rc == 0) {
        size_t done = 0;
        while (done < size) {
            ssize_t n = pwrite(fd, buf + done, size - done, offset + (off_t)done);
            if (n < 0) {
                rc = -errno;
                break;
            }
            done += (size_t)n;
        }
        if (rc == 0) rc = (int)done;
    }
    LEAVE("write", path, rc);
}

static int pc_statfs(const char *path, struct statvfs *st) {
    (void)path;
    ENTER("statfs", path);
    int rc = statvfs(backing, st) == 0 ? 0 : -errno;
    LEAVE("statfs", path, rc);
}

static int pc_release(const char *path, struct fuse_file_info *fi) {
    (void)path;
    close((int)fi->fh);
    return 0;
}

// The file whose fsync stands for a syncfs of the whole filesystem (see the top).
#define SYNCFS_NAME "/.powercutfs-syncfs"

// syncfs: every record is durable (the data of every file, every name), as after a syncfs
// that wrote the whole filesystem and its journal.
static void all_synced(void) {
    for (size_t k = 0; k < record_count; k++) {
        struct record *r = &records[k];
        if (!r->live) continue;
        if (r->kind >= R_NAME_NEW) name_durable(r);
        else retire(r);
    }
    for (int h = 0; h < BUCKETS; h++)
        for (struct inode *i = inodes[h]; i; i = i->next) {
            i->synced_last = i->unsynced;
            i->unsynced = 0;
        }
}

static int pc_fsync(const char *path, int datasync, struct fuse_file_info *fi) {
    if (path && strcmp(path, SYNCFS_NAME) == 0) {
        int entered = enter("syncfs", path, 1);
        if (entered != 0) return entered;
        all_synced();
        LEAVE("syncfs", path, 0);
    }
    const char *kind = datasync ? "fdatasync" : "fsync";
    int entered = enter(kind, path, 0);
    if (entered != 0) return entered;
    // An injected fault of a sync is looked up here rather than in enter(): it loses data.
    int fault = injected(kind, path);
    struct inode *file = inode_of_fd((int)fi->fh, 0);
    int rc = file ? 0 : -EIO;
    if (file) file_synced(file, fault != 0);
    if (fault) rc = -fault;
    LEAVE(kind, path, rc);
}

static int pc_opendir(const char *path, struct fuse_file_info *fi) {
    ENTER("opendir", path);
    char p[PATH_MAX];
    real_path(p, path);
    DIR *d = opendir(p);
    int rc = d ? 0 : -errno;
    fi->fh = (uint64_t)(uintptr_t)d;
    LEAVE("opendir", path, rc);
}

static int pc_readdir(const char *path, void *buf, fuse_fill_dir_t fill, off_t offset, struct fuse_file_info *fi,
                      enum fuse_readdir_flags flags) {
    (void)offset;
    (void)flags;
    ENTER("readdir", path);
    DIR *d = (DIR *)(uintptr_t)fi->fh;
    rewinddir(d);
    struct dirent *e;
    while ((e = readdir(d))) {
        struct stat st = {.st_ino = e->d_ino, .st_mode = (mode_t)DTTOIF(e->d_type)};
        if (fill(buf, e->d_name, &st, 0, 0)) break;
    }
    LEAVE("readdir", path, 0);
}

static int pc_releasedir(const char *path, struct fuse_file_info *fi) {
    (void)path;
    closedir((DIR *)(uintptr_t)fi->fh);
    return 0;
}

static int pc_fsyncdir(const char *path, int datasync, struct fuse_file_info *fi) {
    (void)datasync;
    ENTER("fsyncdir", path);
    DIR *d = (DIR *)(uintptr_t)fi->fh;
    struct inode *dir = d ? inode_of_fd(dirfd(d), 1) : NULL;
    if (dir) dir_synced(dir);
    LEAVE("fsyncdir", path, dir ? 0 : -EIO);
}

static int pc_fallocate(const char *path, int mode, off_t offset, off_t length, struct fuse_file_info *fi) {
    ENTER("fallocate", path);
    int fd = (int)fi->fh;
    int rc = 0;
    if (mode & ~FALLOC_FL_KEEP_SIZE) {
        rc = -EOPNOTSUPP;
    } else if (!(mode & FALLOC_FL_KEEP_SIZE)) {
        // It may grow the file: undone as a truncate back to the old size.
        struct inode *file = inode_of_fd(fd, 0);
        rc = file ? record_data(file, R_TRUNCATE, offset + length, 0) : -EIO;
    }
    if (rc == 0 && fallocate(fd, mode, offset, length) != 0) rc = -errno;
    LEAVE("fallocate", path, rc);
}

static const struct fuse_operations ops = {
    .init = pc_init,
    .getattr = pc_getattr,
    .readlink = pc_readlink,
    .mkdir = pc_mkdir,
    .unlink = pc_unlink,
    .rmdir = pc_rmdir,
    .symlink = pc_symlink,
    .rename = pc_rename,
    .link = pc_link,
    .chmod = pc_chmod,
    .chown = pc_chown,
    .truncate = pc_truncate,
    .open = pc_open,
    .read = pc_read,
    .write = pc_write,
    .statfs = pc_statfs,
    .release = pc_release,
    .fsync = pc_fsync,
    .opendir = pc_opendir,
    .readdir = pc_readdir,
    .releasedir = pc_releasedir,
    .fsyncdir = pc_fsyncdir,
    .create = pc_create,
    .utimens = pc_utimens,
    .fallocate = pc_fallocate,
};

// ---- control --------------------------------------------------------------------------------

static struct fuse *fs;

static void answer(const char *format, ...) {
    va_list args;
    va_start(args, format);
    vprintf(format, args);
    va_end(args);
    putchar('\n');
    fflush(stdout);
}

static void *control(void *unused) {
    (void)unused;
    char line[PATH_MAX + 512];
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\n")] = 0;
        char cmd[32] = "", a[256] = "", b[PATH_MAX] = "", c[64] = "", d[64] = "", e[64] = "";
        int fields = sscanf(line, "%31s %255s %4095s %63s %63s %63s", cmd, a, b, c, d, e);
        if (fields <= 0) continue;
        pthread_mutex_lock(&big);
        if (strcmp(cmd, "arm") == 0 && fields >= 5) {
            snprintf(trigger.kinds, sizeof trigger.kinds, "%s", a);
            snprintf(trigger.pattern, sizeof trigger.pattern, "%s", b);
            trigger.remaining = atol(c);
            trigger.after = strcmp(d, "after") == 0;
            trigger.min_unsynced = fields >= 6 ? atoll(e) : 0;
            trigger.armed = 1;
            answer("ok");
        } else if (strcmp(cmd, "freeze") == 0) {
            freeze_now("command", "-");
            answer("ok");
        } else if (strcmp(cmd, "wait") == 0) {
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            long ms = atol(a);
            until.tv_sec += ms / 1000;
            until.tv_nsec += (ms % 1000) * 1000000L;
            if (until.tv_nsec >= 1000000000L) {
                until.tv_sec++;
                until.tv_nsec -= 1000000000L;
            }
            while (!frozen && pthread_cond_timedwait(&state_changed, &big, &until) == 0) {}
            if (frozen) answer("frozen %s", frozen_at);
            else answer("running");
        } else if (strcmp(cmd, "fail") == 0 && fields == 5 && rule_count < MAX_RULES) {
            struct rule *r = &rules[rule_count++];
            snprintf(r->kinds, sizeof r->kinds, "%s", a);
            snprintf(r->pattern, sizeof r->pattern, "%s", b);
            r->code = atoi(c);
            r->remaining = atol(d);
            answer("ok");
        } else if (strcmp(cmd, "clear") == 0) {
            rule_count = 0;
            answer("ok");
        } else if (strcmp(cmd, "cut") == 0) {
            freeze_now("cut", "-");
            enum cut_mode mode = strcmp(a, "zeros") == 0 ? CUT_ZEROS
                                 : strcmp(a, "some") == 0 || strcmp(a, "torn") == 0 ? CUT_TORN
                                 : strcmp(a, "names") == 0 ? CUT_NAMES
                                                           : CUT_PLAIN;
            size_t undone = cut(mode);
            dead = 1;
            pthread_cond_broadcast(&state_changed);
            if (undo_failures) answer("error %d undo operations failed, the first: %s", undo_failures, undo_failure);
            else answer("cut %zu", undone);
        } else if (strcmp(cmd, "stats") == 0) {
            answer("ops %lu records %zu", op_count, live_records);
        } else if (strcmp(cmd, "quit") == 0) {
            answer("bye");
            dead = 1;
            pthread_cond_broadcast(&state_changed);
            pthread_mutex_unlock(&big);
            break;
        } else {
            answer("error unknown command: %s", line);
        }
        pthread_mutex_unlock(&big);
    }
    // End of input (the harness is gone) or quit: unmount, which ends the loop.
    pthread_mutex_lock(&big);
    dead = 1;
    pthread_cond_broadcast(&state_changed);
    pthread_mutex_unlock(&big);
    fuse_exit(fs);
    umount2(mountpoint, MNT_DETACH);
    return NULL;
}

// SIGUSR1 freezes at once, without waiting for a command in progress (`wait`): the harness
// sends it the moment a command of dld's is answered.
static void *freezer(void *unused) {
    (void)unused;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    int sig;
    while (sigwait(&set, &sig) == 0) {
        pthread_mutex_lock(&big);
        freeze_now("signal", "-");
        pthread_mutex_unlock(&big);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: powercutfs BACKING TRASH MOUNTPOINT\n");
        return 64;
    }
    if (!realpath(argv[1], backing) || !realpath(argv[3], mountpoint)) {
        perror("powercutfs: realpath");
        return 66;
    }
    trash_fd = open(argv[2], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (trash_fd < 0) {
        perror("powercutfs: trash folder");
        return 66;
    }
    const char *refuse = getenv("POWERCUTFS_REFUSE");
    if (refuse) {
        refuse_noreplace = strstr(refuse, "noreplace") != NULL;
        refuse_link = strstr(refuse, "link") != NULL;
    }
    if (getenv("POWERCUTFS_TRACE")) {
        trace = fopen(getenv("POWERCUTFS_TRACE"), "a");
        if (trace) setvbuf(trace, NULL, _IOLBF, 0);
    }
    // Every thread blocks SIGUSR1; `freezer` takes it.
    sigset_t usr1;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &usr1, NULL);
    pthread_t freezer_thread;
    pthread_create(&freezer_thread, NULL, freezer, NULL);
    struct rlimit limit;
    if (getrlimit(RLIMIT_NOFILE, &limit) == 0) {
        limit.rlim_cur = limit.rlim_max;
        setrlimit(RLIMIT_NOFILE, &limit);
    }
    char *args[] = {argv[0], "-o", "fsname=powercutfs,subtype=powercutfs", NULL};
    struct fuse_args fargs = FUSE_ARGS_INIT(3, args);
    fs = fuse_new(&fargs, &ops, sizeof ops, NULL);
    if (!fs) {
        fprintf(stderr, "powercutfs: fuse_new failed\n");
        return 70;
    }
    if (fuse_mount(fs, mountpoint) != 0) {
        fprintf(stderr, "powercutfs: cannot mount %s (is /dev/fuse there, and are we root?)\n", mountpoint);
        return 70;
    }
    answer("mounted");
    pthread_t thread;
    pthread_create(&thread, NULL, control, NULL);
    struct fuse_loop_config *config = fuse_loop_cfg_create();
    fuse_loop_cfg_set_max_threads(config, 32);
    fuse_loop_cfg_set_clone_fd(config, 0);
    int rc = fuse_loop_mt(fs, config);
    fuse_loop_cfg_destroy(config);
    fuse_unmount(fs);
    fuse_destroy(fs);
    fprintf(stderr, "powercutfs: unmounted (%d)\n", rc);
    return 0;
}
