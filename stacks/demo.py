"""`make demo` / `make demo-down`: the dev stack on the local simulator, end to end.

    up:   simulator with 2 GB200 NVL72 racks → `pulumi up` of the dev stack (root Pulumi.yaml,
          program in stacks/dev: driver, racks, 3 ComputeDomains, 3 Jobs bound to them) → wait
          until every ComputeDomain is Ready and every pod runs → a rack map: per node, which
          domain(s) and IMEX channel(s) its pods got (from the simulated runtime's recorded
          container edits), with timings
    down: `pulumi destroy` of the dev stack (its config is kept) → simulator down
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from lightkube import Client
from lightkube.config.kubeconfig import KubeConfig
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.resource_v1 import DeviceClass

from nvlfabric.api.names import CLIQUE_GROUP_ANNOTATION, SPARES_LABEL, WORKLOAD_LABEL
from nvlfabric.controller.cache import ComputeDomainResource
from nvlfabric.sim import addons
from nvlfabric.sim.environment import simulator_env
from nvlfabric.sim.paths import REPO, ToolsMissing, default_state_dir, load_tools
from nvlfabric.testbed.controlplane import ControlPlane, ControlPlaneError

STACK = "dev"
RACKS = 2  # stacks/dev/Pulumi.dev.yaml says the same (nvlfabric-dev:racks)
WAIT_S = 300.0
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
    cp.racks = RACKS  # an already running simulator keeps its own racks
    t0 = time.monotonic()
    fresh = cp.up()
    sim_s = time.monotonic() - t0
    env = environment(cp)
    exists = pulumi(env, "stack", "select", STACK, check=False).returncode == 0
    if exists and fresh:
        # A simulator started afresh is an empty cluster (its etcd is new): a stack left from an
        # earlier one describes objects that are gone, and its update would fail on them ("not
        # found"). Its config stays; its state goes.
        print(f"demo: the simulator started afresh: dropping the state of stack {STACK} from the earlier one")
        pulumi(env, "stack", "rm", "--force", "--yes", "--preserve-config", STACK)
        exists = False
    if not exists:
        pulumi(env, "stack", "init", STACK)
    t1 = time.monotonic()
    pulumi(env, "up", "--yes", "--skip-preview", "--stack", STACK)
    up_s = time.monotonic() - t1
    outputs = json.loads(pulumi(env, "stack", "output", "--json", "--stack", STACK).stdout)
    client = Client(config=KubeConfig.from_file(str(cp.kubeconfig)))
    t2 = time.monotonic()
    domains, pods = wait_running(client, outputs)
    ready_s = time.monotonic() - t2
    print()
    print(f"cluster       {cp.server}  (kubeconfig {cp.kubeconfig})")
    print(f"stack outputs {json.dumps(outputs)}")
    for dc in client.list(DeviceClass):
        assert dc.metadata is not None and dc.spec is not None
        selectors = [s.cel.expression for s in dc.spec.selectors or [] if s.cel]
        print(f"DeviceClass   {dc.metadata.name}: {' && '.join(selectors)}")
    print()
    print(f"{'ComputeDomain':14} {'phase':6} {'clique':48} {'channel':>7} {'nodes':>5}")
    for name, st in sorted(domains.items()):
        print(f"{name:14} {st.get('phase', ''):6} {st.get('clique') or '-':48} {st.get('channel') or '-':>7} "
              f"{st.get('readyNodes', 0)}/{st.get('totalNodes', 0)}")
        for g in st.get("groups") or []:  # a MultiClique domain: a clique and a channel per group
            print(f"  group {g['index']:<6} {'':6} {g.get('clique') or '-':48} {g.get('channel') or '-':>7} "
                  f"{g.get('readyNodes', 0)}/{len(g.get('nodes') or [])}")
    print()
    print_rack_map(cp, pods, spares_by_node(client))
    print(f"\ntimings       simulator up {sim_s:.1f}s, pulumi up {up_s:.1f}s, "
          f"domains Ready + pods Running {ready_s:.1f}s after, total {time.monotonic() - _start:.1f}s")
    sim_dir = "" if cp.state_dir == default_state_dir().resolve() else f"NVLFABRIC_SIM_DIR={cp.state_dir} "
    print(f'\nexplore:      eval "$({sim_dir}.venv/bin/nvlfabric-sim env)"; pulumi stack; make demo-down')


def wait_running(client: Client, outputs: dict[str, Any]) -> tuple[dict[str, dict[str, Any]], list[Pod]]:
    """Every ComputeDomain of the stack Ready (controller status) and every pod of its Jobs Running."""
    names = sorted(outputs.get("compute_domains") or {})
    jobs = sorted((outputs.get("jobs") or {}).values())
    say(f"waiting for ComputeDomains {', '.join(names)} to be Ready and the pods of {', '.join(jobs)} to run")
    deadline = time.monotonic() + WAIT_S
    last = ""
    while True:
        domains: dict[str, dict[str, Any]] = {n: _status(client, n) for n in names}
        # By workload (a job over several cliques is a Job per clique group).
        pods = [p for j in jobs for p in client.list(Pod, namespace="default", labels={WORKLOAD_LABEL: j})]
        running = [p for p in pods if p.status is not None and p.status.phase == "Running"]
        ready = [n for n, st in domains.items() if st.get("phase") == "Ready"]
        line = f"{len(ready)}/{len(names)} ComputeDomains Ready, {len(running)}/{len(pods)} pods Running"
        if line != last:
            say(line)
            last = line
        if len(ready) == len(names) and pods and len(running) == len(pods):
            return domains, running
        if time.monotonic() > deadline:
            raise SystemExit(f"demo: not there after {WAIT_S:.0f}s: {line}; see `kubectl get pods,computedomains`")
        time.sleep(1)


def _status(client: Client, name: str) -> dict[str, Any]:
    status = client.get(ComputeDomainResource, name, namespace="default").status
    return dict(status) if isinstance(status, dict) else {}


def spares_by_node(client: Client) -> dict[str, int]:
    """Node → the spares its rack keeps (its nvlfabric.io/spares label), for the Nodes that have one."""
    out = {}
    for node in client.list(Node, labels={SPARES_LABEL: None}):
        value = ((node.metadata.labels or {}) if node.metadata else {}).get(SPARES_LABEL, "")
        if node.metadata and node.metadata.name and value.isdigit():
            out[node.metadata.name] = int(value)
    return out


def print_rack_map(cp: ControlPlane, pods: list[Pod], spares: dict[str, int] | None = None) -> None:
    """Per node: the pods placed there and the ComputeDomain and IMEX channel each one got, as the
    simulated container runtime recorded them (the env and device nodes the CDI edits injected).
    `spares`: node → its rack's spares (nvlfabric.io/spares), said per rack as the controller reads
    a clique's (the largest over its nodes)."""
    by_node: dict[str, list[str]] = {}
    gpus_used: dict[str, int] = {}
    for pod in pods:
        assert pod.metadata is not None and pod.spec is not None
        node = pod.spec.nodeName or "?"
        gpus = sum(int(((c.resources.limits or {}) if c.resources else {}).get("nvidia.com/gpu", 0))
                   for c in pod.spec.containers)
        gpus_used[node] = gpus_used.get(node, 0) + gpus
        for c in pod.spec.containers:
            path = cp.state_dir / "nodes" / node / "containers" / f"default_{pod.metadata.name}_{c.name}.json"
            try:
                rec = json.loads(path.read_text())
            except FileNotFoundError:
                by_node.setdefault(node, []).append(f"{pod.metadata.name} (no edits recorded)")
                continue
            env = dict(e.split("=", 1) for e in rec.get("env") or [])
            devs = ",".join(d["path"].rsplit("/", 1)[1] for d in rec.get("deviceNodes") or [])
            group = (pod.metadata.annotations or {}).get(CLIQUE_GROUP_ANNOTATION)
            domain = env.get("NVLFABRIC_COMPUTE_DOMAIN", "?") + (f"/g{group}" if group is not None else "")
            by_node.setdefault(node, []).append(f"{domain}:{devs or 'no channel'} ({gpus} GPU)")
    print("rack map (per node: GPUs in use of 4, and each pod's ComputeDomain:IMEX channel device and GPUs, from\n"
          "the recorded container edits)")
    racks: dict[int, list[Any]] = {}
    for n in cp.nodes():
        racks.setdefault(n.rack, []).append(n)
    for rack, nodes in sorted(racks.items()):
        used = [n for n in nodes if n.name in by_node]
        kept = max(((spares or {}).get(n.name, 0) for n in nodes), default=0)
        kept_text = f" ({kept} spare{'' if kept == 1 else 's'})" if kept else ""
        print(f"  rack-{rack}{kept_text}: {len(used)}/{len(nodes)} nodes in use")
        for n in used:
            print(f"    {n.name}  {gpus_used.get(n.name, 0)}/4 GPUs  {'  '.join(sorted(by_node[n.name]))}")


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
    ap.add_argument("--addons", default="", help="controllers the simulator runs too (nvlfabric-sim up --addons); "
                                                 "with jobset, stacks/dev declares a JobSet-bound job")
    args = ap.parse_args(argv)
    state_dir = (args.state_dir or default_state_dir()).resolve()
    cp = ControlPlane(state_dir=state_dir, progress=say)
    saved = cp.load_state()
    if saved is not None:
        cp.ports = saved.ports
    try:
        cp.addons = addons.parse(args.addons)
        up(cp) if args.action == "up" else down(cp)
    except (ControlPlaneError, ToolsMissing, ValueError) as exc:
        print(f"demo {args.action}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
