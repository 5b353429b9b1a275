"""The IMEX stand-ins (nvlfabric/sim/imex) as the node agent will use them: real config and nodes files,
daemons on distinct loopback addresses, nvidia-imex-ctl -q / -N / -N -j, signals."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvlfabric.sim.cluster import eventually
from nvlfabric.sim.imex.config import ImexConfig, write_config
from tests.sim.imex_fixtures import (
    ImexCluster,
    all_connected,
    conn_status,
    link_is,
)

ASAN = os.environ.get("NVLFABRIC_IMEX_ASAN") == "1"


@pytest.fixture
def cluster(imex_bin: Path, tmp_path: Path) -> Iterator[ImexCluster]:
    c = ImexCluster(imex_bin, tmp_path / "imex")
    try:
        yield c
    finally:
        c.close()


@pytest.mark.skipif(ASAN, reason="checks the plain build")
def test_build_is_incremental(imex_bin: Path) -> None:
    src = Path(__file__).resolve().parents[2] / "nvlfabric" / "sim" / "imex"
    out = subprocess.run(["make", "-C", str(src), f"OUT={imex_bin}"],
                         capture_output=True, text=True, check=True).stdout
    assert "gcc" not in out and "Nothing to be done" in out


def test_three_nodes_ready_and_fully_connected(cluster: ImexCluster) -> None:
    nodes = cluster.start(3)
    for node in nodes:
        q = node.ctl("-q")
        assert (q.rc, q.out) == (0, "READY\n")
    for node in nodes:
        node.wait_up(3)
        view = node.nodes()  # "changed" is relative to the previous query: nothing changed since
        assert set(view) == {"nodes", "timestamp", "status"}
        for i in range(3):
            row = view["nodes"][str(i)]
            assert set(row) == {"status", "host", "hostName", "connections"}
            assert row["host"] == cluster.ip(i)
            for j in range(3):
                assert row["connections"][str(j)] == {"host": cluster.ip(j), "status": "CONNECTED",
                                                      "changed": False}
    text = nodes[0].ctl("-N")
    assert text.rc == 0
    assert "Domain State: UP" in text.out
    for i in range(3):
        assert re.search(rf"Node #{i}\s+- {re.escape(cluster.ip(i))}\s+- READY", text.out)
        assert re.search(rf"^\s+{i}\s+C\s+C\s+C\s*$", text.out, re.M)


@pytest.mark.skipif(ASAN, reason="sanitizer builds are larger")
def test_daemon_memory_is_small(cluster: ImexCluster) -> None:
    nodes = cluster.start(2)
    assert nodes[0].proc is not None
    status = Path(f"/proc/{nodes[0].proc.pid}/status").read_text()
    rss_kb = int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1))  # type: ignore[union-attr]
    assert rss_kb < 8 * 1024


def test_kill_shows_disconnected_then_restart_reconnects(cluster: ImexCluster) -> None:
    nodes = cluster.start(3, grace=0)
    nodes[0].wait_up(3)
    nodes[2].kill()
    for i in (0, 1):
        view = nodes[i].wait_view(link_is(i, 2, "DISCONNECTED"), "DISCONNECTED")
        assert view["status"] == "DEGRADED"
        assert view["nodes"]["2"]["status"] == "UNAVAILABLE"
        assert conn_status(view, i, 1 - i) == "CONNECTED"
    assert "Domain State: DEGRADED" in nodes[0].ctl("-N").out
    assert re.search(r"^\s+0\s+C\s+C\s+D\s*$", nodes[0].ctl("-N").out, re.M)

    nodes[2].start()
    for node in nodes:
        node.wait_up(3)


def test_grace_time_recovering_then_disconnected(cluster: ImexCluster) -> None:
    nodes = cluster.start(2, grace=2)
    nodes[0].wait_up(2)
    nodes[1].kill()
    lost = time.monotonic()
    eventually("RECOVERING", lambda: conn_status(nodes[0].nodes(), 0, 1) == "RECOVERING", timeout=10.0, interval=0.05)
    assert time.monotonic() - lost < 2.0
    eventually("DISCONNECTED after 2 s", lambda: conn_status(nodes[0].nodes(), 0, 1) == "DISCONNECTED",
               timeout=10.0, interval=0.05)
    assert time.monotonic() - lost >= 1.9
    # The only peer is gone: the domain is DOWN from node 0's point of view.
    assert nodes[0].nodes()["status"] == "DOWN"


def test_grace_forever_stays_recovering(cluster: ImexCluster) -> None:
    nodes = cluster.start(2, grace=-1)
    nodes[0].wait_up(2)
    nodes[1].stop()  # a clean SIGTERM stop looks the same to the peer
    eventually("RECOVERING", lambda: conn_status(nodes[0].nodes(), 0, 1) == "RECOVERING", timeout=10.0, interval=0.05)
    time.sleep(1.2)
    assert conn_status(nodes[0].nodes(), 0, 1) == "RECOVERING"


def test_map_mismatch(cluster: ImexCluster) -> None:
    cluster.write_nodes(cluster.ip(i) for i in range(3))
    other = cluster.write_nodes([cluster.ip(0), cluster.ip(1), cluster.ip(2), cluster.ip(5)],
                                cluster.dir / "nodes-other.cfg")
    nodes = [cluster.add(0), cluster.add(1), cluster.add(2, nodes_file=other)]
    for node in nodes:
        node.start()
    view0 = nodes[0].wait_view(lambda v: conn_status(v, 0, 1) == "CONNECTED" and conn_status(v, 0, 2) == "MAP_MISMATCH",
                               "!M! towards node 2")
    assert view0["status"] == "DEGRADED"
    view2 = nodes[2].wait_view(lambda v: conn_status(v, 2, 0) == conn_status(v, 2, 1) == "MAP_MISMATCH",
                               "!M! from node 2")
    assert conn_status(view2, 2, 3) == "NEVER_CONNECTED"
    assert view2["status"] == "DOWN"
    text = nodes[0].ctl("-N").out
    assert re.search(r"^\s+0\s+C\s+C\s+!M!\s*$", text, re.M), text


def test_version_mismatch(cluster: ImexCluster) -> None:
    cluster.write_nodes(cluster.ip(i) for i in range(2))
    nodes = [cluster.add(0), cluster.add(1, env={"NVLFABRIC_SIM_IMEX_VERSION": "580.65.06"})]
    for node in nodes:
        node.start()
    nodes[0].wait_view(link_is(0, 1, "VERSION_MISMATCH"), "!V!")
    nodes[1].wait_view(link_is(1, 0, "VERSION_MISMATCH"), "!V!")
    assert re.search(r"^\s+0\s+C\s+!V!\s*$", nodes[0].ctl("-N").out, re.M)


def test_sigusr1_rereads_nodes_file(cluster: ImexCluster) -> None:
    nodes = cluster.start(3)
    pids = [n.proc.pid for n in nodes if n.proc is not None]
    four = [cluster.ip(i) for i in range(4)]
    fourth_file = cluster.write_nodes(four, cluster.dir / "nodes-4.cfg")
    fourth = cluster.add(3, nodes_file=fourth_file).start()
    eventually("4th node mismatched", lambda: conn_status(fourth.nodes(), 3, 0) == "MAP_MISMATCH",
               timeout=10.0, interval=0.05)

    cluster.write_nodes(four)  # atomically replaces the shared nodes file
    for node in nodes:
        node.signal(signal.SIGUSR1)
    for node in [*nodes, fourth]:
        node.wait_up(4)
    assert [n.proc.pid for n in nodes if n.proc is not None and n.proc.poll() is None] == pids


def test_sigusr1_with_broken_nodes_file_keeps_running(cluster: ImexCluster) -> None:
    nodes = cluster.start(2)
    nodes[0].wait_up(2)
    cluster.nodes_file.write_text("not an address!\n")
    nodes[0].signal(signal.SIGUSR1)
    time.sleep(0.3)
    assert nodes[0].proc is not None and nodes[0].proc.poll() is None
    assert all_connected(nodes[0].nodes(), 2)
    assert "keeping the current node map" in (cluster.dir / "imex-0.log").read_text()


def test_hostnames_via_hosts_file_and_sigusr1(cluster: ImexCluster) -> None:
    """NVIDIA's DNS-name mode: a static list of names, the addresses come from a hosts file."""
    names = [f"compute-domain-daemon-{i:04d}" for i in range(3)]
    cluster.write_nodes(names)
    hosts = cluster.dir / "hosts"
    hosts.write_text(f"# sim hosts\n{cluster.ip(0)} {names[0]}\n{cluster.ip(1)}\t{names[1]}\n")
    env = {"NVLFABRIC_SIM_HOSTS_FILE": str(hosts)}
    nodes = [cluster.add(i, env=env) for i in range(2)]
    for node in nodes:
        node.start()
    view = nodes[0].wait_view(lambda v: conn_status(v, 0, 1) == "CONNECTED", "0-1 CONNECTED")
    assert conn_status(view, 0, 2) == "INVALID"
    assert view["nodes"]["0"]["hostName"] == names[0]
    assert view["nodes"]["2"]["host"] == names[2]

    hosts.write_text(hosts.read_text() + f"{cluster.ip(2)} {names[2]}\n")
    third = cluster.add(2, env=env).start()
    for node in nodes:
        node.signal(signal.SIGUSR1)
    for node in [*nodes, third]:
        node.wait_up(3)
    assert "Node #2   - compute-domain-daemon-0002" in nodes[0].ctl("-N", "-H").out


