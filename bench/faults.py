"""Fault bench → bench/results/faults.json: a member node is lost under a running whole-rack job
and the domain heals onto a spare (issue 51).

One NVL72 rack of 18 simulated nodes with nvlfabric's real node agents and IMEX keepers, the driver
deployed from its manifests, the rack's Nodes labelled `nvlfabric.io/spares=2` (as `Nvl72Rack(spares=2)`
does), and a ComputeDomain (numNodes 16) with BoundJob's Job of 16 pods x 4 GPUs. The node
lifecycle controller's grace is shortened to NODE_MONITOR_GRACE_S (clusters shorten it too; the
default, 50 s, is how long a dead kubelet goes unseen, which no driver can shorten). Three losses
in turn, each of a member node, each healed before the next and the node then brought back:

- node_down: its kubelet stops (`nvlfabric-sim fault node-down`); visible when the API shows the
  Node NotReady;
- fabric: its fabric degrades (`fault fabric-degraded`); visible when the Node's NVLinkFabricReady
  condition is False;
- deleted: its Node is deleted; visible when the API answers 404.

Figures (seconds from the loss being visible in the API):
- <kind>_detected_s   until the domain names the node in status.lostNodes (goal ≤ 10)
- <kind>_healed_s     until the replacement runs on a free node and the domain is Ready with 16
                      ready members again (goal ≤ 30 after detection)
- node_loss_detected_s, node_loss_healed_s   the worst of the three
- members_restarted   pods of the other members replaced or restarted, or their IMEX daemons
                      restarted, over the three losses (goal 0)
- leaked_channels     after the three: the claim's reservedFor entries of pods that are gone, plus
                      nodes holding the claim's CDI spec without a live pod of the domain (goal 0)
- node_monitor_grace_s  the grace used

Then, on the same rack (the 16-pod job deleted, the deleted Node not back: 17 nodes), an elastic
job through the real Pulumi CLI (bench/fixtures/elastic: a ComputeDomain without numNodes and a
BoundJob with max_parallelism) brought up with ELASTIC_FROM pods, then `pulumi up` with 2 more and
2 fewer:
- grow_s    `pulumi up` of parallelism +2 until the domain is Ready with as many ready members
- shrink_s  `pulumi up` of parallelism -2 until the domain is Ready with as many
- elastic_members_restarted  pods that stayed through both, replaced or restarted (goal 0)
(Each includes the CLI's own time: its start, the program's run, the preview steps.)
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from lightkube import ApiError, Client, KubeConfig, codecs
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Node
from lightkube.resources.resource_v1 import ResourceClaim
from lightkube.types import CascadeType

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from nvlfabric import manifests  # noqa: E402
from nvlfabric.api import computedomain as api  # noqa: E402
from nvlfabric.api import names  # noqa: E402
from nvlfabric.components.workloadargs import BoundJobArgs  # noqa: E402
from nvlfabric.components.workloadmanifests import workload_manifests  # noqa: E402
from nvlfabric.controller.cache import ComputeDomainResource  # noqa: E402
from nvlfabric.provider.nvlfabricdomain import channel_claim  # noqa: E402
from nvlfabric.sim import faults  # noqa: E402
from nvlfabric.sim.cluster import eventually, install_crd, job_pods  # noqa: E402
from nvlfabric.testbed.controlplane import ControlPlane  # noqa: E402
from nvlfabric.testbed.pulumi_cli import PulumiProject, project_from_fixture  # noqa: E402
from nvlfabric.testbed.runstate import free_ports  # noqa: E402

RESULTS = REPO / "bench" / "results" / "faults.json"
RACK = 198
NODE_MONITOR_GRACE_S = 20
PODS = 16
SPARES = 2
ELASTIC_FROM = 12
_start = time.monotonic()


def say(msg: str) -> None:
    print(f"[bench faults {time.monotonic() - _start:6.1f}s] {msg}", flush=True)


def status(client: Client, name: str) -> dict[str, Any]:
    got = client.get(ComputeDomainResource, name, namespace="default").status
    return got if isinstance(got, dict) else {}


def healed(client: Client, job: str) -> bool:
    pods = job_pods(client, job)
    st = status(client, job)
    return (len(pods) == PODS and all(p.status.phase == "Running" for p in pods.values())
            and st.get("phase") == "Ready" and st.get("readyNodes") == PODS)


def imex_pids(cp: ControlPlane, node: str, clique: str) -> list[int]:
    """Live nvidia-imex processes of `node` serving the clique's IMEX domain (its config's path
    names the domain; every node's path is the same, so the node's own processes tell them apart)."""
    sim_node = {n.name: n for n in cp.nodes()}[node]
    wanted = f"clique-{clique}/config.cfg".encode()
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            zombie = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            continue
        if (argv and Path(argv[0].decode(errors="replace")).name == "nvidia-imex" and not zombie
                and any(a.endswith(wanted) for a in argv) and sim_node.runs(int(entry.name))):
            out.append(int(entry.name))
    return sorted(out)


def snapshot(cp: ControlPlane, client: Client, job: str, clique: str) -> dict[str, tuple[str, int, list[int]]]:
    """Index → (pod uid, restarts, IMEX daemon pids on its node)."""
    return {i: (str(p.metadata.uid), sum(c.restartCount for c in p.status.containerStatuses or []),
                imex_pids(cp, p.spec.nodeName, clique)) for i, p in job_pods(client, job).items()}


def visible(kind: str, client: Client, node: str) -> bool:
    if kind == "deleted":
        try:
            client.get(Node, node)
        except ApiError as exc:
            return exc.status.code == 404
        return False
    conditions = {c.type: c.status for c in client.get(Node, node).status.conditions or []}
    if kind == "node_down":
        return conditions.get("Ready") != "True"
    return conditions.get(names.FABRIC_CONDITION) == "False"


def lose(kind: str, cp: ControlPlane, client: Client, job: str, clique: str, results: dict[str, float]) -> int:
    """One loss of a member node, timed; returns how many other members were disturbed."""
    before = snapshot(cp, client, job, clique)
    index = sorted(before)[len(results) % PODS]
    victim = job_pods(client, job)[index].spec.nodeName
    sim_node = {n.name: n for n in cp.nodes()}[victim]
    say(f"{kind}: losing {victim} (pod {index})")
    if kind == "node_down":
        faults.inject(cp.state_dir, sim_node, "node-down")
    elif kind == "fabric":
        faults.inject(cp.state_dir, sim_node, "fabric-degraded")
    else:
        client.delete(Node, victim)
    seen = eventually(f"{kind} visible", lambda: time.monotonic() if visible(kind, client, victim) else None,
                      timeout=NODE_MONITOR_GRACE_S + 60, interval=0.1)
    named = eventually("the domain to name it", lambda: time.monotonic() if victim in [
        n["name"] for n in status(client, job).get("lostNodes", [])] else None, timeout=60, interval=0.1)
    done = eventually("healed", lambda: time.monotonic() if healed(client, job) else None, timeout=120, interval=0.2)
    results[f"{kind}_detected_s"], results[f"{kind}_healed_s"] = named - seen, done - seen
    say(f"{kind}: named after {named - seen:.1f} s, healed after {done - seen:.1f} s")
    after = snapshot(cp, client, job, clique)
    disturbed = sum(1 for i, was in before.items() if i != index and after.get(i) != was)
    if kind != "deleted":  # the node comes back, and must be a free node again
        faults.inject(cp.state_dir, sim_node, "clear")
        eventually(f"{victim} back", lambda: not visible(kind, client, victim), timeout=60)
    return disturbed


def leaks(cp: ControlPlane, client: Client, job: str) -> int:
    claim = client.get(ResourceClaim, f"{job}-channel", namespace="default")
    cd_uid = client.get(ComputeDomainResource, job, namespace="default").metadata.uid
    pods = job_pods(client, job)
    live = {p.metadata.uid for p in pods.values()} | {cd_uid}
    stale = [r.uid for r in claim.status.reservedFor or [] if r.uid not in live]
    used_on = {p.spec.nodeName for p in pods.values()}
    held = [n.name for n in cp.nodes() if n.name not in used_on and any(
        claim.metadata.uid in f.read_text(errors="replace") for d in n.cdi_dirs if d.is_dir()
        for f in d.iterdir() if f.is_file())]
    say(f"leaks: reservedFor {stale}, CDI specs on nodes without a member pod {held}")
    return len(stale) + len(held)


def ready_at(client: Client, job: str, pods: int) -> bool:
    st = status(client, job)
    running = [p for p in job_pods(client, job).values() if p.status.phase == "Running"]
    return len(running) == pods and st.get("phase") == "Ready" and st.get("readyNodes") == pods == len(st["nodes"])


def elastic(tmp: Path, cp: ControlPlane, client: Client, results: dict[str, float]) -> None:
    """grow_s and shrink_s of an elastic job by `pulumi up` (see the module's docstring)."""
    job = "elastic"
    proj: PulumiProject = project_from_fixture(REPO / "bench" / "fixtures" / "elastic", tmp / "elastic",
                                               kubeconfig=cp.kubeconfig, venv=Path(sys.prefix))
    proj.run("stack", "init", "bench")
    proj.run("config", "set", "pods", str(ELASTIC_FROM))
    say(f"elastic: pulumi up of {ELASTIC_FROM} pods")
    proj.run("up", "--yes", "--skip-preview", timeout=600)
    eventually("the elastic job", lambda: ready_at(client, job, ELASTIC_FROM), timeout=300)
    before = {i: (p.metadata.uid, sum(c.restartCount for c in p.status.containerStatuses or []))
              for i, p in job_pods(client, job).items()}
    for key, pods in (("grow_s", ELASTIC_FROM + 2), ("shrink_s", ELASTIC_FROM)):
        proj.run("config", "set", "pods", str(pods))
        start = time.monotonic()
        proj.run("up", "--yes", "--skip-preview", timeout=600)
        done = eventually(f"Ready at {pods}", lambda p=pods: time.monotonic() if ready_at(client, job, p) else None,
                          timeout=300, interval=0.2)
        results[key] = done - start
        say(f"elastic: {key} {done - start:.1f} s (to {pods} pods)")
    after = {i: (p.metadata.uid, sum(c.restartCount for c in p.status.containerStatuses or []))
             for i, p in job_pods(client, job).items()}
    results["elastic_members_restarted"] = sum(1 for i, was in before.items() if after.get(i) != was)
    proj.run("destroy", "--yes", "--skip-preview", timeout=600)


def main() -> int:
    results: dict[str, float] = {}
    tmp = Path(tempfile.mkdtemp(prefix="nvlbf-"))
    cp = ControlPlane(state_dir=tmp / "sim", ports=free_ports(), racks=1, first_rack=RACK, progress=lambda m: None,
                      extra_args={"kube-controller-manager": [f"--node-monitor-grace-period={NODE_MONITOR_GRACE_S}s",
                                                              "--node-monitor-period=1s"]})
    say(f"simulator up: 1 rack of 18 nodes (rack {RACK}), node-monitor-grace {NODE_MONITOR_GRACE_S} s")
    cp.up()
    client = Client(config=KubeConfig.from_file(str(cp.kubeconfig)), field_manager="bench-faults")
    try:
        install_crd(client)
        for obj in codecs.load_all_yaml(manifests.read(manifests.DRIVER_FILE)):
            client.apply(obj, field_manager="bench-faults", force=True)
        nodes = [n.name for n in cp.nodes()]
        for n in nodes:
            client.patch(Node, n, {"metadata": {"labels": {names.SPARES_LABEL: str(SPARES)}}})
        eventually("every agent to label its Node", lambda: all(
            (client.get(Node, n).metadata.labels or {}).get(names.CLIQUE_LABEL) for n in nodes), timeout=180)
        job = "faults"
        spec = {"numNodes": PODS}
        cd = client.create(ComputeDomainResource(metadata=ObjectMeta(name=job, namespace="default"), spec=spec))
        client.create(codecs.from_dict(channel_claim(job, "default", cd.metadata.uid,
                                                     api.ComputeDomainSpec.model_validate(spec))))
        args = BoundJobArgs(name=job, parallelism=PODS, pod_template={"spec": {"containers": [
            {"name": "worker", "image": "registry.invalid/train:1"}]}})
        for obj in workload_manifests(args, namespace="default", claim_name=f"{job}-channel", domain=job):
            client.create(codecs.from_dict(obj))
        say("waiting for the 16-node job to run and its domain to be Ready")
        eventually("the job", lambda: healed(client, job), timeout=300)
        clique = status(client, job)["clique"]
        disturbed = 0
        for kind in ("node_down", "fabric", "deleted"):
            disturbed += lose(kind, cp, client, job, clique, results)
        time.sleep(5)  # unprepares of the pods that went
        results["members_restarted"] = disturbed
        results["leaked_channels"] = leaks(cp, client, job)
        kinds = ("node_down", "fabric", "deleted")
        results["node_loss_detected_s"] = max(results[f"{k}_detected_s"] for k in kinds)
        results["node_loss_healed_s"] = max(results[f"{k}_healed_s"] for k in kinds)
        results["node_monitor_grace_s"] = NODE_MONITOR_GRACE_S
        client.delete(Job, job, namespace="default", cascade=CascadeType.FOREGROUND)
        eventually("the 16-node job to go", lambda: not job_pods(client, job) or None, timeout=120)
        elastic(tmp, cp, client, results)
    finally:
        client.close()
        cp.down()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({k: round(v, 2) for k, v in results.items()}, indent=2) + "\n")
    for k, v in results.items():
        print(f"{k:28s} {v:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
