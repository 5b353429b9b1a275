/* nvidia-imex stand-in for the nvlfabric GB200 simulator.
 *
 * One single-threaded poll loop: a peer listener on <node address>:SERVER_PORT, one outbound TCP link
 * to every other entry of the nodes file (retried every 500 ms), the command service for
 * nvidia-imex-ctl on IMEX_CMD_BIND_INTERFACE_IP:IMEX_CMD_PORT (and/or IMEX_CMD_UNIX_DOMAIN_PATH), and
 * signals (SIGTERM/SIGINT stop, SIGUSR1 re-reads the nodes file). Protocol: sim/imex/README.md.
 *
 * With IMEX_ENABLE_AUTH_ENCRYPTION=1 every peer link is mutual TLS (OpenSSL 3): the dialer is the TLS
 * client, the acceptor the server; the handshake is driven from the same poll loop and the line
 * protocol then runs inside the TLS session. SIGUSR1 also re-reads the credential files. */
#include "imex_common.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define RETRY_MS 500           /* redial an unreachable peer */
#define MISMATCH_RETRY_MS 1000 /* redial after a map/version mismatch */
#define CONNECT_TIMEOUT_MS 2000
#define HELLO_TIMEOUT_MS 3000
#define KEEPALIVE_MS 2000       /* the dialer's STATUS on every established link (answered by a STATUS) */
#define PEER_TIMEOUT_MS 6000    /* no line from an established peer for this long: link lost */
#define INBOUND_IDLE_MS 15000
#define CMD_TIMEOUT_MS 5000
#define MAX_LINE 65536
#define MAX_INBOUND (4 * IMEX_MAX_NODES)
#define MAX_CMD_CLIENTS 64

enum { LL_FATAL = 1, LL_ERROR = 2, LL_WARN = 3, LL_INFO = 4, LL_DEBUG = 5 };
enum { LINK_IDLE, LINK_CONNECTING, LINK_TLS, LINK_HELLO, LINK_UP };

struct buf {
    char *p;
    size_t len, cap;
};

struct conn {
    int fd;
    struct buf in, out;
    size_t out_off;
    SSL *ssl;         /* NULL on plaintext links and command clients */
    bool want_write;  /* the last TLS operation needs the socket writable before it can go on */
    bool read_blocks_write; /* SSL_write is waiting for data from the peer: POLLOUT would spin */
    bool tls_fatal;   /* a fatal TLS error: no close_notify may be sent */
};

struct peer {
    char *name;
    bool literal, resolved;
    struct in_addr addr;
    char ip[INET_ADDRSTRLEN];
    int status;           /* enum imex_conn: what this node reports for the link to the peer */
    bool ever_connected;
    int64_t lost_at;
    int link;
    struct conn c;
    int64_t next_attempt, deadline, last_rx;
    int remote_state;     /* the peer's node state from its heartbeats, -1 unknown */
    char *remote_row;     /* the peer's connection row (wire codes), NULL unknown */
    char remote_host[64];
    char remote_version[32];
};

struct inbound {
    struct conn c;
    int64_t last_rx;
    int64_t hs_deadline;  /* TLS: the handshake must be done by then */
    bool got_hello, close_after_flush, tls_up;
    struct sockaddr_in from;
};

struct cmdcli {
    struct conn c;
    int64_t deadline;
    bool responded;
};

static struct {
    struct imex_config cfg;
    const char *config_path;
    FILE *log;
    int state;
    struct in_addr self_addr;
    char self_ip[INET_ADDRSTRLEN];
    int self_idx;
    char hostname[64];
    uint64_t map_hash;
    size_t n;
    struct peer *peers;
    struct inbound *in;
    size_t nin, capin;
    struct cmdcli *cmd;
    size_t ncmd, capcmd;
    int listen_fd, cmd_fd, unix_fd;
    unsigned char *last_matrix;
    size_t last_n;
    int64_t ready_at;
    int64_t next_keepalive;
    bool dirty; /* our state or row changed: push a STATUS to every dialer */
    SSL_CTX *tls_server, *tls_client; /* IMEX_ENABLE_AUTH_ENCRYPTION=1: contexts for new links */
} D = {.listen_fd = -1, .cmd_fd = -1, .unix_fd = -1, .self_idx = -1};

static volatile sig_atomic_t got_term, got_usr1;

/* ------------------------------------------------------------------------------------------------ */
/* Logging                                                                                         */

static void logmsg(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void logmsg(int level, const char *fmt, ...)
{
    static const char *const names[] = {"NONE", "FATAL", "ERROR", "WARN", "INFO", "DEBUG"};
    if (level > D.cfg.log_level || !D.log)
        return;
    char ts[64];
    imex_timestamp(ts, sizeof ts);
    va_list ap;
    va_start(ap, fmt);
    fprintf(D.log, "[%s] [%s] [pid %d] ", ts, names[level], (int)getpid());
    vfprintf(D.log, fmt, ap);
    fputc('\n', D.log);
    fflush(D.log);
    va_end(ap);
}

static void set_state(int st)
{
    if (st == D.state)
        return;
    logmsg(LL_INFO, "node state %s -> %s", imex_state_name(D.state), imex_state_name(st));
    D.state = st;
    D.dirty = true;
}

/* ------------------------------------------------------------------------------------------------ */
/* Buffers and connections                                                                          */

static int buf_append(struct buf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->len + n + 1)
            nc *= 2;
        char *np = realloc(b->p, nc);
        if (!np)
            return -1;
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
    return 0;
}

