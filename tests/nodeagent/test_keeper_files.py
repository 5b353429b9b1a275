"""The files the IMEX keeper writes for a domain, byte for byte, and the daemons it adopts from them.

These bytes are a contract across releases: every member of a domain must write the identical nodes
file (IMEX compares a hash of the map and refuses peers whose map differs), whichever release of
the keeper each member runs, and a keeper restart or upgrade that rewrote a running daemon's config
would restart it, invalidating every NVLink mapping imported through it. tests/golden/imex/ holds the
configs releases have written (`/WORKDIR` standing for the work directory).
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nvlfabric.api import names
from nvlfabric.nodeagent import imex, imexconfig
from nvlfabric.nodeagent.imexkeeper import Ensure, KeeperDomain
from nvlfabric.sim.imex.config import ImexConfig as SimImexConfig
from tests.sim.imex_fixtures import TlsAuthority
from tests.support.imexnodes import Nodes, credentials, fake_driver_root, ip, spawn_daemon
from tests.support.keepers import Keeper, program

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "imex"
SLOT3 = imexconfig.ports_for_slot(3)

#: The request each golden file answers: domain, server port, command port, TLS target (address 10.4.0.7).
GOLDEN_REQUESTS = {
    "clique-config.cfg": ("clique-0f2e.32766", 50000, 50005, ""),
    "dedicated-slot3-config.cfg": ("cd-6a1b", SLOT3.server, SLOT3.cmd, ""),
    "dedicated-tls-config.cfg": ("cd-6a1b", SLOT3.server, SLOT3.cmd, "6a1b.imex.nvlfabric.io"),
}

#: A daemon that only sleeps (SIGUSR1 ignored), for tests about files: no peers, no name lookups.
SLEEPER = b"#!/bin/sh\ntrap '' USR1\nwhile :; do sleep 1; done\n"


def test_the_golden_files_are_every_one_of_them() -> None:
    assert sorted(p.name for p in GOLDEN.glob("*.cfg")) == sorted(GOLDEN_REQUESTS)


@pytest.mark.parametrize("name", sorted(GOLDEN_REQUESTS))
def test_the_keeper_writes_the_config_every_release_writes(nodes: Nodes, name: str) -> None:
    """The same request gives the same bytes as the golden file. The keeper writes the files before
    it starts the daemon, which here it cannot: 10.4.0.7 is not this machine's address."""
    domain, server, cmd, target = GOLDEN_REQUESTS[name]
    keeper = nodes.keeper(1)
    req = Ensure(domain=domain, bind_address="10.4.0.7", server_port=server, cmd_port=cmd,
                 members=["10.4.0.8", "10.4.0.7"], tls_target=target)
    with pytest.raises(imex.ImexError, match=r"10\.4\.0\.7:\d+ is not free \(Cannot assign requested address\)"):
        keeper.call(req)
    written = (nodes.workdir(1) / domain / "config.cfg").read_text()
    assert written == (GOLDEN / name).read_text().replace("/WORKDIR", str(nodes.workdir(1)))
    assert (nodes.workdir(1) / domain / "nodes.cfg").read_text() == "10.4.0.7\n10.4.0.8\n"
    assert keeper.status() == []  # nothing of it runs: not a domain of this node


def test_the_slot_golden_file_is_slot_3_and_slots_never_overlap() -> None:
    text = (GOLDEN / "dedicated-slot3-config.cfg").read_text()
    assert f"SERVER_PORT={SLOT3.server}\n" in text and f"IMEX_CMD_PORT={SLOT3.cmd}\n" in text
    assert imexconfig.ports_for_slot(0) == imexconfig.DomainPorts(server=50000, cmd=50005)
    ports = [p for s in range(names.MAX_IMEX_PORT_SLOT + 1)
             for p in (imexconfig.ports_for_slot(s).server, imexconfig.ports_for_slot(s).cmd)]
    assert len(set(ports)) == len(ports) and max(ports) < 51000
    with pytest.raises(ValueError, match="slot"):
        imexconfig.ports_for_slot(names.MAX_IMEX_PORT_SLOT + 1)


def test_the_config_uses_the_real_keys_and_the_daemon_accepts_it(nodes: Nodes) -> None:
    d = nodes.domain(1)
    d.run([ip(1)])
    parsed = SimImexConfig.parse(d.config_path.read_text()).model_dump()
    expected = {"DAEMONIZE": 0, "BIND_INTERFACE_IP": ip(1), "IMEX_CMD_BIND_INTERFACE_IP": ip(1),
                "SERVER_PORT": nodes.server_port, "IMEX_CMD_PORT": nodes.cmd_port,
                "IMEX_NODE_CONFIG_FILE": str(d.nodes_path), "LOG_FILE_NAME": "", "IMEX_CMD_ENABLED": 1}
    assert {k: parsed[k] for k in expected} == expected
    check = subprocess.run([str(nodes.driver_root / "usr" / "bin" / "nvidia-imex"), "-c", str(d.config_path),
                            "--check-config"], capture_output=True, text=True, timeout=10, check=False)
    assert check.returncode == 0, check.stderr
    assert f"BIND_INTERFACE_IP={ip(1)}" in check.stdout and "1 entries" in check.stdout


