#include "domain.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "files.h"
#include "members.h"
#include "procs.h"

#define LOG_TAIL_LINES 5
#define LOG_TAIL_WINDOW (64 * 1024) /* a daemon's log grows for its whole life; a few lines are wanted */

struct domain *domain_new(const char *workdir, const char *id, struct imex_config *cfg)
{
    struct domain *d = xcalloc(1, sizeof *d);
    d->id = xstrdup(id);
    d->dir = path_join(workdir, id);
    d->config_path = path_join(d->dir, "config.cfg");
    d->nodes_path = path_join(d->dir, "nodes.cfg");
    d->log_path = path_join(d->dir, "imex.log");
    d->pid_path = path_join(d->dir, "imex.pid");
    d->cfg = *cfg;
    memset(cfg, 0, sizeof *cfg);
    return d;
}

static void set_members(struct domain *d, char **members, size_t n)
{
    for (size_t i = 0; i < d->nmembers; i++)
        free(d->members[i]);
    free(d->members);
    d->members = members;
    d->nmembers = n;
}

void domain_free(struct domain *d)
{
    if (!d)
        return;
    set_members(d, NULL, 0);
    config_free(&d->cfg);
    buf_free(&d->tls_loaded);
    free(d->id);
    free(d->dir);
    free(d->config_path);
    free(d->nodes_path);
    free(d->log_path);
    free(d->pid_path);
    free(d);
}

pid_t domain_pid(const struct domain *d)
{
    return d->child ? d->child : d->adopted;
}

void domain_child_exited(struct domain *d, int status)
{
    d->child_done = true;
    d->child_code = exit_code(status);
}

bool domain_poll(struct domain *d, int *code)
{
    if (d->child) {
        int status;
        pid_t got = d->child_done ? 0 : waitpid(d->child, &status, WNOHANG);
        if (got == d->child)
            domain_child_exited(d, status);
        else if (got < 0 && errno == ECHILD) /* reaped, yet not by us: its status is lost */
            d->child_done = true;
        *code = d->child_code;
        return d->child_done;
    }
    *code = 255; /* not our child: gone, with a status only its parent saw */
    return d->adopted && !pid_alive(d->adopted);
}

static bool running(struct domain *d)
{
    int code;
    return domain_pid(d) && !domain_poll(d, &code);
}

/* A TLS domain's three credential files (written by the agent), joined by NUL bytes; empty while
 * one is missing. Their contents, not a hash: exact, and a few KB. */
static bool credentials(const struct domain *d, struct buf *out, struct err *e)
{
    static const char *const files[] = {TLS_KEY, TLS_CERT, TLS_CA};
    out->n = 0;
    for (size_t i = 0; i < ARRAY_LEN(files); i++) {
        char *path = path_join(d->dir, files[i]);
        if (i)
            buf_putc(out, '\0');
        int err = read_file(path, out);
        if (err)
            out->n = 0;
        if (err && err != ENOENT)
            err_sys(e, err, "IMEX domain %s: cannot read %s", d->id, path);
        free(path);
        if (err)
            return err == ENOENT;
    }
    return true;
}

/* Bind a socket to the port as the daemon will (SO_REUSEADDR: TIME_WAIT is no conflict), so that a
 * clash is named here rather than found in the daemon's log. */
static bool port_free(const struct domain *d, int port, const char *what, struct err *e)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    int gai = getaddrinfo(d->cfg.bind_address, service, &hints, &res), fd = -1, one = 1, err = 0;
    const char *why = gai == 0 ? NULL : gai == EAI_SYSTEM ? strerror(errno) : gai_strerror(gai);
    if (gai == 0) {
        fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
            bind(fd, res->ai_addr, res->ai_addrlen) != 0)
            err = errno;
        if (fd >= 0)
            close(fd);
        freeaddrinfo(res);
        why = err ? strerror(err) : NULL;
    }
    if (!why)
        return true;
    const char *v6 = strchr(d->cfg.bind_address, ':');
    return err_set(e,
                   "IMEX domain %s: the %s %s%s%s:%d is not free (%s); another IMEX domain on this node uses the "
                   "same port slot, or another program holds the port",
                   d->id, what, v6 ? "[" : "", d->cfg.bind_address, v6 ? "]" : "", port, why);
}

bool kill_stale(const char *config_path, const char *pid_path, pid_t own, struct err *e)
{
    pid_t *pids;
    size_t n = daemons_using(config_path, &pids), kept = 0;
    for (size_t i = 0; i < n; i++)
        if (pids[i] != own)
            pids[kept++] = pids[i];
    terminate(pids, kept, STOP_TIMEOUT_S);
    free(pids);
    return unlink_missing_ok(pid_path, e);
}

static bool write_pid(struct domain *d, pid_t pid, struct err *e)
{
    char text[32];
    bool written;
    int n = snprintf(text, sizeof text, "%d\n", (int)pid);
    return write_if_changed(d->pid_path, text, (size_t)n, &written, e);
}

