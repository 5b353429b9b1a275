"""`make demo` / `make demo-down`: the dev stack on the local simulator, end to end.

    up:   simulator up → `pulumi up` of the dev stack (root Pulumi.yaml, program in stacks/dev)
          → what the cluster now holds, with timings
    down: `pulumi destroy` of the dev stack → simulator down
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from lightkube import Client
from lightkube.config.kubeconfig import KubeConfig
from lightkube.resources.core_v1 import Namespace
from lightkube.resources.resource_v1 import DeviceClass

from sim.controlplane import ControlPlane, ControlPlaneError
from sim.environment import simulator_env
from sim.paths import REPO, ToolsMissing, default_state_dir, load_tools

STACK = "dev"
_start = time.monotonic()


def say(msg: str) -> None:
    print(f"[demo {time.monotonic() - _start:5.1f}s] {msg}", flush=True)


def pulumi(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    say("pulumi " + " ".join(args))
    proc = subprocess.run(["pulumi", *args], cwd=REPO, env=env, text=True,
                          stdout=subprocess.PIPE if "--json" in args else None)
    if check and proc.returncode != 0:
        raise SystemExit(f"demo: `pulumi {' '.join(args)}` failed (exit {proc.returncode}); see the output above")
    return proc


def environment(cp: ControlPlane) -> dict[str, str]:
    env = dict(os.environ)
    env.update(simulator_env(tools=load_tools(), kubeconfig=cp.kubeconfig, backend_dir=cp.backend_dir))
    return env


def up(cp: ControlPlane) -> None:
    t0 = time.monotonic()
    cp.up()
    sim_s = time.monotonic() - t0
    env = environment(cp)
    if pulumi(env, "stack", "select", STACK, check=False).returncode != 0:
        pulumi(env, "stack", "init", STACK)
    t1 = time.monotonic()
    pulumi(env, "up", "--yes", "--skip-preview", "--stack", STACK)
    up_s = time.monotonic() - t1
    outputs = json.loads(pulumi(env, "stack", "output", "--json", "--stack", STACK).stdout)
    client = Client(config=KubeConfig.from_file(str(cp.kubeconfig)))
    print()
    print(f"cluster       {cp.server}  (kubeconfig {cp.kubeconfig})")
    print(f"stack outputs {json.dumps(outputs)}")
    for dc in client.list(DeviceClass):
        assert dc.metadata is not None and dc.spec is not None
        selectors = [s.cel.expression for s in dc.spec.selectors or [] if s.cel]
        print(f"DeviceClass   {dc.metadata.name}: {' && '.join(selectors)}")
    for ns in client.list(Namespace, labels={"app.kubernetes.io/part-of": "nvlfabric"}):
        assert ns.metadata is not None and ns.status is not None
        print(f"Namespace     {ns.metadata.name} ({ns.status.phase})")
    print(f"timings       simulator up {sim_s:.1f}s, pulumi up {up_s:.1f}s, total {time.monotonic() - _start:.1f}s")
    print('\nexplore:      eval "$(.venv/bin/nvlfabric-sim env)"; pulumi stack; make demo-down')


def down(cp: ControlPlane) -> None:
    if cp.running():
        env = environment(cp)
        if pulumi(env, "stack", "select", STACK, check=False).returncode == 0:
            pulumi(env, "destroy", "--yes", "--skip-preview", "--stack", STACK)
            pulumi(env, "stack", "rm", "--yes", "--preserve-config", STACK)
    cp.down()
    say("simulator stopped")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("action", choices=["up", "down"])
    ap.add_argument("--state-dir", type=Path, default=None)
    args = ap.parse_args(argv)
    cp = ControlPlane(state_dir=(args.state_dir or default_state_dir()).resolve(), progress=say)
    saved = cp.load_state()
    if saved is not None:
        cp.ports = saved.ports
    try:
        up(cp) if args.action == "up" else down(cp)
    except (ControlPlaneError, ToolsMissing) as exc:
        print(f"demo {args.action}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
