"""IMEX_ENABLE_AUTH_ENCRYPTION=1 in the IMEX stand-in: mutual TLS on the peer links, one CA per domain,
refusals shown as AUTHENTICATING, credential rotation on SIGUSR1, start-up errors naming the key."""

from __future__ import annotations

import os
import re
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nvlfabric.sim.cluster import eventually
from nvlfabric.sim.imex.config import ImexConfig, write_config
from tests.sim.imex_fixtures import (
    ImexCluster,
    ImexNode,
    TlsAuthority,
    all_connected,
    conn_status,
    tls_settings,
)

ASAN = os.environ.get("NVLFABRIC_IMEX_ASAN") == "1"
TARGET = "imex.domain-a.nvlfabric.test"


@pytest.fixture
def cluster(imex_bin: Path, tmp_path: Path) -> Iterator[ImexCluster]:
    c = ImexCluster(imex_bin, tmp_path / "imex", subnet="127.0.21")
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def ca(tmp_path: Path) -> TlsAuthority:
    return TlsAuthority(tmp_path / "pki", "domain-a-ca")


def tls_node(cluster: ImexCluster, ca: TlsAuthority, i: int, *, target: str = TARGET, dns: tuple[str, ...] = (TARGET,),
             issuer: TlsAuthority | None = None, **overrides: Any) -> ImexNode:
    """Node i with its own certificate from `issuer` (default: the domain CA), trusting `issuer`'s CA."""
    auth = issuer or ca
    ident = auth.issue(f"node-{i}", dns=dns)
    return cluster.add(i, **{**tls_settings(ident, auth.ca_file, target=target), **overrides})


def start_all(nodes: list[ImexNode]) -> None:
    for node in nodes:
        node.start(wait_ready=False)
    for node in nodes:
        node.wait_ready()


def log_of(node: ImexNode) -> str:
    return (node.cluster.dir / f"imex-{node.index}.log").read_text(errors="replace")


def refused(view: dict[str, Any], src: int, dst: int) -> bool:
    return conn_status(view, src, dst) == "AUTHENTICATING"


def test_one_ca_with_target_override_connects_everyone(cluster: ImexCluster, ca: TlsAuthority) -> None:
    cluster.write_nodes(cluster.ip(i) for i in range(3))
    nodes = [tls_node(cluster, ca, i) for i in range(3)]
    start_all(nodes)
    for node in nodes:
        node.wait_up(3)
    assert "Domain State: UP" in nodes[0].ctl("-N").out  # the command service stays plaintext
    text = log_of(nodes[0])
    assert "peer links use mutual TLS" in text and "CN=node-0" in text
    check = subprocess.run([str(cluster.bin / "nvidia-imex"), "-c", str(nodes[0].config), "--check-config"],
                           capture_output=True, text=True, timeout=10, check=False)
    assert check.returncode == 0, check.stderr
    assert re.search(r"^# IMEX_SERVER_CERT \S+: subject /CN=node-0, issuer /CN=domain-a-ca, notAfter \w+", check.stdout,
                     re.M), check.stdout
    assert re.search(r"^# IMEX_CLIENT_CERT_AUTH \S+: 1 CA certificate, first /CN=domain-a-ca$", check.stdout, re.M)
    assert f"subjectAltName DNS:{TARGET}" in check.stdout


def test_foreign_ca_is_refused_both_ways(cluster: ImexCluster, ca: TlsAuthority, tmp_path: Path) -> None:
    other = TlsAuthority(tmp_path / "pki-other", "intruder-ca")
    cluster.write_nodes(cluster.ip(i) for i in range(3))
    nodes = [tls_node(cluster, ca, 0), tls_node(cluster, ca, 1), tls_node(cluster, ca, 2, issuer=other)]
    start_all(nodes)
    view = nodes[2].wait_view(lambda v: refused(v, 2, 0) and refused(v, 2, 1), "intruder refused")
    assert view["status"] != "UP"
    assert re.search(r"^\s+2\s+A\s+A\s+C\s*$", nodes[2].ctl("-N").out, re.M)
    def honest_view(i: int) -> Callable[[dict[str, Any]], bool]:
        return lambda v: refused(v, i, 2) and conn_status(v, i, 1 - i) == "CONNECTED"

    for i in (0, 1):
        view = nodes[i].wait_view(honest_view(i), "honest pair up, intruder refused")
        assert view["status"] == "DEGRADED"
        assert all(conn_status(view, src, 2) != "CONNECTED" for src in (0, 1))
    assert re.search(r"\[WARN\].*peer 127\.0\.21\.3 .*-> AUTHENTICATING: TLS handshake failed: certificate verify "
                     r"failed: unable to get local issuer certificate", log_of(nodes[0]))
    assert re.search(r"\[WARN\].*refused a peer connection from 127\.0\.21\.3:\d+: TLS handshake failed: ",
                     log_of(nodes[0]))
    assert "AUTHENTICATING" in log_of(nodes[2])


