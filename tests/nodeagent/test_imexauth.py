"""The agent's side of IMEX credentials (nvlfabric/nodeagent/imexauth.py): when a node asks for a
new certificate as its domain's authority is replaced, and what it reports it holds."""

from __future__ import annotations

import datetime
import time
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from nvlfabric.api import computedomain as api
from nvlfabric.controller import imexauth as signer
from nvlfabric.nodeagent import imexauth
from tests.support.csr import DOMAIN, UID, csr, request_pem

NOW = datetime.datetime.now(datetime.UTC)


def _files(tmp: Path, authority: signer.Authority) -> imexauth.Files:
    """A node's tls/ with a key and a certificate of `authority`, valid for an hour."""
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    _, node, req = signer.check_request(csr(request_pem(key=key)), {UID: DOMAIN})
    f = imexauth.Files(tmp / "node.key", tmp / "node.crt", tmp / "ca.crt")
    f.key.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption()))
    f.cert.write_text(signer.sign(authority, req, node, DOMAIN, 3600, now=NOW))
    return f


def test_a_node_renews_once_its_authority_no_longer_signs_and_not_before(tmp_path: Path) -> None:
    old = signer.new_authority("team-a", "train", UID, now=NOW)
    new = signer.new_authority("team-a", "train", UID, now=NOW, generation=2)
    f = _files(tmp_path, old)
    assert imexauth.due(f, old.cert_pem) is None
    assert imexauth.due(f, old.cert_pem + new.cert_pem) is None, "introduced, the new one does not sign yet"
    assert imexauth.due(f, new.cert_pem + old.cert_pem) == "its certificate is of an authority being retired"
    assert imexauth.due(f, new.cert_pem) == "its certificate is of another authority"
    assert imexauth.due(f, old.cert_pem, now=time.time() + 2500) == "its certificate is due for renewal"


def test_a_node_reports_the_bundle_it_trusts_and_its_certificates_authority(tmp_path: Path) -> None:
    old = signer.new_authority("team-a", "train", UID, now=NOW)
    new = signer.new_authority("team-a", "train", UID, now=NOW, generation=2)
    f = _files(tmp_path, old)
    assert imexauth.held(f) is None, "no ca.crt yet"
    assert imexauth.write_bundle(f, old.cert_pem + new.cert_pem)
    assert not imexauth.write_bundle(f, old.cert_pem + new.cert_pem), "an unchanged bundle is not rewritten"
    assert imexauth.held(f) == (api.imex_bundle_digest(old.cert_pem + new.cert_pem), old.key_id)
    issuer = x509.load_pem_x509_certificate(f.cert.read_bytes()).issuer
    assert issuer == old.cert.subject != new.cert.subject
