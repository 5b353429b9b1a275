#include "keeper.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "files.h"
#include "log.h"
#include "members.h"
#include "procs.h"
#include "protocol.h"

/* -- the domains, sorted by id ------------------------------------------------------------------ */

static size_t position(const struct keeper *k, const char *id)
{
    size_t i = 0;
    while (i < k->n && strcmp(k->domains[i]->id, id) < 0)
        i++;
    return i;
}

static struct domain *find(const struct keeper *k, const char *id)
{
    size_t i = position(k, id);
    return i < k->n && strcmp(k->domains[i]->id, id) == 0 ? k->domains[i] : NULL;
}

static void insert(struct keeper *k, struct domain *d)
{
    if (k->n == k->cap) {
        k->cap = k->cap ? k->cap * 2 : 4;
        k->domains = xrealloc(k->domains, k->cap * sizeof *k->domains);
    }
    size_t i = position(k, d->id);
    memmove(&k->domains[i + 1], &k->domains[i], (k->n - i) * sizeof *k->domains);
    k->domains[i] = d;
    k->n++;
}

static void take_out(struct keeper *k, const struct domain *d)
{
    size_t i = position(k, d->id);
    memmove(&k->domains[i], &k->domains[i + 1], (k->n - i - 1) * sizeof *k->domains);
    k->n--;
}

static const char *members_text(const struct domain *d, struct buf *b)
{
    for (size_t i = 0; i < d->nmembers; i++)
        buf_printf(b, "%s%s", i ? ", " : "", d->members[i]);
    return buf_str(b);
}

/* -- start: clean up, adopt ------------------------------------------------------------------ */

/* The subdirectories of root (links to directories included), sorted; NULL-terminated. */
static char **subdirs(const char *root)
{
    struct dirent **ents;
    int n = scandir(root, &ents, NULL, alphasort);
    char **out = xcalloc(n > 0 ? (size_t)n + 1 : 1, sizeof *out);
    size_t kept = 0;
    for (int i = 0; i < n; i++) {
        char *path = path_join(root, ents[i]->d_name);
        if (strcmp(ents[i]->d_name, ".") != 0 && strcmp(ents[i]->d_name, "..") != 0 && is_dir(path))
            out[kept++] = xstrdup(ents[i]->d_name);
        free(path);
        free(ents[i]);
    }
    if (n > 0)
        free(ents);
    return out;
}

static void free_names(char **names)
{
    for (char **p = names; *p; p++)
        free(*p);
    free(names);
}

/* The temporary files of writes a killed keeper or agent left: ".<name>.<hex>.tmp". */
static void clean_dir(const char *dir)
{
    struct dirent **ents;
    int n = scandir(dir, &ents, NULL, NULL);
    for (int i = 0; i < n; i++) {
        size_t len = strlen(ents[i]->d_name);
        if (ents[i]->d_name[0] == '.' && len > 5 && strcmp(ents[i]->d_name + len - 4, ".tmp") == 0) {
            char *tmp = path_join(dir, ents[i]->d_name);
            unlink(tmp);
            free(tmp);
        }
        free(ents[i]);
    }
    if (n > 0)
        free(ents);
}

/* The daemon runs from the files an earlier keeper wrote, so the files say what it runs with. */
static struct domain *adopt_one(struct keeper *k, const char *id, pid_t pid, struct err *e)
{
    char *dir = path_join(k->workdir, id), *config_path = path_join(dir, "config.cfg");
    char *nodes_path = path_join(dir, "nodes.cfg");
    struct buf config = {0}, nodes = {0};
    struct imex_config cfg = {0};
    struct err why = {0};
    char **members = NULL;
    size_t n = 0;
    struct domain *d = NULL;
    int err = read_file(config_path, &config);
    if (err) {
        err_sys(e, err, "cannot read %s", config_path);
    } else if (!config_parse(config.p, config.n, &cfg, &why)) {
        err_set(e, "%s: %s", config_path, why.msg);
    } else if ((err = read_file(nodes_path, &nodes)) != 0) {
        err_sys(e, err, "cannot read %s", nodes_path);
    } else {
        static const char blanks[] = " \t\r\n\v\f";
        bool nul = strlen(buf_str(&nodes)) != nodes.n;
        members = xcalloc(nodes.n / 2 + 1, sizeof *members);
        for (char *tok = nul ? NULL : strtok(nodes.p, blanks); tok; tok = strtok(NULL, blanks))
            members[n++] = xstrdup(tok);
        if (nul)
            err_set(e, "%s holds a NUL byte", nodes_path);
        else if (canonical_members(members, n, nodes_path, e)) {
            d = domain_new(k->workdir, id, &cfg);
            if (!domain_adopt(d, pid, members, n, e)) {
                domain_free(d);
                d = NULL;
            }
            members = NULL; /* the domain's (freed with it) */
        }
    }
    for (size_t i = 0; members && i < n; i++)
        free(members[i]);
    free(members);
    config_free(&cfg);
    err_clear(&why);
    buf_free(&config);
    buf_free(&nodes);
    free(nodes_path);
    free(config_path);
    free(dir);
    return d;
}