static void buf_printf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void buf_printf(struct buf *b, const char *fmt, ...)
{
    char tmp[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof tmp) {
        buf_append(b, tmp, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big)
        return;
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    buf_append(b, big, (size_t)n);
    free(big);
}

static void buf_free(struct buf *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

static void conn_init(struct conn *c, int fd)
{
    memset(c, 0, sizeof *c);
    c->fd = fd;
}

static void conn_close(struct conn *c)
{
    if (c->ssl) {
        /* One close_notify, best effort: the peer then sees a clean end rather than a truncation.
         * Not after a fatal error (OpenSSL forbids it) nor during a handshake. */
        if (!c->tls_fatal && SSL_is_init_finished(c->ssl))
            (void)SSL_shutdown(c->ssl);
        SSL_free(c->ssl);
        c->ssl = NULL;
        ERR_clear_error();
    }
    c->want_write = c->read_blocks_write = c->tls_fatal = false;
    if (c->fd >= 0) {
        /* Drain what the other side sent, so that close() sends FIN (not RST) and our last line
         * (e.g. "BYE RELOAD") reaches the peer. */
        char tmp[4096];
        while (recv(c->fd, tmp, sizeof tmp, MSG_DONTWAIT) > 0)
            ;
        close(c->fd);
    }
    c->fd = -1;
    buf_free(&c->in);
    buf_free(&c->out);
    c->out_off = 0;
}

static bool conn_pending(const struct conn *c)
{
    return c->out.len > c->out_off;
}

/* ------------------------------------------------------------------------------------------------ */
/* TLS I/O                                                                                          */

/* The reason of the last TLS failure, for the log and the peer status. Single-threaded, and every
 * caller consumes it right after the failing call, so one buffer serves all connections. */
static char tls_err[256];

/* Fills tls_err from OpenSSL's error queue (first error: the root cause), the verify result for
 * certificate failures, or errno for a failed system call; then clears the queue. */
static void tls_note_error(struct conn *c, int sslerr)
{
    unsigned long e = ERR_get_error();
    int saved = errno;
    if (c)
        c->tls_fatal = sslerr == SSL_ERROR_SSL || sslerr == SSL_ERROR_SYSCALL;
    if (e) {
        const char *r = ERR_reason_error_string(e);
        char tmp[128];
        if (!r) {
            ERR_error_string_n(e, tmp, sizeof tmp);
            r = tmp;
        }
        long vr = c && c->ssl ? SSL_get_verify_result(c->ssl) : X509_V_OK;
        if (ERR_GET_REASON(e) == SSL_R_CERTIFICATE_VERIFY_FAILED && vr != X509_V_OK)
            snprintf(tls_err, sizeof tls_err, "%s: %s", r, X509_verify_cert_error_string(vr));
        else
            snprintf(tls_err, sizeof tls_err, "%s", r);
    } else if (sslerr == SSL_ERROR_SYSCALL && saved) {
        snprintf(tls_err, sizeof tls_err, "%s", strerror(saved));
    } else if (sslerr == SSL_ERROR_ZERO_RETURN) {
        snprintf(tls_err, sizeof tls_err, "peer closed the TLS session");
    } else {
        snprintf(tls_err, sizeof tls_err, "connection closed by peer");
    }
    ERR_clear_error();
}

/* Drives SSL_connect/SSL_accept one step: 1 done, 0 waiting for the socket, -1 failed (tls_err). */
static int conn_handshake(struct conn *c)
{
    ERR_clear_error();
    int r = SSL_do_handshake(c->ssl);
    c->want_write = false;
    if (r == 1)
        return 1;
    int e = SSL_get_error(c->ssl, r);
    if (e == SSL_ERROR_WANT_READ)
        return 0;
    if (e == SSL_ERROR_WANT_WRITE) {
        c->want_write = true;
        return 0;
    }
    tls_note_error(c, e);
    return -1;
}

/* Poll events a connection needs: always readable; writable when output waits (unless TLS is
 * waiting for the peer first, where POLLOUT would only spin) or TLS asked for it. */
static short conn_events(const struct conn *c)
{
    bool out = c->out.len > c->out_off;
    if (c->ssl && c->read_blocks_write)
        out = false;
    return (short)(POLLIN | (out || c->want_write ? POLLOUT : 0));
}

/* Writes what it can; -1 on a broken connection. */
static int conn_flush(struct conn *c)
{
    if (c->ssl) {
        c->want_write = c->read_blocks_write = false;
        while (conn_pending(c)) {
            ERR_clear_error();
            /* The buffer may move and grow between retries: SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER and
             * SSL_MODE_ENABLE_PARTIAL_WRITE are set on both contexts. */
            size_t n = c->out.len - c->out_off;
            int w = SSL_write(c->ssl, c->out.p + c->out_off, n > (1u << 30) ? (1 << 30) : (int)n);
            if (w > 0) {
                c->out_off += (size_t)w;
                continue;
            }
            int e = SSL_get_error(c->ssl, w);
            if (e == SSL_ERROR_WANT_WRITE) {
                c->want_write = true;
                return 0;
            }
            if (e == SSL_ERROR_WANT_READ) {
                c->read_blocks_write = true;
                return 0;
            }
            tls_note_error(c, e);
            return -1;
        }
        c->out.len = c->out_off = 0;
        return 0;
    }
    while (conn_pending(c)) {
        ssize_t w = send(c->fd, c->out.p + c->out_off, c->out.len - c->out_off, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return 0;
            return -1;
        }
        c->out_off += (size_t)w;
    }
    c->out.len = c->out_off = 0;
    return 0;
}

static int conn_send(struct conn *c, const char *s, size_t n)
{
    if (buf_append(&c->out, s, n))
        return -1;
    return conn_flush(c);
}

/* Reads what is available. 1 data read, 0 nothing yet, -1 closed or failed. */
static int conn_read(struct conn *c, size_t max)
{
    char tmp[4096];
    int got = 0;
    if (c->ssl) {
        /* Until WANT_READ: that also empties what OpenSSL has buffered (SSL_pending), which poll()
         * cannot see. */
        for (;;) {
            ERR_clear_error();
            int r = SSL_read(c->ssl, tmp, sizeof tmp);
            if (r > 0) {
                if (c->in.len + (size_t)r > max || buf_append(&c->in, tmp, (size_t)r)) {
                    snprintf(tls_err, sizeof tls_err, "line too long");
                    return -1;
                }
                got = 1;
                continue;
            }
            int e = SSL_get_error(c->ssl, r);
            if (e == SSL_ERROR_WANT_READ)
                return got;
            if (e == SSL_ERROR_WANT_WRITE) {
                c->want_write = true;
                return got;
            }
            tls_note_error(c, e);
            return -1;
        }
    }
    for (;;) {
        ssize_t r = recv(c->fd, tmp, sizeof tmp, 0);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return got;
            return -1;
        }
        if (r == 0)
            return -1;
        if (c->in.len + (size_t)r > max || buf_append(&c->in, tmp, (size_t)r))
            return -1;
        got = 1;
    }
}

/* Pops one '\n'-terminated line into `line` (at most cap-1 bytes, longer lines are cut). */
static bool conn_line(struct conn *c, char *line, size_t cap)
{
    if (!c->in.len)
        return false;
    char *nl = memchr(c->in.p, '\n', c->in.len);
    if (!nl)
        return false;
    size_t n = (size_t)(nl - c->in.p);
    size_t cp = n < cap - 1 ? n : cap - 1;
    memcpy(line, c->in.p, cp);
    line[cp] = '\0';
    if (cp && line[cp - 1] == '\r')
        line[cp - 1] = '\0';
    memmove(c->in.p, nl + 1, c->in.len - n - 1);
    c->in.len -= n + 1;
    return true;
}

/* ------------------------------------------------------------------------------------------------ */
/* Peer protocol                                                                                   */

static int lost_status(void)
{
    return D.cfg.grace_time == 0 ? CS_DISCONNECTED : CS_RECOVERING;
}

static void set_peer_status(struct peer *p, int st, const char *why)
{
    if (p->status == st)
        return;
    int lvl = (st == CS_CONNECTED || st == CS_NEVER_CONNECTED) ? LL_INFO : LL_WARN;
    logmsg(lvl, "peer %s (%s): %s -> %s%s%s", p->name, p->ip, imex_conn_name(p->status), imex_conn_name(st),
           why ? ": " : "", why ? why : "");
    p->status = st;
    D.dirty = true;
}

static void peer_drop_remote(struct peer *p)
{
    free(p->remote_row);
    p->remote_row = NULL;
    p->remote_state = -1;
}

static void peer_close(struct peer *p)
{
    conn_close(&p->c);
    p->link = LINK_IDLE;
    peer_drop_remote(p);
}

/* The link to p broke or could not be made. */
static void peer_fail(struct peer *p, int64_t now, const char *why)
{
    logmsg(LL_DEBUG, "peer %s (%s): link down: %s", p->name, p->ip, why);
    peer_close(p);
    p->next_attempt = now + RETRY_MS;
    switch (p->status) {
    case CS_RECOVERING:
    case CS_DISCONNECTED:
        break;
    case CS_CONNECTED:
        p->lost_at = now;
        set_peer_status(p, lost_status(), why);
        break;
    default:
        if (p->ever_connected) {
            p->lost_at = now;
            set_peer_status(p, lost_status(), why);
        } else {
            set_peer_status(p, CS_NEVER_CONNECTED, NULL);
        }
    }
}

/* The TLS handshake with p failed, or p refused us right after it: AUTHENTICATING, retried like a
 * mismatch. A link that was up (e.g. redialled after a reload, now with credentials the peer does not
 * accept) is first lost as usual, so the log shows both steps. */
static void peer_auth_fail(struct peer *p, int64_t now, const char *why)
{
    char msg[320];
    snprintf(msg, sizeof msg, "TLS handshake failed: %s", why);
    logmsg(LL_DEBUG, "peer %s (%s): %s", p->name, p->ip, msg);
    peer_close(p);
    p->next_attempt = now + MISMATCH_RETRY_MS;
    if (p->status == CS_CONNECTED) {
        p->lost_at = now;
        set_peer_status(p, lost_status(), "link lost (re-authentication follows)");
    }
    set_peer_status(p, CS_AUTHENTICATING, msg);
}

static const char *self_row(char *row, size_t cap)
{
    size_t i = 0;
    for (; i < D.n && i + 1 < cap; i++)
        row[i] = (int)i == D.self_idx ? 'C' : imex_conn_wire(D.peers[i].status);
    if (i == 0)
        row[i++] = '-';
    row[i] = '\0';
    return row;
}

static void send_status(struct conn *c)
{
    char *row = malloc(D.n + 2);
    if (!row)
        return;
    struct buf b = {0};
    buf_printf(&b, "STATUS %s %s\n", imex_state_name(D.state), self_row(row, D.n + 2));
    if (b.p)
        conn_send(c, b.p, b.len);
    buf_free(&b);
    free(row);
}

static void send_hello(struct conn *c)
{
    char line[512];
    int n = snprintf(line, sizeof line, "%s HELLO %s %016llx %zu %d %s %s\n", IMEX_PROTO, imex_version(),
                     (unsigned long long)D.map_hash, D.n, D.self_idx, D.self_ip, D.hostname);
    conn_send(c, line, (size_t)n);
}

struct hello {
    char version[32];
    unsigned long long hash;
    long n, idx;
    char ip[INET_ADDRSTRLEN];
    char host[64];
};

static bool parse_hello(const char *line, struct hello *h)
{
    char tag[16], word[16], hashs[24];
    memset(h, 0, sizeof *h);
    if (sscanf(line, "%15s %15s %31s %23s %ld %ld %15s %63s", tag, word, h->version, hashs, &h->n, &h->idx,
               h->ip, h->host) != 8)
        return false;
    if (strcmp(tag, IMEX_PROTO) || strcmp(word, "HELLO"))
        return false;
    char *end;
    h->hash = strtoull(hashs, &end, 16);
    return *end == '\0';
}

static bool same_major(const char *a, const char *b)
{
    size_t la = strcspn(a, "."), lb = strcspn(b, ".");
    return la == lb && !memcmp(a, b, la);
}

/* One step of the client handshake; when it completes, the hello follows inside TLS. The first step
 * can already complete (a fast acceptor answers while SSL_connect still reads), so every caller
 * must go through here. */
static void peer_tls_step(struct peer *p, int64_t now)
{
    int h = conn_handshake(&p->c);
    if (h < 0) {
        peer_auth_fail(p, now, tls_err);
        return;
    }
    if (h == 0)
        return;
    logmsg(LL_DEBUG, "peer %s (%s): TLS handshake done (%s, %s)", p->name, p->ip, SSL_get_version(p->c.ssl),
           SSL_get_cipher_name(p->c.ssl));
    p->link = LINK_HELLO;
    p->deadline = now + HELLO_TIMEOUT_MS;
    send_hello(&p->c);
}

/* The TCP connection to p is up: start TLS (then the hello) or send the hello at once. */
static void peer_connected(struct peer *p, int64_t now)
{
    p->deadline = now + HELLO_TIMEOUT_MS;
    if (!D.tls_client) {
        p->link = LINK_HELLO;
        send_hello(&p->c);
        return;
    }
    p->c.ssl = SSL_new(D.tls_client);
    if (!p->c.ssl || SSL_set_fd(p->c.ssl, p->c.fd) != 1) {
        tls_note_error(NULL, SSL_ERROR_SSL);
        logmsg(LL_ERROR, "peer %s (%s): cannot create a TLS session: %s", p->name, p->ip, tls_err);
        peer_fail(p, now, "cannot create a TLS session");
        return;
    }
    SSL_set_connect_state(p->c.ssl);
    p->link = LINK_TLS; /* the handshake deadline is the hello timeout */
    peer_tls_step(p, now);
}

static void peer_start_dial(struct peer *p, int64_t now)
{
    if (!p->resolved) {
        if (p->status != CS_INVALID)
            set_peer_status(p, CS_INVALID, "name does not resolve");
        p->next_attempt = now + MISMATCH_RETRY_MS; /* names are re-resolved on SIGUSR1 only */
        return;
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        logmsg(LL_ERROR, "socket: %s", strerror(errno));
        p->next_attempt = now + RETRY_MS;
        return;
    }
    struct sockaddr_in src = {.sin_family = AF_INET, .sin_addr = D.self_addr, .sin_port = 0};
    (void)bind(fd, (struct sockaddr *)&src, sizeof src); /* best effort: peers see our node address */
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct sockaddr_in dst = {.sin_family = AF_INET, .sin_addr = p->addr,
                              .sin_port = htons((uint16_t)D.cfg.server_port)};
    conn_init(&p->c, fd);
    int rc = connect(fd, (struct sockaddr *)&dst, sizeof dst);
    if (rc == 0) {
        peer_connected(p, now);
    } else if (errno == EINPROGRESS) {
        p->link = LINK_CONNECTING;
        p->deadline = now + CONNECT_TIMEOUT_MS;
    } else {
        p->link = LINK_CONNECTING;
        peer_fail(p, now, strerror(errno));
    }
}

static void peer_mismatch(struct peer *p, int64_t now, int st, const char *why)
{
    peer_close(p);
    p->next_attempt = now + MISMATCH_RETRY_MS;
    set_peer_status(p, st, why);
}

static void peer_handle_line(struct peer *p, const char *line, int64_t now)
{
    p->last_rx = now;
    if (p->link == LINK_HELLO) {
        struct hello h;
        if (!parse_hello(line, &h)) {
            peer_mismatch(p, now, CS_INVALID, "peer does not speak the stand-in protocol");
            return;
        }
        if (!same_major(h.version, imex_version())) {
            peer_mismatch(p, now, CS_VERSION_MISMATCH, "version mismatch");
            return;
        }
        if (h.hash != D.map_hash || (size_t)h.n != D.n) {
            peer_mismatch(p, now, CS_MAP_MISMATCH, "node map mismatch");
            return;
        }
        if (h.idx != (long)(p - D.peers)) {
            peer_mismatch(p, now, CS_INVALID, "peer reports another node index");
            return;
        }
        snprintf(p->remote_host, sizeof p->remote_host, "%s", h.host);
        snprintf(p->remote_version, sizeof p->remote_version, "%s", h.version);
        p->link = LINK_UP;
        p->ever_connected = true;
        set_peer_status(p, CS_CONNECTED, NULL);
        send_status(&p->c); /* the answer tells us the peer's state and row right away */
        return;
    }
    if (p->link != LINK_UP)
        return;
    if (!strncmp(line, "STATUS ", 7)) {
        char st[32];
        const char *sp = strchr(line + 7, ' ');
        if (!sp || (size_t)(sp - (line + 7)) >= sizeof st)
            return;
        memcpy(st, line + 7, (size_t)(sp - (line + 7)));
        st[sp - (line + 7)] = '\0';
        const char *row = sp + 1;
        p->remote_state = imex_state_from_name(st);
        if (strlen(row) == D.n) {
            char *r = strdup(row);
            if (r) {
                free(p->remote_row);
                p->remote_row = r;
            }
        }
    } else if (!strcmp(line, "BYE RELOAD")) {
        /* The peer re-reads its nodes file: redial soon, keep the status until the new hello. */
        peer_close(p);
        p->next_attempt = now + 100;
    } else if (!strncmp(line, "BYE", 3)) {
        peer_fail(p, now, "peer is shutting down");
    }
}

static void peer_event(struct peer *p, short rev, int64_t now)
{
    if (p->link == LINK_CONNECTING) {
        int err = 0;
        socklen_t l = sizeof err;
        if (getsockopt(p->c.fd, SOL_SOCKET, SO_ERROR, &err, &l) < 0)
            err = errno;
        if (err) {
            peer_fail(p, now, strerror(err));
            return;
        }
        if (!(rev & (POLLOUT | POLLERR | POLLHUP)))
            return;
        peer_connected(p, now);
        return;
    }
    if (p->link == LINK_TLS) {
        peer_tls_step(p, now);
        if (p->link != LINK_HELLO)
            return;
    }
    /* TLS: both directions on every event, since a TLS read may need the socket writable and vice
     * versa, and records may already sit in OpenSSL's buffer. */
    bool tls = p->c.ssl != NULL;
    if ((rev & POLLOUT) || (tls && conn_pending(&p->c))) {
        if (conn_flush(&p->c) < 0) {
            /* In TLS 1.3 the client finishes its handshake before the server has checked the client
             * certificate: a refusal arrives as an alert while we wait for the hello. */
            if (tls && p->link == LINK_HELLO)
                peer_auth_fail(p, now, tls_err);
            else
                peer_fail(p, now, "write failed");
            return;
        }
    }
    if (tls || (rev & (POLLIN | POLLHUP | POLLERR))) {
        int r = conn_read(&p->c, MAX_LINE);
        char line[MAX_LINE];
        int idx = (int)(p - D.peers);
        while (D.peers[idx].link != LINK_IDLE && conn_line(&p->c, line, sizeof line))
            peer_handle_line(p, line, now);
        if (r < 0 && p->link == LINK_HELLO && tls)
            peer_auth_fail(p, now, tls_err); /* see above: refused after our side of the handshake */
        else if (r < 0 && p->link != LINK_IDLE)
            peer_fail(p, now, "connection closed by peer");
        else if (tls && p->link != LINK_IDLE && p->c.read_blocks_write && conn_flush(&p->c) < 0)
            peer_fail(p, now, "write failed");
    }
}

/* An acceptor's refusal is logged at WARN: a dialer with foreign or no credentials retries every
 * second, so repeats from the same address are logged at WARN once a minute, else at DEBUG. */
static void inbound_refused(const struct inbound *ib, const char *why)
{
    static struct {
        in_addr_t addr;
        int64_t at;
    } seen[32];
    static unsigned next_slot;
    char ip[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &ib->from.sin_addr, ip, sizeof ip);
    int64_t now = imex_now_ms();
    int lvl = LL_WARN;
    size_t k = 0;
    for (; k < sizeof seen / sizeof seen[0]; k++)
        if (seen[k].at && seen[k].addr == ib->from.sin_addr.s_addr)
            break;
    if (k < sizeof seen / sizeof seen[0]) {
        if (now - seen[k].at < 60000)
            lvl = LL_DEBUG;
        else
            seen[k].at = now;
    } else {
        k = next_slot++ % (sizeof seen / sizeof seen[0]);
        seen[k].addr = ib->from.sin_addr.s_addr;
        seen[k].at = now;
    }
    logmsg(lvl, "refused a peer connection from %s:%u: TLS handshake failed: %s", ip,
           (unsigned)ntohs(ib->from.sin_port), why);
}

static void inbound_handle_line(struct inbound *ib, const char *line, int64_t now)
{
    ib->last_rx = now;
    if (!ib->got_hello) {
        struct hello h;
        if (!parse_hello(line, &h)) {
            ib->close_after_flush = true;
            return;
        }
        ib->got_hello = true;
        send_hello(&ib->c);
        if (!same_major(h.version, imex_version()) || h.hash != D.map_hash || (size_t)h.n != D.n) {
            logmsg(LL_DEBUG, "inbound hello from %s rejected (version %s, map %016llx)", h.ip, h.version, h.hash);
            ib->close_after_flush = true;
        }
        return;
    }
    if (!strncmp(line, "STATUS ", 7))
        send_status(&ib->c);
    else if (!strncmp(line, "BYE", 3))
        ib->close_after_flush = true;
}

/* ------------------------------------------------------------------------------------------------ */
/* Command service                                                                                 */

static void json_str(struct buf *b, const char *s)
{
    buf_append(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            buf_append(b, e, 2);
        } else if (c < 0x20) {
            buf_printf(b, "\\u%04x", c);
        } else {
            buf_append(b, (const char *)s, 1);
        }
    }
    buf_append(b, "\"", 1);
}

