"""IMEX authentication per domain on the simulator (docs/tenants.md, "IMEX authentication"): the
driver installed by the component with `imex_authentication="TLS"`, so a dedicated domain that
does not say gets TLS; the controller makes the domain's authority and signs its members'
certificates; the stand-in daemons (nvlfabric/sim/imex) authenticate every link with them, refuse
a daemon with another domain's or no credentials, and take renewed certificates without a restart.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from lightkube import ApiError, Client, codecs
from lightkube.resources.certificates_v1 import CertificateSigningRequest
from lightkube.resources.core_v1 import Event, Node, Pod, Secret
from lightkube.resources.resource_v1 import ResourceClaim
from lightkube.types import PatchType

from nvlfabric.api import computedomain as api
from nvlfabric.api import names
from nvlfabric.components.driver import NvlfabricDriverArgs, driver_objects
from nvlfabric.controller.cache import ComputeDomainResource
from nvlfabric.nodeagent import imexconfig
from nvlfabric.sim.cluster import eventually, install_crd
from nvlfabric.sim.nodes import SimNode
from nvlfabric.testbed.controlplane import ControlPlane, free_ports
from tests.conftest import simulated_rack
from tests.support.agents import daemons_using, domain_with_pods, pod_gone
from tests.support.tenants import token_client

pytestmark = pytest.mark.cluster
RACK = 171  # addresses 127.10.171.x: a rack number no other test uses
VALIDITY_S = 30  # short, so that the agents renew under the running domain within the test


@dataclass(frozen=True)
class Rack:
    cp: ControlPlane
    client: Client
    nodes: dict[str, SimNode]


@pytest.fixture(scope="module")
def rack() -> Iterator[Rack]:
    with simulated_rack(ports=free_ports(), first_rack=RACK, nodes=3, field_manager="imex-auth-test",
                        prefix="nvlauth-") as (cp, client):
        install_crd(client)
        args = NvlfabricDriverArgs(imex_authentication=api.IMEXAuthentication.TLS, imex_cert_validity_s=VALIDITY_S)
        for obj in driver_objects(args):
            if obj["kind"] == "DaemonSet":  # membership and renewal checks every 2 s
                obj["spec"]["template"]["spec"]["containers"][0].setdefault("env", []).append(
                    {"name": "RESYNC_SECONDS", "value": "2"})
            client.apply(codecs.from_dict(obj), field_manager="imex-auth-test", force=True)
        nodes = {n.name: n for n in cp.nodes()}
        eventually("the agents to label their Nodes", lambda: all(
            (client.get(Node, n).metadata.labels or {}).get(names.CLIQUE_LABEL) for n in nodes), timeout=120)
        yield Rack(cp, client, nodes)


def _ready(client: Client, name: str) -> dict[str, Any]:
    return eventually(f"ComputeDomain {name} to be Ready", lambda: (
        s if (s := client.get(ComputeDomainResource, name, namespace="default").status or {}).get("phase")
        == "Ready" else None), timeout=120)


def _dir(node: SimNode, uid: str) -> Path:
    return node.kubelet_root / "plugins" / names.DRIVER / "imex" / f"cd-{uid}"


def _ctl(node: SimNode, address: str, cmd_port: int) -> dict[str, Any]:
    """`nvidia-imex-ctl -N -j` against the daemon at address:cmd_port (the node's own ctl binary)."""
    out = subprocess.run([str(node.dir / "driver-root" / "usr" / "bin" / "nvidia-imex-ctl"), "-N", "-j",
                          "-i", address, str(cmd_port)], capture_output=True, text=True, timeout=10, check=False)
    return json.loads(out.stdout) if out.stdout.strip().startswith("{") else {"status": "NO ANSWER",
                                                                               "stderr": out.stderr}


def _links(view: dict[str, Any], me: str) -> dict[str, str]:
    """What the daemon at `me` says of each peer link (peer address -> status)."""
    mine = next(n for n in view.get("nodes", {}).values() if n["host"] == me)
    return {c["host"]: c["status"] for c in mine["connections"].values() if c["host"] != me}


def _pid(node: SimNode, uid: str) -> int:
    (pid,) = [p for p in daemons_using(f"/var/lib/kubelet/plugins/{names.DRIVER}/imex/cd-{uid}/config.cfg")
              if node.runs(p)]
    return pid


def _serial(node: SimNode, uid: str) -> int:
    return x509.load_pem_x509_certificate((_dir(node, uid) / "tls" / "node.crt").read_bytes()).serial_number


def _cleanup(client: Client, name: str, count: int) -> None:
    for i in range(count):
        with contextlib.suppress(ApiError):
            client.delete(Pod, f"{name}-{i}", namespace="default")
    for i in range(count):
        eventually("the pods to be removed after unprepare", lambda i=i: pod_gone(client, f"{name}-{i}"), timeout=90)
    with contextlib.suppress(ApiError):
        client.delete(ComputeDomainResource, name, namespace="default")
    with contextlib.suppress(ApiError):
        client.delete(ResourceClaim, f"{name}-channel", namespace="default")


def _intruder(rack: Rack, tmp: Path, address: str, members: list[str], slot: int,
              credentials: Path | None, target: str) -> subprocess.Popen[bytes]:
    """A stand-in daemon outside nvlfabric, on `address` with the domain's ports and its members
    plus itself in its nodes file: with `credentials` (a domain directory's tls/) or none."""
    ports = imexconfig.ports_for_slot(slot)
    (tmp / "nodes.cfg").write_text(imexconfig.render_nodes([*members, address]))
    lines = [f"BIND_INTERFACE_IP={address}", f"SERVER_PORT={ports.server}", f"IMEX_CMD_PORT={ports.cmd}",
             f"IMEX_CMD_BIND_INTERFACE_IP={address}", f"IMEX_NODE_CONFIG_FILE={tmp / 'nodes.cfg'}", "DAEMONIZE=0",
             "LOG_FILE_NAME=", "LOG_LEVEL=4"]
    if credentials is not None:
        lines += ["IMEX_ENABLE_AUTH_ENCRYPTION=1", "IMEX_AUTH_ENCRYPTION_MODE=SSL_TLS", "IMEX_AUTH_SOURCE=FILE",
                  f"IMEX_SECURITY_TARGET_OVERRIDE={target}"]
        for side in ("SERVER", "CLIENT"):
            lines += [f"IMEX_{side}_KEY={credentials / 'node.key'}", f"IMEX_{side}_CERT={credentials / 'node.crt'}",
                      f"IMEX_{side}_CERT_AUTH={credentials / 'ca.crt'}"]
    (tmp / "config.cfg").write_text("\n".join(lines) + "\n")
    binary = next(iter(rack.nodes.values())).dir / "driver-root" / "usr" / "bin" / "nvidia-imex"
    with (tmp / "imex.log").open("wb") as log:
        return subprocess.Popen([str(binary), "-c", str(tmp / "config.cfg")], stdout=log, stderr=subprocess.STDOUT)


def test_a_tls_domain_authenticates_with_its_own_authority_and_refuses_intruders(rack: Rack, tmp_path: Path) -> None:
    client, nodes = rack.client, rack.nodes
    members, other = sorted(nodes)[:2], sorted(nodes)[2]
    a, b = f"tls-a-{uuid.uuid4().hex[:5]}", f"tls-b-{uuid.uuid4().hex[:5]}"
    uid_a = domain_with_pods(client, a, members, {"imexMode": "Dedicated", "numNodes": 2})  # TLS: the default
    uid_b = domain_with_pods(client, b, [other], {"imexMode": "Dedicated", "imexAuthentication": "TLS"})
    intruders: list[subprocess.Popen[bytes]] = []
    try:
        status = _ready(client, a)
        _ready(client, b)
        assert status["imexAuthentication"] == "TLS"
        authority = x509.load_pem_x509_certificate(status["imexCABundle"].encode())
        secret = client.get(Secret, f"{names.IMEX_CA_SECRET_PREFIX}{uid_a}", namespace=names.NAMESPACE)
        assert secret.type == "kubernetes.io/tls"
        assert base64.b64decode(secret.data["tls.crt"]).decode() == status["imexCABundle"]
        slot = status["imexPortSlot"]
        ports = imexconfig.ports_for_slot(slot)
        addresses = sorted(nodes[n].address for n in members)
        for n in members:
            d = _dir(nodes[n], uid_a)
            config = (d / "config.cfg").read_text()
            assert "IMEX_ENABLE_AUTH_ENCRYPTION=1" in config
            assert f"IMEX_SECURITY_TARGET_OVERRIDE={names.imex_target(uid_a)}" in config
            assert (d / "tls" / "node.key").stat().st_mode & 0o077 == 0, "the node's key is readable by others"
            cert = x509.load_pem_x509_certificate((d / "tls" / "node.crt").read_bytes())
            assert cert.issuer == authority.subject
            assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == names.imex_node_subject(n)
            assert cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
                x509.DNSName) == [names.imex_target(uid_a)]
            # UP, and its connection to the peer listed (the -N view can show UP a moment before).
            view = eventually(f"{n}'s daemon to be connected to its peer", lambda n=n: (
                v if (v := _ctl(nodes[n], nodes[n].address, ports.cmd)).get("status") == "UP"
                and _links(v, nodes[n].address) else None))
            assert set(_links(view, nodes[n].address)) == set(addresses) - {nodes[n].address}
        assert not list(client.list(CertificateSigningRequest, fields={"spec.signerName": names.IMEX_SIGNER})), \
            "the agents delete their requests once answered"

        # Intruders at the third node's address, with the domain's ports: one without credentials,
        # then one with the credentials of domain b (valid, but of another authority).
        intruder = nodes[other].address
        for creds, what in ((None, "no credentials"), (_dir(nodes[other], uid_b) / "tls", "domain b's")):
            work = tmp_path / what.split()[0].strip("'")
            work.mkdir()
            proc = _intruder(rack, work, intruder, addresses, slot, creds, names.imex_target(uid_a))
            intruders.append(proc)
            seen = eventually(f"the intruder with {what} credentials to be refused", lambda creds=creds: (
                v if (v := _ctl(nodes[other], intruder, ports.cmd)).get("nodes") and
                all(s != "CONNECTED" for s in _links(v, intruder).values()) and
                len(_links(v, intruder)) == 2 and (creds is None or
                                                   set(_links(v, intruder).values()) == {"AUTHENTICATING"}) else None),
                timeout=30)
            assert seen["status"] != "UP", seen
            time.sleep(1.5)  # a few of its redials
            for n in members:  # the members' own domain is untouched
                view = _ctl(nodes[n], nodes[n].address, ports.cmd)
                assert view["status"] == "UP" and set(_links(view, nodes[n].address).values()) == {"CONNECTED"}
            proc.terminate()
            proc.wait(timeout=10)
        logs = "".join((_dir(nodes[n], uid_a) / "imex.log").read_text(errors="replace") for n in members)
        assert intruder in logs and "TLS" in logs, "the members do not log the refused intruder"
    finally:
        for proc in intruders:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        _cleanup(client, a, 2)
        _cleanup(client, b, 1)
    eventually("the authorities of deleted domains to go", lambda: not [
        s for s in client.list(Secret, namespace=names.NAMESPACE)
        if s.metadata.name in (f"{names.IMEX_CA_SECRET_PREFIX}{uid_a}", f"{names.IMEX_CA_SECRET_PREFIX}{uid_b}")],
        timeout=30)


