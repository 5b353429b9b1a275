/* Processes: the daemons the keeper spawns, and those it finds running from a config file. */
#ifndef KEEPER_PROCS_H
#define KEEPER_PROCS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "util.h"

#define STOP_TIMEOUT_S 5.0 /* SIGTERM, then SIGKILL after this long */

double monotonic_s(void);
void sleep_s(double seconds);

/* It exists and is not a zombie (one its parent has not reaped is gone for our purposes). */
bool pid_alive(pid_t pid);
/* The live nvidia-imex processes whose command line has "-c <config_path>": daemons of that
 * domain, found by what they run from, not by a pid file a killed keeper may not have written. */
size_t daemons_using(const char *config_path, pid_t **out);
/* SIGTERM, then SIGKILL what still runs after timeout s (for processes not ours to wait for). */
void terminate(const pid_t *pids, size_t n, double timeout);

/* `binary -c config` in its own session (it outlives the keeper), stdin /dev/null, stdout and
 * stderr to log_fd, no other descriptor of ours, default signal handling. */
bool spawn_daemon(const char *binary, const char *config, int log_fd, pid_t *pid, struct err *e);
/* A wait status as one number: the exit code, or -signal. */
int exit_code(int status);

#endif
