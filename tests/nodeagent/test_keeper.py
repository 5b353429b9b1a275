"""The node's IMEX keeper (the C program) as the agent drives it, through `KeeperDomain`, with the
simulator's stand-in daemons: what the agent asks for runs, follows its members without restarts,
and survives the agent and even the keeper process itself (it is adopted, not restarted).

Every simulated node has its own loopback address (127.0.30.x), work directory and keeper; the
members of a domain share its ports, as real members do.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nvlfabric.nodeagent import imex, imexkeeper
from nvlfabric.nodeagent.imexkeeper import KeeperDomain, Stop
from nvlfabric.sim.cluster import eventually
from tests.sim.imex_fixtures import TlsAuthority
from tests.support.imexnodes import Nodes, credentials, fake_driver_root, free_port, gone, ip, spawn_daemon


def view(d: KeeperDomain) -> dict[str, Any]:
    """The daemon's own view of its domain (`nvidia-imex-ctl -N -j`)."""
    proc = subprocess.run([str(d.ctl_binary), "-c", str(d.config_path), "-N", "-j"], capture_output=True,
                          text=True, timeout=10, check=False)
    assert proc.returncode == 0, proc.stderr
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


def all_connected(d: KeeperDomain, n: int) -> bool:
    v = view(d)
    return bool(v["status"] == "UP" and len(v["nodes"]) == n
                and all(node["status"] == "READY"
                        and all(c["status"] == "CONNECTED" for c in node["connections"].values())
                        for node in v["nodes"].values()))


def wait_all_connected(domains: list[KeeperDomain], n: int) -> None:
    for d in domains:
        eventually(f"{n} connected, seen from {d.bind_address}", functools.partial(all_connected, d, n),
                   timeout=10.0, interval=0.05)


def start_domain(nodes: Nodes, count: int) -> list[KeeperDomain]:
    members = [ip(i) for i in range(1, count + 1)]
    domains = [nodes.domain(i) for i in range(1, count + 1)]
    for d in domains:
        assert d.run(members) == "started"
    for d in domains:
        d.wait_ready(10)
    return domains


def files_without_a_daemon(nodes: Nodes, i: int) -> KeeperDomain:
    """Node i's domain files as a keeper wrote them, no daemon running and a keeper that knows of none."""
    d = nodes.domain(i)
    assert d.run([ip(i)]) == "started"
    d.wait_ready(10)
    pid = d.pid
    assert pid is not None
    nodes.keeper(i).kill()
    os.kill(pid, signal.SIGTERM)
    eventually("the daemon to stop", lambda: gone(pid), timeout=10, interval=0.02)
    d = nodes.domain(i)  # a new keeper: nothing to adopt
    assert d.pid is None and d.config_path.exists()
    return d


# ----------------------------------------------------------------------------------------------
# A domain of real (stand-in) daemons


def test_three_members_become_ready_and_connected(nodes: Nodes) -> None:
    domains = start_domain(nodes, 3)
    assert all(d.ready() for d in domains)
    wait_all_connected(domains, 3)
    d0 = domains[0]
    assert d0.nodes_path.read_text() == f"{ip(1)}\n{ip(2)}\n{ip(3)}\n"
    assert d0.poll() is None and d0.pid is not None and d0.members == [ip(1), ip(2), ip(3)]
    assert (d0.dir / "imex.pid").read_text() == f"{d0.pid}\n"


