"""Atomic file replacement for the agent's own files (CDI specs, IMEX config and nodes files),
and the removal of a directory of them.

Temp file `.<name>.<random>.tmp` in the same directory, fsync, chmod, rename over the target,
fsync the directory: a reader (the container runtime, the IMEX daemon) sees the old file or the
new one, never half of one, and a crash leaves at most a temp file that start-up removes.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def _create_temp(path: Path) -> tuple[int, str]:
    """A new owner-only temp file beside `path` (what `tempfile.mkstemp` does, without importing
    tempfile: with shutil, random and the compressors it costs the IMEX keeper, a process on
    every node, 0.8 MB; docs/architecture.md "Scale")."""
    while True:
        tmp = str(path.parent / f".{path.name}.{os.urandom(6).hex()}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600), tmp
        except FileExistsError:
            continue


def atomic_write(path: Path, data: bytes, mode: int = 0o644) -> None:
    fd, tmp = _create_temp(path)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def remove_tree(top: Path) -> None:
    """Remove a directory and everything in it, as far as it can (`shutil.rmtree` with ignore_errors,
    without importing shutil: 0.5 MB of the IMEX keeper, a process on every node). Symbolic links
    are removed, never followed."""
    for root, dirs, names in os.walk(top, topdown=False):
        for entry in names:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(root, entry))
        for entry in dirs:
            where = os.path.join(root, entry)
            with contextlib.suppress(OSError):
                if os.path.islink(where):
                    os.unlink(where)
                else:
                    os.rmdir(where)
    with contextlib.suppress(OSError):
        os.rmdir(top)