def test_members_are_written_in_one_canonical_order(nodes: Nodes, tmp_path: Path) -> None:
    keeper = nodes.keeper(1, driver_root=fake_driver_root(tmp_path, SLEEPER))
    members = ["node-b", "10.0.0.10", ip(1), "fd00::1", "10.0.0.9", "node-a", "::ffff:10.0.0.1"]
    keeper.call(Ensure(domain="clique-a", bind_address=ip(1), server_port=nodes.server_port,
                       cmd_port=nodes.cmd_port, members=members))
    assert (nodes.workdir(1) / "clique-a" / "nodes.cfg").read_text() == (
        f"10.0.0.9\n10.0.0.10\n{ip(1)}\n::ffff:10.0.0.1\nfd00::1\nnode-a\nnode-b\n")


member_text = st.one_of(
    st.sampled_from([ip(i) for i in range(1, 9)]),  # repeats are likely
    st.ip_addresses(v=4).map(str),
    st.ip_addresses(v=6).map(str),
    st.ip_addresses(v=6).map(lambda a: a.exploded),
    st.ip_addresses(v=6).map(lambda a: f"{a}%eth0"),
    st.from_regex(r"\A[A-Za-z0-9_][A-Za-z0-9_.\-]{0,20}\Z"),
    st.sampled_from(["node-a", "node-b", "::1", "0::1", "::ffff:10.0.0.1", "10.0.0.10", "10.0.0.9", "1.2.3.04",
                     "1.2.3.4.5", "x y", "-bad", "a/b", "fe80::1%", "1::2::3", "é", ""]),
)


def test_the_nodes_file_is_the_agents_rendering_for_any_members(nodes: Nodes, tmp_path: Path) -> None:
    """Through Ensure on one running keeper: the nodes file is `imexconfig.render_nodes` (what the
    agent and earlier keepers write), and whatever the agent's rules refuse the keeper refuses too."""
    keeper = nodes.keeper(1, driver_root=fake_driver_root(tmp_path, SLEEPER))
    nodes_path = nodes.workdir(1) / "clique-a" / "nodes.cfg"

    @settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(st.lists(member_text, max_size=10), st.randoms(use_true_random=False))
    def check(members: list[str], rnd: random.Random) -> None:
        members = [*members, ip(1)]
        rnd.shuffle(members)
        req = Ensure(domain="clique-a", bind_address=ip(1), server_port=nodes.server_port, cmd_port=nodes.cmd_port,
                     members=members)
        try:
            expected = imexconfig.render_nodes(members)
        except ValueError as exc:
            before = nodes_path.read_bytes() if nodes_path.exists() else None
            with pytest.raises(imex.ImexError) as err:
                keeper.call(req)
            kinds = {k for k in ("listed twice", "neither an IP address nor a host name") if k in str(err.value)}
            assert len(kinds) == 1, err.value
            if all(m == ip(1) or is_member(m) for m in members):  # only repeats wrong: the same complaint
                assert kinds.pop() in str(exc)
            assert (nodes_path.read_bytes() if nodes_path.exists() else None) == before
            return
        reply = keeper.call(req)
        assert nodes_path.read_text() == expected
        (state,) = keeper.status()
        assert state.members == imexconfig.canonical_members(members) and reply.done in (None, "members changed",
                                                                                         "started")

    check()


def is_member(entry: str) -> bool:
    try:
        imexconfig.canonical_members([entry])
    except ValueError:
        return False
    return True


def previous_release_files(nodes: Nodes, name: str, members: list[str]) -> KeeperDomain:
    """A domain's files exactly as the previous release laid them out (the golden config with this
    test's address and ports, the nodes file, the pid file), its daemon started from them without any
    keeper; the agent's handle on it."""
    domain, _, _, target = GOLDEN_REQUESTS[name]
    workdir = nodes.workdir(1)
    text = (GOLDEN / name).read_text().replace("/WORKDIR", str(workdir)).replace("10.4.0.7", ip(1))
    lines = [f"SERVER_PORT={nodes.server_port}" if line.startswith("SERVER_PORT=")
             else f"IMEX_CMD_PORT={nodes.cmd_port}" if line.startswith("IMEX_CMD_PORT=") else line
             for line in text.splitlines()]
    d = KeeperDomain(workdir / "keeper.sock", domain_id=domain, workdir=workdir, driver_root=nodes.driver_root,
                     bind_address=ip(1), server_port=nodes.server_port, cmd_port=nodes.cmd_port, tls_target=target)
    d.dir.mkdir(parents=True)
    d.config_path.write_text("\n".join(lines) + "\n")
    d.nodes_path.write_text(imexconfig.render_nodes(members))
    return d


