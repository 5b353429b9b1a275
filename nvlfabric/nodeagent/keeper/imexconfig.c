#include "imexconfig.h"

#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "members.h"

void config_init(struct imex_config *c, const char *bind_address, int server_port, int cmd_port,
                 const char *tls_target)
{
    c->bind_address = xstrdup(bind_address);
    c->server_port = server_port;
    c->cmd_port = cmd_port;
    c->tls_target = xstrdup(tls_target);
    c->log_level = 4;
    c->grace_time = -1;
    c->quorum_none = false;
}

void config_free(struct imex_config *c)
{
    free(c->bind_address);
    free(c->tls_target);
    memset(c, 0, sizeof *c);
}

void config_render(const struct imex_config *c, const char *id, const char *dir, struct buf *out)
{
    buf_printf(out, "# nvlfabric node agent: IMEX domain %s; written by the agent, do not edit\n", id);
    buf_printf(out, "LOG_LEVEL=%d\nLOG_FILE_NAME=\nLOG_APPEND_TO_LOG=0\nDAEMONIZE=0\n", c->log_level);
    buf_printf(out, "BIND_INTERFACE_IP=%s\nSERVER_PORT=%d\n", c->bind_address, c->server_port);
    buf_printf(out, "IMEX_NODE_CONFIG_FILE=%s/nodes.cfg\n", dir);
    buf_printf(out, "IMEX_WAIT_FOR_QUORUM=%s\n", c->quorum_none ? "NONE" : "RECOVERY");
    buf_printf(out, "IMEX_ENABLE_AUTH_ENCRYPTION=%d\nIMEX_CMD_ENABLED=1\n", *c->tls_target ? 1 : 0);
    buf_printf(out, "IMEX_CMD_BIND_INTERFACE_IP=%s\nIMEX_CMD_PORT=%d\n", c->bind_address, c->cmd_port);
    buf_printf(out, "IMEX_NODE_DISCONNECTED_GRACE_TIME=%ld\n", c->grace_time);
    if (!*c->tls_target)
        return;
    /* the node's key and certificate serve both ends of a link; it trusts its domain's CA only */
    buf_puts(out, "IMEX_AUTH_ENCRYPTION_MODE=SSL_TLS\nIMEX_AUTH_SOURCE=FILE\n");
    const char *side[] = {"SERVER", "CLIENT"};
    for (int i = 0; i < 2; i++)
        buf_printf(out, "IMEX_%s_KEY=%s/" TLS_KEY "\nIMEX_%s_CERT=%s/" TLS_CERT "\nIMEX_%s_CERT_AUTH=%s/" TLS_CA "\n",
                   side[i], dir, side[i], dir, side[i], dir);
    buf_printf(out, "IMEX_SECURITY_TARGET_OVERRIDE=%s\n", c->tls_target);
}

static bool is_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

/* s[0..n) without the blanks around it, as a new string */
static char *trimmed(const char *s, size_t n)
{
    while (n && is_blank(*s))
        s++, n--;
    while (n && is_blank(s[n - 1]))
        n--;
    return xmemdup(s, n);
}

/* A plain decimal integer (an optional '-', then digits) in low..high. */
static bool whole(const char *s, long low, long high, long *out)
{
    const char *d = s + (*s == '-');
    if (!*d || strspn(d, "0123456789") != strlen(d) || strlen(d) > 10)
        return false;
    *out = strtol(s, NULL, 10);
    return *out >= low && *out <= high;
}

struct number_key {
    const char *key;
    long low, high;
};

static const struct number_key NUMBERS[] = {
    {"SERVER_PORT", 1, 65535}, {"IMEX_CMD_PORT", 1, 65535}, {"LOG_LEVEL", 0, 5},
    {"IMEX_NODE_DISCONNECTED_GRACE_TIME", -1, 2147483647}, {"IMEX_ENABLE_AUTH_ENCRYPTION", 0, 1},
};

static bool bad_line(struct err *e, size_t line, const char *key, const char *value, const char *why)
{
    struct buf msg = {0};
    if (line)
        buf_printf(&msg, "line %zu: ", line);
    buf_printf(&msg, "%s: ", key);
    json_quote_str(&msg, value);
    buf_puts(&msg, why);
    return err_take(e, &msg);
}

bool config_parse(const char *text, size_t n, struct imex_config *out, struct err *e)
{
    long num[ARRAY_LEN(NUMBERS)] = {50000, 50005, 4, -1, 0};
    char *bind = NULL, *target = xstrdup("");
    bool quorum_none = false, ok = true;
    size_t line = 0;
    for (size_t at = 0; at < n && ok; line++) {
        const char *end = memchr(text + at, '\n', n - at);
        size_t len = end ? (size_t)(end - (text + at)) : n - at;
        char *whole_line = trimmed(text + at, len), *eq = strchr(whole_line, '=');
        at += len + 1;
        if (*whole_line == '#' || !eq) {
            free(whole_line);
            continue;
        }
        char *key = trimmed(whole_line, (size_t)(eq - whole_line)), *value = trimmed(eq + 1, strlen(eq + 1));
        for (size_t k = 0; k < ARRAY_LEN(NUMBERS); k++)
            if (strcmp(key, NUMBERS[k].key) == 0 && !whole(value, NUMBERS[k].low, NUMBERS[k].high, &num[k]))
                ok = bad_line(e, line + 1, key, value, " is not a whole number in the key's range");
        if (strcmp(key, "BIND_INTERFACE_IP") == 0) {
            free(bind);
            bind = xstrdup(value);
        } else if (strcmp(key, "IMEX_SECURITY_TARGET_OVERRIDE") == 0) {
            free(target);
            target = xstrdup(value);
        } else if (strcmp(key, "IMEX_WAIT_FOR_QUORUM") == 0) {
            quorum_none = strcmp(value, "NONE") == 0;
            if (!quorum_none && strcmp(value, "RECOVERY") != 0)
                ok = bad_line(e, line + 1, key, value, " is not NONE or RECOVERY");
        }
        free(key);
        free(value);
        free(whole_line);
    }
    struct ipaddr addr;
    if (ok && !bind)
        ok = err_set(e, "BIND_INTERFACE_IP: missing");
    else if (ok && !ip_parse(bind, &addr))
        ok = bad_line(e, 0, "BIND_INTERFACE_IP", bind, " is not an IP address");
    else if (ok && num[0] == num[1])
        ok = err_set(e, "SERVER_PORT and IMEX_CMD_PORT are both %ld", num[0]);
    else if (ok && num[4] && !*target)
        ok = err_set(e, "IMEX_ENABLE_AUTH_ENCRYPTION=1 without an IMEX_SECURITY_TARGET_OVERRIDE");
    if (ok) {
        config_init(out, bind, (int)num[0], (int)num[1], num[4] ? target : "");
        out->log_level = (int)num[2];
        out->grace_time = num[3];
        out->quorum_none = quorum_none;
    }
    free(bind);
    free(target);
    return ok;
}
