"""Scale benchmark → bench/results/scale.json: how nvlfabric's cost grows with the fleet.

`python bench/scale.py [RACKS ...]` (default 8 16; `python bench/scale.py 8 16 32 64` for the
whole curve). For each size, a simulator of its own with RACKS NVL72 racks of 18 nodes: the first
rack runs nvlfabric's real node agents and IMEX keepers, the others are hollow
(nvlfabric/sim/kubelet/hollow.py: the same API objects, no per-node processes), so 64 racks
(1,152 nodes) fit on one 2-core machine. Not timed: the driver and an `Nvl72Rack` per rack
(`pulumi up` of bench/fixtures/scale), until every node's agent labelled its clique and every
clique's pool is published. Timed, from ONE `pulumi up`: the workloads, which take every GPU
once: a whole-rack ComputeDomain with an 18-pod x 4-GPU BoundJob on each of RACKS-8 racks, and
one MultiClique job of 8 clique groups (144 pods x 4 GPUs) on the other 8. So claims, Jobs, pods
and GPUs double exactly with the racks. Nothing is pinned: nvlfabric places every group.

The control plane is tuned as Kubernetes' own scalability tests tune kubemark's (the controller
manager and the scheduler at 100 QPS / 100 burst instead of 20/30 and 50/100): at the defaults the
Job controller alone needs 58 s to create 1,152 pods. Its Go processes run with GOGC=400
(NVLFABRIC_BENCH_SCALE_GOGC; 100 is Go's default): this machine has memory to spare and 2 cores.
Pulumi runs as a user's CI runs it: its defaults. Everything else is upstream's default.

Figures per size N (`racks<N>_*`):
- running_s              from `pulumi up` until every pod runs and every domain is Ready (goal at
                         64 racks: ≤ 60 s); the milestones on the way (cds_created_s,
                         claims_allocated_s, pods_created_s, pods_scheduled_s, pods_running_s,
                         domains_ready_s, up_returned_s)
- status_conflicts       409 answers to ComputeDomain writes (the API server's metrics; goal 0)
- failed_scheduling      FailedScheduling events (goal 0)
- nodes_not_ready        NodeNotReady events over the whole run, driver install included: nodes
                         whose heartbeats did not keep up (goal 0)
- lease_interval_s       how often a node renewed its Lease during the timed up, from the API
                         server's count of Lease requests (goal ≤ 11: the kubelet's 10 s)
- controller_cpu_s, controller_peak_rss_mb   both controller replicas, during the timed up
- apiserver_requests     every request the API server answered during the timed up (its
                         `apiserver_request_total`); of them apiserver_lease_requests, the nodes'
                         heartbeats (nodes x seconds, whatever runs), and
                         apiserver_workload_requests, the rest; controller_requests, the
                         controller's own (from an audit log of its service account); the largest
                         kinds as apiserver_requests_<verb>_<resource> / controller_requests_...
- idle_cpu_cores         what the idle fleet (heartbeats, resyncs) burns before the timed up, in
                         cores, and per component (idle_cpu_<component>_cores)
- cpu_<component>_s      where the 2 cores went during the timed up
- hollow_racks           racks without agent processes (the bench prints which)
- preview_s, preview_report_s   `pulumi preview` of the workloads (the racks and driver exist)
                         and `nvlfabric preview-report` of its JSON, against the cluster
Across sizes: controller_cpu_growth_per_doubling, apiserver_requests_growth_per_doubling,
apiserver_workload_requests_growth_per_doubling, controller_requests_growth_per_doubling (the
largest ratio between consecutive sizes that double; goal ≤ 2.2: linear is 2; figures that also
grow with the run's length, as CPU seconds and heartbeats do, grow faster where the run takes
longer), and preview_racks64_s, preview_report_racks64_s (goals 15 s and 5 s).

NVLFABRIC_BENCH_SCALE_TIMEOUT_S (default 900) bounds each wait.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import resource
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.e2e import _cpu_s, cpu_by_role, driver_processes, leftover_processes  # noqa: E402
from nvlfabric.sim.nvml.topology import rack_name  # noqa: E402
from nvlfabric.sim.processes import run_owned  # noqa: E402
from nvlfabric.testbed.controlplane import ControlPlane, free_ports  # noqa: E402
from nvlfabric.testbed.pulumi_cli import PulumiProject, project_from_fixture  # noqa: E402

RESULTS = REPO / "bench" / "results" / "scale.json"
FIXTURE = REPO / "bench" / "fixtures" / "scale"
FIRST_RACK = 20  # racks 20..83 (127.10.20.x ...): away from the demo's, the tests' and bench/e2e.py's
JOB_RACKS = 8
POLL_S = 1.0
IDLE_S = 20.0
TIMEOUT_S = float(os.environ.get("NVLFABRIC_BENCH_SCALE_TIMEOUT_S", "900"))
PARALLEL = [f"--parallel={os.environ['NVLFABRIC_BENCH_SCALE_PARALLEL']}"] \
    if os.environ.get("NVLFABRIC_BENCH_SCALE_PARALLEL") else []
"""`pulumi up --parallel` (NVLFABRIC_BENCH_SCALE_PARALLEL); unset: Pulumi's default, 4 per CPU (8 here)."""
CONTROLLER_USER = "system:serviceaccount:nvlfabric-system:nvlfabric-controller"
FLEET: dict[str, Any] = {
    "scheduler_config": {"clientConnection": {"qps": 100, "burst": 100}},
    "extra_args": {"kube-controller-manager": ["--kube-api-qps=100", "--kube-api-burst=100"]},
}
GOGC = os.environ.get("NVLFABRIC_BENCH_SCALE_GOGC", "400")
"""The control plane's Go garbage collector target (GOGC; "100" is Go's default). One machine of 2
cores and 24 GB runs a 1,152-node control plane here: memory to spare, CPU not. The API server
spent 17 % of its CPU in GC at 64 racks; at 400 the run needs ~25 % less CPU in all."""
GOALS = {"running_s": 60.0, "status_conflicts": 0, "failed_scheduling": 0, "nodes_not_ready": 0,
         "lease_interval_s": 11.0}
