/*
 * Descriptors the library keeps open (the shared region, the loans ledger) live in the program's
 * descriptor table, so the program can close one and get its number back for another file (a
 * close-all loop, dup2 over it). Asking "is this slot's owner alive" (F_OFD_GETLK) through a
 * number that now names another file answers "nobody holds it" for every slot, and a sweep would
 * then erase every other process's usage. So every use first checks that the number still names
 * the same file (device and inode); if not, the file is opened again by its path (a new open
 * file description: its F_OFD_GETLK sees every other process's lock just the same).
 *
 * The slot lock itself survives such a close: it belongs to the open file description, which the
 * library's mmap of the file keeps alive (an OFD lock is released when the description's last
 * reference goes, and a mapping is one). A reopened description is pinned the same way (one
 * mapped page), so a lock later taken through it survives a close too.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "isolation.h"

void ts_fd_remember(ts_fd *f, int fd, const char *path) {
    struct stat st;
    f->fd = fd;
    f->dev = 0;
    f->ino = 0;
    snprintf(f->path, sizeof f->path, "%s", path ? path : "");
    if (fd >= 0 && fstat(fd, &st) == 0) {
        f->dev = (uint64_t)st.st_dev;
        f->ino = (uint64_t)st.st_ino;
    }
}

int ts_fd_get(ts_fd *f) {
    if (f->fd < 0) return -1;
    struct stat st;
    if (fstat(f->fd, &st) == 0 && (uint64_t)st.st_dev == f->dev && (uint64_t)st.st_ino == f->ino) return f->fd;
    int fd = f->path[0] ? open(f->path, O_RDWR | O_CLOEXEC) : -1;
    if (fd >= 0 && (fstat(fd, &st) != 0 || (uint64_t)st.st_dev != f->dev || (uint64_t)st.st_ino != f->ino)) {
        close(fd);
        fd = -1;
    }
    if (fd < 0) {
        ts_log_once(f->path, "the descriptor of %s was closed or replaced by the program and the file cannot be "
                    "opened again; no process's usage is reclaimed through it, new charges are refused",
                    f->path[0] ? f->path : "(private)");
        return -1;
    }
    int high = fcntl(fd, F_DUPFD_CLOEXEC, 900);
    if (high >= 0) {
        close(fd);
        fd = high;
    }
    void *pin = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0); /* keeps the description (and its locks) */
    if (pin != MAP_FAILED) madvise(pin, 4096, MADV_DONTFORK); /* a child must not keep it (fork.c) */
    ts_log_once(f->path, "the descriptor of %s was closed or replaced by the program; opened again", f->path);
    f->fd = fd; /* the old number is the program's now: never closed by us */
    return fd;
}
