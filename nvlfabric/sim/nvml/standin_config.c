/*
 * nvlfabric NVML stand-in: the topology and fault file parsers.
 *
 * Both files share one line-based syntax (see README.md):
 *
 *   # a comment (only at the start of a line, after optional blanks)
 *   key = value
 *   [section argument]
 *
 * Every byte of the input is checked; anything unexpected is reported as
 * "<path>:<line>: <what> (field '<key>')" and the parse stops. No input can make the
 * parser read or write out of bounds: lines, keys and values have fixed maximum lengths
 * and are copied with explicit bounds.
 */
#define _POSIX_C_SOURCE 200809L

#include "standin.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SI_LINE_MAX 1024
#define SI_KEY_MAX 64
#define SI_VALUE_MAX 256
#define SI_TOPOLOGY_MAX_BYTES (16u * 1024u * 1024u)
#define SI_FAULTS_MAX_BYTES (256u * 1024u)
#define SI_MAX_RACKS 4096
#define SI_MAX_NODES 65536

#define TOPOLOGY_FORMAT "nvlfabric-nvml-topology/1"
#define FAULTS_FORMAT "nvlfabric-nvml-faults/1"

const char *const si_call_names[SI_CALL_COUNT] = {
    [SI_CALL_SHUTDOWN] = "nvmlShutdown",
    [SI_CALL_SYSTEM_GET_DRIVER_VERSION] = "nvmlSystemGetDriverVersion",
    [SI_CALL_SYSTEM_GET_NVML_VERSION] = "nvmlSystemGetNVMLVersion",
    [SI_CALL_SYSTEM_GET_CUDA_DRIVER_VERSION] = "nvmlSystemGetCudaDriverVersion",
    [SI_CALL_DEVICE_GET_COUNT] = "nvmlDeviceGetCount",
    [SI_CALL_DEVICE_GET_HANDLE_BY_INDEX] = "nvmlDeviceGetHandleByIndex",
    [SI_CALL_DEVICE_GET_HANDLE_BY_UUID] = "nvmlDeviceGetHandleByUUID",
    [SI_CALL_DEVICE_GET_HANDLE_BY_PCI_BUS_ID] = "nvmlDeviceGetHandleByPciBusId",
    [SI_CALL_DEVICE_GET_NAME] = "nvmlDeviceGetName",
    [SI_CALL_DEVICE_GET_UUID] = "nvmlDeviceGetUUID",
    [SI_CALL_DEVICE_GET_SERIAL] = "nvmlDeviceGetSerial",
    [SI_CALL_DEVICE_GET_BOARD_PART_NUMBER] = "nvmlDeviceGetBoardPartNumber",
    [SI_CALL_DEVICE_GET_PCI_INFO] = "nvmlDeviceGetPciInfo",
    [SI_CALL_DEVICE_GET_MEMORY_INFO] = "nvmlDeviceGetMemoryInfo",
    [SI_CALL_DEVICE_GET_MINOR_NUMBER] = "nvmlDeviceGetMinorNumber",
    [SI_CALL_DEVICE_GET_INDEX] = "nvmlDeviceGetIndex",
    [SI_CALL_DEVICE_GET_CUDA_COMPUTE_CAPABILITY] = "nvmlDeviceGetCudaComputeCapability",
    [SI_CALL_DEVICE_GET_GPU_FABRIC_INFO] = "nvmlDeviceGetGpuFabricInfo",
    [SI_CALL_DEVICE_GET_GPU_FABRIC_INFO_V] = "nvmlDeviceGetGpuFabricInfoV",
};

/* ------------------------------------------------------------------ errors */

static void set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    if (err == NULL || errlen == 0)
        return;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* ------------------------------------------------------------------ file reading */