static const char *node_host(size_t i)
{
    return D.peers[i].resolved ? D.peers[i].ip : D.peers[i].name;
}

static const char *node_hostname(size_t i)
{
    if (!D.peers[i].literal)
        return D.peers[i].name;
    if ((int)i == D.self_idx)
        return D.hostname;
    if (D.peers[i].remote_host[0])
        return D.peers[i].remote_host;
    return node_host(i);
}

/* The node state of row i, and its connection codes in m[i*n ..]. */
static int build_row(size_t i, int *m)
{
    size_t n = D.n;
    if ((int)i == D.self_idx) {
        for (size_t j = 0; j < n; j++)
            m[i * n + j] = j == i ? CS_CONNECTED : D.peers[j].status;
        return D.state;
    }
    struct peer *p = &D.peers[i];
    if (p->link == LINK_UP && p->remote_row && p->remote_state >= 0) {
        for (size_t j = 0; j < n; j++) {
            int cs = imex_conn_from_wire(p->remote_row[j]);
            m[i * n + j] = cs < 0 ? CS_INVALID : cs;
        }
        return p->remote_state;
    }
    for (size_t j = 0; j < n; j++)
        m[i * n + j] = CS_INVALID;
    return NS_UNAVAILABLE;
}

static const char *domain_state(const int *states, const int *m)
{
    size_t n = D.n;
    if (D.state != NS_READY)
        return "DOWN";
    if (n > 1) {
        bool any = false;
        for (size_t j = 0; j < n; j++)
            if ((int)j != D.self_idx && D.peers[j].status == CS_CONNECTED)
                any = true;
        if (!any)
            return "DOWN";
    }
    for (size_t i = 0; i < n; i++) {
        if (states[i] != NS_READY)
            return "DEGRADED";
        for (size_t j = 0; j < n; j++)
            if (m[i * n + j] != CS_CONNECTED)
                return "DEGRADED";
    }
    if (D.self_idx < 0)
        return "DEGRADED";
    return "UP";
}

