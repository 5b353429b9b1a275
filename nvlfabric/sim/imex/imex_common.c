/* Shared code of the IMEX stand-ins: see imex_common.h. */
#include "imex_common.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------------------------------------ */
/* Tables                                                                                          */

static const char *const state_names[NS_COUNT] = {
    "INITIALIZING", "STARTING_AUTH_SERVER", "WAITING_FOR_PEERS", "WAITING_FOR_RECOVERY",
    "INIT_GPU",     "READY",                "SHUTTING_DOWN",     "UNAVAILABLE",
};

const char *imex_state_name(int state)
{
    if (state < 0 || state >= NS_COUNT)
        return "UNAVAILABLE";
    return state_names[state];
}

int imex_state_from_name(const char *name)
{
    for (int i = 0; i < NS_COUNT; i++)
        if (strcmp(state_names[i], name) == 0)
            return i;
    return -1;
}

static const struct {
    const char *code;
    const char *name;
    char wire;
} conn_table[CS_COUNT] = {
    [CS_INVALID] = {"I", "INVALID", 'I'},
    [CS_NEVER_CONNECTED] = {"N", "NEVER_CONNECTED", 'N'},
    [CS_RECOVERING] = {"R", "RECOVERING", 'R'},
    [CS_DISCONNECTED] = {"D", "DISCONNECTED", 'D'},
    [CS_AUTHENTICATING] = {"A", "AUTHENTICATING", 'A'},
    [CS_VERSION_MISMATCH] = {"!V!", "VERSION_MISMATCH", 'V'},
    [CS_MAP_MISMATCH] = {"!M!", "MAP_MISMATCH", 'M'},
    [CS_CONNECTED] = {"C", "CONNECTED", 'C'},
};

const char *imex_conn_code(int cs)
{
    return (cs >= 0 && cs < CS_COUNT) ? conn_table[cs].code : "I";
}

const char *imex_conn_name(int cs)
{
    return (cs >= 0 && cs < CS_COUNT) ? conn_table[cs].name : "INVALID";
}

char imex_conn_wire(int cs)
{
    return (cs >= 0 && cs < CS_COUNT) ? conn_table[cs].wire : 'I';
}

int imex_conn_from_wire(char c)
{
    for (int i = 0; i < CS_COUNT; i++)
        if (conn_table[i].wire == c)
            return i;
    return -1;
}

/* ------------------------------------------------------------------------------------------------ */
/* Utilities                                                                                       */

int64_t imex_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void imex_timestamp(char *buf, size_t len)
{
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    localtime_r(&ts.tv_sec, &tm);
    snprintf(buf, len, "%d/%d/%04d %02d:%02d:%02d.%03d", tm.tm_mon + 1, tm.tm_mday, tm.tm_year + 1900,
             tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(ts.tv_nsec / 1000000));
}

void imex_escape(char *dst, size_t dstlen, const char *src, size_t srclen)
{
    size_t o = 0;
    if (dstlen == 0)
        return;
    for (size_t i = 0; i < srclen; i++) {
        unsigned char c = (unsigned char)src[i];
        char tmp[8];
        size_t tl;
        if (c >= 0x20 && c < 0x7f && c != '\\') {
            tmp[0] = (char)c;
            tl = 1;
        } else {
            tl = (size_t)snprintf(tmp, sizeof tmp, "\\x%02x", c);
        }
        if (o + tl + 4 >= dstlen) {
            if (o + 3 < dstlen) {
                memcpy(dst + o, "...", 3);
                o += 3;
            }
            break;
        }
        memcpy(dst + o, tmp, tl);
        o += tl;
    }
    dst[o] = '\0';
}

