#include "protocol.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "members.h"

struct message {
    const char *name, *op;
    enum op kind;
    const char *fields[8]; /* what the message may carry, "op" included */
};

static const struct message MESSAGES[] = {
    {"Ensure", "ensure", OP_ENSURE,
     {"op", "domain", "bind_address", "server_port", "cmd_port", "members", "tls_target"}},
    {"Stop", "stop", OP_STOP, {"op", "domain"}},
    {"Status", "status", OP_STATUS, {"op"}},
};

/* "<Message>.<field>: <value><why>" */
static bool bad_field(struct err *e, const struct message *m, const char *field, const struct jval *v, const char *why)
{
    struct buf msg = {0};
    buf_printf(&msg, "%s.%s: ", m->name, field);
    if (v)
        json_quote_src(&msg, v);
    buf_puts(&msg, why);
    return err_take(e, &msg);
}

static bool known_fields(const struct message *m, const struct jval *raw, struct err *e)
{
    for (size_t k = 0; k < raw->len; k++) {
        const struct jval *key = &raw->keys[k];
        bool known = false;
        for (size_t f = 0; f < ARRAY_LEN(m->fields) && m->fields[f] && !known; f++)
            known = key->s_n == strlen(m->fields[f]) && memcmp(key->s, m->fields[f], key->s_n) == 0;
        if (known)
            continue;
        struct buf msg = {0};
        buf_printf(&msg, "%s: unknown field ", m->name);
        json_quote_src(&msg, key);
        buf_printf(&msg, "; a %s has", m->name);
        for (size_t f = 0; f < ARRAY_LEN(m->fields) && m->fields[f]; f++)
            buf_printf(&msg, "%s %s", f ? "," : "", m->fields[f]);
        return err_take(e, &msg);
    }
    return true;
}

static bool text_of(const struct message *m, const char *field, const struct jval *v, char **out, struct err *e)
{
    if (v->t != J_STRING)
        return bad_field(e, m, field, v, " is not a string");
    if (memchr(v->s, '\0', v->s_n))
        return bad_field(e, m, field, v, " holds a NUL character");
    *out = xmemdup(v->s, v->s_n);
    return true;
}

/* A required field (a missing one is refused), or an optional one (*out stays as it was). */
static bool get_str(const struct message *m, const struct jval *raw, const char *field, bool required, char **out,
                    struct err *e)
{
    const struct jval *v = json_member(raw, field);
    if (!v)
        return !required || bad_field(e, m, field, NULL, "missing");
    free(*out);
    *out = NULL;
    return text_of(m, field, v, out, e);
}

static bool get_port(const struct message *m, const struct jval *raw, const char *field, int *out, struct err *e)
{
    const struct jval *v = json_member(raw, field);
    if (!v)
        return bad_field(e, m, field, NULL, "missing");
    if (v->t != J_NUMBER || !v->is_int)
        return bad_field(e, m, field, v, " is not an integer");
    if (v->i < 1 || v->i > 65535)
        return bad_field(e, m, field, v, " is not a port number (1..65535)");
    *out = (int)v->i;
    return true;
}

static bool get_members(const struct message *m, const struct jval *raw, struct request *req, struct err *e)
{
    const struct jval *v = json_member(raw, "members");
    if (!v)
        return bad_field(e, m, "members", NULL, "missing");
    if (v->t != J_ARRAY)
        return bad_field(e, m, "members", v, " is not a list of strings");
    req->members = xcalloc(v->len, sizeof *req->members);
    for (size_t i = 0; i < v->len; i++, req->nmembers++) {
        char field[40];
        snprintf(field, sizeof field, "members[%zu]", i);
        if (!text_of(m, field, &v->items[i], &req->members[i], e))
            return false;
    }
    return true;
}

/* What the keeper would refuse of the domain, refused with the request: a bad request names its
 * field and changes nothing. */
static bool check_ensure(struct request *req, struct err *e)
{
    struct buf msg = {0};
    struct ipaddr addr;
    if (!is_domain_id(req->domain)) {
        buf_puts(&msg, "Ensure.domain: ");
        json_quote_str(&msg, req->domain);
        buf_puts(&msg, " is not a domain id (" DOMAIN_ID_RULE ")");
    } else if (!ip_parse(req->bind_address, &addr)) {
        buf_puts(&msg, "Ensure.bind_address: ");
        json_quote_str(&msg, req->bind_address);
        buf_puts(&msg, " is not an IPv4 or IPv6 address");
    } else if (req->server_port == req->cmd_port) {
        buf_printf(&msg, "Ensure.cmd_port: %d is the server_port too; the two ports must differ", req->cmd_port);
    } else if (strpbrk(req->tls_target, "\r\n")) {
        buf_puts(&msg, "Ensure.tls_target: ");
        json_quote_str(&msg, req->tls_target);
        buf_puts(&msg, " holds a line break");
    } else if (!canonical_members(req->members, req->nmembers, "Ensure.members", e)) {
        return false;
    } else {
        for (size_t i = 0; i < req->nmembers; i++)
            if (strcmp(req->members[i], req->bind_address) == 0)
                return true;
        buf_printf(&msg, "Ensure.members: this node's address %s (bind_address) is not among the members [",
                   req->bind_address);
        for (size_t i = 0; i < req->nmembers && msg.n < 200; i++) {
            buf_puts(&msg, i ? ", " : "");
            json_quote_str(&msg, req->members[i]);
        }
        buf_puts(&msg, msg.n < 200 ? "]" : ", ...]");
    }
    return err_take(e, &msg);
}

