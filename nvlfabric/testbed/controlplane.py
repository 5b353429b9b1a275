"""The local Kubernetes control plane: etcd, kube-apiserver, kube-scheduler, kube-controller-manager.

All four are the real binaries `make tools` builds from Go modules, run on loopback with generated
certificates (see pki.py). `up` is idempotent: a second `up` while everything runs changes nothing.
A failed `up` stops whatever it had started, so a half-started control plane never stays behind.

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
import contextlib
import fcntl
import functools
import json
import os
import shutil
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from nvlfabric.sim import addons, hardware, nodeimage, pki, podnetwork, processes, realnode
from nvlfabric.sim.images import ImageProgram, default_images
from nvlfabric.sim.kubelet import rootfs
from nvlfabric.sim.nodes import GPUS_PER_NODE, NODES_PER_RACK, SimNode, rack_nodes, runtime_root
from nvlfabric.sim.paths import Tools, load_tools
from nvlfabric.sim.processes import ProcessRecord

START_TIMEOUT_S = 90.0  # contended 2-core CI machines take 30 s+ for RBAC bootstrap alone
POLL_INTERVAL_S = 0.2
KUBELET_STOP_TIMEOUT_S = 30.0  # its own budget for stopping the local processes is 10 s
APISERVER_STOP_TIMEOUT_S = 2.0
#: Kubernetes 1.37's workload-aware scheduling, off by default there (alpha and beta): Workload,
#: PodGroup and CompositePodGroup objects, gang policy, a topology constraint per pod group and
#: claims reserved for a whole pod group (../shared/reference: k8s-workload-scheduling.md).
WORKLOAD_SCHEDULING_GATES = ("GenericWorkload", "DRAWorkloadResourceClaims", "TopologyAwareWorkloadScheduling",
                             "CompositePodGroup")
#: The versions served: 1.37's scheduler watches v1beta1 (the issue and the reference name v1alpha3,
#: which 1.37 serves too, with the same fields).
WORKLOAD_SCHEDULING_APIS = ("scheduling.k8s.io/v1beta1", "scheduling.k8s.io/v1alpha3")


class Ports(BaseModel):
    """Loopback ports; the defaults sit away from a real cluster's (2379, 6443, 10259)."""

    etcd_client: int = 23790
    etcd_peer: int = 23800
    apiserver: int = 26443
    scheduler: int = 20259

    def flags(self) -> dict[str, str]:
        return {"etcd_client": "--etcd-port", "etcd_peer": "--etcd-peer-port",
                "apiserver": "--apiserver-port", "scheduler": "--scheduler-port"}


def free_ports() -> Ports:
    """Four distinct free loopback ports (held open together while chosen), for a control plane of
    its own beside any other on this machine: a test's, a benchmark's, another checkout's."""
    etcd, peer, api, sched = processes.free_loopback_ports(4)
    return Ports(etcd_client=etcd, etcd_peer=peer, apiserver=api, scheduler=sched)


class State(BaseModel):
    ports: Ports
    token: str
    processes: list[ProcessRecord]
    started_at: float
    ready_s: float | None = None
    racks: int = 0
    nodes_per_rack: int = NODES_PER_RACK
    first_rack: int = 0
    nodes_ready_s: float | None = None
    workload_scheduling: bool = False
    real_kubelets: int = 0
    hollow_racks: int = 0
    addons: list[str] = []
    pod_network: int | None = None
    """The pod network this simulator holds (nvlfabric/sim/podnetwork.py); None: pods share their node's."""


class ControlPlaneError(RuntimeError):
    """Something the user must act on; the message says what and how."""


