"""`python -m nvlfabric agent`: the node agent (the DaemonSet's container).

Reads and checks the settings (settings.py: every flag has an environment-variable twin, which
the DaemonSet sets, some from the downward API), sets up logging and runs the agent (agent.py)
until SIGTERM. A bad setting is one line and exit code 2.
"""

from __future__ import annotations

import sys

from nvlfabric.daemon import process
from nvlfabric.nodeagent import agent, settings


def main(argv: list[str] | None = None) -> int:
    try:
        cfg = settings.parse(sys.argv[1:] if argv is None else argv)
        settings.check_paths(cfg)
    except process.SettingsError as exc:
        print(f"nvlfabric agent: {exc}", file=sys.stderr)
        return 2
    process.setup_logging(cfg.log_format)
    return agent.run(cfg=cfg, stop=process.stop_on_signals())


if __name__ == "__main__":
    sys.exit(main())
