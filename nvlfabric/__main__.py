"""`python -m nvlfabric agent|imex|controller ...`: the node image's one entry point.

The agent's DaemonSet runs `agent`, the IMEX keeper's DaemonSet `imex` (which replaces this process
with the keeper's C program, nvlfabric/nodeagent/keeper), the controller's Deployment
`controller` (same image); everything after the word goes to that process's own settings
(`python -m nvlfabric agent --help`).
"""

from __future__ import annotations

import sys

USAGE = "usage: python -m nvlfabric {agent,imex,controller} [options]"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] not in ("agent", "imex", "controller"):
        print(f"{USAGE}\n(got {args[0]!r})" if args else USAGE, file=sys.stderr)
        return 2
    # Imported on demand: each process loads only its own room (the agent's 60 MB budget).
    if args[0] == "agent":
        from nvlfabric.nodeagent.__main__ import main as run
    elif args[0] == "imex":
        from nvlfabric.nodeagent.imexkeeper import main as run
    else:
        from nvlfabric.controller.__main__ import main as run
    return run(args[1:])


if __name__ == "__main__":
    sys.exit(main())
