/* nvidia-imex-ctl stand-in for the nvlfabric GB200 simulator: asks one nvidia-imex stand-in over its
 * command service (TCP IMEX_CMD_BIND_INTERFACE_IP:IMEX_CMD_PORT, or IMEX_CMD_UNIX_DOMAIN_PATH).
 *
 * Exit status: 0 success (-q: the daemon is READY); 1 the daemon answered but is not READY, or
 * refused the request; 2 usage or config error; 3 no daemon answered (-q prints UNAVAILABLE). */
#include "imex_common.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define CONNECT_TIMEOUT_MS 2000
#define REPLY_TIMEOUT_MS 5000
#define PROBE_TIMEOUT_MS 300

static void usage(FILE *f)
{
    fprintf(f,
            "usage: nvidia-imex-ctl [-c <config.cfg>] (-q | -N [-j] [-H]) [-i <ip> [<port>]] [-p <port>]\n"
            "                       [-u <socket> | --u=<socket>]\n"
            "\n"
            "nvlfabric simulator stand-in for nvidia-imex-ctl.\n"
            "\n"
            "  -c, --config FILE  daemon config to read the command address from (default " IMEX_DEFAULT_CONFIG ")\n"
            "  -q, --query        print the daemon state; READY exits 0, anything else non-zero\n"
            "  -N, --nodes        print the node table, connectivity matrix and domain state\n"
            "  -j, --json         with -N: JSON output\n"
            "  -H, --hostnames    with -N: show host names\n"
            "  -i, --ip IP        command service address (overrides the config)\n"
            "  -p, --port PORT    command service port (overrides the config)\n"
            "  -u, --u SOCKET     command service unix socket\n"
            "  -v, --version      print the version\n"
            "  -h, --help         this text\n"
            "\n"
            "exit status: 0 ok/READY, 1 not READY or refused, 2 usage/config error, 3 unavailable\n");
}

static int wait_fd(int fd, short ev, int64_t deadline)
{
    for (;;) {
        int64_t left = deadline - imex_now_ms();
        if (left <= 0)
            return -1;
        struct pollfd p = {.fd = fd, .events = ev};
        int rc = poll(&p, 1, (int)left);
        if (rc < 0 && errno == EINTR)
            continue;
        return rc > 0 ? 0 : -1;
    }
}

static int connect_to(const struct sockaddr *sa, socklen_t sl, int family, int timeout_ms, char *why, size_t wl)
{
    int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(why, wl, "socket: %s", strerror(errno));
        return -1;
    }
    if (connect(fd, sa, sl) < 0) {
        if (errno != EINPROGRESS) {
            snprintf(why, wl, "%s", strerror(errno));
            close(fd);
            return -1;
        }
        if (wait_fd(fd, POLLOUT, imex_now_ms() + timeout_ms) < 0) {
            snprintf(why, wl, "connection timed out");
            close(fd);
            return -1;
        }
        int err = 0;
        socklen_t l = sizeof err;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &l);
        if (err) {
            snprintf(why, wl, "%s", strerror(err));
            close(fd);
            return -1;
        }
    }
    return fd;
}

static int connect_tcp(const char *ip, int port, int timeout_ms, char *why, size_t wl)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, ip, &sa.sin_addr) != 1) {
        snprintf(why, wl, "'%s' is not an IPv4 address", ip);
        return -1;
    }
    return connect_to((struct sockaddr *)&sa, sizeof sa, AF_INET, timeout_ms, why, wl);
}

static int connect_unix(const char *path, char *why, size_t wl)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof sa.sun_path) {
        snprintf(why, wl, "socket path too long");
        return -1;
    }
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    return connect_to((struct sockaddr *)&sa, sizeof sa, AF_UNIX, CONNECT_TIMEOUT_MS, why, wl);
}

/* Sends `req`, reads the whole reply. 0 on success. */
static int exchange(int fd, const char *req, char **reply, size_t *rlen, char *why, size_t wl)
{
    int64_t deadline = imex_now_ms() + REPLY_TIMEOUT_MS;
    size_t off = 0, n = strlen(req);
    while (off < n) {
        ssize_t w = send(fd, req + off, n - off, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN && wait_fd(fd, POLLOUT, deadline) == 0)
                continue;
            snprintf(why, wl, "send: %s", strerror(errno));
            return -1;
        }
        off += (size_t)w;
    }
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    if (!buf) {
        snprintf(why, wl, "out of memory");
        return -1;
    }
    for (;;) {
        if (len + 1 >= cap) {
            char *nb = cap < (64u << 20) ? realloc(buf, cap * 2) : NULL;
            if (!nb) {
                free(buf);
                snprintf(why, wl, "reply too large");
                return -1;
            }
            buf = nb;
            cap *= 2;
        }
        ssize_t r = recv(fd, buf + len, cap - len - 1, 0);
        if (r > 0) {
            len += (size_t)r;
            continue;
        }
        if (r == 0)
            break;
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN && wait_fd(fd, POLLIN, deadline) == 0)
            continue;
        free(buf);
        snprintf(why, wl, errno == EAGAIN ? "no reply in time" : "recv: %s", strerror(errno));
        return -1;
    }
    buf[len] = '\0';
    *reply = buf;
    *rlen = len;
    return 0;
}

