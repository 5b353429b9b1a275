"""A deployment the engine stops at an error ends with that error and at most one line more: the
SDK's "resource monitor shut down" failures of the registrations still in flight, and the
engine's interrupt, print no tracebacks (nvlfabric/components/shutdown.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import grpc
import pytest
from pulumi import RunError

from nvlfabric.components import shutdown
from nvlfabric.testbed.pulumi_cli import project_from_fixture

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "stopped_stack"


class _RpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def _original(exn: Any) -> Exception:
    return Exception(f"original: {exn.details()}")


def test_a_shut_down_monitor_is_a_one_line_run_error_and_every_other_error_is_left_alone() -> None:
    convert = shutdown.quiet(_original)
    stopped = convert(_RpcError(grpc.StatusCode.UNKNOWN, "resource monitor shut down"))
    assert isinstance(stopped, RunError) and str(stopped) == shutdown.STOPPED
    other = convert(_RpcError(grpc.StatusCode.UNKNOWN, "invalid resource URN"))
    assert type(other) is Exception and str(other) == "original: invalid resource URN"
    assert str(convert(_RpcError(grpc.StatusCode.INVALID_ARGUMENT, "resource monitor shut down"))).startswith(
        "original:")


def test_installing_twice_wraps_once() -> None:
    from pulumi.runtime import settings

    shutdown.install()
    shutdown.install()
    assert not hasattr(settings.grpc_error_to_exception.__wrapped__, "__wrapped__")  # type: ignore[attr-defined]


def test_an_interrupted_program_the_engine_runs_exits_without_a_traceback() -> None:
    program = textwrap.dedent("""
        import os, signal, grpc
        from pulumi.runtime import settings
        from pulumi.runtime.proto import engine_pb2_grpc
        settings.SETTINGS.engine = engine_pb2_grpc.EngineStub(grpc.insecure_channel("127.0.0.1:9"))
        import nvlfabric.components
        print("interrupting", flush=True)
        try:
            os.kill(os.getpid(), signal.SIGINT)
            signal.pause()
        finally:
            print("unwound")  # not reached: unwinding the SDK's coroutines printed tracebacks of its own
    """)
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 130 and proc.stderr == "" and proc.stdout == "interrupting\n", proc


def test_outside_an_engine_sigint_is_left_as_python_has_it() -> None:
    program = ("import signal, nvlfabric.components\n"
               "assert signal.getsignal(signal.SIGINT) is signal.default_int_handler")
    subprocess.run([sys.executable, "-c", program], check=True, timeout=60)


@pytest.mark.pulumi
def test_a_preview_stopped_at_an_unreachable_cluster_says_so_without_tracebacks(tmp_path: Path) -> None:
    """The real CLI: the ConfigGroup's error, then nothing from Python. The race this guards is
    timing-dependent (a third of the previews printed tracebacks before the fix): three runs."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(textwrap.dedent("""
        apiVersion: v1
        kind: Config
        clusters: [{name: c, cluster: {server: "https://127.0.0.1:9"}}]
        users: [{name: u, user: {token: x}}]
        contexts: [{name: c, context: {cluster: c, user: u}}]
        current-context: c
    """))
    proj = project_from_fixture(FIXTURE, tmp_path / "proj", kubeconfig=kubeconfig, venv=Path(sys.prefix))
    proj.run("stack", "init", "test")
    for _ in range(3):
        out = proj.run("preview", check=False, timeout=300)
        text = out.stdout + out.stderr
        assert out.returncode != 0 and "configured Kubernetes cluster is unreachable" in text, text
        assert "Traceback" not in text and "unhandled exception" not in text, text
