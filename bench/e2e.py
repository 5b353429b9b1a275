"""End-to-end benchmark → bench/results/e2e.json.

The whole path, timed from the start of `pulumi up` (the real CLI, a local file:// backend, the
components of `nvlfabric/components/`) on the simulator: the ComputeDomain provider creates the domain and
its channel claim, the Job controller creates the pods (held by BoundJob's reservation gate), the
controller lets one pod through, whose scheduling allocates the claim, reserves the claim for the
other pods in one write and lifts their gates (nvlfabric/controller/reservations.py), the scheduler places
them, the simulated kubelets call the node agents' DRA plugins, the agents start the clique's IMEX
stand-ins and report their node, the controller summarises. Nodes
are GB200 compute trays advertising `nvidia.com/gpu: 4`; pods ask for one GPU each, so the
scheduler must spread them 4 per node.

Two scenarios, each on a simulator of its own, with nvlfabric's driver (NvlfabricDriver: CRD,
DaemonSet, controller; bench/fixtures/e2e) installed by a first `pulumi up` before the timer starts:

- cd18: 1 rack of 18 nodes; one ComputeDomain with numNodes 18 and a BoundJob of 72 one-GPU
  pods. cd18_ready_s = from `pulumi up` until the domain is Ready (18 node entries, all ready) and
  all 72 pods run. Goal ≤ 15 s.
- job256: 4 racks of 18 nodes; 256 one-GPU pods over the 4 racks. A ComputeDomain is one NVLink
  clique (one rack) by design (docs/architecture.md, "DRA design"), so this is four ComputeDomains,
  one per rack (numNodes 16: 64 one-GPU pods need at least 16 trays), each with a BoundJob of 64
  pods pinned to its rack, all in ONE `pulumi up`. job256_running_s = from `pulumi up` until all
  256 pods run. Goal ≤ 30 s. (Kept for comparison with job288.)
- job288: 4 racks of 18 nodes; 72 pods x 4 GPUs as ONE workload: one MultiClique ComputeDomain
  (placement.cliques 4, numNodes 72) and one BoundJob, in one `pulumi up`; nvlfabric places the 4
  groups, a rack each. job288_running_s = until every pod runs and the domain is Ready. Goal ≤ 15 s.
- job288_jobset: the same job as a JobSet (BoundJob kind JobSet: a replicated Job per group), run
  by JobSet's real controller (the simulator's `jobset` addon). job288_jobset_running_s, goal ≤ 15 s
  and 0 failed scheduling, beside job288_running_s.
- job288_kueue: that JobSet queued in Kueue (the `kueue` addon; a ClusterQueue with quota for the
  cluster's GPUs and nvlfabric's AdmissionCheck, made before the timer starts), admitted once
  nvlfabric placed its groups. job288_kueue_running_s, goal ≤ 15 s and 0 failed scheduling.
- racks8 (not in the default run: 144 nodes, agents and IMEX keepers; `python bench/e2e.py
  racks8`): 8 racks, 8 whole-rack domains of 18 pods x 4 GPUs NOT pinned to racks, in one
  `pulumi up`. racks8_domains_running_s: until all 144 pods run and all 8 domains are Ready.
  Goal ≤ 30 s. Both also report claims_split_across_cliques (goal 0) and cliques_used.
- superpod (not in the default run either; `python bench/e2e.py superpod`): the same 8 racks,
  576 GPUs as ONE job: a MultiClique domain of 8 cliques and one BoundJob of 144 pods x 4 GPUs.
  superpod_running_s: until all 144 pods run and the domain is Ready. Goal ≤ 30 s.
- racks8 and superpod also report what the driver costs while they run: <k>_agents_rss_sum_mb
  (all node agents), <k>_keepers_rss_sum_mb, <k>_controller_cpu_s (both replicas' CPU seconds
  during the timed `pulumi up`), and <k>_status_conflicts (409s the ComputeDomain status writes
  met, from the agents' and the controller's logs; goal 0).

Each scenario runs twice: with the Kubernetes components' defaults (the figures the goals are
judged on), and again as `<scenario>_tuned_*` with a scheduler and controller manager tuned for
many pods per claim (TUNED: scheduler client 500 QPS / burst 1000 and pod back-off 1 s instead of
50/100 and 1..10 s; controller manager 200 QPS / burst 400 instead of 20/30). The difference is
the time the defaults cost. NVLFABRIC_BENCH_E2E_TUNED=0 skips the tuned runs.

Figures (seconds from the start of `pulumi up` unless named otherwise; <k> = cd18, cd18_tuned,
job256 or job256_tuned):
- cd18_ready_s, job256_running_s   the goals' figures (cd18: max of domains Ready and pods running)
- <k>_up_returned_s            `pulumi up` exited (domains await Accepted, Jobs their uid)
- <k>_cds_created_s            every ComputeDomain exists (provider create)
- <k>_jobs_created_s           every Job exists (created once its domain's create returned)
- <k>_claims_allocated_s       every domain's channel claim is allocated (its first pod scheduled)
- <k>_first_pod_running_s      the first pod runs (its node's agent prepared the claim)
- <k>_pods_created_s           the Job controller created every pod
- <k>_pods_scheduled_s         every pod is bound to a node
- <k>_domain_nodes_reported_s  the domains' status holds numNodes node entries each
- <k>_pods_running_s           every pod runs
- <k>_domains_ready_s          every ComputeDomain is phase Ready (the controller's summary)
- <k>_nodes_used, <k>_max_pods_per_node, <k>_domain_nodes   where the pods landed; node entries
- <k>_failed_scheduling        failed scheduling attempts (FailedScheduling events, with counts)
- <k>_reservation_conflicts    of those: the scheduler lost the race to add the pod to the shared
                               claim's status.reservedFor (409 Conflict five times in a row)
- <k>_sim_up_s, <k>_driver_up_s, <k>_driver_ready_s   set-up, not timed: simulator up; `pulumi up`
                               of the driver; until every node's agent runs, labelled its clique and
                               registered with the kubelet, and every clique's channel pool exists
- <k>_leftover_processes       simulator processes still alive after `down` (should be 0)
- job256_domains               4: one ComputeDomain per rack

The milestones come from polling the API server every POLL_S (0.5 s), so each is ±0.5 s.
NVLFABRIC_BENCH_E2E_TIMEOUT_S (default 600) bounds each wait. `python bench/e2e.py cd18` runs one
scenario.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import httpx2  # noqa: E402
from lightkube import Client  # noqa: E402
from lightkube.config.kubeconfig import KubeConfig  # noqa: E402
from lightkube.resources.batch_v1 import Job  # noqa: E402
from lightkube.resources.core_v1 import Event, Node, Pod  # noqa: E402
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice  # noqa: E402

from nvlfabric.controller.cache import ComputeDomainResource  # noqa: E402
from nvlfabric.controller.pools import CLIQUE_LABEL, POOL_LABEL  # noqa: E402
from nvlfabric.sim.kubelet.plugins import registry_sockets  # noqa: E402
from nvlfabric.sim.nodes import runtime_root  # noqa: E402
from nvlfabric.sim.nvml.topology import rack_name  # noqa: E402
from nvlfabric.testbed.controlplane import ControlPlane, free_ports  # noqa: E402
from nvlfabric.testbed.pulumi_cli import PulumiProject, project_from_fixture  # noqa: E402

RESULTS = REPO / "bench" / "results" / "e2e.json"
FIXTURE = REPO / "bench" / "fixtures" / "e2e"
NAMESPACE = "default"
POLL_S = 0.5
TIMEOUT_S = float(os.environ.get("NVLFABRIC_BENCH_E2E_TIMEOUT_S", "600"))
RUN_TUNED = os.environ.get("NVLFABRIC_BENCH_E2E_TUNED", "1") != "0"
GOALS = {"cd18_ready_s": 15.0, "job256_running_s": 30.0, "cd18_tuned_ready_s": 15.0,
         "job256_tuned_running_s": 30.0, "job288_running_s": 15.0, "job288_tuned_running_s": 15.0,
         "racks8_domains_running_s": 30.0, "racks8_tuned_domains_running_s": 30.0,
         "superpod_running_s": 30.0, "superpod_tuned_running_s": 30.0, "racks8_status_conflicts": 0,
         "superpod_status_conflicts": 0, "job288_jobset_running_s": 15.0, "job288_jobset_tuned_running_s": 15.0,
         "job288_jobset_failed_scheduling": 0,
         "job288_kueue_running_s": 15.0, "job288_kueue_tuned_running_s": 15.0, "job288_kueue_failed_scheduling": 0}
# Racks of their own (loopback 127.10.<rack>.x, and the IMEX ports there), away from a demo's
# (0, 1) and the tests' (90, 91, 150, 160, 200, 230-249).
CD18_RACK = 170
JOB256_FIRST_RACK = 180
JOB288_FIRST_RACK = 190
RACKS8_FIRST_RACK = 100
TUNED: dict[str, Any] = {
    "scheduler_config": {"clientConnection": {"qps": 500, "burst": 1000},
                         "podInitialBackoffSeconds": 1, "podMaxBackoffSeconds": 1},
    "extra_args": {"kube-controller-manager": ["--kube-api-qps=200", "--kube-api-burst=400"]},
}
_start = time.monotonic()


def say(msg: str) -> None:
    print(f"[bench e2e {time.monotonic() - _start:6.1f}s] {msg}", flush=True)


@dataclass
class Sim:
    key: str
    """Prefix of this run's figures (cd18, cd18_tuned, ...)."""
    prefix: str
    """Prefix of the stack's domain and Job names (a DNS label)."""
    cp: ControlPlane
    client: Client
    proj: PulumiProject
    racks: list[str] = field(default_factory=list)


