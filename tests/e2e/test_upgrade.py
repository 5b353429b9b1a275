"""An upgrade from the previous release under a running job, as a platform repo does it
(docs/compatibility.md, "What an upgrade must never do").

The previous release is the newest CHANGELOG release before this version, its wheel built from this
checkout's git history (its tag, or the commit that set its version) into a virtualenv of its own.
A platform project on that venv brings up the driver, a rack, a ComputeDomain and a Job of two pods
on a simulated rack; then the venv gets this checkout's wheel (`pip install` of the new release),
and:
- `pulumi preview` replaces and deletes nothing, and touches no domain, workload or claim: the
  upgrade's steps are the golden file tests/golden/upgrade/from-<previous>.json (updated with
  NVLFABRIC_UPDATE_GOLDEN=1, and reviewed: a new step there is something users will see);
- `pulumi up` rolls the agents and the controller to the new image while the job's pods keep
  running, with their IMEX daemon (its pid), channel, claim allocation and containers;
- `pulumi refresh` finds nothing changed, and the domain removed from the program is deleted
  through the state the previous release wrote.

The project's own stack, stacks/dev (two racks of 16 nodes here, its four jobs of 23 pods, one
over both racks), goes through the same upgrade: the same golden preview, every pod, claim and
IMEX daemon kept, `refresh` clean.

The simulated nodes run the previous release's agent image (`nvlfabric/node-agent:<previous>`)
from a virtualenv of that release's wheel with its `node` extra, and this release's image from the
checkout (nvlfabric/sim/images.py maps a tag of its own): the agents that roll are the previous
release's code, the new agents adopt what those prepared, and the previous release's IMEX keepers
(OnDelete) keep serving the new agents.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from lightkube import Client
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.resource_v1 import ResourceClaim

import nvlfabric
from nvlfabric.api import names
from nvlfabric.controller.cache import ComputeDomainResource
from nvlfabric.sim.cluster import eventually, ready_domain_status
from nvlfabric.sim.images import ImageProgram
from nvlfabric.sim.nvml.topology import rack_name
from nvlfabric.testbed.controlplane import ControlPlane, free_ports
from tests.conftest import simulated_rack
from tests.support import installed
from tests.support.agents import edits, imex_daemon
from tests.support.installed import platform_project
from tests.support.upgrade import KEPT_TYPES, golden, previous_release, steps_of

pytestmark = [pytest.mark.cluster, pytest.mark.pulumi]
RACK = 166  # addresses 127.10.166.x: a rack number no other test uses
# What an upgrade may never replace, delete or change: the user's domains, workloads and claims.

PROGRAM = '''\
"""A platform repo's stack: the driver, one NVL72 rack, and (unless `removeDomain`) a ComputeDomain
with a Job of two pods bound to it."""

import pulumi

from nvlfabric import BoundJob, ComputeDomain, Nvl72Rack, NvlfabricDriver

config = pulumi.Config()
driver = NvlfabricDriver("nvlfabric", channels_per_clique=16)
rack = Nvl72Rack(config.require("rack"), nodes=config.require_object("nodes"))
if not config.get_bool("removeDomain"):
    cd = ComputeDomain("pretrain", name=config.require("domain"), opts=pulumi.ResourceOptions(depends_on=[driver]))
    BoundJob("pretrain", name=config.require("domain"), compute_domain=cd, parallelism=2, gpus_per_pod=4,
             pod_template={"spec": {"containers": [{"name": "trainer", "image": "registry.invalid/train:1"}]}})
'''


@pytest.fixture(scope="module")
def previous() -> tuple[str, str, Path]:
    """(version, git ref, its wheel) of the previous release."""
    version, ref = previous_release()
    return version, ref, installed.release_wheel(ref)


@pytest.fixture(scope="module")
def rack(previous: tuple[str, str, Path], tmp_path_factory: pytest.TempPathFactory,
         ) -> Iterator[tuple[ControlPlane, Client, Path]]:
    """A simulated rack whose nodes run the previous release's agent image from its own virtualenv."""
    yield from _on_previous_release(previous, tmp_path_factory, first_rack=RACK, nodes=2, prefix="nvlupg-")


