#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "json.h"
#include "util.h"

#define LOGGER "nvlfabric.imexkeeper"

static bool as_json = true;

void log_setup(bool json)
{
    as_json = json;
}

static void write_line(enum log_level level, const char *msg)
{
    static const char *const lower[] = {"info", "warning", "error"};
    static const char *const upper[] = {"INFO", "WARNING", "ERROR"};
    struct buf b = {0};
    if (as_json) {
        struct timespec ts;
        struct tm tm;
        clock_gettime(CLOCK_REALTIME, &ts);
        gmtime_r(&ts.tv_sec, &tm);
        /* json.dumps' default separators (", " and ": "), as the Python processes write them */
        buf_printf(&b,
                   "{\"ts\": \"%04d-%02d-%02dT%02d:%02d:%02d.%03ld+00:00\", \"level\": \"%s\", "
                   "\"logger\": \"" LOGGER "\", \"msg\": ",
                   tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                   ts.tv_nsec / 1000000, lower[level]);
        json_put_str(&b, msg, strlen(msg));
        buf_puts(&b, "}\n");
    } else {
        buf_printf(&b, "%s:" LOGGER ":%s\n", upper[level], msg);
    }
    /* one write per line: the lines of concurrent writers to the pod log never interleave */
    for (size_t off = 0; off < b.n;) {
        ssize_t put = write(STDERR_FILENO, b.p + off, b.n - off);
        if (put < 0 && errno == EINTR)
            continue;
        if (put <= 0)
            break;
        off += (size_t)put;
    }
    buf_free(&b);
}

void log_msg(enum log_level level, const char *fmt, ...)
{
    struct buf b = {0};
    va_list ap;
    va_start(ap, fmt);
    buf_vprintf(&b, fmt, ap);
    va_end(ap);
    write_line(level, buf_str(&b));
    buf_free(&b);
}
