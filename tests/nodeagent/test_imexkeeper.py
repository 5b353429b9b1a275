"""The IMEX keeper with the simulator's stand-in daemons: what the agent asks for runs, and what
runs survives the agent and even the keeper process itself (it is adopted, not restarted)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nvlfabric.nodeagent import files, imex, imexkeeper
from nvlfabric.nodeagent.imexkeeper import Ensure, Keeper, KeeperDomain, Status, Stop
from nvlfabric.sim.cluster import eventually
from tests.support.imexnodes import Nodes, gone, ip


def keeper_at(nodes: Nodes, i: int) -> tuple[Keeper, Path, imexkeeper.Server]:
    workdir = nodes.root / f"node{i}"
    keeper = Keeper(workdir, nodes.driver_root)
    sock = Path(f"/tmp/nvlk-{os.getpid()}-{i}-{time.monotonic_ns()}.sock")  # unix socket paths are short
    return keeper, sock, imexkeeper.serve(keeper, sock)


def client(nodes: Nodes, i: int, sock: Path, domain_id: str = "clique-a") -> KeeperDomain:
    return KeeperDomain(sock, domain_id=domain_id, workdir=nodes.root / f"node{i}", driver_root=nodes.driver_root,
                        bind_address=ip(i), server_port=nodes.server_port, cmd_port=nodes.cmd_port)


def test_the_agents_domain_runs_in_the_keeper_and_follows_members_without_restarts(nodes: Nodes) -> None:
    keeper, sock, server = keeper_at(nodes, 1)
    try:
        d = client(nodes, 1, sock)
        assert d.pid is None and d.poll() is None  # nothing runs yet
        assert d.run([ip(1)]) == "started"
        d.wait_ready(10)
        pid = d.pid
        assert pid is not None and d.members == [ip(1)]
        assert d.run([ip(1)]) is None  # already so: nothing done
        assert d.run([ip(2), ip(1)]) == "members changed"
        assert d.pid == pid and d.members == [ip(1), ip(2)]
        assert d.nodes_path.read_text() == f"{ip(1)}\n{ip(2)}\n"
        # A second handle (a restarted agent) sees the same daemon and changes nothing.
        again = client(nodes, 1, sock)
        assert again.pid == pid and again.run([ip(1), ip(2)]) is None and again.pid == pid

        os.kill(pid, signal.SIGKILL)
        assert eventually("the keeper to see the crash", lambda: d.poll(),
                   timeout=10.0, interval=0.05) == -signal.SIGKILL
        assert d.run([ip(1), ip(2)]) == "started" and d.pid not in (None, pid)
        d.wait_ready(10)
        d.stop()
        assert d.pid is None and not d.dir.exists()
    finally:
        server.close()
        keeper.stop_all()


def test_a_restarted_keeper_adopts_the_running_daemon_instead_of_restarting_it(nodes: Nodes) -> None:
    keeper, sock, server = keeper_at(nodes, 1)
    d = client(nodes, 1, sock)
    d.run([ip(1), ip(2)])
    d.wait_ready(10)
    pid = d.pid
    server.close()  # the keeper process is gone; its daemon is not
    assert pid is not None and not gone(pid)

    second, sock2, server2 = keeper_at(nodes, 1)
    try:
        (state,) = second.handle(Status()).domains
        assert (state.pid, state.members, state.adopted, state.exit) == (pid, [ip(1), ip(2)], True, None)
        d2 = client(nodes, 1, sock2)
        assert d2.run([ip(1), ip(2)]) is None and d2.pid == pid  # same members: nothing to do
        assert d2.ready()
        assert d2.run([ip(1), ip(2), ip(3)]) == "members changed" and d2.pid == pid  # SIGUSR1, not a restart
        os.kill(pid, signal.SIGKILL)  # not the keeper's child: it sees the exit, not the status
        assert eventually("the adopted daemon's exit", lambda: d2.poll(), timeout=10.0, interval=0.05) == 255
        assert d2.run([ip(1), ip(2), ip(3)]) == "started"
        d2.wait_ready(10)
        d2.stop()
        assert not d2.dir.exists()
    finally:
        server2.close()
        second.stop_all()
        keeper.stop_all()


def test_a_daemon_whose_files_do_not_say_what_it_runs_with_is_stopped(nodes: Nodes) -> None:
    d = nodes.domain(1)
    d.ensure_running([ip(1)])
    d.wait_ready(10)
    pid = d.pid
    assert pid is not None
    # Its nodes file no longer holds a member list (a hand edit, a torn write by other software):
    # the keeper cannot say whom it serves, so it stops it and the agent starts the domain afresh.
    d.nodes_path.write_text("-not-a-member-\n")
    keeper = Keeper(nodes.root / "node1", nodes.driver_root)
    assert keeper.domains == {}
    assert not imex.daemons_using(d.config_path)
    # Private `_proc`: the daemon is this test process's child, and only its Popen can reap it
    # (a public call such as stop() would signal it itself; the test checks that another process did).
    d._proc.wait(timeout=5)  # type: ignore[union-attr]
    assert gone(pid)


def test_an_absent_keeper_is_named_with_what_to_check(nodes: Nodes) -> None:
    d = client(nodes, 1, nodes.root / "no-keeper.sock")
    with pytest.raises(imexkeeper.KeeperUnavailable, match="nvlfabric-imex DaemonSet"):
        d.run([ip(1)])


def test_bad_requests_are_refused_and_the_keeper_stays(nodes: Nodes) -> None:
    keeper, sock, server = keeper_at(nodes, 1)
    try:
        with pytest.raises(imex.ImexError, match="not among the members"):
            imexkeeper.call(sock, Ensure(domain="clique-a", bind_address=ip(1), server_port=nodes.server_port,
                                         cmd_port=nodes.cmd_port, members=[ip(2)]))
        with pytest.raises(imex.ImexError, match="DNS label"):
            imexkeeper.call(sock, Ensure(domain="../etc", bind_address=ip(1), server_port=1, cmd_port=2,
                                         members=[ip(1)]))
        imexkeeper.call(sock, Stop(domain="../etc"))  # nothing of that name: nothing removed
        assert (nodes.root / "node1").is_dir()
        assert imexkeeper.call(sock, Status()).domains == []
    finally:
        server.close()
        keeper.stop_all()


def test_the_keeper_process_stops_its_daemons_on_sigterm_and_says_so(nodes: Nodes, tmp_path: Path) -> None:
    kubelet_root = Path(f"/tmp/nvlk-{os.getpid()}-root")
    workdir = imexkeeper.default_workdir(kubelet_root)
    proc = subprocess.Popen([sys.executable, "-m", "nvlfabric", "imex", "--kubelet-root", str(kubelet_root),
                             "--driver-root", str(nodes.driver_root), "--log-format", "text"],
                            stderr=subprocess.PIPE, text=True)
    try:
        sock = workdir / imexkeeper.SOCKET_NAME
        eventually("the keeper's socket", sock.exists, timeout=10.0, interval=0.05)
        d = KeeperDomain(sock, domain_id="clique-a", workdir=workdir, driver_root=nodes.driver_root,
                         bind_address=ip(1), server_port=nodes.server_port, cmd_port=nodes.cmd_port)
        d.run([ip(1)])
        d.wait_ready(10)
        pid = d.pid
        assert pid is not None
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
        assert proc.returncode == 0, err
        assert gone(pid) and not sock.exists()
        assert "stopping the daemon" in err and "clique-a" in err
    finally:
        if proc.poll() is None:
            proc.kill()
        import shutil
        shutil.rmtree(kubelet_root, ignore_errors=True)


@pytest.mark.parametrize(("line", "error"), [
    (b'{"op": "ensure", "domain": "a", "bind_address": "x", "server_port": "50000", "cmd_port": 1, "members": []}',
     "Ensure.server_port: '50000' is not a int"),
    (b'{"op": "ensure", "domain": "a", "bind_address": "x", "server_port": 1, "cmd_port": 1, "members": [1]}',
     "Ensure.members: [1] is not a list[str]"),
    (b'{"op": "stop"}', "Stop.domain: missing"),
    (b'{"op": "stop", "domain": "a", "force": true}', "Stop: unknown field(s) force"),
    (b'{"op": "restart"}', "op: must be one of ensure, stop, status"),
    (b'not json', "not JSON"),
])
def test_a_bad_request_is_refused_naming_the_field(line: bytes, error: str) -> None:
    with pytest.raises(ValueError, match=re.escape(error)):
        imexkeeper.decode_request(line)


def test_messages_round_trip() -> None:
    reply = imexkeeper.Reply(done="started", domains=[imexkeeper.DomainState("clique-a", 7, None, ["10.0.0.1"], 50000,
                                                                             False)])
    assert imexkeeper.decode_reply(imexkeeper.encode(reply)) == reply
    ensure = Ensure(domain="a", bind_address="10.0.0.1", server_port=1, cmd_port=2, members=["10.0.0.1"])
    assert imexkeeper.decode_request(imexkeeper.encode(ensure)) == ensure


def test_an_ensure_without_tls_is_what_a_keeper_of_the_previous_release_reads() -> None:
    """The keeper DaemonSet is OnDelete: after an upgrade the old keepers serve the new agents, and
    they refuse unknown fields. Only a TLS domain's Ensure carries the new one."""
    plain = Ensure(domain="a", bind_address="10.0.0.1", server_port=1, cmd_port=2, members=["10.0.0.1"])
    assert "tls_target" not in json.loads(imexkeeper.encode(plain))
    tls = Ensure(domain="a", bind_address="10.0.0.1", server_port=1, cmd_port=2, members=["10.0.0.1"],
                 tls_target="u.imex.nvlfabric.io")
    assert json.loads(imexkeeper.encode(tls))["tls_target"] == "u.imex.nvlfabric.io"
    assert imexkeeper.decode_request(imexkeeper.encode(tls)) == tls


def test_a_stopped_domains_directory_goes_and_what_its_links_point_at_stays(tmp_path: Path) -> None:
    """Stop removes the domain's files (config, nodes file, credentials) whatever they are, and never
    what a symbolic link in there points at."""
    outside = tmp_path / "outside"
    (outside / "keep").mkdir(parents=True)
    (outside / "keep" / "file").write_text("x")
    domain = tmp_path / "work" / "clique-a"
    (domain / "tls" / "deep").mkdir(parents=True)
    (domain / "config.cfg").write_text("SERVER_PORT=1\n")
    (domain / "tls" / "deep" / "key.pem").write_text("k")
    (domain / "tls" / "ca.pem").symlink_to(outside / "keep" / "file")
    (domain / "linked-dir").symlink_to(outside / "keep")
    files.remove_tree(domain)
    assert not domain.exists() and (tmp_path / "work").is_dir()
    assert (outside / "keep" / "file").read_text() == "x"
    files.remove_tree(domain)  # gone already: nothing to do