def test_certificates_are_renewed_under_a_running_domain_without_disturbing_it(rack: Rack) -> None:
    client, nodes = rack.client, rack.nodes
    members = sorted(nodes)[:2]
    name = f"tls-r-{uuid.uuid4().hex[:5]}"
    uid = domain_with_pods(client, name, members, {"imexMode": "Dedicated", "imexAuthentication": "TLS", "numNodes": 2})
    try:
        status = _ready(client, name)
        ports = imexconfig.ports_for_slot(status["imexPortSlot"])
        pods = {p: client.get(Pod, p, namespace="default").metadata.uid for p in (f"{name}-0", f"{name}-1")}
        for n in members:  # Ready says each daemon is READY; its links may still be coming up
            eventually(f"{n}'s daemon to be connected", lambda n=n: _ctl(nodes[n], nodes[n].address,
                                                                         ports.cmd).get("status") == "UP")
        before = {n: (_pid(nodes[n], uid), _serial(nodes[n], uid)) for n in members}
        deadline = time.monotonic() + 3 * VALIDITY_S
        while any(_serial(nodes[n], uid) == before[n][1] for n in members):
            assert time.monotonic() < deadline, "the agents did not renew their certificates"
            for n in members:  # the domain stays up, all along
                assert _ctl(nodes[n], nodes[n].address, ports.cmd)["status"] == "UP"
            time.sleep(1)
        for n in members:
            assert _pid(nodes[n], uid) == before[n][0], f"{n}'s IMEX daemon was restarted"
            eventually(f"{n}'s daemon to load its new certificate", lambda n=n: "TLS credentials reloaded" in (
                _dir(nodes[n], uid) / "imex.log").read_text(errors="replace"), timeout=20)
            assert _ctl(nodes[n], nodes[n].address, ports.cmd)["status"] == "UP"
        for pod, pod_uid in pods.items():
            p = client.get(Pod, pod, namespace="default")
            assert (p.metadata.uid, p.status.phase) == (pod_uid, "Running")
            assert not [s for s in p.status.containerStatuses or [] if s.restartCount]
        # A daemon that starts after the renewal (a crash) joins with the new credentials.
        os.kill(_pid(nodes[members[0]], uid), signal.SIGKILL)
        eventually("the restarted daemon to join its peer with the renewed credentials", lambda: (
            _ctl(nodes[members[0]], nodes[members[0]].address, ports.cmd).get("status") == "UP"), timeout=60)
    finally:
        _cleanup(client, name, 2)


