/* Shared code of the IMEX stand-ins (nvidia-imex, nvidia-imex-ctl): config and nodes-file parsing,
 * name resolution, state and connection-code tables, small utilities.
 *
 * Written from the documented formats only (see sim/imex/README.md); no NVIDIA code. */
#ifndef NVLFABRIC_IMEX_COMMON_H
#define NVLFABRIC_IMEX_COMMON_H

#include <netinet/in.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define IMEX_SIM_VERSION_DEFAULT "570.172.08"
#define IMEX_DEFAULT_CONFIG "/etc/nvidia-imex/config.cfg"
#define IMEX_DEFAULT_NODES "/etc/nvidia-imex/nodes_config.cfg"
#define IMEX_DEFAULT_LOG "/var/log/nvidia-imex.log"
#define IMEX_MAX_NODES 4096
#define IMEX_ERRLEN 512

/* Wire protocol tag, first word of every peer hello and every command request. */
#define IMEX_PROTO "IMEXSIM/1"

/* Node (daemon) states, numbered as DCGM fields 1502/1503 number them. */
enum imex_node_state {
    NS_INITIALIZING = 0,
    NS_STARTING_AUTH_SERVER = 1,
    NS_WAITING_FOR_PEERS = 2,
    NS_WAITING_FOR_RECOVERY = 3,
    NS_INIT_GPU = 4,
    NS_READY = 5,
    NS_SHUTTING_DOWN = 6,
    NS_UNAVAILABLE = 7,
    NS_COUNT
};

/* Connection status of one node towards another (the -N matrix). */
enum imex_conn {
    CS_INVALID = 0,
    CS_NEVER_CONNECTED,
    CS_RECOVERING,
    CS_DISCONNECTED,
    CS_AUTHENTICATING,
    CS_VERSION_MISMATCH,
    CS_MAP_MISMATCH,
    CS_CONNECTED,
    CS_COUNT
};

const char *imex_state_name(int state);
int imex_state_from_name(const char *name); /* -1 when unknown */
const char *imex_conn_code(int cs);         /* "C", "!M!", ... */
const char *imex_conn_name(int cs);         /* "CONNECTED", "MAP_MISMATCH", ... */
char imex_conn_wire(int cs);                /* one character on the peer link */
int imex_conn_from_wire(char c);            /* -1 when unknown */

enum imex_quorum { QUORUM_NONE = 0, QUORUM_RECOVERY = 1 };

/* IMEX_AUTH_ENCRYPTION_MODE and IMEX_AUTH_SOURCE, in the order the config file spells them. */
enum imex_auth_mode { AUTH_SSL_TLS = 0, AUTH_GSS_AUTH_ENCRYPT = 1, AUTH_GSS_AUTH_ONLY = 2 };
enum imex_auth_source { AUTH_SOURCE_UNSET = -1, AUTH_SOURCE_FILE = 0, AUTH_SOURCE_ENV_PATH = 1,
                        AUTH_SOURCE_ENV_VAL = 2 };

/* The TLS material keys (IMEX_AUTH_SOURCE applies to all but the target override). */
enum imex_tls_key {
    TLS_SERVER_KEY = 0,
    TLS_SERVER_CERT,
    TLS_SERVER_CERT_AUTH,
    TLS_CLIENT_KEY,
    TLS_CLIENT_CERT,
    TLS_CLIENT_CERT_AUTH,
    TLS_TARGET_OVERRIDE,
    TLS_NKEYS
};
extern const char *const imex_tls_key_names[TLS_NKEYS]; /* "IMEX_SERVER_KEY", ... */