def test_own_address_from_cmd_bind_ip(cluster: ImexCluster) -> None:
    """The DRA-driver style config: BIND_INTERFACE_IP empty, the command service on the node's IP."""
    cluster.write_nodes(cluster.ip(i) for i in range(2))
    nodes = [cluster.add(i, BIND_INTERFACE_IP="") for i in range(2)]
    for node in nodes:
        node.start()
    nodes[1].wait_up(2)


def test_ctl_flags_ip_port_and_unix_socket(cluster: ImexCluster) -> None:
    cluster.write_nodes([cluster.ip(0)])
    sock = cluster.dir / "imex_ctrl.sock"
    node = cluster.add(0, IMEX_CMD_UNIX_DOMAIN_PATH=str(sock)).start()
    port = str(cluster.cmd_port)
    for args in (["-q", "-i", node.ip, port], ["-q", "-i", node.ip, "-p", port], ["-q", f"--u={sock}"],
                 ["-q", "-u", str(sock)]):
        res = node.ctl(*args, config=False)
        assert (res.rc, res.out) == (0, "READY\n"), args
    res = node.ctl("-Nj")
    assert res.rc == 0 and json.loads(res.out)["status"] == "UP"  # a single-node domain is UP
    node.stop()
    assert not sock.exists()


def test_query_without_daemon_is_unavailable(cluster: ImexCluster) -> None:
    cluster.write_nodes([cluster.ip(0)])
    node = cluster.add(0)
    res = node.ctl("-q")
    assert res.out == "UNAVAILABLE\n" and res.rc != 0
    assert "cannot reach" in res.err
    res = node.ctl("-N", "-j")
    assert res.rc != 0 and res.out == ""


