/* Memory, growable byte buffers, and the error value every fallible call fills. */
#ifndef KEEPER_UTIL_H
#define KEEPER_UTIL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* Allocation failure ends the process: the daemons run on in their own sessions and the next
 * keeper adopts them, which is safer than carrying on half-allocated. */
void *xmalloc(size_t n);
void *xcalloc(size_t count, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
char *xmemdup(const void *p, size_t n); /* n bytes and a NUL after them */

/* Bytes with a NUL kept after them, so that text in it is also a C string. */
struct buf {
    char *p;
    size_t n, cap;
};

void buf_put(struct buf *b, const void *p, size_t n);
void buf_puts(struct buf *b, const char *s);
void buf_putc(struct buf *b, char c);
void buf_printf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void buf_vprintf(struct buf *b, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));
const char *buf_str(struct buf *b); /* the contents as a C string, "" when empty */
char *buf_take(struct buf *b);      /* the contents, now the caller's; the buffer is emptied */
void buf_free(struct buf *b);

/* Why a call failed, as one line for the reply or the log. */
struct err {
    char *msg;
};

/* These set the message and return false, so that `return err_set(e, ...)` reads as a failure. */
bool err_set(struct err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
bool err_sys(struct err *e, int errnum, const char *fmt, ...) __attribute__((format(printf, 3, 4))); /* + strerror */
bool err_take(struct err *e, struct buf *msg);
void err_clear(struct err *e);

#endif
