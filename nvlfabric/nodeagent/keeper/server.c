#include "server.h"

#include <errno.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "procs.h"
#include "protocol.h"

bool server_listen(struct server *s, const char *path, struct err *e)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    memset(s, 0, sizeof *s);
    s->fd = -1;
    if (strlen(path) >= sizeof addr.sun_path)
        return err_set(e, "%s: longer than a unix socket path may be", path);
    strcpy(addr.sun_path, path);
    if (unlink(path) != 0 && errno != ENOENT)
        return err_sys(e, errno, "cannot remove the old socket %s", path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(fd, 64) != 0) {
        int err = errno;
        if (fd >= 0)
            close(fd);
        return err_sys(e, err, "cannot listen on %s", path);
    }
    s->fd = fd;
    s->path = xstrdup(path);
    return true;
}

static void drop(struct server *s, size_t i)
{
    bool big = s->conns[i].in.cap > 64 * 1024;
    close(s->conns[i].fd);
    buf_free(&s->conns[i].in);
    s->conns[i] = s->conns[--s->nconns];
    if (big)
        malloc_trim(0); /* what a large request took goes back: the footprint stays the idle one */
}

void server_close(struct server *s)
{
    while (s->nconns)
        drop(s, 0);
    if (s->fd >= 0)
        close(s->fd);
    if (s->path)
        unlink(s->path);
    free(s->path);
    memset(s, 0, sizeof *s);
    s->fd = -1;
}

size_t server_pollfds(const struct server *s, struct pollfd *fds, double now, double *wait)
{
    size_t n = 0;
    for (size_t i = 0; i < s->nconns; i++) {
        fds[n++] = (struct pollfd){.fd = s->conns[i].fd, .events = POLLIN};
        double left = s->conns[i].deadline - now;
        if (left < *wait)
            *wait = left < 0 ? 0 : left;
    }
    /* at the limit, the listen backlog holds newcomers until a slot frees */
    fds[n++] = (struct pollfd){.fd = s->nconns < MAX_CONNS ? s->fd : -1, .events = POLLIN};
    return n;
}

static void send_reply(int fd, const char *p, size_t n)
{
    double deadline = monotonic_s() + WRITE_TIMEOUT_S;
    while (n) {
        ssize_t put = send(fd, p, n, MSG_NOSIGNAL);
        if (put > 0) {
            p += put;
            n -= (size_t)put;
        } else if (put < 0 && (errno == EAGAIN || errno == EINTR) && monotonic_s() < deadline) {
            struct pollfd pfd = {.fd = fd, .events = POLLOUT};
            poll(&pfd, 1, 100);
        } else {
            return; /* a client that does not read gets no more */
        }
    }
    shutdown(fd, SHUT_WR);
}

static void read_some(struct conn *c)
{
    char chunk[16384];
    while (!c->eof && c->in.n <= MAX_REQUEST_LINE) {
        ssize_t got = recv(c->fd, chunk, sizeof chunk, 0);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0 && errno == EAGAIN)
            return;
        if (got <= 0) {
            c->eof = true;
            return;
        }
        buf_put(&c->in, chunk, (size_t)got);
        if (memchr(chunk, '\n', (size_t)got))
            return;
    }
}

/* Answer the connection's request if it is complete: a line, or what came before EOF. */
static bool answer(struct conn *c, struct keeper *k)
{
    const char *nl = c->in.n ? memchr(c->in.p, '\n', c->in.n) : NULL;
    size_t len = nl ? (size_t)(nl - c->in.p) + 1 : c->in.n;
    if (!nl && !c->eof && c->in.n <= MAX_REQUEST_LINE)
        return false;
    struct buf reply = {0};
    if (len > MAX_REQUEST_LINE)
        encode_reply(&reply, "bad request: longer than 1 MiB", NULL, NULL, 0);
    else
        keeper_handle_line(k, buf_str(&c->in), len, &reply);
    send_reply(c->fd, reply.p, reply.n);
    buf_free(&reply);
    return true;
}

void server_service(struct server *s, const struct pollfd *fds, size_t nfds, struct keeper *k)
{
    /* the connections' descriptors come first, in conns order (server_pollfds); drop() moves the
     * last connection into a freed slot, so they are visited from the end */
    bool listener = nfds && fds[nfds - 1].fd >= 0 && fds[nfds - 1].revents;
    for (size_t i = s->nconns < nfds ? s->nconns : nfds; i-- > 0;) {
        struct conn *c = &s->conns[i];
        if (fds[i].revents)
            read_some(c);
        if (answer(c, k) || monotonic_s() >= c->deadline)
            drop(s, i);
    }
    while (listener && s->nconns < MAX_CONNS) {
        int fd = accept4(s->fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0)
            break;
        struct conn *c = &s->conns[s->nconns++];
        *c = (struct conn){.fd = fd, .deadline = monotonic_s() + READ_TIMEOUT_S};
        read_some(c); /* most clients have sent their line by now */
        if (answer(c, k))
            drop(s, s->nconns - 1);
    }
}