def test_waiting_for_peers_until_ready(cluster: ImexCluster) -> None:
    cluster.write_nodes([cluster.ip(0)])
    node = cluster.add(0, env={"NVLFABRIC_SIM_IMEX_READY_DELAY_MS": "1500"}).start(wait_ready=False)
    res = eventually("command service up", lambda: r if (r := node.ctl("-q")).rc != 3 else None,
               timeout=10.0, interval=0.05)
    assert (res.rc, res.out) == (1, "WAITING_FOR_PEERS\n")
    assert node.nodes()["status"] == "DOWN"
    node.wait_ready()


def test_sigterm_exits_zero_promptly(cluster: ImexCluster) -> None:
    nodes = cluster.start(2, grace=0)
    nodes[0].wait_up(2)
    t0 = time.monotonic()
    assert nodes[1].stop(timeout=5) == 0
    assert time.monotonic() - t0 < 1.0
    eventually("peer DISCONNECTED", lambda: conn_status(nodes[0].nodes(), 0, 1) == "DISCONNECTED",
               timeout=10.0, interval=0.05)
    nodes[0].signal(signal.SIGINT)
    assert nodes[0].proc is not None and nodes[0].proc.wait(timeout=5) == 0
    assert "SHUTTING_DOWN" in (cluster.dir / "imex-0.log").read_text()


def test_daemonize_forks_into_background(cluster: ImexCluster) -> None:
    cluster.write_nodes([cluster.ip(0)])
    node = cluster.add(0, DAEMONIZE=1)
    parent = subprocess.run([str(cluster.bin / "nvidia-imex"), "-c", str(node.config)], capture_output=True,
                            timeout=10, check=False)
    assert parent.returncode == 0
    log = cluster.dir / "imex-0.log"
    match = eventually("daemon pid", lambda: re.search(r"DAEMONIZE=1\), pid (\d+)", log.read_text()),
               timeout=10.0, interval=0.05)
    pid = int(match.group(1))
    try:
        assert node.ctl("-q").out == "READY\n"
    finally:
        os.kill(pid, signal.SIGTERM)
    eventually("daemon gone", lambda: not Path(f"/proc/{pid}").exists() or "stopped" in log.read_text(),
               timeout=10.0, interval=0.05)


