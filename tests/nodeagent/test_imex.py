"""IMEX supervision against the simulator's real stand-in binaries, one daemon per simulated node.

Every simulated node of a domain gets its own loopback address (127.0.30.x) and its own work
directory; they share the domain's ports, as real members do. The fixtures kill every daemon whose
command line names this test's temporary directory, whatever the test did.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from nvlfabric.nodeagent import imex, imexconfig
from nvlfabric.nodeagent.imex import ImexDomain
from nvlfabric.sim.cluster import eventually
from nvlfabric.sim.imex.config import ImexConfig as SimImexConfig
from tests.support.imexnodes import Nodes, free_port, gone, ip

T = TypeVar("T")


def view(d: ImexDomain) -> dict[str, Any]:
    proc = subprocess.run([str(d.ctl_binary), "-c", str(d.config_path), "-N", "-j"], capture_output=True,
                          text=True, timeout=10, check=False)
    assert proc.returncode == 0, proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def all_connected(d: ImexDomain, n: int) -> bool:
    v = view(d)
    return bool(v["status"] == "UP" and len(v["nodes"]) == n
                and all(node["status"] == "READY"
                        and all(c["status"] == "CONNECTED" for c in node["connections"].values())
                        for node in v["nodes"].values()))


def wait_all_connected(domains: list[ImexDomain], n: int) -> None:
    for d in domains:
        eventually(f"{n} connected, seen from {d.bind_address}", functools.partial(all_connected, d, n),
                   timeout=10.0, interval=0.05)


def start_domain(nodes: Nodes, count: int) -> list[ImexDomain]:
    members = [ip(i) for i in range(1, count + 1)]
    domains = [nodes.domain(i) for i in range(1, count + 1)]
    for d in domains:
        d.ensure_running(members)
    for d in domains:
        d.wait_ready(10)
    return domains




# ----------------------------------------------------------------------------------------------
# A domain of real (stand-in) daemons


def test_three_members_become_ready_and_connected(nodes: Nodes) -> None:
    domains = start_domain(nodes, 3)
    assert all(d.ready() for d in domains)
    wait_all_connected(domains, 3)
    d0 = domains[0]
    assert d0.nodes_path.read_text() == f"{ip(1)}\n{ip(2)}\n{ip(3)}\n"
    assert d0.poll() is None and d0.pid is not None
    assert d0.pid_path.read_text() == f"{d0.pid}\n"


def test_a_new_member_joins_through_sigusr1_without_restarts(nodes: Nodes) -> None:
    domains = start_domain(nodes, 3)
    pids = [d.pid for d in domains]
    members = [ip(4), ip(1), ip(3), ip(2)]  # any order: every member writes the same file
    fourth = nodes.domain(4)
    fourth.ensure_running(members)
    fourth.wait_ready(10)
    assert all(d.update_members(members) for d in domains)
    assert not domains[0].update_members(list(reversed(members)))  # unchanged: no signal, no rewrite
    wait_all_connected([*domains, fourth], 4)
    assert [d.pid for d in domains] == pids and all(d.poll() is None for d in domains)
    assert {d.nodes_path.read_text() for d in [*domains, fourth]} == {"".join(f"{ip(i)}\n" for i in range(1, 5))}


def test_stopping_a_member_is_noticed_and_leaves_no_process(nodes: Nodes) -> None:
    domains = start_domain(nodes, 3)
    wait_all_connected(domains, 3)
    pid = domains[2].pid
    assert pid is not None
    assert domains[2].stop() == 0
    assert gone(pid) and not domains[2].pid_path.exists()
    assert domains[2].poll() is None and not domains[2].ready()  # a deliberate stop is not a crash

    def lost(d: ImexDomain) -> Callable[[], bool]:
        def probe() -> bool:
            v = view(d)
            return bool(v["status"] == "DEGRADED" and v["nodes"]["2"]["status"] == "UNAVAILABLE"
                        and v["nodes"]["0"]["connections"]["2"]["status"] != "CONNECTED")
        return probe

    for d in domains[:2]:
        eventually(f"node 3 lost, seen from {d.bind_address}", lost(d), timeout=10.0, interval=0.05)
    assert domains[2].stop() is None  # stopping twice is harmless


def test_a_crashed_daemon_is_detected_and_restarted(nodes: Nodes) -> None:
    domains = start_domain(nodes, 2)
    victim = domains[1]
    old = victim.pid
    assert old is not None
    os.kill(old, signal.SIGKILL)
    assert eventually("poll() to see the crash", lambda: victim.poll(), timeout=10.0, interval=0.05) == -signal.SIGKILL
    assert not victim.ready()
    victim.ensure_running([ip(1), ip(2)])
    victim.wait_ready(10)
    assert victim.pid != old and victim.poll() is None
    assert victim.log_path.with_name("imex.log.1").exists()  # the crashed run's log is kept
    wait_all_connected(domains, 2)


def test_a_daemon_left_by_a_killed_agent_is_replaced(nodes: Nodes) -> None:
    first = nodes.domain(1)
    first.ensure_running([ip(1)])
    first.wait_ready(10)
    orphan = first.pid
    assert orphan is not None
    # a new agent process: same work directory, no memory of the child
    second = nodes.domain(1)
    second.ensure_running([ip(1)])
    second.wait_ready(10)
    assert second.pid != orphan
    # Private `_proc`: the daemon is this test process's child, and only its Popen can reap it
    # (a public call such as stop() would signal it itself; the test checks that another process did).
    first._proc.wait(timeout=5)  # type: ignore[union-attr]
    assert gone(orphan)


def test_two_domains_on_one_node_need_distinct_ports(nodes: Nodes) -> None:
    a = nodes.domain(5, domain_id="clique-a")
    a.ensure_running([ip(5)])
    a.wait_ready(10)
    clash = nodes.domain(5, domain_id="cd-b")
    with pytest.raises(imex.PortInUse, match=rf"{ip(5)}:{nodes.server_port} is not free"):
        clash.ensure_running([ip(5)])
    hosts = [ip(5)]
    other = nodes.domain(5, domain_id="cd-b", server_port=free_port(hosts, {nodes.server_port, nodes.cmd_port}),
                         cmd_port=free_port(hosts, {nodes.server_port, nodes.cmd_port}))
    other.ensure_running([ip(5)])
    other.wait_ready(10)
    assert a.ready() and other.ready()


def test_a_slow_daemon_times_out_with_what_was_seen(nodes: Nodes) -> None:
    d = nodes.domain(6, env={"NVLFABRIC_SIM_IMEX_READY_DELAY_MS": "60000"}, ctl_timeout=5.0)
    d.ensure_running([ip(6)])
    with pytest.raises(imex.ImexNotReady, match=r"not READY after 0.5 s; last query: WAITING_FOR_PEERS \(exit 1"):
        d.wait_ready(0.5)
    assert not d.ready()


def test_a_daemon_that_exits_at_start_is_reported_with_its_log(nodes: Nodes, tmp_path: Path) -> None:
    fake = tmp_path / "bin" / "nvidia-imex"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'nvidia-imex: error: driver version mismatch' >&2\nexit 1\n")
    fake.chmod(0o755)
    d = nodes.domain(1, imex_binary=fake)
    d.ensure_running([ip(1)])
    with pytest.raises(imex.ImexDaemonExited, match=r"status 1 before it was READY.*driver version mismatch"):
        d.wait_ready(10)


def test_a_missing_binary_is_named(nodes: Nodes, tmp_path: Path) -> None:
    d = nodes.domain(1, imex_binary=tmp_path / "nope" / "nvidia-imex")
    with pytest.raises(imex.ImexError, match=r"nope/nvidia-imex is missing or not executable"):
        d.ensure_running([ip(1)])


# ----------------------------------------------------------------------------------------------
# Config, members, ports


def test_the_config_uses_the_real_keys_and_the_daemon_accepts_it(nodes: Nodes) -> None:
    d = nodes.domain(1)
    d.ensure_running([ip(1)])
    d.stop()
    parsed = SimImexConfig.parse(d.config_path.read_text()).model_dump()
    expected = {"DAEMONIZE": 0, "BIND_INTERFACE_IP": ip(1), "IMEX_CMD_BIND_INTERFACE_IP": ip(1),
                "SERVER_PORT": nodes.server_port, "IMEX_CMD_PORT": nodes.cmd_port,
                "IMEX_NODE_CONFIG_FILE": str(d.nodes_path), "LOG_FILE_NAME": "", "IMEX_CMD_ENABLED": 1}
    assert {k: parsed[k] for k in expected} == expected
    check = subprocess.run([str(d.imex_binary), "-c", str(d.config_path), "--check-config"], capture_output=True,
                           text=True, timeout=10, check=False)
    assert check.returncode == 0, check.stderr
    assert f"BIND_INTERFACE_IP={ip(1)}" in check.stdout and "1 entries" in check.stdout
    assert set(imexconfig.ImexConfig.ORDER) <= set(SimImexConfig.model_fields)


def test_members_are_written_in_one_canonical_order() -> None:
    assert imexconfig.canonical_members(["10.0.0.10", "node-b", "10.0.0.9", "fd00::1", "node-a"]) == [
        "10.0.0.9", "10.0.0.10", "fd00::1", "node-a", "node-b"]
    with pytest.raises(ValueError, match="listed twice"):
        imexconfig.canonical_members(["10.0.0.1", "10.0.0.1"])
    with pytest.raises(ValueError, match="neither an IP address nor a host name"):
        imexconfig.canonical_members(["10.0.0.1 # x"])


def test_the_own_address_must_be_a_member(nodes: Nodes) -> None:
    with pytest.raises(ValueError, match=rf"{ip(1)} is not among the members"):
        nodes.domain(1).ensure_running([ip(2)])


def test_port_slots_never_overlap() -> None:
    assert imexconfig.ports_for_slot(0) == imexconfig.DomainPorts(server=50000, cmd=50005)
    ports = [p for s in range(imexconfig.MAX_DOMAIN_SLOTS) for p in (imexconfig.ports_for_slot(s).server,
                                                               imexconfig.ports_for_slot(s).cmd)]
    assert len(set(ports)) == len(ports) and max(ports) < 51000
    with pytest.raises(ValueError, match="slot"):
        imexconfig.ports_for_slot(imexconfig.MAX_DOMAIN_SLOTS)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"domain_id": "Bad_ID"}, "domain id"),
    ({"bind_address": "not-an-ip"}, "does not appear to be an IPv4 or IPv6 address"),
    ({"cmd_port": 50000, "server_port": 50000}, "must differ"),
])
def test_bad_domain_settings_are_refused(tmp_path: Path, kwargs: dict[str, Any], match: str) -> None:
    args: dict[str, Any] = {"domain_id": "d", "workdir": tmp_path, "driver_root": tmp_path, "bind_address": ip(1),
                            **kwargs}
    with pytest.raises(ValueError, match=match):
        ImexDomain(**args)


def test_a_domain_without_authentication_writes_the_config_earlier_releases_wrote(tmp_path: Path) -> None:
    """A changed config restarts a running daemon, so the TLS keys appear only where TLS is on."""
    plain = imex.ImexDomain(domain_id="clique-x", workdir=tmp_path, driver_root=tmp_path, bind_address="10.0.0.1")
    text = plain.config.render()
    assert "IMEX_AUTH_" not in text and "IMEX_SERVER" not in text and "TARGET" not in text
    assert [line.partition("=")[0] for line in text.splitlines()] == list(imexconfig.ImexConfig.ORDER)
    tls = imex.ImexDomain(domain_id="cd-u", workdir=tmp_path, driver_root=tmp_path, bind_address="10.0.0.1",
                          tls_target="u.imex.nvlfabric.io")
    rendered = tls.config.render()
    for line in ("IMEX_ENABLE_AUTH_ENCRYPTION=1", "IMEX_AUTH_ENCRYPTION_MODE=SSL_TLS", "IMEX_AUTH_SOURCE=FILE",
                 f"IMEX_SERVER_KEY={tmp_path}/cd-u/tls/node.key", f"IMEX_CLIENT_CERT={tmp_path}/cd-u/tls/node.crt",
                 f"IMEX_SERVER_CERT_AUTH={tmp_path}/cd-u/tls/ca.crt",
                 "IMEX_SECURITY_TARGET_OVERRIDE=u.imex.nvlfabric.io"):
        assert line in rendered.splitlines(), line
    assert imexconfig.ImexConfig.parse(rendered) == tls.config
    with pytest.raises(ValueError, match="IMEX_SERVER_KEY: must be set with IMEX_ENABLE_AUTH_ENCRYPTION=1"):
        imexconfig.ImexConfig(BIND_INTERFACE_IP="10.0.0.1", IMEX_NODE_CONFIG_FILE="n",
                              IMEX_CMD_BIND_INTERFACE_IP="10.0.0.1",
                              IMEX_ENABLE_AUTH_ENCRYPTION=1)
