#include "json.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

struct reader {
    const char *s;
    size_t n, pos, values;
    struct err *e;
};

static bool fail(struct reader *r, const char *what)
{
    if (r->pos >= r->n)
        return err_set(r->e, "%s, but the line ends", what);
    return err_set(r->e, "%s at byte %zu", what, r->pos);
}

static void skip_ws(struct reader *r)
{
    while (r->pos < r->n && (r->s[r->pos] == ' ' || r->s[r->pos] == '\t' || r->s[r->pos] == '\n' ||
                             r->s[r->pos] == '\r'))
        r->pos++;
}

static bool is_digit(struct reader *r)
{
    return r->pos < r->n && r->s[r->pos] >= '0' && r->s[r->pos] <= '9';
}

static int hex4(const char *s)
{
    int v = 0;
    for (int k = 0; k < 4; k++) {
        char c = s[k];
        if (c >= 'A' && c <= 'F')
            c = (char)(c - 'A' + 'a');
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
            return -1;
        v = v << 4 | (c <= '9' ? c - '0' : c - 'a' + 10);
    }
    return v;
}

/* The \uXXXX escape at r->pos (a pair of them for a character past U+FFFF). */
static bool escape_u(struct reader *r, long *cp)
{
    int hi = r->pos + 6 <= r->n ? hex4(r->s + r->pos + 2) : -1;
    if (hi < 0)
        return fail(r, "\\u not followed by four hex digits");
    if (hi < 0xD800 || hi > 0xDFFF) {
        *cp = hi;
        r->pos += 6;
        return true;
    }
    int lo = hi <= 0xDBFF && r->pos + 12 <= r->n && r->s[r->pos + 6] == '\\' && r->s[r->pos + 7] == 'u'
                 ? hex4(r->s + r->pos + 8)
                 : -1;
    if (lo < 0xDC00 || lo > 0xDFFF)
        return fail(r, "lone surrogate escape");
    *cp = 0x10000 + ((long)(hi - 0xD800) << 10) + (lo - 0xDC00);
    r->pos += 12;
    return true;
}