def test_port_flag_overrides_server_port(cluster: ImexCluster, imex_bin: Path) -> None:
    cluster.write_nodes([cluster.ip(0)])
    node = cluster.add(0)
    out = subprocess.run([str(imex_bin / "nvidia-imex"), "-c", str(node.config), "--port", "45678",
                          "--check-config"], capture_output=True, text=True, check=True).stdout
    assert "SERVER_PORT=45678\n" in out


@pytest.mark.parametrize(
    ("line", "key"),
    [
        ("SERVER_PORT=70000", "SERVER_PORT"),
        ("LOG_LEVEL=loud", "LOG_LEVEL"),
        ("DAEMONIZE=2", "DAEMONIZE"),
        ("BIND_INTERFACE_IP=10.0.0.300", "BIND_INTERFACE_IP"),
        ("IMEX_CMD_BIND_INTERFACE_IP=fe80::1", "IMEX_CMD_BIND_INTERFACE_IP"),
        ("IMEX_WAIT_FOR_QUORUM=SOMETIMES", "IMEX_WAIT_FOR_QUORUM"),
        ("IMEX_NODE_DISCONNECTED_GRACE_TIME=-2", "IMEX_NODE_DISCONNECTED_GRACE_TIME"),
        ("IMEX_ENABLE_AUTH_ENCRYPTION=2", "IMEX_ENABLE_AUTH_ENCRYPTION"),
        ("THIS LINE HAS NO EQUALS SIGN", "THIS LINE HAS NO EQUALS SIGN"),
        ("BAD KEY=1", "BAD KEY"),
    ],
)
def test_malformed_config_names_file_line_and_key(cluster: ImexCluster, imex_bin: Path, line: str,
                                                  key: str) -> None:
    cluster.write_nodes([cluster.ip(0)])
    good = ImexConfig.for_child_process(nodes_file=cluster.nodes_file, cmd_bind_ip=cluster.ip(0),
                                        cmd_port=cluster.cmd_port, server_port=cluster.server_port)
    path = cluster.dir / "bad.cfg"
    write_config(path, good)
    lines = path.read_text().splitlines()
    lines.insert(3, line)
    path.write_text("\n".join(lines) + "\n")
    for extra in (["--check-config"], []):
        proc = subprocess.run([str(imex_bin / "nvidia-imex"), "-c", str(path), *extra], capture_output=True,
                              text=True, timeout=10, check=False)
        assert proc.returncode == 1, proc
        assert f"{path}:4:" in proc.stderr and key in proc.stderr, proc.stderr
        assert proc.stderr.startswith("nvidia-imex: error: ")
    ctl = subprocess.run([str(imex_bin / "nvidia-imex-ctl"), "-c", str(path), "-q"], capture_output=True,
                         text=True, timeout=10, check=False)
    assert ctl.returncode == 2 and f"{path}:4:" in ctl.stderr


def test_unknown_keys_and_comments_are_accepted(cluster: ImexCluster) -> None:
    cluster.write_nodes([cluster.ip(0)])
    node = cluster.add(0)
    text = node.config.read_text()
    node.config.write_text("# a comment\n\n   # indented comment\nSOME_FUTURE_KEY = whatever\n" + text)
    node.start()


def test_missing_nodes_file_and_no_local_address(cluster: ImexCluster, imex_bin: Path) -> None:
    node = cluster.add(0)  # nodes.cfg never written
    proc = subprocess.run([str(imex_bin / "nvidia-imex"), "-c", str(node.config)], capture_output=True, text=True,
                          timeout=10, check=False)
    assert proc.returncode == 1 and "nodes.cfg" in proc.stderr
    cluster.write_nodes(["10.255.255.1", "10.255.255.2"])
    node2 = cluster.add(1, BIND_INTERFACE_IP="", IMEX_CMD_BIND_INTERFACE_IP="")
    proc = subprocess.run([str(imex_bin / "nvidia-imex"), "-c", str(node2.config)], capture_output=True, text=True,
                          timeout=10, check=False)
    assert proc.returncode == 1 and "BIND_INTERFACE_IP" in proc.stderr
