/* The keeper's wire protocol, the agent's nvlfabric/nodeagent/imexkeeper.py: one JSON object per
 * line, one request and one reply per connection.
 *
 * Requests (Ensure, Stop, Status) are decoded strictly, each field of its type and no field this
 * release does not know, so that an agent and a keeper that disagree find out at the first call,
 * with a message naming the field. Replies carry exactly the fields of Reply and DomainState, in
 * that order, as compact ASCII JSON: agents of every release decode them and refuse unknown
 * fields, and the keeper's DaemonSet is OnDelete, so a node runs an older keeper under a newer
 * agent (and the other way round) until the node is drained. */
#ifndef KEEPER_PROTOCOL_H
#define KEEPER_PROTOCOL_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "util.h"

#define MAX_REQUEST_LINE (1u << 20)

enum op { OP_ENSURE, OP_STOP, OP_STATUS };

struct request {
    enum op op;
    char *domain;       /* Ensure, Stop: a valid domain id */
    char *bind_address; /* Ensure: an IP address, among the members */
    int server_port, cmd_port;
    char **members; /* Ensure: in canonical order */
    size_t nmembers;
    char *tls_target; /* Ensure: "" for a domain without TLS */
};

/* One request line, checked; false with what is wrong with it (the reply says "bad request: "). */
bool decode_request(const char *line, size_t n, struct request *req, struct err *e);
void request_free(struct request *req);

struct domain_state {
    const char *domain;
    pid_t pid; /* 0: null */
    bool has_exit;
    int exit;
    char *const *members;
    size_t nmembers;
    int server_port;
    bool adopted;
};

/* A Reply: ok when error is NULL; done NULL is null. */
void encode_reply(struct buf *b, const char *error, const char *done, const struct domain_state *domains,
                  size_t ndomains);

#endif