static void render_nodes(struct buf *b, bool json, bool hostnames)
{
    size_t n = D.n;
    int *m = calloc(n * n + 1, sizeof *m);
    int *states = calloc(n + 1, sizeof *states);
    if (!m || !states) {
        free(m);
        free(states);
        buf_printf(b, "ERR out of memory\n");
        return;
    }
    for (size_t i = 0; i < n; i++)
        states[i] = build_row(i, m);
    const char *dom = domain_state(states, m);
    if (D.last_n != n || !D.last_matrix) {
        free(D.last_matrix);
        D.last_matrix = malloc(n * n + 1);
        D.last_n = n;
        if (D.last_matrix)
            memset(D.last_matrix, 0xff, n * n + 1);
    }
    char ts[64];
    imex_timestamp(ts, sizeof ts);
    buf_printf(b, "OK\n");
    if (json) {
        buf_printf(b, "{\"nodes\": {");
        for (size_t i = 0; i < n; i++) {
            buf_printf(b, "%s\"%zu\": {\"status\": \"%s\", \"host\": ", i ? ", " : "", i, imex_state_name(states[i]));
            json_str(b, node_host(i));
            buf_printf(b, ", \"hostName\": ");
            json_str(b, node_hostname(i));
            buf_printf(b, ", \"connections\": {");
            for (size_t j = 0; j < n; j++) {
                int cs = m[i * n + j];
                bool changed = D.last_matrix && D.last_matrix[i * n + j] != 0xff && D.last_matrix[i * n + j] != cs;
                buf_printf(b, "%s\"%zu\": {\"host\": ", j ? ", " : "", j);
                json_str(b, node_host(j));
                buf_printf(b, ", \"status\": \"%s\", \"changed\": %s}", imex_conn_name(cs), changed ? "true" : "false");
            }
            buf_printf(b, "}}");
        }
        buf_printf(b, "}, \"timestamp\": ");
        json_str(b, ts);
        buf_printf(b, ", \"status\": \"%s\"}\n", dom);
    } else {
        buf_printf(b, "Connectivity table legend:\n"
                      "  C   - connected\n"
                      "  N   - never connected\n"
                      "  I   - invalid: node not reachable, no connection status available\n"
                      "  R   - recovering: connection lost, clean-up not yet triggered\n"
                      "  D   - disconnected: connection lost, clean-up triggered\n"
                      "  A   - authenticating\n"
                      "  !V! - version mismatch, communication disabled\n"
                      "  !M! - node map mismatch, communication disabled\n"
                      "\n%s\nNodes:\n",
                   ts);
        for (size_t i = 0; i < n; i++) {
            const char *ver = (int)i == D.self_idx ? imex_version()
                              : D.peers[i].remote_version[0] ? D.peers[i].remote_version : "-";
            if (hostnames)
                buf_printf(b, "Node #%-3zu - %-32s - %-15s - %-20s - Version: %s\n", i, node_hostname(i),
                           node_host(i), imex_state_name(states[i]), ver);
            else
                buf_printf(b, "Node #%-3zu - %-15s - %-20s - Version: %s\n", i, node_host(i),
                           imex_state_name(states[i]), ver);
        }
        buf_printf(b, "\n Nodes From\\To ");
        for (size_t j = 0; j < n; j++)
            buf_printf(b, " %-4zu", j);
        buf_printf(b, "\n");
        for (size_t i = 0; i < n; i++) {
            buf_printf(b, "   %-11zu ", i);
            for (size_t j = 0; j < n; j++)
                buf_printf(b, " %-4s", imex_conn_code(m[i * n + j]));
            buf_printf(b, "\n");
        }
        buf_printf(b, "Domain State: %s\n", dom);
    }
    if (D.last_matrix)
        for (size_t k = 0; k < n * n; k++)
            D.last_matrix[k] = (unsigned char)m[k];
    free(m);
    free(states);
}

static void cmd_handle(struct cmdcli *cc, const char *line)
{
    char tag[16] = "", verb[16] = "", a1[16] = "", a2[16] = "";
    struct buf b = {0};
    int nt = sscanf(line, "%15s %15s %15s %15s", tag, verb, a1, a2);
    if (nt < 2 || strcmp(tag, IMEX_PROTO)) {
        buf_printf(&b, "ERR unknown request\n");
    } else if (!strcmp(verb, "QUERY")) {
        buf_printf(&b, "OK\n%s\n", imex_state_name(D.state));
    } else if (!strcmp(verb, "NODES")) {
        bool json = !strcmp(a1, "JSON") || !strcmp(a2, "JSON");
        bool hn = !strcmp(a1, "HOSTNAMES") || !strcmp(a2, "HOSTNAMES");
        render_nodes(&b, json, hn);
    } else {
        buf_printf(&b, "ERR unknown command %s\n", verb);
    }
    logmsg(LL_DEBUG, "command: %s", line);
    if (b.p)
        buf_append(&cc->c.out, b.p, b.len);
    buf_free(&b);
    cc->responded = true;
}

/* ------------------------------------------------------------------------------------------------ */
/* Sockets                                                                                         */

static int listen_tcp(struct in_addr a, int port, int *err)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        *err = errno;
        return -1;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr = a, .sin_port = htons((uint16_t)port)};
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(fd, 128) < 0) {
        *err = errno;
        close(fd);
        return -1;
    }
    return fd;
}

static int listen_unix(const char *path, int *err)
{
    struct stat st;
    if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode))
        unlink(path); /* a stale socket of an earlier run */
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        *err = errno;
        return -1;
    }
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(fd, 16) < 0) {
        *err = errno;
        close(fd);
        return -1;
    }
    return fd;
}

/* Picks this node's address and opens the peer listener. Rules, in order:
 *  1. BIND_INTERFACE_IP when set;
 *  2. IMEX_CMD_BIND_INTERFACE_IP when it is an entry of the nodes file;
 *  3. the first entry that is exactly the address of a local interface;
 *  4. (simulator) the first entry we can listen on at SERVER_PORT, e.g. one of the 127/8 addresses
 *     on lo that nobody else uses yet. */
static int pick_address(const struct imex_node_map *map)
{
    int err = 0;
    struct in_addr a;
    if (D.cfg.bind_ip[0]) {
        inet_pton(AF_INET, D.cfg.bind_ip, &a);
        D.listen_fd = listen_tcp(a, D.cfg.server_port, &err);
        if (D.listen_fd < 0)
            goto fail_one;
        D.self_addr = a;
        logmsg(LL_INFO, "node address %s (BIND_INTERFACE_IP)", D.cfg.bind_ip);
        return 0;
    }
    if (D.cfg.cmd_bind_ip[0]) {
        inet_pton(AF_INET, D.cfg.cmd_bind_ip, &a);
        if (imex_nodes_find_addr(map, a) >= 0) {
            D.listen_fd = listen_tcp(a, D.cfg.server_port, &err);
            if (D.listen_fd < 0)
                goto fail_one;
            D.self_addr = a;
            logmsg(LL_INFO, "node address %s (IMEX_CMD_BIND_INTERFACE_IP, found in the nodes file)",
                   D.cfg.cmd_bind_ip);
            return 0;
        }
    }
    for (size_t i = 0; i < map->n; i++) {
        if (!map->nodes[i].resolved || !imex_addr_on_interface(map->nodes[i].addr))
            continue;
        a = map->nodes[i].addr;
        D.listen_fd = listen_tcp(a, D.cfg.server_port, &err);
        if (D.listen_fd < 0)
            goto fail_one;
        D.self_addr = a;
        logmsg(LL_INFO, "node address %s (local interface address in the nodes file)", map->nodes[i].name);
        return 0;
    }
    for (size_t i = 0; i < map->n; i++) {
        if (!map->nodes[i].resolved)
            continue;
        D.listen_fd = listen_tcp(map->nodes[i].addr, D.cfg.server_port, &err);
        if (D.listen_fd >= 0) {
            D.self_addr = map->nodes[i].addr;
            logmsg(LL_WARN, "node address %s: first nodes-file entry free to listen on (set BIND_INTERFACE_IP "
                   "to choose explicitly)", map->nodes[i].name);
            return 0;
        }
    }
    logmsg(LL_FATAL, "no entry of %s is a local address; set BIND_INTERFACE_IP", D.cfg.node_config_file);
    fprintf(stderr, "nvidia-imex: error: no entry of %s is a local address we can listen on at port %d; "
            "set BIND_INTERFACE_IP\n", D.cfg.node_config_file, D.cfg.server_port);
    return -1;
fail_one: {
    char ip[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &a, ip, sizeof ip);
    logmsg(LL_FATAL, "cannot listen on %s:%d: %s", ip, D.cfg.server_port, strerror(err));
    fprintf(stderr, "nvidia-imex: error: cannot listen on %s:%d: %s\n", ip, D.cfg.server_port, strerror(err));
    return -1;
}
}

/* ------------------------------------------------------------------------------------------------ */
/* TLS credentials (start-up and SIGUSR1)                                                          */

struct tls_creds {
    SSL_CTX *server, *client;
};

/* Errors name the config file and line of the key, the key and the credential file, like the
 * parse errors do: "<config>:<line>: IMEX_SERVER_KEY: <file>: <reason>". */
static void cred_err(char *err, size_t el, int k, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void cred_err(char *err, size_t el, int k, const char *fmt, ...)
{
    int n = snprintf(err, el, "%s:%d: %s: ", D.config_path, D.cfg.tls_line[k], imex_tls_key_names[k]);
    if (n >= 0 && (size_t)n < el) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err + n, el - (size_t)n, fmt, ap);
        va_end(ap);
    }
    ERR_clear_error();
}

static const char *ossl_reason(void)
{
    unsigned long e = ERR_peek_error();
    const char *r = e ? ERR_reason_error_string(e) : NULL;
    return r ? r : "unknown OpenSSL error";
}

/* The file a credential key names: the value itself (FILE), or the value of the environment
 * variable it names (ENV_PATH). */
static const char *cred_path(int k, char *err, size_t el)
{
    const char *v = D.cfg.tls[k];
    if (D.cfg.auth_source != AUTH_SOURCE_ENV_PATH)
        return v;
    const char *p = getenv(v);
    if (!p || !*p) {
        cred_err(err, el, k, "environment variable %s (IMEX_AUTH_SOURCE=ENV_PATH) is %s", v, p ? "empty" : "not set");
        return NULL;
    }
    return p;
}

static FILE *cred_open(int k, const char *path, char *err, size_t el)
{
    FILE *f = fopen(path, "re");
    if (!f)
        cred_err(err, el, k, "cannot open %s: %s", path, strerror(errno));
    return f;
}