def leftover_processes(cp: ControlPlane) -> list[int]:
    """Processes this simulator started that are still alive after `down` (agents, IMEX stand-ins):
    their working directory or command line lies in its state dir or its socket dir."""
    roots = (str(cp.state_dir), str(runtime_root(cp.state_dir)))
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(cwd.startswith(r) or r in cmd for r in roots):
            found.append(int(entry.name))
    return found


@contextmanager
def simulator(key: str, prefix: str, tmp: Path, racks: int, first_rack: int, results: dict[str, float],
              tuned: bool, addons: tuple[str, ...] = ()) -> Iterator[Sim]:
    state = tmp / key / "sim"
    cp = ControlPlane(state_dir=state, ports=free_ports(), racks=racks, first_rack=first_rack,
                      progress=lambda m: None, addons=addons, **(TUNED if tuned else {}))
    say(f"{key}: simulator up: {racks} rack(s) of 18 nodes (racks {first_rack}..{first_rack + racks - 1}), "
        f"apiserver port {cp.ports.apiserver}, {'tuned' if tuned else 'default'} scheduler settings")
    t0 = time.monotonic()
    try:
        cp.up()
        results[f"{key}_sim_up_s"] = time.monotonic() - t0
        client = Client(config=KubeConfig.from_file(str(cp.kubeconfig)), field_manager="bench-e2e")
        proj = project_from_fixture(FIXTURE, tmp / key / "proj", kubeconfig=cp.kubeconfig, venv=Path(sys.prefix))
        proj.run("stack", "init", "bench")
        # Some config from the start: with none, our language host passes PULUMI_CONFIG=null (a nil
        # Go map) and the program fails before it runs.
        proj.run("config", "set", "prefix", prefix)
        say(f"{key}: simulator up in {results[f'{key}_sim_up_s']:.1f}s")
        yield Sim(key, prefix, cp, client, proj, [rack_name(r) for r in range(first_rack, first_rack + racks)])
        client.close()
    finally:
        say(f"{key}: simulator down")
        cp.down()
        left = leftover_processes(cp)
        if left:
            say(f"{key}: {len(left)} process(es) of this simulator outlived `down`; stopping them: {left}")
            for pid in left:
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
            time.sleep(2)
            for pid in leftover_processes(cp):
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        results[f"{key}_leftover_processes"] = len(left)


