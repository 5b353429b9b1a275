/* A domain's members and the names the keeper accepts: IP addresses, host names, domain ids.
 *
 * Every member of a domain must write the byte-identical nodes file (IMEX compares a hash of the
 * map and refuses peers whose map differs), whichever release of the keeper or the agent wrote it,
 * so members are written in one canonical order, the agent's (imexconfig.canonical_members):
 * IPv4 addresses numerically, then IPv6 addresses numerically, then host names; ties by text. */
#ifndef KEEPER_MEMBERS_H
#define KEEPER_MEMBERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util.h"

struct ipaddr {
    int version;       /* 4 or 6 */
    uint8_t value[16]; /* the address as a big-endian number (IPv4 in the last four bytes) */
};

/* An IPv4 address (four decimal octets, no leading zeros) or an IPv6 one, optionally with a
 * zone ("fe80::1%eth0"): what Python's ipaddress.ip_address accepts, the agent's check. */
bool ip_parse(const char *s, struct ipaddr *out);
/* 1..253 of A-Z a-z 0-9 _ . -, not starting with '.' or '-' */
bool is_hostname(const char *s);
/* 1..63 of a-z 0-9 . -, starting and ending with a letter or digit: also a directory name */
bool is_domain_id(const char *s);
#define DOMAIN_ID_RULE "1 to 63 of a-z, 0-9, '-' and '.', starting and ending with a letter or digit"

/* Puts members[0..n) in canonical order; false, naming `what` and the entry, for a malformed or
 * repeated one. */
bool canonical_members(char **members, size_t n, const char *what, struct err *e);
void render_nodes(char *const *members, size_t n, struct buf *out);

#endif
