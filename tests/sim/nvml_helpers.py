"""Helpers for the NVML stand-in tests: building the library and driving it from a probe process."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from nvlfabric.sim.nvml.constants import ENV_FAULTS, ENV_NODE, ENV_TOPOLOGY

REPO = Path(__file__).resolve().parents[2]
NVML_SRC = REPO / "nvlfabric" / "sim" / "nvml"
PROBE = Path(__file__).with_name("nvml_probe.py")
REPLY_TIMEOUT_S = 60.0


#: NVLFABRIC_TEST_NVML_SANITIZE=1 runs every probe on the AddressSanitizer/UBSan build.
SANITIZE = os.environ.get("NVLFABRIC_TEST_NVML_SANITIZE") == "1"


def build_library(out: Path, *, sanitize: bool = SANITIZE) -> Path:
    """Runs the library's Makefile into `out`; returns the directory holding libnvidia-ml.so.1."""
    target = "sanitize" if sanitize else "all"
    proc = subprocess.run(
        ["make", "-C", str(NVML_SRC), f"OUT={out}", target], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"building the NVML stand-in failed:\n{proc.stdout}\n{proc.stderr}")
    return out / "sanitize" if sanitize else out


def sanitizer_env() -> dict[str, str]:
    """What a process needs to load the sanitizer build (libasan must be loaded first)."""
    libasan = subprocess.run(
        ["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True, check=True
    ).stdout.strip()
    return {
        "LD_PRELOAD": libasan,
        "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",
        "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
    }


def handle(i: int) -> dict[str, int]:
    """A probe argument naming the i-th handle the probe has received."""
    return {"handle": i}


def struct(name: str, version: int | None = None) -> dict[str, Any]:
    """A probe argument: a fresh pynvml struct passed by reference."""
    arg: dict[str, Any] = {"struct": name}
    if version is not None:
        arg["version"] = version
    return arg


def cluster_uuid(info: Mapping[str, Any]) -> str:
    """The clusterUuid of a fabric-info answer as a canonical UUID string."""
    return str(uuid.UUID(bytes=bytes(info["clusterUuid"])))


class NvmlCallError(Exception):
    def __init__(self, code: int, cls: str, msg: str) -> None:
        super().__init__(f"{cls} ({code}): {msg}")
        self.code = code
        self.cls = cls
        self.msg = msg


class ProbeDied(Exception):
    pass


class Probe:
    """One process with pynvml, answering as one node."""

    def __init__(self, env: dict[str, str], stderr_file: Path) -> None:
        self.stderr_file = stderr_file
        self._stderr = stderr_file.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, str(PROBE)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env=env,
            cwd=str(REPO),
        )
        ready = self._read()
        if ready != {"ready": True}:
            raise ProbeDied(f"probe did not start: {ready!r}")

    def _read(self) -> Any:
        assert self.proc.stdout is not None
        r, _, _ = select.select([self.proc.stdout], [], [], REPLY_TIMEOUT_S)
        if not r:
            raise ProbeDied(f"no reply within {REPLY_TIMEOUT_S}s; stderr: {self.stderr()}")
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout=10)
            raise ProbeDied(f"probe exited with {self.proc.returncode}; stderr: {self.stderr()}")
        return json.loads(line)

    def request(self, req: Mapping[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            self.proc.wait(timeout=10)
            raise ProbeDied(f"probe exited with {self.proc.returncode}; stderr: {self.stderr()}") from None
        reply: dict[str, Any] = self._read()
        if "exception" in reply:
            raise RuntimeError(f"probe raised:\n{reply['exception']}")
        return reply

    def call_full(self, fn: str, *args: Any) -> dict[str, Any]:
        reply = self.request({"op": "call", "fn": fn, "args": list(args)})
        if "error" in reply:
            raise NvmlCallError(reply["error"], reply["cls"], reply["msg"])
        return reply

    def call(self, fn: str, *args: Any) -> Any:
        """Calls pynvml.<fn>; raises NvmlCallError for an NVML error."""
        return self.call_full(fn, *args)["ok"]

    def struct_call(self, fn: str, *args: Any) -> dict[str, Any]:
        """Calls a pynvml function with one struct argument and returns that struct."""
        structs: list[dict[str, Any]] = self.call_full(fn, *args)["structs"]
        return structs[0]

    def code(self, fn: str, *args: Any) -> int:
        """The NVML return code of pynvml.<fn> (0 on success)."""
        reply = self.request({"op": "call", "fn": fn, "args": list(args)})
        return int(reply.get("error", 0))

    def exec(self, code: str) -> Any:
        """Runs Python in the probe (names: pynvml, ctypes, handles, last_error); returns `result`."""
        reply = self.request({"op": "exec", "code": code})
        if "error" in reply:
            raise NvmlCallError(reply["error"], reply["cls"], reply["msg"])
        return reply["ok"]

    def raw(self, expr: str) -> int:
        """Evaluates a raw ctypes call on the loaded library (`lib`) and returns its int result."""
        return int(self.exec(f"lib = pynvml.nvmlLib\nresult = int({expr})"))

    def last_error(self) -> str:
        return str(self.exec("result = last_error()"))

    def stderr(self) -> str:
        self._stderr.flush()
        return self.stderr_file.read_text(errors="replace")

    def close(self) -> int:
        """Ends the probe normally; returns its exit status."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with suppress(BrokenPipeError):
                self.proc.stdin.close()
        try:
            rc = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._stderr.close()
        return rc


def probe_env(
    lib_dir: Path | None,
    topology: Path | None,
    node: str | None,
    faults: Path | None = None,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("NVLFABRIC_NVML_") and k not in ("LD_LIBRARY_PATH", "LD_PRELOAD")
    }
    if lib_dir is not None:
        env["LD_LIBRARY_PATH"] = str(lib_dir)
    if topology is not None:
        env[ENV_TOPOLOGY] = str(topology)
    if node is not None:
        env[ENV_NODE] = node
    if faults is not None:
        env[ENV_FAULTS] = str(faults)
    if SANITIZE:
        env.update(sanitizer_env())
    env.update(extra or {})
    return env


@contextmanager
def running_probe(
    lib_dir: Path | None,
    topology: Path | None,
    node: str | None,
    faults: Path | None = None,
    extra_env: Mapping[str, str] | None = None,
) -> Iterator[Probe]:
    with tempfile.TemporaryDirectory(prefix="nvml-probe-") as tmp:
        probe = Probe(probe_env(lib_dir, topology, node, faults, extra_env), Path(tmp) / "stderr")
        try:
            yield probe
        finally:
            probe.close()
