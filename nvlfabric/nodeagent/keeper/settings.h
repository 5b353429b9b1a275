/* The keeper's command line, which `python -m nvlfabric imex` passes on as it is. Each flag has an
 * environment twin; a flag wins over its twin, the twin over the default. */
#ifndef KEEPER_SETTINGS_H
#define KEEPER_SETTINGS_H

#include <stdbool.h>

#define MAX_UNIX_SOCKET_PATH 107 /* sun_path is 108 bytes with its NUL */

struct settings {
    char *workdir;
    char *driver_root;
    char *socket;
    bool log_json;
};

/* -1: run with *s; else the exit status (0 after --help, 2 after a message on stderr). */
int settings_parse(int argc, char **argv, struct settings *s);
void settings_free(struct settings *s);

#endif
