/*
 * syncpoints: an LD_PRELOAD shim that records what a process made durable.
 *
 * Every successful fsync(2) and fdatasync(2) appends one line to the file
 * named by MALACHI_SYNC_LOG:
 *
 *     <inode> <size> <path>
 *
 * where <size> is the file's size when the sync was asked for: every byte
 * below it was written before the call, so it is on the disk once the call
 * returns. The line is written after the call returns, and before the
 * caller sees the result, so nothing the caller does on the strength of a
 * sync (such as acknowledging a write) comes before its line.
 *
 * chaos/run uses it for the `lose_unsynced` fault: it SIGKILLs a broker and
 * cuts each of its segment logs back to the last size recorded for that
 * file's inode (to nothing if it was never synced), which is what a power
 * loss may leave of a file whose suffix sat in the page cache. Keyed by
 * inode, not path, so a file synced under a temporary name and renamed
 * keeps its record.
 *
 * Build: gcc -O2 -shared -fPIC -o syncpoints.so syncpoints.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
static int log_fd = -1;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void init(void) {
    real_fsync = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    real_fdatasync = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    const char *path = getenv("MALACHI_SYNC_LOG");
    if (path != NULL) {
        log_fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    }
}

/* Records `fd`'s inode, `size` and path; regular files only. */
static void record(int fd, const struct stat *st) {
    if (log_fd < 0 || !S_ISREG(st->st_mode)) {
        return;
    }
    char link[64];
    char path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0) {
        return;
    }
    path[n] = '\0';
    char line[4200];
    int len = snprintf(line, sizeof line, "%llu %lld %s\n", (unsigned long long)st->st_ino,
                       (long long)st->st_size, path);
    if (len > 0 && len < (int)sizeof line) {
        /* One write with O_APPEND: lines from threads never interleave. */
        ssize_t ignored = write(log_fd, line, (size_t)len);
        (void)ignored;
    }
}

static int synced(int fd, int (*real)(int)) {
    struct stat st;
    int saved = errno;
    int have = fstat(fd, &st) == 0;
    errno = saved;
    int rc = real(fd);
    if (rc == 0 && have) {
        saved = errno;
        record(fd, &st);
        errno = saved;
    }
    return rc;
}

int fsync(int fd) {
    pthread_once(&once, init);
    return synced(fd, real_fsync);
}

int fdatasync(int fd) {
    pthread_once(&once, init);
    return synced(fd, real_fdatasync);
}