@pytest.mark.parametrize("name", ["clique-config.cfg", "dedicated-tls-config.cfg"])
def test_a_daemon_of_the_previous_release_is_adopted_and_left_alone(nodes: Nodes, tmp_path: Path,
                                                                     name: str) -> None:
    members = [ip(2), ip(1)]
    d = previous_release_files(nodes, name, members)
    if d.tls_target:
        credentials(d, TlsAuthority(tmp_path / "pki", "domain-ca"), d.tls_target)
    daemon = spawn_daemon(nodes, d.config_path)
    try:
        (d.dir / "imex.pid").write_text(f"{daemon.pid}\n")
        torn = d.dir / ".nodes.cfg.0123456789ab.tmp"  # a write the previous keeper did not finish
        torn.write_text("10.0.0.")
        before = {p: (p.read_bytes(), p.stat().st_ino, p.stat().st_mtime_ns) for p in (d.config_path, d.nodes_path)}

        keeper = nodes.keeper(1)
        d.keeper_socket = keeper.socket
        (state,) = keeper.status()
        assert (state.domain, state.pid, state.adopted, state.exit) == (d.domain_id, daemon.pid, True, None)
        assert state.members == [ip(1), ip(2)] and state.server_port == nodes.server_port
        assert not torn.exists()
        assert d.run(members) is None and d.pid == daemon.pid and d.ready()  # the identical Ensure: nothing to do
        after = {p: (p.read_bytes(), p.stat().st_ino, p.stat().st_mtime_ns) for p in (d.config_path, d.nodes_path)}
        assert after == before  # neither rewritten
        d.stop()
        assert daemon.wait(10) == 0 and not d.dir.exists()
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()


config_lines = st.one_of(
    st.tuples(st.sampled_from(["SERVER_PORT", "IMEX_CMD_PORT", "LOG_LEVEL", "IMEX_NODE_DISCONNECTED_GRACE_TIME",
                               "IMEX_ENABLE_AUTH_ENCRYPTION", "BIND_INTERFACE_IP", "IMEX_WAIT_FOR_QUORUM",
                               "IMEX_SECURITY_TARGET_OVERRIDE", " SERVER_PORT ", "#SERVER_PORT", "OTHER"]),
              st.sampled_from(["=", " = ", "=="]),
              st.sampled_from(["1", "50000", " 7 ", "-1", "0", "x", "", "NONE", "RECOVERY", ip(1), "::1",
                               "99999999999999999999", "-", "1_0", "\x00", "é"]) | st.text(max_size=12))
    .map("".join),
    st.text(max_size=30),
)


def test_whatever_files_a_daemon_runs_from_the_asan_build_starts_cleanly(nodes: Nodes) -> None:
    """At every start the keeper reads the files of each running daemon: hand-edited, torn or foreign,
    they never crash it; it adopts the daemon or stops it, and exits cleanly."""
    asan = program(asan=True)
    domain_dir = nodes.workdir(1) / "clique-a"
    domain_dir.mkdir(parents=True)

    valid = [f"BIND_INTERFACE_IP={ip(1)}", f"SERVER_PORT={nodes.server_port}", f"IMEX_CMD_PORT={nodes.cmd_port}"]

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(st.lists(config_lines, max_size=6), st.booleans(), st.sampled_from(["\n", "\r\n"]),
           st.one_of(st.lists(st.sampled_from([ip(1), ip(2), "node-a", "::1"]), unique=True).map(" \n ".join),
                     st.lists(member_text, max_size=4).map("\n".join), st.binary(max_size=40)))
    def check(lines: list[str], from_valid: bool, sep: str, members: str | bytes) -> None:
        lines = [*valid, *lines] if from_valid else lines
        (domain_dir / "config.cfg").write_bytes(sep.join(lines).encode("utf-8", "surrogatepass"))
        (domain_dir / "nodes.cfg").write_bytes(members.encode() if isinstance(members, str) else members)
        daemon = subprocess.Popen([str(nodes.root / "nvidia-imex"), "-c", "import time; time.sleep(60)", "-c",
                                   str(domain_dir / "config.cfg")], executable=sys.executable, start_new_session=True)
        try:
            keeper = Keeper.start(nodes.workdir(1), nodes.driver_root, program=asan)
            states = keeper.status()
            assert [(s.pid, s.adopted) for s in states] in ([], [(daemon.pid, True)])
            assert (daemon.poll() is None) == bool(states), keeper.tail()  # adopted, or stopped
            assert keeper.terminate() == 0, keeper.tail()
            assert daemon.wait(10) == -signal.SIGTERM
            assert not any(r in keeper.log.read_text() for r in ("Sanitizer", "runtime error:")), keeper.tail()
        finally:
            if daemon.poll() is None:
                daemon.kill()
                daemon.wait()

    check()
