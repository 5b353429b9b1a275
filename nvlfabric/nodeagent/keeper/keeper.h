/* Every IMEX daemon of this node: the ones adopted at start, and the requests. Requests are handled
 * one at a time, each to its end. */
#ifndef KEEPER_KEEPER_H
#define KEEPER_KEEPER_H

#include <stdbool.h>
#include <stddef.h>

#include "domain.h"
#include "util.h"

struct keeper {
    char *workdir;
    char *imex_binary; /* <driver root>/usr/bin/nvidia-imex */
    struct domain **domains; /* sorted by id */
    size_t n, cap;
};

/* Create the work directory, remove the temporary files of interrupted writes, adopt each daemon an
 * earlier keeper left running whose files say what it runs with, and stop the others. */
bool keeper_init(struct keeper *k, const char *workdir, const char *driver_root, struct err *e);
/* One request line: its reply line. */
void keeper_handle_line(struct keeper *k, const char *line, size_t n, struct buf *reply);
/* Reap exited children; say once per daemon that it exited on its own (the agent restarts it). */
void keeper_watch(struct keeper *k);
/* Stop every daemon (the keeper's pod is stopped: the node is drained or the keeper replaced). */
void keeper_stop_all(struct keeper *k);
void keeper_free(struct keeper *k);

#endif
