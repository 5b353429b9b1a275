/* The keeper's file operations: paths, whole-file reads, atomic replacement of a file that leaves
 * an identical one alone, and directory removal that never follows a symbolic link. */
#ifndef KEEPER_FILES_H
#define KEEPER_FILES_H

#include <stdbool.h>
#include <stddef.h>

#include "util.h"

/* No repeated, trailing or "." components: the paths in a config file and in a daemon's command
 * line must be spelled the same by every keeper run, whatever its flags said. */
char *path_normalize(const char *p);
char *path_join(const char *base, const char *name);
bool is_dir(const char *path); /* following links */

/* The whole file into out (appended), or an errno. */
int read_file(const char *path, struct buf *out);
/* Replace the file atomically (a temporary ".<name>.<hex>.tmp" beside it, fsync, rename, fsync of
 * the directory), unless it holds exactly these bytes already: a daemon that reads it is then left
 * alone. *written says which. Creates the directory when missing. */
bool write_if_changed(const char *path, const char *data, size_t n, bool *written, struct err *e);
bool unlink_missing_ok(const char *path, struct err *e);
bool mkdir_parents(const char *path, struct err *e);
/* Removes what it can: the domain's files are the keeper's, what links point at is not. */
void remove_tree(const char *top);

#endif