static void adopt_all(struct keeper *k)
{
    char **dirs = subdirs(k->workdir);
    for (char **name = dirs; *name; name++) {
        char *dir = path_join(k->workdir, *name), *config_path = path_join(dir, "config.cfg");
        char *pid_path = path_join(dir, "imex.pid");
        struct err why = {0};
        pid_t *pids;
        size_t n = daemons_using(config_path, &pids);
        struct domain *d = NULL;
        clean_dir(dir);
        if (n > 1)
            err_set(&why, "%zu daemons run from its config", n);
        else if (n == 1 && !is_domain_id(*name))
            err_set(&why, "its name is not a domain id");
        else if (n == 1)
            d = adopt_one(k, *name, pids[0], &why);
        if (d) {
            struct buf members = {0};
            insert(k, d);
            log_msg(LOG_INFO, "IMEX domain %s: adopted the running daemon (pid %d, members %s)", d->id,
                    (int)d->adopted, members_text(d, &members));
            buf_free(&members);
        } else if (n) {
            /* It would hold the domain's ports, and nobody can say what it runs with. */
            struct buf list = {0};
            for (size_t i = 0; i < n; i++)
                buf_printf(&list, "%s%d", i ? ", " : "", (int)pids[i]);
            log_msg(LOG_WARNING, "IMEX domain directory %s: stopping the daemon(s) running from it (pid %s), which "
                                 "cannot be adopted: %s",
                    dir, buf_str(&list), why.msg);
            buf_free(&list);
            terminate(pids, n, STOP_TIMEOUT_S);
        }
        if (!d)
            unlink(pid_path);
        err_clear(&why);
        free(pids);
        free(pid_path);
        free(config_path);
        free(dir);
    }
    free_names(dirs);
}

bool keeper_init(struct keeper *k, const char *workdir, const char *driver_root, struct err *e)
{
    memset(k, 0, sizeof *k);
    k->workdir = path_normalize(workdir);
    char *root = path_normalize(driver_root);
    k->imex_binary = path_join(root, "usr/bin/nvidia-imex");
    free(root);
    if (!mkdir_parents(k->workdir, e))
        return false;
    adopt_all(k);
    return true;
}

/* -- requests ------------------------------------------------------------------------------------ */

static bool same_settings(const struct domain *d, const struct request *r)
{
    return d->cfg.server_port == r->server_port && d->cfg.cmd_port == r->cmd_port &&
           strcmp(d->cfg.bind_address, r->bind_address) == 0 && strcmp(d->cfg.tls_target, r->tls_target) == 0;
}

static void discard(struct domain *d)
{
    struct err ignored = {0};
    bool has_code;
    int code;
    domain_stop(d, &has_code, &code, &ignored);
    err_clear(&ignored);
    domain_free(d);
}

static bool ensure(struct keeper *k, const struct request *req, const char **done, struct err *e)
{
    struct domain *d = find(k, req->domain);
    if (d && !same_settings(d, req)) {
        /* a new config, and the daemon reads its config only at start */
        log_msg(LOG_INFO, "IMEX domain %s: ports, address or authentication changed, restarting it", d->id);
        bool has_code;
        int code;
        take_out(k, d);
        bool stopped = domain_stop(d, &has_code, &code, e);
        domain_free(d);
        if (!stopped)
            return false;
        d = NULL;
    }
    bool fresh = d == NULL;
    if (fresh) {
        struct imex_config cfg;
        config_init(&cfg, req->bind_address, req->server_port, req->cmd_port, req->tls_target);
        d = domain_new(k->workdir, req->domain, &cfg);
    }
    int before;
    bool exited_before = !fresh && domain_poll(d, &before);
    bool ok = domain_run(d, k->imex_binary, req->members, req->nmembers, done, e);
    if (!ok && fresh && !domain_pid(d)) {
        discard(d); /* nothing of it runs: not a domain of this node */
        return false;
    }
    if (fresh)
        insert(k, d);
    if (!ok || !*done)
        return ok;
    struct buf members = {0}, last = {0};
    members_text(d, &members);
    if (exited_before)
        buf_printf(&last, ", the last one exited with %d", before);
    if (strcmp(*done, "started") == 0)
        log_msg(LOG_INFO, "IMEX domain %s: started the daemon (pid %d%s), members %s", d->id, (int)domain_pid(d),
                buf_str(&last), members.p);
    else if (strcmp(*done, "members changed") == 0)
        log_msg(LOG_INFO, "IMEX domain %s: members now %s (SIGUSR1 to pid %d)", d->id, members.p, (int)domain_pid(d));
    else
        log_msg(LOG_INFO, "IMEX domain %s: new credentials (SIGUSR1 to pid %d)", d->id, (int)domain_pid(d));
    buf_free(&members);
    buf_free(&last);
    return true;
}

