// SPDX-License-Identifier: MIT
// Output files written whole or not at all: out_file.h.
#define _XOPEN_SOURCE 700 // realpath
#include "out_file.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int fail(const out_file *o, int err) {
    fprintf(stderr, "%s: cannot write %s: %s\n", o->prog, o->path,
            err ? strerror(err) : "write error");
    return -1;
}

// The regular file to replace for `path`: itself, or what its symlink names
// (so that a link is written through, not replaced). NULL where the target
// exists and is no regular file (write in place), or on error (*err set).
static char *replace_target(const char *path, int *err) {
    struct stat sb;
    *err = 0;
    if (stat(path, &sb) != 0) {
        if (errno != ENOENT) *err = errno;
        return *err ? NULL : strdup(path); // a new file
    }
    if (!S_ISREG(sb.st_mode)) return NULL;
    char *real = realpath(path, NULL);
    if (!real) *err = errno;
    return real;
}

int out_open(out_file *o, const char *prog, const char *path) {
    memset(o, 0, sizeof *o);
    o->prog = prog;
    o->path = path;
    if (!strcmp(path, "-")) {
        o->f = stdout;
        o->path = "stdout";
        return 0;
    }
    int err;
    o->target = replace_target(path, &err);
    if (err) return fail(o, err);
    if (!o->target) { // a device, a FIFO, ...: write in place
        o->f = fopen(path, "w");
        return o->f ? 0 : fail(o, errno);
    }
    const size_t n = strlen(o->target);
    o->tmp = malloc(n + sizeof ".tmp.XXXXXX");
    if (!o->tmp) return fail(o, ENOMEM);
    memcpy(o->tmp, o->target, n);
    memcpy(o->tmp + n, ".tmp.XXXXXX", sizeof ".tmp.XXXXXX");
    const int fd = mkstemp(o->tmp);
    if (fd < 0) { // a folder that takes no new file: the target in place, or why not
        free(o->tmp);
        free(o->target);
        o->tmp = o->target = NULL;
        o->f = fopen(path, "w");
        return o->f ? 0 : fail(o, errno);
    }
    // mkstemp makes it 0600: a replaced file keeps its mode, a new one is as
    // readable as any new file.
    struct stat old;
    const mode_t mask = umask(0);
    umask(mask);
    (void)fchmod(fd, stat(o->target, &old) == 0 ? old.st_mode & 07777 : 0666 & ~mask);
    o->f = fdopen(fd, "w");
    if (!o->f) {
        err = errno;
        close(fd);
        unlink(o->tmp);
        free(o->tmp);
        free(o->target);
        o->tmp = o->target = NULL;
        return fail(o, err);
    }
    return 0;
}

int out_close(out_file *o) {
    if (!o->f) return -1;
    int err = 0;
    errno = 0;
    // ferror: a write failed earlier even if the flush now succeeds.
    if (fflush(o->f) != 0 || ferror(o->f)) err = errno ? errno : EIO;
    if (o->f == stdout) {
        o->f = NULL;
        return err ? fail(o, err) : 0;
    }
    errno = 0;
    if (fclose(o->f) != 0 && !err) err = errno ? errno : EIO;
    o->f = NULL;
    if (!err && o->tmp && rename(o->tmp, o->target) != 0) err = errno;
    if (err && o->tmp) unlink(o->tmp);
    free(o->tmp);
    free(o->target);
    o->tmp = o->target = NULL;
    return err ? fail(o, err) : 0;
}

int out_check_stdout(const char *prog) {
    errno = 0;
    if (fflush(stdout) == 0 && !ferror(stdout)) return 0;
    const out_file o = {.prog = prog, .path = "stdout"};
    return fail(&o, errno ? errno : EIO);
}