def test_the_daemon_runs_apart_from_the_keeper_and_a_second_handle_sees_it(nodes: Nodes) -> None:
    d = nodes.domain(1)
    assert d.pid is None and d.poll() is None  # nothing runs yet
    assert d.run([ip(1)]) == "started"
    d.wait_ready(10)
    pid = d.pid
    assert pid is not None and not d.adopted
    # Its own session (a keeper's stop or crash does not take it along), stdin /dev/null, output to
    # its log, and none of the keeper's descriptors (a socket of the keeper's would outlive it).
    assert os.getsid(pid) == pid
    fds = {int(f): os.readlink(f"/proc/{pid}/fd/{f}") for f in os.listdir(f"/proc/{pid}/fd")}
    assert (fds[0], fds[1], fds[2]) == ("/dev/null", str(d.log_path), str(d.log_path))
    keeper = nodes.keeper(1)
    keeper_fds = {os.readlink(f"/proc/{keeper.pid}/fd/{f}") for f in os.listdir(f"/proc/{keeper.pid}/fd")}
    assert not {v for v in fds.values() if v.startswith("socket:")} & keeper_fds
    assert d.run([ip(1)]) is None  # already so: nothing done
    again = nodes.domain(1)  # a restarted agent's handle
    assert again.pid == pid and again.run([ip(1)]) is None and again.pid == pid


def test_a_new_member_joins_through_sigusr1_without_restarts(nodes: Nodes) -> None:
    domains = start_domain(nodes, 3)
    pids = [d.pid for d in domains]
    members = [ip(4), ip(1), ip(3), ip(2)]  # any order: every member writes the same file
    fourth = nodes.domain(4)
    assert fourth.run(members) == "started"
    fourth.wait_ready(10)
    assert all(d.run(members) == "members changed" for d in domains)
    assert domains[0].run(list(reversed(members))) is None  # unchanged: no signal, no rewrite
    wait_all_connected([*domains, fourth], 4)
    assert [d.pid for d in domains] == pids and all(d.poll() is None for d in domains)
    assert {d.nodes_path.read_text() for d in [*domains, fourth]} == {"".join(f"{ip(i)}\n" for i in range(1, 5))}
    assert "SIGUSR1: re-reading" in domains[0].log_path.read_text()
    assert f"IMEX domain clique-a: members now {', '.join(ip(i) for i in range(1, 5))} (SIGUSR1 to pid {pids[0]})" \
        in nodes.keeper(1).log.read_text()


def test_stopping_a_member_is_noticed_and_leaves_no_process(nodes: Nodes) -> None:
    domains = start_domain(nodes, 3)
    wait_all_connected(domains, 3)
    pid = domains[2].pid
    assert pid is not None
    assert domains[2].stop() is None  # it ran, it did not exit on its own
    assert gone(pid) and not domains[2].dir.exists()
    assert domains[2].pid is None and domains[2].poll() is None and not domains[2].ready()

    def lost(d: KeeperDomain) -> bool:
        v = view(d)
        return bool(v["status"] == "DEGRADED" and v["nodes"]["2"]["status"] == "UNAVAILABLE"
                    and v["nodes"]["0"]["connections"]["2"]["status"] != "CONNECTED")

    for d in domains[:2]:
        eventually(f"node 3 lost, seen from {d.bind_address}", functools.partial(lost, d), timeout=10.0,
                   interval=0.05)
    assert domains[2].stop() is None  # stopping twice is harmless
    assert f"IMEX domain clique-a: stopped the daemon (pid {pid}, exit status 0)" in nodes.keeper(3).log.read_text()


def test_a_crashed_daemon_is_detected_logged_once_and_restarted(nodes: Nodes) -> None:
    domains = start_domain(nodes, 2)
    victim = domains[1]
    old = victim.pid
    assert old is not None
    os.kill(old, signal.SIGKILL)
    assert eventually("the keeper to see the crash", victim.poll, timeout=10.0, interval=0.05) == -signal.SIGKILL
    assert not victim.ready()
    with pytest.raises(imex.ImexDaemonExited, match=r"exited with status -9 before it was READY"):
        victim.wait_ready(1)
    log = nodes.keeper(2).log
    said = f"IMEX domain clique-a: the daemon (pid {old}) exited with status -9; log: "
    eventually("the keeper's log to say so", lambda: said in log.read_text(), timeout=5, interval=0.05)
    assert victim.run([ip(1), ip(2)]) == "started"
    victim.wait_ready(10)
    assert victim.pid not in (None, old) and victim.poll() is None
    assert victim.log_path.with_name("imex.log.1").exists()  # the crashed run's log is kept
    wait_all_connected(domains, 2)
    text = log.read_text()
    assert text.count(said) == 1 and f"(pid {victim.pid}, the last one exited with -9)" in text