_start = time.monotonic()


def say(msg: str) -> None:
    print(f"[bench scale {time.monotonic() - _start:6.1f}s] {msg}", flush=True)


class Api:
    """Raw reads of the API server (JSON, no client models: the bench's own polling must stay
    cheap next to what it measures)."""

    def __init__(self, cp: ControlPlane) -> None:
        state = cp.load_state()
        assert state is not None
        self.server, self.token = cp.server, state.token
        self.ctx = ssl.create_default_context(cafile=str(cp.state_dir / "pki" / "ca.crt"))

    def get(self, path: str, *, raw: bool = False) -> Any:
        req = urllib.request.Request(self.server + path, headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(req, timeout=60, context=self.ctx) as resp:
            body = resp.read()
        return body.decode() if raw else json.loads(body)

    def items(self, path: str) -> list[dict[str, Any]]:
        return list(self.get(path)["items"])


class Watch:
    """What the bench watches of one kind: a list, then a watch stream from its resourceVersion, each
    object kept as `slim(obj)` by uid. Polling lists of 1,152 pods every second cost the API server
    more than some of what it measures; a watch costs it one event per change."""

    def __init__(self, api: Api, path: str, slim: Any) -> None:
        self.api, self.path, self.slim = api, path, slim
        self.items: dict[str, Any] = {}
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        threading.Thread(target=self._run, daemon=True, name=f"watch {path}").start()

    def _run(self) -> None:
        while not self.stopped.is_set():
            try:
                listing = self.api.get(self.path)
                with self.lock:
                    self.items = {o["metadata"]["uid"]: self.slim(o) for o in listing["items"]}
                rv = listing["metadata"]["resourceVersion"]
                sep = "&" if "?" in self.path else "?"
                url = f"{self.api.server}{self.path}{sep}watch=1&resourceVersion={rv}&timeoutSeconds=300"
                req = urllib.request.Request(url, headers={"Authorization": f"Bearer {self.api.token}"})
                with urllib.request.urlopen(req, timeout=330, context=self.api.ctx) as resp:
                    for line in resp:
                        if self.stopped.is_set():
                            return
                        ev = json.loads(line)
                        obj = ev.get("object") or {}
                        uid = (obj.get("metadata") or {}).get("uid")
                        if ev.get("type") == "ERROR" or not uid:
                            break
                        with self.lock:
                            if ev["type"] == "DELETED":
                                self.items.pop(uid, None)
                            else:
                                self.items[uid] = self.slim(obj)
            except (OSError, ValueError, KeyError):
                time.sleep(0.5)

    def values(self) -> list[Any]:
        with self.lock:
            return list(self.items.values())


def request_counts(api: Api) -> Counter[tuple[str, str, str]]:
    """The API server's `apiserver_request_total`, summed by (verb, resource, code)."""
    out: Counter[tuple[str, str, str]] = Counter()
    for line in api.get("/metrics", raw=True).splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels, _, value = line.rpartition(" ")
        inner = labels[len("apiserver_request_total{"):-1]
        fields = dict(part.split("=", 1) for part in inner.split(",") if "=" in part)
        key = tuple(fields.get(k, "").strip('"') for k in ("verb", "resource", "code"))
        out[key] += int(float(value))  # type: ignore[index]
    return out


def audit_policy(path: Path) -> Path:
    """Log the controller's requests (who, verb, resource) and nothing else."""
    path.write_text(json.dumps({
        "apiVersion": "audit.k8s.io/v1", "kind": "Policy",
        "omitStages": ["RequestReceived", "ResponseStarted", "Panic"],
        "rules": [{"level": "Metadata", "users": [CONTROLLER_USER]}, {"level": "None"}]}))
    return path


def controller_requests(log: Path, since: float, until: float) -> Counter[tuple[str, str]]:
    """The controller's requests answered between two wall-clock times, by (verb, resource)."""
    out: Counter[tuple[str, str]] = Counter()
    if not log.exists():
        return out
    for line in log.read_text(errors="replace").splitlines():
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        stamp = ev.get("stageTimestamp", "")
        try:
            t = time.mktime(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone
        except ValueError:
            continue
        if since <= t <= until:
            ref = ev.get("objectRef") or {}
            resource = ref.get("resource", "") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
            out[(ev.get("verb", ""), resource)] += 1
    return out


def wait_driver(api: Api, racks: int, nodes: int) -> None:
    """Until every node's agent (real or hollow) labelled its clique, every DaemonSet pod runs and
    every clique's channel pool exists."""
    deadline, last = time.monotonic() + TIMEOUT_S, ""
    while True:
        labelled = api.items("/api/v1/nodes?labelSelector=nvlfabric.io%2Fclique")
        daemonsets = api.items("/apis/apps/v1/namespaces/nvlfabric-system/daemonsets")
        available = sum(d.get("status", {}).get("numberAvailable", 0) for d in daemonsets)
        pools = api.items("/apis/resource.k8s.io/v1/resourceslices?labelSelector=nvlfabric.io%2Fpool")
        cliques = {(s.get("metadata", {}).get("labels") or {}).get("nvlfabric.io/pool") for s in pools}
        line = (f"{len(labelled)}/{nodes} nodes labelled with a clique, {available}/{2 * nodes} agent and keeper "
                f"pods available, {len(cliques)}/{racks} clique pools")
        if line != last:
            say(f"  {line}")
            last = line
        if len(labelled) == nodes and available == 2 * nodes and len(cliques) == racks:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"bench scale: the driver is not ready after {TIMEOUT_S:.0f}s: {line}")
        time.sleep(2)


def timed_up(proj: PulumiProject, api: Api, want_pods: int, want_domains: int, want_claims: int) -> dict[str, float]:
    marks: dict[str, float] = {}

    def mark(key: str, cond: bool, t: float) -> None:
        if cond and key not in marks:
            marks[key] = t
            say(f"    {key.removesuffix('_s').replace('_', ' ')} at {t:.1f}s")

    log_path = proj.workdir / "up.log"
    children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    # --json: the engine's events, one per line with their times (where Pulumi's time goes).
    with log_path.open("w") as log, (proj.workdir / "events.jsonl").open("w") as events:
        up = subprocess.Popen(["pulumi", "up", "--yes", "--skip-preview", "--json", *PARALLEL], cwd=proj.workdir,
                              env=proj.env, stdout=events, stderr=log, text=True, start_new_session=True)
    last = ""
    watches = [Watch(api, "/apis/nvlfabric.io/v1alpha1/namespaces/default/computedomains",
                     lambda o: (o.get("status") or {}).get("phase")),
               Watch(api, "/apis/batch/v1/namespaces/default/jobs", lambda o: True),
               Watch(api, "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims",
                     lambda o: bool((o.get("status") or {}).get("allocation"))),
               Watch(api, "/api/v1/namespaces/default/pods",
                     lambda o: (bool((o.get("spec") or {}).get("nodeName")), (o.get("status") or {}).get("phase")))]
    try:
        while True:
            now = time.monotonic() - t0
            if up.poll() is not None and "up_returned_s" not in marks:
                mark("up_returned_s", True, now)
                if up.returncode != 0:
                    raise SystemExit(f"bench scale: pulumi up failed (exit {up.returncode}):\n"
                                     + log_path.read_text()[-2000:]
                                     + (proj.workdir / "events.jsonl").read_text()[-3000:])
            domains, jobs, claims, pods = (w.values() for w in watches)
            scheduled = sum(1 for bound, _ in pods if bound)
            running = sum(1 for _, phase in pods if phase == "Running")
            allocated = sum(1 for c in claims if c)
            ready = sum(1 for d in domains if d == "Ready")
            mark("cds_created_s", len(domains) == want_domains, now)
            mark("jobs_created_s", len(jobs) == want_claims, now)
            mark("claims_allocated_s", allocated == want_claims, now)
            mark("pods_created_s", len(pods) == want_pods, now)
            mark("pods_scheduled_s", scheduled == want_pods, now)
            mark("pods_running_s", running == want_pods, now)
            mark("domains_ready_s", ready == want_domains, now)
            line = (f"{len(pods)}/{want_pods} pods created, {scheduled} scheduled, {running} running; "
                    f"{allocated}/{want_claims} claims allocated; {ready}/{want_domains} domains Ready")
            if line != last:
                say(f"  [{now:5.1f}s] {line}")
                last = line
            if all(k in marks for k in ("pods_running_s", "domains_ready_s", "up_returned_s")):
                break
            if now > TIMEOUT_S:
                raise SystemExit(f"bench scale: not done after {TIMEOUT_S:.0f}s: {line}")
            time.sleep(max(0.0, POLL_S - (time.monotonic() - t0 - now)))
    finally:
        for w in watches:
            w.stopped.set()
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGTERM)
            up.wait(30)
    marks["running_s"] = max(marks["pods_running_s"], marks["domains_ready_s"])
    children = resource.getrusage(resource.RUSAGE_CHILDREN)  # pulumi and the plugins it waited for
    marks["cpu_pulumi_s"] = (children.ru_utime + children.ru_stime) - (children0.ru_utime + children0.ru_stime)
    return marks