static void put_utf8(struct buf *b, long cp)
{
    char out[4];
    size_t n;
    if (cp < 0x80) {
        out[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        out[0] = (char)(0xC0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        out[0] = (char)(0xE0 | cp >> 12);
        out[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        out[0] = (char)(0xF0 | cp >> 18);
        out[1] = (char)(0x80 | (cp >> 12 & 0x3F));
        out[2] = (char)(0x80 | (cp >> 6 & 0x3F));
        out[3] = (char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    buf_put(b, out, n);
}

/* At the opening quote. The line is known to be UTF-8, so bytes other than escapes are copied. */
static bool read_string(struct reader *r, struct jval *v)
{
    static const char plain[] = "\"\\/bfnrt", decoded[] = "\"\\/\b\f\n\r\t";
    struct buf b = {0};
    size_t start = r->pos++;
    for (;;) {
        unsigned char c = r->pos < r->n ? (unsigned char)r->s[r->pos] : '\n';
        if (c == '\n') { /* the end of the line: a request is one line */
            r->pos = start;
            buf_free(&b);
            return fail(r, "unterminated string");
        }
        if (c == '"')
            break;
        if (c < 0x20) {
            buf_free(&b);
            return fail(r, "control character in a string (escape it)");
        }
        if (c != '\\') {
            buf_putc(&b, (char)c);
            r->pos++;
            continue;
        }
        const char *esc = r->pos + 1 < r->n ? strchr(plain, r->s[r->pos + 1]) : NULL;
        if (esc && *esc) {
            buf_putc(&b, decoded[esc - plain]);
            r->pos += 2;
        } else if (r->pos + 1 < r->n && r->s[r->pos + 1] == 'u') {
            long cp = 0;
            if (!escape_u(r, &cp)) {
                buf_free(&b);
                return false;
            }
            put_utf8(&b, cp);
        } else {
            buf_free(&b);
            return fail(r, "unknown escape");
        }
    }
    r->pos++;
    v->t = J_STRING;
    v->s_n = b.n;
    v->s = buf_take(&b);
    return true;
}

static bool read_number(struct reader *r, struct jval *v)
{
    size_t start = r->pos;
    bool neg = r->pos < r->n && r->s[r->pos] == '-', integral = true;
    if (neg)
        r->pos++;
    if (!is_digit(r)) {
        r->pos = start;
        return fail(r, "expected a value");
    }
    if (r->s[r->pos] == '0')
        r->pos++;
    else
        while (is_digit(r))
            r->pos++;
    size_t digits_end = r->pos;
    if (r->pos < r->n && r->s[r->pos] == '.') {
        r->pos++;
        if (!is_digit(r))
            return fail(r, "expected a digit");
        while (is_digit(r))
            r->pos++;
        integral = false;
    }
    if (r->pos < r->n && (r->s[r->pos] == 'e' || r->s[r->pos] == 'E')) {
        r->pos++;
        if (r->pos < r->n && (r->s[r->pos] == '+' || r->s[r->pos] == '-'))
            r->pos++;
        if (!is_digit(r))
            return fail(r, "expected a digit");
        while (is_digit(r))
            r->pos++;
        integral = false;
    }
    v->t = J_NUMBER;
    if (!integral)
        return true;
    /* accumulated as a negative number: LLONG_MIN has no positive twin */
    long long acc = 0;
    for (size_t i = start + neg; i < digits_end; i++) {
        int d = r->s[i] - '0';
        if (acc < (LLONG_MIN + d) / 10)
            return true; /* out of range: a number, not an integer the keeper can use */
        acc = acc * 10 - d;
    }
    if (!neg && acc == LLONG_MIN)
        return true;
    v->is_int = true;
    v->i = neg ? acc : -acc;
    return true;
}

static bool read_value(struct reader *r, struct jval *v, int depth);

static int key_order(const void *a, const void *b)
{
    const struct jval *x = *(const struct jval *const *)a, *y = *(const struct jval *const *)b;
    size_t n = x->s_n < y->s_n ? x->s_n : y->s_n;
    int c = n ? memcmp(x->s, y->s, n) : 0;
    return c ? c : (x->s_n > y->s_n) - (x->s_n < y->s_n);
}

static bool no_repeated_key(struct reader *r, const struct jval *obj)
{
    const struct jval **sorted = xmalloc(obj->len * sizeof *sorted);
    for (size_t k = 0; k < obj->len; k++)
        sorted[k] = &obj->keys[k];
    qsort(sorted, obj->len, sizeof *sorted, key_order);
    const struct jval *twice = NULL;
    for (size_t k = 1; k < obj->len && !twice; k++)
        if (key_order(&sorted[k - 1], &sorted[k]) == 0)
            twice = sorted[k];
    free(sorted);
    if (!twice)
        return true;
    struct buf msg = {0};
    buf_puts(&msg, "key ");
    json_quote_src(&msg, twice);
    buf_puts(&msg, " given twice");
    return err_take(r->e, &msg);
}

/* An array or an object, at its opening bracket. */
static bool read_items(struct reader *r, struct jval *v, int depth, bool object)
{
    char close = object ? '}' : ']';
    size_t cap = 0;
    v->t = object ? J_OBJECT : J_ARRAY;
    if (depth >= JSON_MAX_DEPTH)
        return fail(r, "nested too deep");
    r->pos++;
    skip_ws(r);
    if (r->pos < r->n && r->s[r->pos] == close) {
        r->pos++;
        return true;
    }
    for (;;) {
        if (v->len == cap) {
            cap = cap ? cap * 2 : 4;
            v->items = xrealloc(v->items, cap * sizeof *v->items);
            if (object)
                v->keys = xrealloc(v->keys, cap * sizeof *v->keys);
        }
        struct jval *item = &v->items[v->len];
        memset(item, 0, sizeof *item);
        if (object)
            memset(&v->keys[v->len], 0, sizeof *v->keys);
        v->len++; /* counted before it is read: json_free frees what a failure left half read */
        if (object) {
            struct jval *key = &v->keys[v->len - 1];
            skip_ws(r);
            if (r->pos >= r->n || r->s[r->pos] != '"')
                return fail(r, "expected a string key");
            key->src = r->s + r->pos;
            if (!read_string(r, key))
                return false;
            key->src_n = (size_t)(r->s + r->pos - key->src);
            skip_ws(r);
            if (r->pos >= r->n || r->s[r->pos] != ':')
                return fail(r, "expected ':'");
            r->pos++;
        }
        if (!read_value(r, item, depth + 1))
            return false;
        skip_ws(r);
        if (r->pos < r->n && r->s[r->pos] == ',') {
            r->pos++;
            continue;
        }
        if (r->pos < r->n && r->s[r->pos] == close)
            break;
        return fail(r, object ? "expected ',' or '}'" : "expected ',' or ']'");
    }
    r->pos++;
    return !object || no_repeated_key(r, v);
}

static bool read_literal(struct reader *r, const char *word)
{
    size_t n = strlen(word);
    if (r->pos + n > r->n || memcmp(r->s + r->pos, word, n) != 0)
        return fail(r, "expected a value");
    r->pos += n;
    return true;
}

static bool read_value(struct reader *r, struct jval *v, int depth)
{
    skip_ws(r);
    if (++r->values > JSON_MAX_VALUES)
        return fail(r, "too many values (at most 16384)");
    size_t start = r->pos;
    bool ok;
    switch (r->pos < r->n ? r->s[r->pos] : '\0') {
    case '{':
    case '[':
        ok = read_items(r, v, depth, r->s[r->pos] == '{');
        break;
    case '"':
        ok = read_string(r, v);
        break;
    case 't':
    case 'f':
        v->t = J_BOOL;
        v->b = r->s[r->pos] == 't';
        ok = read_literal(r, v->b ? "true" : "false");
        break;
    case 'n':
        v->t = J_NULL;
        ok = read_literal(r, "null");
        break;
    default:
        ok = read_number(r, v);
    }
    v->src = r->s + start;
    v->src_n = r->pos - start;
    return ok;
}

bool json_parse(const char *line, size_t n, struct jval *out, struct err *e)
{
    struct reader r = {.s = line, .n = n, .e = e};
    memset(out, 0, sizeof *out);
    for (size_t i = 0; i < n;) {
        size_t at = i;
        if (utf8_next(line, n, &i) < 0)
            return err_set(e, "not UTF-8 at byte %zu", at);
    }
    if (!read_value(&r, out, 0)) {
        json_free(out);
        return false;
    }
    skip_ws(&r);
    if (r.pos != n) {
        json_free(out);
        return fail(&r, "unexpected text after the value");
    }
    return true;
}

void json_free(struct jval *v)
{
    for (size_t k = 0; k < v->len; k++) {
        json_free(&v->items[k]);
        if (v->keys)
            json_free(&v->keys[k]);
    }
    free(v->items);
    free(v->keys);
    free(v->s);
    memset(v, 0, sizeof *v);
}

const struct jval *json_member(const struct jval *obj, const char *key)
{
    size_t n = strlen(key);
    for (size_t k = 0; obj->t == J_OBJECT && k < obj->len; k++)
        if (obj->keys[k].s_n == n && memcmp(obj->keys[k].s, key, n) == 0)
            return &obj->items[k];
    return NULL;
}

long utf8_next(const char *s, size_t n, size_t *i)
{
    const unsigned char *u = (const unsigned char *)s + *i;
    size_t left = n - *i, len;
    long cp, min;
    if (u[0] < 0x80) {
        (*i)++;
        return u[0];
    }
    if (u[0] >= 0xC2 && u[0] <= 0xDF)
        len = 2, cp = u[0] & 0x1F, min = 0x80;
    else if (u[0] >= 0xE0 && u[0] <= 0xEF)
        len = 3, cp = u[0] & 0x0F, min = 0x800;
    else if (u[0] >= 0xF0 && u[0] <= 0xF4)
        len = 4, cp = u[0] & 0x07, min = 0x10000;
    else
        len = 0, cp = 0, min = 0;
    for (size_t k = 1; k < len; k++) {
        if (k >= left || (u[k] & 0xC0) != 0x80) {
            len = 0;
            break;
        }
        cp = cp << 6 | (u[k] & 0x3F);
    }
    if (len == 0 || cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
        (*i)++;
        return -1;
    }
    *i += len;
    return cp;
}

void json_put_str(struct buf *b, const char *s, size_t n)
{
    buf_putc(b, '"');
    for (size_t i = 0; i < n;) {
        long cp = utf8_next(s, n, &i);
        const char *esc = cp == '"' ? "\\\"" : cp == '\\' ? "\\\\" : cp == '\n' ? "\\n" : cp == '\r' ? "\\r"
                        : cp == '\t' ? "\\t" : cp == '\b' ? "\\b" : cp == '\f' ? "\\f" : NULL;
        if (esc)
            buf_puts(b, esc);
        else if (cp >= ' ' && cp <= '~')
            buf_putc(b, (char)cp);
        else if (cp < 0)
            buf_puts(b, "\\ufffd");
        else if (cp < 0x10000)
            buf_printf(b, "\\u%04lx", (unsigned long)cp);
        else
            buf_printf(b, "\\u%04lx\\u%04lx", (unsigned long)(0xD800 | (cp - 0x10000) >> 10),
                       (unsigned long)(0xDC00 | (cp & 0x3FF)));
    }
    buf_putc(b, '"');
}

static void put_excerpt(struct buf *b, const char *text, size_t n)
{
    if (n <= JSON_QUOTE_MAX) {
        buf_put(b, text, n);
        return;
    }
    size_t cut = JSON_QUOTE_MAX - 3;
    while (cut && ((unsigned char)text[cut] & 0xC0) == 0x80) /* not inside a UTF-8 sequence */
        cut--;
    buf_put(b, text, cut);
    buf_puts(b, "...");
}

void json_quote_str(struct buf *b, const char *s)
{
    struct buf q = {0};
    json_put_str(&q, s, strlen(s));
    put_excerpt(b, q.p, q.n);
    buf_free(&q);
}

void json_quote_src(struct buf *b, const struct jval *v)
{
    put_excerpt(b, v->src, v->src_n);
}