static bool decode(const struct jval *raw, struct request *req, struct err *e)
{
    if (raw->t != J_OBJECT)
        return err_set(e, "a request is a JSON object");
    const struct jval *op = json_member(raw, "op");
    const struct message *m = NULL;
    for (size_t i = 0; i < ARRAY_LEN(MESSAGES) && op && op->t == J_STRING && !m; i++)
        if (op->s_n == strlen(MESSAGES[i].op) && memcmp(op->s, MESSAGES[i].op, op->s_n) == 0)
            m = &MESSAGES[i];
    if (!m) {
        struct buf msg = {0};
        buf_puts(&msg, "op: ");
        if (op)
            json_quote_src(&msg, op);
        buf_puts(&msg, op ? " is not one of" : "missing; one of");
        buf_puts(&msg, " \"ensure\", \"stop\", \"status\"");
        return err_take(e, &msg);
    }
    req->op = m->kind;
    if (!known_fields(m, raw, e))
        return false;
    if (req->op == OP_STATUS)
        return true;
    if (!get_str(m, raw, "domain", true, &req->domain, e))
        return false;
    if (req->op == OP_STOP) {
        if (is_domain_id(req->domain))
            return true;
        return bad_field(e, m, "domain", json_member(raw, "domain"), " is not a domain id (" DOMAIN_ID_RULE ")");
    }
    req->tls_target = xstrdup("");
    return get_str(m, raw, "bind_address", true, &req->bind_address, e) &&
           get_port(m, raw, "server_port", &req->server_port, e) && get_port(m, raw, "cmd_port", &req->cmd_port, e) &&
           get_members(m, raw, req, e) && get_str(m, raw, "tls_target", false, &req->tls_target, e) &&
           check_ensure(req, e);
}

bool decode_request(const char *line, size_t n, struct request *req, struct err *e)
{
    struct jval raw;
    struct err why = {0};
    memset(req, 0, sizeof *req);
    if (!json_parse(line, n, &raw, &why)) {
        err_set(e, "not JSON: %s", why.msg);
        err_clear(&why);
        return false;
    }
    bool ok = decode(&raw, req, e);
    json_free(&raw);
    if (!ok)
        request_free(req);
    return ok;
}

void request_free(struct request *req)
{
    free(req->domain);
    free(req->bind_address);
    free(req->tls_target);
    for (size_t i = 0; i < req->nmembers; i++)
        free(req->members[i]);
    free(req->members);
    memset(req, 0, sizeof *req);
}

void encode_reply(struct buf *b, const char *error, const char *done, const struct domain_state *domains,
                  size_t ndomains)
{
    buf_printf(b, "{\"ok\":%s,\"error\":", error ? "false" : "true");
    json_put_str(b, error ? error : "", error ? strlen(error) : 0);
    buf_puts(b, ",\"done\":");
    if (done)
        json_put_str(b, done, strlen(done));
    else
        buf_puts(b, "null");
    buf_puts(b, ",\"domains\":[");
    for (size_t i = 0; i < ndomains; i++) {
        const struct domain_state *d = &domains[i];
        buf_puts(b, i ? ",{\"domain\":" : "{\"domain\":");
        json_put_str(b, d->domain, strlen(d->domain));
        if (d->pid)
            buf_printf(b, ",\"pid\":%d", (int)d->pid);
        else
            buf_puts(b, ",\"pid\":null");
        if (d->has_exit)
            buf_printf(b, ",\"exit\":%d", d->exit);
        else
            buf_puts(b, ",\"exit\":null");
        buf_puts(b, ",\"members\":[");
        for (size_t k = 0; k < d->nmembers; k++) {
            buf_puts(b, k ? "," : "");
            json_put_str(b, d->members[k], strlen(d->members[k]));
        }
        buf_printf(b, "],\"server_port\":%d,\"adopted\":%s}", d->server_port, d->adopted ? "true" : "false");
    }
    buf_puts(b, "]}\n");
}