def driver_processes(cp: ControlPlane) -> dict[str, list[int]]:
    """The driver's processes of this simulator by role (agent, imex, controller): `python -m
    nvlfabric <role>` whose working directory lies in the simulator's state."""
    roles: dict[str, list[int]] = {"agent": [], "imex": [], "controller": []}
    for pid in leftover_processes(cp):
        try:
            argv = (Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [a.decode(errors="replace") for a in argv if a]
        if "nvlfabric" in words and words[-1] in roles:
            roles[words[-1]].append(pid)
    return roles


def _rss_mb(pid: int) -> float:
    with suppress(OSError):
        for line in (Path("/proc") / str(pid) / "status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _cpu_s(pid: int) -> float:
    with suppress(OSError, IndexError, ValueError):
        fields = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return 0.0


def cpu_by_role(cp: ControlPlane) -> dict[str, float]:
    """CPU seconds so far of the simulator's processes, by role: the control plane's own (by
    name), the driver's (agent, imex, controller), and everything else it started (imex daemons,
    IMEX stand-ins, ...) as `other`."""
    out: dict[str, float] = {}
    state = cp.load_state()
    own = {rec.pid: rec.name for rec in state.processes} if state else {}
    for pid, name in own.items():
        out[name] = out.get(name, 0.0) + _cpu_s(pid)
    seen = set(own)
    for role, pids in driver_processes(cp).items():
        out[role] = sum(_cpu_s(pid) for pid in pids)
        seen.update(pids)
    out["other"] = sum(_cpu_s(pid) for pid in leftover_processes(cp) if pid not in seen)
    return out


def status_conflicts(cp: ControlPlane) -> int:
    """Conflicts (409) the agents and the controller logged writing ComputeDomain status."""
    n = 0
    for log in cp.state_dir.glob("nodes/*/pods/*/*.log"):
        with suppress(OSError):
            n += sum(1 for line in log.read_text(errors="replace").splitlines()
                     if "onflict" in line and "ComputeDomain" in line)
    return n


def install_driver(sim: Sim, results: dict[str, float]) -> None:
    """`pulumi up` of the driver alone, then wait until every node can prepare channel claims."""
    say(f"{sim.key}: pulumi up (driver only; not timed)")
    t0 = time.monotonic()
    sim.proj.run("up", "--yes", "--skip-preview", timeout=TIMEOUT_S)
    results[f"{sim.key}_driver_up_s"] = time.monotonic() - t0
    nodes = sim.cp.nodes()
    last = ""
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        agents = [p for p in sim.client.list(Pod, namespace="nvlfabric-system")
                  if p.status is not None and p.status.phase == "Running"]
        labelled = list(sim.client.list(Node, labels={CLIQUE_LABEL: None}))
        cliques = {n.metadata.labels[CLIQUE_LABEL] for n in labelled if n.metadata and n.metadata.labels}
        pools = {(s.metadata.labels or {}).get(POOL_LABEL)
                 for s in sim.client.list(ResourceSlice, labels={POOL_LABEL: None}) if s.metadata}
        registered = sum(1 for n in nodes if registry_sockets(n.registry_dir))
        want = 2 * len(nodes) + 2  # an agent and an IMEX keeper per node, two controller replicas
        line = (f"{len(agents)}/{want} driver pods running, {len(labelled)}/{len(nodes)} nodes labelled "
                f"with a clique, {registered}/{len(nodes)} plugins registered, {len(pools)}/{len(sim.racks)} "
                "clique pools")
        if line != last:
            say(f"{sim.key}: {line}")
            last = line
        if (len(agents) >= want and len(labelled) == len(nodes) and registered == len(nodes)
                and len(cliques) == len(sim.racks) and len(pools) == len(sim.racks)):
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"bench e2e: the driver is not ready after {TIMEOUT_S:.0f}s: {line}")
        time.sleep(1)
    time.sleep(1)  # the kubelet scans its plugin registry every 0.5 s: let the last one register
    results[f"{sim.key}_driver_ready_s"] = time.monotonic() - t0
    say(f"{sim.key}: driver ready {results[f'{sim.key}_driver_ready_s']:.1f}s after its pulumi up started")


def scheduling_failures(client: Client) -> tuple[int, int]:
    """(failed scheduling attempts, of which lost races on a shared claim's reservedFor)."""
    failed = conflicts = 0
    for ev in client.list(Event, namespace=NAMESPACE):
        if ev.reason != "FailedScheduling":
            continue
        n = ev.count or 1
        failed += n
        if "add reservation to claim" in (ev.message or ""):
            conflicts += n
    return failed, conflicts


def timed_up(sim: Sim, pods_per_domain: int, num_nodes: int | None, results: dict[str, float], *,
             gpus_per_pod: int = 1, multi_rack: bool = False, pin_racks: bool = True,
             kind: str = "Job") -> dict[str, float]:
    """Set the workload config, run `pulumi up` and watch the cluster until every domain is Ready and
    every pod runs. Returns the milestones (seconds after `pulumi up` started) and placement counts.
    `multi_rack`: one MultiClique domain (a claim and a Job per rack) instead of a domain per rack."""
    p = sim.proj
    p.run("config", "set", "racks", ",".join(sim.racks))
    p.run("config", "set", "podsPerDomain", str(pods_per_domain))
    p.run("config", "set", "gpusPerPod", str(gpus_per_pod))
    p.run("config", "set", "multiRack", "true" if multi_rack else "false")
    p.run("config", "set", "pinRacks", "true" if pin_racks else "false")
    p.run("config", "set", "kind", kind)
    if num_nodes:
        p.run("config", "set", "numNodes", str(num_nodes))
    want_pods = pods_per_domain * len(sim.racks)
    want_domains = 1 if multi_rack else len(sim.racks)
    want_claims = len(sim.racks)  # a claim (and a Job) per rack either way
    log_path = p.workdir / "up.log"
    say(f"{sim.key}: pulumi up: {want_domains} ComputeDomain(s), {want_pods} one-GPU pods (the timer starts)")
    marks: dict[str, float] = {}

    def mark(key: str, cond: bool, t: float) -> None:
        if cond and key not in marks:
            marks[key] = t
            say(f"{sim.key}:   {key.removesuffix('_s').replace('_', ' ')} at {t:.1f}s")

    controllers = driver_processes(sim.cp)["controller"]
    cpu0 = sum(_cpu_s(pid) for pid in controllers)
    cpu_roles0 = cpu_by_role(sim.cp)
    t0 = time.monotonic()
    with log_path.open("w") as log:
        up = subprocess.Popen(["pulumi", "up", "--yes", "--skip-preview"], cwd=p.workdir, env=p.env,
                              stdout=log, stderr=subprocess.STDOUT, text=True)
    try:
        last = ""
        while True:
            now = time.monotonic() - t0
            if up.poll() is not None and "up_returned_s" not in marks:
                mark("up_returned_s", True, now)
                if up.returncode != 0:
                    raise SystemExit(f"bench e2e: pulumi up failed (exit {up.returncode}):\n"
                                     + log_path.read_text()[-4000:])
            c = sim.client
            try:
                domains: dict[str, dict[str, Any]] = {
                    str(cd.metadata.name): dict(cd.status or {})  # type: ignore[arg-type]
                    for cd in c.list(ComputeDomainResource, namespace=NAMESPACE) if cd.metadata}
                jobs = list(c.list(Job, namespace=NAMESPACE))
                claims = list(c.list(ResourceClaim, namespace=NAMESPACE))
                pods = list(c.list(Pod, namespace=NAMESPACE))
            except httpx2.HTTPError as exc:  # an API server too busy to answer the bench's own reads
                say(f"{sim.key}: [{now:5.1f}s] reading the cluster failed ({type(exc).__name__}); polling again")
                if now > TIMEOUT_S:
                    raise SystemExit(f"bench e2e: {sim.key}: no answer from the API server after {now:.0f}s") from exc
                continue
            scheduled = [x for x in pods if x.spec and x.spec.nodeName]
            running = [x for x in pods if x.status and x.status.phase == "Running"]
            allocated = [x for x in claims if x.status and x.status.allocation]
            entries = sum(len(st.get("nodes") or []) for st in domains.values())
            ready_entries = sum(1 for st in domains.values() for n in st.get("nodes") or [] if n.get("ready"))
            ready = [n for n, st in domains.items() if st.get("phase") == "Ready"]
            mark("cds_created_s", len(domains) == want_domains, now)
            mark("jobs_created_s", len(jobs) == want_claims, now)
            mark("claims_allocated_s", len(allocated) == want_claims, now)
            mark("first_pod_running_s", bool(running), now)
            mark("pods_created_s", len(pods) == want_pods, now)
            mark("pods_scheduled_s", len(scheduled) == want_pods, now)
            if num_nodes:
                per_domain = num_nodes * (len(sim.racks) if multi_rack else 1)
                mark("domain_nodes_reported_s", all(len(st.get("nodes") or []) >= per_domain
                                                    for st in domains.values()) and len(domains) == want_domains,
                     now)
            mark("pods_running_s", len(running) == want_pods, now)
            mark("domains_ready_s", len(ready) == want_domains, now)
            line = (f"{len(pods)}/{want_pods} pods created, {len(scheduled)} scheduled, {len(running)} running; "
                    f"{len(allocated)}/{want_claims} claims allocated; {ready_entries}/{entries} domain node "
                    f"entries ready; {len(ready)}/{want_domains} domains Ready")
            if line != last:
                say(f"{sim.key}: [{now:5.1f}s] {line}")
                last = line
            if all(k in marks for k in ("pods_running_s", "domains_ready_s", "up_returned_s")):
                break
            if now > TIMEOUT_S:
                not_ready = {n: (st.get("phase"), (st.get("conditions") or [{}])[0].get("message"))
                             for n, st in domains.items() if st.get("phase") != "Ready"}
                raise SystemExit(f"bench e2e: {sim.key} not done after {TIMEOUT_S:.0f}s: {line}; "
                                 f"domains not Ready: {not_ready}")
            time.sleep(max(0.0, POLL_S - (time.monotonic() - t0 - now)))
    finally:
        if up.poll() is None:
            up.terminate()
            up.wait(30)
    marks["controller_cpu_s"] = sum(_cpu_s(pid) for pid in controllers) - cpu0
    for role, cpu in cpu_by_role(sim.cp).items():  # where the 2 cores went during the timed up
        marks[f"cpu_{role.replace('-', '_')}_s"] = cpu - cpu_roles0.get(role, 0.0)
    roles = driver_processes(sim.cp)
    marks["agents_rss_sum_mb"] = sum(_rss_mb(pid) for pid in roles["agent"])
    marks["keepers_rss_sum_mb"] = sum(_rss_mb(pid) for pid in roles["imex"])
    marks["status_conflicts"] = status_conflicts(sim.cp)
    per_node = Counter(x.spec.nodeName for x in pods if x.spec)
    marks["nodes_used"] = len(per_node)
    marks["max_pods_per_node"] = max(per_node.values())
    marks["domain_nodes"] = entries
    marks["failed_scheduling"], marks["reservation_conflicts"] = scheduling_failures(sim.client)
    # Where each claim (a domain's, or a MultiClique domain's group's) landed: one clique each.
    cliques = {(n.metadata.name if n.metadata else ""): (n.metadata.labels or {}).get(CLIQUE_LABEL)
               for n in sim.client.list(Node) if n.metadata}
    per_claim: dict[str, set[str | None]] = {}
    for x in pods:
        if x.spec and x.spec.nodeName:
            for rc in x.spec.resourceClaims or []:
                per_claim.setdefault(rc.resourceClaimName or "", set()).add(cliques.get(x.spec.nodeName))
    marks["claims_split_across_cliques"] = sum(1 for c in per_claim.values() if len(c) > 1)
    marks["cliques_used"] = len({c for cs in per_claim.values() for c in cs})
    for k, v in marks.items():
        results[f"{sim.key}_{k}"] = v
    return marks


def cd18(tmp: Path, results: dict[str, float], *, tuned: bool) -> None:
    key = "cd18_tuned" if tuned else "cd18"
    with simulator(key, "cd18", tmp, racks=1, first_rack=CD18_RACK, results=results, tuned=tuned) as sim:
        install_driver(sim, results)
        marks = timed_up(sim, pods_per_domain=72, num_nodes=18, results=results)
        results[f"{key}_ready_s"] = max(marks["domains_ready_s"], marks["pods_running_s"])
        if marks["domain_nodes"] != 18 or marks["nodes_used"] != 18 or marks["max_pods_per_node"] != 4:
            raise SystemExit(f"bench e2e: {key}: expected 18 nodes x 4 pods and 18 domain node entries, "
                             f"got {marks}")


def one_job(name: str, racks: int, first_rack: int, tmp: Path, results: dict[str, float], *, tuned: bool,
            kind: str = "Job", queue: str = "") -> None:
    """18 pods x 4 GPUs per rack over `racks` racks as ONE workload: a MultiClique domain, one BoundJob
    (of `kind`: a JobSet runs with the simulator's jobset addon; queued in Kueue's `queue`)."""
    key = f"{name}_tuned" if tuned else name
    addons = (("jobset",) if kind == "JobSet" else ()) + (("kueue",) if queue else ())
    with simulator(key, name.replace("_", "-"), tmp, racks=racks, first_rack=first_rack, results=results,
                   tuned=tuned, addons=addons) as sim:
        install_driver(sim, results)
        if queue:
            kueue_queue(sim.client, queue, gpus=racks * 18 * 4)
        sim.proj.run("config", "set", "queueName", queue)
        marks = timed_up(sim, pods_per_domain=18, num_nodes=18, results=results, gpus_per_pod=4, multi_rack=True,
                         kind=kind)
        results[f"{key}_running_s"] = max(marks["pods_running_s"], marks["domains_ready_s"])
        if marks["claims_split_across_cliques"] or marks["cliques_used"] != racks or marks["nodes_used"] != 18 * racks:
            raise SystemExit(f"bench e2e: {key}: expected {racks} groups in {racks} cliques on {18 * racks} nodes, "
                             f"got {marks}")


def job288(tmp: Path, results: dict[str, float], *, tuned: bool) -> None:
    """72 pods x 4 GPUs over 4 racks as ONE workload."""
    one_job("job288", 4, JOB288_FIRST_RACK, tmp, results, tuned=tuned)


def kueue_queue(client: Client, name: str, *, gpus: int) -> None:
    """A LocalQueue `name` in the bench's namespace, its ClusterQueue with quota for `gpus` GPUs
    and nvlfabric's AdmissionCheck (what a platform sets up once)."""
    from lightkube.generic_resource import create_global_resource, create_namespaced_resource
    from lightkube.models.meta_v1 import ObjectMeta

    from nvlfabric.api.names import PLACEMENT_CHECK_CONTROLLER

    kueue = ("kueue.x-k8s.io", "v1beta1")
    flavor = create_global_resource(*kueue, "ResourceFlavor", "resourceflavors")
    check = create_global_resource(*kueue, "AdmissionCheck", "admissionchecks")
    cluster_queue = create_global_resource(*kueue, "ClusterQueue", "clusterqueues")
    local_queue = create_namespaced_resource(*kueue, "LocalQueue", "localqueues")
    client.create(flavor(metadata=ObjectMeta(name="gb200"), spec={}))
    client.create(check(metadata=ObjectMeta(name="nvlfabric-placement"),
                        spec={"controllerName": PLACEMENT_CHECK_CONTROLLER}))
    client.create(cluster_queue(metadata=ObjectMeta(name=name), spec={
        "namespaceSelector": {}, "admissionChecks": ["nvlfabric-placement"],
        "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
            {"name": "gb200", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": gpus}]}]}]}))
    client.create(local_queue(metadata=ObjectMeta(name=name, namespace=NAMESPACE), spec={"clusterQueue": name}))


def job288_kueue(tmp: Path, results: dict[str, float], *, tuned: bool) -> None:
    """job288 as a JobSet queued in Kueue, admitted through nvlfabric's AdmissionCheck."""
    one_job("job288_kueue", 4, JOB288_FIRST_RACK, tmp, results, tuned=tuned, kind="JobSet", queue="bench")


def job288_jobset(tmp: Path, results: dict[str, float], *, tuned: bool) -> None:
    """job288 as a JobSet, run by JobSet's own controller."""
    one_job("job288_jobset", 4, JOB288_FIRST_RACK, tmp, results, tuned=tuned, kind="JobSet")


def racks8(tmp: Path, results: dict[str, float], *, tuned: bool) -> None:
    """8 whole-rack domains (18 pods x 4 GPUs each), not pinned to racks, in one pulumi up on 8 racks."""
    key = "racks8_tuned" if tuned else "racks8"
    with simulator(key, "racks8", tmp, racks=8, first_rack=RACKS8_FIRST_RACK, results=results,
                   tuned=tuned) as sim:
        install_driver(sim, results)
        marks = timed_up(sim, pods_per_domain=18, num_nodes=18, results=results, gpus_per_pod=4, pin_racks=False)
        results[f"{key}_domains_running_s"] = max(marks["pods_running_s"], marks["domains_ready_s"])
        if marks["claims_split_across_cliques"] or marks["cliques_used"] != 8:
            raise SystemExit(f"bench e2e: {key}: expected 8 domains in 8 cliques, got {marks}")


def superpod(tmp: Path, results: dict[str, float], *, tuned: bool) -> None:
    """576 GPUs as ONE job: 144 pods x 4 GPUs, a MultiClique domain of 8 cliques, on 8 racks."""
    one_job("superpod", 8, RACKS8_FIRST_RACK, tmp, results, tuned=tuned)


def job256(tmp: Path, results: dict[str, float], *, tuned: bool) -> None:
    key = "job256_tuned" if tuned else "job256"
    with simulator(key, "job256", tmp, racks=4, first_rack=JOB256_FIRST_RACK, results=results,
                   tuned=tuned) as sim:
        install_driver(sim, results)
        timed_up(sim, pods_per_domain=64, num_nodes=16, results=results)
        results[f"{key}_running_s"] = results[f"{key}_pods_running_s"]
        results["job256_domains"] = len(sim.racks)


PHASES = [  # (label, from milestone, to milestone)
    ("pulumi: engine, program, provider create", None, "cds_created_s"),
    ("pulumi: domain create returned → Job created", "cds_created_s", "jobs_created_s"),
    ("Job controller: every pod created", "jobs_created_s", "pods_created_s"),
    ("scheduler: last pod bound (claim reservedFor)", "pods_created_s", "pods_scheduled_s"),
    ("kubelets + agents: last pod running", "pods_scheduled_s", "pods_running_s"),
]


def profile(results: dict[str, float], key: str) -> None:
    if f"{key}_pods_running_s" not in results:
        return
    print(f"\n{key}: where the time goes (seconds; each mark ±{POLL_S} s)")
    for label, start, end in PHASES:
        t0 = results.get(f"{key}_{start}", 0.0) if start else 0.0
        t1 = results.get(f"{key}_{end}")
        if t1 is not None:
            print(f"  {label:50} {t0:6.1f} → {t1:6.1f}  ({t1 - t0:5.1f})")
    print(f"  {'failed scheduling attempts (reservedFor conflicts)':50} {results.get(f'{key}_failed_scheduling'):.0f} "
          f"({results.get(f'{key}_reservation_conflicts'):.0f})")


def main() -> int:
    only = sys.argv[1:] or ["cd18", "job256", "job288", "job288_jobset", "job288_kueue"]
    scenarios = {"cd18": cd18, "job256": job256, "job288": job288, "job288_jobset": job288_jobset,
                 "job288_kueue": job288_kueue,
                 "racks8": racks8, "superpod": superpod}
    results: dict[str, float] = {}

    def save() -> None:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps({k: round(v, 2) for k, v in results.items()}, indent=2) + "\n")

    # A stopped benchmark (SIGTERM, e.g. from `timeout`) unwinds like an error, so each scenario's
    # simulator is taken down instead of left running.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="nvlbe-", dir="/tmp") as tmp:
        for name in only:
            for tuned in (False, True) if RUN_TUNED else (False,):
                scenarios[name](Path(tmp), results, tuned=tuned)
                save()  # what is measured so far survives a later failure
    print("\njob256 = 256 one-GPU pods as 4 ComputeDomains (a ComputeDomain is one NVLink clique, one rack) "
          "x 64 pods, in one pulumi up")
    print("*_tuned = scheduler 500 QPS/1000 burst, pod back-off 1 s; controller manager 200 QPS/400 burst")
    for k, v in sorted(results.items()):
        goal = GOALS.get(k)
        verdict = "" if goal is None else f"  (goal ≤ {goal:g}: {'met' if v <= goal else 'MISSED'})"
        print(f"{k:38} {round(v, 2)}{verdict}")
    for key in ("cd18", "cd18_tuned", "job256", "job256_tuned", "job288", "job288_tuned", "job288_jobset",
                "job288_jobset_tuned", "job288_kueue", "job288_kueue_tuned", "racks8", "racks8_tuned", "superpod",
                "superpod_tuned"):
        profile(results, key)
    return 0


if __name__ == "__main__":
    sys.exit(main())