def _on_previous_release(previous: tuple[str, str, Path], tmp_path_factory: pytest.TempPathFactory, **rack: Any,
                         ) -> Iterator[tuple[ControlPlane, Client, Path]]:
    """Simulated racks whose nodes run the previous release's agent image from a venv of its wheel
    with its `node` extra (and the venv)."""
    version, _, wheel = previous
    node_venv = tmp_path_factory.mktemp("previous-node") / "venv"
    installed.venv(node_venv, "node", wheel)
    old_image = {f"{names.AGENT_IMAGE_REPOSITORY}:{version}": ImageProgram(
        entrypoint=[str(node_venv / "bin" / "python"), "-m", "nvlfabric"])}
    # Every pod on its node's address: the previous release's agent and keeper DaemonSets predate
    # hostNetwork, so in pod network namespaces its IMEX daemons would listen where no peer reaches
    # them (as on a real cluster); it ran, and was tested, on a simulator without them.
    with simulated_rack(ports=free_ports(), field_manager="upgrade-test", images=old_image, pod_network="host",
                        **rack) as (cp, client):
        yield cp, client, node_venv


def running_from(venv: Path, role: str) -> list[int]:
    """Pids of this machine's processes that run `role` (agent, imex, controller) with `venv`'s Python."""
    out = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0] == str(venv / "bin" / "python").encode() and role.encode() in argv[1:]:
            out.append(int(proc.name))
    return out


def _driver_pods(client: Client, name: str) -> dict[str, Pod]:
    return {p.metadata.name: p for p in client.list(Pod, namespace=names.NAMESPACE,
                                                   labels={"app.kubernetes.io/name": name})
            if p.metadata.deletionTimestamp is None}


def _serving(client: Client, name: str, image: str, count: int) -> dict[str, Pod] | None:
    pods = _driver_pods(client, name)
    fine = len(pods) == count and all(p.status.phase == "Running" and p.spec.containers[0].image == image
                                      and all(c.ready for c in p.status.containerStatuses or [])
                                      for p in pods.values())
    return pods if fine else None


