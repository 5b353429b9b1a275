/* A domain's IMEX config file (config.cfg): written for a request, read back at adoption.
 *
 * The bytes are a contract (the files in tests/golden/imex): every keeper release writes the same file for
 * the same request, so a keeper restart or upgrade finds its daemons' configs unchanged and never
 * restarts one, and the members of a domain run with the same settings whatever release each runs.
 * The TLS keys appear only for a TLS domain, so a plain domain's file is what releases before TLS
 * wrote. */
#ifndef KEEPER_IMEXCONFIG_H
#define KEEPER_IMEXCONFIG_H

#include <stdbool.h>
#include <stddef.h>

#include "util.h"

#define TLS_KEY "tls/node.key"
#define TLS_CERT "tls/node.crt"
#define TLS_CA "tls/ca.crt"

struct imex_config {
    char *bind_address;
    int server_port, cmd_port;
    char *tls_target; /* "": no authentication (IMEX_ENABLE_AUTH_ENCRYPTION=0) */
    /* Always 4, -1 and RECOVERY in what this keeper writes; kept as read from an adopted daemon's
     * config, so that its restart keeps what it ran with. */
    int log_level;
    long grace_time;
    bool quorum_none;
};

/* The settings a request gives; copies the strings. */
void config_init(struct imex_config *c, const char *bind_address, int server_port, int cmd_port,
                 const char *tls_target);
void config_free(struct imex_config *c);
/* The file for domain `id` whose directory is `dir`. */
void config_render(const struct imex_config *c, const char *id, const char *dir, struct buf *out);
/* A config file's settings: comments and the keys the keeper does not set are skipped, blanks
 * around keys and values ignored; false with the line and key at fault. */
bool config_parse(const char *text, size_t n, struct imex_config *out, struct err *e);

#endif
