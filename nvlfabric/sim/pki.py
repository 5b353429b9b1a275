"""Certificates and credentials for the local control plane.

One throwaway CA signs the API server's serving certificate, the client certificate it shows the
kubelets (`kubelet-client.crt`, for `kubectl logs`), and each simulated node's kubelet serving
certificate (`node_serving`, with the node's address, which the API server checks against the
CA); a separate RSA key signs service account tokens; the admin credential is a bearer token
listed in the API server's token file (user `nvlfabric-admin`, group `system:masters`).
Everything is regenerated on every `up`: the cluster is disposable, and fresh material means no
stale trust between runs.
"""

from __future__ import annotations

import datetime
import ipaddress
import secrets
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

ADMIN_USER = "nvlfabric-admin"


def _write_private(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    path.chmod(0o600)


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def generate(pki_dir: Path, extra_ips: tuple[str, ...] = ()) -> str:
    """Write ca.crt, apiserver.crt/.key, sa.key/.pub and tokens.csv; return the admin token.
    `extra_ips`: more addresses the API server is reached at (the pod network's gateway)."""
    pki_dir.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    valid = (now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=365))

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "nvlfabric-sim-ca")])
    ca_cert = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(valid[0]).not_valid_after(valid[1])
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )

    srv_key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [
        x509.DNSName("localhost"), x509.DNSName("kubernetes"), x509.DNSName("kubernetes.default"),
        x509.DNSName("kubernetes.default.svc"), x509.DNSName("kubernetes.default.svc.cluster.local"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.IPAddress(ipaddress.ip_address("10.0.0.1")),
        *(x509.IPAddress(ipaddress.ip_address(a)) for a in extra_ips),
    ]
    srv_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_name).public_key(srv_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(valid[0]).not_valid_after(valid[1])
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    (pki_dir / "ca.crt").write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    _write_private(pki_dir / "ca.key", _key_pem(ca_key))
    (pki_dir / "apiserver.crt").write_bytes(srv_cert.public_bytes(serialization.Encoding.PEM))
    _write_private(pki_dir / "apiserver.key", _key_pem(srv_key))
    client = _signed(ca_cert, ca_key, "kube-apiserver-kubelet-client", [], x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH,
                     organization="system:masters")
    (pki_dir / "kubelet-client.crt").write_bytes(client[0])
    _write_private(pki_dir / "kubelet-client.key", client[1])

    # Service-account tokens are RS256-signed by default; the API server verifies with the key.
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_private(pki_dir / "sa.key", _key_pem(sa_key))
    (pki_dir / "sa.pub").write_bytes(sa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))

    token = secrets.token_hex(24)
    _write_private(pki_dir / "tokens.csv", f'{token},{ADMIN_USER},{ADMIN_USER},"system:masters"\n'.encode())
    return token


def _signed(ca_cert: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, common_name: str,
            sans: list[x509.GeneralName], usage: x509.ObjectIdentifier, *,
            organization: str | None = None) -> tuple[bytes, bytes]:
    """A leaf certificate and its key (PEM), signed by the CA, valid as long as the CA is."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        subject.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    builder = (
        x509.CertificateBuilder().subject_name(x509.Name(subject)).issuer_name(ca_cert.subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(ca_cert.not_valid_before_utc).not_valid_after(ca_cert.not_valid_after_utc)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM), _key_pem(key)


def _node_certificate(pki_dir: Path, node: str, sans: list[x509.GeneralName], usage: x509.ObjectIdentifier,
                      out_dir: Path, stem: str) -> tuple[Path, Path]:
    ca_cert = x509.load_pem_x509_certificate((pki_dir / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((pki_dir / "ca.key").read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    cert, key = _signed(ca_cert, ca_key, f"system:node:{node}", sans, usage, organization="system:nodes")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{stem}.crt").write_bytes(cert)
    _write_private(out_dir / f"{stem}.key", key)
    return out_dir / f"{stem}.crt", out_dir / f"{stem}.key"


def node_serving(pki_dir: Path, node: str, address: str, out_dir: Path) -> tuple[Path, Path]:
    """Write a node's kubelet serving certificate and key into `out_dir` (as a kubelet's own,
    `system:node:<name>`, for its name and address), signed by the cluster's CA; their paths."""
    return _node_certificate(pki_dir, node, [x509.DNSName(node), x509.IPAddress(ipaddress.ip_address(address))],
                             x509.oid.ExtendedKeyUsageOID.SERVER_AUTH, out_dir, "kubelet")


def node_client(pki_dir: Path, node: str, out_dir: Path) -> tuple[Path, Path]:
    """A real kubelet's client certificate (`system:node:<name>` in `system:nodes`): the API
    server's Node authorizer and NodeRestriction then limit it to its own node, as on a cluster."""
    return _node_certificate(pki_dir, node, [], x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH, out_dir, "kubelet-client")


def webhook_serving(pki_dir: Path, service: str, out_dir: Path) -> tuple[Path, Path]:
    """An addon's webhook serving certificate (`tls.crt`, `tls.key` in `out_dir`, the names
    controller-runtime reads), for its Service's DNS name and 127.0.0.1 (the API server calls it
    there: the webhook configurations name a URL), signed by the cluster's CA; their paths."""
    ca_cert = x509.load_pem_x509_certificate((pki_dir / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((pki_dir / "ca.key").read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    cert, key = _signed(ca_cert, ca_key, service, [x509.DNSName(service), x509.IPAddress(
        ipaddress.ip_address("127.0.0.1"))], x509.oid.ExtendedKeyUsageOID.SERVER_AUTH)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "tls.crt").write_bytes(cert)
    _write_private(out_dir / "tls.key", key)
    return out_dir / "tls.crt", out_dir / "tls.key"