def test_plaintext_daemon_is_not_connected(cluster: ImexCluster, ca: TlsAuthority) -> None:
    cluster.write_nodes(cluster.ip(i) for i in range(3))
    nodes = [tls_node(cluster, ca, 0), tls_node(cluster, ca, 1), cluster.add(2)]  # node 2: auth=0
    start_all(nodes)
    # The TLS side: no answer (or garbage) to its ClientHello -> AUTHENTICATING within the hello timeout.
    view = nodes[0].wait_view(lambda v: refused(v, 0, 2) and conn_status(v, 0, 1) == "CONNECTED",
                              "plaintext peer refused", timeout=8)
    assert view["status"] == "DEGRADED"
    # The TLS acceptor refuses the plaintext dialer's hello line ...
    eventually("refusal logged", lambda: re.search(
        r"\[WARN\].*refused a peer connection from 127\.0\.21\.3:\d+: TLS handshake failed: ", log_of(nodes[0])),
        timeout=10.0, interval=0.05)
    # ... which only sees its connections closed: its peers stay NEVER_CONNECTED.
    plain = nodes[2].nodes()
    assert conn_status(plain, 2, 0) == conn_status(plain, 2, 1) == "NEVER_CONNECTED"
    assert plain["status"] == "DOWN"


def test_certificate_without_the_target_name_is_refused(cluster: ImexCluster, ca: TlsAuthority) -> None:
    cluster.write_nodes(cluster.ip(i) for i in range(3))
    # Node 2's CN is the target name, but its subjectAltName is not: the CN must not count.
    bad = ca.issue(TARGET, dns=("elsewhere.nvlfabric.test",))
    nodes = [tls_node(cluster, ca, 0), tls_node(cluster, ca, 1),
             cluster.add(2, **tls_settings(bad, ca.ca_file, target=TARGET))]
    start_all(nodes)
    nodes[0].wait_view(lambda v: refused(v, 0, 2) and conn_status(v, 0, 1) == "CONNECTED", "wrong SAN refused")
    nodes[2].wait_view(lambda v: refused(v, 2, 0) and refused(v, 2, 1), "refused by the acceptors")
    assert re.search(r"peer 127\.0\.21\.3 .*AUTHENTICATING: TLS handshake failed: certificate verify failed: "
                     r"hostname mismatch", log_of(nodes[0]))