/* Never prompt on the terminal for a passphrase: an encrypted key is an error. */
static int no_passphrase(char *buf, int size, int rwflag, void *u)
{
    (void)buf, (void)size, (void)rwflag, (void)u;
    return -1;
}

static void cert_summary(struct buf *info, const char *key, const char *path, X509 *x)
{
    char subj[256], iss[256], na[64] = "?";
    X509_NAME_oneline(X509_get_subject_name(x), subj, sizeof subj);
    X509_NAME_oneline(X509_get_issuer_name(x), iss, sizeof iss);
    BIO *b = BIO_new(BIO_s_mem());
    if (b) {
        if (ASN1_TIME_print(b, X509_get0_notAfter(x)) == 1) {
            int n = BIO_read(b, na, sizeof na - 1);
            na[n > 0 ? n : 0] = '\0';
        }
        BIO_free(b);
    }
    bool expired = X509_cmp_current_time(X509_get0_notAfter(x)) < 0;
    buf_printf(info, "# %s %s: subject %s, issuer %s, notAfter %s%s\n", key, path, subj, iss, na,
               expired ? " (EXPIRED)" : "");
}

/* One side's context: own key and certificate chain, and the CA bundle that peers must chain to. */
static SSL_CTX *tls_side(bool server, struct buf *info, char *err, size_t el)
{
    int kk = server ? TLS_SERVER_KEY : TLS_CLIENT_KEY, kc = kk + 1, ka = kk + 2;
    const char *pk = cred_path(kk, err, el), *pc = pk ? cred_path(kc, err, el) : NULL,
               *pa = pc ? cred_path(ka, err, el) : NULL;
    if (!pa)
        return NULL;
    SSL_CTX *ctx = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
    EVP_PKEY *key = NULL;
    X509 *leaf = NULL, *x;
    FILE *f = NULL;
    if (!ctx) {
        cred_err(err, el, kk, "cannot create a TLS context: %s", ossl_reason());
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    /* RELEASE_BUFFERS: idle links keep no record buffers. NO_AUTO_CHAIN: we send the certificate
     * file's chain only, never certificates picked from the trust bundle (a root sent along is
     * useless to the peer and muddles its verify error). */
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER |
                              SSL_MODE_RELEASE_BUFFERS | SSL_MODE_NO_AUTO_CHAIN);
    /* Every connection is fully verified against the current CA bundle: no session resumption. */
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
    SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET);
    if (server)
        SSL_CTX_set_num_tickets(ctx, 0);

    /* Certificate (leaf first, then any chain certificates in the same file). */
    if (!(f = cred_open(kc, pc, err, el)))
        goto fail;
    leaf = PEM_read_X509(f, NULL, no_passphrase, NULL);
    if (!leaf) {
        cred_err(err, el, kc, "%s: no PEM certificate (%s)", pc, ossl_reason());
        goto fail;
    }
    if (SSL_CTX_use_certificate(ctx, leaf) != 1) {
        cred_err(err, el, kc, "%s: certificate not usable: %s", pc, ossl_reason());
        goto fail;
    }
    while ((x = PEM_read_X509(f, NULL, no_passphrase, NULL)) != NULL)
        if (SSL_CTX_add0_chain_cert(ctx, x) != 1) {
            X509_free(x);
            cred_err(err, el, kc, "%s: chain certificate not usable: %s", pc, ossl_reason());
            goto fail;
        }
    ERR_clear_error(); /* the end of the file reads as "no start line" */
    fclose(f);
    f = NULL;

    /* Private key, which must belong to that certificate. */
    if (!(f = cred_open(kk, pk, err, el)))
        goto fail;
    key = PEM_read_PrivateKey(f, NULL, no_passphrase, NULL);
    fclose(f);
    f = NULL;
    if (!key) {
        cred_err(err, el, kk, "%s: no PEM private key, or it is encrypted (%s)", pk, ossl_reason());
        goto fail;
    }
    if (X509_check_private_key(leaf, key) != 1) {
        cred_err(err, el, kk, "%s does not match the certificate in %s %s", pk, imex_tls_key_names[kc], pc);
        goto fail;
    }
    if (SSL_CTX_use_PrivateKey(ctx, key) != 1) {
        cred_err(err, el, kk, "%s: key not usable: %s", pk, ossl_reason());
        goto fail;
    }

    /* CA bundle: every certificate in the file is a trust anchor. */
    if (!(f = cred_open(ka, pa, err, el)))
        goto fail;
    X509_STORE *store = SSL_CTX_get_cert_store(ctx);
    int nca = 0;
    char first[256] = "";
    while ((x = PEM_read_X509(f, NULL, no_passphrase, NULL)) != NULL) {
        if (!nca)
            X509_NAME_oneline(X509_get_subject_name(x), first, sizeof first);
        int ok = X509_STORE_add_cert(store, x);
        X509_free(x);
        if (ok != 1) {
            unsigned long e = ERR_peek_last_error();
            if (ERR_GET_REASON(e) != X509_R_CERT_ALREADY_IN_HASH_TABLE) {
                cred_err(err, el, ka, "%s: CA certificate not usable: %s", pa, ossl_reason());
                goto fail;
            }
        }
        nca++;
    }
    ERR_clear_error();
    fclose(f);
    f = NULL;
    if (!nca) {
        cred_err(err, el, ka, "%s: no PEM CA certificate in the bundle", pa);
        goto fail;
    }

    /* The acceptor insists on a client certificate; both verify the peer's chain. With the target
     * override the peer's certificate must also carry that DNS name in its subjectAltName (never the
     * subject CN: a CA that signs for other purposes must not be enough). */
    SSL_CTX_set_verify(ctx, server ? SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT : SSL_VERIFY_PEER, NULL);
    const char *target = D.cfg.tls[TLS_TARGET_OVERRIDE];
    if (target && *target) {
        X509_VERIFY_PARAM *vp = SSL_CTX_get0_param(ctx);
        X509_VERIFY_PARAM_set_hostflags(vp, X509_CHECK_FLAG_NEVER_CHECK_SUBJECT |
                                                X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
        if (X509_VERIFY_PARAM_set1_host(vp, target, 0) != 1) {
            cred_err(err, el, TLS_TARGET_OVERRIDE, "'%s' is not usable as a DNS name", target);
            goto fail;
        }
    }
    if (info) {
        cert_summary(info, imex_tls_key_names[kc], pc, leaf);
        buf_printf(info, "# %s %s: %d CA certificate%s, first %s\n", imex_tls_key_names[ka], pa, nca,
                   nca == 1 ? "" : "s", first);
    }
    X509_free(leaf);
    EVP_PKEY_free(key);
    return ctx;
fail:
    if (f)
        fclose(f);
    X509_free(leaf);
    EVP_PKEY_free(key);
    SSL_CTX_free(ctx);
    return NULL;
}

/* Loads all credentials into new contexts; 0, or -1 with the error in err (nothing changed). */
static int tls_load(struct tls_creds *out, struct buf *info, char *err, size_t el)
{
    out->server = tls_side(true, info, err, el);
    if (!out->server)
        return -1;
    out->client = tls_side(false, info, err, el);
    if (!out->client) {
        SSL_CTX_free(out->server);
        out->server = NULL;
        return -1;
    }
    return 0;
}

static void tls_install(struct tls_creds *c)
{
    /* Live SSL objects hold their own reference to the context they were made from, so established
     * links (and handshakes in progress) keep the old credentials; new connections use the new. */
    SSL_CTX_free(D.tls_server);
    SSL_CTX_free(D.tls_client);
    D.tls_server = c->server;
    D.tls_client = c->client;
}

/* Logs each "# ..." line of a tls_load() summary at INFO (it is modified in place). */
static void log_comment_lines(const char *prefix, char *text)
{
    for (char *line = text, *nl; line && *line; line = nl + 1) {
        nl = strchr(line, '\n');
        if (!nl)
            break;
        *nl = '\0';
        logmsg(LL_INFO, "%s: %s", prefix, line[0] == '#' && line[1] == ' ' ? line + 2 : line);
    }
}

static void reload_credentials(void)
{
    struct tls_creds c;
    struct buf info = {0};
    char err[IMEX_ERRLEN];
    if (tls_load(&c, &info, err, sizeof err)) {
        logmsg(LL_ERROR, "SIGUSR1: keeping the current TLS credentials: %s", err);
        buf_free(&info);
        return;
    }
    tls_install(&c);
    log_comment_lines("TLS credentials reloaded", info.p);
    buf_free(&info);
}

/* ------------------------------------------------------------------------------------------------ */
/* Node map (start-up and SIGUSR1)                                                                 */

static void peer_free(struct peer *p)
{
    peer_close(p);
    free(p->name);
    p->name = NULL;
}

static void peer_set_node(struct peer *p, const struct imex_node *nd)
{
    p->literal = nd->literal;
    p->resolved = nd->resolved;
    p->addr = nd->addr;
    if (nd->resolved)
        inet_ntop(AF_INET, &nd->addr, p->ip, sizeof p->ip);
    else
        snprintf(p->ip, sizeof p->ip, "unresolved");
}

/* Installs `map` (taking its names). Peers keep their state and links when their name and address
 * are unchanged and the map hash is the same; otherwise their links are redialled. */
