"""Node agent benchmark → bench/results/nodeagent.json.

One node agent, started through its real entry point (`python -m nvlfabric agent`) on a simulated
GB200 node (NVML and IMEX stand-ins) against a control plane of its own, called over its real DRA
socket the way the kubelet calls it (one claim per NodePrepareResources call).

Set-up: 1000 channel claims of 100 ComputeDomains (10 claims each), allocated on one clique pool of
1000 channels. Their allocations are written through the resourceclaims/status subresource as an
admin, as the scheduler would write them, instead of scheduling 1000 pods: the agent reads nothing
but the claim, and 1000 pods on one node would measure the scheduler, not the agent.

Figures (targets from issue 4):
- prepare_p50_ms, prepare_p99_ms   warm prepare (the claim already prepared, e.g. the kubelet
                                   preparing again after a restart or for another pod of the claim),
                                   one call per claim over the 1000 claims; target ≤ 2 / ≤ 10 ms
- node_footprint_rss_mb            agent + IMEX keeper resident memory with one ComputeDomain running
                                   (its 10 claims prepared, its IMEX daemon up); ≤ 66 MB, what NVIDIA's
                                   kubelet plugin alone idles at on the same NVML stand-in; also
                                   node_footprint_pss_mb and each process's share (agent_/keeper_one_domain_*,
                                   with _anon_mb: its own objects, _file_mb: mapped libraries)
- node_footprint_distinct_mb       the same two processes' distinct resident pages: a library page both
                                   map (libpython, libc) counted once, as the node's memory (and a
                                   cgroup) holds it once; needs root (page frame numbers), else absent
- rss_mb                           the agent's resident memory with 1000 claims prepared; ≤ 60 MB
- idle_cpu_pct                     the agent's CPU use while nobody calls, over one full resync
                                   period (30 s: one fabric re-check and housekeeping pass); < 1 %
- cold_prepare_p50_ms / _p99_ms    first prepare of each claim (API GET, checkpoint writes, CDI
                                   spec, channel node, status report; the IMEX daemon start on the
                                   first one)
- unprepare_p50_ms                 unprepare of each claim
- idle_cpu_health_stream_pct       idle CPU with the kubelet's device-health stream open
- rss_hwm_mb                       peak resident memory
- rss_anon_mb, pss_mb              of rss_mb: private (anonymous) memory, and the proportional share
                                   (shared library pages split among the processes mapping them)
- rss_no_claims_mb                 right after start, before any claim (the floor of the stack:
                                   Python, gRPC, pydantic, protobuf, NVML bindings, OpenSSL)
- setup_claims_s                   creating and allocating the 1000 claims (not the agent)

The agent runs as its DaemonSet runs it: in-cluster credentials (a service-account dir), the
gRPC health port and the Prometheus metrics port open.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import struct
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import grpc  # noqa: E402
import yaml  # noqa: E402
from lightkube import Client  # noqa: E402
from lightkube.config.kubeconfig import KubeConfig  # noqa: E402

from nvlfabric.api.kubelet import dra_health_v1alpha1_pb2, dra_health_v1alpha1_pb2_grpc  # noqa: E402
from nvlfabric.controller import pools  # noqa: E402
from nvlfabric.sim import agenthost, agentprocess, channelclaims, draclient  # noqa: E402
from nvlfabric.testbed.controlplane import ControlPlane, Ports, free_ports  # noqa: E402

PORTS = Ports(etcd_client=63791, etcd_peer=63801, apiserver=56445, scheduler=60260)
RESULTS = REPO / "bench" / "results" / "nodeagent.json"
CLAIMS = int(os.environ.get("NVLFABRIC_BENCH_CLAIMS", "1000"))
FIRST = 10  # claims prepared before the one-domain footprint is read (the IMEX daemon started)
IDLE_S = float(os.environ.get("NVLFABRIC_BENCH_IDLE_S", "30"))
RESYNC_S = 30.0  # the agent's default
PAGE = os.sysconf("SC_PAGE_SIZE")
FRAME_MASK = (1 << 55) - 1
TARGETS = {"prepare_p50_ms": 2.0, "prepare_p99_ms": 10.0, "rss_mb": 60.0, "idle_cpu_pct": 1.0,
           "node_footprint_rss_mb": 66.0}


def say(msg: str) -> None:
    print(f"[bench nodeagent {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def status_kb(pid: int, key: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) / 1024
    return 0.0


def smaps_kb(pid: int, key: str) -> float:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) / 1024
    return 0.0


def resident_frames(pid: int) -> set[int]:
    """The physical page frames the process has resident (/proc/<pid>/pagemap: bit 63 present,
    bits 0-54 the frame number, which reads 0 without CAP_SYS_ADMIN)."""
    frames: set[int] = set()
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/pagemap", "rb") as pagemap:
        for line in maps:
            if line.rstrip().endswith("[vsyscall]"):
                continue
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            pagemap.seek(lo // PAGE * 8)
            for (entry,) in struct.iter_unpack("<Q", pagemap.read((hi - lo) // PAGE * 8)):
                if entry >> 63 & 1:
                    frames.add(entry & FRAME_MASK)
    return frames


def distinct_mb(pids: list[int]) -> float | None:
    """Resident memory of the processes together, each page once; None where frames are hidden."""
    together = set().union(*(resident_frames(pid) for pid in pids))
    return None if together <= {0} else len(together) * PAGE / 2**20


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]


def idle_cpu(pid: int, seconds: float) -> float:
    c0, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return 100 * (cpu_seconds(pid) - c0) / (time.monotonic() - t0)


def make_claims(client: Client, host: agenthost.Host) -> list[channelclaims.Claim]:
    """One ComputeDomain per claim (the agent prepares only a domain's own claim, issue 49), all
    clique-scoped: every claim shares the clique's one IMEX daemon, as before."""
    def one(i: int) -> channelclaims.Claim:
        config = channelclaims.compute_domain(client, f"bench-{i:04d}")
        return channelclaims.allocated_claim(client, host, f"{config.compute_domain.name}-channel",
                                             config.to_kube(), channel=i + 1)

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, range(CLAIMS)))