static void seterr(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void seterr(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    if (!err || errlen == 0)
        return;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

int imex_read_file(const char *path, char **out, size_t *len, char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        seterr(err, errlen, "cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap + 1);
    if (!buf) {
        close(fd);
        seterr(err, errlen, "out of memory reading %s", path);
        return -1;
    }
    for (;;) {
        if (n == cap) {
            if (cap >= (16u << 20)) {
                free(buf);
                close(fd);
                seterr(err, errlen, "%s is too large (over 16 MiB)", path);
                return -1;
            }
            char *nb = realloc(buf, cap * 2 + 1);
            if (!nb) {
                free(buf);
                close(fd);
                seterr(err, errlen, "out of memory reading %s", path);
                return -1;
            }
            buf = nb;
            cap *= 2;
        }
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            seterr(err, errlen, "cannot read %s: %s", path, strerror(errno));
            free(buf);
            close(fd);
            return -1;
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    close(fd);
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return 0;
}

int imex_parse_port(const char *s)
{
    char *end;
    if (!s || !*s || !isdigit((unsigned char)*s))
        return -1;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < 1 || v > 65535)
        return -1;
    return (int)v;
}

const char *imex_version(void)
{
    const char *v = getenv("NVLFABRIC_SIM_IMEX_VERSION");
    if (v && *v && strlen(v) < 32) {
        for (const char *p = v; *p; p++)
            if (!isalnum((unsigned char)*p) && *p != '.' && *p != '-')
                return IMEX_SIM_VERSION_DEFAULT;
        return v;
    }
    return IMEX_SIM_VERSION_DEFAULT;
}

/* ------------------------------------------------------------------------------------------------ */
/* Line splitting shared by both parsers                                                          */

struct line_iter {
    const char *text;
    size_t len, pos;
    int lineno;
};

/* Returns the next line (without '\n', '\r' and surrounding blanks) or NULL at the end.
 * *has_nul is set when the raw line contained a NUL byte. */
static const char *next_line(struct line_iter *it, size_t *out_len, bool *has_nul)
{
    if (it->pos >= it->len)
        return NULL;
    const char *start = it->text + it->pos;
    const char *nl = memchr(start, '\n', it->len - it->pos);
    size_t raw = nl ? (size_t)(nl - start) : it->len - it->pos;
    it->pos += raw + (nl ? 1 : 0);
    it->lineno++;
    *has_nul = memchr(start, '\0', raw) != NULL;
    size_t b = 0, e = raw;
    while (b < e && (start[b] == ' ' || start[b] == '\t' || start[b] == '\r' || start[b] == '\v' ||
                     start[b] == '\f'))
        b++;
    while (e > b && (start[e - 1] == ' ' || start[e - 1] == '\t' || start[e - 1] == '\r' ||
                     start[e - 1] == '\v' || start[e - 1] == '\f'))
        e--;
    *out_len = e - b;
    return start + b;
}

/* ------------------------------------------------------------------------------------------------ */
/* Config file                                                                                     */

const char *const imex_tls_key_names[TLS_NKEYS] = {
    "IMEX_SERVER_KEY", "IMEX_SERVER_CERT", "IMEX_SERVER_CERT_AUTH", "IMEX_CLIENT_KEY",
    "IMEX_CLIENT_CERT", "IMEX_CLIENT_CERT_AUTH", "IMEX_SECURITY_TARGET_OVERRIDE",
};

void imex_config_defaults(struct imex_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->log_level = 4;
    cfg->log_file_name = strdup(IMEX_DEFAULT_LOG);
    cfg->log_append = 1;
    cfg->daemonize = 1;
    cfg->server_port = 50000;
    cfg->node_config_file = strdup(IMEX_DEFAULT_NODES);
    cfg->wait_for_quorum = QUORUM_RECOVERY;
    cfg->cmd_enabled = 1;
    cfg->cmd_port = 50005;
    cfg->cmd_unix_path = strdup("");
    cfg->grace_time = -1;
    cfg->auth_mode = AUTH_SSL_TLS;
    cfg->auth_source = AUTH_SOURCE_UNSET;
}

void imex_config_free(struct imex_config *cfg)
{
    free(cfg->log_file_name);
    free(cfg->node_config_file);
    free(cfg->cmd_unix_path);
    cfg->log_file_name = cfg->node_config_file = cfg->cmd_unix_path = NULL;
    for (int k = 0; k < TLS_NKEYS; k++) {
        free(cfg->tls[k]);
        cfg->tls[k] = NULL;
    }
}

int imex_config_check_auth(const char *name, const struct imex_config *cfg, char *err, size_t errlen)
{
    static const char *const modes[] = {"SSL_TLS", "GSS_AUTH_ENCRYPT", "GSS_AUTH_ONLY"};
    if (!cfg->auth_enabled)
        return 0;
    if (cfg->auth_mode != AUTH_SSL_TLS) {
        seterr(err, errlen,
               "%s:%d: IMEX_AUTH_ENCRYPTION_MODE: %s is not supported by the stand-in (Kerberos/GSSAPI is not "
               "implemented by the IMEX stand-in; use SSL_TLS)",
               name, cfg->auth_mode_line, modes[cfg->auth_mode]);
        return -1;
    }
    /* Missing keys before the source check: config.py's model checks in the same order, so both
     * name the same line for the same file. */
    for (int k = 0; k < TLS_TARGET_OVERRIDE; k++)
        if (!cfg->tls[k] || !cfg->tls[k][0]) {
            seterr(err, errlen,
                   "%s:%d: %s: required when IMEX_ENABLE_AUTH_ENCRYPTION=1 with IMEX_AUTH_ENCRYPTION_MODE=SSL_TLS",
                   name, cfg->auth_line, imex_tls_key_names[k]);
            return -1;
        }
    if (cfg->auth_source == AUTH_SOURCE_ENV_VAL) {
        seterr(err, errlen,
               "%s:%d: IMEX_AUTH_SOURCE: ENV_VAL (PEM text in environment variables) is not implemented by the "
               "IMEX stand-in; use FILE or ENV_PATH",
               name, cfg->auth_source_line);
        return -1;
    }
    return 0;
}

/* Each checker returns 0, or -1 with a description of what was expected in `why`. */
static int parse_int(const char *v, long min, long max, int *out, char *why, size_t wl)
{
    char *end;
    if (!*v) /* empty value: keep the default */
        return 0;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || end == v || isspace((unsigned char)*v) || x < min || x > max) {
        seterr(why, wl, "expected an integer in %ld..%ld", min, max);
        return -1;
    }
    if (out)
        *out = (int)x;
    return 0;
}

static int parse_ipv4(const char *v, char *out, char *why, size_t wl)
{
    struct in_addr a;
    struct in6_addr a6;
    if (!*v) {
        out[0] = '\0';
        return 0;
    }
    if (inet_pton(AF_INET, v, &a) == 1) {
        inet_ntop(AF_INET, &a, out, INET_ADDRSTRLEN);
        return 0;
    }
    if (inet_pton(AF_INET6, v, &a6) == 1)
        seterr(why, wl, "IPv6 addresses are not supported by the IMEX stand-in");
    else
        seterr(why, wl, "expected an IPv4 address or an empty value");
    return -1;
}

static int parse_choice(const char *v, const char *const *choices, int *out, char *why, size_t wl)
{
    if (!*v)
        return 0;
    for (int i = 0; choices[i]; i++)
        if (strcmp(v, choices[i]) == 0) {
            if (out)
                *out = i;
            return 0;
        }
    size_t o = (size_t)snprintf(why, wl, "expected one of");
    for (int i = 0; choices[i] && o < wl; i++)
        o += (size_t)snprintf(why + o, wl - o, "%s %s", i ? "," : "", choices[i]);
    return -1;
}

static int set_string(char **slot, const char *v)
{
    char *d = strdup(v);
    if (!d)
        return -1;
    free(*slot);
    *slot = d;
    return 0;
}

static const char *const ignored_strings[] = {
    "STATS_FILE_NAME", "NETWORK_INTERFACE", "IMEX_GSS_SERVICE_NAME", NULL,
};

/* 0 ok, 1 unknown key (ignored), -1 bad value (why filled). */
static int apply_key(struct imex_config *cfg, const char *k, const char *v, int lineno, char *why, size_t wl)
{
    static const char *const quorum[] = {"NONE", "RECOVERY", NULL};
    static const char *const auth_modes[] = {"SSL_TLS", "GSS_AUTH_ENCRYPT", "GSS_AUTH_ONLY", NULL};
    static const char *const auth_sources[] = {"FILE", "ENV_PATH", "ENV_VAL", NULL};

    if (!strcmp(k, "LOG_LEVEL"))
        return parse_int(v, 0, 5, &cfg->log_level, why, wl);
    if (!strcmp(k, "LOG_FILE_NAME"))
        return set_string(&cfg->log_file_name, v) ? (seterr(why, wl, "out of memory"), -1) : 0;
    if (!strcmp(k, "LOG_APPEND_TO_LOG"))
        return parse_int(v, 0, 1, &cfg->log_append, why, wl);
    if (!strcmp(k, "LOG_FILE_MAX_SIZE") || !strcmp(k, "LOG_MAX_ROTATE_COUNT"))
        return parse_int(v, 0, 1000000000L, NULL, why, wl);
    if (!strcmp(k, "LOG_USE_SYSLOG"))
        return parse_int(v, 0, 1, NULL, why, wl);
    if (!strcmp(k, "DAEMONIZE"))
        return parse_int(v, 0, 1, &cfg->daemonize, why, wl);
    if (!strcmp(k, "BIND_INTERFACE_IP"))
        return parse_ipv4(v, cfg->bind_ip, why, wl);
    if (!strcmp(k, "SERVER_PORT"))
        return parse_int(v, 1, 65535, &cfg->server_port, why, wl);
    if (!strcmp(k, "IMEX_NODE_CONFIG_FILE")) {
        if (!*v) {
            seterr(why, wl, "expected a path, got an empty value");
            return -1;
        }
        return set_string(&cfg->node_config_file, v) ? (seterr(why, wl, "out of memory"), -1) : 0;
    }
    if (!strcmp(k, "IMEX_WAIT_FOR_QUORUM"))
        return parse_choice(v, quorum, &cfg->wait_for_quorum, why, wl);
    if (!strcmp(k, "IMEX_ENABLE_AUTH_ENCRYPTION")) {
        if (parse_int(v, 0, 1, &cfg->auth_enabled, why, wl))
            return -1;
        if (*v)
            cfg->auth_line = lineno;
        return 0;
    }
    if (!strcmp(k, "IMEX_AUTH_ENCRYPTION_MODE")) {
        if (parse_choice(v, auth_modes, &cfg->auth_mode, why, wl))
            return -1;
        if (*v)
            cfg->auth_mode_line = lineno;
        return 0;
    }
    if (!strcmp(k, "IMEX_AUTH_SOURCE")) {
        if (parse_choice(v, auth_sources, &cfg->auth_source, why, wl))
            return -1;
        if (*v)
            cfg->auth_source_line = lineno;
        return 0;
    }
    for (int t = 0; t < TLS_NKEYS; t++)
        if (!strcmp(k, imex_tls_key_names[t])) {
            if (set_string(&cfg->tls[t], v)) {
                seterr(why, wl, "out of memory");
                return -1;
            }
            cfg->tls_line[t] = lineno;
            return 0;
        }
    if (!strcmp(k, "IMEX_GSS_TIMEOUT_SEC") || !strcmp(k, "IMEX_GSS_SEC_CONTEXT_LIFETIME_SEC"))
        return parse_int(v, -1, 1000000000L, NULL, why, wl);
    if (!strcmp(k, "IMEX_GSS_RETRY_INTERVAL_SEC"))
        return parse_int(v, 0, 1000000000L, NULL, why, wl);
    if (!strcmp(k, "IMEX_GSS_SHUTDOWN_ON_FAILURE"))
        return parse_int(v, 0, 1, NULL, why, wl);
    if (!strcmp(k, "IMEX_CMD_ENABLED"))
        return parse_int(v, 0, 1, &cfg->cmd_enabled, why, wl);
    if (!strcmp(k, "IMEX_CMD_BIND_INTERFACE_IP"))
        return parse_ipv4(v, cfg->cmd_bind_ip, why, wl);
    if (!strcmp(k, "IMEX_CMD_PORT"))
        return parse_int(v, 1, 65535, &cfg->cmd_port, why, wl);
    if (!strcmp(k, "IMEX_CMD_UNIX_DOMAIN_PATH")) {
        if (strlen(v) >= sizeof(((struct sockaddr_un *)0)->sun_path)) {
            seterr(why, wl, "path too long for a unix socket (at most %zu bytes)",
                   sizeof(((struct sockaddr_un *)0)->sun_path) - 1);
            return -1;
        }
        return set_string(&cfg->cmd_unix_path, v) ? (seterr(why, wl, "out of memory"), -1) : 0;
    }
    if (!strcmp(k, "IMEX_NODE_DISCONNECTED_GRACE_TIME"))
        return parse_int(v, -1, 1000000000L, &cfg->grace_time, why, wl);
    for (int i = 0; ignored_strings[i]; i++)
        if (!strcmp(k, ignored_strings[i]))
            return 0;
    return 1;
}

static bool key_char(char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
}

int imex_config_parse(const char *name, const char *text, size_t len, struct imex_config *cfg, char *err,
                      size_t errlen)
{
    struct line_iter it = {text, len, 0, 0};
    const char *line;
    size_t ll;
    bool has_nul;
    char esc[160], why[256];

    while ((line = next_line(&it, &ll, &has_nul)) != NULL) {
        if (has_nul) {
            seterr(err, errlen, "%s:%d: malformed line: contains a NUL byte", name, it.lineno);
            return -1;
        }
        if (ll == 0 || line[0] == '#')
            continue;
        for (size_t i = 0; i < ll; i++) {
            unsigned char c = (unsigned char)line[i];
            if ((c < 0x20 && c != '\t') || c == 0x7f) {
                seterr(err, errlen, "%s:%d: malformed line: contains the control character 0x%02x", name,
                       it.lineno, c);
                return -1;
            }
        }
        const char *eq = memchr(line, '=', ll);
        if (!eq) {
            imex_escape(esc, sizeof esc, line, ll);
            seterr(err, errlen, "%s:%d: malformed line '%s': expected KEY=VALUE", name, it.lineno, esc);
            return -1;
        }
        size_t kl = (size_t)(eq - line);
        while (kl > 0 && (line[kl - 1] == ' ' || line[kl - 1] == '\t'))
            kl--;
        bool key_ok = kl > 0;
        for (size_t i = 0; key_ok && i < kl; i++)
            key_ok = key_char(line[i]);
        if (!key_ok) {
            imex_escape(esc, sizeof esc, line, kl);
            seterr(err, errlen, "%s:%d: malformed key '%s': expected KEY=VALUE with KEY made of A-Z, 0-9 and _",
                   name, it.lineno, esc);
            return -1;
        }
        if (kl >= 128) { /* longer than any key we know: an unknown key, ignored */
            cfg->unknown_keys++;
            continue;
        }
        char key[128];
        memcpy(key, line, kl);
        key[kl] = '\0';
        const char *vs = eq + 1, *ve = line + ll;
        while (vs < ve && (*vs == ' ' || *vs == '\t'))
            vs++;
        size_t vl = (size_t)(ve - vs);
        char *value = malloc(vl + 1);
        if (!value) {
            seterr(err, errlen, "%s:%d: %s: out of memory", name, it.lineno, key);
            return -1;
        }
        memcpy(value, vs, vl);
        value[vl] = '\0';
        why[0] = '\0';
        int rc = apply_key(cfg, key, value, it.lineno, why, sizeof why);
        if (rc < 0) {
            imex_escape(esc, sizeof esc, value, vl);
            seterr(err, errlen, "%s:%d: %s: invalid value '%s': %s", name, it.lineno, key, esc, why);
            free(value);
            return -1;
        }
        if (rc == 1)
            cfg->unknown_keys++;
        free(value);
    }
    return 0;
}

int imex_config_load(const char *path, struct imex_config *cfg, char *err, size_t errlen)
{
    char *text;
    size_t len;
    char e2[IMEX_ERRLEN];
    if (imex_read_file(path, &text, &len, e2, sizeof e2)) {
        seterr(err, errlen, "config file: %s", e2);
        return -1;
    }
    int rc = imex_config_parse(path, text, len, cfg, err, errlen);
    free(text);
    return rc;
}

/* ------------------------------------------------------------------------------------------------ */
/* Nodes file                                                                                      */

static bool valid_hostname(const char *s, size_t n)
{
    if (n == 0 || n > 253 || s[0] == '-' || s[0] == '.')
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
              c == '.' || c == '_'))
            return false;
    }
    return true;
}