def test_a_restarted_keeper_adopts_the_running_daemon_instead_of_restarting_it(nodes: Nodes) -> None:
    d = nodes.domain(1)
    assert d.run([ip(1), ip(2)]) == "started"
    d.wait_ready(10)
    pid = d.pid
    assert pid is not None
    nodes.keeper(1).kill()  # the keeper process is gone; its daemon is not
    assert not gone(pid)

    d2 = nodes.domain(1)  # starts the next keeper
    (state,) = nodes.keeper(1).status()
    assert (state.pid, state.members, state.adopted, state.exit) == (pid, [ip(1), ip(2)], True, None)
    assert f"IMEX domain clique-a: adopted the running daemon (pid {pid}, members {ip(1)}, {ip(2)})" in \
        nodes.keeper(1).log.read_text()
    assert d2.run([ip(1), ip(2)]) is None and d2.pid == pid  # same members: nothing to do
    assert d2.ready() and d2.adopted
    assert d2.run([ip(1), ip(2), ip(3)]) == "members changed" and d2.pid == pid  # SIGUSR1, not a restart
    os.kill(pid, signal.SIGKILL)  # not the keeper's child: it sees the exit, not the status
    assert eventually("the adopted daemon's exit", d2.poll, timeout=10.0, interval=0.05) == 255
    assert d2.run([ip(1), ip(2), ip(3)]) == "started" and not d2.adopted
    d2.wait_ready(10)
    d2.stop()
    assert not d2.dir.exists()


def test_a_daemon_whose_files_do_not_say_what_it_runs_with_is_stopped(nodes: Nodes) -> None:
    d = nodes.domain(1)
    d.run([ip(1)])
    d.wait_ready(10)
    pid = d.pid
    assert pid is not None
    nodes.keeper(1).kill()
    # Its nodes file no longer holds a member list (a hand edit, a torn write by other software): the
    # keeper cannot say whom it serves, so it stops it, and the agent starts the domain afresh.
    d.nodes_path.write_text("-not-a-member-\n")
    keeper = nodes.keeper(1)
    assert keeper.status() == []
    assert gone(pid) and not (d.dir / "imex.pid").exists()
    assert (f'stopping the daemon(s) running from it (pid {pid}), which cannot be adopted: {d.nodes_path}: '
            '"-not-a-member-" is neither an IP address nor a host name') in keeper.log.read_text()


def test_two_daemons_of_one_config_are_both_stopped(nodes: Nodes) -> None:
    d = files_without_a_daemon(nodes, 1)
    first = spawn_daemon(nodes, d.config_path)
    # and a process that looks like a second one (argv[0] .../nvidia-imex, "-c <config>")
    second = subprocess.Popen([str(nodes.root / "nvidia-imex"), "-c", "import time; time.sleep(60)", "-c",
                               str(d.config_path)], executable=sys.executable, start_new_session=True)
    try:
        eventually("both to run", lambda: len(imex_daemons(d.config_path)) == 2, timeout=5, interval=0.02)
        keeper = nodes.keeper(1)
        keeper.kill()
        keeper = nodes.keeper(1)
        assert keeper.status() == []
        assert first.wait(10) == 0 and second.wait(10) == -signal.SIGTERM
        assert "stopping the daemon(s) running from it" in keeper.log.read_text()
        assert "2 daemons run from its config" in keeper.log.read_text()
    finally:
        for p in (first, second):
            if p.poll() is None:
                p.kill()
                p.wait()


