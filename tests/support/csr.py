"""IMEX certificate signing requests as a node agent writes them, and one TLS domain to sign them for."""

from __future__ import annotations

import base64

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from lightkube.resources.certificates_v1 import CertificateSigningRequest

from nvlfabric.api import names
from nvlfabric.controller import imexauth

UID = "0f8fad5b-d9cb-469f-a165-70867728950e"
DOMAIN = imexauth.TlsDomain("team-a", "train", UID, frozenset({"node-1", "node-2"}))


def request_pem(cn: str = names.imex_node_subject("node-1"), dns: tuple[str, ...] = (names.imex_target(UID),),
             key: object = None) -> str:
    key = key or ec.generate_private_key(ec.SECP256R1())
    builder = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
    if dns:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(d) for d in dns]), critical=False)
    return base64.b64encode(builder.sign(key, hashes.SHA256()).public_bytes(  # type: ignore[arg-type]
        serialization.Encoding.PEM)).decode()


def csr(request: str | None = None, *, user: str = names.AGENT_USERNAME, node: str | None = "node-1",
         usages: tuple[str, ...] = ("digital signature", "server auth", "client auth")) -> CertificateSigningRequest:
    return CertificateSigningRequest.from_dict({
        "metadata": {"name": "r"},
        "spec": {"signerName": names.IMEX_SIGNER, "request": request or request_pem(), "usages": list(usages),
                 "username": user, "extra": {names.NODE_NAME_EXTRA: [node]} if node else {}}})
