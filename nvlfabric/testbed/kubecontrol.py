"""The control plane's processes: etcd, kube-apiserver, kube-scheduler and kube-controller-manager,
their command lines and what each must answer before the next starts.

All four are the real binaries `make tools` builds from Go modules, run on loopback with generated
certificates (nvlfabric/sim/pki.py).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import yaml

from nvlfabric.sim import podnetwork
from nvlfabric.sim.paths import Tools
from nvlfabric.testbed.apihttp import http_ok
from nvlfabric.testbed.launcher import Launcher
from nvlfabric.testbed.runstate import Ports

#: Kubernetes 1.37's workload-aware scheduling, off by default there (alpha and beta): Workload,
#: PodGroup and CompositePodGroup objects, gang policy, a topology constraint per pod group and
#: claims reserved for a whole pod group (../shared/reference: k8s-workload-scheduling.md).
WORKLOAD_SCHEDULING_GATES = ("GenericWorkload", "DRAWorkloadResourceClaims", "TopologyAwareWorkloadScheduling",
                             "CompositePodGroup")
#: The versions served: 1.37's scheduler watches v1beta1 (the issue and the reference name v1alpha3,
#: which 1.37 serves too, with the same fields).
WORKLOAD_SCHEDULING_APIS = ("scheduling.k8s.io/v1beta1", "scheduling.k8s.io/v1alpha3")


def start(run: Launcher, tools: Tools, *, ports: Ports, kubeconfig: Path, scheduler_config: dict[str, Any],
          workload_scheduling: bool) -> None:
    """All four, in order, each answering before the next starts; returns once pods are admissible."""
    _start_etcd(run, tools, ports)
    _start_apiserver(run, tools, ports, workload_scheduling=workload_scheduling)
    _start_scheduler(run, tools, ports, kubeconfig, scheduler_config, workload_scheduling=workload_scheduling)
    _start_controller_manager(run, tools, kubeconfig, workload_scheduling=workload_scheduling)
    # Pods are rejected until the service-account controller made `default/default`; waiting
    # for it proves the controller manager is working, not just alive.
    admin = run.admin
    run.wait("the controller manager to create ServiceAccount default/default",
             lambda: admin.ok("/api/v1/namespaces/default/serviceaccounts/default"))


def _gated(argv: list[str], workload_scheduling: bool, *, apis: bool = False) -> list[str]:
    """The command line with workload scheduling's gates on (and its APIs served, for the API
    server), as a cluster that opted in sets them in all three Kubernetes components alike."""
    if not workload_scheduling:
        return argv
    argv = [*argv, f"--feature-gates={','.join(f'{g}=true' for g in WORKLOAD_SCHEDULING_GATES)}"]
    if apis:
        argv.append(f"--runtime-config={','.join(f'{v}=true' for v in WORKLOAD_SCHEDULING_APIS)}")
    return argv


def _start_etcd(run: Launcher, tools: Tools, p: Ports) -> None:
    peer = f"http://127.0.0.1:{p.etcd_peer}"
    run.launch("etcd", [
        str(tools.binary("etcd")), "--name=nvlfabric-sim", f"--data-dir={run.state_dir / 'etcd'}",
        f"--listen-client-urls=http://127.0.0.1:{p.etcd_client}",
        f"--advertise-client-urls=http://127.0.0.1:{p.etcd_client}",
        f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=nvlfabric-sim={peer}",
        # A disposable test cluster: durability costs fsyncs the 2-core machine cannot spare.
        "--unsafe-no-fsync", "--log-level=warn", "--quota-backend-bytes=4294967296",
    ])
    run.wait("etcd /health", lambda: http_ok(f"http://127.0.0.1:{p.etcd_client}/health"))


def service_range(pod_network: int | None) -> str:
    return str(podnetwork.PodNetwork(pod_network).service_range) if pod_network is not None else "10.0.0.0/24"


def _start_apiserver(run: Launcher, tools: Tools, p: Ports, *, workload_scheduling: bool) -> None:
    pki_dir = run.state_dir / "pki"
    run.launch("kube-apiserver", _gated([
        str(tools.binary("kube-apiserver")),
        f"--etcd-servers=http://127.0.0.1:{p.etcd_client}",
        # With a pod network, also its gateway's: where pods in namespaces of their own reach it.
        f"--bind-address={'0.0.0.0' if run.state.pod_network is not None else '127.0.0.1'}",
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
        # With a pod network, a Service range of the simulator's own (podnetwork.PodNetwork).
        f"--service-cluster-ip-range={service_range(run.state.pod_network)}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki_dir / 'sa.pub'}",
        f"--service-account-signing-key-file={pki_dir / 'sa.key'}",
        "--authorization-mode=Node,RBAC", "--allow-privileged=true",
        "--enable-admission-plugins=NodeRestriction",
        f"--cert-dir={pki_dir}", "--v=1",
    ], workload_scheduling, apis=True))
    admin = run.admin
    run.wait("kube-apiserver /readyz", lambda: admin.ok("/readyz"))
    run.wait("resource.k8s.io/v1 to be served", lambda: admin.ok("/apis/resource.k8s.io/v1"))
    for version in WORKLOAD_SCHEDULING_APIS if workload_scheduling else ():
        run.wait(f"{version} to be served", functools.partial(admin.ok, f"/apis/{version}"))


def _start_scheduler(run: Launcher, tools: Tools, p: Ports, kubeconfig: Path, scheduler_config: dict[str, Any], *,
                     workload_scheduling: bool) -> None:
    if scheduler_config:
        # With --config the scheduler ignores --kubeconfig and --leader-elect: they go in the file.
        config = _merged({"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
                          "clientConnection": {"kubeconfig": str(kubeconfig)},
                          "leaderElection": {"leaderElect": False}}, scheduler_config)
        path = run.state_dir / "kube-scheduler.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        client = [f"--config={path}"]
    else:
        client = [f"--kubeconfig={kubeconfig}", "--leader-elect=false"]
    run.launch("kube-scheduler", _gated([
        str(tools.binary("kube-scheduler")), *client,
        f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1", f"--secure-port={p.scheduler}",
        f"--cert-dir={run.state_dir / 'pki' / 'scheduler'}", "--v=1",
    ], workload_scheduling))
    run.wait("kube-scheduler /healthz", lambda: http_ok(f"https://127.0.0.1:{p.scheduler}/healthz", insecure=True))


def _start_controller_manager(run: Launcher, tools: Tools, kubeconfig: Path, *, workload_scheduling: bool) -> None:
    pki_dir = run.state_dir / "pki"
    run.launch("kube-controller-manager", _gated([
        str(tools.binary("kube-controller-manager")), f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
        "--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port=0",
        "--controllers=*", "--use-service-account-credentials=false",
        f"--service-account-private-key-file={pki_dir / 'sa.key'}", f"--root-ca-file={pki_dir / 'ca.crt'}",
        "--cluster-name=nvlfabric-sim", "--v=1",
    ], workload_scheduling))


def _merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """`base` with `extra` merged in, nested mappings key by key."""
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out