@pytest.mark.timeout(1500)
def test_an_upgrade_from_the_previous_release_keeps_the_running_job(
        tmp_path: Path, previous: tuple[str, str, Path], rack: tuple[ControlPlane, Client, Path]) -> None:
    cp, client, node_venv = rack
    version, _, wheel = previous
    venv = tmp_path / "venv"
    installed.venv(venv, "pulumi", wheel)
    nodes = sorted(n.name for n in cp.nodes())
    domain = f"pretrain-{uuid.uuid4().hex[:5]}"
    proj = platform_project(tmp_path / "proj", venv, cp.kubeconfig, PROGRAM)
    proj.run("stack", "init", "dev")
    for key, value in (("domain", domain), ("rack", rack_name(RACK)), ("nodes", json.dumps(nodes))):
        proj.run("config", "set", key, value)
    proj.run("up", "--yes", "--skip-preview", timeout=400)

    # The previous release, running: its image, the domain Ready, the Job's pods on both nodes.
    old_image = f"{names.AGENT_IMAGE_REPOSITORY}:{version}"
    agents = eventually("the previous release's agents to serve", lambda: _serving(
        client, "nvlfabric-agent", old_image, len(nodes)), timeout=180)
    keepers = eventually("the IMEX keepers to run", lambda: _serving(
        client, "nvlfabric-imex", old_image, len(nodes)), timeout=120)
    old_keepers = running_from(node_venv, "imex")
    assert len(running_from(node_venv, "agent")) == len(nodes) == len(old_keepers), "the previous release's code runs"
    status = ready_domain_status(client, domain)
    members = {names.COMPUTE_DOMAIN_LABEL: domain}
    pods = eventually("the Job's two pods to run", lambda: (
        ps if len(ps := [p for p in client.list(Pod, namespace="default", labels=members)
                         if p.status.phase == "Running"]) == 2 else None), timeout=120)
    clique = (client.get(Node, nodes[0]).metadata.labels or {})[names.CLIQUE_LABEL]
    by_node = {n.name: n for n in cp.nodes()}
    daemons = {n: imex_daemon(by_node[n], clique) for n in nodes}
    assert all(len(pids) == 1 for pids, _ in daemons.values()), daemons
    containers = {p.metadata.name: edits(cp.state_dir, p.spec.nodeName, p.metadata.name, "trainer") for p in pods}
    claim = client.get(ResourceClaim, f"{domain}-channel", namespace="default")
    job = client.get(Job, domain, namespace="default")
    cd = client.get(ComputeDomainResource, domain, namespace="default")

    # The platform installs the new release into its venv.
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
                          "--disable-pip-version-check", f"nvlfabric[pulumi] @ {installed.wheel().as_uri()}"],
                         capture_output=True, text=True, timeout=900)
    assert pip.returncode == 0, pip.stdout + pip.stderr

    steps = steps_of(proj.json("preview", "--json", "--diff"))
    # A release may add driver objects (a new admission policy) and update them in place; it never
    # replaces or deletes anything, and never creates what a user owns.
    assert not [s for s in steps if s[0] not in ("update", "create")], f"the upgrade would replace or delete: {steps}"
    assert not [s for s in steps if s[0] == "create" and any(t in s[1] for t in KEPT_TYPES)], steps
    assert not [s for s in steps if s[1].endswith(KEPT_TYPES)], f"the upgrade touches a user's object: {steps}"
    assert steps == golden(f"from-{version}.json", steps)

    proj.run("up", "--yes", "--skip-preview", timeout=400)
    new_image = names.AGENT_IMAGE
    rolled = eventually("the agents to roll to the new image", lambda: _serving(
        client, "nvlfabric-agent", new_image, len(nodes)), timeout=240)
    assert not set(rolled) & set(agents), "every agent pod is a new one"
    eventually("the controller to roll to the new image", lambda: _serving(
        client, "nvlfabric-controller", new_image, 2), timeout=180)
    assert running_from(node_venv, "agent") == [], "an agent of the previous release still runs"
    for pod in rolled.values():  # the release an agent runs is its log's first line
        log = by_node[pod.spec.nodeName].pod_dir(pod.metadata.uid) / "agent.log"
        assert f"nvlfabric {nvlfabric.__version__}: node agent of node {pod.spec.nodeName}" in log.read_text()
    # The keeper's DaemonSet is OnDelete: its pods (the previous release's code), and the IMEX
    # daemons they hold, stay; the new agents talk to them.
    assert set(_driver_pods(client, "nvlfabric-imex")) == set(keepers)
    assert running_from(node_venv, "imex") == old_keepers
    assert client.get(DaemonSet, "nvlfabric-imex", namespace=names.NAMESPACE).spec.template.spec.containers[
        0].image == new_image

    for n in nodes:
        assert imex_daemon(by_node[n], clique) == daemons[n], f"{n}'s IMEX daemon changed with the upgrade"
    for p in pods:
        now = client.get(Pod, p.metadata.name, namespace="default")
        assert now.metadata.uid == p.metadata.uid and now.status.phase == "Running", now.status
        assert edits(cp.state_dir, p.spec.nodeName, p.metadata.name, "trainer") == containers[p.metadata.name]
    now = client.get(ResourceClaim, f"{domain}-channel", namespace="default")
    assert now.metadata.uid == claim.metadata.uid and now.status.allocation == claim.status.allocation
    assert client.get(Job, domain, namespace="default").metadata.uid == job.metadata.uid
    assert client.get(ComputeDomainResource, domain, namespace="default").metadata.uid == cd.metadata.uid
    assert ready_domain_status(client, domain)["channel"] == status["channel"]

    proj.run("refresh", "--yes", "--skip-preview", "--expect-no-changes", timeout=300)

    # The domain leaves the program: deleted through the state the previous release wrote.
    proj.run("config", "set", "removeDomain", "true")
    proj.run("up", "--yes", "--skip-preview", timeout=400)
    with pytest.raises(httpx2.HTTPStatusError) as err:
        client.get(ComputeDomainResource, domain, namespace="default")
    assert err.value.response.status_code == 404
    assert not list(client.list(ResourceClaim, namespace="default"))
    assert not list(client.list(Job, namespace="default"))

    # Halfway through the keepers' rollout: the first node (drained: nothing runs on it) gets this
    # release's keeper, the C program; the second keeps the previous release's. A domain over both
    # becomes Ready: one protocol, and both write the same nodes file (IMEX refuses a differing map).
    drained, kept = nodes
    old_pod = next(p for p in keepers.values() if p.spec.nodeName == drained)
    client.delete(Pod, old_pod.metadata.name, namespace=names.NAMESPACE)
    eventually("this release's keeper on the drained node", lambda: (
        [p for p in _driver_pods(client, "nvlfabric-imex").values()
         if p.spec.nodeName == drained and p.spec.containers[0].image == new_image and p.status.phase == "Running"
         and all(c.ready for c in p.status.containerStatuses or [])]), timeout=120)
    assert len(running_from(node_venv, "imex")) == 1, "the other node keeps the previous release's keeper"
    assert eventually("the keeper's C program to run on the drained node", lambda: [
        pid for pid in _pids_of(names.IMEX_KEEPER_BINARY) if by_node[drained].runs(pid)], timeout=30)
    mixed = f"mixed-{uuid.uuid4().hex[:5]}"
    proj.run("config", "set", "removeDomain", "false")
    proj.run("config", "set", "domain", mixed)
    proj.run("up", "--yes", "--skip-preview", timeout=400)
    ready_domain_status(client, mixed)
    eventually("the mixed domain's two pods to run", lambda: len(
        [p for p in client.list(Pod, namespace="default", labels={names.COMPUTE_DOMAIN_LABEL: mixed})
         if p.status.phase == "Running"]) == 2, timeout=120)
    files = {n: imex_daemon(by_node[n], clique)[1] for n in nodes}
    assert files[drained] == files[kept] and len(files[drained].split()) == 2, files
    proj.run("destroy", "--yes", "--skip-preview", timeout=400)