struct imex_config {
    int log_level;             /* LOG_LEVEL 0..5 */
    char *log_file_name;       /* LOG_FILE_NAME, "" = stderr */
    int log_append;            /* LOG_APPEND_TO_LOG */
    int daemonize;             /* DAEMONIZE */
    char bind_ip[INET_ADDRSTRLEN];     /* BIND_INTERFACE_IP, "" = pick from the nodes file */
    int server_port;           /* SERVER_PORT */
    char *node_config_file;    /* IMEX_NODE_CONFIG_FILE */
    int wait_for_quorum;       /* IMEX_WAIT_FOR_QUORUM */
    int cmd_enabled;           /* IMEX_CMD_ENABLED */
    char cmd_bind_ip[INET_ADDRSTRLEN]; /* IMEX_CMD_BIND_INTERFACE_IP, "" = the node's address */
    int cmd_port;              /* IMEX_CMD_PORT */
    char *cmd_unix_path;       /* IMEX_CMD_UNIX_DOMAIN_PATH, "" = none */
    int grace_time;            /* IMEX_NODE_DISCONNECTED_GRACE_TIME, -1 = never clean up */
    int auth_enabled;          /* IMEX_ENABLE_AUTH_ENCRYPTION */
    int auth_mode;             /* IMEX_AUTH_ENCRYPTION_MODE, enum imex_auth_mode */
    int auth_source;           /* IMEX_AUTH_SOURCE, enum imex_auth_source */
    char *tls[TLS_NKEYS];      /* the TLS keys' values as written, NULL = not set */
    /* Line of the last non-empty occurrence of a key (0 = never set), so that errors found after
     * parsing (a missing TLS key, an unreadable credential file) name a line like parse errors do. */
    int auth_line, auth_mode_line, auth_source_line;
    int tls_line[TLS_NKEYS];
    int unknown_keys;          /* how many keys were ignored */
};

void imex_config_defaults(struct imex_config *cfg);
/* Loads `path` over the defaults already in cfg. 0 on success; else -1 and a message
 * "<path>:<line>: <KEY>: ..." in err. */
int imex_config_load(const char *path, struct imex_config *cfg, char *err, size_t errlen);
/* Same, from a buffer (len bytes, may contain NULs); `name` is used in messages. */
int imex_config_parse(const char *name, const char *text, size_t len, struct imex_config *cfg, char *err,
                      size_t errlen);
void imex_config_free(struct imex_config *cfg);
/* With IMEX_ENABLE_AUTH_ENCRYPTION=1: the mode must be SSL_TLS, the six credential keys must be set
 * and the source must be FILE or ENV_PATH (empty = FILE). Checks the settings only, not the files.
 * 0 when fine (or auth is off); else -1 and "<name>:<line>: <KEY>: ..." in err. */
int imex_config_check_auth(const char *name, const struct imex_config *cfg, char *err, size_t errlen);

struct imex_node {
    char *name;          /* the line as written (address or hostname) */
    bool literal;        /* an IPv4 literal */
    bool resolved;       /* addr is valid */
    struct in_addr addr;
};

struct imex_node_map {
    struct imex_node *nodes;
    size_t n;
    uint64_t hash;       /* FNV-1a over the entries as written, in order */
};

int imex_nodes_load(const char *path, struct imex_node_map *map, char *err, size_t errlen);
int imex_nodes_parse(const char *name, const char *text, size_t len, struct imex_node_map *map, char *err,
                     size_t errlen);
/* Resolves the hostnames: $NVLFABRIC_SIM_HOSTS_FILE (hosts(5) format) when set, else getaddrinfo. */
void imex_nodes_resolve(struct imex_node_map *map);
void imex_nodes_free(struct imex_node_map *map);
int imex_nodes_find_addr(const struct imex_node_map *map, struct in_addr addr); /* index or -1 */

/* True when addr is exactly the address of a local interface (getifaddrs). */
bool imex_addr_on_interface(struct in_addr addr);

/* Utilities */
int64_t imex_now_ms(void);                                  /* CLOCK_MONOTONIC */
void imex_timestamp(char *buf, size_t len);                /* "M/D/YYYY HH:MM:SS.mmm", local time */
void imex_escape(char *dst, size_t dstlen, const char *src, size_t srclen); /* printable, truncated */
int imex_read_file(const char *path, char **out, size_t *len, char *err, size_t errlen);
int imex_parse_port(const char *s);                         /* 1..65535 or -1 */
const char *imex_version(void);                             /* $NVLFABRIC_SIM_IMEX_VERSION or default */

#endif
