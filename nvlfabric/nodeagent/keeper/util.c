#include "util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void out_of_memory(size_t n)
{
    char msg[96];
    int len = snprintf(msg, sizeof msg, "nvlfabric imex: out of memory (%zu bytes)\n", n);
    if (len > 0 && write(STDERR_FILENO, msg, (size_t)len) < 0) {
        /* nothing left to report with */
    }
    abort();
}

void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        out_of_memory(n);
    return p;
}

void *xcalloc(size_t count, size_t size)
{
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p)
        out_of_memory(count * size);
    return p;
}

void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q)
        out_of_memory(n);
    return q;
}

char *xstrdup(const char *s)
{
    return xmemdup(s, strlen(s));
}

char *xmemdup(const void *p, size_t n)
{
    char *q = xmalloc(n + 1);
    if (n)
        memcpy(q, p, n);
    q[n] = '\0';
    return q;
}

static void buf_reserve(struct buf *b, size_t more)
{
    if (b->n + more + 1 <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + more + 1)
        cap *= 2;
    b->p = xrealloc(b->p, cap);
    b->cap = cap;
}

void buf_put(struct buf *b, const void *p, size_t n)
{
    buf_reserve(b, n);
    if (n)
        memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = '\0';
}

void buf_puts(struct buf *b, const char *s)
{
    buf_put(b, s, strlen(s));
}

void buf_putc(struct buf *b, char c)
{
    buf_put(b, &c, 1);
}

void buf_vprintf(struct buf *b, const char *fmt, va_list ap)
{
    va_list again;
    va_copy(again, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    if (n > 0) {
        buf_reserve(b, (size_t)n);
        vsnprintf(b->p + b->n, (size_t)n + 1, fmt, again);
        b->n += (size_t)n;
    }
    va_end(again);
}

void buf_printf(struct buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    buf_vprintf(b, fmt, ap);
    va_end(ap);
}

const char *buf_str(struct buf *b)
{
    buf_reserve(b, 0);
    b->p[b->n] = '\0';
    return b->p;
}

char *buf_take(struct buf *b)
{
    buf_str(b);
    char *p = b->p;
    b->p = NULL;
    b->n = b->cap = 0;
    return p;
}

void buf_free(struct buf *b)
{
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

bool err_take(struct err *e, struct buf *msg)
{
    free(e->msg);
    e->msg = buf_take(msg);
    return false;
}

bool err_set(struct err *e, const char *fmt, ...)
{
    struct buf b = {0};
    va_list ap;
    va_start(ap, fmt);
    buf_vprintf(&b, fmt, ap);
    va_end(ap);
    return err_take(e, &b);
}

bool err_sys(struct err *e, int errnum, const char *fmt, ...)
{
    struct buf b = {0};
    va_list ap;
    va_start(ap, fmt);
    buf_vprintf(&b, fmt, ap);
    va_end(ap);
    buf_printf(&b, ": %s", strerror(errnum));
    return err_take(e, &b);
}

void err_clear(struct err *e)
{
    free(e->msg);
    e->msg = NULL;
}
