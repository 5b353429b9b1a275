"""A local simulated cluster's lifecycle: `up` (the control plane, addons, simulated racks), status,
an API server outage, `down`. `ControlPlane` holds the settings and the order; the parts are
modules of their own: the state directory's record and lock (runstate.py), starting and waiting
for a process (launcher.py), etcd and the Kubernetes components (kubecontrol.py), the addons
(addons.py), the pod network (podnet.py), the simulated racks (simracks.py) and the nodes the real
kubelet runs (realkubelets.py).

`up` is idempotent: a second `up` while everything runs changes nothing. A failed `up` stops
whatever it had started, so a half-started control plane never stays behind.

State directory layout:
    controlplane.json   ports, admin token and the running processes (pid + start time)
    controlplane.lock   held (flock) while up/down run; removed by down
    kubeconfig          admin kubeconfig (token auth, CA embedded)
    kube-scheduler.yaml the scheduler's configuration, only when `scheduler_config` is set
    pki/                CA, serving cert, service-account key, token file
    etcd/               etcd data (removed by down: every up starts an empty cluster)
    logs/<name>.log     each component's output (kept after down, for post-mortems)
    pulumi/             the file:// Pulumi backend that `nvlfabric-sim env` points at
"""

from __future__ import annotations

import base64
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from nvlfabric.sim import pki, podnetwork, processes, realnode
from nvlfabric.sim.images import ImageProgram, default_images
from nvlfabric.sim.nodes import NODES_PER_RACK, SimNode, rack_nodes, runtime_root
from nvlfabric.sim.paths import Tools, load_tools
from nvlfabric.sim.processes import ProcessRecord
from nvlfabric.testbed import addons, kubecontrol, podnet, realkubelets, runstate, simracks
from nvlfabric.testbed.launcher import Launcher
from nvlfabric.testbed.runstate import ControlPlaneError, Ports, State, free_ports

# The names callers import from here (tests, bench, the CLI), wherever they are defined.
__all__ = ["ControlPlane", "ControlPlaneError", "Ports", "State", "free_ports"]

KUBELET_STOP_TIMEOUT_S = 30.0  # its own budget for stopping the local processes is 10 s
APISERVER_STOP_TIMEOUT_S = 2.0