def imex_daemons(config: Path) -> list[int]:
    """Live processes that run as daemons of `config` (argv[0] .../nvidia-imex, then -c <config>)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0].endswith(b"/nvidia-imex") and str(config).encode() in argv and not gone(int(entry.name)):
            found.append(int(entry.name))
    return found


def test_a_daemon_nobody_holds_is_replaced_when_the_domain_starts(nodes: Nodes) -> None:
    """A keeper killed between starting a daemon and recording it leaves one that holds the domain's
    ports: the next start stops it first."""
    d = files_without_a_daemon(nodes, 1)
    stale = spawn_daemon(nodes, d.config_path)
    assert d.run([ip(1)]) == "started"
    d.wait_ready(10)
    assert stale.wait(10) == 0 and d.pid != stale.pid and imex_daemons(d.config_path) == [d.pid]


def test_a_domain_unknown_to_the_keeper_is_stopped_by_stop(nodes: Nodes) -> None:
    d = files_without_a_daemon(nodes, 1)
    stale = spawn_daemon(nodes, d.config_path)
    d.stop()
    assert stale.wait(10) == 0 and not d.dir.exists()


def test_two_domains_on_one_node_need_distinct_ports(nodes: Nodes) -> None:
    a = nodes.domain(5, "clique-a")
    a.run([ip(5)])
    a.wait_ready(10)
    clash = nodes.domain(5, "cd-b")
    with pytest.raises(imex.ImexError) as err:
        clash.run([ip(5)])
    assert str(err.value) == (
        f"the IMEX keeper refused: IMEX domain cd-b: the IMEX peer port (SERVER_PORT) {ip(5)}:{nodes.server_port} is "
        "not free (Address already in use); another IMEX domain on this node uses the same port slot, or another "
        "program holds the port")
    assert [s.domain for s in nodes.keeper(5).status()] == ["clique-a"]  # the refused one is not kept
    hosts = [ip(5)]
    server = free_port(hosts, {nodes.server_port, nodes.cmd_port})
    other = nodes.domain(5, "cd-b", server_port=server,
                         cmd_port=free_port(hosts, {nodes.server_port, nodes.cmd_port, server}))
    assert other.run([ip(5)]) == "started"
    other.wait_ready(10)
    assert a.ready() and other.ready()
    assert [s.domain for s in nodes.keeper(5).status()] == ["cd-b", "clique-a"]


def test_a_changed_port_restarts_the_daemon(nodes: Nodes) -> None:
    """The daemon reads its config only at start: a new one means a restart (never a silent mismatch)."""
    d = nodes.domain(1)
    d.run([ip(1)])
    d.wait_ready(10)
    pid = d.pid
    assert pid is not None
    port = free_port([ip(1)], {nodes.server_port, nodes.cmd_port})
    moved = nodes.domain(1, server_port=port)
    assert moved.run([ip(1)]) == "started" and moved.pid != pid and gone(pid)
    moved.wait_ready(10)
    assert f"SERVER_PORT={port}\n" in moved.config_path.read_text()
    assert [s.server_port for s in nodes.keeper(1).status()] == [port]
    assert "IMEX domain clique-a: ports, address or authentication changed, restarting it" in \
        nodes.keeper(1).log.read_text()


def test_a_slow_daemon_times_out_with_what_was_seen(nodes: Nodes) -> None:
    nodes.keeper(6, env={"NVLFABRIC_SIM_IMEX_READY_DELAY_MS": "60000"})  # the daemons inherit its environment
    d = nodes.domain(6)
    d.run([ip(6)])
    with pytest.raises(imex.ImexNotReady, match=r"not READY after 0.5 s; last query: WAITING_FOR_PEERS \(exit 1"):
        d.wait_ready(0.5)
    assert not d.ready() and d.poll() is None


def test_a_daemon_that_exits_at_start_is_reported_with_its_log(nodes: Nodes, tmp_path: Path) -> None:
    root = fake_driver_root(tmp_path, b"#!/bin/sh\necho 'nvidia-imex: error: driver version mismatch' >&2\nexit 1\n")
    keeper = nodes.keeper(1, driver_root=root)
    d = nodes.domain(1)
    assert d.run([ip(1)]) == "started"
    with pytest.raises(imex.ImexDaemonExited, match=r"status 1 before it was READY.*driver version mismatch"):
        d.wait_ready(10)
    eventually("the keeper's log line", lambda: "exited with status 1; log: nvidia-imex: error: driver version "
               "mismatch" in keeper.log.read_text(), timeout=5, interval=0.05)


def test_a_missing_or_broken_binary_is_named(nodes: Nodes, tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    nodes.keeper(1, driver_root=missing)
    with pytest.raises(imex.ImexError) as err:
        nodes.domain(1).run([ip(1)])
    assert str(err.value) == (f"the IMEX keeper refused: IMEX domain clique-a: {missing}/usr/bin/nvidia-imex is "
                              "missing or not executable (--driver-root / $DRIVER_ROOT names the driver's root)")
    broken = fake_driver_root(tmp_path, b"\x7fELF garbage")
    nodes.keeper(2, driver_root=broken)
    with pytest.raises(imex.ImexError) as err:
        nodes.domain(2).run([ip(2)])
    assert str(err.value) == ("the IMEX keeper refused: IMEX domain clique-a: cannot run "
                              f"{broken}/usr/bin/nvidia-imex: Exec format error")
    assert nodes.keeper(1).status() == [] and nodes.keeper(2).status() == []


def test_an_absent_keeper_is_named_with_what_to_check(nodes: Nodes) -> None:
    d = KeeperDomain(nodes.root / "no-keeper.sock", domain_id="clique-a", workdir=nodes.workdir(1),
                     driver_root=nodes.driver_root, bind_address=ip(1))
    with pytest.raises(imexkeeper.KeeperUnavailable, match="nvlfabric-imex DaemonSet"):
        d.run([ip(1)])


def test_a_tls_domain_loads_renewed_credentials_without_a_restart(nodes: Nodes, tmp_path: Path) -> None:
    target = "u.imex.nvlfabric.io"
    ca = TlsAuthority(tmp_path / "pki", "domain-u")
    d = nodes.domain(1, tls_target=target)
    credentials(d, ca, target)
    assert d.run([ip(1)]) == "started"
    d.wait_ready(10)
    pid = d.pid
    assert "IMEX_ENABLE_AUTH_ENCRYPTION=1\n" in d.config_path.read_text()
    assert d.run([ip(1)]) is None
    credentials(d, ca, target)  # renewal: a new key and certificate
    assert d.run([ip(1)]) == "credentials changed" and d.pid == pid
    assert d.run([ip(1)]) is None
    eventually("the daemon to load them", lambda: "SIGUSR1" in d.log_path.read_text(), timeout=5, interval=0.05)
    assert f"IMEX domain clique-a: new credentials (SIGUSR1 to pid {pid})" in nodes.keeper(1).log.read_text()
    # the same domain without TLS: another config, so another daemon
    plain = nodes.domain(1)
    assert plain.run([ip(1)]) == "started" and plain.pid != pid
    assert "IMEX_AUTH" not in plain.config_path.read_text()


def test_a_stopped_domains_directory_goes_and_what_its_links_point_at_stays(nodes: Nodes, tmp_path: Path) -> None:
    """Stop removes the domain's files (config, nodes file, credentials) whatever they are, and never
    what a symbolic link in there points at."""
    d = nodes.domain(1)
    d.run([ip(1)])
    outside = tmp_path / "outside"
    (outside / "keep").mkdir(parents=True)
    (outside / "keep" / "file").write_text("x")
    (d.dir / "tls" / "deep").mkdir(parents=True)
    (d.dir / "tls" / "deep" / "key.pem").write_text("k")
    (d.dir / "tls" / "ca.pem").symlink_to(outside / "keep" / "file")
    (d.dir / "linked-dir").symlink_to(outside / "keep")
    d.stop()
    assert not d.dir.exists() and d.dir.parent.is_dir()
    assert (outside / "keep" / "file").read_text() == "x"
    # a domain directory that is itself a link: the link goes, its target stays
    (nodes.workdir(1) / "cd-x").symlink_to(outside / "keep")
    nodes.keeper(1).call(Stop(domain="cd-x"))
    assert not (nodes.workdir(1) / "cd-x").is_symlink() and (outside / "keep" / "file").read_text() == "x"

