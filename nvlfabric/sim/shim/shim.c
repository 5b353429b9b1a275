/*
 * nvlfabric-shim: what stays of a simulated container's proxy once its container runs.
 *
 *   nvlfabric-shim <child pid> [<CRI log path> <stdout fd> <stderr fd>]
 *   nvlfabric-shim --init <child pid>
 *   nvlfabric-shim --pause
 *
 * rootfs.py forks the container, then execs this in the proxy's place: the same process (its pid
 * is the one the kubelet or runtime started and signals), now a few hundred kB instead of a
 * Python interpreter. It forwards the signals a runtime forwards to the container, and exits
 * with the container's status (128 + signal when it was killed). With a log path it is also the
 * container's log writer: each line of the two pipes becomes `<RFC 3339 time> stdout|stderr F
 * <line>` in the CRI log format the kubelet reads. It stops at the container's exit, not at the
 * pipes' end: what the container started and left running (an IMEX daemon) may hold them open.
 *
 * --init: the first process of a container's own PID namespace (rootfs.py), as `docker run --init`
 * gives one: it forwards the signals to the container (pid <child pid> in that namespace), reaps
 * every orphan the container leaves it, and exits with the container's status as soon as the
 * container exits; the kernel then kills whatever else still runs in the namespace, so no
 * process of a container outlives it.
 *
 * --pause: the first process of a node's or a pod's PID namespace (a sandbox's, as the pause
 * container is): it only reaps the orphans re-parented to it, until SIGTERM or SIGINT.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define LINE_MAX_BYTES (16 * 1024)

static volatile pid_t child;

static void forward(int sig) {
    if (child > 0)
        kill(child, sig);
}

struct stream {
    const char *name;
    int fd;
    char buf[LINE_MAX_BYTES];
    size_t len;
};

static int log_fd = -1;

static void write_all(const char *data, size_t len) {
    while (len > 0) {
        ssize_t n = write(log_fd, data, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return; /* a full disk loses log lines, never the container */
        }
        data += n;
        len -= (size_t)n;
    }
}

static void emit(const struct stream *s, const char *line, size_t len) {
    struct timespec ts;
    struct tm tm;
    char head[96];
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(head, sizeof head, "%Y-%m-%dT%H:%M:%S", &tm);
    n += (size_t)snprintf(head + n, sizeof head - n, ".%06ldZ %s F ", ts.tv_nsec / 1000, s->name);
    write_all(head, n);
    write_all(line, len);
    write_all("\n", 1);
}

/* Read what is there; write every complete line (an over-long one in pieces). 0 at the pipe's end. */
static int drain(struct stream *s) {
    for (;;) {
        ssize_t n = read(s->fd, s->buf + s->len, sizeof s->buf - s->len);
        if (n < 0)
            return errno == EINTR ? 1 : (errno == EAGAIN ? 1 : 0);
        if (n == 0)
            return 0;
        s->len += (size_t)n;
        size_t start = 0;
        for (size_t i = 0; i < s->len; i++) {
            if (s->buf[i] == '\n') {
                emit(s, s->buf + start, i - start);
                start = i + 1;
            }
        }
        if (start == 0 && s->len == sizeof s->buf) { /* no newline in a full buffer */
            emit(s, s->buf, s->len);
            start = s->len;
        }
        memmove(s->buf, s->buf + start, s->len - start);
        s->len -= start;
    }
}

static int exit_code(int status) {
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* --pause: reap until told to stop. */
static int pause_and_reap(void) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigprocmask(SIG_BLOCK, &set, NULL);
    for (;;) {
        int sig = sigwaitinfo(&set, NULL);
        if (sig == SIGTERM || sig == SIGINT)
            return 0;
        while (waitpid(-1, NULL, WNOHANG) > 0) {
        }
    }
}

/* --init: the container's status once it exits; every other child is reaped on the way. */
static int init_and_reap(void) {
    int status = 0;
    for (;;) {
        pid_t done = waitpid(-1, &status, 0);
        if (done == child)
            return exit_code(status);
        if (done < 0 && errno != EINTR)
            return 127;
    }
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "--pause") == 0)
        return pause_and_reap();
    int init = argc == 3 && strcmp(argv[1], "--init") == 0;
    if (init) {
        argv++;
        argc--;
    }
    if (argc != 2 && argc != 5) {
        fprintf(stderr, "usage: %s <child pid> [<CRI log path> <stdout fd> <stderr fd>] | --init <child pid> | --pause\n",
                argv[0]);
        return 127;
    }
    child = (pid_t)atol(argv[1]);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = forward;
    sa.sa_flags = SA_RESTART;
    int forwarded[] = {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2, SIGQUIT};
    for (size_t i = 0; i < sizeof forwarded / sizeof forwarded[0]; i++)
        sigaction(forwarded[i], &sa, NULL);
    int status = 0;
    if (init)
        return init_and_reap();
    if (argc == 2) {
        while (waitpid(child, &status, 0) < 0) {
            if (errno != EINTR)
                return 127;
        }
        return exit_code(status);
    }
    log_fd = open(argv[2], O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
    static struct stream streams[2];
    streams[0].name = "stdout";
    streams[0].fd = atoi(argv[3]);
    streams[1].name = "stderr";
    streams[1].fd = atoi(argv[4]);
    struct pollfd fds[2];
    for (int i = 0; i < 2; i++) {
        fcntl(streams[i].fd, F_SETFL, fcntl(streams[i].fd, F_GETFL) | O_NONBLOCK);
        fds[i].fd = streams[i].fd;
        fds[i].events = POLLIN;
    }
    for (;;) {
        if (poll(fds, 2, 200) > 0) {
            for (int i = 0; i < 2; i++) {
                if (fds[i].fd >= 0 && (fds[i].revents & (POLLIN | POLLHUP)) && !drain(&streams[i]))
                    fds[i].fd = -1; /* its end: poll ignores it from now on */
            }
        }
        pid_t done = waitpid(child, &status, WNOHANG);
        if (done == child || (done < 0 && errno == ECHILD))
            break;
    }
    for (int i = 0; i < 2; i++) {
        if (fds[i].fd >= 0)
            drain(&streams[i]);
        if (streams[i].len > 0)
            emit(&streams[i], streams[i].buf, streams[i].len);
    }
    return exit_code(status);
}