def _pids_of(program: str) -> list[int]:
    """Pids of this machine's processes running `program` (by the name of their executable)."""
    out = []
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            argv0 = (proc / "cmdline").read_bytes().split(b"\0")[0]
            if argv0.rsplit(b"/", 1)[-1] == program.encode():
                out.append(int(proc.name))
    return out


FLEET = 176  # racks 176 and 177 (127.10.176-177.x): stacks/dev's two racks, away from a demo's 0 and 1
FLEET_NODES = 16  # stacks/dev's 23 pods of 4 GPUs: 7 of single-rack jobs plus 8 per rack of the multirack one


@pytest.fixture(scope="module")
def fleet(previous: tuple[str, str, Path], tmp_path_factory: pytest.TempPathFactory,
          ) -> Iterator[tuple[ControlPlane, Client, Path]]:
    """Two simulated racks for stacks/dev, their nodes on the previous release's agent image."""
    yield from _on_previous_release(previous, tmp_path_factory, first_rack=FLEET, racks=2, nodes=FLEET_NODES,
                                    prefix="nvlupf-")


@pytest.mark.timeout(1800)
def test_stacks_dev_upgrades_from_the_previous_release_under_its_running_jobs(
        tmp_path: Path, previous: tuple[str, str, Path], fleet: tuple[ControlPlane, Client, Path]) -> None:
    """The project's own stack, stacks/dev (three single-rack jobs and one over both racks), up on
    the previous release; the new wheel's preview is the same few in-place driver updates as a
    platform project's (the same golden file), and its `up` keeps every job pod, claim and daemon."""
    cp, client, node_venv = fleet
    version, _, wheel = previous
    venv = tmp_path / "venv"
    installed.venv(venv, "pulumi", wheel)
    proj = platform_project(tmp_path / "dev", venv, cp.kubeconfig,
                            (installed.REPO / "stacks" / "dev" / "__main__.py").read_text())
    proj.run("stack", "init", "dev")
    for key, value in (("racks", "2"), ("nodesPerRack", str(FLEET_NODES)), ("firstRack", str(FLEET))):
        proj.run("config", "set", key, value)
    proj.run("up", "--yes", "--skip-preview", timeout=900)
    nodes = sorted(n.name for n in cp.nodes())
    old_image = f"{names.AGENT_IMAGE_REPOSITORY}:{version}"
    agents = eventually("the previous release's agents to serve", lambda: _serving(
        client, "nvlfabric-agent", old_image, len(nodes)), timeout=300)
    jobs = {"pretrain": 4, "finetune": 2, "eval": 1, "multirack": 16}
    pods = eventually("every job pod of stacks/dev to run", lambda: (
        ps if len(ps := [p for p in client.list(Pod, namespace="default") if p.status.phase == "Running"])
        == sum(jobs.values()) else None), timeout=300)
    by_node = {n.name: n for n in cp.nodes()}
    cliques = {n: (client.get(Node, n).metadata.labels or {})[names.CLIQUE_LABEL] for n in nodes}
    daemons = {p.spec.nodeName: imex_daemon(by_node[p.spec.nodeName], cliques[p.spec.nodeName]) for p in pods}
    claims = {c.metadata.name: (c.metadata.uid, c.status.allocation) for c in client.list(ResourceClaim,
                                                                                          namespace="default")}
    statuses = {d: ready_domain_status(client, d) for d in jobs}

    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
                          "--disable-pip-version-check", f"nvlfabric[pulumi] @ {installed.wheel().as_uri()}"],
                         capture_output=True, text=True, timeout=900)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    steps = steps_of(proj.json("preview", "--json", "--diff"))
    assert not [s for s in steps if s[1].endswith(KEPT_TYPES)], f"the upgrade touches a user's object: {steps}"
    assert steps == golden(f"from-{version}.json", steps), "stacks/dev's upgrade differs from a platform project's"

    proj.run("up", "--yes", "--skip-preview", timeout=900)
    rolled = eventually("the agents to roll to the new image", lambda: _serving(
        client, "nvlfabric-agent", names.AGENT_IMAGE, len(nodes)), timeout=600)
    assert not set(rolled) & set(agents), "every agent pod is a new one"
    assert running_from(node_venv, "agent") == []
    for p in pods:
        now = client.get(Pod, p.metadata.name, namespace="default")
        assert (now.metadata.uid, now.status.phase) == (p.metadata.uid, "Running"), p.metadata.name
    for node, daemon in daemons.items():
        assert imex_daemon(by_node[node], cliques[node]) == daemon, f"{node}'s IMEX daemon changed with the upgrade"
    assert {c.metadata.name: (c.metadata.uid, c.status.allocation)
            for c in client.list(ResourceClaim, namespace="default")} == claims
    for d, status in statuses.items():
        now = ready_domain_status(client, d)
        assert (now.get("channel"), now.get("groups")) == (status.get("channel"), status.get("groups")), d
    proj.run("refresh", "--yes", "--skip-preview", "--expect-no-changes", timeout=600)
    proj.run("destroy", "--yes", "--skip-preview", timeout=900)
