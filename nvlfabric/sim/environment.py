"""The environment that points kubectl, Pulumi and our tools at the simulator, offline.

`nvlfabric-sim env` prints it as shell exports; tests and the demo pass it to subprocesses.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from nvlfabric.sim.paths import Tools

# A fixed passphrase is fine for a throwaway local backend; real stacks bring their own.
DEV_PASSPHRASE = "nvlfabric-dev"


def simulator_env(*, tools: Tools, kubeconfig: Path, backend_dir: Path, base_path: str | None = None) -> dict[str, str]:
    """Variables to add to an environment (values only; the caller merges them)."""
    venv_bin = Path(sys.executable).parent
    path = base_path if base_path is not None else os.environ.get("PATH", "")
    return {
        "KUBECONFIG": str(kubeconfig),
        # Built tools first, then the project's Python (the dynamic-provider shim runs python3).
        "PATH": os.pathsep.join([str(tools.bin_dir), str(venv_bin), path]),
        "PULUMI_HOME": str(tools.pulumi_home),
        "PULUMI_BACKEND_URL": f"file://{backend_dir}",
        "PULUMI_CONFIG_PASSPHRASE": DEV_PASSPHRASE,
        # Offline: never download plugins, never ask for updates, never consult the registry,
        # and take plugins only from the build (bundled beside the CLI) and PULUMI_HOME.
        "PULUMI_SKIP_UPDATE_CHECK": "true",
        "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
        "PULUMI_IGNORE_AMBIENT_PLUGINS": "true",
        "PULUMI_DISABLE_REGISTRY_RESOLVE": "true",
        "PULUMI_DIY_BACKEND_NO_LEGACY_WARNING": "true",
    }