void imex_nodes_free(struct imex_node_map *map)
{
    for (size_t i = 0; i < map->n; i++)
        free(map->nodes[i].name);
    free(map->nodes);
    map->nodes = NULL;
    map->n = 0;
    map->hash = 0;
}

int imex_nodes_parse(const char *name, const char *text, size_t len, struct imex_node_map *map, char *err,
                     size_t errlen)
{
    struct line_iter it = {text, len, 0, 0};
    const char *line;
    size_t ll, cap = 0;
    bool has_nul;
    char esc[160];
    uint64_t h = 1469598103934665603ULL;

    memset(map, 0, sizeof *map);
    while ((line = next_line(&it, &ll, &has_nul)) != NULL) {
        if (has_nul) {
            seterr(err, errlen, "%s:%d: malformed line: contains a NUL byte", name, it.lineno);
            goto fail;
        }
        if (ll == 0 || line[0] == '#')
            continue;
        imex_escape(esc, sizeof esc, line, ll);
        struct imex_node node = {0};
        char tmp[256];
        struct in6_addr a6;
        if (ll < sizeof tmp) {
            memcpy(tmp, line, ll);
            tmp[ll] = '\0';
        } else {
            tmp[0] = '\0';
        }
        if (tmp[0] && inet_pton(AF_INET, tmp, &node.addr) == 1) {
            node.literal = node.resolved = true;
        } else if (tmp[0] && inet_pton(AF_INET6, tmp, &a6) == 1) {
            seterr(err, errlen, "%s:%d: '%s': IPv6 addresses are not supported by the IMEX stand-in", name,
                   it.lineno, esc);
            goto fail;
        } else if (!valid_hostname(line, ll)) {
            seterr(err, errlen, "%s:%d: invalid node entry '%s': expected one IPv4 address or hostname per line",
                   name, it.lineno, esc);
            goto fail;
        }
        for (size_t i = 0; i < map->n; i++)
            if (strlen(map->nodes[i].name) == ll && !memcmp(map->nodes[i].name, line, ll)) {
                seterr(err, errlen, "%s:%d: duplicate node entry '%s'", name, it.lineno, esc);
                goto fail;
            }
        if (map->n >= IMEX_MAX_NODES) {
            seterr(err, errlen, "%s:%d: too many nodes (at most %d)", name, it.lineno, IMEX_MAX_NODES);
            goto fail;
        }
        if (map->n == cap) {
            size_t nc = cap ? cap * 2 : 16;
            struct imex_node *nn = realloc(map->nodes, nc * sizeof *nn);
            if (!nn) {
                seterr(err, errlen, "%s: out of memory", name);
                goto fail;
            }
            map->nodes = nn;
            cap = nc;
        }
        node.name = strndup(line, ll);
        if (!node.name) {
            seterr(err, errlen, "%s: out of memory", name);
            goto fail;
        }
        map->nodes[map->n++] = node;
        for (size_t i = 0; i < ll; i++) {
            h ^= (unsigned char)line[i];
            h *= 1099511628211ULL;
        }
        h ^= '\n';
        h *= 1099511628211ULL;
    }
    map->hash = h;
    return 0;
fail:
    imex_nodes_free(map);
    return -1;
}

