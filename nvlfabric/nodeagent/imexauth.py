"""This node's IMEX credentials for `imexAuthentication: TLS` domains.

Per domain, under `<workdir>/<domain id>/tls/`: `node.key` (made here, mode 0600, never sent
anywhere), `node.crt` (signed by the domain's authority through a CertificateSigningRequest of
signer `nvlfabric.io/imex`, which the controller answers for member nodes only:
nvlfabric/controller/imexauth.py) and `ca.crt` (the authority's certificate, from the domain's
`status.imexCABundle`). The daemon's config names the three files for both its server and its
client side, and `IMEX_SECURITY_TARGET_OVERRIDE=<uid>.imex.nvlfabric.io`, the name every
certificate of the domain carries.

The agent reports what it holds in its status entry (`imexTrusts`: the digest of the bundle its
daemon loaded; `imexIssuer`: its certificate's authority), which is how the controller paces an
authority rotation: it signs with a new authority only once every member trusts it, and drops the
old one only once no member's certificate is of it. The bundle's first authority is the one that
signs; a certificate of another one is renewed.

Renewal under a running domain: once two thirds of a certificate's life (counted from when it was
written here) have passed, a new key and certificate replace the files (the key first, then the
certificate, each atomically) and the daemon gets SIGUSR1, which makes it load them for new links
while its established links, and so every pod's imports, stay as they are.

`cryptography` is imported by the agent only when a TLS domain is prepared here: the agent on a
node without one does not load it (its memory, docs/architecture.md "Scale").
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nvlfabric.api import computedomain as api
from nvlfabric.api import errors, names
from nvlfabric.nodeagent import files, imexconfig, kubeapi

CSR_PATH = kubeapi.path("certificates.k8s.io/v1", "certificatesigningrequests")
RENEW_AFTER = 2 / 3
POLL_S = 0.25
USAGES = ["digital signature", "server auth", "client auth"]


class CredentialsError(Exception):
    """The domain's credentials cannot be had now (denied, not answered in time, or unreadable)."""


@dataclass(frozen=True)
class Files:
    key: Path
    cert: Path
    ca: Path

    @classmethod
    def of(cls, domain_dir: Path) -> Files:
        return cls(domain_dir / imexconfig.TLS_KEY, domain_dir / imexconfig.TLS_CERT, domain_dir / imexconfig.TLS_CA)


def due(f: Files, bundle: str, *, now: float | None = None) -> str | None:
    """Why this node needs a new certificate for the domain (None: the one it has is good)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    now = time.time() if now is None else now
    try:
        cert = x509.load_pem_x509_certificate(f.cert.read_bytes())
        key = serialization.load_pem_private_key(f.key.read_bytes(), password=None)
        written = f.cert.stat().st_mtime
    except FileNotFoundError:
        return "no certificate yet"
    except ValueError as exc:
        return f"its certificate or key does not parse ({exc})"
    spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if cert.public_key().public_bytes(*spki) != key.public_key().public_bytes(*spki):
        return "its key does not match its certificate"
    authorities = x509.load_pem_x509_certificates(bundle.encode()) if bundle else []
    if not authorities or _issuer_id(cert) != _key_id(authorities[0]):
        # The bundle's first authority is the one that signs: a certificate of another one (a
        # retiring authority's, during a rotation) is replaced while both are still trusted.
        return ("its certificate is of an authority being retired" if any(
            _issuer_id(cert) == _key_id(a) for a in authorities) else "its certificate is of another authority")
    end = cert.not_valid_after_utc.timestamp()
    if now >= written + RENEW_AFTER * max(0.0, end - written):
        return "its certificate is due for renewal"
    return None


def _key_id(ca: Any) -> str:
    from cryptography import x509

    try:
        return str(ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value.digest.hex())
    except x509.ExtensionNotFound:
        return f"subject:{ca.subject.rfc4514_string()}"


def _issuer_id(cert: Any) -> str:
    from cryptography import x509

    try:
        kid = cert.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value.key_identifier
    except x509.ExtensionNotFound:
        kid = None
    return str(kid.hex()) if kid else f"subject:{cert.issuer.rfc4514_string()}"


def held(f: Files) -> tuple[str, str] | None:
    """What this node reports for the domain (status entry imexTrusts, imexIssuer): the digest of the
    bundle in its ca.crt and the key identifier of its certificate's authority; None while a file
    is missing or does not parse."""
    from cryptography import x509

    try:
        bundle, cert = f.ca.read_text(), x509.load_pem_x509_certificate(f.cert.read_bytes())
    except (OSError, ValueError):
        return None
    issuer = _issuer_id(cert)
    return api.imex_bundle_digest(bundle), ("" if issuer.startswith("subject:") else issuer)


def write_bundle(f: Files, bundle: str) -> bool:
    """The authority's certificate(s) in `ca.crt`; True if that changed the file."""
    data = bundle.encode()
    with contextlib.suppress(FileNotFoundError):
        if f.ca.read_bytes() == data:
            return False
    f.ca.parent.mkdir(parents=True, exist_ok=True)
    files.atomic_write(f.ca, data)
    return True