static bool start(struct domain *d, const char *binary, struct err *e)
{
    if (access(binary, X_OK) != 0)
        return err_set(e, "IMEX domain %s: %s is missing or not executable (--driver-root / $DRIVER_ROOT names the "
                          "driver's root)",
                       d->id, binary);
    d->child = d->adopted = 0; /* the last one is gone (running() said so) */
    d->child_done = false;
    if (!kill_stale(d->config_path, d->pid_path, 0, e) ||
        !port_free(d, d->cfg.server_port, "IMEX peer port (SERVER_PORT)", e) ||
        !port_free(d, d->cfg.cmd_port, "IMEX command port (IMEX_CMD_PORT)", e))
        return false;
    struct buf old = {0};
    buf_printf(&old, "%s.1", d->log_path); /* the previous run's log is kept, one generation */
    bool ok = rename(d->log_path, buf_str(&old)) == 0 || errno == ENOENT ||
              err_sys(e, errno, "IMEX domain %s: cannot rename %s", d->id, d->log_path);
    buf_free(&old);
    if (!ok || (*d->cfg.tls_target && !credentials(d, &d->tls_loaded, e)))
        return false;
    int log_fd = open(d->log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0)
        return err_sys(e, errno, "IMEX domain %s: cannot open %s", d->id, d->log_path);
    pid_t pid;
    struct err why = {0};
    ok = spawn_daemon(binary, d->config_path, log_fd, &pid, &why);
    close(log_fd);
    if (!ok) {
        err_set(e, "IMEX domain %s: %s", d->id, why.msg);
        err_clear(&why);
        return false;
    }
    d->child = pid;
    return write_pid(d, pid, e);
}

static bool write_nodes(struct domain *d, char *const *members, size_t n, bool *changed, struct err *e)
{
    struct buf text = {0};
    render_nodes(members, n, &text);
    bool ok = write_if_changed(d->nodes_path, text.p, text.n, changed, e);
    buf_free(&text);
    if (!ok)
        return false;
    char **copy = xcalloc(n, sizeof *copy);
    for (size_t i = 0; i < n; i++)
        copy[i] = xstrdup(members[i]);
    set_members(d, copy, n);
    return true;
}

bool domain_run(struct domain *d, const char *imex_binary, char *const *members, size_t n, const char **done,
                struct err *e)
{
    bool changed;
    *done = NULL;
    if (!running(d)) {
        struct buf config = {0};
        config_render(&d->cfg, d->id, d->dir, &config);
        bool ok = write_if_changed(d->config_path, config.p, config.n, &changed, e) &&
                  write_nodes(d, members, n, &changed, e) && start(d, imex_binary, e);
        buf_free(&config);
        *done = ok ? "started" : NULL;
        return ok;
    }
    /* The daemon re-reads its nodes file and credentials on SIGUSR1, keeping its links and the
     * NVLink imports made through it; its config it reads only at start. */
    if (!write_nodes(d, members, n, &changed, e))
        return false;
    if (changed) {
        kill(domain_pid(d), SIGUSR1);
        *done = "members changed";
        return true;
    }
    if (!*d->cfg.tls_target)
        return true;
    struct buf now = {0};
    bool ok = credentials(d, &now, e);
    if (ok && now.n && !(now.n == d->tls_loaded.n && memcmp(now.p, d->tls_loaded.p, now.n) == 0)) {
        kill(domain_pid(d), SIGUSR1);
        buf_free(&d->tls_loaded);
        d->tls_loaded = now;
        now = (struct buf){0};
        *done = "credentials changed";
    }
    buf_free(&now);
    return ok;
}

bool domain_stop(struct domain *d, bool *has_code, int *code, struct err *e)
{
    pid_t child = d->child, adopted = d->adopted;
    *has_code = child != 0;
    *code = d->child_code;
    if (adopted) /* not our child: watched through /proc */
        terminate(&adopted, 1, STOP_TIMEOUT_S);
    if (child && !d->child_done) {
        int status = 0;
        pid_t got = waitpid(child, &status, WNOHANG);
        if (got == 0) {
            kill(child, SIGTERM);
            for (double deadline = monotonic_s() + STOP_TIMEOUT_S;
                 (got = waitpid(child, &status, WNOHANG)) == 0 && monotonic_s() < deadline;)
                sleep_s(0.01);
        }
        if (got == 0) {
            kill(child, SIGKILL);
            while ((got = waitpid(child, &status, 0)) < 0 && errno == EINTR) {
            }
        }
        *code = got == child ? exit_code(status) : 0;
    }
    d->child = d->adopted = 0;
    d->child_done = false;
    return unlink_missing_ok(d->pid_path, e);
}

bool domain_adopt(struct domain *d, pid_t pid, char **members, size_t n, struct err *e)
{
    d->adopted = pid;
    set_members(d, members, n);
    return (!*d->cfg.tls_target || credentials(d, &d->tls_loaded, e)) && write_pid(d, pid, e);
}

void domain_log_tail(const struct domain *d, struct buf *out)
{
    int fd = open(d->log_path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        if (fd >= 0)
            close(fd);
        buf_puts(out, "(no log)");
        return;
    }
    off_t from = st.st_size > LOG_TAIL_WINDOW ? st.st_size - LOG_TAIL_WINDOW : 0;
    char *text = xmalloc(LOG_TAIL_WINDOW + 1);
    ssize_t got = pread(fd, text, LOG_TAIL_WINDOW, from);
    close(fd);
    size_t n = got > 0 ? (size_t)got : 0, start = 0;
    if (from) { /* the first line is cut: not shown */
        const char *nl = memchr(text, '\n', n);
        start = nl ? (size_t)(nl - text) + 1 : n;
    }
    while (n > start && (text[n - 1] == '\n' || text[n - 1] == '\r' || text[n - 1] == ' ' || text[n - 1] == '\t'))
        n--;
    size_t first = n, lines = 0; /* back to the start of the last LOG_TAIL_LINES lines */
    while (first > start && lines < LOG_TAIL_LINES)
        if (text[--first] == '\n' && ++lines == LOG_TAIL_LINES)
            first++;
    while (first < n && (text[first] == '\n' || text[first] == ' ' || text[first] == '\t'))
        first++;
    if (first == n)
        buf_puts(out, "(empty log)");
    for (size_t i = first; i < n; i++) {
        if (text[i] == '\n')
            buf_puts(out, " | ");
        else if (text[i] != '\r')
            buf_putc(out, text[i]);
    }
    free(text);
}