int imex_nodes_load(const char *path, struct imex_node_map *map, char *err, size_t errlen)
{
    char *text;
    size_t len;
    char e2[IMEX_ERRLEN];
    memset(map, 0, sizeof *map);
    if (imex_read_file(path, &text, &len, e2, sizeof e2)) {
        seterr(err, errlen, "nodes file: %s", e2);
        return -1;
    }
    int rc = imex_nodes_parse(path, text, len, map, err, errlen);
    free(text);
    return rc;
}

/* Looks `name` up in a hosts(5)-format buffer; first match wins, like /etc/hosts. */
static bool hosts_lookup(const char *hosts, size_t len, const char *name, struct in_addr *out)
{
    struct line_iter it = {hosts, len, 0, 0};
    const char *line;
    size_t ll;
    bool has_nul;
    while ((line = next_line(&it, &ll, &has_nul)) != NULL) {
        if (has_nul || ll == 0 || line[0] == '#' || ll > 4000)
            continue;
        char buf[4001];
        memcpy(buf, line, ll);
        buf[ll] = '\0';
        char *hash = strchr(buf, '#');
        if (hash)
            *hash = '\0';
        char *save = NULL, *tok = strtok_r(buf, " \t", &save);
        struct in_addr a;
        if (!tok || inet_pton(AF_INET, tok, &a) != 1)
            continue;
        while ((tok = strtok_r(NULL, " \t", &save)) != NULL)
            if (strcasecmp(tok, name) == 0) {
                *out = a;
                return true;
            }
    }
    return false;
}

