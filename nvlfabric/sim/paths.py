"""Where the simulator keeps its state and finds the tools `make tools` built.

State lives in one directory: `--state-dir`, else `$NVLFABRIC_SIM_DIR`, else the user's state dir
(`$XDG_STATE_HOME/nvlfabric/sim`, i.e. `~/.local/state/nvlfabric/sim`). The tools are found
through the manifest tools/build.py writes (`build/tools.json` in the checkout, or
`$NVLFABRIC_TOOLS_MANIFEST`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
"""Where the `nvlfabric` package sits: a checkout's root when run from one (its `build/` holds the
tool manifest `make tools` writes), a site-packages directory when installed from the wheel."""


def build_dir() -> Path:
    """Where the simulator builds its C stand-ins: the checkout's `build/`, else the user's cache."""
    if (REPO / "pyproject.toml").is_file():
        return REPO / "build"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "nvlfabric" / "sim-build"


def default_state_dir() -> Path:
    if env := os.environ.get("NVLFABRIC_SIM_DIR"):
        return Path(env)
    xdg = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(xdg) / "nvlfabric" / "sim"


class ToolsMissing(RuntimeError):
    """The Go-built tools are not there yet."""


@dataclass(frozen=True)
class Tools:
    bin_dir: Path
    pulumi_home: Path
    versions: dict[str, str]
    cni_dir: Path | None = None
    """The CNI plugins (bridge, host-local, loopback, portmap): a directory of their own, not bin_dir."""

    def binary(self, name: str) -> Path:
        path = self.bin_dir / name
        if not path.exists():
            raise ToolsMissing(f"{path} is missing; run `make tools` to build it")
        return path


def load_tools() -> Tools:
    manifest = Path(os.environ.get("NVLFABRIC_TOOLS_MANIFEST") or REPO / "build" / "tools.json")
    try:
        data = json.loads(manifest.read_text())
    except FileNotFoundError:
        raise ToolsMissing(f"no tool manifest at {manifest}; run `make tools` in an nvlfabric checkout first, "
                           "or point $NVLFABRIC_TOOLS_MANIFEST at its build/tools.json") from None
    except ValueError as exc:
        raise ToolsMissing(f"tool manifest {manifest} is not valid JSON ({exc}); run `make tools` again") from None
    return Tools(bin_dir=Path(data["bin_dir"]), pulumi_home=Path(data["pulumi_home"]),
                 versions=dict(data["versions"]), cni_dir=Path(data["cni_dir"]) if data.get("cni_dir") else None)
