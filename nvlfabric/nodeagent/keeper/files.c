#include "files.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

char *path_normalize(const char *p)
{
    struct buf b = {0};
    if (*p == '/')
        buf_putc(&b, '/');
    size_t root = b.n;
    for (const char *s = p; *s;) {
        while (*s == '/')
            s++;
        size_t n = strcspn(s, "/");
        if (n && !(n == 1 && *s == '.')) {
            if (b.n > root)
                buf_putc(&b, '/');
            buf_put(&b, s, n);
        }
        s += n;
    }
    if (b.n == 0)
        buf_putc(&b, '.');
    return buf_take(&b);
}

char *path_join(const char *base, const char *name)
{
    struct buf b = {0};
    buf_puts(&b, base);
    if (b.n == 0 || b.p[b.n - 1] != '/')
        buf_putc(&b, '/');
    buf_puts(&b, name);
    return buf_take(&b);
}

bool is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int read_file(const char *path, struct buf *out)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno;
    char chunk[8192];
    for (;;) {
        ssize_t got = read(fd, chunk, sizeof chunk);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            int err = got < 0 ? errno : 0;
            close(fd);
            return err;
        }
        buf_put(out, chunk, (size_t)got);
    }
}

/* Whether the file holds exactly data[0..n): its size first, so a large file is not read. */
static int holds(const char *path, const char *data, size_t n, bool *same)
{
    struct stat st;
    *same = false;
    if (stat(path, &st) != 0)
        return errno;
    if ((size_t)st.st_size != n)
        return 0;
    struct buf now = {0};
    int err = read_file(path, &now);
    *same = !err && now.n == n && (n == 0 || memcmp(now.p, data, n) == 0);
    buf_free(&now);
    return err;
}

static bool write_all(int fd, const char *data, size_t n)
{
    while (n) {
        ssize_t put = write(fd, data, n);
        if (put < 0 && errno == EINTR)
            continue;
        if (put < 0)
            return false;
        data += put;
        n -= (size_t)put;
    }
    return true;
}

static bool atomic_write(const char *path, const char *data, size_t n, struct err *e)
{
    const char *slash = strrchr(path, '/');
    char *dir = slash ? xmemdup(path, slash == path ? 1 : (size_t)(slash - path)) : xstrdup(".");
    const char *name = slash ? slash + 1 : path;
    struct buf tmp = {0};
    int fd = -1;
    while (fd < 0) {
        unsigned char rnd[6] = {0};
        if (getrandom(rnd, sizeof rnd, 0) < 0 && errno != EINTR) {
            err_sys(e, errno, "getrandom");
            break;
        }
        tmp.n = 0;
        buf_printf(&tmp, "%s/.%s.%02x%02x%02x%02x%02x%02x.tmp", dir, name, rnd[0], rnd[1], rnd[2], rnd[3], rnd[4],
                   rnd[5]);
        fd = open(buf_str(&tmp), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0 && errno != EEXIST) {
            err_sys(e, errno, "cannot create %s", buf_str(&tmp));
            break;
        }
    }
    bool ok = fd >= 0;
    if (ok && !(write_all(fd, data, n) && fchmod(fd, 0644) == 0 && fsync(fd) == 0))
        ok = err_sys(e, errno, "cannot write %s", buf_str(&tmp));
    if (fd >= 0 && close(fd) != 0 && ok)
        ok = err_sys(e, errno, "cannot write %s", buf_str(&tmp));
    if (ok && rename(buf_str(&tmp), path) != 0)
        ok = err_sys(e, errno, "cannot rename %s to %s", buf_str(&tmp), path);
    if (fd >= 0 && !ok)
        unlink(buf_str(&tmp));
    if (ok) { /* the rename itself must survive a crash of the node */
        int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0 || fsync(dfd) != 0)
            ok = err_sys(e, errno, "cannot sync directory %s", dir);
        if (dfd >= 0)
            close(dfd);
    }
    buf_free(&tmp);
    free(dir);
    return ok;
}

bool write_if_changed(const char *path, const char *data, size_t n, bool *written, struct err *e)
{
    bool same;
    int err = holds(path, data, n, &same);
    *written = false;
    if (err && err != ENOENT)
        return err_sys(e, err, "cannot read %s", path);
    if (same)
        return true;
    const char *slash = strrchr(path, '/');
    if (slash && slash != path) {
        char *dir = xmemdup(path, (size_t)(slash - path));
        bool ok = mkdir_parents(dir, e);
        free(dir);
        if (!ok)
            return false;
    }
    if (!atomic_write(path, data, n, e))
        return false;
    *written = true;
    return true;
}

bool unlink_missing_ok(const char *path, struct err *e)
{
    if (unlink(path) == 0 || errno == ENOENT)
        return true;
    return err_sys(e, errno, "cannot remove %s", path);
}

bool mkdir_parents(const char *path, struct err *e)
{
    char *p = xstrdup(path);
    bool ok = true;
    for (char *s = p + 1; ok; s++) {
        if (*s != '/' && *s != '\0')
            continue;
        char c = *s;
        *s = '\0';
        if (mkdir(p, 0755) != 0 && errno != EEXIST)
            ok = err_sys(e, errno, "cannot create directory %s", p);
        else if (!is_dir(p))
            ok = err_set(e, "cannot create directory %s: a file of that name is in the way", p);
        *s = c;
        if (!c)
            break;
    }
    free(p);
    return ok;
}

/* Depth first through directory descriptors opened with O_NOFOLLOW: a symbolic link anywhere, also
 * one swapped in during the walk, is unlinked as an entry and never entered. */
#define REMOVE_MAX_DEPTH 64

static void remove_at(int fd, int depth)
{
    DIR *dir = fdopendir(fd);
    if (!dir) {
        close(fd);
        return;
    }
    struct dirent *ent;
    while ((ent = readdir(dir)) != NULL) {
        if (strcmp(ent->d_name, ".") == 0 || strcmp(ent->d_name, "..") == 0)
            continue;
        if (unlinkat(dirfd(dir), ent->d_name, 0) == 0 || (errno != EISDIR && errno != EPERM))
            continue;
        int sub = depth < REMOVE_MAX_DEPTH
                      ? openat(dirfd(dir), ent->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
                      : -1;
        if (sub >= 0)
            remove_at(sub, depth + 1);
        unlinkat(dirfd(dir), ent->d_name, AT_REMOVEDIR);
    }
    closedir(dir);
}

void remove_tree(const char *top)
{
    int fd = open(top, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        unlink(top); /* a link (to a directory or not) or a file: it goes, what it points at stays */
        return;
    }
    remove_at(fd, 0);
    rmdir(top);
}
