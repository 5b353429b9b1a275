"""A pod's network on a simulated node, as the kubelet's sandbox and a CNI plugin give it one.

A pod that is not `hostNetwork` gets an address of its node's block on the simulator's pod
network (nvlfabric/sim/podnetwork.py) when it starts, and keeps it until it is deleted; if any of
its containers runs as a process, also a network namespace there, which they all enter, so its
ports are its own. The address is written in the pod's directory: a restarted kubelet gives a
running pod the same one, and never hands it to another pod meanwhile. Its /etc/resolv.conf names
the simulator's cluster DNS (clusterdns.py) at the pod network's gateway, as a kubelet's
`--cluster-dns` does, by the pod's `dnsPolicy` and `dnsConfig`.
"""

from __future__ import annotations

import contextlib
from urllib.parse import urlparse

from lightkube.resources.core_v1 import Pod

from nvlfabric.sim.clusterdns import CLUSTER_DOMAIN
from nvlfabric.sim.kubelet.state import NodeState, PodNotReady
from nvlfabric.sim.podnetwork import PodNetwork, PodNetworkError

IP_FILE = "pod-ip"


def _recorded(state: NodeState) -> set[str]:
    """Addresses written in the node's pod directories (pods a restarted kubelet has not synced yet)."""
    out = set()
    for f in (state.node.dir / "pods").glob(f"*/{IP_FILE}"):
        with contextlib.suppress(OSError):
            out.add(f.read_text().strip())
    return out


def _address(net: PodNetwork, state: NodeState, uid: str) -> str:
    record = state.node.pod_dir(uid) / IP_FILE
    with contextlib.suppress(OSError):
        if ip := record.read_text().strip():
            return ip
    taken = set(state.pod_ips.values()) | _recorded(state) | net.in_use()
    free = [a for a in net.node_addresses(state.node.rack, state.node.index) if a not in taken]
    if not free:
        raise PodNetworkError(f"node {state.node.name} has no pod address left ({len(taken)} in use)")
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(free[0])
    return free[0]


async def open_sandbox(net: PodNetwork | None, state: NodeState, pod: Pod, *, runs_processes: bool) -> None:
    """The pod's address, and its namespace when it runs processes (nothing for hostNetwork pods)."""
    assert pod.metadata is not None and pod.spec is not None
    uid = pod.metadata.uid or ""
    if net is None or pod.spec.hostNetwork:
        return
    try:
        ip = state.pod_ips[uid] = _address(net, state, uid)
        if runs_processes and uid not in state.netns:
            state.netns[uid] = await net.sandbox(ip)
    except PodNetworkError as exc:  # the kubelet's event when the CNI plugin fails
        raise PodNotReady("FailedCreatePodSandBox", f"Failed to create pod sandbox: {exc}") from exc


async def close_sandbox(net: PodNetwork | None, state: NodeState, uid: str) -> None:
    """The pod is gone: its namespace and address are free again."""
    ip = state.pod_ips.pop(uid, None)
    if state.netns.pop(uid, None) is not None and net is not None and ip is not None:
        await net.remove(ip)
    (state.node.pod_dir(uid) / IP_FILE).unlink(missing_ok=True)


def resolv_conf(pod: Pod, nameserver: str | None, domain: str = CLUSTER_DOMAIN) -> str | None:
    """The pod's /etc/resolv.conf as the kubelet writes it for its `dnsPolicy` with the cluster's
    DNS at `nameserver` (clusterdns.py), its `dnsConfig` added; None: the node's own file (policy
    Default, a hostNetwork pod under ClusterFirst, or no cluster DNS)."""
    assert pod.metadata is not None and pod.spec is not None
    policy, cfg = pod.spec.dnsPolicy or "ClusterFirst", pod.spec.dnsConfig
    wants = policy == "ClusterFirstWithHostNet" or (policy == "ClusterFirst" and not pod.spec.hostNetwork)
    cluster = nameserver is not None and wants
    if not cluster and policy != "None":
        return None
    ns = pod.metadata.namespace or "default"
    searches = [f"{ns}.svc.{domain}", f"svc.{domain}", domain] if cluster else []
    servers = [nameserver] if cluster and nameserver else []
    options = {"ndots": "5"} if cluster else {}
    if cfg is not None:
        servers += [s for s in cfg.nameservers or [] if s not in servers]
        searches += [s for s in cfg.searches or [] if s not in searches]
        options.update({o.name: o.value or "" for o in cfg.options or [] if o.name})
    lines = ([f"search {' '.join(searches)}"] if searches else []) + [f"nameserver {s}" for s in servers[:3]]
    if options:
        lines.append("options " + " ".join(f"{k}:{v}" if v else k for k, v in options.items()))
    return "\n".join(lines) + "\n"


def api_server_for(api_server: str, net: PodNetwork | None, state: NodeState, uid: str) -> str:
    """The API server's URL as the pod reaches it: at the pod network's gateway from a namespace
    of its own (its loopback is its own), else as given."""
    if net is None or uid not in state.netns:
        return api_server
    u = urlparse(api_server)
    return u._replace(netloc=f"{net.gateway}:{u.port or 443}").geturl()
