/* A strict, bounded JSON reader for the keeper's request lines, and the string writer of its
 * replies and log lines.
 *
 * Strict, because a request that is not what an agent sends is refused, not guessed at: UTF-8
 * only, RFC 8259's grammar (no NaN, no comments), no key given twice in an object, no lone
 * surrogate escapes. Bounded, because any local process may connect: at most JSON_MAX_DEPTH
 * levels of nesting (the reader recurses) and JSON_MAX_VALUES values (each costs a node). */
#ifndef KEEPER_JSON_H
#define KEEPER_JSON_H

#include <stdbool.h>
#include <stddef.h>

#include "util.h"

#define JSON_MAX_DEPTH 32
#define JSON_MAX_VALUES 16384
#define JSON_QUOTE_MAX 64 /* what a message quotes of a value, at most (then "...") */

enum jtype { J_NULL, J_BOOL, J_NUMBER, J_STRING, J_ARRAY, J_OBJECT };

struct jval {
    enum jtype t;
    const char *src; /* the value's JSON text in the line it was read from, quoted in messages */
    size_t src_n;
    bool b;           /* J_BOOL */
    bool is_int;      /* J_NUMBER: no fraction or exponent, and within long long */
    long long i;
    char *s;          /* J_STRING: the text, which may hold NUL (from \u0000) */
    size_t s_n;
    size_t len;       /* J_ARRAY, J_OBJECT: how many items */
    struct jval *items;
    struct jval *keys; /* J_OBJECT: keys[k], a J_STRING, names items[k] */
};

/* The one value of `line` (whitespace around it allowed); false with the reason. */
bool json_parse(const char *line, size_t n, struct jval *out, struct err *e);
void json_free(struct jval *v);
const struct jval *json_member(const struct jval *obj, const char *key);

/* The code point at s[*i], advancing *i; -1 (one byte consumed) where s[*i] does not start a
 * well-formed UTF-8 sequence (overlong forms, surrogates and code points past U+10FFFF are not). */
long utf8_next(const char *s, size_t n, size_t *i);

/* A JSON string in ASCII: other characters as \uXXXX (a pair past U+FFFF), bytes that are not
 * UTF-8 as \ufffd. */
void json_put_str(struct buf *b, const char *s, size_t n);
/* For messages: `s` as a JSON string, or `src` (JSON text already) as it is; at most
 * JSON_QUOTE_MAX bytes of either. */
void json_quote_str(struct buf *b, const char *s);
void json_quote_src(struct buf *b, const struct jval *v);

#endif
