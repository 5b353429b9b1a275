#include "settings.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "files.h"
#include "util.h"

#define DRIVER "channel.nvlfabric.io"

enum { F_KUBELET_ROOT, F_DRIVER_ROOT, F_LOG_FORMAT, F_WORKDIR, F_SOCKET, F_COUNT };

struct flag {
    const char *name, *env;
    const char *value; /* from the command line, else the environment (unset when empty), else NULL */
};

static const char USAGE[] =
    "usage: nvlfabric-imex-keeper [--kubelet-root DIR] [--driver-root DIR] [--log-format json|text]\n"
    "                             [--workdir DIR] [--socket PATH]\n"
    "\n"
    "The nvlfabric IMEX keeper: runs this node's IMEX daemons for the node agent.\n"
    "\n"
    "  --kubelet-root DIR    $KUBELET_ROOT, default /var/lib/kubelet\n"
    "  --driver-root DIR     where usr/bin/nvidia-imex is; $DRIVER_ROOT, default /run/nvidia/driver\n"
    "  --log-format FORMAT   json or text; $LOG_FORMAT, default json\n"
    "  --workdir DIR         the IMEX work directory the agent shares; $IMEX_WORKDIR, default\n"
    "                        <kubelet root>/plugins/" DRIVER "/imex\n"
    "  --socket PATH         the keeper's socket; $IMEX_KEEPER_SOCKET, default <workdir>/keeper.sock\n";

static int fail(struct settings *s, const struct flag *f, const char *what)
{
    if (f)
        fprintf(stderr, "nvlfabric imex: %s / $%s: %s\n", f->name, f->env, what);
    else
        fprintf(stderr, "nvlfabric imex: %s\n", what);
    settings_free(s);
    return 2;
}

int settings_parse(int argc, char **argv, struct settings *s)
{
    struct flag flags[F_COUNT] = {
        {"--kubelet-root", "KUBELET_ROOT", NULL}, {"--driver-root", "DRIVER_ROOT", NULL},
        {"--log-format", "LOG_FORMAT", NULL},     {"--workdir", "IMEX_WORKDIR", NULL},
        {"--socket", "IMEX_KEEPER_SOCKET", NULL},
    };
    char msg[512];
    memset(s, 0, sizeof *s);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            fputs(USAGE, stdout);
            return 0;
        }
        const char *eq = strchr(argv[i], '=');
        size_t len = eq ? (size_t)(eq - argv[i]) : strlen(argv[i]);
        struct flag *f = NULL;
        for (int k = 0; k < F_COUNT && !f; k++)
            if (strlen(flags[k].name) == len && strncmp(flags[k].name, argv[i], len) == 0)
                f = &flags[k];
        if (!f) {
            snprintf(msg, sizeof msg, "unknown argument %.200s (see --help)", argv[i]);
            return fail(s, NULL, msg);
        }
        if (!eq && i + 1 == argc)
            return fail(s, f, "expects a value");
        f->value = eq ? eq + 1 : argv[++i];
        if (!*f->value)
            return fail(s, f, "must not be empty (leave it out for the default)");
    }
    for (int k = 0; k < F_COUNT; k++) {
        const char *env = getenv(flags[k].env);
        if (!flags[k].value && env && *env)
            flags[k].value = env;
        /* the paths end up in one-line config files */
        if (flags[k].value && strpbrk(flags[k].value, "\r\n"))
            return fail(s, &flags[k], "must not hold a line break");
    }

    const char *format = flags[F_LOG_FORMAT].value ? flags[F_LOG_FORMAT].value : "json";
    if (strcmp(format, "json") != 0 && strcmp(format, "text") != 0) {
        snprintf(msg, sizeof msg, "%.200s is not json or text", format);
        return fail(s, &flags[F_LOG_FORMAT], msg);
    }
    s->log_json = strcmp(format, "json") == 0;
    s->driver_root = path_normalize(flags[F_DRIVER_ROOT].value ? flags[F_DRIVER_ROOT].value : "/run/nvidia/driver");
    const struct flag *source = &flags[F_WORKDIR];
    if (flags[F_WORKDIR].value) {
        s->workdir = path_normalize(flags[F_WORKDIR].value);
    } else {
        struct buf b = {0};
        source = &flags[F_KUBELET_ROOT];
        buf_printf(&b, "%s/plugins/" DRIVER "/imex", source->value ? source->value : "/var/lib/kubelet");
        s->workdir = path_normalize(buf_str(&b));
        buf_free(&b);
    }
    if (flags[F_SOCKET].value) {
        source = &flags[F_SOCKET];
        s->socket = path_normalize(source->value);
    } else {
        s->socket = path_join(s->workdir, "keeper.sock");
    }
    if (strlen(s->socket) > MAX_UNIX_SOCKET_PATH) {
        snprintf(msg, sizeof msg, "the keeper's socket %.300s is longer than a unix socket path may be (%d bytes); %s",
                 s->socket, MAX_UNIX_SOCKET_PATH,
                 source == &flags[F_KUBELET_ROOT] ? "use a shorter kubelet root"
                 : source == &flags[F_WORKDIR]    ? "use a shorter work directory, or set --socket"
                                                  : "use a shorter path");
        return fail(s, source, msg);
    }
    return -1;
}

void settings_free(struct settings *s)
{
    free(s->workdir);
    free(s->driver_root);
    free(s->socket);
    memset(s, 0, sizeof *s);
}
