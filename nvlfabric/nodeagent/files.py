"""Atomic file replacement for the agent's own files (CDI specs, IMEX config and nodes files).

Temp file `.<name>.<random>.tmp` in the same directory, fsync, chmod, rename over the target,
fsync the directory: a reader (the container runtime, the IMEX daemon) sees the old file or the
new one, never half of one, and a crash leaves at most a temp file that start-up removes.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def atomic_write(path: Path, data: bytes, mode: int = 0o644) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
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
