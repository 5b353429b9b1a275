/* The keeper's log lines on stderr, in the format of every nvlfabric process's pod log
 * (nvlfabric/daemon/process.py), so that one collector reads them all: JSON
 * {"ts": ..., "level": ..., "logger": "nvlfabric.imexkeeper", "msg": ...} or the text
 * "LEVEL:nvlfabric.imexkeeper:message". */
#ifndef KEEPER_LOG_H
#define KEEPER_LOG_H

#include <stdbool.h>

enum log_level { LOG_INFO, LOG_WARNING, LOG_ERROR };

void log_setup(bool json);
void log_msg(enum log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
