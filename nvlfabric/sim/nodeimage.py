"""nvlfabric's node image as the simulator runs it: this Python environment, and the IMEX keeper
built from the package's C source.

The image (deploy/Dockerfile) holds the package with its `node` extra, run as `python -m nvlfabric
agent|imex|controller`, and the keeper's program (nvlfabric/nodeagent/keeper/, built with make)
at /usr/local/bin. The simulator runs the image's ENTRYPOINT with its own Python and builds the
keeper the same way, into its build directory (`paths.build_dir()`, beside the stand-ins); the
image's ENV names that program (`NVLFABRIC_IMEX_KEEPER`), which `python -m nvlfabric imex` honours
before the PATH. The sources ship inside the package (package data), so an installed wheel builds
it too.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from nvlfabric.api import names
from nvlfabric.sim import paths

#: The keeper's C sources: a directory of the node agent's package, found by path (the simulator
#: imports nothing of the node agent; it runs it).
KEEPER_SOURCE = Path(__file__).resolve().parents[1] / "nodeagent" / "keeper"


class KeeperBuildFailed(RuntimeError):
    pass


def keeper_path(build_dir: Path | None = None) -> Path:
    """Where `build_keeper` puts the keeper's program."""
    return (build_dir or paths.build_dir()) / "keeper" / names.IMEX_KEEPER_BINARY


def build_keeper(build_dir: Path | None = None) -> Path:
    """Build the keeper (or confirm it is up to date: make rebuilds only on change); its path."""
    target = keeper_path(build_dir)
    res = subprocess.run(["make", "--no-print-directory", "-s", "-C", str(KEEPER_SOURCE), f"OUT={target.parent}"],
                         capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise KeeperBuildFailed(f"building the IMEX keeper failed (make -C {KEEPER_SOURCE}):\n{res.stderr[-2000:]}")
    return target


def image_env(build_dir: Path | None = None) -> dict[str, str]:
    """The node image's ENV as the simulator runs it: where its keeper program is."""
    return {names.IMEX_KEEPER_BINARY_ENV: str(keeper_path(build_dir))}