int si_read_file(const char *path, size_t max_size, char **out, size_t *out_len, char *err,
                 size_t errlen)
{
    struct stat st;
    char *buf;
    size_t len = 0;
    int fd;

    *out = NULL;
    *out_len = 0;
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        set_err(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    if (fstat(fd, &st) != 0) {
        set_err(err, errlen, "%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        set_err(err, errlen, "%s: not a regular file", path);
        close(fd);
        return -1;
    }
    buf = malloc(max_size + 2);
    if (buf == NULL) {
        set_err(err, errlen, "%s: out of memory", path);
        close(fd);
        return -1;
    }
    /* Read up to max_size + 1 bytes so a file that grew past the limit is noticed. */
    while (len <= max_size) {
        ssize_t n = read(fd, buf + len, max_size + 1 - len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            set_err(err, errlen, "%s: cannot read: %s", path, strerror(errno));
            free(buf);
            close(fd);
            return -1;
        }
        if (n == 0)
            break;
        len += (size_t)n;
    }
    close(fd);
    if (len > max_size) {
        set_err(err, errlen, "%s: file is larger than %zu bytes", path, max_size);
        free(buf);
        return -1;
    }
    buf[len] = '\0';
    *out = buf;
    *out_len = len;
    return 0;
}

/* ------------------------------------------------------------------ lexer */

enum tok_kind { TOK_EOF, TOK_SECTION, TOK_KV };

struct lexer {
    const char *path;
    const char *buf;
    size_t len;
    size_t pos;
    unsigned line;
};

struct token {
    enum tok_kind kind;
    unsigned line;
    char key[SI_KEY_MAX];     /* TOK_KV: the key; TOK_SECTION: the section kind */
    char value[SI_VALUE_MAX]; /* TOK_KV: the value; TOK_SECTION: the argument or "" */
};

static int is_blank(char c) { return c == ' ' || c == '\t'; }
static int is_digit(char c) { return c >= '0' && c <= '9'; }
static int is_lower(char c) { return c >= 'a' && c <= 'z'; }
static int is_upper(char c) { return c >= 'A' && c <= 'Z'; }
static int is_alnum(char c) { return is_digit(c) || is_lower(c) || is_upper(c); }
static int is_hex(char c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
static int is_key_char(char c) { return is_alnum(c) || c == '_' || c == '.' || c == '*'; }
static int is_name_char(char c) { return is_alnum(c) || c == '_' || c == '.' || c == '-'; }

static int hex_val(char c)
{
    if (is_digit(c))
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return c - 'A' + 10;
}

/* Copies s[0..n) into dst (size cap) with surrounding blanks removed; -1 if it does not fit. */
static int copy_trimmed(char *dst, size_t cap, const char *s, size_t n)
{
    while (n > 0 && is_blank(s[0])) {
        s++;
        n--;
    }
    while (n > 0 && is_blank(s[n - 1]))
        n--;
    if (n >= cap)
        return -1;
    memcpy(dst, s, n);
    dst[n] = '\0';
    return 0;
}

/* Returns 1 and fills tok, 0 at end of input, -1 on a syntax error (err set). */
static int lex_next(struct lexer *lx, struct token *tok, char *err, size_t errlen)
{
    while (lx->pos < lx->len) {
        const char *start = lx->buf + lx->pos;
        size_t n = 0, i;
        const char *eq;

        lx->line++;
        while (lx->pos + n < lx->len && start[n] != '\n')
            n++;
        lx->pos += n;
        if (lx->pos < lx->len)
            lx->pos++; /* the newline */
        if (n > 0 && start[n - 1] == '\r')
            n--;
        if (n > SI_LINE_MAX) {
            set_err(err, errlen, "%s:%u: line is longer than %d characters", lx->path, lx->line,
                    SI_LINE_MAX);
            return -1;
        }
        for (i = 0; i < n; i++) {
            unsigned char c = (unsigned char)start[i];
            if (c == '\t')
                continue;
            if (c < 0x20 || c > 0x7e) {
                set_err(err, errlen,
                        "%s:%u: invalid byte 0x%02x at column %zu (only printable ASCII is allowed)",
                        lx->path, lx->line, c, i + 1);
                return -1;
            }
        }
        i = 0;
        while (i < n && is_blank(start[i]))
            i++;
        if (i == n || start[i] == '#')
            continue;

        tok->line = lx->line;
        if (start[i] == '[') {
            size_t j = i + 1, k;
            size_t close_at = n;
            for (k = j; k < n; k++) {
                if (start[k] == ']') {
                    close_at = k;
                    break;
                }
            }
            if (close_at == n) {
                set_err(err, errlen, "%s:%u: section header without closing ']'", lx->path, lx->line);
                return -1;
            }
            for (k = close_at + 1; k < n; k++) {
                if (!is_blank(start[k])) {
                    set_err(err, errlen, "%s:%u: unexpected text after section header", lx->path,
                            lx->line);
                    return -1;
                }
            }
            /* kind */
            while (j < close_at && is_blank(start[j]))
                j++;
            k = j;
            while (k < close_at && is_lower(start[k]))
                k++;
            if (k == j || (k < close_at && !is_blank(start[k]))) {
                set_err(err, errlen, "%s:%u: malformed section header (expected [kind] or [kind name])",
                        lx->path, lx->line);
                return -1;
            }
            if (copy_trimmed(tok->key, sizeof tok->key, start + j, k - j) != 0) {
                set_err(err, errlen, "%s:%u: section kind is too long", lx->path, lx->line);
                return -1;
            }
            if (copy_trimmed(tok->value, sizeof tok->value, start + k, close_at - k) != 0) {
                set_err(err, errlen, "%s:%u: section name is too long", lx->path, lx->line);
                return -1;
            }
            tok->kind = TOK_SECTION;
            return 1;
        }

        eq = memchr(start + i, '=', n - i);
        if (eq == NULL) {
            set_err(err, errlen, "%s:%u: expected 'key = value', '[section]' or a '#' comment", lx->path,
                    lx->line);
            return -1;
        }
        if (copy_trimmed(tok->key, sizeof tok->key, start + i, (size_t)(eq - (start + i))) != 0) {
            set_err(err, errlen, "%s:%u: key is longer than %d characters", lx->path, lx->line,
                    SI_KEY_MAX - 1);
            return -1;
        }
        if (tok->key[0] == '\0') {
            set_err(err, errlen, "%s:%u: empty key before '='", lx->path, lx->line);
            return -1;
        }
        for (i = 0; tok->key[i] != '\0'; i++) {
            if (!is_key_char(tok->key[i])) {
                set_err(err, errlen, "%s:%u: invalid character '%c' in key '%s'", lx->path, lx->line,
                        tok->key[i], tok->key);
                return -1;
            }
        }
        if (copy_trimmed(tok->value, sizeof tok->value, eq + 1, (size_t)(start + n - (eq + 1))) != 0) {
            set_err(err, errlen, "%s:%u: value of field '%s' is longer than %d characters", lx->path,
                    lx->line, tok->key, SI_VALUE_MAX - 1);
            return -1;
        }
        if (tok->value[0] == '\0') {
            set_err(err, errlen, "%s:%u: field '%s' has an empty value", lx->path, lx->line, tok->key);
            return -1;
        }
        tok->kind = TOK_KV;
        return 1;
    }
    tok->kind = TOK_EOF;
    tok->line = lx->line;
    return 0;
}

/* ------------------------------------------------------------------ value parsers */

/* Unsigned integer, decimal or 0x-hex, no sign, no blanks; 0 on success. */
static int parse_u64(const char *s, unsigned long long max, unsigned long long *out)
{
    unsigned long long v = 0;
    int base = 10;
    if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
        base = 16;
        s += 2;
    }
    if (*s == '\0')
        return -1;
    for (; *s != '\0'; s++) {
        unsigned d;
        if (base == 10 && is_digit(*s))
            d = (unsigned)(*s - '0');
        else if (base == 16 && is_hex(*s))
            d = (unsigned)hex_val(*s);
        else
            return -1;
        if (d > max || v > (max - d) / (unsigned)base)
            return -1;
        v = v * (unsigned)base + d;
    }
    *out = v;
    return 0;
}

/* Decimal only. */
static int parse_dec(const char *s, unsigned long long max, unsigned long long *out)
{
    const char *c;
    if (*s == '\0')
        return -1;
    for (c = s; *c != '\0'; c++)
        if (!is_digit(*c))
            return -1;
    return parse_u64(s, max, out);
}

static int parse_uuid16(const char *s, unsigned char out[16])
{
    static const int dash_at[] = {8, 13, 18, 23};
    size_t i, b = 0;
    if (strlen(s) != 36)
        return -1;
    for (i = 0; i < 4; i++)
        if (s[dash_at[i]] != '-')
            return -1;
    for (i = 0; i < 36;) {
        if (s[i] == '-') {
            i++;
            continue;
        }
        if (b >= 16 || !is_hex(s[i]) || !is_hex(s[i + 1]))
            return -1;
        out[b++] = (unsigned char)(hex_val(s[i]) << 4 | hex_val(s[i + 1]));
        i += 2;
    }
    return b == 16 ? 0 : -1;
}

/* "GPU-" followed by a lower-case canonical UUID, exactly as NVML prints it. */
static int valid_gpu_uuid(const char *s)
{
    unsigned char tmp[16];
    size_t i;
    if (strncmp(s, "GPU-", 4) != 0 || parse_uuid16(s + 4, tmp) != 0)
        return 0;
    for (i = 4; s[i] != '\0'; i++)
        if (is_upper(s[i]))
            return 0;
    return 1;
}

static int valid_name(const char *s)
{
    size_t n = strlen(s), i;
    if (n == 0 || n >= SI_NAME_MAX || !is_alnum(s[0]))
        return 0;
    for (i = 0; i < n; i++)
        if (!is_name_char(s[i]))
            return 0;
    return 1;
}

/* Dotted version string like 570.172.08 or 12.570.172.08. */
static int valid_version(const char *s)
{
    size_t n = strlen(s), i;
    if (n == 0 || n >= SI_VERSION_SIZE || !is_digit(s[0]) || !is_digit(s[n - 1]))
        return 0;
    for (i = 0; i < n; i++) {
        if (!is_digit(s[i]) && s[i] != '.')
            return 0;
        if (s[i] == '.' && s[i + 1] == '.')
            return 0;
    }
    return 1;
}

/* Free text such as a marketing name or serial: printable ASCII (the lexer already checked)
 * that fits the NVML buffer. */
static int copy_text(char *dst, size_t cap, const char *s)
{
    size_t n = strlen(s);
    if (n >= cap)
        return -1;
    memcpy(dst, s, n + 1);
    return 0;
}

/* "DDDD:BB:DD.F" or "DDDDDDDD:BB:DD.F" (hex), function 0. */
static int parse_topology_bus_id(const char *s, unsigned *domain, unsigned *bus, unsigned *dev)
{
    size_t n = strlen(s), dlen, i;
    unsigned long long d = 0, b = 0, v = 0;
    if (n == 12)
        dlen = 4;
    else if (n == 16)
        dlen = 8;
    else
        return -1;
    for (i = 0; i < n; i++) {
        if (i == dlen || i == dlen + 3) {
            if (s[i] != ':')
                return -1;
        } else if (i == dlen + 6) {
            if (s[i] != '.')
                return -1;
        } else if (!is_hex(s[i])) {
            return -1;
        }
    }
    for (i = 0; i < dlen; i++)
        d = d * 16 + (unsigned)hex_val(s[i]);
    b = (unsigned)(hex_val(s[dlen + 1]) * 16 + hex_val(s[dlen + 2]));
    v = (unsigned)(hex_val(s[dlen + 4]) * 16 + hex_val(s[dlen + 5]));
    if (s[dlen + 7] != '0' || d > 0xFFFF || v > 0x1F)
        return -1;
    *domain = (unsigned)d;
    *bus = (unsigned)b;
    *dev = (unsigned)v;
    return 0;
}

static const struct {
    nvmlReturn_t code;
    const char *name;
} return_names[] = {
    {NVML_SUCCESS, "SUCCESS"},
    {NVML_ERROR_UNINITIALIZED, "UNINITIALIZED"},
    {NVML_ERROR_INVALID_ARGUMENT, "INVALID_ARGUMENT"},
    {NVML_ERROR_NOT_SUPPORTED, "NOT_SUPPORTED"},
    {NVML_ERROR_NO_PERMISSION, "NO_PERMISSION"},
    {NVML_ERROR_ALREADY_INITIALIZED, "ALREADY_INITIALIZED"},
    {NVML_ERROR_NOT_FOUND, "NOT_FOUND"},
    {NVML_ERROR_INSUFFICIENT_SIZE, "INSUFFICIENT_SIZE"},
    {NVML_ERROR_INSUFFICIENT_POWER, "INSUFFICIENT_POWER"},
    {NVML_ERROR_DRIVER_NOT_LOADED, "DRIVER_NOT_LOADED"},
    {NVML_ERROR_TIMEOUT, "TIMEOUT"},
    {NVML_ERROR_IRQ_ISSUE, "IRQ_ISSUE"},
    {NVML_ERROR_LIBRARY_NOT_FOUND, "LIBRARY_NOT_FOUND"},
    {NVML_ERROR_FUNCTION_NOT_FOUND, "FUNCTION_NOT_FOUND"},
    {NVML_ERROR_CORRUPTED_INFOROM, "CORRUPTED_INFOROM"},
    {NVML_ERROR_GPU_IS_LOST, "GPU_IS_LOST"},
    {NVML_ERROR_RESET_REQUIRED, "RESET_REQUIRED"},
    {NVML_ERROR_OPERATING_SYSTEM, "OPERATING_SYSTEM"},
    {NVML_ERROR_LIB_RM_VERSION_MISMATCH, "LIB_RM_VERSION_MISMATCH"},
    {NVML_ERROR_IN_USE, "IN_USE"},
    {NVML_ERROR_MEMORY, "MEMORY"},
    {NVML_ERROR_NO_DATA, "NO_DATA"},
    {NVML_ERROR_VGPU_ECC_NOT_SUPPORTED, "VGPU_ECC_NOT_SUPPORTED"},
    {NVML_ERROR_INSUFFICIENT_RESOURCES, "INSUFFICIENT_RESOURCES"},
    {NVML_ERROR_FREQ_NOT_SUPPORTED, "FREQ_NOT_SUPPORTED"},
    {NVML_ERROR_ARGUMENT_VERSION_MISMATCH, "ARGUMENT_VERSION_MISMATCH"},
    {NVML_ERROR_DEPRECATED, "DEPRECATED"},
    {NVML_ERROR_NOT_READY, "NOT_READY"},
    {NVML_ERROR_GPU_NOT_FOUND, "GPU_NOT_FOUND"},
    {NVML_ERROR_INVALID_STATE, "INVALID_STATE"},
    {NVML_ERROR_RESET_TYPE_NOT_SUPPORTED, "RESET_TYPE_NOT_SUPPORTED"},
    {NVML_ERROR_UNKNOWN, "UNKNOWN"},
};

#define N_RETURN_NAMES (sizeof return_names / sizeof return_names[0])

const char *si_return_name(nvmlReturn_t r)
{
    size_t i;
    for (i = 0; i < N_RETURN_NAMES; i++)
        if (return_names[i].code == r)
            return return_names[i].name;
    return NULL;
}

/* A code by name (with or without NVML_ / NVML_ERROR_ prefix) or by number; only codes NVML
 * defines are accepted. */
int si_parse_return_code(const char *s, nvmlReturn_t *out)
{
    unsigned long long v;
    size_t i;
    if (strncmp(s, "NVML_ERROR_", 11) == 0)
        s += 11;
    else if (strncmp(s, "NVML_", 5) == 0)
        s += 5;
    for (i = 0; i < N_RETURN_NAMES; i++) {
        if (strcmp(s, return_names[i].name) == 0) {
            *out = return_names[i].code;
            return 0;
        }
    }
    if (parse_u64(s, 0xFFFFFFFFull, &v) != 0)
        return -1;
    for (i = 0; i < N_RETURN_NAMES; i++) {
        if ((unsigned long long)return_names[i].code == v) {
            *out = return_names[i].code;
            return 0;
        }
    }
    return -1;
}

static int parse_named_small(const char *s, const char *const *names, size_t count, const char *prefix,
                             unsigned char *out)
{
    unsigned long long v;
    size_t i, plen = strlen(prefix);
    if (strncmp(s, prefix, plen) == 0)
        s += plen;
    for (i = 0; i < count; i++) {
        if (strcmp(s, names[i]) == 0) {
            *out = (unsigned char)i;
            return 0;
        }
    }
    if (parse_u64(s, count - 1, &v) != 0)
        return -1;
    *out = (unsigned char)v;
    return 0;
}

static const char *const fabric_state_names[] = {"NOT_SUPPORTED", "NOT_STARTED", "IN_PROGRESS",
                                                 "COMPLETED"};
static const char *const health_summary_names[] = {"NOT_SUPPORTED", "HEALTHY", "UNHEALTHY",
                                                   "LIMITED_CAPACITY"};

static int parse_fabric_state(const char *s, unsigned char *out)
{
    return parse_named_small(s, fabric_state_names, 4, "NVML_GPU_FABRIC_STATE_", out);
}

static int parse_health_summary(const char *s, unsigned char *out)
{
    return parse_named_small(s, health_summary_names, 4, "NVML_GPU_FABRIC_HEALTH_SUMMARY_", out);
}

static int parse_bool(const char *s, int *out)
{
    if (strcmp(s, "true") == 0 || strcmp(s, "1") == 0 || strcmp(s, "yes") == 0) {
        *out = 1;
        return 0;
    }
    if (strcmp(s, "false") == 0 || strcmp(s, "0") == 0 || strcmp(s, "no") == 0) {
        *out = 0;
        return 0;
    }
    return -1;
}

/* "10.0" -> 10, 0 */
static int parse_compute_capability(const char *s, int *major, int *minor)
{
    char buf[16];
    char *dot;
    unsigned long long a, b;
    if (copy_text(buf, sizeof buf, s) != 0)
        return -1;
    dot = strchr(buf, '.');
    if (dot == NULL)
        return -1;
    *dot = '\0';
    if (parse_dec(buf, 99, &a) != 0 || parse_dec(dot + 1, 99, &b) != 0)
        return -1;
    *major = (int)a;
    *minor = (int)b;
    return 0;
}

/* ------------------------------------------------------------------ name sets */

/* An insert-only hash set of short names, for duplicate detection and rack lookups. */
struct name_set {
    char (*names)[SI_NAME_MAX];
    uint32_t *slots; /* 0: empty, else index + 1 */
    size_t count;
    size_t cap;   /* capacity of names */
    size_t nslot; /* power of two, >= 2 * cap */
    size_t limit;
};

static uint32_t fnv1a(const char *s)
{
    uint32_t h = 2166136261u;
    for (; *s != '\0'; s++) {
        h ^= (unsigned char)*s;
        h *= 16777619u;
    }
    return h;
}

static void name_set_free(struct name_set *ns)
{
    free(ns->names);
    free(ns->slots);
    memset(ns, 0, sizeof *ns);
}

/* Index of name, or -1. */
static long name_set_find(const struct name_set *ns, const char *name)
{
    size_t i;
    if (ns->nslot == 0)
        return -1;
    i = fnv1a(name) & (ns->nslot - 1);
    while (ns->slots[i] != 0) {
        uint32_t idx = ns->slots[i] - 1;
        if (strcmp(ns->names[idx], name) == 0)
            return (long)idx;
        i = (i + 1) & (ns->nslot - 1);
    }
    return -1;
}

static int name_set_grow(struct name_set *ns)
{
    size_t cap = ns->cap == 0 ? 64 : ns->cap * 2, nslot = cap * 2, i;
    char(*names)[SI_NAME_MAX];
    uint32_t *slots;
    if (cap > ns->limit)
        cap = ns->limit;
    nslot = 1;
    while (nslot < cap * 2)
        nslot <<= 1;
    names = realloc(ns->names, cap * sizeof *names);
    if (names == NULL)
        return -1;
    ns->names = names;
    slots = calloc(nslot, sizeof *slots);
    if (slots == NULL)
        return -1;
    for (i = 0; i < ns->count; i++) {
        size_t j = fnv1a(ns->names[i]) & (nslot - 1);
        while (slots[j] != 0)
            j = (j + 1) & (nslot - 1);
        slots[j] = (uint32_t)(i + 1);
    }
    free(ns->slots);
    ns->slots = slots;
    ns->cap = cap;
    ns->nslot = nslot;
    return 0;
}

/* 0: added; 1: already present; -1: out of memory; -2: over the limit. */
static int name_set_add(struct name_set *ns, const char *name)
{
    size_t i;
    if (name_set_find(ns, name) >= 0)
        return 1;
    if (ns->count >= ns->limit)
        return -2;
    if (ns->count == ns->cap && name_set_grow(ns) != 0)
        return -1;
    memcpy(ns->names[ns->count], name, strlen(name) + 1);
    i = fnv1a(name) & (ns->nslot - 1);
    while (ns->slots[i] != 0)
        i = (i + 1) & (ns->nslot - 1);
    ns->slots[i] = (uint32_t)(ns->count + 1);
    ns->count++;
    return 0;
}

/* ------------------------------------------------------------------ topology */

enum section { SEC_TOP, SEC_RACK, SEC_NODE, SEC_GPU };

/* Bits for "which keys this section has seen". */
enum {
    K_FORMAT = 1u << 0,
    K_DRIVER_VERSION = 1u << 1,
    K_NVML_VERSION = 1u << 2,
    K_CUDA_DRIVER_VERSION = 1u << 3,
    K_CLUSTER_UUID = 1u << 4,
    K_CLIQUE_ID = 1u << 5,
    K_RACK = 1u << 6,
    K_INDEX = 1u << 7,
    K_UUID = 1u << 8,
    K_NAME = 1u << 9,
    K_SERIAL = 1u << 10,
    K_BOARD_PART_NUMBER = 1u << 11,
    K_PCI_BUS_ID = 1u << 12,
    K_PCI_DEVICE_ID = 1u << 13,
    K_PCI_SUBSYSTEM_ID = 1u << 14,
    K_MINOR = 1u << 15,
    K_MEMORY_TOTAL_MIB = 1u << 16,
    K_MEMORY_RESERVED_MIB = 1u << 17,
    K_MEMORY_USED_MIB = 1u << 18,
    K_COMPUTE_CAPABILITY = 1u << 19,
    K_FABRIC_STATE = 1u << 20,
    K_FABRIC_STATUS = 1u << 21,
    K_HEALTH_MASK = 1u << 22,
    K_HEALTH_SUMMARY = 1u << 23
};

static const struct {
    const char *name;
    unsigned bit;
    unsigned sections; /* 1 << enum section */
} topo_keys[] = {
    {"format", K_FORMAT, 1u << SEC_TOP},
    {"driver_version", K_DRIVER_VERSION, 1u << SEC_TOP},
    {"nvml_version", K_NVML_VERSION, 1u << SEC_TOP},
    {"cuda_driver_version", K_CUDA_DRIVER_VERSION, 1u << SEC_TOP},
    {"cluster_uuid", K_CLUSTER_UUID, 1u << SEC_RACK | 1u << SEC_GPU},
    {"clique_id", K_CLIQUE_ID, 1u << SEC_RACK | 1u << SEC_NODE | 1u << SEC_GPU},
    {"rack", K_RACK, 1u << SEC_NODE},
    {"index", K_INDEX, 1u << SEC_GPU},
    {"uuid", K_UUID, 1u << SEC_GPU},
    {"name", K_NAME, 1u << SEC_GPU},
    {"serial", K_SERIAL, 1u << SEC_GPU},
    {"board_part_number", K_BOARD_PART_NUMBER, 1u << SEC_GPU},
    {"pci_bus_id", K_PCI_BUS_ID, 1u << SEC_GPU},
    {"pci_device_id", K_PCI_DEVICE_ID, 1u << SEC_GPU},
    {"pci_subsystem_id", K_PCI_SUBSYSTEM_ID, 1u << SEC_GPU},
    {"minor", K_MINOR, 1u << SEC_GPU},
    {"memory_total_mib", K_MEMORY_TOTAL_MIB, 1u << SEC_GPU},
    {"memory_reserved_mib", K_MEMORY_RESERVED_MIB, 1u << SEC_GPU},
    {"memory_used_mib", K_MEMORY_USED_MIB, 1u << SEC_GPU},
    {"compute_capability", K_COMPUTE_CAPABILITY, 1u << SEC_GPU},
    {"fabric_state", K_FABRIC_STATE, 1u << SEC_GPU},
    {"fabric_status", K_FABRIC_STATUS, 1u << SEC_GPU},
    {"health_mask", K_HEALTH_MASK, 1u << SEC_GPU},
    {"health_summary", K_HEALTH_SUMMARY, 1u << SEC_GPU},
};

#define N_TOPO_KEYS (sizeof topo_keys / sizeof topo_keys[0])
#define TOP_REQUIRED (K_FORMAT | K_DRIVER_VERSION | K_NVML_VERSION | K_CUDA_DRIVER_VERSION)
#define RACK_REQUIRED (K_CLUSTER_UUID | K_CLIQUE_ID)
#define GPU_REQUIRED (K_INDEX | K_UUID | K_PCI_BUS_ID | K_MINOR)
#define GPU_FABRIC_KEYS                                                                         \
    (K_CLUSTER_UUID | K_CLIQUE_ID | K_FABRIC_STATE | K_FABRIC_STATUS | K_HEALTH_MASK |          \
     K_HEALTH_SUMMARY)

static const char *const section_names[] = {"top level", "[rack]", "[node]", "[gpu]"};

struct rack_info {
    unsigned char cluster_uuid[16];
    uint32_t clique_id;
};

struct topo_parser {
    const char *path;
    const char *want_node;
    struct si_topology *out;
    char *err;
    size_t errlen;

    struct name_set racks;
    struct rack_info *rack_info; /* parallel to racks.names, grown with it */
    size_t rack_info_cap;
    struct name_set nodes;

    enum section sec;
    unsigned sec_line;
    unsigned seen;     /* keys seen in the current section */
    unsigned top_seen; /* keys seen at the top level */

    /* current rack / node / gpu */
    long cur_rack;           /* index into racks, or -1 */
    int node_open;           /* a [node] section was the last node-level section */
    int node_selected;       /* the current node is the one we answer as */
    int node_found;
    long node_rack;          /* rack of the current node, or -1 */
    uint32_t node_clique;
    int node_has_clique;
    unsigned node_gpu_count; /* gpus seen under the current node */
    struct si_gpu gpu;       /* gpu being parsed */
    char node_uuids[SI_MAX_GPUS][SI_UUID_STR_SIZE];
    unsigned node_minors[SI_MAX_GPUS];
    unsigned node_bus[SI_MAX_GPUS][3];
};

static int topo_fail_field(struct topo_parser *p, const struct token *t, const char *what)
{
    set_err(p->err, p->errlen, "%s:%u: field '%s': %s (got '%s')", p->path, t->line, t->key, what,
            t->value);
    return -1;
}

static void gpu_defaults(struct si_gpu *g)
{
    memset(g, 0, sizeof *g);
    memcpy(g->name, "NVIDIA GB200", sizeof "NVIDIA GB200");
    g->pci_device_id = 0x294110DEu;
    g->pci_subsystem_id = 0x204610DEu;
    g->mem_total = 189471ull << 20;
    g->cc_major = 10;
    g->cc_minor = 0;
    g->fabric_state = NVML_GPU_FABRIC_STATE_COMPLETED;
    g->fabric_status = NVML_SUCCESS;
    g->health_mask = SI_HEALTH_MASK_HEALTHY;
    g->health_summary = NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY;
}

static int missing_keys(struct topo_parser *p, unsigned required, unsigned seen, const char *where,
                        unsigned line)
{
    size_t i;
    for (i = 0; i < N_TOPO_KEYS; i++) {
        if ((required & topo_keys[i].bit) && !(seen & topo_keys[i].bit)) {
            if (line == 0)
                set_err(p->err, p->errlen, "%s: %s is missing required field '%s'", p->path, where,
                        topo_keys[i].name);
            else
                set_err(p->err, p->errlen, "%s:%u: %s section is missing required field '%s'", p->path,
                        line, where, topo_keys[i].name);
            return -1;
        }
    }
    return 0;
}

/* Validates and stores the section that just ended. */
static int topo_end_section(struct topo_parser *p)
{
    switch (p->sec) {
    case SEC_TOP:
        return 0;
    case SEC_RACK:
        return missing_keys(p, RACK_REQUIRED, p->seen, "[rack]", p->sec_line);
    case SEC_NODE:
        if ((p->seen & K_CLIQUE_ID) && !(p->seen & K_RACK)) {
            set_err(p->err, p->errlen,
                    "%s:%u: [node] section has field 'clique_id' but no 'rack' (NVLink domain)", p->path,
                    p->sec_line);
            return -1;
        }
        return 0;
    case SEC_GPU: {
        struct si_gpu *g = &p->gpu;
        unsigned i, slot;
        if (missing_keys(p, GPU_REQUIRED, p->seen, "[gpu]", p->sec_line) != 0)
            return -1;
        if (g->mem_reserved + g->mem_used > g->mem_total) {
            set_err(p->err, p->errlen,
                    "%s:%u: [gpu] section: memory_reserved_mib + memory_used_mib exceed memory_total_mib",
                    p->path, p->sec_line);
            return -1;
        }
        slot = p->node_gpu_count;
        for (i = 0; i < slot; i++) {
            if (strcmp(p->node_uuids[i], g->uuid) == 0) {
                set_err(p->err, p->errlen, "%s:%u: field 'uuid': %s is used twice on this node", p->path,
                        p->sec_line, g->uuid);
                return -1;
            }
            if (p->node_minors[i] == g->minor) {
                set_err(p->err, p->errlen, "%s:%u: field 'minor': %u is used twice on this node",
                        p->path, p->sec_line, g->minor);
                return -1;
            }
            if (p->node_bus[i][0] == g->pci_domain && p->node_bus[i][1] == g->pci_bus &&
                p->node_bus[i][2] == g->pci_device) {
                set_err(p->err, p->errlen, "%s:%u: field 'pci_bus_id': used twice on this node",
                        p->path, p->sec_line);
                return -1;
            }
        }
        memcpy(p->node_uuids[slot], g->uuid, sizeof g->uuid);
        p->node_minors[slot] = g->minor;
        p->node_bus[slot][0] = g->pci_domain;
        p->node_bus[slot][1] = g->pci_bus;
        p->node_bus[slot][2] = g->pci_device;
        if (p->node_rack >= 0) {
            g->has_fabric = 1;
            if (!(p->seen & K_CLUSTER_UUID))
                memcpy(g->cluster_uuid, p->rack_info[p->node_rack].cluster_uuid, 16);
            if (!(p->seen & K_CLIQUE_ID))
                g->clique_id = p->node_clique;
        }
        if (p->node_selected)
            p->out->gpus[slot] = *g;
        p->node_gpu_count++;
        if (p->node_selected)
            p->out->gpu_count = p->node_gpu_count;
        return 0;
    }
    }
    return 0;
}

static int topo_begin_section(struct topo_parser *p, const struct token *t)
{
    if (topo_end_section(p) != 0)
        return -1;
    p->seen = 0;
    p->sec_line = t->line;

    if (strcmp(t->key, "rack") == 0) {
        int r;
        if (!valid_name(t->value)) {
            set_err(p->err, p->errlen,
                    "%s:%u: [rack] needs a name of 1-%d characters [A-Za-z0-9._-] starting with a "
                    "letter or digit (got '%s')",
                    p->path, t->line, SI_NAME_MAX - 1, t->value);
            return -1;
        }
        if (p->nodes.count > 0) {
            set_err(p->err, p->errlen, "%s:%u: [rack %s] comes after a [node] section; declare racks first",
                    p->path, t->line, t->value);
            return -1;
        }
        r = name_set_add(&p->racks, t->value);
        if (r == 1) {
            set_err(p->err, p->errlen, "%s:%u: rack '%s' is declared twice", p->path, t->line, t->value);
            return -1;
        }
        if (r != 0) {
            if (r == -2)
                set_err(p->err, p->errlen, "%s:%u: too many racks (at most %d)", p->path, t->line,
                        SI_MAX_RACKS);
            else
                set_err(p->err, p->errlen, "%s:%u: out of memory", p->path, t->line);
            return -1;
        }
        if (p->racks.count > p->rack_info_cap) {
            size_t cap = p->racks.cap;
            struct rack_info *ri = realloc(p->rack_info, cap * sizeof *ri);
            if (ri == NULL) {
                set_err(p->err, p->errlen, "%s:%u: out of memory", p->path, t->line);
                return -1;
            }
            p->rack_info = ri;
            p->rack_info_cap = cap;
        }
        p->cur_rack = (long)p->racks.count - 1;
        memset(&p->rack_info[p->cur_rack], 0, sizeof p->rack_info[p->cur_rack]);
        p->node_open = 0;
        p->sec = SEC_RACK;
        return 0;
    }
    if (strcmp(t->key, "node") == 0) {
        int r;
        if (!valid_name(t->value)) {
            set_err(p->err, p->errlen,
                    "%s:%u: [node] needs a name of 1-%d characters [A-Za-z0-9._-] starting with a "
                    "letter or digit (got '%s')",
                    p->path, t->line, SI_NAME_MAX - 1, t->value);
            return -1;
        }
        r = name_set_add(&p->nodes, t->value);
        if (r == 1) {
            set_err(p->err, p->errlen, "%s:%u: node '%s' is declared twice", p->path, t->line, t->value);
            return -1;
        }
        if (r != 0) {
            if (r == -2)
                set_err(p->err, p->errlen, "%s:%u: too many nodes (at most %d)", p->path, t->line,
                        SI_MAX_NODES);
            else
                set_err(p->err, p->errlen, "%s:%u: out of memory", p->path, t->line);
            return -1;
        }
        p->node_open = 1;
        p->node_selected = strcmp(t->value, p->want_node) == 0;
        if (p->node_selected) {
            p->node_found = 1;
            memcpy(p->out->node, t->value, strlen(t->value) + 1);
            p->out->rack[0] = '\0';
            p->out->gpu_count = 0;
        }
        p->node_rack = -1;
        p->node_has_clique = 0;
        p->node_clique = 0;
        p->node_gpu_count = 0;
        p->sec = SEC_NODE;
        return 0;
    }
    if (strcmp(t->key, "gpu") == 0) {
        if (t->value[0] != '\0') {
            set_err(p->err, p->errlen, "%s:%u: [gpu] takes no name (got '%s'); use 'index = N'", p->path,
                    t->line, t->value);
            return -1;
        }
        if (!p->node_open) {
            set_err(p->err, p->errlen, "%s:%u: [gpu] must follow a [node] section", p->path, t->line);
            return -1;
        }
        if (p->node_gpu_count >= SI_MAX_GPUS) {
            set_err(p->err, p->errlen, "%s:%u: node has more than %d [gpu] sections", p->path, t->line,
                    SI_MAX_GPUS);
            return -1;
        }
        gpu_defaults(&p->gpu);
        p->sec = SEC_GPU;
        return 0;
    }
    set_err(p->err, p->errlen, "%s:%u: unknown section kind '%s' (expected rack, node or gpu)", p->path,
            t->line, t->key);
    return -1;
}

static int topo_kv(struct topo_parser *p, const struct token *t)
{
    size_t i;
    unsigned bit = 0;
    unsigned long long v;
    const char *val = t->value;

    for (i = 0; i < N_TOPO_KEYS; i++) {
        if (strcmp(topo_keys[i].name, t->key) == 0) {
            if (!(topo_keys[i].sections & (1u << p->sec))) {
                set_err(p->err, p->errlen, "%s:%u: field '%s' is not allowed in the %s section", p->path,
                        t->line, t->key, section_names[p->sec]);
                return -1;
            }
            bit = topo_keys[i].bit;
            break;
        }
    }
    if (bit == 0) {
        set_err(p->err, p->errlen, "%s:%u: unknown field '%s' in the %s section", p->path, t->line, t->key,
                section_names[p->sec]);
        return -1;
    }
    if ((p->sec == SEC_TOP ? p->top_seen : p->seen) & bit) {
        set_err(p->err, p->errlen, "%s:%u: field '%s' is given twice in this section", p->path, t->line,
                t->key);
        return -1;
    }
    if (p->sec == SEC_TOP)
        p->top_seen |= bit;
    else
        p->seen |= bit;

    switch (p->sec) {
    case SEC_TOP:
        if (bit == K_FORMAT) {
            if (strcmp(val, TOPOLOGY_FORMAT) != 0)
                return topo_fail_field(p, t, "unsupported format, expected '" TOPOLOGY_FORMAT "'");
        } else if (bit == K_DRIVER_VERSION || bit == K_NVML_VERSION) {
            if (!valid_version(val))
                return topo_fail_field(p, t, "expected a dotted version such as 570.172.08");
            memcpy(bit == K_DRIVER_VERSION ? p->out->driver_version : p->out->nvml_version, val,
                   strlen(val) + 1);
        } else { /* K_CUDA_DRIVER_VERSION */
            if (parse_dec(val, 99999, &v) != 0 || v < 1000)
                return topo_fail_field(p, t, "expected an integer such as 12080 (CUDA 12.8)");
            p->out->cuda_driver_version = (int)v;
        }
        return 0;
    case SEC_RACK: {
        struct rack_info *ri = &p->rack_info[p->cur_rack];
        if (bit == K_CLUSTER_UUID) {
            if (parse_uuid16(val, ri->cluster_uuid) != 0)
                return topo_fail_field(p, t, "expected a UUID such as 7b968a6d-c8aa-45e1-9e07-e1e51be99c31");
        } else { /* K_CLIQUE_ID */
            if (parse_u64(val, 0xFFFFFFFFull, &v) != 0)
                return topo_fail_field(p, t, "expected an unsigned 32-bit integer");
            ri->clique_id = (uint32_t)v;
        }
        return 0;
    }
    case SEC_NODE:
        if (bit == K_RACK) {
            long r = name_set_find(&p->racks, val);
            if (r < 0)
                return topo_fail_field(p, t, "unknown rack (declare it with a [rack] section first)");
            p->node_rack = r;
            if (!p->node_has_clique)
                p->node_clique = p->rack_info[r].clique_id;
            if (p->node_selected)
                memcpy(p->out->rack, val, strlen(val) + 1);
        } else { /* K_CLIQUE_ID */
            if (parse_u64(val, 0xFFFFFFFFull, &v) != 0)
                return topo_fail_field(p, t, "expected an unsigned 32-bit integer");
            p->node_clique = (uint32_t)v;
            p->node_has_clique = 1;
        }
        return 0;
    case SEC_GPU: {
        struct si_gpu *g = &p->gpu;
        if ((bit & GPU_FABRIC_KEYS) && p->node_rack < 0)
            return topo_fail_field(p, t, "fabric fields need the node to have a 'rack' (NVLink domain)");
        switch (bit) {
        case K_INDEX:
            if (parse_dec(val, SI_MAX_GPUS - 1, &v) != 0)
                return topo_fail_field(p, t, "expected a GPU index 0-15");
            if (v != p->node_gpu_count) {
                set_err(p->err, p->errlen,
                        "%s:%u: field 'index': expected %u (the node's [gpu] sections must be numbered "
                        "0, 1, 2, ... in order), got '%s'",
                        p->path, t->line, p->node_gpu_count, val);
                return -1;
            }
            g->index = (unsigned)v;
            break;
        case K_UUID:
            if (!valid_gpu_uuid(val))
                return topo_fail_field(p, t, "expected 'GPU-' and a lower-case UUID");
            memcpy(g->uuid, val, strlen(val) + 1);
            break;
        case K_NAME:
            if (copy_text(g->name, sizeof g->name, val) != 0)
                return topo_fail_field(p, t, "longer than 95 characters");
            break;
        case K_SERIAL:
            if (copy_text(g->serial, sizeof g->serial, val) != 0)
                return topo_fail_field(p, t, "longer than 29 characters");
            break;
        case K_BOARD_PART_NUMBER:
            if (copy_text(g->part_number, sizeof g->part_number, val) != 0)
                return topo_fail_field(p, t, "longer than 79 characters");
            break;
        case K_PCI_BUS_ID:
            if (parse_topology_bus_id(val, &g->pci_domain, &g->pci_bus, &g->pci_device) != 0)
                return topo_fail_field(p, t,
                                       "expected DDDDDDDD:BB:DD.0 in hex with a domain of at most 0xFFFF");
            break;
        case K_PCI_DEVICE_ID:
        case K_PCI_SUBSYSTEM_ID:
            if (parse_u64(val, 0xFFFFFFFFull, &v) != 0)
                return topo_fail_field(p, t, "expected an unsigned 32-bit integer such as 0x294110DE");
            if (bit == K_PCI_DEVICE_ID)
                g->pci_device_id = (uint32_t)v;
            else
                g->pci_subsystem_id = (uint32_t)v;
            break;
        case K_MINOR:
            if (parse_dec(val, 255, &v) != 0)
                return topo_fail_field(p, t, "expected a device minor number 0-255");
            g->minor = (unsigned)v;
            break;
        case K_MEMORY_TOTAL_MIB:
        case K_MEMORY_RESERVED_MIB:
        case K_MEMORY_USED_MIB:
            if (parse_dec(val, 1ull << 24, &v) != 0)
                return topo_fail_field(p, t, "expected MiB as an integer of at most 16777216");
            if (bit == K_MEMORY_TOTAL_MIB)
                g->mem_total = v << 20;
            else if (bit == K_MEMORY_RESERVED_MIB)
                g->mem_reserved = v << 20;
            else
                g->mem_used = v << 20;
            break;
        case K_COMPUTE_CAPABILITY:
            if (parse_compute_capability(val, &g->cc_major, &g->cc_minor) != 0)
                return topo_fail_field(p, t, "expected MAJOR.MINOR such as 10.0");
            break;
        case K_CLUSTER_UUID:
            if (parse_uuid16(val, g->cluster_uuid) != 0)
                return topo_fail_field(p, t, "expected a UUID");
            break;
        case K_CLIQUE_ID:
            if (parse_u64(val, 0xFFFFFFFFull, &v) != 0)
                return topo_fail_field(p, t, "expected an unsigned 32-bit integer");
            g->clique_id = (uint32_t)v;
            break;
        case K_FABRIC_STATE:
            if (parse_fabric_state(val, &g->fabric_state) != 0)
                return topo_fail_field(p, t,
                                       "expected NOT_SUPPORTED, NOT_STARTED, IN_PROGRESS or COMPLETED");
            break;
        case K_FABRIC_STATUS:
            if (si_parse_return_code(val, &g->fabric_status) != 0)
                return topo_fail_field(p, t, "expected an NVML return code such as SUCCESS");
            break;
        case K_HEALTH_MASK:
            if (parse_u64(val, 0xFFFFFFFFull, &v) != 0)
                return topo_fail_field(p, t, "expected an unsigned 32-bit integer such as 0x11AA");
            g->health_mask = (uint32_t)v;
            break;
        case K_HEALTH_SUMMARY:
            if (parse_health_summary(val, &g->health_summary) != 0)
                return topo_fail_field(p, t,
                                       "expected NOT_SUPPORTED, HEALTHY, UNHEALTHY or LIMITED_CAPACITY");
            break;
        default:
            return topo_fail_field(p, t, "internal error: unhandled field");
        }
        return 0;
    }
    }
    return 0;
}

int si_load_topology(const char *path, const char *node, struct si_topology *out, char *err,
                     size_t errlen)
{
    struct topo_parser *p;
    struct lexer lx;
    struct token tok;
    char *text = NULL;
    size_t len = 0;
    int rc = -1, r;

    memset(out, 0, sizeof *out);
    if (si_read_file(path, SI_TOPOLOGY_MAX_BYTES, &text, &len, err, errlen) != 0)
        return -1;
    p = calloc(1, sizeof *p);
    if (p == NULL) {
        set_err(err, errlen, "%s: out of memory", path);
        free(text);
        return -1;
    }
    p->path = path;
    p->want_node = node;
    p->out = out;
    p->err = err;
    p->errlen = errlen;
    p->racks.limit = SI_MAX_RACKS;
    p->nodes.limit = SI_MAX_NODES;
    p->sec = SEC_TOP;
    p->cur_rack = -1;
    p->node_rack = -1;

    memset(&lx, 0, sizeof lx);
    lx.path = path;
    lx.buf = text;
    lx.len = len;

    for (;;) {
        r = lex_next(&lx, &tok, err, errlen);
        if (r < 0)
            goto out;
        if (r == 0)
            break;
        if (tok.kind == TOK_SECTION)
            r = topo_begin_section(p, &tok);
        else
            r = topo_kv(p, &tok);
        if (r != 0)
            goto out;
    }
    if (topo_end_section(p) != 0)
        goto out;
    if (missing_keys(p, TOP_REQUIRED, p->top_seen, "the top level", 0) != 0)
        goto out;
    if (!p->node_found) {
        set_err(err, errlen, "%s: node '%s' (from NVLFABRIC_NVML_NODE) has no [node %s] section", path,
                node, node);
        goto out;
    }
    rc = 0;
out:
    name_set_free(&p->racks);
    name_set_free(&p->nodes);
    free(p->rack_info);
    free(p);
    free(text);
    if (rc != 0)
        memset(out, 0, sizeof *out);
    return rc;
}

/* ------------------------------------------------------------------ faults */

static int fault_fail(const char *path, const struct token *t, char *err, size_t errlen,
                      const char *what)
{
    set_err(err, errlen, "%s:%u: field '%s': %s (got '%s')", path, t->line, t->key, what, t->value);
    return -1;
}

/* call.<name>: the base name, or the base name with a _vN suffix. */
static int lookup_call(const char *name)
{
    size_t i;
    for (i = 0; i < SI_CALL_COUNT; i++) {
        size_t n = strlen(si_call_names[i]);
        if (strncmp(name, si_call_names[i], n) != 0)
            continue;
        if (name[n] == '\0')
            return (int)i;
        if (name[n] == '_' && name[n + 1] == 'v' && is_digit(name[n + 2]) && name[n + 3] == '\0')
            return (int)i;
    }
    return -1;
}

static int apply_gpu_fault(const char *path, const struct token *t, char *err, size_t errlen,
                           struct si_gpu_fault *f, const char *field)
{
    unsigned long long v;
    if (strcmp(field, "missing") == 0) {
        if (parse_bool(t->value, &f->missing) != 0)
            return fault_fail(path, t, err, errlen, "expected true or false");
        f->set |= SI_GF_MISSING;
    } else if (strcmp(field, "error") == 0) {
        if (si_parse_return_code(t->value, &f->error) != 0)
            return fault_fail(path, t, err, errlen, "expected an NVML return code such as GPU_IS_LOST");
        f->set |= SI_GF_ERROR;
    } else if (strcmp(field, "fabric_state") == 0) {
        if (parse_fabric_state(t->value, &f->fabric_state) != 0)
            return fault_fail(path, t, err, errlen,
                              "expected NOT_SUPPORTED, NOT_STARTED, IN_PROGRESS or COMPLETED");
        f->set |= SI_GF_FABRIC_STATE;
    } else if (strcmp(field, "fabric_status") == 0) {
        if (si_parse_return_code(t->value, &f->fabric_status) != 0)
            return fault_fail(path, t, err, errlen, "expected an NVML return code");
        f->set |= SI_GF_FABRIC_STATUS;
    } else if (strcmp(field, "health_mask") == 0) {
        if (parse_u64(t->value, 0xFFFFFFFFull, &v) != 0)
            return fault_fail(path, t, err, errlen, "expected an unsigned 32-bit integer");
        f->health_mask = (uint32_t)v;
        f->set |= SI_GF_HEALTH_MASK;
    } else if (strcmp(field, "health_summary") == 0) {
        if (parse_health_summary(t->value, &f->health_summary) != 0)
            return fault_fail(path, t, err, errlen,
                              "expected NOT_SUPPORTED, HEALTHY, UNHEALTHY or LIMITED_CAPACITY");
        f->set |= SI_GF_HEALTH_SUMMARY;
    } else if (strcmp(field, "clique_id") == 0) {
        if (parse_u64(t->value, 0xFFFFFFFFull, &v) != 0)
            return fault_fail(path, t, err, errlen, "expected an unsigned 32-bit integer");
        f->clique_id = (uint32_t)v;
        f->set |= SI_GF_CLIQUE_ID;
    } else if (strcmp(field, "cluster_uuid") == 0) {
        if (parse_uuid16(t->value, f->cluster_uuid) != 0)
            return fault_fail(path, t, err, errlen, "expected a UUID");
        f->set |= SI_GF_CLUSTER_UUID;
    } else {
        set_err(err, errlen,
                "%s:%u: unknown GPU fault field '%s' in '%s' (expected missing, error, fabric_state, "
                "fabric_status, health_mask, health_summary, clique_id or cluster_uuid)",
                path, t->line, field, t->key);
        return -1;
    }
    return 0;
}

int si_load_faults(const char *path, unsigned gpu_count, struct si_faults *out, char *err,
                   size_t errlen)
{
    struct lexer lx;
    struct token tok;
    char *text = NULL;
    size_t len = 0;
    int r, rc = -1;

    memset(out, 0, sizeof *out);
    if (si_read_file(path, SI_FAULTS_MAX_BYTES, &text, &len, err, errlen) != 0)
        return -1;
    memset(&lx, 0, sizeof lx);
    lx.path = path;
    lx.buf = text;
    lx.len = len;

    for (;;) {
        const char *key;
        r = lex_next(&lx, &tok, err, errlen);
        if (r < 0)
            goto out;
        if (r == 0)
            break;
        if (tok.kind == TOK_SECTION) {
            set_err(err, errlen, "%s:%u: fault files have no sections", path, tok.line);
            goto out;
        }
        key = tok.key;
        if (strcmp(key, "format") == 0) {
            if (strcmp(tok.value, FAULTS_FORMAT) != 0) {
                fault_fail(path, &tok, err, errlen, "unsupported format, expected '" FAULTS_FORMAT "'");
                goto out;
            }
        } else if (strcmp(key, "init") == 0) {
            if (si_parse_return_code(tok.value, &out->init_error) != 0) {
                fault_fail(path, &tok, err, errlen, "expected an NVML return code such as DRIVER_NOT_LOADED");
                goto out;
            }
        } else if (strncmp(key, "call.", 5) == 0) {
            nvmlReturn_t code;
            if (si_parse_return_code(tok.value, &code) != 0) {
                fault_fail(path, &tok, err, errlen, "expected an NVML return code such as UNKNOWN");
                goto out;
            }
            if (strcmp(key + 5, "*") == 0) {
                out->all_calls_error = code;
            } else {
                int c = lookup_call(key + 5);
                if (c < 0) {
                    set_err(err, errlen, "%s:%u: field '%s': '%s' is not a call this library implements",
                            path, tok.line, key, key + 5);
                    goto out;
                }
                out->call_error[c] = code;
            }
        } else if (strncmp(key, "gpu.", 4) == 0) {
            const char *sel = key + 4;
            const char *dot = strchr(sel, '.');
            char selbuf[8];
            size_t sl;
            if (dot == NULL || dot == sel || dot[1] == '\0') {
                set_err(err, errlen, "%s:%u: field '%s': expected gpu.<index or *>.<field>", path, tok.line,
                        key);
                goto out;
            }
            sl = (size_t)(dot - sel);
            if (sl >= sizeof selbuf) {
                set_err(err, errlen, "%s:%u: field '%s': GPU selector is not an index or '*'", path,
                        tok.line, key);
                goto out;
            }
            memcpy(selbuf, sel, sl);
            selbuf[sl] = '\0';
            if (strcmp(selbuf, "*") == 0) {
                unsigned i;
                for (i = 0; i < SI_MAX_GPUS; i++)
                    if (apply_gpu_fault(path, &tok, err, errlen, &out->gpu[i], dot + 1) != 0)
                        goto out;
            } else {
                unsigned long long idx;
                if (parse_dec(selbuf, SI_MAX_GPUS - 1, &idx) != 0 || (selbuf[0] == '0' && selbuf[1] != '\0')) {
                    set_err(err, errlen, "%s:%u: field '%s': GPU selector '%s' is not an index 0-%d or '*'",
                            path, tok.line, key, selbuf, SI_MAX_GPUS - 1);
                    goto out;
                }
                if (idx >= gpu_count) {
                    set_err(err, errlen, "%s:%u: field '%s': GPU %llu does not exist (this node has %u)",
                            path, tok.line, key, idx, gpu_count);
                    goto out;
                }
                if (apply_gpu_fault(path, &tok, err, errlen, &out->gpu[idx], dot + 1) != 0)
                    goto out;
            }
        } else {
            set_err(err, errlen,
                    "%s:%u: unknown fault field '%s' (expected format, init, call.<name>, call.* or "
                    "gpu.<index or *>.<field>)",
                    path, tok.line, key);
            goto out;
        }
    }
    rc = 0;
out:
    free(text);
    if (rc != 0)
        memset(out, 0, sizeof *out);
    return rc;
}
