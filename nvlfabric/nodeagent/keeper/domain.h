/* One IMEX domain's daemon on this node: its files under <workdir>/<id>/, its process (a child
 * of the keeper, or adopted from an earlier keeper), its members. */
#ifndef KEEPER_DOMAIN_H
#define KEEPER_DOMAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "imexconfig.h"
#include "util.h"

struct domain {
    char *id, *dir, *config_path, *nodes_path, *log_path, *pid_path;
    struct imex_config cfg;
    char **members; /* canonical order */
    size_t nmembers;
    struct buf tls_loaded; /* a TLS domain's credential files when the daemon last loaded them */
    pid_t child;           /* our child, or 0 */
    bool child_done;       /* reaped, with child_code */
    int child_code;
    pid_t adopted;  /* an earlier keeper's daemon (not our child: no exit status), or 0 */
    pid_t reported; /* the daemon whose exit the log has told of */
};

/* Takes cfg (zeroes it). */
struct domain *domain_new(const char *workdir, const char *id, struct imex_config *cfg);
void domain_free(struct domain *d);

pid_t domain_pid(const struct domain *d); /* 0: none */
/* True with the exit status of a daemon that died on its own (-signal; 255: an adopted one). */
bool domain_poll(struct domain *d, int *code);
void domain_child_exited(struct domain *d, int status); /* the keeper reaped it */

/* Make the daemon run with these members (copied, canonical): start it ("started"), or SIGUSR1
 * it for a new nodes file ("members changed") or new credentials ("credentials changed"), or
 * nothing (NULL). */
bool domain_run(struct domain *d, const char *imex_binary, char *const *members, size_t n, const char **done,
                struct err *e);
/* SIGTERM, SIGKILL after STOP_TIMEOUT_S; *has_code with our child's exit status. */
bool domain_stop(struct domain *d, bool *has_code, int *code, struct err *e);
/* Take over a daemon running from this domain's files; members are the domain's now. */
bool domain_adopt(struct domain *d, pid_t pid, char **members, size_t n, struct err *e);
/* Stop the daemons running from config_path other than `own`: ones nobody holds would hold the ports. */
bool kill_stale(const char *config_path, const char *pid_path, pid_t own, struct err *e);
/* The last lines of the daemon's log, for the log line that says it exited. */
void domain_log_tail(const struct domain *d, struct buf *out);

#endif