def timed(calls: list[channelclaims.Claim], kubelet: draclient.Kubelet, op: str) -> list[float]:
    out = []
    for c in calls:
        t0 = time.perf_counter()
        result = kubelet.prepare([c]) if op == "prepare" else kubelet.unprepare([c])
        out.append((time.perf_counter() - t0) * 1000)
        r = result[c.uid]
        if isinstance(r, str) and r:
            raise SystemExit(f"bench: {op} of {c.ref} failed: {r}")
    return out


def health_stream(endpoint: Path, stop: threading.Event) -> None:
    """The kubelet's NodeWatchResources stream, held open and drained until `stop`."""
    with grpc.insecure_channel(f"unix:{endpoint}") as ch:
        stream = dra_health_v1alpha1_pb2_grpc.DRAResourceHealthStub(ch).NodeWatchResources(
            dra_health_v1alpha1_pb2.NodeWatchResourcesRequest())
        stop_watch = threading.Thread(target=lambda: (stop.wait(), stream.cancel()), daemon=True)
        stop_watch.start()
        try:
            for _ in stream:
                pass
        except grpc.RpcError:
            pass


def run(tmp: Path, results: dict[str, float]) -> None:
    cp = ControlPlane(state_dir=tmp / "cp", ports=PORTS, progress=lambda m: None)
    cp.up()
    client = Client(config=KubeConfig.from_file(str(cp.kubeconfig)), field_manager="bench")
    agent: agentprocess.AgentProcess | None = None
    host: agenthost.Host | None = None
    try:
        host = agenthost.make_host(tmp / "host", range(245, 250))  # apart from cp/: remove_host deletes it
        agenthost.register(client, host)
        pools.apply(client, host.clique, channels=CLAIMS)  # what the controller would publish
        t0 = time.monotonic()
        claims = make_claims(client, host)
        results["setup_claims_s"] = time.monotonic() - t0
        say(f"{len(claims)} claims of as many ComputeDomains allocated in "
            f"{results['setup_claims_s']:.1f}s")

        # Configured as its DaemonSet configures it: in-cluster credentials (a token and the CA in a
        # service-account dir), the health and metrics ports open.
        sa = tmp / "serviceaccount"
        sa.mkdir()
        (sa / "token").write_text(yaml.safe_load(cp.kubeconfig.read_text())["users"][0]["user"]["token"])
        shutil.copyfile(cp.state_dir / "pki" / "ca.crt", sa / "ca.crt")
        health_port, metrics_port = free_ports().apiserver, free_ports().scheduler
        agent = agentprocess.AgentProcess(host, cp.kubeconfig, resync_seconds=RESYNC_S,
                                          in_cluster=(f"127.0.0.1:{PORTS.apiserver}", sa),
                                          health_port=health_port, metrics_port=metrics_port)
        agent.start()
        assert agent.pid is not None
        time.sleep(1)
        results["rss_no_claims_mb"] = status_kb(agent.pid, "VmRSS")
        kubelet = draclient.Kubelet(host.endpoint)
        t0 = time.monotonic()
        cold = timed(claims[:FIRST], kubelet, "prepare")  # the first domains: the clique's IMEX daemon runs
        time.sleep(1)
        assert agent.keeper.proc is not None
        footprint = {"agent": agent.pid, "keeper": agent.keeper.proc.pid}
        for who, pid in footprint.items():
            results[f"{who}_one_domain_rss_mb"] = status_kb(pid, "VmRSS")
            results[f"{who}_one_domain_pss_mb"] = smaps_kb(pid, "Pss")
            results[f"{who}_one_domain_anon_mb"] = status_kb(pid, "RssAnon")
            results[f"{who}_one_domain_file_mb"] = status_kb(pid, "RssFile")
        results["node_footprint_rss_mb"] = results["agent_one_domain_rss_mb"] + results["keeper_one_domain_rss_mb"]
        results["node_footprint_pss_mb"] = results["agent_one_domain_pss_mb"] + results["keeper_one_domain_pss_mb"]
        say(f"one domain running: agent {results['agent_one_domain_rss_mb']:.1f} MB + keeper "
            f"{results['keeper_one_domain_rss_mb']:.1f} MB = {results['node_footprint_rss_mb']:.1f} MB RSS per node "
            f"(PSS {results['node_footprint_pss_mb']:.1f} MB)")
        if (distinct := distinct_mb(list(footprint.values()))) is not None:
            results["node_footprint_distinct_mb"] = distinct
            say(f"  their distinct resident pages (shared library pages once): {distinct:.1f} MB")
        cold += timed(claims[FIRST:], kubelet, "prepare")
        say(f"cold prepare of {len(claims)} claims in {time.monotonic() - t0:.1f}s "
            f"(p50 {statistics.median(cold):.1f} ms, first {cold[0]:.0f} ms)")
        results["cold_prepare_p50_ms"] = statistics.median(cold)
        results["cold_prepare_p99_ms"] = percentile(cold, 99)

        timed(claims[:100], kubelet, "prepare")  # warm-up of the client's channel, not measured
        warm = timed(claims, kubelet, "prepare")
        results["prepare_p50_ms"] = statistics.median(warm)
        results["prepare_p99_ms"] = percentile(warm, 99)
        results["prepare_max_ms"] = max(warm)
        say(f"warm prepare over {len(warm)} claims: p50 {results['prepare_p50_ms']:.2f} ms, "
            f"p99 {results['prepare_p99_ms']:.2f} ms, max {results['prepare_max_ms']:.2f} ms")

        results["rss_mb"] = status_kb(agent.pid, "VmRSS")
        results["rss_anon_mb"] = status_kb(agent.pid, "RssAnon")
        results["pss_mb"] = smaps_kb(agent.pid, "Pss")
        say(f"agent RSS with {len(claims)} claims prepared: {results['rss_mb']:.1f} MB; idle for {IDLE_S:.0f}s")
        kubelet.close()
        results["idle_cpu_pct"] = idle_cpu(agent.pid, IDLE_S)
        say(f"idle CPU {results['idle_cpu_pct']:.3f} %; again with the kubelet's health stream open")
        stop = threading.Event()
        watcher = threading.Thread(target=health_stream, args=(host.endpoint, stop), daemon=True)
        watcher.start()
        time.sleep(1)
        results["idle_cpu_health_stream_pct"] = idle_cpu(agent.pid, IDLE_S)
        stop.set()
        watcher.join(10)
        results["rss_hwm_mb"] = status_kb(agent.pid, "VmHWM")
        assert agent.keeper.proc is not None
        results["keeper_rss_mb"] = status_kb(agent.keeper.proc.pid, "VmRSS")
        results["keeper_idle_cpu_pct"] = idle_cpu(agent.keeper.proc.pid, IDLE_S)
        say(f"IMEX keeper RSS {results['keeper_rss_mb']:.1f} MB, idle CPU {results['keeper_idle_cpu_pct']:.3f} %")

        kubelet = draclient.Kubelet(host.endpoint)
        results["unprepare_p50_ms"] = statistics.median(timed(claims, kubelet, "unprepare"))
        kubelet.close()
        left = {"cdi specs": len(host.cdi_specs()), "channel nodes": len(host.channel_nodes())}
        if any(left.values()):
            raise SystemExit(f"bench: left behind after unpreparing everything: {left}")
        results["claims"] = len(claims)
    finally:
        if agent is not None:
            agent.close()
        if host is not None:
            agenthost.stop_daemons(host)
            agenthost.remove_host(host)
        client.close()
        cp.down()


def main() -> int:
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="nvlb-", dir="/tmp") as tmp:
        run(Path(tmp), results)
    results = {k: round(v, 3) for k, v in results.items()}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    for k, v in results.items():
        target = TARGETS.get(k)
        verdict = "" if target is None else (f"  (target {'<' if k == 'idle_cpu_pct' else '≤'} {target}: "
                                             f"{'met' if v <= target else 'MISSED'})")
        print(f"{k:28} {v}{verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
