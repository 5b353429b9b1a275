"""Helpers for the IMEX stand-in tests: build once, start daemons on loopback addresses, run the ctl.

Every daemon is started through an `ImexCluster`, which kills whatever is still running when the
test ends (the `imex_cluster` fixtures of the test modules close it in their teardown).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from nvlfabric.sim.cluster import eventually
from nvlfabric.sim.imex.config import ImexConfig, WaitForQuorum, write_config, write_nodes_file

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "nvlfabric" / "sim" / "imex"

_built: dict[str, Path] = {}

T = TypeVar("T")


def build_imex(out: Path, *, asan: bool = False) -> Path:
    """`make -C nvlfabric/sim/imex OUT=<out>` (plus the `asan` target if asked); once per process and flavour."""
    key = "asan" if asan else "plain"
    if key in _built:
        return _built[key]
    target = ["asan"] if asan else []
    proc = subprocess.run(["make", "--no-print-directory", "-C", str(SRC), f"OUT={out}", *target],
                          capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"building the IMEX stand-ins failed:\n{proc.stdout}\n{proc.stderr}")
    result = out / "asan" if asan else out
    _built[key] = result
    return result


def free_port(addrs: Iterable[str]) -> int:
    """A TCP port that can be bound on every address in `addrs` right now."""
    hosts = list(addrs)
    for _ in range(200):
        with socket.socket() as probe:
            probe.bind((hosts[0], 0))
            port = int(probe.getsockname()[1])
        ok = True
        for host in hosts[1:]:
            with socket.socket() as s:
                try:
                    s.bind((host, port))
                except OSError:
                    ok = False
                    break
        if ok:
            return port
    raise RuntimeError("no free port")




@dataclass
class CtlResult:
    rc: int
    out: str
    err: str

    def json(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.out)
        return data


@dataclass
class ImexNode:
    cluster: ImexCluster
    index: int
    ip: str
    config: Path
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    def start(self, *, wait_ready: bool = True) -> ImexNode:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        with self.log.open("ab") as fh:
            self.proc = subprocess.Popen([str(self.cluster.bin / "nvidia-imex"), "-c", str(self.config)],
                                         stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                                         env={**os.environ, **self.env})
        if wait_ready:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 10.0) -> None:
        eventually(f"node {self.ip} READY", lambda: self.ctl("-q").out == "READY\n", timeout=timeout, interval=0.05)

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL: an unclean stop, the peers only see the TCP connections drop."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def stop(self, timeout: float = 5.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def ctl(self, *args: str, config: bool = True) -> CtlResult:
        argv = [str(self.cluster.bin / "nvidia-imex-ctl")]
        if config:
            argv += ["-c", str(self.config)]
        proc = subprocess.run([*argv, *args], capture_output=True, text=True, timeout=20, check=False)
        return CtlResult(proc.returncode, proc.stdout, proc.stderr)

    def nodes(self) -> dict[str, Any]:
        res = self.ctl("-N", "-j")
        assert res.rc == 0, res
        return res.json()

    def wait_view(self, pred: Callable[[dict[str, Any]], bool], what: str, timeout: float = 10.0) -> dict[str, Any]:
        """Polls `-N -j` on this node until `pred(view)` holds; returns that view."""

        def probe() -> dict[str, Any] | None:
            view = self.nodes()
            return view if pred(view) else None

        return eventually(f"{what} (seen from {self.ip})", probe, timeout=timeout, interval=0.05)

    def wait_up(self, n: int) -> dict[str, Any]:
        return self.wait_view(lambda v: all_connected(v, n), f"{n} nodes UP")


class ImexCluster:
    """Daemons on 127.0.20.<1..n> (or other loopback addresses) sharing one peer and one command port."""

    def __init__(self, bin_dir: Path, workdir: Path, *, subnet: str = "127.0.20") -> None:
        self.bin = bin_dir
        self.dir = workdir
        self.subnet = subnet
        self.dir.mkdir(parents=True, exist_ok=True)
        addrs = [f"{subnet}.{i}" for i in range(1, 9)]
        self.server_port = free_port(addrs)
        self.cmd_port = free_port(addrs)
        while self.cmd_port == self.server_port:
            self.cmd_port = free_port(addrs)
        self.nodes_file = self.dir / "nodes.cfg"
        self.members: list[ImexNode] = []

    def ip(self, i: int) -> str:
        return f"{self.subnet}.{i + 1}"

    def write_nodes(self, entries: Iterable[str], path: Path | None = None) -> Path:
        return write_nodes_file(path or self.nodes_file, list(entries))

    def add(self, index: int, *, nodes_file: Path | None = None, grace: int = 0, log_level: int = 5,
            env: Mapping[str, str] | None = None, **overrides: Any) -> ImexNode:
        ip = self.ip(index)
        cfg = ImexConfig.for_child_process(nodes_file=nodes_file or self.nodes_file, cmd_bind_ip=ip, bind_ip=ip,
                                           server_port=self.server_port, cmd_port=self.cmd_port,
                                           log_file=str(self.dir / f"imex-{index}.log"),
                                           wait_for_quorum=WaitForQuorum.NONE, grace_time=grace)
        cfg = ImexConfig.model_validate({**cfg.model_dump(), "LOG_LEVEL": log_level, **overrides})
        path = write_config(self.dir / f"imex-{index}.cfg", cfg)
        node = ImexNode(self, index, ip, path, self.dir / f"imex-{index}.out", dict(env or {}))
        self.members.append(node)
        return node

    def start(self, n: int, *, grace: int = 0) -> list[ImexNode]:
        """n daemons with one shared nodes file, all started, all READY."""
        self.write_nodes(self.ip(i) for i in range(n))
        nodes = [self.add(i, grace=grace) for i in range(n)]
        for node in nodes:
            node.start(wait_ready=False)
        for node in nodes:
            node.wait_ready()
        return nodes

    def close(self) -> None:
        """Stops every daemon (SIGTERM, SIGKILL after 3 s), then fails on sanitizer reports in their output."""
        running = [n.proc for n in self.members if n.proc is not None and n.proc.poll() is None]
        for proc in running:
            proc.send_signal(signal.SIGTERM)
        for proc in running:
            try:
                proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=10)
        # Daemons that forked into the background (DAEMONIZE=1) are not our children: find them by
        # their config file, which lives in this cluster's own temporary directory.
        configs = {str(node.config).encode() for node in self.members}
        for pid in _pids_with_argument(configs):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for node in self.members:
            if node.log.exists():
                text = node.log.read_text(errors="replace")
                assert "Sanitizer" not in text and "runtime error:" not in text, text


def _pids_with_argument(args: set[bytes]) -> list[int]:
    pids: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"nvidia-imex") and args.intersection(argv):
            pids.append(int(entry.name))
    return pids


def conn_status(view: dict[str, Any], src: int, dst: int) -> str:
    status: str = view["nodes"][str(src)]["connections"][str(dst)]["status"]
    return status


def all_connected(view: dict[str, Any], n: int) -> bool:
    return (view["status"] == "UP" and len(view["nodes"]) == n
            and all(view["nodes"][str(i)]["status"] == "READY" for i in range(n))
            and all(conn_status(view, i, j) == "CONNECTED" for i in range(n) for j in range(n)))


def link_is(src: int, dst: int, status: str) -> Callable[[dict[str, Any]], bool]:
    """A predicate for `wait_view`: node `src` reports `status` for its link to `dst`."""
    return lambda view: conn_status(view, src, dst) == status


# ------------------------------------------------------------------------------------------------
# TLS material for IMEX_ENABLE_AUTH_ENCRYPTION=1 (tests/sim/test_imex_tls.py)

@dataclass
class TlsIdentity:
    """A PEM key and certificate on disk, issued by a `TlsAuthority`."""

    key: Path
    cert: Path


class TlsAuthority:
    """A throw-away CA (EC P-256) in `workdir`: `ca_file` is its PEM certificate (a one-CA bundle)."""

    def __init__(self, workdir: Path, name: str) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.name = name
        self._key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = _utcnow()
        self.certificate = (
            x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(self._key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - _hours(1)).not_valid_after(now + _hours(24))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256()))
        self.ca_file = self.dir / f"{name}-ca.pem"
        self.ca_file.write_bytes(self.certificate.public_bytes(serialization.Encoding.PEM))

    def issue(self, name: str, *, dns: Iterable[str] = (), key_path: Path | None = None,
              cert_path: Path | None = None, days: float = 1.0) -> TlsIdentity:
        """A leaf for both TLS roles (serverAuth + clientAuth), CN=`name`, SAN = `dns`; files are
        replaced atomically, so a running daemon never reads half of one."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        now = _utcnow()
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self.certificate.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _hours(1)).not_valid_after(now + _hours(24 * days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                           critical=False))
        names = [x509.DNSName(d) for d in dns]
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        ident = TlsIdentity(key_path or self.dir / f"{name}.key", cert_path or self.dir / f"{name}.pem")
        _write_atomic(ident.key, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                   serialization.NoEncryption()))
        _write_atomic(ident.cert, cert.public_bytes(serialization.Encoding.PEM))
        return ident


def tls_settings(ident: TlsIdentity, ca_bundle: Path, *, target: str = "") -> dict[str, Any]:
    """Config overrides for `ImexCluster.add`: mutual TLS with one identity for both roles."""
    return {"IMEX_ENABLE_AUTH_ENCRYPTION": 1, "IMEX_AUTH_ENCRYPTION_MODE": "SSL_TLS", "IMEX_AUTH_SOURCE": "FILE",
            "IMEX_SERVER_KEY": str(ident.key), "IMEX_SERVER_CERT": str(ident.cert),
            "IMEX_SERVER_CERT_AUTH": str(ca_bundle), "IMEX_CLIENT_KEY": str(ident.key),
            "IMEX_CLIENT_CERT": str(ident.cert), "IMEX_CLIENT_CERT_AUTH": str(ca_bundle),
            "IMEX_SECURITY_TARGET_OVERRIDE": target}


def _utcnow() -> Any:
    import datetime

    return datetime.datetime.now(datetime.UTC)


def _hours(n: float) -> Any:
    import datetime

    return datetime.timedelta(hours=n)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
