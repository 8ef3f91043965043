/*
 * Preloaded into QEMU when a VM maps a snapshot's RAM file privately (copy-on-write).
 *
 * QEMU refuses to discard guest RAM that lives in a file it opened read-only, and on a
 * file it opened read-write it would punch holes into the file itself, under every other
 * VM that maps it. This library opens that one file read-only behind QEMU's back and lets
 * its hole punches succeed without touching the file, so a discard goes on to drop the
 * VM's private copies of the pages (MADV_DONTNEED), as Firecracker does: a page the guest
 * gave back (balloon, free page reporting) returns to the host and reads as the
 * snapshot's page again.
 *
 * The file is the one AENV_PRIVATE_RAM names; every other call passes through untouched.
 * The server checks that QEMU holds that file read-only before the guest runs.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#ifndef FALLOC_FL_PUNCH_HOLE
#define FALLOC_FL_PUNCH_HOLE 0x02
#endif

typedef int (*open_fn)(const char *, int, ...);
typedef int (*openat_fn)(int, const char *, int, ...);
typedef int (*fallocate_fn)(int, int, off_t, off_t);
typedef int (*close_fn)(int);

static int ram_fd = -1;

static void *next(const char *name) { return dlsym(RTLD_NEXT, name); }

static int is_ram(const char *path) {
    const char *ram = getenv("AENV_PRIVATE_RAM");
    return ram != NULL && *ram != '\0' && path != NULL && strcmp(path, ram) == 0;
}

static int wants_mode(int flags) {
    return (flags & O_CREAT) != 0 || (flags & O_TMPFILE) == O_TMPFILE;
}

static int read_only(const char *path, int flags) {
    return is_ram(path) ? (flags & ~O_ACCMODE) | O_RDONLY : flags;
}

static int remember(const char *path, int fd) {
    if (fd >= 0 && is_ram(path))
        ram_fd = fd;
    return fd;
}

#define MODE_ARG(flags, mode)              \
    mode_t mode = 0;                       \
    if (wants_mode(flags)) {               \
        va_list args;                      \
        va_start(args, flags);             \
        mode = va_arg(args, mode_t);       \
        va_end(args);                      \
    }

#define OPEN(name)                                                         \
    int name(const char *path, int flags, ...) {                           \
        static open_fn real;                                               \
        MODE_ARG(flags, mode)                                              \
        if (real == NULL)                                                  \
            real = (open_fn)next(#name);                                   \
        return remember(path, real(path, read_only(path, flags), mode));   \
    }

#define OPEN_FORTIFIED(name)                                               \
    int name(const char *path, int flags) {                                \
        static open_fn real;                                               \
        if (real == NULL)                                                  \
            real = (open_fn)next(#name);                                   \
        return remember(path, real(path, read_only(path, flags)));         \
    }

#define OPENAT(name)                                                              \
    int name(int dir, const char *path, int flags, ...) {                         \
        static openat_fn real;                                                    \
        MODE_ARG(flags, mode)                                                     \
        if (real == NULL)                                                         \
            real = (openat_fn)next(#name);                                        \
        return remember(path, real(dir, path, read_only(path, flags), mode));     \
    }

#define FALLOCATE(name)                                                    \
    int name(int fd, int how, off_t offset, off_t length) {                \
        static fallocate_fn real;                                          \
        if (fd >= 0 && fd == ram_fd && (how & FALLOC_FL_PUNCH_HOLE))       \
            return 0;                                                      \
        if (real == NULL)                                                  \
            real = (fallocate_fn)next(#name);                              \
        return real(fd, how, offset, length);                              \
    }

OPEN(open)
OPEN(open64)
OPEN_FORTIFIED(__open_2)
OPEN_FORTIFIED(__open64_2)
OPENAT(openat)
OPENAT(openat64)
FALLOCATE(fallocate)
FALLOCATE(fallocate64)

int close(int fd) {
    static close_fn real;
    if (real == NULL)
        real = (close_fn)next("close");
    if (fd >= 0 && fd == ram_fd)
        ram_fd = -1;
    return real(fd);
}
