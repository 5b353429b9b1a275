"""Controller failover: the Lease decision table, the settings' checks, and two real controller
processes on the real API server (exactly one leads; kill -9 the leader and the standby takes
over and works; the health endpoints answer as nvlfabric/controller/endpoint.py documents)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from lightkube import ApiError
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.resource_v1 import CELDeviceSelector, DeviceClassSpec, DeviceSelector
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.resource_v1 import DeviceClass
from prometheus_client.parser import text_string_to_metric_families

from nvlfabric.controller import endpoint, pools
from nvlfabric.controller.__main__ import settings
from nvlfabric.controller.leader import Action, Seen, decide, lost
from nvlfabric.daemon import process
from nvlfabric.sim.cluster import delete_nodes, eventually, install_crd, make_ready_nodes
from nvlfabric.sim.paths import REPO
from tests.conftest import Cluster
from tests.support.http import free_port, get


@pytest.mark.parametrize(("lease", "now", "action"), [
    pytest.param(None, 100.0, Action.CREATE, id="no-lease"),
    pytest.param(Seen("me", 15, 90.0), 100.0, Action.RENEW, id="ours"),
    pytest.param(Seen("me", 15, 0.0), 100.0, Action.RENEW, id="ours-even-if-overdue"),
    pytest.param(Seen("", 15, 99.0), 100.0, Action.TAKE, id="released"),
    pytest.param(Seen("other", 15, 90.0), 100.0, Action.WAIT, id="other-valid"),
    pytest.param(Seen("other", 15, 85.5), 100.0, Action.WAIT, id="other-just-valid"),
    pytest.param(Seen("other", 15, 85.0), 100.0, Action.TAKE, id="other-expired-exactly"),
    pytest.param(Seen("other", 15, 10.0), 100.0, Action.TAKE, id="other-long-expired"),
    pytest.param(Seen("other", 1, 99.5), 100.0, Action.WAIT, id="short-duration-valid"),
])
def test_the_lease_decision(lease: Seen | None, now: float, action: Action) -> None:
    assert decide(lease, now, "me") is action


def test_a_holder_stops_past_its_renew_deadline_only() -> None:
    assert not lost(90.0, 100.0, 10.0)
    assert lost(89.9, 100.0, 10.0)


def test_watch_failures_back_off_and_turn_loud(caplog: pytest.LogCaptureFixture) -> None:
    assert [endpoint.backoff(n) for n in (1, 2, 3, 4, 5, 6, 7, 50)] == [1, 2, 4, 8, 16, 30, 30, 30]
    before = endpoint.WATCH_FAILURES.labels("Test").value
    logger = logging.getLogger("nvlfabric.test-watch")
    with caplog.at_level(logging.DEBUG, logger="nvlfabric.test-watch"):
        for n in (1, 2, 3):
            endpoint.watch_failed("Test", RuntimeError("boom"), n, logger)
    assert [r.levelno for r in caplog.records] == [logging.DEBUG, logging.DEBUG, logging.WARNING]
    assert endpoint.WATCH_FAILURES.labels("Test").value == before + 3


@pytest.mark.parametrize(("argv", "needle"), [
    (["--lease-duration", "0"], "--lease-duration / $LEASE_DURATION"),
    (["--renew-interval", "x"], "--renew-interval / $RENEW_INTERVAL"),
    (["--renew-deadline", "20"], "< --lease-duration"),
    (["--renew-interval", "7"], "--renew-interval (7) < --renew-deadline (7)"),
    (["--health-port", "70000"], "--health-port / $HEALTH_PORT"),
])
def test_bad_failover_settings_are_one_line(argv: list[str], needle: str) -> None:
    with pytest.raises(process.SettingsError, match=r".*") as info:
        settings(argv)
    assert needle in str(info.value)


def test_the_identity_is_the_pod_name_or_hostname_and_pid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAME", "nvlfabric-controller-7d9-abcde")
    assert settings([]).identity == "nvlfabric-controller-7d9-abcde"
    monkeypatch.delenv("POD_NAME")
    assert settings([]).identity == f"{socket.gethostname()}-{os.getpid()}"


# -- two controller processes on the real API server ----------------------------------------



def leader_gauge(port: int) -> float | None:
    code, text = get(port, "/metrics")
    if code != 200:
        return None
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == "nvlfabric_controller_leader"]
    return family.samples[0].value


Procs = dict[str, tuple[subprocess.Popen[bytes], int]]  # "a"/"b" → (process, health port)


@pytest.fixture
def two_controllers(cluster: Cluster, tmp_path: Path) -> Iterator[tuple[str, Procs]]:
    lease = f"ctl-lease-{uuid.uuid4().hex[:6]}"
    procs: Procs = {}
    for who in ("a", "b"):
        port = free_port()
        with open(tmp_path / f"{who}.log", "wb") as out:  # the child keeps its own descriptor
            procs[who] = (subprocess.Popen(
                [sys.executable, "-m", "nvlfabric", "controller", "--kubeconfig", str(cluster.kubeconfig),
                 "--identity", f"ctl-{who}", "--lease-name", lease, "--lease-namespace", "default",
                 "--lease-duration", "4", "--renew-interval", "1", "--renew-deadline", "3", "--retry-interval", "0.5",
                 "--health-port", str(port), "--listen-address", "127.0.0.1", "--channels-per-clique", "4",
                 "--log-format", "text"], cwd=REPO, stdout=out, stderr=subprocess.STDOUT), port)
    try:
        yield lease, procs
    finally:
        for p, _ in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p, _ in procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        for who in procs:
            print(f"--- controller {who}\n" + (tmp_path / f"{who}.log").read_text()[-3000:])
        with contextlib.suppress(ApiError):
            cluster.client.delete(Lease, lease, namespace="default")


@pytest.mark.cluster
def test_one_controller_leads_and_the_standby_takes_over_when_it_dies(
        cluster: Cluster, two_controllers: tuple[str, Procs]) -> None:
    client, (lease, procs) = cluster.client, two_controllers
    install_crd(client)
    with contextlib.suppress(ApiError):
        client.create(DeviceClass(metadata=ObjectMeta(name="imex-channel.nvlfabric.io"), spec=DeviceClassSpec(
            selectors=[DeviceSelector(cel=CELDeviceSelector(expression=f'device.driver == "{pools.DRIVER}"'))])))

    def holder() -> str | None:
        try:
            spec = client.get(Lease, lease, namespace="default").spec
        except ApiError:
            return None
        return spec.holderIdentity if spec else None

    first = eventually("one controller to take the Lease", holder, timeout=30)
    leader, standby = ("a", "b") if first == "ctl-a" else ("b", "a")
    eventually("both to answer /readyz", lambda: all(get(port, "/readyz")[0] == 200 for _, port in procs.values()),
               timeout=20)
    assert get(procs[leader][1], "/readyz") == (200, "leader\n")
    assert get(procs[standby][1], "/readyz") == (200, "standby\n")
    assert all(get(port, "/healthz") == (200, "ok\n") for _, port in procs.values())
    eventually("the leader gauge", lambda: leader_gauge(procs[leader][1]) == 1.0, timeout=10)
    assert leader_gauge(procs[standby][1]) == 0.0
    assert get(procs[leader][1], "/nope")[0] == 404
    time.sleep(2)  # a few renews and standby reads: still exactly one holder, the same
    assert holder() == first and leader_gauge(procs[standby][1]) == 0.0

    procs[leader][0].send_signal(signal.SIGKILL)
    procs[leader][0].wait(timeout=10)
    killed = time.monotonic()
    eventually("the standby to take the Lease over", lambda: holder() == f"ctl-{standby}", timeout=15)
    assert time.monotonic() - killed < 15
    eventually("the standby to say it leads", lambda: get(procs[standby][1], "/readyz") == (200, "leader\n"),
               timeout=5)

    # ... and it works: a new clique's pool is published by the new leader.
    clique = f"{uuid.uuid4()}.32766"
    node = f"ctl-lease-{uuid.uuid4().hex[:5]}"
    make_ready_nodes(client, {node: {pools.CLIQUE_LABEL: clique}})
    try:
        eventually("the new leader to publish the clique's pool", lambda: pools.existing_slices(client, clique),
                   timeout=20)
    finally:
        delete_nodes(client, [node])
        procs[standby][0].send_signal(signal.SIGTERM)
        assert procs[standby][0].wait(timeout=15) == 0  # a clean stop releases the Lease
        assert not holder()
        pools.withdraw(client, clique)