void imex_nodes_resolve(struct imex_node_map *map)
{
    const char *hosts_path = getenv("NVLFABRIC_SIM_HOSTS_FILE");
    char *hosts = NULL;
    size_t hlen = 0;
    bool use_hosts = hosts_path && *hosts_path;
    if (use_hosts && imex_read_file(hosts_path, &hosts, &hlen, NULL, 0))
        hosts = NULL;
    for (size_t i = 0; i < map->n; i++) {
        struct imex_node *n = &map->nodes[i];
        if (n->literal)
            continue;
        n->resolved = false;
        if (use_hosts) {
            if (hosts)
                n->resolved = hosts_lookup(hosts, hlen, n->name, &n->addr);
            continue;
        }
        struct addrinfo hints = {0}, *res = NULL;
        hints.ai_family = AF_INET;
        hints.ai_socktype = SOCK_STREAM;
        if (getaddrinfo(n->name, NULL, &hints, &res) == 0 && res) {
            n->addr = ((struct sockaddr_in *)(void *)res->ai_addr)->sin_addr;
            n->resolved = true;
        }
        if (res)
            freeaddrinfo(res);
    }
    free(hosts);
}

int imex_nodes_find_addr(const struct imex_node_map *map, struct in_addr addr)
{
    for (size_t i = 0; i < map->n; i++)
        if (map->nodes[i].resolved && map->nodes[i].addr.s_addr == addr.s_addr)
            return (int)i;
    return -1;
}

bool imex_addr_on_interface(struct in_addr addr)
{
    struct ifaddrs *ifa = NULL;
    bool found = false;
    if (getifaddrs(&ifa) != 0)
        return false;
    for (struct ifaddrs *p = ifa; p && !found; p = p->ifa_next)
        if (p->ifa_addr && p->ifa_addr->sa_family == AF_INET &&
            ((struct sockaddr_in *)(void *)p->ifa_addr)->sin_addr.s_addr == addr.s_addr)
            found = true;
    freeifaddrs(ifa);
    return found;
}