@dataclass
class ControlPlane:
    """A local simulated cluster in `state_dir`: its settings, and `up` and `down` in order."""

    state_dir: Path
    ports: Ports = field(default_factory=Ports)
    progress: Callable[[str], None] = print
    racks: int = 0
    nodes_per_rack: int = NODES_PER_RACK
    first_rack: int = 0
    """Number of the first rack. Node names and loopback addresses (127.10.<rack>.<n>) derive from
    it, so two simulators on one machine (a demo and the test suite) need different ranges."""
    images: dict[str, ImageProgram] = field(default_factory=default_images)
    """Container images the simulated kubelets run as local processes (nvlfabric/sim/images.py)."""
    scheduler_config: dict[str, Any] = field(default_factory=dict)
    """KubeSchedulerConfiguration (v1) fields to set, e.g. `{"podMaxBackoffSeconds": 1,
    "clientConnection": {"qps": 500}}`; the scheduler then runs from a generated config file.
    Empty (the default): the scheduler's own defaults, as on a cluster nobody tuned."""
    extra_args: dict[str, list[str]] = field(default_factory=dict)
    """Extra command-line flags per component (`etcd`, `kube-apiserver`, `kube-scheduler`,
    `kube-controller-manager`), e.g. `{"kube-controller-manager": ["--kube-api-qps=100"]}`."""
    extra_env: dict[str, dict[str, str]] = field(default_factory=dict)
    """Extra environment per component, e.g. `{"kube-apiserver": {"GOGC": "400"}}` (a control
    plane with memory to spare and few cores: bench/scale.py)."""
    real_kubelets: int = 0
    """How many of the nodes (the last ones that are not hollow) the real kubelet runs, against
    nvlfabric's CRI stand-in (nvlfabric/sim/realnode.py); the simulated kubelet runs the others."""
    runtime: str = "standin"
    """The real-kubelet nodes' container runtime: "standin" (nvlfabric/sim/cri), or "containerd":
    containerd and runc (built by `make tools`) running the node image built from deploy/Dockerfile
    (testbed/nodeimages.py; needs a checkout, buildah and mmdebstrap, and the pod network)."""
    hollow_racks: int = 0
    """How many of the racks (the last ones) are hollow (nvlfabric/sim/kubelet/hollow.py): their
    nodes cost the simulated kubelet's bookkeeping only, no agent or keeper process. The others
    run everything, so a cluster of dozens of racks fits on one machine with real agents on some."""
    addons: tuple[str, ...] = ()
    """Controllers to run beside the control plane (nvlfabric/sim/addons.py: "jobset"), with their
    CRDs, RBAC and webhooks; none by default, so a plain `up` costs what it did."""
    pod_network: str = "namespaced"
    """"namespaced": a pod that is not hostNetwork gets a network namespace and an address of its
    own, as on a real node (nvlfabric/sim/podnetwork.py); "host": every pod shares its node's
    loopback address (the simulator before 0.2: software that assumes it, e.g. an old release's
    DaemonSets without hostNetwork)."""
    gpu_devices: str = "DevicePlugin"
    """"DevicePlugin": the nodes advertise their GPUs as nvidia.com/gpu, as NVIDIA's device plugin
    does; "DRA": they advertise none, and the agents publish the GPUs as DRA devices (the driver
    installed with gpu_devices "DRA"), which serve nvidia.com/gpu requests."""
    workload_scheduling: bool = False
    """Serve scheduling.k8s.io/v1alpha3 and turn on WORKLOAD_SCHEDULING_GATES in the API server,
    the scheduler and the controller manager alike, as a cluster that opted in would."""

    def nodes(self) -> list[SimNode]:
        return rack_nodes(self.state_dir, self.racks, self.nodes_per_rack, first_rack=self.first_rack,
                          hollow_racks=self.hollow_racks)

    def real_nodes(self) -> list[SimNode]:
        """The nodes the real kubelet runs: the last `real_kubelets` ones that are not hollow."""
        full = [n for n in self.nodes() if not n.hollow]
        return full[len(full) - self.real_kubelets:] if self.real_kubelets else []

    @property
    def state_file(self) -> Path:
        return self.state_dir / runstate.STATE_FILE

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def backend_dir(self) -> Path:
        return self.state_dir / "pulumi"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    # -- state and status ----------------------------------------------------------------------

    def load_state(self) -> State | None:
        return runstate.load(self.state_dir)

    def component_status(self) -> dict[str, bool]:
        return runstate.component_status(self.state_dir)

    def running(self) -> bool:
        return runstate.running(self.state_dir)

    def _launcher(self, state: State) -> Launcher:
        return Launcher(self.state_dir, state, self.progress, extra_args=self.extra_args, extra_env=self.extra_env)

    # -- up --------------------------------------------------------------------------------------

    def up(self) -> bool:
        """Start everything; returns False when it was already running (nothing changed)."""
        with runstate.locked(self.state_dir):
            state = self.load_state()
            if state is not None:
                if self.running():
                    self.ports = state.ports
                    self.racks, self.nodes_per_rack, self.first_rack = (state.racks, state.nodes_per_rack,
                                                                        state.first_rack)
                    self.workload_scheduling = state.workload_scheduling
                    self.real_kubelets = state.real_kubelets
                    self.runtime = state.runtime
                    self.hollow_racks = state.hollow_racks
                    self.addons = tuple(state.addons)
                    return False
                # Leftovers of a crash: stop what survives before starting afresh.
                self._stop_all(state)
            tools = load_tools()
            if self.real_kubelets:
                realkubelets.check(self.real_kubelets, len([n for n in self.nodes() if not n.hollow]), tools,
                                   runtime=self.runtime, pod_network=self.pod_network)
            runstate.check_free(self.ports)
            started = time.monotonic()
            net = podnet.claim(self.state_dir, self.pod_network, self.progress)
            if net is not None and self.real_kubelets and self.runtime == "containerd":
                net.route_api_service(self.ports.apiserver)
            token = pki.generate(self.state_dir / "pki",
                                 extra_ips=(net.gateway, net.api_service_ip) if net else ())
            self._write_kubeconfig(token)
            self.backend_dir.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(self.state_dir / "etcd", ignore_errors=True)
            state = State(ports=self.ports, token=token, processes=[], started_at=time.time(),
                          racks=self.racks, nodes_per_rack=self.nodes_per_rack, first_rack=self.first_rack,
                          workload_scheduling=self.workload_scheduling, real_kubelets=self.real_kubelets,
                          runtime=self.runtime, hollow_racks=self.hollow_racks, addons=list(self.addons),
                          pod_network=net.index if net else None)
            run = self._launcher(state)
            try:
                kubecontrol.start(run, tools, ports=self.ports, kubeconfig=self.kubeconfig,
                                  scheduler_config=self.scheduler_config, workload_scheduling=self.workload_scheduling)
                if net is not None:  # the pods' resolver, at the gateway they reach (sim/clusterdns.py)
                    run.launch("cluster-dns", [sys.executable, "-m", "nvlfabric.sim.clusterdns",
                                               "--kubeconfig", str(self.kubeconfig), "--listen", net.gateway])
                for name in self.addons:
                    addons.start(run, tools, name, kubeconfig=self.kubeconfig)
                state.ready_s = round(time.monotonic() - started, 2)
                self.progress(f"control plane ready in {state.ready_s:.1f}s at {self.server}")
                if self.racks:
                    self._start_nodes(run, tools)
                    state.nodes_ready_s = round(time.monotonic() - started, 2)
            except BaseException:
                self._stop_all(state)
                podnetwork.release(self.state_dir)
                self.state_file.unlink(missing_ok=True)
                raise
            runstate.save(self.state_dir, state)
            return True

    def _start_nodes(self, run: Launcher, tools: Tools) -> None:
        """Simulated GB200 racks: stand-ins in each node's driver root, then one process of
        simulated kubelets, and a machine with the real kubelet for each of `real_nodes()`."""
        nodes, real = self.nodes(), self.real_nodes()
        hollow = sorted({n.rack for n in nodes if n.hollow})
        self.progress(f"preparing {len(nodes)} simulated GB200 nodes ({self.racks} rack(s) of {self.nodes_per_rack}"
                      + (f"; racks {hollow[0]}..{hollow[-1]} hollow" if hollow else "") + ")")
        built = simracks.prepare(self.state_dir, nodes, self.progress)
        if len(real) < len(nodes):
            simracks.start_kubelets(run, kubeconfig=self.kubeconfig, racks=self.racks,
                                    nodes_per_rack=self.nodes_per_rack, first_rack=self.first_rack,
                                    hollow_racks=self.hollow_racks, images=self.images, exclude=real,
                                    gpus_by_dra=self.gpu_devices == "DRA")
        images = realkubelets.build_images(self.progress) if real and self.runtime == "containerd" else None
        for node, address in zip(real, realnode.node_addresses(len(real)), strict=True):
            realkubelets.start(run, tools, realnode.RealNode(node=node, address=address),
                               shim=built["nvlfabric-shim"], images=self.images,
                               gpus_by_dra=self.gpu_devices == "DRA", containerd_images=images)
        simracks.wait_ready(run, {n.name for n in nodes})

    def _write_kubeconfig(self, token: str) -> None:
        ca = (self.state_dir / "pki" / "ca.crt").read_bytes()
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "nvlfabric-sim",
            "clusters": [{"name": "nvlfabric-sim", "cluster": {
                "server": self.server, "certificate-authority-data": base64.b64encode(ca).decode()}}],
            "users": [{"name": pki.ADMIN_USER, "user": {"token": token}}],
            "contexts": [{"name": "nvlfabric-sim", "context": {
                "cluster": "nvlfabric-sim", "user": pki.ADMIN_USER, "namespace": "default"}}],
        }
        self.kubeconfig.write_text(yaml.safe_dump(config, sort_keys=False))
        self.kubeconfig.chmod(0o600)

    # -- an API server outage ----------------------------------------------------------------------

    def stop_apiserver(self) -> None:
        """Stop kube-apiserver alone, as an outage of it: etcd, the scheduler, the controller manager
        and the simulated kubelets keep running (and keep failing to reach it). `status` says
        STOPPED meanwhile, and an `up` would start a fresh cluster; `start_apiserver` brings it back."""
        with runstate.locked(self.state_dir):
            # It stops listening at once on SIGTERM, then can linger in its shutdown for the whole
            # 10 s `stop` grants (seen: quota evaluators): the outage has begun, so kill it sooner.
            processes.stop(self._apiserver(self._saved()), timeout=APISERVER_STOP_TIMEOUT_S)

    def start_apiserver(self) -> None:
        """Start the stopped kube-apiserver again with the argv it had: the same port, etcd and
        credentials, so every kubeconfig and resourceVersion stays valid; returns once /readyz is OK."""
        with runstate.locked(self.state_dir):
            state = self._saved()
            old = self._apiserver(state)
            if not processes.alive(old):
                self.progress("starting kube-apiserver")
                new = processes.spawn(old.name, old.argv, Path(old.log))
                # Same place in the list: `down` stops the processes in reverse start order.
                state.processes[state.processes.index(old)] = new
                runstate.save(self.state_dir, state)
            run = self._launcher(state)
            run.wait("kube-apiserver /readyz", lambda: run.admin.ok("/readyz"))

    def _saved(self) -> State:
        state = self.load_state()
        if state is None:
            raise ControlPlaneError(f"nvlfabric-sim is not running (state dir {self.state_dir})")
        self.ports = state.ports
        return state

    @staticmethod
    def _apiserver(state: State) -> ProcessRecord:
        return next(r for r in state.processes if r.name == "kube-apiserver")

    # -- down ------------------------------------------------------------------------------------

    def _stop_all(self, state: State) -> None:
        for rec in reversed(state.processes):
            if processes.alive(rec):
                self.progress(f"stopping {rec.name} (pid {rec.pid})")
            # The kubelet stops the processes it runs (node agents, which stop their IMEX daemons)
            # first; killed before that, it would leave them running.
            # A machine's first process goes last and at once (SIGKILL: unshare ignores SIGTERM),
            # taking what is left in its PID namespace with it.
            timeout = (KUBELET_STOP_TIMEOUT_S if rec.name == "sim-kubelet" or rec.name.startswith("kubelet-")
                       else 0.0 if rec.name.startswith("machine-") else 10.0)
            processes.stop(rec, timeout=timeout)

    def down(self) -> bool:
        """Stop everything; returns False when nothing was running."""
        with runstate.locked(self.state_dir):
            state = self.load_state()
            was_running = state is not None and any(processes.alive(r) for r in state.processes)
            if state is not None:
                self._stop_all(state)
            podnetwork.release(self.state_dir)
            self.state_file.unlink(missing_ok=True)
            shutil.rmtree(self.state_dir / "etcd", ignore_errors=True)
            shutil.rmtree(runtime_root(self.state_dir), ignore_errors=True)
        (self.state_dir / runstate.LOCK_FILE).unlink(missing_ok=True)
        return was_running