static void install_map(struct imex_node_map *map, int64_t now)
{
    bool hash_changed = D.peers && map->hash != D.map_hash;
    struct peer *np = calloc(map->n + 1, sizeof *np);
    bool *taken = calloc(D.n + 1, sizeof *taken);
    if (!np || !taken) {
        logmsg(LL_ERROR, "out of memory installing the node map");
        free(np);
        free(taken);
        imex_nodes_free(map);
        return;
    }
    for (size_t j = 0; j < map->n; j++) {
        struct imex_node *nd = &map->nodes[j];
        struct peer *p = &np[j];
        size_t k = 0;
        for (; k < D.n; k++)
            if (!taken[k] && !strcmp(D.peers[k].name, nd->name))
                break;
        if (k < D.n) {
            taken[k] = true;
            *p = D.peers[k];
            free(p->name);
            bool addr_changed = p->resolved != nd->resolved || p->addr.s_addr != nd->addr.s_addr;
            if ((hash_changed || addr_changed) && p->link != LINK_IDLE) {
                if (p->link == LINK_UP)
                    conn_send(&p->c, "BYE RELOAD\n", 11);
                peer_close(p);
                p->next_attempt = now;
            }
        } else {
            memset(p, 0, sizeof *p);
            conn_init(&p->c, -1);
            p->status = CS_NEVER_CONNECTED;
            p->remote_state = -1;
            p->next_attempt = now;
        }
        p->name = nd->name;
        nd->name = NULL;
        peer_set_node(p, nd);
        if (!p->resolved) {
            peer_close(p);
            set_peer_status(p, CS_INVALID, "name does not resolve");
        }
    }
    for (size_t k = 0; k < D.n; k++)
        if (!taken[k])
            peer_free(&D.peers[k]);
    free(taken);
    free(D.peers);
    D.peers = np;
    D.n = map->n;
    D.map_hash = map->hash;
    imex_nodes_free(map);

    int old_self = D.self_idx;
    D.self_idx = -1;
    for (size_t j = 0; j < D.n; j++)
        if (D.peers[j].resolved && D.peers[j].addr.s_addr == D.self_addr.s_addr) {
            D.self_idx = (int)j;
            break;
        }
    for (size_t j = 0; j < D.n; j++) {
        struct peer *p = &D.peers[j];
        if ((int)j == D.self_idx) {
            peer_close(p);
            p->status = CS_CONNECTED;
            p->ever_connected = true;
        } else if (p->status == CS_CONNECTED && p->link == LINK_IDLE && p->next_attempt > now) {
            p->next_attempt = now; /* was our own entry before */
        }
    }
    if (D.self_idx < 0)
        logmsg(LL_WARN, "this node's address %s is not in the nodes file", D.self_ip);
    else if (old_self != D.self_idx)
        logmsg(LL_INFO, "this node is #%d of %zu in the nodes file", D.self_idx, D.n);

    if (hash_changed) {
        for (size_t i = 0; i < D.nin; i++)
            if (D.in[i].c.fd >= 0) {
                conn_send(&D.in[i].c, "BYE RELOAD\n", 11);
                conn_close(&D.in[i].c);
            }
        free(D.last_matrix);
        D.last_matrix = NULL;
        D.last_n = 0;
    }
}

static void reload_nodes(int64_t now)
{
    struct imex_node_map map;
    char err[IMEX_ERRLEN];
    logmsg(LL_INFO, "SIGUSR1: re-reading %s", D.cfg.node_config_file);
    if (imex_nodes_load(D.cfg.node_config_file, &map, err, sizeof err)) {
        logmsg(LL_ERROR, "SIGUSR1: keeping the current node map: %s", err);
        return;
    }
    imex_nodes_resolve(&map);
    uint64_t old = D.map_hash;
    install_map(&map, now);
    logmsg(LL_INFO, "node map reloaded: %zu nodes, map %016llx%s", D.n, (unsigned long long)D.map_hash,
           old == D.map_hash ? " (unchanged)" : "");
}

/* ------------------------------------------------------------------------------------------------ */
/* Main loop                                                                                       */

static void on_signal(int sig)
{
    if (sig == SIGUSR1)
        got_usr1 = 1;
    else if (sig == SIGTERM || sig == SIGINT)
        got_term = 1;
}