def test_the_controller_signs_for_members_only(rack: Rack) -> None:
    """Asked with the agent's own token of a node that is not a member, or for another node, the
    controller denies the request and says which rule; the agent cannot read an authority."""
    client, nodes = rack.client, rack.nodes
    members, outsider = sorted(nodes)[:1], sorted(nodes)[2]
    name = f"tls-s-{uuid.uuid4().hex[:5]}"
    uid = domain_with_pods(client, name, members, {"imexMode": "Dedicated", "imexAuthentication": "TLS"})
    kubeconfig = yaml.safe_load(rack.cp.kubeconfig.read_text())["clusters"][0]["cluster"]
    agent_pod = next(p for p in client.list(Pod, namespace=names.NAMESPACE,
                                            labels={"app.kubernetes.io/name": "nvlfabric-agent"})
                     if p.spec.nodeName == outsider)
    agent = token_client(client, kubeconfig["server"], kubeconfig["certificate-authority-data"],
                         names.AGENT_SERVICE_ACCOUNT, bound_pod=agent_pod, manager="spy")
    try:
        _ready(client, name)

        def ask(subject: str, what: str) -> str:
            key = ec.generate_private_key(ec.SECP256R1())
            req = (x509.CertificateSigningRequestBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
                   .add_extension(x509.SubjectAlternativeName([x509.DNSName(names.imex_target(uid))]), critical=False)
                   .sign(key, hashes.SHA256()))
            csr = f"spy-{what}-{uuid.uuid4().hex[:5]}"
            agent.create(CertificateSigningRequest.from_dict({
                "metadata": {"name": csr}, "spec": {
                    "signerName": names.IMEX_SIGNER, "usages": ["digital signature", "client auth", "server auth"],
                    "request": base64.b64encode(req.public_bytes(serialization.Encoding.PEM)).decode()}}))
            done = eventually(f"the controller to answer {csr}", lambda: (
                c if (c := client.get(CertificateSigningRequest, csr)).status and c.status.conditions else None),
                timeout=40)
            assert not done.status.certificate
            (cond,) = done.status.conditions
            assert cond.type == "Denied"
            client.delete(CertificateSigningRequest, csr)
            return f"{cond.reason}: {cond.message}"

        assert ask(names.imex_node_subject(members[0]), "other").startswith(
            f"WrongNode: the request names ['{names.imex_node_subject(members[0])}'], but the requester's node is "
            f"{outsider}")
        assert ask(names.imex_node_subject(outsider), "self").startswith(
            f"NotADomainMember: node {outsider} is not (yet) a member of ComputeDomain default/{name}")
        with pytest.raises(ApiError) as refused:
            agent.get(Secret, f"{names.IMEX_CA_SECRET_PREFIX}{uid}", namespace=names.NAMESPACE)
        assert refused.value.status.code == 403
    finally:
        agent.close()
        _cleanup(client, name, 1)