@dataclass
class ControlPlane:
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
        return self.state_dir / "controlplane.json"

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def backend_dir(self) -> Path:
        return self.state_dir / "pulumi"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    # -- state ---------------------------------------------------------------------------------

    def load_state(self) -> State | None:
        try:
            return State.model_validate_json(self.state_file.read_text())
        except FileNotFoundError:
            return None
        except ValueError:
            # A torn or foreign file: treat as "nothing recorded"; `down` still cleans the dir.
            return None

    def _save_state(self, state: State) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(state.model_dump_json(indent=2))
        tmp.replace(self.state_file)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        lock = self.state_dir / "controlplane.lock"
        with lock.open("w") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise ControlPlaneError(
                    f"another nvlfabric-sim command is working on {self.state_dir}; wait for it to finish"
                ) from None
            yield

    # -- status ----------------------------------------------------------------------------------

    def component_status(self) -> dict[str, bool]:
        state = self.load_state()
        if state is None:
            return {}
        return {rec.name: processes.alive(rec) for rec in state.processes}

    def running(self) -> bool:
        status = self.component_status()
        return bool(status) and all(status.values())

    # -- up --------------------------------------------------------------------------------------

    def up(self) -> bool:
        """Start everything; returns False when it was already running (nothing changed)."""
        with self._locked():
            state = self.load_state()
            if state is not None:
                if self.running():
                    self.ports = state.ports
                    self.racks, self.nodes_per_rack, self.first_rack = (state.racks, state.nodes_per_rack,
                                                                        state.first_rack)
                    self.workload_scheduling = state.workload_scheduling
                    self.real_kubelets = state.real_kubelets
                    self.hollow_racks = state.hollow_racks
                    self.addons = tuple(state.addons)
                    return False
                # Leftovers of a crash: stop what survives before starting afresh.
                self._stop_all(state)
            tools = load_tools()
            if self.real_kubelets:
                full = [n for n in self.nodes() if not n.hollow]
                if self.real_kubelets > len(full):
                    raise ControlPlaneError(f"--real-kubelets {self.real_kubelets} is more than the "
                                            f"{len(full)} node(s) of --racks/--nodes-per-rack that are not hollow")
                tools.binary("kubelet")
                realnode.node_addresses(self.real_kubelets)
            self._check_ports()
            started = time.monotonic()
            net = self._claim_pod_network()
            token = pki.generate(self.state_dir / "pki", extra_ips=(net.gateway,) if net else ())
            self._write_kubeconfig(token)
            self.backend_dir.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(self.state_dir / "etcd", ignore_errors=True)
            state = State(ports=self.ports, token=token, processes=[], started_at=time.time(),
                          racks=self.racks, nodes_per_rack=self.nodes_per_rack, first_rack=self.first_rack,
                          workload_scheduling=self.workload_scheduling, real_kubelets=self.real_kubelets,
                          hollow_racks=self.hollow_racks, addons=list(self.addons),
                          pod_network=net.index if net else None)
            try:
                self._start_etcd(tools, state)
                self._start_apiserver(tools, state)
                self._start_scheduler(tools, state)
                self._start_controller_manager(tools, state)
                self._wait_workloads_admissible(state)
                for name in self.addons:
                    self._start_addon(tools, state, name)
                state.ready_s = round(time.monotonic() - started, 2)
                self.progress(f"control plane ready in {state.ready_s:.1f}s at {self.server}")
                if self.racks:
                    self._start_nodes(tools, state)
                    state.nodes_ready_s = round(time.monotonic() - started, 2)
            except BaseException:
                self._stop_all(state)
                podnetwork.release(self.state_dir)
                self.state_file.unlink(missing_ok=True)
                raise
            self._save_state(state)
            return True

    def _claim_pod_network(self) -> podnetwork.PodNetwork | None:
        # Also without racks: kubelets started beside the control plane (the tests') may use it.
        if self.pod_network == "host":
            return None
        if self.pod_network != "namespaced":
            raise ControlPlaneError(f"--pod-network {self.pod_network!r}: give namespaced or host")

        def held(state_dir: Path) -> bool:  # its simulator runs, or an up/down works on it now
            other = ControlPlane(state_dir)
            return other.running() or _locked_elsewhere(other.state_dir / "controlplane.lock")

        try:
            net = podnetwork.claim(self.state_dir, held)
        except podnetwork.PodNetworkError as exc:
            raise ControlPlaneError(str(exc)) from None
        self.progress(f"pod network {net.subnet} on bridge {net.bridge} (pods that are not hostNetwork)")
        return net

    def _check_ports(self) -> None:
        for attr, flag in self.ports.flags().items():
            port = getattr(self.ports, attr)
            if processes.port_in_use(port):
                raise ControlPlaneError(
                    f"port {port} on 127.0.0.1 ({attr.replace('_', ' ')}) is already in use by another "
                    f"process; stop it, or choose another port with `nvlfabric-sim up {flag} PORT`"
                )

    def _launch(self, state: State, name: str, argv: list[str]) -> ProcessRecord:
        self.progress(f"starting {name}")
        if self.workload_scheduling and name.startswith("kube-"):
            argv = [*argv, f"--feature-gates={','.join(f'{g}=true' for g in WORKLOAD_SCHEDULING_GATES)}"]
            if name == "kube-apiserver":
                argv.append(f"--runtime-config={','.join(f'{v}=true' for v in WORKLOAD_SCHEDULING_APIS)}")
        argv = [*argv, *self.extra_args.get(name, [])]
        env = {**os.environ, **self.extra_env[name]} if name in self.extra_env else None
        rec = processes.spawn(name, argv, self.state_dir / "logs" / f"{name}.log", env=env)
        state.processes.append(rec)
        self._save_state(state)
        return rec

    def _wait(self, state: State, what: str, check: Callable[[], bool]) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            for rec in state.processes:
                if not processes.alive(rec):
                    raise ControlPlaneError(
                        f"{rec.name} exited while waiting for {what}; last lines of {rec.log}:\n"
                        f"{processes.log_tail(rec.log)}"
                    )
            if check():
                return
            time.sleep(POLL_INTERVAL_S)
        raise ControlPlaneError(f"timed out after {START_TIMEOUT_S:.0f}s waiting for {what}; logs in "
                                f"{self.state_dir / 'logs'}")

    def _start_etcd(self, tools: Tools, state: State) -> None:
        p = self.ports
        peer = f"http://127.0.0.1:{p.etcd_peer}"
        self._launch(state, "etcd", [
            str(tools.binary("etcd")), "--name=nvlfabric-sim", f"--data-dir={self.state_dir / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{p.etcd_client}",
            f"--advertise-client-urls=http://127.0.0.1:{p.etcd_client}",
            f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=nvlfabric-sim={peer}",
            # A disposable test cluster: durability costs fsyncs the 2-core machine cannot spare.
            "--unsafe-no-fsync", "--log-level=warn", "--quota-backend-bytes=4294967296",
        ])
        self._wait(state, "etcd /health", lambda: _http_ok(f"http://127.0.0.1:{p.etcd_client}/health"))

    def _start_apiserver(self, tools: Tools, state: State) -> None:
        p, pki_dir = self.ports, self.state_dir / "pki"
        self._launch(state, "kube-apiserver", [
            str(tools.binary("kube-apiserver")),
            f"--etcd-servers=http://127.0.0.1:{p.etcd_client}",
            # With a pod network, also its gateway's: where pods in namespaces of their own reach it.
            f"--bind-address={'0.0.0.0' if state.pod_network is not None else '127.0.0.1'}",
            f"--secure-port={p.apiserver}", "--advertise-address=127.0.0.1",
            # Loopback only: stop the "kubernetes" Service endpoint reconciler fighting 127.0.0.1.
            "--endpoint-reconciler-type=none",
            f"--tls-cert-file={pki_dir / 'apiserver.crt'}", f"--tls-private-key-file={pki_dir / 'apiserver.key'}",
            f"--client-ca-file={pki_dir / 'ca.crt'}",
            f"--token-auth-file={pki_dir / 'tokens.csv'}",
            # `kubectl logs`: the simulated kubelets serve their API on each node's InternalIP (its
            # Hostname resolves nowhere), with certificates of the cluster CA, both ways.
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            f"--kubelet-client-certificate={pki_dir / 'kubelet-client.crt'}",
            f"--kubelet-client-key={pki_dir / 'kubelet-client.key'}",
            f"--kubelet-certificate-authority={pki_dir / 'ca.crt'}",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki_dir / 'sa.pub'}",
            f"--service-account-signing-key-file={pki_dir / 'sa.key'}",
            "--authorization-mode=Node,RBAC", "--allow-privileged=true",
            "--enable-admission-plugins=NodeRestriction",
            f"--cert-dir={pki_dir}", "--v=1",
        ])
        self._wait(state, "kube-apiserver /readyz", lambda: self._api_ok(state.token, "/readyz"))
        self._wait(state, "resource.k8s.io/v1 to be served",
                   lambda: self._api_ok(state.token, "/apis/resource.k8s.io/v1"))
        for version in WORKLOAD_SCHEDULING_APIS if self.workload_scheduling else ():
            served = functools.partial(self._api_ok, state.token, f"/apis/{version}")
            self._wait(state, f"{version} to be served", served)

    def _start_scheduler(self, tools: Tools, state: State) -> None:
        p = self.ports
        if self.scheduler_config:
            # With --config the scheduler ignores --kubeconfig and --leader-elect: they go in the file.
            config = _merged({"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
                              "clientConnection": {"kubeconfig": str(self.kubeconfig)},
                              "leaderElection": {"leaderElect": False}}, self.scheduler_config)
            path = self.state_dir / "kube-scheduler.yaml"
            path.write_text(yaml.safe_dump(config, sort_keys=False))
            client = [f"--config={path}"]
        else:
            client = [f"--kubeconfig={self.kubeconfig}", "--leader-elect=false"]
        self._launch(state, "kube-scheduler", [
            str(tools.binary("kube-scheduler")), *client,
            f"--authentication-kubeconfig={self.kubeconfig}", f"--authorization-kubeconfig={self.kubeconfig}",
            "--bind-address=127.0.0.1", f"--secure-port={p.scheduler}",
            f"--cert-dir={self.state_dir / 'pki' / 'scheduler'}", "--v=1",
        ])
        self._wait(state, "kube-scheduler /healthz",
                   lambda: _http_ok(f"https://127.0.0.1:{p.scheduler}/healthz", insecure=True))

    def _start_controller_manager(self, tools: Tools, state: State) -> None:
        pki_dir = self.state_dir / "pki"
        self._launch(state, "kube-controller-manager", [
            str(tools.binary("kube-controller-manager")), f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}", f"--authorization-kubeconfig={self.kubeconfig}",
            "--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=0",
            "--controllers=*", "--use-service-account-credentials=false",
            f"--service-account-private-key-file={pki_dir / 'sa.key'}", f"--root-ca-file={pki_dir / 'ca.crt'}",
            "--cluster-name=nvlfabric-sim", "--v=1",
        ])

    def _start_addon(self, tools: Tools, state: State, name: str) -> None:
        addon = addons.ADDONS[name]
        webhook_port, health_port = processes.free_loopback_ports(2)
        client = addons.admin_client(self.kubeconfig)
        try:
            prepared = addons.prepare(addon, state_dir=self.state_dir, client=client,
                                      binary=tools.binary(addon.binary), webhook_port=webhook_port,
                                      health_port=health_port)
        finally:
            client.close()
        self._launch(state, name, prepared.argv)
        self._wait(state, f"addon {name} to be ready", lambda: _http_ok(prepared.ready_url))

    def _wait_workloads_admissible(self, state: State) -> None:
        # Pods are rejected until the service-account controller made `default/default`; waiting
        # for it proves the controller manager is working, not just alive.
        self._wait(state, "the controller manager to create ServiceAccount default/default",
                   lambda: self._api_ok(state.token, "/api/v1/namespaces/default/serviceaccounts/default"))

    def _start_nodes(self, tools: Tools, state: State) -> None:
        """Simulated GB200 racks: stand-ins in each node's driver root, then one process of
        simulated kubelets, and a machine with the real kubelet for each of `real_nodes()`."""
        nodes = self.nodes()
        hollow = sorted({n.rack for n in nodes if n.hollow})
        self.progress(f"preparing {len(nodes)} simulated GB200 nodes ({self.racks} rack(s) of {self.nodes_per_rack}"
                      + (f"; racks {hollow[0]}..{hollow[-1]} hollow" if hollow else "") + ")")
        built = hardware.build_standins()
        nodeimage.build_keeper()  # the node image's IMEX keeper, which its `imex` containers run
        # Hollow nodes read no NVML (their stand-in agent knows its clique): the topology holds the
        # others, so what a real agent's NVML reads does not grow with the cluster.
        topo = hardware.write_topology(self.state_dir, [n for n in nodes if not n.hollow] or nodes)
        minors = {n.name: [g.minor for g in n.gpus] for n in topo.nodes}
        shutil.rmtree(runtime_root(self.state_dir), ignore_errors=True)
        for node in nodes:
            shutil.rmtree(node.dir, ignore_errors=True)
            node.prepare_dirs()
            if node.hollow:
                continue
            hardware.install_driver_root(node, built, topo.driver_version)
            hardware.write_node_identity(self.state_dir, node)
            for problem in hardware.install_host_files(node, minors[node.name], topo.driver_version):
                self.progress(f"{node.name}: not made: {problem}")  # once per node: no CAP_MKNOD here
        real = self.real_nodes()
        if len(real) < len(nodes):
            self._launch(state, "sim-kubelet", [
                sys.executable, "-m", "nvlfabric.sim.kubelet", f"--state-dir={self.state_dir}",
                f"--kubeconfig={self.kubeconfig}",
                f"--racks={self.racks}", f"--nodes-per-rack={self.nodes_per_rack}", f"--first-rack={self.first_rack}",
                f"--hollow-racks={self.hollow_racks}",
                f"--images={json.dumps({k: v.model_dump() for k, v in self.images.items()})}",
                f"--pki-dir={self.state_dir / 'pki'}",
                *(f"--exclude={n.name}" for n in real),
                *([f"--pod-network={state.pod_network}"] if state.pod_network is not None else []),
            ])
        for node, address in zip(real, realnode.node_addresses(len(real)), strict=True):
            self._start_real_node(tools, state, realnode.RealNode(node=node, address=address), built["nvlfabric-shim"])
        names = {n.name for n in nodes}
        last = [-1]

        def all_ready() -> bool:
            ready = self._ready_nodes(state.token) & names
            if len(ready) != last[0]:
                last[0] = len(ready)
                self.progress(f"{len(ready)}/{len(names)} nodes Ready")
            return ready == names

        self._wait(state, f"{len(names)} simulated nodes to be Ready and schedulable", all_ready)

    def _start_real_node(self, tools: Tools, state: State, real: realnode.RealNode, shim: Path) -> None:
        """The node's machine (a PID namespace, its first process reaping orphans), then the node
        itself in it: the CRI stand-in and the real kubelet (nvlfabric/sim/realnode.py)."""
        name = real.node.name
        machine = self._launch(state, f"machine-{name}", [
            shutil.which("unshare") or "unshare", "--pid", "--fork", "--kill-child",
            sys.executable, "-m", "nvlfabric.sim.kubelet.rootfs", "--init"])
        init = rootfs.namespace_init(machine.pid)
        if init is None:
            raise ControlPlaneError(f"node {name}: its PID namespace did not start (unshare --pid): a real-kubelet "
                                    "node needs root (CAP_SYS_ADMIN) for its PID and mount namespaces")
        real.node.machine_pid_file.write_text(f"{init}\n")
        spec = realnode.prepare(real, pki_dir=self.state_dir / "pki", kubelet=tools.binary("kubelet"), shim=shim,
                                server=self.server, images=self.images, labels=realnode.labels(real.node),
                                hardware_env=hardware.node_env(self.state_dir, real.node), pidns=f"/proc/{init}/ns/pid")
        self._launch(state, f"kubelet-{name}", [sys.executable, "-m", "nvlfabric.sim.kubelet.rootfs", str(spec)])
        self._wait(state, f"the real kubelet of {name} to register its Node (log: {real.kubelet_log})",
                   lambda: self._api_ok(state.token, f"/api/v1/nodes/{name}"))
        self._patch_node_status(state.token, name, realnode.gpu_capacity_patch(GPUS_PER_NODE))

    def _patch_node_status(self, token: str, name: str, patch: dict[str, Any]) -> None:
        req = urllib.request.Request(f"{self.server}/api/v1/nodes/{name}/status", data=json.dumps(patch).encode(),
                                     method="PATCH", headers={"Content-Type": "application/merge-patch+json",
                                                              "Authorization": f"Bearer {token}"})
        ctx = ssl.create_default_context(cafile=str(self.state_dir / "pki" / "ca.crt"))
        with urllib.request.urlopen(req, timeout=10, context=ctx):
            pass

    def _ready_nodes(self, token: str) -> set[str]:
        """Nodes that are Ready and no longer carry the not-ready taint (i.e. schedulable)."""
        req = urllib.request.Request(self.server + "/api/v1/nodes?labelSelector=nvlfabric.io%2Fsimulated%3Dtrue")
        req.add_header("Authorization", f"Bearer {token}")
        ctx = ssl.create_default_context(cafile=str(self.state_dir / "pki" / "ca.crt"))
        try:
            with urllib.request.urlopen(req, timeout=5, context=ctx) as resp:
                items = json.load(resp)["items"]
        except (urllib.error.URLError, OSError, ValueError):
            return set()
        out = set()
        for item in items:
            conditions = {c["type"]: c["status"] for c in item.get("status", {}).get("conditions", [])}
            taints = [t["key"] for t in item.get("spec", {}).get("taints", [])]
            if conditions.get("Ready") == "True" and "node.kubernetes.io/not-ready" not in taints:
                out.add(item["metadata"]["name"])
        return out

    def _api_ok(self, token: str, path: str) -> bool:
        return _http_ok(self.server + path, token=token, cafile=self.state_dir / "pki" / "ca.crt")

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
        with self._locked():
            # It stops listening at once on SIGTERM, then can linger in its shutdown for the whole
            # 10 s `stop` grants (seen: quota evaluators): the outage has begun, so kill it sooner.
            processes.stop(self._apiserver(self._saved()), timeout=APISERVER_STOP_TIMEOUT_S)

    def start_apiserver(self) -> None:
        """Start the stopped kube-apiserver again with the argv it had: the same port, etcd and
        credentials, so every kubeconfig and resourceVersion stays valid; returns once /readyz is OK."""
        with self._locked():
            state = self._saved()
            old = self._apiserver(state)
            if not processes.alive(old):
                self.progress("starting kube-apiserver")
                new = processes.spawn(old.name, old.argv, Path(old.log))
                # Same place in the list: `down` stops the processes in reverse start order.
                state.processes[state.processes.index(old)] = new
                self._save_state(state)
            self._wait(state, "kube-apiserver /readyz", lambda: self._api_ok(state.token, "/readyz"))

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
        with self._locked():
            state = self.load_state()
            was_running = state is not None and any(processes.alive(r) for r in state.processes)
            if state is not None:
                self._stop_all(state)
            podnetwork.release(self.state_dir)
            self.state_file.unlink(missing_ok=True)
            shutil.rmtree(self.state_dir / "etcd", ignore_errors=True)
            shutil.rmtree(runtime_root(self.state_dir), ignore_errors=True)
        (self.state_dir / "controlplane.lock").unlink(missing_ok=True)
        return was_running


def _merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """`base` with `extra` merged in, nested mappings key by key."""
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _locked_elsewhere(lock: Path) -> bool:
    """Whether another process holds `lock` (an `nvlfabric-sim up` or `down` at work)."""
    try:
        with lock.open("r") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(fh, fcntl.LOCK_UN)
            return False
    except OSError:
        return False


def _http_ok(url: str, *, token: str | None = None, cafile: Path | None = None, insecure: bool = False) -> bool:
    ctx: ssl.SSLContext | None = None
    if url.startswith("https"):
        if insecure:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        else:
            ctx = ssl.create_default_context(cafile=str(cafile) if cafile else None)
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=2, context=ctx) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False