static void accept_all(int lfd, bool is_cmd)
{
    for (;;) {
        struct sockaddr_in from = {0};
        socklen_t fl = sizeof from;
        int fd = accept4(lfd, is_cmd ? NULL : (struct sockaddr *)&from, is_cmd ? NULL : &fl,
                         SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return;
        int64_t now = imex_now_ms();
        if (is_cmd) {
            if (D.ncmd >= MAX_CMD_CLIENTS) {
                close(fd);
                continue;
            }
            if (D.ncmd == D.capcmd) {
                size_t nc = D.capcmd ? D.capcmd * 2 : 8;
                struct cmdcli *p = realloc(D.cmd, nc * sizeof *p);
                if (!p) {
                    close(fd);
                    continue;
                }
                D.cmd = p;
                D.capcmd = nc;
            }
            struct cmdcli *cc = &D.cmd[D.ncmd++];
            memset(cc, 0, sizeof *cc);
            conn_init(&cc->c, fd);
            cc->deadline = now + CMD_TIMEOUT_MS;
        } else {
            if (D.nin >= MAX_INBOUND) {
                close(fd);
                continue;
            }
            if (D.nin == D.capin) {
                size_t nc = D.capin ? D.capin * 2 : 16;
                struct inbound *p = realloc(D.in, nc * sizeof *p);
                if (!p) {
                    close(fd);
                    continue;
                }
                D.in = p;
                D.capin = nc;
            }
            struct inbound *ib = &D.in[D.nin];
            memset(ib, 0, sizeof *ib);
            conn_init(&ib->c, fd);
            ib->from = from;
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            ib->last_rx = now;
            if (D.tls_server) {
                ib->c.ssl = SSL_new(D.tls_server);
                if (!ib->c.ssl || SSL_set_fd(ib->c.ssl, fd) != 1) {
                    tls_note_error(NULL, SSL_ERROR_SSL);
                    logmsg(LL_ERROR, "cannot create a TLS session: %s", tls_err);
                    conn_close(&ib->c);
                    continue;
                }
                SSL_set_accept_state(ib->c.ssl);
                ib->hs_deadline = now + HELLO_TIMEOUT_MS;
            }
            D.nin++;
        }
    }
}

static int64_t run_timers(int64_t now)
{
    int64_t next = now + 1000;
#define WAKE(t) do { if ((t) < next) next = (t); } while (0)
    if (D.state == NS_WAITING_FOR_PEERS) {
        if (now >= D.ready_at)
            set_state(NS_READY);
        else
            WAKE(D.ready_at);
    }
    for (size_t j = 0; j < D.n; j++) {
        struct peer *p = &D.peers[j];
        if ((int)j == D.self_idx)
            continue;
        if (p->status == CS_RECOVERING && D.cfg.grace_time > 0) {
            int64_t t = p->lost_at + (int64_t)D.cfg.grace_time * 1000;
            if (now >= t)
                set_peer_status(p, CS_DISCONNECTED, "grace time over, cleaning up");
            else
                WAKE(t);
        }
        switch (p->link) {
        case LINK_IDLE:
            if (now >= p->next_attempt)
                peer_start_dial(p, now);
            if (p->link == LINK_IDLE)
                WAKE(p->next_attempt);
            else
                WAKE(p->deadline);
            break;
        case LINK_TLS:
            if (now >= p->deadline) {
                /* No answer to our ClientHello: either a plaintext daemon (it waits for a hello line)
                 * or a hung one. A peer that was up before is treated as hung (RECOVERING stays);
                 * otherwise the link never got past authentication. */
                bool answered = BIO_number_read(SSL_get_rbio(p->c.ssl)) > 0;
                if (!answered && (p->status == CS_RECOVERING || p->status == CS_DISCONNECTED))
                    peer_fail(p, now, "TLS handshake timed out");
                else
                    peer_auth_fail(p, now, answered ? "timed out"
                                                    : "timed out: no answer to our ClientHello (is the peer "
                                                      "running with IMEX_ENABLE_AUTH_ENCRYPTION=1?)");
            }
            WAKE(p->link == LINK_IDLE ? p->next_attempt : p->deadline);
            break;
        case LINK_CONNECTING:
        case LINK_HELLO:
            if (now >= p->deadline)
                peer_fail(p, now, "timed out");
            WAKE(p->link == LINK_IDLE ? p->next_attempt : p->deadline);
            break;
        case LINK_UP:
            if (now - p->last_rx > PEER_TIMEOUT_MS) {
                peer_fail(p, now, "peer stopped answering");
                WAKE(p->next_attempt);
                break;
            }
            WAKE(p->last_rx + PEER_TIMEOUT_MS + 1);
            break;
        }
    }
    /* One keepalive tick for all links (fewer wake-ups with many daemons on one machine). */
    if (now >= D.next_keepalive) {
        for (size_t j = 0; j < D.n; j++)
            if (D.peers[j].link == LINK_UP)
                send_status(&D.peers[j].c);
        D.next_keepalive = now + KEEPALIVE_MS;
    }
    WAKE(D.next_keepalive);
    /* Changes are pushed to the dialers at once, so their -N rows for us are current. */
    if (D.dirty) {
        D.dirty = false;
        for (size_t i = 0; i < D.nin; i++)
            if (D.in[i].c.fd >= 0 && D.in[i].got_hello && !D.in[i].close_after_flush)
                send_status(&D.in[i].c);
    }
    for (size_t i = 0; i < D.nin; i++) {
        struct inbound *ib = &D.in[i];
        if (ib->c.fd >= 0 && ib->c.ssl && !ib->tls_up) {
            if (now >= ib->hs_deadline) {
                inbound_refused(ib, "TLS handshake timed out");
                conn_close(&ib->c);
            } else {
                WAKE(ib->hs_deadline);
            }
        }
        if (ib->c.fd >= 0 && now - ib->last_rx > INBOUND_IDLE_MS)
            conn_close(&ib->c);
    }
    for (size_t i = 0; i < D.ncmd; i++) {
        if (D.cmd[i].c.fd >= 0 && now >= D.cmd[i].deadline)
            conn_close(&D.cmd[i].c);
        else if (D.cmd[i].c.fd >= 0)
            WAKE(D.cmd[i].deadline);
    }
#undef WAKE
    return next;
}

static void compact(void)
{
    size_t o = 0;
    for (size_t i = 0; i < D.nin; i++)
        if (D.in[i].c.fd >= 0)
            D.in[o++] = D.in[i];
    D.nin = o;
    o = 0;
    for (size_t i = 0; i < D.ncmd; i++)
        if (D.cmd[i].c.fd >= 0)
            D.cmd[o++] = D.cmd[i];
    D.ncmd = o;
}

enum { T_LISTEN, T_CMD, T_UNIX, T_PEER, T_IN, T_CLI };

static void shutdown_all(void)
{
    set_state(NS_SHUTTING_DOWN);
    for (size_t j = 0; j < D.n; j++) {
        if (D.peers[j].link == LINK_UP)
            conn_send(&D.peers[j].c, "BYE SHUTDOWN\n", 13);
        peer_free(&D.peers[j]);
    }
    for (size_t i = 0; i < D.nin; i++) {
        if (D.in[i].c.fd >= 0)
            conn_send(&D.in[i].c, "BYE SHUTDOWN\n", 13);
        conn_close(&D.in[i].c);
    }
    for (size_t i = 0; i < D.ncmd; i++)
        conn_close(&D.cmd[i].c);
    if (D.listen_fd >= 0)
        close(D.listen_fd);
    if (D.cmd_fd >= 0)
        close(D.cmd_fd);
    if (D.unix_fd >= 0) {
        close(D.unix_fd);
        unlink(D.cfg.cmd_unix_path);
    }
    free(D.peers);
    free(D.in);
    free(D.cmd);
    free(D.last_matrix);
    SSL_CTX_free(D.tls_server);
    SSL_CTX_free(D.tls_client);
    D.tls_server = D.tls_client = NULL;
    logmsg(LL_INFO, "nvidia-imex stand-in stopped");
}

static void loop(sigset_t *unblocked)
{
    struct pollfd *pf = NULL;
    int *tag = NULL, *tix = NULL;
    size_t cap = 0;
    int64_t next = imex_now_ms();
    for (;;) {
        int64_t now = imex_now_ms();
        if (got_term) {
            logmsg(LL_INFO, "termination signal received");
            break;
        }
        if (got_usr1) {
            got_usr1 = 0;
            if (D.cfg.auth_enabled)
                reload_credentials(); /* first, so that links a changed map redials use the new ones */
            reload_nodes(now);
        }
        next = run_timers(now);
        compact();
        size_t need = 3 + D.n + D.nin + D.ncmd;
        if (need > cap) {
            size_t nc = need * 2;
            struct pollfd *npf = realloc(pf, nc * sizeof *npf);
            if (npf)
                pf = npf;
            int *nt = realloc(tag, nc * sizeof *nt);
            if (nt)
                tag = nt;
            int *ni = realloc(tix, nc * sizeof *ni);
            if (ni)
                tix = ni;
            if (!npf || !nt || !ni) {
                logmsg(LL_FATAL, "out of memory");
                break;
            }
            cap = nc;
        }
        size_t k = 0;
#define ADD(fd_, ev_, t_, i_) do { pf[k].fd = (fd_); pf[k].events = (short)(ev_); pf[k].revents = 0; \
                                    tag[k] = (t_); tix[k] = (int)(i_); k++; } while (0)
        if (D.listen_fd >= 0)
            ADD(D.listen_fd, POLLIN, T_LISTEN, 0);
        if (D.cmd_fd >= 0)
            ADD(D.cmd_fd, POLLIN, T_CMD, 0);
        if (D.unix_fd >= 0)
            ADD(D.unix_fd, POLLIN, T_UNIX, 0);
        for (size_t j = 0; j < D.n; j++) {
            struct peer *p = &D.peers[j];
            if (p->link == LINK_CONNECTING)
                ADD(p->c.fd, POLLOUT, T_PEER, j);
            else if (p->link != LINK_IDLE)
                ADD(p->c.fd, conn_events(&p->c), T_PEER, j);
        }
        for (size_t i = 0; i < D.nin; i++)
            ADD(D.in[i].c.fd, conn_events(&D.in[i].c), T_IN, i);
        for (size_t i = 0; i < D.ncmd; i++)
            ADD(D.cmd[i].c.fd, D.cmd[i].responded ? POLLOUT : POLLIN, T_CLI, i);
#undef ADD
        int64_t wait = next - imex_now_ms();
        if (wait < 0)
            wait = 0;
        if (wait > 1000)
            wait = 1000;
        struct timespec ts = {.tv_sec = wait / 1000, .tv_nsec = (long)(wait % 1000) * 1000000L};
        int rc = ppoll(pf, k, &ts, unblocked);
        if (rc < 0) {
            if (errno == EINTR)
                continue;
            logmsg(LL_FATAL, "poll: %s", strerror(errno));
            break;
        }
        now = imex_now_ms();
        for (size_t x = 0; x < k && rc > 0; x++) {
            short rev = pf[x].revents;
            if (!rev)
                continue;
            size_t i = (size_t)tix[x];
            switch (tag[x]) {
            case T_LISTEN:
                accept_all(D.listen_fd, false);
                break;
            case T_CMD:
                accept_all(D.cmd_fd, true);
                break;
            case T_UNIX:
                accept_all(D.unix_fd, true);
                break;
            case T_PEER:
                if (D.peers[i].link != LINK_IDLE && D.peers[i].c.fd == pf[x].fd)
                    peer_event(&D.peers[i], rev, now);
                break;
            case T_IN: {
                struct inbound *ib = &D.in[i];
                if (ib->c.fd < 0)
                    break;
                bool tls = ib->c.ssl != NULL;
                if (tls && !ib->tls_up) {
                    int h = conn_handshake(&ib->c);
                    if (h < 0) {
                        inbound_refused(ib, tls_err);
                        conn_close(&ib->c);
                        break;
                    }
                    if (h == 0)
                        break;
                    ib->tls_up = true;
                    if (D.cfg.log_level >= LL_DEBUG) {
                        char subj[256] = "?";
                        X509 *pc = SSL_get1_peer_certificate(ib->c.ssl);
                        if (pc) {
                            X509_NAME_oneline(X509_get_subject_name(pc), subj, sizeof subj);
                            X509_free(pc);
                        }
                        logmsg(LL_DEBUG, "inbound TLS from %s accepted (%s), client certificate %s",
                               inet_ntoa(ib->from.sin_addr), SSL_get_version(ib->c.ssl), subj);
                    }
                }
                /* TLS: flush and read on every event (see peer_event). */
                if (((rev & POLLOUT) || (tls && conn_pending(&ib->c))) && conn_flush(&ib->c) < 0) {
                    conn_close(&ib->c);
                    break;
                }
                if (tls || (rev & (POLLIN | POLLHUP | POLLERR))) {
                    int r = conn_read(&ib->c, MAX_LINE);
                    char line[MAX_LINE];
                    while (ib->c.fd >= 0 && !ib->close_after_flush && conn_line(&ib->c, line, sizeof line))
                        inbound_handle_line(ib, line, now);
                    if (r < 0)
                        conn_close(&ib->c);
                }
                if (ib->c.fd >= 0 && ib->close_after_flush) {
                    conn_flush(&ib->c);
                    conn_close(&ib->c);
                }
                break;
            }
            case T_CLI: {
                struct cmdcli *cc = &D.cmd[i];
                if (cc->c.fd < 0)
                    break;
                if (!cc->responded) {
                    int r = conn_read(&cc->c, 4096);
                    char line[4096];
                    if (conn_line(&cc->c, line, sizeof line))
                        cmd_handle(cc, line);
                    else if (r < 0) {
                        conn_close(&cc->c);
                        break;
                    }
                }
                if (cc->responded) {
                    if (conn_flush(&cc->c) < 0 || !conn_pending(&cc->c))
                        conn_close(&cc->c);
                }
                break;
            }
            }
        }
    }
    free(pf);
    free(tag);
    free(tix);
}

/* ------------------------------------------------------------------------------------------------ */
/* Command line                                                                                    */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: nvidia-imex [-c|--config <config.cfg>] [-p|--port <port>] [--check-config] [--nogpu]\n"
            "\n"
            "nvlfabric simulator stand-in for NVIDIA's IMEX daemon. It reads the real config and nodes\n"
            "file formats, links to its peers over TCP and serves nvidia-imex-ctl; no GPU memory is shared.\n"
            "\n"
            "  -c, --config FILE   config file (default " IMEX_DEFAULT_CONFIG ")\n"
            "  -p, --port PORT     overrides SERVER_PORT\n"
            "      --check-config  validate the config (and the nodes file if present), print the\n"
            "                      effective settings, exit\n"
            "      --nogpu         accepted and ignored (there is never a GPU)\n"
            "  -v, --version       print the version\n"
            "  -h, --help          this text\n"
            "\n"
            "Environment (simulator only): NVLFABRIC_SIM_HOSTS_FILE (hosts file for node names),\n"
            "NVLFABRIC_SIM_IMEX_VERSION, NVLFABRIC_SIM_IMEX_READY_DELAY_MS, NVLFABRIC_SIM_HOSTNAME.\n");
}

static void print_effective(void)
{
    const struct imex_config *c = &D.cfg;
    printf("LOG_LEVEL=%d\nLOG_FILE_NAME=%s\nLOG_APPEND_TO_LOG=%d\nDAEMONIZE=%d\nBIND_INTERFACE_IP=%s\n"
           "SERVER_PORT=%d\nIMEX_NODE_CONFIG_FILE=%s\nIMEX_WAIT_FOR_QUORUM=%s\nIMEX_CMD_ENABLED=%d\n"
           "IMEX_CMD_BIND_INTERFACE_IP=%s\nIMEX_CMD_PORT=%d\nIMEX_CMD_UNIX_DOMAIN_PATH=%s\n"
           "IMEX_NODE_DISCONNECTED_GRACE_TIME=%d\n",
           c->log_level, c->log_file_name, c->log_append, c->daemonize, c->bind_ip, c->server_port,
           c->node_config_file, c->wait_for_quorum == QUORUM_NONE ? "NONE" : "RECOVERY", c->cmd_enabled,
           c->cmd_bind_ip, c->cmd_port, c->cmd_unix_path, c->grace_time);
}