static bool stop(struct keeper *k, const char *id, struct err *e)
{
    struct domain *d = find(k, id);
    char *dir = path_join(k->workdir, id);
    bool ok;
    if (d) {
        bool has_code;
        int code;
        pid_t pid = domain_pid(d);
        take_out(k, d);
        ok = domain_stop(d, &has_code, &code, e);
        if (pid && has_code)
            log_msg(LOG_INFO, "IMEX domain %s: stopped the daemon (pid %d, exit status %d)", id, (int)pid, code);
        else if (pid)
            log_msg(LOG_INFO, "IMEX domain %s: stopped the daemon (pid %d)", id, (int)pid);
        domain_free(d);
    } else {
        /* Not known here, yet one may run from its files: a keeper killed between starting it and
         * recording it. */
        char *config_path = path_join(dir, "config.cfg"), *pid_path = path_join(dir, "imex.pid");
        ok = kill_stale(config_path, pid_path, 0, e);
        free(config_path);
        free(pid_path);
    }
    if (ok)
        remove_tree(dir);
    free(dir);
    return ok;
}

static void status(struct keeper *k, struct buf *reply)
{
    struct domain_state *states = xcalloc(k->n, sizeof *states);
    for (size_t i = 0; i < k->n; i++) {
        struct domain *d = k->domains[i];
        states[i] = (struct domain_state){.domain = d->id, .pid = domain_pid(d), .members = d->members,
                                          .nmembers = d->nmembers, .server_port = d->cfg.server_port,
                                          .adopted = d->adopted != 0};
        states[i].has_exit = domain_poll(d, &states[i].exit);
    }
    encode_reply(reply, NULL, NULL, states, k->n);
    free(states);
}

void keeper_handle_line(struct keeper *k, const char *line, size_t n, struct buf *reply)
{
    struct request req;
    struct err e = {0};
    const char *done = NULL;
    if (!decode_request(line, n, &req, &e)) {
        struct buf msg = {0};
        buf_printf(&msg, "bad request: %s", e.msg);
        encode_reply(reply, msg.p, NULL, NULL, 0);
        buf_free(&msg);
        err_clear(&e);
        return;
    }
    bool ok = true;
    if (req.op == OP_ENSURE)
        ok = ensure(k, &req, &done, &e);
    else if (req.op == OP_STOP)
        ok = stop(k, req.domain, &e);
    if (req.op == OP_STATUS)
        status(k, reply);
    else
        encode_reply(reply, ok ? NULL : e.msg, done, NULL, 0);
    err_clear(&e);
    request_free(&req);
}

void keeper_watch(struct keeper *k)
{
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0)
        for (size_t i = 0; i < k->n; i++)
            if (k->domains[i]->child == pid && !k->domains[i]->child_done)
                domain_child_exited(k->domains[i], status);
    for (size_t i = 0; i < k->n; i++) {
        struct domain *d = k->domains[i];
        pid_t own = domain_pid(d);
        int code;
        if (own && own != d->reported && domain_poll(d, &code)) {
            struct buf tail = {0};
            d->reported = own;
            domain_log_tail(d, &tail);
            log_msg(LOG_WARNING, "IMEX domain %s: the daemon (pid %d) exited with status %d; log: %s", d->id, (int)own,
                    code, tail.p);
            buf_free(&tail);
        }
    }
}

void keeper_stop_all(struct keeper *k)
{
    while (k->n) {
        struct domain *d = k->domains[0];
        take_out(k, d);
        if (domain_pid(d))
            log_msg(LOG_INFO, "IMEX domain %s: stopping the daemon (pid %d): the keeper stops", d->id,
                    (int)domain_pid(d));
        discard(d);
    }
}

void keeper_free(struct keeper *k)
{
    keeper_stop_all(k);
    free(k->domains);
    free(k->workdir);
    free(k->imex_binary);
    memset(k, 0, sizeof *k);
}
