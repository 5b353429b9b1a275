#include "procs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "files.h"

extern char **environ;

double monotonic_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void sleep_s(double seconds)
{
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

bool pid_alive(pid_t pid)
{
    if (kill(pid, 0) != 0 && errno != EPERM)
        return false;
    char path[64];
    struct buf stat = {0};
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    if (read_file(path, &stat) != 0) {
        buf_free(&stat);
        return true;
    }
    /* the state follows the command name, which may itself hold ") " */
    const char *close = strrchr(buf_str(&stat), ')');
    bool alive = !(close && close[1] == ' ' && close[2] == 'Z');
    buf_free(&stat);
    return alive;
}

/* argv[0]'s base name is nvidia-imex, and some "-c" is directly followed by the config. */
static bool runs_from(const struct buf *cmdline, const char *config)
{
    const char *argv0 = cmdline->p, *end = cmdline->p + cmdline->n;
    const char *base = strrchr(argv0, '/');
    if (strcmp(base ? base + 1 : argv0, "nvidia-imex") != 0)
        return false;
    for (const char *arg = argv0; arg < end; arg += strlen(arg) + 1) {
        const char *next = arg + strlen(arg) + 1;
        if (strcmp(arg, "-c") == 0 && next < end && strcmp(next, config) == 0)
            return true;
    }
    return false;
}

size_t daemons_using(const char *config_path, pid_t **out)
{
    size_t count = 0, cap = 0;
    *out = NULL;
    DIR *proc = opendir("/proc");
    struct dirent *ent;
    while (proc && (ent = readdir(proc)) != NULL) {
        if (!*ent->d_name || strspn(ent->d_name, "0123456789") != strlen(ent->d_name))
            continue;
        char path[300];
        struct buf cmdline = {0};
        snprintf(path, sizeof path, "/proc/%s/cmdline", ent->d_name);
        pid_t pid = (pid_t)atol(ent->d_name);
        if (read_file(path, &cmdline) == 0 && cmdline.n && runs_from(&cmdline, config_path) && pid_alive(pid)) {
            if (count == cap) {
                cap = cap ? cap * 2 : 4;
                *out = xrealloc(*out, cap * sizeof **out);
            }
            (*out)[count++] = pid;
        }
        buf_free(&cmdline);
    }
    if (proc)
        closedir(proc);
    return count;
}

void terminate(const pid_t *pids, size_t n, double timeout)
{
    for (size_t i = 0; i < n; i++)
        kill(pids[i], SIGTERM);
    double deadline = monotonic_s() + timeout;
    for (bool any = true; any && monotonic_s() < deadline;) {
        any = false;
        for (size_t i = 0; i < n && !any; i++)
            any = pid_alive(pids[i]);
        if (any)
            sleep_s(0.02);
    }
    for (size_t i = 0; i < n; i++)
        if (pid_alive(pids[i]))
            kill(pids[i], SIGKILL);
}

bool spawn_daemon(const char *binary, const char *config, int log_fd, pid_t *pid, struct err *e)
{
    int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (devnull < 0)
        return err_sys(e, errno, "cannot open /dev/null");
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t attr;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, devnull, STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&fa, log_fd, STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&fa, log_fd, STDERR_FILENO);
    posix_spawn_file_actions_addclosefrom_np(&fa, 3); /* ours are close-on-exec too */
    posix_spawnattr_init(&attr);
    /* The keeper blocks SIGTERM and SIGINT outside ppoll and ignores SIGPIPE; a daemon must start
     * with none blocked and every handler at its default. */
    sigset_t none, defaults;
    sigemptyset(&none);
    sigfillset(&defaults);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &defaults);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    char *argv[] = {xstrdup(binary), xstrdup("-c"), xstrdup(config), NULL};
    int rc = posix_spawn(pid, binary, &fa, &attr, argv, environ);
    for (size_t i = 0; argv[i]; i++)
        free(argv[i]);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    close(devnull);
    if (rc != 0)
        return err_sys(e, rc, "cannot run %s", binary);
    return true;
}

int exit_code(int status)
{
    if (WIFSIGNALED(status))
        return -WTERMSIG(status);
    return WIFEXITED(status) ? WEXITSTATUS(status) : status;
}
