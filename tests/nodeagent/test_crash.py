"""Crash consistency: the node agent SIGKILLed at random moments across hundreds of prepare and
unprepare cycles, driven like the kubelet drives it.

The agent runs as its own process through the real entry point (`python -m nvlfabric agent`) on a
simulated node (NVML and IMEX stand-ins, real API server and scheduler), and is called over its real
DRA socket. A seeded random schedule picks the calls (one claim or several per call; prepare,
unprepare, a repeated prepare of a prepared claim, and sometimes an unprepare instead of retrying an
interrupted prepare, as the kubelet does when the pod goes away) and kills the agent at a random
moment inside some calls, between calls, or while it starts. The test plays the kubelet: a call
that got no answer is retried after the restart.

After every call and every restart the node's state must agree with what the kubelet was told:
- a claim the kubelet considers prepared is PrepareCompleted in the checkpoint, its CDI spec (with
  the device IDs the kubelet got) and its channel device node exist, and preparing it again gives
  the same answer;
- a claim the kubelet considers unprepared has no CDI spec, no channel node and no live entry;
- the checkpoint always loads (status loaded, checksum verified), no temporary file is left behind,
  and there is never more than one nvidia-imex daemon per IMEX domain; the daemon is the IMEX
  keeper's, so no kill of the agent (nor its SIGTERM) restarts it, and the keeper's SIGTERM stops it.

NVLFABRIC_CRASH_SEED replays a schedule (the calls and the kill delays; where in the agent's work a
kill lands also depends on timing); NVLFABRIC_CRASH_CYCLES changes the length (default 200).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import grpc
import pytest
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import ResourceClaim
from lightkube.types import PatchType

from nvlfabric.api import names
from nvlfabric.controller import pools
from nvlfabric.nodeagent import cdi, checkpoint
from nvlfabric.sim import agenthost, agentprocess, channelclaims, draclient
from nvlfabric.sim.cluster import eventually
from tests.conftest import Cluster

pytestmark = pytest.mark.cluster
SEED = int(os.environ.get("NVLFABRIC_CRASH_SEED") or random.SystemRandom().randrange(2**32))
CYCLES = int(os.environ.get("NVLFABRIC_CRASH_CYCLES") or 200)
CLAIMS = 6
RACKS = range(230, 240)  # loopback addresses 127.10.<rack>.1: the first one free
KILL_IN_CALL = 0.12  # chance that a call is interrupted by SIGKILL at a random moment
KILL_IDLE = 0.03  # chance of a SIGKILL between calls
KILL_AT_START = 0.1  # chance that a restart is itself killed, at a random moment during start-up
STALE = "stale"  # what the agent says when it refuses the retry of a prepare the kubelet gave up on


@dataclass
class Node:
    host: agenthost.Host
    agent: agentprocess.AgentProcess
    claims: list[channelclaims.Claim]
    channel: dict[str, int]  # claim UID → its allocated channel


@pytest.fixture
def node(cluster: Cluster) -> Iterator[Node]:
    client = cluster.client
    state = Path(tempfile.mkdtemp(prefix="nvlc-", dir="/tmp"))
    host = agenthost.make_host(state, RACKS)
    agenthost.register(client, host)
    pools.apply(client, host.clique, channels=CLAIMS + 2)  # what the controller would publish
    names = [f"crash-{os.urandom(3).hex()}-{i}" for i in range(CLAIMS)]
    agent = agentprocess.AgentProcess(host, cluster.kubeconfig, resync_seconds=1.0)
    try:
        claims = [channelclaims.scheduled_claim(client, host, n) for n in names]
        channelclaims.wait_allocated(client, claims)
        channel = {}
        for c in claims:
            alloc = client.get(ResourceClaim, c.name, namespace=c.namespace).status.allocation
            channel[c.uid] = int(alloc.devices.results[0].device.removeprefix("channel-"))
        yield Node(host, agent, claims, channel)
    finally:
        agent.kill()
        agent.keeper.kill()
        agenthost.stop_daemons(host)
        for n in names:
            channelclaims.delete_domain(client, n)
        agenthost.unregister(client, host)
        pools.withdraw(client, host.clique)
        agenthost.remove_host(host)


@dataclass
class KubeletView:
    """What the kubelet believes, and how it got there."""

    prepared: dict[str, list[dict[str, object]]] = field(default_factory=dict)
    pending: dict[str, str] = field(default_factory=dict)  # UID → the call it must retry
    half: set[str] = field(default_factory=set)  # UIDs whose prepare got no answer, not yet settled
    quarantine: dict[str, float] = field(default_factory=dict)  # UID → monotonic time a retry is no longer stale
    just_quarantined: list[channelclaims.Claim] = field(default_factory=list)
    cycles: int = 0
    kills: dict[str, int] = field(default_factory=lambda: {"in call": 0, "idle": 0, "at start": 0})
    calls: int = 0
    log: list[str] = field(default_factory=list)


class CrashRun:
    def __init__(self, n: Node, seed: int) -> None:
        self.n = n
        self.rng = random.Random(seed)
        self.seed = seed
        self.k = KubeletView()
        self.client = draclient.Kubelet(n.host.endpoint)
        self.durations = {"prepare": 0.05, "unprepare": 0.02}
        self.by_uid = {c.uid: c for c in n.claims}

    # -- failure context ------------------------------------------------------------------------

    def fail(self, what: str) -> None:
        raise AssertionError(
            f"{what}\nseed {self.seed} (rerun: NVLFABRIC_CRASH_SEED={self.seed}); after {self.k.calls} calls, "
            f"{self.k.cycles} cycles, kills {self.k.kills}\nlast steps:\n  " + "\n  ".join(self.k.log[-15:])
            + f"\nagent log:\n{self.n.agent.tail(25)}\nsockets of the node's address:\n{self.sockets()}")

    def sockets(self) -> str:
        addr = self.n.host.node.address
        try:
            out = subprocess.run(["ss", "-tanp"], capture_output=True, text=True, timeout=10).stdout
        except OSError as exc:
            return f"(ss: {exc})"
        return "\n".join(line for line in out.splitlines() if addr in line) or "(none)"

    def note(self, text: str) -> None:
        self.k.log.append(text)

    # -- the agent's life -----------------------------------------------------------------------

    def restart(self) -> None:
        """Start the agent again (the kubelet's container restart), sometimes killing that start too."""
        self.client.close()
        while True:
            self.n.agent.spawn()
            if self.rng.random() < KILL_AT_START:
                time.sleep(self.rng.uniform(0, 1.2))
                self.n.agent.kill()
                self.k.kills["at start"] += 1
                self.note("killed while starting")
                self.check_checkpoint_file()
                continue
            self.n.agent.wait_serving(60)
            break
        self.check("after restart", after_restart=True)

    def kill(self, why: str) -> None:
        self.n.agent.kill()
        self.k.kills[why] += 1
        self.check_checkpoint_file()
        self.restart()

    # -- calls -----------------------------------------------------------------------------------

    def call(self, op: str, claims: Sequence[channelclaims.Claim]) -> None:
        """One kubelet call, maybe with a SIGKILL at a random moment inside it."""
        self.k.calls += 1
        names = ", ".join(c.name.removesuffix("-channel") for c in claims)
        fut = (self.client.prepare_future if op == "prepare" else self.client.unprepare_future)(claims)
        killed = False
        t0 = time.monotonic()
        if self.rng.random() < KILL_IN_CALL:
            delay = self.rng.uniform(0, 1.3 * self.durations[op] * len(claims))
            try:
                fut.result(timeout=delay)
            except grpc.FutureTimeoutError:
                self.n.agent.kill()
                killed = True
            except grpc.RpcError:
                pass
        try:
            results: dict[str, object] | None = dict(
                draclient.Kubelet.prepare_result(fut) if op == "prepare" else draclient.Kubelet.unprepare_result(fut))
        except grpc.RpcError as exc:
            if not killed:
                self.fail(f"{op} [{names}]: the agent failed the call without being killed: {exc}")
            results = None
        if not killed:
            self.durations[op] = 0.8 * self.durations[op] + 0.2 * (time.monotonic() - t0) / len(claims)
        self.note(f"{op} [{names}]" + (" killed" if killed else "") + ("" if results is not None else ": no answer"))
        if results is None:
            for c in claims:
                self.k.pending[c.uid] = op
                if op == "prepare" and c.uid not in self.k.prepared:
                    self.k.half.add(c.uid)
        else:
            for c in claims:
                if c.uid not in results:
                    self.fail(f"{op} [{names}]: no answer for claim {c.ref}: {results}")
                self.settle(op, c, results[c.uid])
        if killed:
            self.k.kills["in call"] += 1
            self.check_checkpoint_file()
            self.restart()
        else:
            self.check(f"after {op} [{names}]")

    def settle(self, op: str, c: channelclaims.Claim, result: object) -> None:
        k = self.k
        if op == "prepare":
            if isinstance(result, str):
                if c.uid in k.quarantine and STALE in result:
                    k.pending.pop(c.uid, None)
                    return
                self.fail(f"prepare of {c.ref} failed: {result}")
            assert isinstance(result, list)
            if c.uid in k.prepared and k.prepared[c.uid] != result:
                self.fail(f"a repeated prepare of {c.ref} answered {result}, first {k.prepared[c.uid]}")
            k.prepared[c.uid] = result
            k.pending.pop(c.uid, None)
            k.quarantine.pop(c.uid, None)
            k.half.discard(c.uid)
        else:
            if result != "":
                self.fail(f"unprepare of {c.ref} failed: {result}")
            if c.uid in k.prepared:
                k.cycles += 1
            elif c.uid in k.half:
                # The kubelet gave up on a prepare that got no answer: a retry of it is refused as
                # stale for a while (or succeeds, when the killed prepare had recorded nothing).
                k.quarantine[c.uid] = time.monotonic() + checkpoint.STALE_PREPARE_WINDOW.seconds + 5
                k.just_quarantined.append(c)
            k.half.discard(c.uid)
            k.prepared.pop(c.uid, None)
            k.pending.pop(c.uid, None)

    # -- invariants -------------------------------------------------------------------------------

    def check_checkpoint_file(self) -> checkpoint.Checkpoint:
        """The checkpoint as the next agent will read it: loads, checksum verified (read from a copy,
        because `load` tidies the directory it reads from)."""
        host = self.n.host
        with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
            copy = Path(tmp) / "checkpoint.json"
            if host.checkpoint.exists():
                shutil.copy(host.checkpoint, copy)
            cp, report = checkpoint.load(copy, host.boot_id)
        if report.status not in (checkpoint.LoadStatus.LOADED, checkpoint.LoadStatus.MISSING) or \
                report.skipped_entries:
            self.fail(f"the checkpoint does not load cleanly: {report}")
        return cp

    def check(self, when: str, *, after_restart: bool = False) -> None:
        host, k = self.n.host, self.k
        cp = self.check_checkpoint_file()
        entries = {e.uid: e for e in cp.claims}
        specs = host.cdi_specs()
        nodes = host.channel_nodes()
        problems = []
        for uid, c in self.by_uid.items():
            if uid in k.pending:
                continue  # the kubelet does not know yet; its retry settles it
            e, ch = entries.get(uid), self.n.channel[uid]
            if uid in k.prepared:
                if e is None or e.state is not checkpoint.ClaimState.PREPARE_COMPLETED:
                    problems.append(f"{c.ref} is prepared for the kubelet but {e.state if e else 'absent'} "
                                    "in the checkpoint (claim lost)")
                if uid not in specs:
                    problems.append(f"{c.ref} is prepared but its CDI spec is missing")
                else:
                    spec = json.loads(specs[uid].read_text())
                    ids = [f"{spec['kind']}={d['name']}" for d in spec["devices"]]
                    got = k.prepared[uid][0]["cdi"]
                    if ids != got:
                        problems.append(f"{c.ref}: CDI spec has devices {ids}, the kubelet got {got}")
                if ch not in nodes:
                    problems.append(f"{c.ref} is prepared but channel node {ch} is missing")
            else:
                if e is not None and e.state is not checkpoint.ClaimState.PREPARE_ABORTED:
                    problems.append(f"{c.ref} is not prepared but {e.state} in the checkpoint")
                if uid in specs:
                    problems.append(f"{c.ref} is not prepared but its CDI spec {specs[uid].name} exists (leak)")
                if ch in nodes:
                    problems.append(f"{c.ref} is not prepared but its channel node {ch} exists (leak)")
        problems += [f"CDI spec of an unknown claim: {p.name}" for u, p in specs.items() if u not in self.by_uid]
        problems += [f"channel node of no claim: {p}" for ch, p in nodes.items() if ch not in self.n.channel.values()]
        per_domain: dict[str, list[int]] = {}
        for pid, config in host.imex_daemons().items():
            per_domain.setdefault(config, []).append(pid)
        problems += [f"{len(p)} nvidia-imex daemons for {cfg}: pids {p}" for cfg, p in per_domain.items() if len(p) > 1]
        if problems:
            self.fail(f"{when}:\n  " + "\n  ".join(problems))
        if after_restart:
            # Whatever the killed agent was writing is gone once the new one has started (allowing a
            # moment for a write the new agent itself may have in flight).
            try:
                eventually("no temporary files", lambda: not host.temp_files(), timeout=3)
            except AssertionError:
                self.fail(f"{when}: temporary files left behind: {host.temp_files()}")

    # -- the schedule ---------------------------------------------------------------------------

    def pick(self) -> tuple[str, list[channelclaims.Claim]]:
        k, now = self.k, time.monotonic()
        usable = [c for c in self.n.claims if k.quarantine.get(c.uid, 0) <= now] or list(self.n.claims)
        first = self.rng.choice(usable)
        op = self.op_for(first)
        if op == "abandon":  # the pod went away while its prepare was interrupted
            return "unprepare", [first]
        others = [c for c in usable if c is not first and c.uid not in k.pending and self.op_for(c) == op]
        extra = self.rng.sample(others, k=min(len(others), self.rng.choice([0, 0, 0, 1, 2])))
        return op, [first, *extra]

    def op_for(self, c: channelclaims.Claim) -> str:
        k = self.k
        if k.pending.get(c.uid) == "prepare":
            quarantined = sum(until > time.monotonic() for until in k.quarantine.values())
            abandon = self.rng.random() < 0.15 and c.uid not in k.prepared and quarantined < 2
            return "abandon" if abandon else "prepare"
        if c.uid in k.pending:
            return k.pending[c.uid]
        if c.uid in k.prepared:
            return "prepare" if self.rng.random() < 0.2 else "unprepare"
        return "prepare"

    def run(self, cycles: int) -> None:
        self.restart()
        while self.k.cycles < cycles:
            op, claims = self.pick()
            self.call(op, claims)
            while self.k.just_quarantined:  # a new pod of that claim, at once
                self.call_without_kill("prepare", [self.k.just_quarantined.pop()])
            if self.rng.random() < KILL_IDLE:
                self.note("killed between calls")
                self.kill("idle")

    def call_without_kill(self, op: str, claims: Sequence[channelclaims.Claim]) -> None:
        saved = self.rng.random
        self.rng.random = lambda: 1.0  # type: ignore[method-assign]
        try:
            self.call(op, claims)
        finally:
            self.rng.random = saved  # type: ignore[method-assign]

    def settle_everything(self) -> None:
        """The end: every pod is gone; the kubelet unprepares every claim it knows until it succeeds."""
        todo = [c for c in self.n.claims if c.uid in self.k.prepared or c.uid in self.k.pending]
        for c in todo:
            self.call_without_kill("unprepare", [c])


def test_sigkill_at_random_moments_loses_no_claim_and_leaks_nothing(node: Node) -> None:
    t0 = time.monotonic()
    run = CrashRun(node, SEED)
    run.run(CYCLES)

    # Every kill left the clique's IMEX daemon alone: it belongs to the keeper, not to the agent.
    for c in node.claims:
        if c.uid not in run.k.prepared:
            run.call_without_kill("prepare", [c])
    daemons = node.host.imex_daemons()
    run.kill("idle")
    if len(daemons) != 1 or node.host.imex_daemons() != daemons:
        run.fail(f"the IMEX daemon changed across an agent kill: {daemons} then {node.host.imex_daemons()}")
    run.settle_everything()
    host = node.host
    cp = run.check_checkpoint_file()
    live = [e for e in cp.claims if e.state is not checkpoint.ClaimState.PREPARE_ABORTED]
    leftovers = {"cdi specs": list(host.cdi_specs()), "channel nodes": list(host.channel_nodes()),
                 "live checkpoint entries": [e.uid for e in live], "temp files": host.temp_files()}
    if any(leftovers.values()):
        run.fail(f"after unpreparing everything: {leftovers}")
    if (rc := node.agent.terminate()) != 0:
        run.fail(f"the agent exited with {rc} on SIGTERM")
    if host.imex_daemons() != daemons:  # an agent upgrade stops the agent this way
        run.fail(f"the agent's SIGTERM touched the IMEX daemon: {daemons} then {host.imex_daemons()}")
    if (rc := node.agent.keeper.terminate()) != 0:
        run.fail(f"the IMEX keeper exited with {rc} on SIGTERM; log:\n{node.agent.keeper.tail()}")
    try:
        eventually("no nvidia-imex daemon once the keeper stopped", lambda: not host.imex_daemons(), timeout=10)
    except AssertionError as exc:
        run.fail(str(exc))
    kills = sum(run.k.kills.values())
    assert run.k.cycles >= CYCLES and run.k.kills["in call"] >= CYCLES // 20 and kills >= CYCLES // 10, run.k.kills
    print(f"\ncrash test: seed {SEED}, {run.k.cycles} prepare/unprepare cycles in {run.k.calls} calls, kills "
          f"{run.k.kills}, {node.agent.starts} agent starts, {time.monotonic() - t0:.0f} s")
    assert not list(Path(host.cdi_dir).glob(f"{names.CDI_VENDOR}*"))


# ----------------------------------------------------------------------------------------------
# The states a kill leaves, built deterministically (the random run above meets them by chance).


def _allocation(node: Node, c: channelclaims.Claim, cluster: Cluster) -> checkpoint.Allocation:
    params = cluster.client.get(ResourceClaim, c.name, namespace=c.namespace).spec.devices.config[0].opaque.parameters
    return checkpoint.Allocation(compute_domain_uid=params["computeDomain"]["uid"],
                                 compute_domain_name=params["computeDomain"]["name"],
                                 channels=(node.channel[c.uid],), imex_domain_id=f"clique-{node.host.clique}")


def test_a_prepare_killed_after_its_side_effects_is_undone_by_unprepare(node: Node, cluster: Cluster) -> None:
    host, (half, done, *_) = node.host, node.claims
    # Killed after writing the CDI spec, before recording PrepareCompleted; and killed mid-write
    # of a CDI spec, a channel node and the checkpoint (their temporary files are left).
    cp, _ = checkpoint.load(host.checkpoint, host.boot_id)
    cp = checkpoint.start_prepare(cp, checkpoint.ClaimRef(uid=half.uid, namespace=half.namespace, name=half.name),
                                  _allocation(node, half, cluster), now=datetime.now(UTC))
    checkpoint.save(host.checkpoint, cp)
    ch = node.channel[half.uid]
    cdi.channel_device_node(host.node.driver_root, ch, 507)
    cdi.write_claim_spec(host.cdi_dir, half.uid, cdi.claim_spec(claim_uid=half.uid, channels=[ch], major=507,
                                                                compute_domain="x"))
    temps = [host.cdi_dir / f".{cdi.spec_file_name(done.uid)}.abcd1234.tmp", host.channel_dir / f".channel{ch}.99.tmp",
             host.plugin_dir / ".checkpoint.json.tmp-abcd"]
    for t in temps:
        t.write_text("torn")

    node.agent.start()
    assert not host.temp_files()
    kubelet = draclient.Kubelet(host.endpoint)
    assert kubelet.unprepare([half]) == {half.uid: ""}  # the pod went away instead of a retry
    assert half.uid not in host.cdi_specs() and ch not in host.channel_nodes()
    entry = checkpoint.load(host.checkpoint, host.boot_id)[0].get(half.uid)
    assert entry is not None and entry.state is checkpoint.ClaimState.PREPARE_ABORTED
    refused = kubelet.prepare([half])[half.uid]
    assert isinstance(refused, str) and half.ref in refused and STALE in refused, refused

    # A completed claim whose CDI spec went missing (killed mid-unprepare, then prepared again by
    # a new pod): the repeated prepare puts it back and answers as before.
    first = kubelet.prepare([done])[done.uid]
    assert not isinstance(first, str), first
    node.agent.kill()
    host.cdi_specs()[done.uid].unlink()
    node.agent.start()
    kubelet.reconnect()
    assert kubelet.prepare([done])[done.uid] == first and done.uid in host.cdi_specs()
    assert kubelet.unprepare([done]) == {done.uid: ""} and not host.cdi_specs() and not host.channel_nodes()
    kubelet.close()


def test_the_imex_daemon_outlives_agent_kills_and_a_keeper_restart_adopts_it(node: Node) -> None:
    host, c = node.host, node.claims[0]
    node.agent.start()
    kubelet = draclient.Kubelet(host.endpoint)
    result = kubelet.prepare([c])[c.uid]
    assert not isinstance(result, str), result
    (daemon,) = host.imex_daemons()
    # The agent killed (a crash, an OOM kill) and stopped (an upgrade): the daemon, and so every
    # NVLink import through it, stays; the next agent answers from it without a restart.
    node.agent.kill()
    assert list(host.imex_daemons()) == [daemon]
    node.agent.start()
    assert node.agent.terminate() == 0 and list(host.imex_daemons()) == [daemon]
    node.agent.start()
    kubelet.reconnect()
    assert kubelet.prepare([c])[c.uid] == result and list(host.imex_daemons()) == [daemon]
    # The keeper itself killed: where its daemons outlive it, the next keeper adopts them.
    node.agent.keeper.kill()
    node.agent.keeper.start()
    assert list(host.imex_daemons()) == [daemon]
    assert "adopted the running daemon" in node.agent.keeper.tail()
    # The daemon dies on its own: the agent's housekeeping (every resync, 1 s here) starts it again.
    os.kill(daemon, signal.SIGKILL)
    eventually("the domain to run again", lambda: len(d := host.imex_daemons()) == 1 and daemon not in d)
    assert kubelet.unprepare([c]) == {c.uid: ""}
    kubelet.close()
    assert node.agent.terminate() == 0 and len(host.imex_daemons()) == 1  # the clique's domain stays
    assert node.agent.keeper.terminate() == 0
    assert not host.imex_daemons()


def test_a_claim_allocated_anew_under_its_uid_is_prepared_anew(node: Node, cluster: Cluster) -> None:
    """Deallocated and allocated another channel while the agent was down (same object, same UID):
    the old channel's node and spec go, the new one is prepared; nothing is answered from the stale
    entry."""
    host, client = node.host, cluster.client
    config = channelclaims.compute_domain(client, f"realloc-{os.urandom(3).hex()}")
    old, new = CLAIMS + 1, CLAIMS + 2  # channels no scheduled claim of the fixture holds
    try:
        c = channelclaims.allocated_claim(client, host, f"{config.compute_domain.name}-channel", config.to_kube(),
                                          channel=old)
        node.agent.start()
        kubelet = draclient.Kubelet(host.endpoint)
        first = kubelet.prepare([c])[c.uid]
        assert not isinstance(first, str) and first[0]["device"] == f"channel-{old}", first
        node.agent.kill()
        for allocation in (None, channelclaims.allocation(host, new, config.to_kube())):
            client.patch(ResourceClaim.Status, c.name, {"status": {"allocation": allocation}}, namespace=c.namespace,
                         patch_type=PatchType.MERGE)
        node.agent.start()
        kubelet.reconnect()
        moved = kubelet.prepare([c])[c.uid]
        assert not isinstance(moved, str) and moved[0]["device"] == f"channel-{new}", moved
        assert moved[0]["cdi"] == [f"{names.CDI_KIND}={c.uid}-channel-{new}"]
        assert set(host.channel_nodes()) == {new} and set(host.cdi_specs()) == {c.uid}
        assert kubelet.prepare([c])[c.uid] == moved  # and the warm answer is the new one
        assert kubelet.unprepare([c]) == {c.uid: ""} and not host.channel_nodes() and not host.cdi_specs()
        kubelet.close()
    finally:
        channelclaims.delete_domain(client, config.compute_domain.name)


def test_a_corrupt_checkpoint_is_rebuilt_from_the_api_server(node: Node, cluster: Cluster) -> None:
    """The checkpoint is damaged while the agent is down. The restarted agent moves it aside and
    rebuilds from the API server: a claim a pod on this node still holds is adopted (the kubelet's
    later unprepare cleans it up), the spec and channel of a claim whose pod is gone are removed."""
    host, (held, left, *_) = node.host, node.claims
    node.agent.start()
    kubelet = draclient.Kubelet(host.endpoint)
    first = kubelet.prepare([held, left])
    assert all(not isinstance(r, str) for r in first.values()), first
    assert node.channel[held.uid] != node.channel[left.uid]
    node.agent.kill()
    pod = left.name.removesuffix("-channel") + "-0"
    cluster.client.delete(Pod, pod, namespace=left.namespace, grace_period=0)
    eventually("the pod to be gone", lambda: not list(cluster.client.list(
        Pod, namespace=left.namespace, fields={"metadata.name": pod})))
    host.checkpoint.write_text('{"version": "v1", "claims": {"trunc')  # a torn write by something else

    node.agent.start()
    eventually("the agent to rebuild its checkpoint", lambda: host.checkpoint.exists() and held.uid in json.loads(
        host.checkpoint.read_text()).get("claims", {}))
    eventually("the agent to remove what no pod holds", lambda: left.uid not in host.cdi_specs()
               and node.channel[left.uid] not in host.channel_nodes())
    entry = checkpoint.load(host.checkpoint, host.boot_id)[0].get(held.uid)
    assert entry is not None and entry.state is checkpoint.ClaimState.PREPARE_COMPLETED
    assert entry.allocation.channels == (node.channel[held.uid],)
    assert list(host.checkpoint.parent.glob("checkpoint.json.corrupt-*")), "the damaged file was not kept aside"
    specs, nodes = host.cdi_specs(), host.channel_nodes()
    assert held.uid in specs and node.channel[held.uid] in nodes
    assert left.uid not in specs and node.channel[left.uid] not in nodes
    kubelet.reconnect()
    assert kubelet.prepare([held])[held.uid] == first[held.uid]  # the same devices as before the loss
    assert kubelet.unprepare([held, left]) == {held.uid: "", left.uid: ""}
    assert not host.cdi_specs() and not host.channel_nodes()
    kubelet.close()
    assert node.agent.terminate() == 0


def test_an_agent_no_kubelet_registers_exits_naming_the_kubelet_root(cluster: Cluster) -> None:
    """Sockets in a plugins_registry no kubelet watches (a kubelet root that is another kubelet's,
    or left over): the agent exits after its registration timeout, naming the setting, so its pod
    restarts with back-off and says why instead of running "healthy" unused."""
    client = cluster.client
    state = Path(tempfile.mkdtemp(prefix="nvlr-", dir="/tmp"))
    host = agenthost.make_host(state, RACKS)
    agenthost.register(client, host)
    agent = agentprocess.AgentProcess(host, cluster.kubeconfig, registration_timeout=2.0)
    try:
        agent.spawn()
        assert agent.proc is not None
        assert agent.proc.wait(timeout=60) == 1
        log = agent.log.read_text()
        assert "the kubelet has not registered this plugin 2s after its socket" in log, log
        assert f"check --kubelet-root / $KUBELET_ROOT ({host.node.kubelet_root})" in log
    finally:
        agent.kill()
        agent.keeper.kill()
        agenthost.stop_daemons(host)
        agenthost.unregister(client, host)
        agenthost.remove_host(host)
