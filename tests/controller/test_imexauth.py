"""The controller's IMEX signer, rule by rule (nvlfabric/controller/imexauth.py): which requests
it signs, what it denies and with which words, and what a signed certificate holds. The cluster
path (the agents' requests, the Secret, the daemons) is tests/test_imex_auth_on_sim.py."""

from __future__ import annotations

import base64
import datetime

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from lightkube.resources.certificates_v1 import CertificateSigningRequest

from nvlfabric.api import computedomain as api
from nvlfabric.api import names
from nvlfabric.controller import imexauth

UID = "0f8fad5b-d9cb-469f-a165-70867728950e"
DOMAIN = imexauth.TlsDomain("team-a", "train", UID, frozenset({"node-1", "node-2"}))


def _request(cn: str = names.imex_node_subject("node-1"), dns: tuple[str, ...] = (names.imex_target(UID),),
             key: object = None) -> str:
    key = key or ec.generate_private_key(ec.SECP256R1())
    builder = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
    if dns:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(d) for d in dns]), critical=False)
    return base64.b64encode(builder.sign(key, hashes.SHA256()).public_bytes(  # type: ignore[arg-type]
        serialization.Encoding.PEM)).decode()


def _csr(request: str | None = None, *, user: str = names.AGENT_USERNAME, node: str | None = "node-1",
         usages: tuple[str, ...] = ("digital signature", "server auth", "client auth")) -> CertificateSigningRequest:
    return CertificateSigningRequest.from_dict({
        "metadata": {"name": "r"},
        "spec": {"signerName": names.IMEX_SIGNER, "request": request or _request(), "usages": list(usages),
                 "username": user, "extra": {names.NODE_NAME_EXTRA: [node]} if node else {}}})


def test_a_members_request_is_signed_with_the_domains_authority() -> None:
    domain, node, req = imexauth.check_request(_csr(), {UID: DOMAIN})
    assert (domain, node) == (DOMAIN, "node-1")
    authority = imexauth.new_authority("team-a", "train", UID)
    now = datetime.datetime.now(datetime.UTC)
    cert = x509.load_pem_x509_certificate(imexauth.sign(authority, req, node, domain, 3600, now=now).encode())
    assert cert.issuer == authority.cert.subject
    cert.verify_directly_issued_by(authority.cert)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "system:nvlfabric:imex:node-1"
    assert cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName) == [f"{UID}.imex.nvlfabric.io"]
    assert set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == {
        ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert abs(cert.not_valid_after_utc - now - datetime.timedelta(seconds=3600)) < datetime.timedelta(seconds=1)
    assert authority.cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_a_certificate_never_outlives_its_authority() -> None:
    authority = imexauth.new_authority("team-a", "train", UID)
    _, node, req = imexauth.check_request(_csr(), {UID: DOMAIN})
    cert = x509.load_pem_x509_certificate(imexauth.sign(authority, req, node, DOMAIN, 100 * 365 * 86400).encode())
    assert cert.not_valid_after_utc == authority.cert.not_valid_after_utc


@pytest.mark.parametrize(("csr", "reason", "words"), [
    pytest.param(lambda: _csr(user="system:serviceaccount:team-a:default"), "NotTheAgent",
                 "only the nvlfabric node agent (system:serviceaccount:nvlfabric-system:nvlfabric-agent) may ask",
                 id="not-the-agent"),
    pytest.param(lambda: _csr(node=None), "NoNode", "the requester's token is not bound to a node", id="unbound"),
    pytest.param(lambda: _csr(_request(cn=names.imex_node_subject("node-2"))), "WrongNode",
                 "the request names ['system:nvlfabric:imex:node-2'], but the requester's node is node-1",
                 id="another-node"),
    pytest.param(lambda: _csr(_request(dns=())), "WrongTarget", "must name exactly one DNS name", id="no-target"),
    pytest.param(lambda: _csr(_request(dns=(names.imex_target(UID), "evil.example"))), "WrongTarget",
                 "must name exactly one DNS name", id="two-names"),
    pytest.param(lambda: _csr(_request(dns=(names.imex_target("another-uid"),))), "NoSuchDomain",
                 "no ComputeDomain with uid another-uid has imexAuthentication TLS", id="unknown-domain"),
    pytest.param(lambda: _csr(usages=("digital signature", "code signing")), "BadUsages", "exceed", id="usages"),
    pytest.param(lambda: _csr(_request(key=rsa.generate_private_key(65537, 1024))), "WeakKey",
                 "RSA of at least 2048 bits", id="weak-key"),
    pytest.param(lambda: _csr(base64.b64encode(b"not a request").decode()), "BadRequest",
                 "not a PEM certificate request", id="garbage"),
])
def test_requests_outside_the_rules_are_denied_with_the_rule(csr: object, reason: str, words: str) -> None:
    with pytest.raises(imexauth.Verdict) as denied:
        imexauth.check_request(csr(), {UID: DOMAIN})  # type: ignore[operator]
    assert denied.value.reason == reason
    assert words in str(denied.value), str(denied.value)


def test_a_node_whose_membership_has_not_arrived_waits() -> None:
    with pytest.raises(imexauth.NotYet, match="node node-3 is not \\(yet\\) a member of ComputeDomain team-a/train"):
        imexauth.check_request(_csr(_request(cn=names.imex_node_subject("node-3")), node="node-3"), {UID: DOMAIN})


@pytest.mark.parametrize(("spec", "status", "default", "expected"), [
    ({"imexMode": "Dedicated"}, None, "TLS", "TLS"),
    ({"imexMode": "Dedicated"}, None, "Disabled", "Disabled"),
    ({"imexMode": "Dedicated", "imexAuthentication": "Disabled"}, None, "TLS", "Disabled"),
    ({"imexMode": "Dedicated", "imexAuthentication": "TLS"}, None, "Disabled", "TLS"),
    # Recorded once: a later change of the driver's default does not flip a running domain.
    ({"imexMode": "Dedicated"}, {"imexAuthentication": "Disabled"}, "TLS", "Disabled"),
    ({}, None, "TLS", None),  # a clique's shared IMEX domain holds no domain's credentials
])
def test_what_a_domain_runs_with(spec: dict[str, str], status: dict[str, str] | None, default: str,
                                 expected: str | None) -> None:
    got = imexauth.effective(api.ComputeDomainSpec.model_validate(spec),
                             api.ComputeDomainStatus.model_validate(status) if status else None,
                             api.IMEXAuthentication(default))
    assert (got.value if got else None) == expected