def _mint(tmp: Path, ca_pem: bytes, ca_key_pem: bytes, node: str, uid: str) -> Path:
    """A node key and certificate made with an authority's key (as whoever stole it would), in a
    tls/ directory a stand-in daemon can use."""
    ca = x509.load_pem_x509_certificate(ca_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names.imex_node_subject(node))]))
            .issuer_name(ca.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=1)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(names.imex_target(uid))]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    tmp.mkdir(parents=True)
    (tmp / "node.key").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                     serialization.NoEncryption()))
    (tmp / "node.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp / "ca.crt").write_bytes(ca_pem)
    return tmp


def _key_id(ca_pem: str) -> str:
    ca = x509.load_pem_x509_certificate(ca_pem.encode())
    return ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value.digest.hex()


def test_the_authority_is_replaced_under_a_running_domain_and_the_old_one_stops_working(
        rack: Rack, tmp_path: Path) -> None:
    """`kubectl annotate cd NAME nvlfabric.io/rotate-imex-authority=...` (what to do when an
    authority's key may have leaked): the controller brings in a new authority, switches to it once
    every member trusts it and retires the old one once every member's certificate is of the new
    one. No pod, daemon or link is disturbed, and a certificate made with the old key, which worked
    before, is refused after."""
    client, nodes = rack.client, rack.nodes
    members, outsider = sorted(nodes)[:2], sorted(nodes)[2]
    name = f"tls-x-{uuid.uuid4().hex[:5]}"
    uid = domain_with_pods(client, name, members, {"imexMode": "Dedicated", "imexAuthentication": "TLS", "numNodes": 2})
    secret_name = f"{names.IMEX_CA_SECRET_PREFIX}{uid}"
    intruders: list[subprocess.Popen[bytes]] = []

    def stolen_credentials_authenticate(work: Path) -> bool:
        work.mkdir()
        proc = _intruder(rack, work, nodes[outsider].address, addresses, status["imexPortSlot"], stolen,
                         names.imex_target(uid))
        intruders.append(proc)
        try:
            def settled() -> dict[str, str] | None:
                view = _ctl(nodes[outsider], nodes[outsider].address, ports.cmd)
                links = _links(view, nodes[outsider].address) if view.get("nodes") else {}
                # Authenticated, it gets as far as the members' map check (MAP_MISMATCH: its nodes
                # file names itself too); refused, it never gets past the handshake.
                return links if len(links) == 2 and (set(links.values()) <= {"CONNECTED", "MAP_MISMATCH"} or
                                                     set(links.values()) == {"AUTHENTICATING"}) else None

            links = eventually("the daemon with the old authority's certificate to settle", settled, timeout=30)
            return "AUTHENTICATING" not in links.values()
        finally:
            proc.terminate()
            proc.wait(timeout=10)

    try:
        status = _ready(client, name)
        ports = imexconfig.ports_for_slot(status["imexPortSlot"])
        addresses = sorted(nodes[n].address for n in members)
        for n in members:
            eventually(f"{n}'s daemon to be connected", lambda n=n: _ctl(nodes[n], nodes[n].address,
                                                                         ports.cmd).get("status") == "UP")
        pods = {p: client.get(Pod, p, namespace="default").metadata.uid for p in (f"{name}-0", f"{name}-1")}
        pids = {n: _pid(nodes[n], uid) for n in members}
        old = client.get(Secret, secret_name, namespace=names.NAMESPACE).data
        old_pem = base64.b64decode(old["tls.crt"]).decode()
        stolen = _mint(tmp_path / "stolen", old_pem.encode(), base64.b64decode(old["tls.key"]), outsider, uid)
        assert stolen_credentials_authenticate(tmp_path / "before"), "a certificate of the domain's CA is refused"

        client.patch(ComputeDomainResource, name, {"metadata": {"annotations": {
            names.ROTATE_IMEX_AUTHORITY_ANNOTATION: "after-incident-42"}}}, namespace="default",
            patch_type=PatchType.MERGE)
        deadline = time.monotonic() + 90
        while True:
            secret = client.get(Secret, secret_name, namespace=names.NAMESPACE)
            data, annotations = secret.data, secret.metadata.annotations or {}
            if annotations.get(f"{names.GROUP}/rotation-handled") == "after-incident-42" and \
                    not {"next.crt", "previous.crt"} & set(data) and data["tls.crt"] != old["tls.crt"]:
                break
            assert time.monotonic() < deadline, f"the rotation did not complete: Secret keys {sorted(data)}"
            for n in members:  # the domain stays up, all along
                assert _ctl(nodes[n], nodes[n].address, ports.cmd)["status"] == "UP"
            time.sleep(1)

        new_pem = base64.b64decode(data["tls.crt"]).decode()
        status = eventually("the status to hold the new authority only, and each member to report it", lambda: (
            s if (s := client.get(ComputeDomainResource, name, namespace="default").status or {}).get(
                "imexCABundle") == new_pem and all(
                e.get("imexTrusts") == api.imex_bundle_digest(new_pem) and e.get("imexIssuer") == _key_id(new_pem)
                for e in s["nodes"]) and len(s["nodes"]) == 2 else None), timeout=30)
        assert status["phase"] == "Ready"
        reasons = [e.reason for e in client.list(Event, namespace="default",
                                                 fields={"involvedObject.name": name})]
        for reason in ("IMEXAuthorityIntroduced", "IMEXAuthoritySwitched", "IMEXAuthorityRotated"):
            assert reason in reasons, reasons
        for n in members:
            d = _dir(nodes[n], uid) / "tls"
            assert (d / "ca.crt").read_text() == new_pem
            cert = x509.load_pem_x509_certificate((d / "node.crt").read_bytes())
            aki = cert.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value.key_identifier
            assert aki is not None and aki.hex() == _key_id(new_pem)
            assert _pid(nodes[n], uid) == pids[n], f"{n}'s IMEX daemon was restarted"
            assert _ctl(nodes[n], nodes[n].address, ports.cmd)["status"] == "UP"
        for pod, pod_uid in pods.items():
            p = client.get(Pod, pod, namespace="default")
            assert (p.metadata.uid, p.status.phase) == (pod_uid, "Running")
            assert not [s for s in p.status.containerStatuses or [] if s.restartCount]
        assert not stolen_credentials_authenticate(tmp_path / "after"), \
            "a certificate made with the retired authority's key is still accepted"
    finally:
        for proc in intruders:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        _cleanup(client, name, 2)