int main(int argc, char **argv)
{
    const char *config = NULL, *ip = NULL, *unix_path = NULL;
    int port = -1;
    bool query = false, nodes = false, json = false, hostnames = false;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = NULL;
        char opt = 0;
        if (!strncmp(a, "--", 2)) {
            const char *eq = strchr(a, '=');
            size_t nl = eq ? (size_t)(eq - a) : strlen(a);
            static const struct {
                const char *name;
                char opt;
            } longs[] = {{"--config", 'c'}, {"--query", 'q'}, {"--nodes", 'N'}, {"--json", 'j'},
                         {"--hostnames", 'H'}, {"--ip", 'i'}, {"--port", 'p'}, {"--u", 'u'},
                         {"--unix-socket", 'u'}, {"--help", 'h'}, {"--version", 'v'}};
            for (size_t k = 0; k < sizeof longs / sizeof longs[0]; k++)
                if (strlen(longs[k].name) == nl && !strncmp(a, longs[k].name, nl))
                    opt = longs[k].opt;
            if (!opt) {
                fprintf(stderr, "nvidia-imex-ctl: unknown option '%s'\n", a);
                usage(stderr);
                return 2;
            }
            if (strchr("cipu", opt)) {
                if (eq)
                    val = eq + 1;
                else if (i + 1 < argc)
                    val = argv[++i];
            } else if (eq) {
                fprintf(stderr, "nvidia-imex-ctl: option '%.*s' takes no value\n", (int)nl, a);
                return 2;
            }
        } else if (a[0] == '-' && a[1]) {
            /* short options, flags may be grouped (-Nj) */
            for (const char *p = a + 1; *p; p++) {
                if (strchr("cipu", *p)) {
                    opt = *p;
                    if (p[1])
                        val = p + 1;
                    else if (i + 1 < argc)
                        val = argv[++i];
                    break;
                }
                switch (*p) {
                case 'q': query = true; break;
                case 'N': nodes = true; break;
                case 'j': json = true; break;
                case 'H': hostnames = true; break;
                case 'h': usage(stdout); return 0;
                case 'v': printf("nvidia-imex-ctl (nvlfabric simulator stand-in) %s\n", imex_version()); return 0;
                default:
                    fprintf(stderr, "nvidia-imex-ctl: unknown option '-%c'\n", *p);
                    usage(stderr);
                    return 2;
                }
            }
            if (!opt)
                continue;
        } else if (ip && port < 0 && imex_parse_port(a) > 0) {
            port = imex_parse_port(a); /* "-i <ip> <port>", as older NVIDIA drivers invoke it */
            continue;
        } else {
            fprintf(stderr, "nvidia-imex-ctl: unexpected argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
        switch (opt) {
        case 'q': query = true; continue;
        case 'N': nodes = true; continue;
        case 'j': json = true; continue;
        case 'H': hostnames = true; continue;
        case 'h': usage(stdout); return 0;
        case 'v': printf("nvidia-imex-ctl (nvlfabric simulator stand-in) %s\n", imex_version()); return 0;
        default: break;
        }
        if (!val) {
            fprintf(stderr, "nvidia-imex-ctl: option '%s' needs a value\n", a);
            return 2;
        }
        if (opt == 'c') {
            config = val;
        } else if (opt == 'i') {
            ip = val;
        } else if (opt == 'u') {
            unix_path = val;
        } else if (opt == 'p') {
            port = imex_parse_port(val);
            if (port < 0) {
                fprintf(stderr, "nvidia-imex-ctl: invalid port '%s' (expected 1..65535)\n", val);
                return 2;
            }
        }
    }
    if (query == nodes) {
        fprintf(stderr, "nvidia-imex-ctl: give exactly one of -q and -N\n");
        usage(stderr);
        return 2;
    }

    struct imex_config cfg;
    char err[IMEX_ERRLEN];
    imex_config_defaults(&cfg);
    struct stat st;
    const char *cfg_path = config ? config : (stat(IMEX_DEFAULT_CONFIG, &st) == 0 ? IMEX_DEFAULT_CONFIG : NULL);
    if (cfg_path && imex_config_load(cfg_path, &cfg, err, sizeof err)) {
        fprintf(stderr, "nvidia-imex-ctl: error: %s\n", err);
        imex_config_free(&cfg);
        return 2;
    }
    if (port < 0)
        port = cfg.cmd_port;

    char target[256], why[256] = "";
    int fd = -1;
    if (!unix_path && !ip && !cfg.cmd_enabled && cfg.cmd_unix_path[0])
        unix_path = cfg.cmd_unix_path;
    if (unix_path) {
        snprintf(target, sizeof target, "unix:%s", unix_path);
        fd = connect_unix(unix_path, why, sizeof why);
    } else {
        char chosen[INET_ADDRSTRLEN] = "";
        if (ip)
            snprintf(chosen, sizeof chosen, "%.15s", ip);
        else if (cfg.cmd_bind_ip[0])
            snprintf(chosen, sizeof chosen, "%s", cfg.cmd_bind_ip);
        else if (cfg.bind_ip[0])
            snprintf(chosen, sizeof chosen, "%s", cfg.bind_ip);
        if (chosen[0]) {
            snprintf(target, sizeof target, "%s:%d", chosen, port);
            fd = connect_tcp(chosen, port, CONNECT_TIMEOUT_MS, why, sizeof why);
        } else {
            /* Like the daemon: the nodes-file entry that is a local interface address; else (the
             * simulator's 127/8 nodes) the first loopback entry whose command port answers. */
            struct imex_node_map map = {0};
            if (cfg_path && imex_nodes_load(cfg.node_config_file, &map, err, sizeof err) == 0) {
                imex_nodes_resolve(&map);
                for (int pass = 0; pass < 2 && fd < 0 && !chosen[0]; pass++)
                    for (size_t k = 0; k < map.n && fd < 0; k++) {
                        struct imex_node *nd = &map.nodes[k];
                        if (!nd->resolved)
                            continue;
                        bool ok = pass == 0 ? imex_addr_on_interface(nd->addr)
                                            : (ntohl(nd->addr.s_addr) >> 24) == 127;
                        if (!ok)
                            continue;
                        char a[INET_ADDRSTRLEN];
                        inet_ntop(AF_INET, &nd->addr, a, sizeof a);
                        if (pass == 0) {
                            snprintf(chosen, sizeof chosen, "%s", a);
                            break;
                        }
                        fd = connect_tcp(a, port, PROBE_TIMEOUT_MS, why, sizeof why);
                        if (fd >= 0)
                            snprintf(chosen, sizeof chosen, "%s", a);
                    }
                imex_nodes_free(&map);
            }
            if (!chosen[0])
                snprintf(chosen, sizeof chosen, "127.0.0.1");
            snprintf(target, sizeof target, "%s:%d", chosen, port);
            if (fd < 0)
                fd = connect_tcp(chosen, port, CONNECT_TIMEOUT_MS, why, sizeof why);
        }
    }
    imex_config_free(&cfg);

    char *reply = NULL;
    size_t rlen = 0;
    if (fd >= 0) {
        char req[64];
        snprintf(req, sizeof req, "%s %s%s%s\n", IMEX_PROTO, query ? "QUERY" : "NODES", json ? " JSON" : "",
                 hostnames ? " HOSTNAMES" : "");
        int rc = exchange(fd, req, &reply, &rlen, why, sizeof why);
        close(fd);
        if (rc)
            reply = NULL;
    }
    if (!reply) {
        fprintf(stderr, "nvidia-imex-ctl: cannot reach the IMEX daemon at %s: %s\n", target, why);
        if (query)
            printf("%s\n", imex_state_name(NS_UNAVAILABLE));
        return 3;
    }
    if (strncmp(reply, "OK\n", 3) != 0) {
        size_t l = strcspn(reply, "\n");
        fprintf(stderr, "nvidia-imex-ctl: daemon at %s refused the request: %.*s\n", target, (int)l, reply);
        free(reply);
        return 1;
    }
    const char *body = reply + 3;
    fwrite(body, 1, rlen - 3, stdout);
    int rc = 0;
    if (query)
        rc = strcmp(body, "READY\n") == 0 ? 0 : 1;
    free(reply);
    return rc;
}
