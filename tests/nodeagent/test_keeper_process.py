"""The IMEX keeper as a process: how it is started (`python -m nvlfabric imex` replaces itself with
it), its settings, its log lines, its stop, and what it costs each node."""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from nvlfabric.api import names
from nvlfabric.nodeagent.imexkeeper import KeeperDomain
from nvlfabric.sim.cluster import eventually
from tests.support.imexnodes import Nodes, gone, ip, pids_mentioning
from tests.support.keepers import program

RSS_BUDGET_KB = 4096


def test_python_m_nvlfabric_imex_is_the_keeper_and_sigterm_stops_its_daemons(nodes: Nodes) -> None:
    """The DaemonSet runs `python -m nvlfabric imex --kubelet-root ...`: the same process becomes the
    keeper, serves in the kubelet root's IMEX work directory, and on SIGTERM (the pod stopped) stops
    every daemon, says so, removes its socket and exits 0."""
    kubelet_root = Path(f"/tmp/nvlk-{os.getpid()}-kubelet")  # a unix socket path is short
    workdir = Path(names.imex_workdir(str(kubelet_root)))
    proc = subprocess.Popen([sys.executable, "-m", "nvlfabric", "imex", "--kubelet-root", str(kubelet_root),
                             "--driver-root", str(nodes.driver_root), "--log-format", "text"],
                            env={**os.environ, names.IMEX_KEEPER_BINARY_ENV: str(program())},
                            stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        sock = workdir / names.IMEX_KEEPER_SOCKET
        eventually("the keeper's socket", sock.exists, timeout=10.0, interval=0.02)
        assert Path(f"/proc/{proc.pid}/exe").resolve() == program().resolve()
        d = KeeperDomain(sock, domain_id="clique-a", workdir=workdir, driver_root=nodes.driver_root,
                         bind_address=ip(1), server_port=nodes.server_port, cmd_port=nodes.cmd_port)
        assert d.run([ip(1)]) == "started"
        d.wait_ready(10)
        pid = d.pid
        assert pid is not None
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
        assert proc.returncode == 0, err
        assert gone(pid) and not sock.exists()
        assert f"INFO:nvlfabric.imexkeeper:IMEX keeper serving on {sock} (0 daemon(s) adopted)" in err
        assert f"INFO:nvlfabric.imexkeeper:IMEX domain clique-a: stopping the daemon (pid {pid}): the keeper stops" \
            in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for leftover in pids_mentioning(str(kubelet_root)):
            os.kill(leftover, signal.SIGKILL)
        shutil.rmtree(kubelet_root, ignore_errors=True)


def test_json_log_lines_are_the_pod_logs_format(nodes: Nodes) -> None:
    """Every nvlfabric pod logs one JSON object per line with the same keys (nvlfabric/daemon/process.py)."""
    keeper = nodes.keeper(1, env={"LOG_FORMAT": "json"})
    d = nodes.domain(1)
    d.run([ip(1)])
    assert keeper.terminate() == 0
    text = keeper.log.read_text()
    lines = [json.loads(line) for line in text.splitlines()]
    assert [list(x) for x in lines] == [["ts", "level", "logger", "msg"]] * 3
    assert {x["logger"] for x in lines} == {"nvlfabric.imexkeeper"} and {x["level"] for x in lines} == {"info"}
    assert lines[0]["msg"] == f"IMEX keeper serving on {keeper.socket} (0 daemon(s) adopted)"
    assert lines[1]["msg"].startswith("IMEX domain clique-a: started the daemon (pid ")
    assert lines[2]["msg"].startswith("IMEX domain clique-a: stopping the daemon (pid ")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", lines[0]["ts"])
    ts = datetime.datetime.fromisoformat(lines[0]["ts"])
    assert abs((datetime.datetime.now(datetime.UTC) - ts).total_seconds()) < 60
    assert text.startswith('{"ts": "')  # json.dumps' default separators, as the Python pods write them


def run_keeper(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    settings = ("KUBELET_ROOT", "DRIVER_ROOT", "LOG_FORMAT", "IMEX_WORKDIR", "IMEX_KEEPER_SOCKET")
    clean = {k: v for k, v in os.environ.items() if k not in settings}
    return subprocess.run([str(program()), *args], capture_output=True, text=True, timeout=10,
                          env={**clean, **(env or {})}, check=False)


LONG_ROOT = "/" + "k" * 80


@pytest.mark.parametrize(("args", "env", "error"), [
    (["--kubelet-root", LONG_ROOT], {},
     f"--kubelet-root / $KUBELET_ROOT: the keeper's socket {LONG_ROOT}/plugins/channel.nvlfabric.io/imex/keeper.sock "
     "is longer than a unix socket path may be (107 bytes); use a shorter kubelet root"),
    ([], {"KUBELET_ROOT": LONG_ROOT},
     f"--kubelet-root / $KUBELET_ROOT: the keeper's socket {LONG_ROOT}/plugins/channel.nvlfabric.io/imex/keeper.sock "
     "is longer than a unix socket path may be (107 bytes); use a shorter kubelet root"),
    (["--workdir=/" + "w" * 120], {},
     f"--workdir / $IMEX_WORKDIR: the keeper's socket /{'w' * 120}/keeper.sock is longer than a unix socket path may "
     "be (107 bytes); use a shorter work directory, or set --socket"),
    (["--log-format=xml"], {}, "--log-format / $LOG_FORMAT: xml is not json or text"),
    ([], {"LOG_FORMAT": "xml"}, "--log-format / $LOG_FORMAT: xml is not json or text"),
    (["--workdir", ""], {}, "--workdir / $IMEX_WORKDIR: must not be empty (leave it out for the default)"),
    (["--workdir", "/tmp/a\nb"], {}, "--workdir / $IMEX_WORKDIR: must not hold a line break"),
    (["--kubelet-root"], {}, "--kubelet-root / $KUBELET_ROOT: expects a value"),
    (["--bogus"], {}, "unknown argument --bogus (see --help)"),
])
def test_a_bad_setting_is_named_with_its_flag_and_variable(args: list[str], env: dict[str, str], error: str) -> None:
    p = run_keeper(*args, env=env)
    assert (p.returncode, p.stderr) == (2, f"nvlfabric imex: {error}\n")


def test_help_lists_every_flag() -> None:
    p = run_keeper("--help")
    assert p.returncode == 0
    for flag in ("--kubelet-root", "--driver-root", "--log-format", "--workdir", "--socket", "$IMEX_KEEPER_SOCKET"):
        assert flag in p.stdout


def test_a_work_directory_it_cannot_make_is_named(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    p = run_keeper("--workdir", str(tmp_path / "file" / "imex"), "--log-format", "text")
    assert p.returncode == 1
    assert p.stderr == (f"ERROR:nvlfabric.imexkeeper:the IMEX keeper cannot start: cannot create directory "
                        f"{tmp_path}/file: a file of that name is in the way\n")


def vm_rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def test_the_keeper_costs_a_node_under_4_mb(nodes: Nodes) -> None:
    """A user-visible budget: one keeper runs on every GPU node, beside the workloads, for the node's
    life; with one domain running (the common case) its resident set stays under 4 MB (the Python
    keeper it replaced took ~16). Large requests do not raise it for good."""
    keeper = nodes.keeper(1)
    d = nodes.domain(1)
    assert d.run([ip(1)]) == "started"
    d.wait_ready(10)
    keeper.raw(b'{"op": "status", "pad": "' + b"x" * 900_000 + b'"}\n')
    for _ in range(20):
        d.run([ip(1)])
    rss = vm_rss_kb(keeper.pid)
    print(f"\nIMEX keeper VmRSS with one domain running: {rss} kB")
    assert rss < RSS_BUDGET_KB