/* Comment lines only: the KEY=VALUE part of --check-config stays the list of effective settings. */
static void print_auth(const char *tls_info)
{
    const struct imex_config *c = &D.cfg;
    if (!c->auth_enabled) {
        printf("# IMEX_ENABLE_AUTH_ENCRYPTION=0: peer links are plaintext\n");
        return;
    }
    const char *t = c->tls[TLS_TARGET_OVERRIDE];
    printf("# IMEX_ENABLE_AUTH_ENCRYPTION=1: mutual TLS (SSL_TLS), IMEX_AUTH_SOURCE=%s, %s%s\n",
           c->auth_source == AUTH_SOURCE_ENV_PATH ? "ENV_PATH" : "FILE",
           t && *t ? "peer certificates must carry the subjectAltName DNS:" : "peer certificates: chain only",
           t && *t ? t : "");
    if (tls_info)
        fputs(tls_info, stdout);
}

static int open_log(void)
{
    if (!D.cfg.log_file_name[0]) {
        D.log = stderr;
        return 0;
    }
    D.log = fopen(D.cfg.log_file_name, D.cfg.log_append ? "ae" : "we");
    if (!D.log) {
        fprintf(stderr, "nvidia-imex: error: cannot open LOG_FILE_NAME %s: %s\n", D.cfg.log_file_name,
                strerror(errno));
        return -1;
    }
    setvbuf(D.log, NULL, _IOLBF, 0);
    return 0;
}

static void daemonize(void)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        logmsg(LL_FATAL, "fork: %s", strerror(errno));
        exit(1);
    }
    if (pid > 0)
        _exit(0);
    setsid();
    int nul = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (nul >= 0) {
        dup2(nul, STDIN_FILENO);
        dup2(nul, STDOUT_FILENO);
        if (D.log != stderr)
            dup2(nul, STDERR_FILENO);
        if (nul > STDERR_FILENO)
            close(nul);
    }
    logmsg(LL_INFO, "running in the background (DAEMONIZE=1), pid %d", (int)getpid());
}

int main(int argc, char **argv)
{
    const char *config = IMEX_DEFAULT_CONFIG;
    int port_override = -1;
    bool check = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = NULL;
        if (!strcmp(a, "-c") || !strcmp(a, "--config") || !strcmp(a, "-p") || !strcmp(a, "--port")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "nvidia-imex: error: %s needs a value\n", a);
                usage(stderr);
                return 2;
            }
            val = argv[++i];
        } else if (!strncmp(a, "--config=", 9) || !strncmp(a, "--port=", 7)) {
            val = strchr(a, '=') + 1;
        } else if ((!strncmp(a, "-c", 2) || !strncmp(a, "-p", 2)) && a[2]) {
            val = a + 2;
        }
        if (val) {
            if (a[1] == 'c' || !strncmp(a, "--config", 8)) {
                config = val;
            } else {
                port_override = imex_parse_port(val);
                if (port_override < 0) {
                    fprintf(stderr, "nvidia-imex: error: invalid port '%s' (expected 1..65535)\n", val);
                    return 2;
                }
            }
        } else if (!strcmp(a, "--check-config")) {
            check = true;
        } else if (!strcmp(a, "--nogpu")) {
            /* accepted for compatibility */
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "-v") || !strcmp(a, "--version")) {
            printf("nvidia-imex (nvlfabric simulator stand-in) %s\n", imex_version());
            return 0;
        } else {
            fprintf(stderr, "nvidia-imex: error: unknown argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }

    /* Signals are caught from the start but only delivered inside ppoll(): a SIGUSR1 or SIGTERM that
     * arrives during start-up waits until the daemon is up instead of killing it half-way. */
    sigset_t block, unblocked;
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGUSR1);
    sigprocmask(SIG_BLOCK, &block, &unblocked);
    sigdelset(&unblocked, SIGTERM);
    sigdelset(&unblocked, SIGINT);
    sigdelset(&unblocked, SIGUSR1);
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    signal(SIGHUP, SIG_IGN);

    char err[IMEX_ERRLEN];
    imex_config_defaults(&D.cfg);
    D.config_path = config;
    if (imex_config_load(config, &D.cfg, err, sizeof err)) {
        fprintf(stderr, "nvidia-imex: error: %s\n", err);
        imex_config_free(&D.cfg);
        return 1;
    }
    if (port_override > 0)
        D.cfg.server_port = port_override;
    struct buf tls_info = {0};
    if (D.cfg.auth_enabled) {
        /* Settings, then the files: a wrong path or key is a start-up error, not a runtime surprise. */
        struct tls_creds creds;
        if (imex_config_check_auth(config, &D.cfg, err, sizeof err) ||
            tls_load(&creds, &tls_info, err, sizeof err)) {
            fprintf(stderr, "nvidia-imex: error: %s\n", err);
            buf_free(&tls_info);
            imex_config_free(&D.cfg);
            return 1;
        }
        tls_install(&creds);
    }
    if (check) {
        /* The nodes file is checked too when it exists (it may legitimately be written later). */
        if (access(D.cfg.node_config_file, F_OK) == 0) {
            struct imex_node_map m;
            if (imex_nodes_load(D.cfg.node_config_file, &m, err, sizeof err)) {
                fprintf(stderr, "nvidia-imex: error: %s\n", err);
                buf_free(&tls_info);
                imex_config_free(&D.cfg);
                return 1;
            }
            print_effective();
            printf("# %s: %zu entries, map %016llx\n", D.cfg.node_config_file, m.n, (unsigned long long)m.hash);
            imex_nodes_free(&m);
        } else {
            print_effective();
            printf("# %s: not present\n", D.cfg.node_config_file);
        }
        print_auth(tls_info.p);
        buf_free(&tls_info);
        SSL_CTX_free(D.tls_server);
        SSL_CTX_free(D.tls_client);
        imex_config_free(&D.cfg);
        return 0;
    }

    if (open_log()) {
        buf_free(&tls_info);
        return 1;
    }
    D.state = NS_INITIALIZING;
    const char *hn = getenv("NVLFABRIC_SIM_HOSTNAME");
    if (hn && *hn)
        snprintf(D.hostname, sizeof D.hostname, "%s", hn);
    else if (gethostname(D.hostname, sizeof D.hostname - 1) != 0)
        snprintf(D.hostname, sizeof D.hostname, "localhost");
    for (char *p = D.hostname; *p; p++)
        if (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
            *p = '_';
    logmsg(LL_INFO, "nvidia-imex stand-in %s starting, config %s, pid %d", imex_version(), config, (int)getpid());
    if (D.cfg.unknown_keys)
        logmsg(LL_DEBUG, "%d unknown config keys ignored", D.cfg.unknown_keys);
    if (D.cfg.auth_enabled) {
        const char *t = D.cfg.tls[TLS_TARGET_OVERRIDE];
        logmsg(LL_INFO, "peer links use mutual TLS (%s)", t && *t ? t : "no IMEX_SECURITY_TARGET_OVERRIDE: chain only");
        log_comment_lines("TLS credentials", tls_info.p);
    } else {
        logmsg(LL_INFO, "peer links are plaintext (IMEX_ENABLE_AUTH_ENCRYPTION=0)");
    }
    buf_free(&tls_info);

    struct imex_node_map map;
    if (imex_nodes_load(D.cfg.node_config_file, &map, err, sizeof err)) {
        logmsg(LL_FATAL, "%s", err);
        if (D.log != stderr)
            fprintf(stderr, "nvidia-imex: error: %s\n", err);
        return 1;
    }
    imex_nodes_resolve(&map);
    if (pick_address(&map)) {
        imex_nodes_free(&map);
        return 1;
    }
    inet_ntop(AF_INET, &D.self_addr, D.self_ip, sizeof D.self_ip);
    install_map(&map, imex_now_ms());
    logmsg(LL_INFO, "peer service on %s:%d, %zu nodes, map %016llx", D.self_ip, D.cfg.server_port, D.n,
           (unsigned long long)D.map_hash);

    if (D.cfg.cmd_enabled) {
        struct in_addr ca = D.self_addr;
        if (D.cfg.cmd_bind_ip[0])
            inet_pton(AF_INET, D.cfg.cmd_bind_ip, &ca);
        int e = 0;
        D.cmd_fd = listen_tcp(ca, D.cfg.cmd_port, &e);
        char cip[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &ca, cip, sizeof cip);
        if (D.cmd_fd < 0) {
            logmsg(LL_FATAL, "cannot listen on %s:%d for commands: %s", cip, D.cfg.cmd_port, strerror(e));
            fprintf(stderr, "nvidia-imex: error: cannot listen on %s:%d for commands: %s\n", cip, D.cfg.cmd_port,
                    strerror(e));
            return 1;
        }
        logmsg(LL_INFO, "command service on %s:%d", cip, D.cfg.cmd_port);
    }
    if (D.cfg.cmd_unix_path[0]) {
        int e = 0;
        D.unix_fd = listen_unix(D.cfg.cmd_unix_path, &e);
        if (D.unix_fd < 0) {
            logmsg(LL_FATAL, "cannot listen on %s: %s", D.cfg.cmd_unix_path, strerror(e));
            fprintf(stderr, "nvidia-imex: error: cannot listen on %s: %s\n", D.cfg.cmd_unix_path, strerror(e));
            return 1;
        }
        logmsg(LL_INFO, "command service on unix:%s", D.cfg.cmd_unix_path);
    }

    if (D.cfg.daemonize)
        daemonize();

    long delay = 0;
    const char *ds = getenv("NVLFABRIC_SIM_IMEX_READY_DELAY_MS");
    if (ds && *ds) {
        delay = strtol(ds, NULL, 10);
        if (delay < 0 || delay > 3600000)
            delay = 0;
    }
    set_state(NS_WAITING_FOR_PEERS);
    D.ready_at = imex_now_ms() + delay;
    logmsg(LL_INFO, "IMEX_WAIT_FOR_QUORUM=%s: no unsafe termination to recover from, READY %s",
           D.cfg.wait_for_quorum == QUORUM_NONE ? "NONE" : "RECOVERY", delay ? "after the simulated delay" : "now");

    loop(&unblocked);
    shutdown_all();
    imex_config_free(&D.cfg);
    if (D.log && D.log != stderr)
        fclose(D.log);
    return 0;
}