def peer_certificate_cn(cluster: ImexCluster, ca: TlsAuthority, client_node: int, server: ImexNode) -> str:
    """The CN of the certificate `server` presents to a new connection (authenticated as node 1)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.load_verify_locations(cafile=str(ca.ca_file))
    ctx.load_cert_chain(str(ca.dir / f"node-{client_node}.pem"), str(ca.dir / f"node-{client_node}.key"))
    with socket.create_connection((server.ip, cluster.server_port), timeout=5) as raw, \
            ctx.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return str(x509.load_der_x509_certificate(der).subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)


def test_sigusr1_rotates_credentials_without_dropping_links(cluster: ImexCluster, ca: TlsAuthority) -> None:
    cluster.write_nodes(cluster.ip(i) for i in range(2))
    nodes = [tls_node(cluster, ca, i) for i in range(2)]
    start_all(nodes)
    nodes[0].wait_up(2)
    assert nodes[0].proc is not None
    pid = nodes[0].proc.pid
    assert peer_certificate_cn(cluster, ca, 1, nodes[0]) == "node-0"

    # New key and certificate from the same CA, written over the configured files.
    ca.issue("node-0-rotated", dns=(TARGET,), key_path=ca.dir / "node-0.key", cert_path=ca.dir / "node-0.pem")
    nodes[0].signal(signal.SIGUSR1)
    eventually("reload logged", lambda: "TLS credentials reloaded" in log_of(nodes[0]), timeout=10.0, interval=0.05)
    for _ in range(5):
        assert all_connected(nodes[0].nodes(), 2) and all_connected(nodes[1].nodes(), 2)
        time.sleep(0.1)
    assert nodes[0].proc.poll() is None and nodes[0].proc.pid == pid
    assert re.search(r"\[INFO\].*TLS credentials reloaded: IMEX_SERVER_CERT \S+: subject /CN=node-0-rotated, .*"
                     r"notAfter ", log_of(nodes[0]))
    assert peer_certificate_cn(cluster, ca, 1, nodes[0]) == "node-0-rotated"  # new connections: new credentials

    # A broken file: logged, the current credentials stay in use.
    (ca.dir / "node-0.key").write_text("not a key\n")
    nodes[0].signal(signal.SIGUSR1)
    eventually("failed reload logged", lambda: "keeping the current TLS credentials" in log_of(nodes[0]),
               timeout=10.0, interval=0.05)
    assert re.search(r"\[ERROR\].*keeping the current TLS credentials: .*: IMEX_SERVER_KEY: .*node-0\.key",
                     log_of(nodes[0]))
    assert all_connected(nodes[0].nodes(), 2)
    assert peer_certificate_cn(cluster, ca, 1, nodes[0]) == "node-0-rotated"


def start_error(cluster: ImexCluster, config: Path, env: dict[str, str] | None = None) -> str:
    """Runs the daemon (and --check-config) on a bad config: both exit 1 with one error line."""
    messages = []
    for extra in ([], ["--check-config"]):
        proc = subprocess.run([str(cluster.bin / "nvidia-imex"), "-c", str(config), *extra], capture_output=True,
                              text=True, timeout=10, check=False, env={**os.environ, **(env or {})})
        assert proc.returncode == 1, proc
        assert proc.stderr.startswith("nvidia-imex: error: ") and proc.stderr.count("\n") == 1, proc.stderr
        messages.append(proc.stderr)
    assert messages[0] == messages[1]
    return messages[0]


def config_with(cluster: ImexCluster, ident_settings: dict[str, Any], name: str, **extra: Any) -> Path:
    base = ImexConfig.for_child_process(nodes_file=cluster.nodes_file, cmd_bind_ip=cluster.ip(0),
                                        bind_ip=cluster.ip(0), server_port=cluster.server_port,
                                        cmd_port=cluster.cmd_port)
    cfg = ImexConfig.model_validate({**base.model_dump(), **ident_settings, **extra})
    return write_config(cluster.dir / f"{name}.cfg", cfg)


def test_start_up_errors_name_the_key_and_the_file(cluster: ImexCluster, ca: TlsAuthority, tmp_path: Path) -> None:
    cluster.write_nodes([cluster.ip(0), cluster.ip(1)])
    good = tls_settings(ca.issue("node-0", dns=(TARGET,)), ca.ca_file, target=TARGET)
    other = ca.issue("node-other", dns=(TARGET,))

    missing = start_error(cluster, config_with(cluster, {**good, "IMEX_SERVER_KEY": str(tmp_path / "nope.key")},
                                               "missing"))
    assert re.search(r"missing\.cfg:\d+: IMEX_SERVER_KEY: cannot open \S*nope\.key: No such file", missing), missing

    mismatch = start_error(cluster, config_with(cluster, {**good, "IMEX_CLIENT_KEY": str(other.key)}, "mismatch"))
    assert re.search(r"mismatch\.cfg:\d+: IMEX_CLIENT_KEY: \S*node-other\.key does not match the certificate in "
                     r"IMEX_CLIENT_CERT \S*node-0\.pem", mismatch), mismatch

    empty = tmp_path / "empty-bundle.pem"
    empty.write_text("# no certificates here\n")
    bundle = start_error(cluster, config_with(cluster, {**good, "IMEX_SERVER_CERT_AUTH": str(empty)}, "bundle"))
    assert "IMEX_SERVER_CERT_AUTH" in bundle and "no PEM CA certificate" in bundle, bundle

    env_val = start_error(cluster, config_with(cluster, {**good, "IMEX_AUTH_SOURCE": "ENV_VAL"}, "envval"))
    assert "IMEX_AUTH_SOURCE: ENV_VAL" in env_val and "not implemented by the IMEX stand-in" in env_val

    gss = start_error(cluster, config_with(cluster, good, "gss", IMEX_AUTH_ENCRYPTION_MODE="GSS_AUTH_ENCRYPT"))
    assert "IMEX_AUTH_ENCRYPTION_MODE: GSS_AUTH_ENCRYPT is not supported by the stand-in" in gss

    # ENV_PATH: the values name environment variables that hold the paths.
    names = {key: f"NVLF_TEST_{key}" for key in good if key.endswith(("_KEY", "_CERT", "_CERT_AUTH"))}
    env = {names[key]: good[key] for key in names}
    cfg = config_with(cluster, {**good, **names, "IMEX_AUTH_SOURCE": "ENV_PATH"}, "envpath")
    ok = subprocess.run([str(cluster.bin / "nvidia-imex"), "-c", str(cfg), "--check-config"], capture_output=True,
                        text=True, timeout=10, check=False, env={**os.environ, **env})
    assert ok.returncode == 0 and "IMEX_AUTH_SOURCE=ENV_PATH" in ok.stdout and "/CN=node-0," in ok.stdout, ok
    unset = start_error(cluster, cfg, {k: v for k, v in env.items() if k != names["IMEX_CLIENT_CERT"]})
    assert "IMEX_CLIENT_CERT: environment variable NVLF_TEST_IMEX_CLIENT_CERT (IMEX_AUTH_SOURCE=ENV_PATH) is not " \
           "set" in unset, unset
