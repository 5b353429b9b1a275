"""`nvlfabric-sim`: bring the local simulator up and down, show its status, prepare a shell.

    nvlfabric-sim up        start etcd, kube-apiserver, kube-scheduler, kube-controller-manager
    nvlfabric-sim status    what runs (exit 0 when everything does, 3 otherwise)
    nvlfabric-sim env       shell exports: eval "$(nvlfabric-sim env)"
    nvlfabric-sim down      stop everything it started
    nvlfabric-sim apiserver stop|start   an API server outage: kube-apiserver alone stops, then
                            comes back on the same port and etcd
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from nvlfabric.sim import addons, images
from nvlfabric.sim.environment import simulator_env
from nvlfabric.sim.faults import FAULTS, find_node, inject
from nvlfabric.sim.hardware import StandinsMissing
from nvlfabric.sim.nodes import NODES_PER_RACK, rack_nodes
from nvlfabric.sim.paths import ToolsMissing, default_state_dir, load_tools
from nvlfabric.testbed.controlplane import ControlPlane, ControlPlaneError, Ports


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="nvlfabric-sim", description="The local nvlfabric simulator.")
    ap.add_argument("--state-dir", type=Path, default=None,
                    help="where all simulator state lives (default: $NVLFABRIC_SIM_DIR, else "
                         "$XDG_STATE_HOME/nvlfabric/sim)")
    sub = ap.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the control plane (does nothing if it already runs)")
    defaults = Ports()
    up.add_argument("--apiserver-port", type=int, default=defaults.apiserver)
    up.add_argument("--etcd-port", type=int, default=defaults.etcd_client)
    up.add_argument("--etcd-peer-port", type=int, default=defaults.etcd_peer)
    up.add_argument("--scheduler-port", type=int, default=defaults.scheduler)
    up.add_argument("--racks", type=int, default=0,
                    help="simulated GB200 NVL72 racks to bring up (0: control plane only)")
    up.add_argument("--nodes-per-rack", type=int, default=NODES_PER_RACK,
                    help=f"nodes (compute trays) per rack, at most {NODES_PER_RACK}")
    up.add_argument("--first-rack", type=int, default=0,
                    help="number of the first rack: names and 127.10.<rack>.x addresses start there, so two "
                         "simulators on one machine do not collide")
    up.add_argument("--images", type=Path, default=None, metavar="FILE",
                    help="YAML mapping container images (no tag) to local programs the simulated nodes run: "
                         "{images: {<image>: [entrypoint...] | {entrypoint: [...], cmd: [...], files: {<image "
                         "path>: <path here>}}}}; a container's "
                         "command and args apply as Kubernetes applies them (see nvlfabric/sim/images.py)")
    up.add_argument("--real-kubelets", type=int, default=0, metavar="N",
                    help="run the last N nodes with the real kubelet (built by `make tools`) against nvlfabric's "
                         "CRI runtime stand-in instead of the simulated kubelet; each needs a non-loopback "
                         "address of this machine (see nvlfabric/sim/realnode.py)")
    up.add_argument("--runtime", choices=["standin", "containerd"], default="standin",
                    help="the real-kubelet nodes' container runtime: standin (default; nvlfabric's CRI stand-in) or "
                         "containerd (containerd and runc built by `make tools`, running the node image built "
                         "from deploy/Dockerfile with buildah: needs a checkout, `make sysdeps` and the "
                         "namespaced pod network; see nvlfabric/sim/containerdnode.py)")
    up.add_argument("--hollow-racks", type=int, default=0, metavar="N",
                    help="make the last N racks hollow: their nodes run no agent or IMEX keeper process, an "
                         "in-process stand-in writes what the agent would (fleet-size clusters on one machine; "
                         "see nvlfabric/sim/kubelet/hollow.py)")
    up.add_argument("--addons", default="", metavar="LIST",
                    help="comma-separated controllers to run beside the control plane, with their CRDs, RBAC and "
                         "webhooks, built by `make tools` from their Go modules: jobset (logs in the state dir's "
                         "logs/<addon>.log; see nvlfabric/sim/addons.py)")
    up.add_argument("--workload-scheduling", action="store_true",
                    help="serve scheduling.k8s.io/v1alpha3 with Kubernetes 1.37's workload-scheduling gates on "
                         "(gang pod groups, a topology constraint, pod-group claims), as an opted-in cluster would")
    up.add_argument("--pod-network", choices=["namespaced", "host"], default="namespaced",
                    help="namespaced (default): each pod that is not hostNetwork gets a network namespace and an "
                         "address of its own on a bridge, as on a real node, so pods of one machine may share a "
                         "port; host: every pod shares its node's loopback address (see docs/other-drivers.md)")
    sub.add_parser("down", help="stop everything the simulator started")
    sub.add_parser("status", help="show what runs")
    sub.add_parser("env", help="print shell exports for kubectl/pulumi against the simulator")
    apiserver = sub.add_parser("apiserver", help="stop kube-apiserver alone (an outage), or start it again")
    apiserver.add_argument("action", choices=["stop", "start"])
    fault = sub.add_parser("fault", help="inject a fault into a running simulator (see nvlfabric/sim/faults.py)")
    fault.add_argument("fault", choices=FAULTS)
    fault.add_argument("node", help="simulated node name, e.g. rack-0-node-03")
    fault.add_argument("--gpu", type=int, action="append", help="GPU index (repeatable); default all GPUs")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    state_dir: Path = (args.state_dir or default_state_dir()).resolve()
    start = time.monotonic()

    def progress(msg: str) -> None:
        print(f"[{time.monotonic() - start:5.1f}s] {msg}", file=sys.stderr, flush=True)

    cp = ControlPlane(state_dir=state_dir, progress=progress)
    saved = cp.load_state()
    if saved is not None and args.command != "up":
        cp.ports = saved.ports
    try:
        if args.command == "up":
            cp.ports = Ports(etcd_client=args.etcd_port, etcd_peer=args.etcd_peer_port,
                             apiserver=args.apiserver_port, scheduler=args.scheduler_port)
            if args.racks:
                rack_nodes(state_dir, args.racks, args.nodes_per_rack, first_rack=args.first_rack,
                           hollow_racks=args.hollow_racks)  # validates
            cp.racks, cp.nodes_per_rack, cp.first_rack = args.racks, args.nodes_per_rack, args.first_rack
            cp.workload_scheduling = args.workload_scheduling
            cp.real_kubelets = args.real_kubelets
            cp.runtime = args.runtime
            cp.hollow_racks = args.hollow_racks
            cp.pod_network = args.pod_network
            try:
                cp.addons = addons.parse(args.addons)
            except ValueError as exc:
                print(f"nvlfabric-sim: --addons: {exc}", file=sys.stderr)
                return 2
            if args.images is not None:
                cp.images = images.load(args.images)
            if not cp.up():
                print(f"nvlfabric-sim is already running at {cp.server} (state in {state_dir}); nothing changed")
            return 0
        if args.command == "down":
            if cp.down():
                print("nvlfabric-sim stopped")
            else:
                print("nvlfabric-sim was not running")
            return 0
        if args.command == "status":
            return _status(cp)
        if args.command == "env":
            print(_env(cp))
            return 0
        if args.command == "apiserver":
            if args.action == "stop":
                cp.stop_apiserver()
            else:
                cp.start_apiserver()
            return 0
        if args.command == "fault":
            if saved is None or not cp.running():
                raise ControlPlaneError(f"nvlfabric-sim is not running (state dir {state_dir})")
            node = find_node(state_dir, saved.racks, saved.nodes_per_rack, args.node, first_rack=saved.first_rack)
            print(inject(state_dir, node, args.fault, args.gpu))
            return 0
    except (ControlPlaneError, ToolsMissing, StandinsMissing, ValueError) as exc:  # FaultError too
        print(f"nvlfabric-sim {args.command}: {exc}", file=sys.stderr)
        return 1
    return 2


def _status(cp: ControlPlane) -> int:
    status = cp.component_status()
    if not status:
        print(f"nvlfabric-sim: not running (state dir {cp.state_dir})")
        return 3
    state = cp.load_state()
    assert state is not None
    for rec in state.processes:
        print(f"{rec.name:26} {'running' if status[rec.name] else 'STOPPED':8} pid {rec.pid}")
    print(f"apiserver {cp.server}  kubeconfig {cp.kubeconfig}")
    return 0 if all(status.values()) else 3


def _env(cp: ControlPlane) -> str:
    exports = simulator_env(tools=load_tools(), kubeconfig=cp.kubeconfig, backend_dir=cp.backend_dir)
    return "\n".join(f"export {k}={shlex.quote(v)}" for k, v in exports.items())


if __name__ == "__main__":
    sys.exit(main())
