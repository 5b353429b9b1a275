/* nvlfabric-imex-keeper: the node's IMEX keeper, a supervisor of the node's IMEX daemons that runs
 * on every GPU node, apart from the node agent. See README.md. */
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "keeper.h"
#include "log.h"
#include "procs.h"
#include "server.h"
#include "settings.h"

#define WATCH_S 1.0 /* how often exited daemons are looked for */

static volatile sig_atomic_t stopping;

static void on_stop(int sig)
{
    (void)sig;
    stopping = 1;
}

/* A daemon's stdio must not land on one of our sockets: keep 0..2 taken. */
static void hold_stdio(void)
{
    for (int fd = 0; fd < 3; fd++) {
        if (fcntl(fd, F_GETFD) >= 0 || errno != EBADF)
            continue;
        int null = open("/dev/null", O_RDWR);
        if (null >= 0 && null != fd) {
            dup2(null, fd);
            close(null);
        }
    }
}

int main(int argc, char **argv)
{
    hold_stdio();
    /* Fixed thresholds: glibc's adaptive ones would keep a large request's buffers in the heap for
     * good after the first one; these give them back at once. */
    mallopt(M_MMAP_THRESHOLD, 64 * 1024);
    mallopt(M_TRIM_THRESHOLD, 128 * 1024);
    struct settings cfg;
    int rc = settings_parse(argc, argv, &cfg);
    if (rc >= 0)
        return rc;
    log_setup(cfg.log_json);

    /* SIGTERM and SIGINT are taken only inside ppoll, between requests: a stop never interrupts a
     * request half done. */
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigset_t blocked, during_poll;
    sigemptyset(&blocked);
    sigaddset(&blocked, SIGTERM);
    sigaddset(&blocked, SIGINT);
    sigprocmask(SIG_BLOCK, &blocked, &during_poll);
    sigdelset(&during_poll, SIGTERM);
    sigdelset(&during_poll, SIGINT);

    struct keeper keeper;
    struct server server;
    struct err e = {0};
    if (!keeper_init(&keeper, cfg.workdir, cfg.driver_root, &e) || !server_listen(&server, cfg.socket, &e)) {
        log_msg(LOG_ERROR, "the IMEX keeper cannot start: %s", e.msg);
        return 1; /* what it adopted runs on: the next keeper adopts it again */
    }
    log_msg(LOG_INFO, "IMEX keeper serving on %s (%zu daemon(s) adopted)", cfg.socket, keeper.n);

    for (double next_watch = monotonic_s() + WATCH_S; !stopping;) {
        struct pollfd fds[MAX_CONNS + 1];
        double now = monotonic_s(), wait = next_watch > now ? next_watch - now : 0;
        size_t nfds = server_pollfds(&server, fds, now, &wait);
        struct timespec ts = {(time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9)};
        int ready = ppoll(fds, nfds, &ts, &during_poll);
        if (stopping)
            break;
        if (monotonic_s() >= next_watch) {
            keeper_watch(&keeper);
            next_watch = monotonic_s() + WATCH_S;
        }
        if (ready >= 0) /* also on a timeout: a connection past its deadline is dropped */
            server_service(&server, fds, nfds, &keeper);
    }
    server_close(&server);
    keeper_free(&keeper); /* stops every daemon */
    settings_free(&cfg);
    return 0;
}