def _request_name(node: str, uid: str) -> str:
    # Unique per attempt, and a DNS subdomain of at most 253 characters whatever the node's name.
    tag = hashlib.sha256(f"{node}/{uid}/{time.time_ns()}".encode()).hexdigest()[:10]
    return f"imex-{uid[:8]}-{node[:200]}-{tag}"


def obtain(client: kubeapi.Client, node: str, uid: str, f: Files, *, deadline: float) -> None:
    """A new key and a certificate for it, signed by the domain's authority, into `f`; or a
    CredentialsError that says why not (the controller's own words when it denied the request)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    request = (x509.CertificateSigningRequestBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names.imex_node_subject(node))]))
               .add_extension(x509.SubjectAlternativeName([x509.DNSName(names.imex_target(uid))]), critical=False)
               .sign(key, hashes.SHA256()))
    name = _request_name(node, uid)
    body = {"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
            "metadata": {"name": name, "labels": {names.COMPUTE_DOMAIN_UID_LABEL: uid}},
            "spec": {"signerName": names.IMEX_SIGNER, "usages": USAGES,
                     "request": base64.b64encode(request.public_bytes(serialization.Encoding.PEM)).decode()}}
    client.create(CSR_PATH, body)
    try:
        pem = _wait_issued(client, name, deadline)
    finally:
        with contextlib.suppress(errors.ApiStatusError, OSError):
            client.request("DELETE", f"{CSR_PATH}/{name}")
    cert = x509.load_pem_x509_certificate(pem)
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    if cert.public_key().public_bytes(serialization.Encoding.DER, spki) != \
            key.public_key().public_bytes(serialization.Encoding.DER, spki):
        raise CredentialsError(f"CertificateSigningRequest {name} was answered with a certificate of another key")
    f.key.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(f.key.parent, 0o700)
    # Key first, then certificate: the daemon loads them only on our SIGUSR1, sent after both.
    files.atomic_write(f.key, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                serialization.NoEncryption()), mode=0o600)
    files.atomic_write(f.cert, pem)


def _wait_issued(client: kubeapi.Client, name: str, deadline: float) -> bytes:
    while True:
        obj: dict[str, Any] = client.get(f"{CSR_PATH}/{name}")
        status = obj.get("status") or {}
        for c in status.get("conditions") or []:
            if c.get("type") in ("Denied", "Failed") and c.get("status") == "True":
                raise CredentialsError(f"the nvlfabric controller {c['type'].lower()} CertificateSigningRequest "
                                       f"{name}: {c.get('reason')}: {c.get('message')}")
        if status.get("certificate"):
            return base64.b64decode(status["certificate"])
        if time.monotonic() >= deadline:
            raise CredentialsError(f"CertificateSigningRequest {name} (signer {names.IMEX_SIGNER}) was not answered "
                                   "in time; is the nvlfabric controller running?")
        time.sleep(POLL_S)