def _hwm_mb(pid: int) -> float:
    try:
        for line in (Path("/proc") / str(pid) / "status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def run_size(racks: int, tmp: Path, results: dict[str, float]) -> None:
    key = f"racks{racks}"
    state = tmp / key / "sim"
    state.mkdir(parents=True)
    policy = audit_policy(tmp / key / "audit-policy.json")
    audit_log = state / "logs" / "audit.log"
    fleet_args = dict(FLEET["extra_args"])
    fleet_args["kube-apiserver"] = [f"--audit-policy-file={policy}", f"--audit-log-path={audit_log}",
                                    "--audit-log-format=json"]
    hollow = racks - 1
    cp = ControlPlane(state_dir=state, ports=free_ports(), racks=racks, first_rack=FIRST_RACK, hollow_racks=hollow,
                      scheduler_config=FLEET["scheduler_config"], extra_args=fleet_args, progress=lambda m: None,
                      extra_env={c: {"GOGC": GOGC} for c in ("etcd", "kube-apiserver", "kube-scheduler",
                                                             "kube-controller-manager")})
    names = [rack_name(r) for r in range(FIRST_RACK, FIRST_RACK + racks)]
    say(f"{key}: simulator up: {racks} racks ({18 * racks} nodes); real agents on {names[0]}, hollow: "
        f"{names[1]}..{names[-1]}" if hollow else f"{key}: simulator up: {racks} rack(s), none hollow")
    results[f"{key}_hollow_racks"] = hollow
    results[f"{key}_control_plane_gogc"] = float(GOGC)
    t0 = time.monotonic()
    try:
        cp.up()
        results[f"{key}_sim_up_s"] = time.monotonic() - t0
        api = Api(cp)
        proj = project_from_fixture(FIXTURE, tmp / key / "proj", kubeconfig=cp.kubeconfig, venv=Path(sys.prefix))
        proj.run("stack", "init", "bench")
        proj.run("config", "set", "racks", ",".join(names))
        proj.run("config", "set", "jobRacks", str(JOB_RACKS))
        say(f"{key}: pulumi up of the driver and {racks} Nvl72Racks (not timed)")
        t1 = time.monotonic()
        proj.run("up", "--yes", "--skip-preview", timeout=TIMEOUT_S)
        results[f"{key}_driver_up_s"] = time.monotonic() - t1
        wait_driver(api, racks, 18 * racks)
        results[f"{key}_driver_ready_s"] = time.monotonic() - t1
        proj.run("config", "set", "workloads", "true")
        # What the idle fleet costs (heartbeats, controllers' resyncs), before any workload: the
        # share of the machine the timed run cannot have.
        idle0, t1 = cpu_by_role(cp), time.monotonic()
        time.sleep(IDLE_S)
        idle = {r: c - idle0.get(r, 0.0) for r, c in cpu_by_role(cp).items()}
        results[f"{key}_idle_cpu_cores"] = sum(idle.values()) / (time.monotonic() - t1)
        for role, cpu in idle.items():
            results[f"{key}_idle_cpu_{role.replace('-', '_')}_cores"] = cpu / (time.monotonic() - t1)
        say(f"{key}: the idle fleet uses {results[f'{key}_idle_cpu_cores']:.2f} cores")

        say(f"{key}: pulumi preview of the workloads")
        t1 = time.monotonic()
        preview = proj.run("preview", "--json", timeout=TIMEOUT_S)
        results[f"{key}_preview_s"] = time.monotonic() - t1
        (tmp / key / "preview.json").write_text(preview.stdout)
        t1 = time.monotonic()
        cli = str(Path(sys.prefix) / "bin" / "nvlfabric")
        report = run_owned([cli, "preview-report", str(tmp / key / "preview.json")], cwd=proj.workdir,
                           env={**proj.env, "KUBECONFIG": str(cp.kubeconfig)}, timeout=300)
        results[f"{key}_preview_report_s"] = time.monotonic() - t1
        if report.returncode != 0:
            raise SystemExit(f"bench scale: preview-report failed: {report.stderr[-2000:]}")
        say(f"{key}: preview {results[f'{key}_preview_s']:.1f}s, preview-report "
            f"{results[f'{key}_preview_report_s']:.1f}s")

        whole = racks - JOB_RACKS
        want_pods, want_domains, want_claims = 18 * racks, whole + 1, racks
        controllers = driver_processes(cp)["controller"]
        cpu0 = sum(_cpu_s(p) for p in controllers)
        roles0 = cpu_by_role(cp)
        requests0 = request_counts(api)
        wall0 = time.time()
        say(f"{key}: pulumi up: {whole} whole-rack domains + one job over {JOB_RACKS} racks, {want_pods} pods x 4 "
            "GPUs (the timer starts)")
        marks = timed_up(proj, api, want_pods, want_domains, want_claims)
        wall1 = time.time()
        # The engine's own record of each step (for where Pulumi's time goes), beside the figures.
        with contextlib.suppress(OSError):
            shutil.copyfile(proj.workdir / "events.jsonl", RESULTS.parent / f"scale-{key}-pulumi-events.jsonl")
        for k, v in marks.items():
            results[f"{key}_{k}"] = v
        results[f"{key}_controller_cpu_s"] = sum(_cpu_s(p) for p in controllers) - cpu0
        results[f"{key}_controller_peak_rss_mb"] = max((_hwm_mb(p) for p in controllers), default=0.0)
        for role, cpu in cpu_by_role(cp).items():
            results[f"{key}_cpu_{role.replace('-', '_')}_s"] = cpu - roles0.get(role, 0.0)
        delta = request_counts(api) - requests0
        results[f"{key}_apiserver_requests"] = sum(delta.values())
        # The nodes' heartbeats (Lease renewals, 115 a second at 64 racks) grow with nodes x
        # seconds, whatever the workload: the workload's own requests are the others.
        results[f"{key}_apiserver_lease_requests"] = sum(n for (_, res, _), n in delta.items() if res == "leases")
        results[f"{key}_apiserver_workload_requests"] = (results[f"{key}_apiserver_requests"]
                                                         - results[f"{key}_apiserver_lease_requests"])
        # How often each node renewed its Lease, as the API server counted: 10 s when heartbeats
        # keep up (leaseDuration/4), longer when renewals queue behind the workload's requests.
        results[f"{key}_lease_interval_s"] = (18 * racks * (wall1 - wall0)
                                              / max(1.0, results[f"{key}_apiserver_lease_requests"]))
        results[f"{key}_status_conflicts"] = sum(n for (verb, res, code), n in delta.items()
                                                 if res == "computedomains" and code == "409")
        by_kind: Counter[tuple[str, str]] = Counter()
        for (verb, res, _), n in delta.items():
            by_kind[(verb, res)] += n
        for (verb, res), n in by_kind.most_common(12):
            results[f"{key}_apiserver_requests_{verb}_{res}".lower()] = n
        mine = controller_requests(audit_log, wall0, wall1)
        results[f"{key}_controller_requests"] = sum(mine.values())
        for (verb, res), n in mine.most_common(10):
            results[f"{key}_controller_requests_{verb}_{res.replace('/', '_')}".lower()] = n
        events = api.items("/api/v1/events?limit=100000")
        results[f"{key}_failed_scheduling"] = sum(e.get("count") or 1 for e in events
                                                  if e.get("reason") == "FailedScheduling")
        results[f"{key}_nodes_not_ready"] = sum(1 for e in events if e.get("reason") == "NodeNotReady"
                                                and (e.get("involvedObject") or {}).get("kind") == "Node")
        say(f"{key}: all {want_pods} pods running and {want_domains} domains Ready in {marks['running_s']:.1f}s; "
            f"controller {results[f'{key}_controller_cpu_s']:.1f} CPU-s, "
            f"{results[f'{key}_controller_requests']:.0f} controller requests, "
            f"{results[f'{key}_apiserver_requests']:.0f} API requests in all")
    finally:
        say(f"{key}: simulator down")
        cp.down()
        left = leftover_processes(cp)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        results[f"{key}_leftover_processes"] = len(left)


def growth(results: dict[str, float], sizes: list[int]) -> None:
    """The largest ratio of a figure between consecutive sizes that double."""
    for figure in ("controller_cpu_s", "apiserver_requests", "apiserver_workload_requests", "controller_requests"):
        ratios = [results[f"racks{b}_{figure}"] / results[f"racks{a}_{figure}"]
                  for a, b in itertools.pairwise(sizes) if b == 2 * a
                  and results.get(f"racks{a}_{figure}") and f"racks{b}_{figure}" in results]
        if ratios:
            results[f"{figure.removesuffix('_s')}_growth_per_doubling"] = max(ratios)


def main() -> int:
    sizes = sorted(int(a) for a in sys.argv[1:]) or [8, 16]
    if any(s < JOB_RACKS for s in sizes):
        raise SystemExit(f"bench scale: every size needs at least {JOB_RACKS} racks (the MultiClique job's)")
    results: dict[str, float] = {}

    def save() -> None:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps({k: round(v, 2) for k, v in sorted(results.items())}, indent=2) + "\n")

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="nvlsc-", dir="/tmp") as tmp:
        for size in sizes:
            run_size(size, Path(tmp), results)
            growth(results, sizes)
            if size == 64:
                results["preview_racks64_s"] = results["racks64_preview_s"]
                results["preview_report_racks64_s"] = results["racks64_preview_report_s"]
            save()
    print()
    for k, v in sorted(results.items()):
        figure = k.split("_", 1)[1] if k.startswith("racks") else k
        goal = GOALS.get(figure) if k.startswith("racks64_") or figure != "running_s" else None
        goal = {"controller_cpu_growth_per_doubling": 2.2, "apiserver_workload_requests_growth_per_doubling": 2.2,
                "controller_requests_growth_per_doubling": 2.2,
                "preview_racks64_s": 15.0, "preview_report_racks64_s": 5.0}.get(k, goal)
        verdict = "" if goal is None else f"  (goal ≤ {goal:g}: {'met' if v <= goal else 'MISSED'})"
        print(f"{k:52} {round(v, 2)}{verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
