#include "members.h"

#include <arpa/inet.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"

bool ip_parse(const char *s, struct ipaddr *out)
{
    memset(out, 0, sizeof *out);
    /* glibc's inet_pton takes exactly dotted quads without leading zeros, as ipaddress does */
    if (inet_pton(AF_INET, s, out->value + 12) == 1) {
        out->version = 4;
        return true;
    }
    /* A zone: ipaddress takes any text after the '%'; this takes printable ASCII only, since the
     * address goes into one-line files (no agent sends a zone anyway). */
    const char *zone = strchr(s, '%');
    size_t addr_n = zone ? (size_t)(zone - s) : strlen(s);
    if (zone) {
        if (!zone[1])
            return false;
        for (const char *z = zone + 1; *z; z++)
            if (*z <= ' ' || *z > '~' || *z == '%' || *z == '/')
                return false;
    }
    char addr[64];
    if (addr_n >= sizeof addr)
        return false;
    memcpy(addr, s, addr_n);
    addr[addr_n] = '\0';
    if (inet_pton(AF_INET6, addr, out->value) != 1)
        return false;
    out->version = 6;
    return true;
}

static bool is_alnum(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

bool is_hostname(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 253 || !(is_alnum(s[0]) || s[0] == '_'))
        return false;
    for (size_t i = 1; i < n; i++)
        if (!(is_alnum(s[i]) || s[i] == '_' || s[i] == '.' || s[i] == '-'))
            return false;
    return true;
}

bool is_domain_id(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 63)
        return false;
    for (size_t i = 0; i < n; i++) {
        bool ok = (s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') ||
                  (i > 0 && i < n - 1 && (s[i] == '.' || s[i] == '-'));
        if (!ok)
            return false;
    }
    return true;
}

struct keyed {
    char *text;
    int rank; /* 0 IPv4, 1 IPv6, 2 host name */
    struct ipaddr addr;
};

static int by_member_key(const void *a, const void *b)
{
    const struct keyed *x = a, *y = b;
    if (x->rank != y->rank)
        return x->rank - y->rank;
    int c = memcmp(x->addr.value, y->addr.value, sizeof x->addr.value);
    return c ? c : strcmp(x->text, y->text);
}

static bool bad_member(struct err *e, const char *what, const char *member, const char *why)
{
    struct buf msg = {0};
    buf_printf(&msg, "%s: ", what);
    json_quote_str(&msg, member);
    buf_puts(&msg, why);
    return err_take(e, &msg);
}

bool canonical_members(char **members, size_t n, const char *what, struct err *e)
{
    struct keyed *keys = xcalloc(n, sizeof *keys);
    bool ok = true;
    for (size_t i = 0; i < n && ok; i++) {
        keys[i].text = members[i];
        if (ip_parse(members[i], &keys[i].addr))
            keys[i].rank = keys[i].addr.version == 4 ? 0 : 1;
        else if (is_hostname(members[i]))
            keys[i].rank = 2;
        else
            ok = bad_member(e, what, members[i], " is neither an IP address nor a host name");
    }
    if (ok)
        qsort(keys, n, sizeof *keys, by_member_key);
    for (size_t i = 1; i < n && ok; i++) /* equal texts have equal keys: they end up side by side */
        if (strcmp(keys[i].text, keys[i - 1].text) == 0)
            ok = bad_member(e, what, keys[i].text, " is listed twice");
    if (ok)
        for (size_t i = 0; i < n; i++)
            members[i] = keys[i].text;
    free(keys);
    return ok;
}

void render_nodes(char *const *members, size_t n, struct buf *out)
{
    for (size_t i = 0; i < n; i++) {
        buf_puts(out, members[i]);
        buf_putc(out, '\n');
    }
}
