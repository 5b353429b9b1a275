/* The keeper's unix socket: one request line and one reply line per connection.
 *
 * A few connections are read at once, each against a deadline, so that a client that connects and
 * sends nothing cannot hold up the agent's calls; requests themselves are handled one at a time. */
#ifndef KEEPER_SERVER_H
#define KEEPER_SERVER_H

#include <poll.h>
#include <stdbool.h>
#include <stddef.h>

#include "keeper.h"
#include "util.h"

#define MAX_CONNS 8
#define READ_TIMEOUT_S 5.0
#define WRITE_TIMEOUT_S 5.0

struct conn {
    int fd;
    double deadline;
    struct buf in;
    bool eof;
};

struct server {
    int fd;
    char *path;
    struct conn conns[MAX_CONNS];
    size_t nconns;
};

/* Listen at path, replacing the socket file a killed keeper left. */
bool server_listen(struct server *s, const char *path, struct err *e);
/* Stop serving and remove the socket file (the daemons run on). */
void server_close(struct server *s);
/* The descriptors to poll; lowers *wait to the next connection's deadline. */
size_t server_pollfds(const struct server *s, struct pollfd *fds, double now, double *wait);
/* After poll: accept, read, answer what is complete, drop what is late. */
void server_service(struct server *s, const struct pollfd *fds, size_t nfds, struct keeper *k);

#endif
