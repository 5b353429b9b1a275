"""The controller's IMEX signer, rule by rule (nvlfabric/controller/imexauth.py): which requests
it signs, what it denies and with which words, and what a signed certificate holds. The cluster
path (the agents' requests, the Secret, the daemons) is tests/e2e/test_imex_auth_on_sim.py."""

from __future__ import annotations

import base64
import datetime

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from nvlfabric.api import computedomain as api
from nvlfabric.api import names
from nvlfabric.controller import imexauth
from tests.support.csr import DOMAIN, UID, csr, request_pem


def test_a_members_request_is_signed_with_the_domains_authority() -> None:
    domain, node, req = imexauth.check_request(csr(), {UID: DOMAIN})
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
    _, node, req = imexauth.check_request(csr(), {UID: DOMAIN})
    cert = x509.load_pem_x509_certificate(imexauth.sign(authority, req, node, DOMAIN, 100 * 365 * 86400).encode())
    assert cert.not_valid_after_utc == authority.cert.not_valid_after_utc


@pytest.mark.parametrize(("csr", "reason", "words"), [
    pytest.param(lambda: csr(user="system:serviceaccount:team-a:default"), "NotTheAgent",
                 "only the nvlfabric node agent (system:serviceaccount:nvlfabric-system:nvlfabric-agent) may ask",
                 id="not-the-agent"),
    pytest.param(lambda: csr(node=None), "NoNode", "the requester's token is not bound to a node", id="unbound"),
    pytest.param(lambda: csr(request_pem(cn=names.imex_node_subject("node-2"))), "WrongNode",
                 "the request names ['system:nvlfabric:imex:node-2'], but the requester's node is node-1",
                 id="another-node"),
    pytest.param(lambda: csr(request_pem(dns=())), "WrongTarget", "must name exactly one DNS name", id="no-target"),
    pytest.param(lambda: csr(request_pem(dns=(names.imex_target(UID), "evil.example"))), "WrongTarget",
                 "must name exactly one DNS name", id="two-names"),
    pytest.param(lambda: csr(request_pem(dns=(names.imex_target("another-uid"),))), "NoSuchDomain",
                 "no ComputeDomain with uid another-uid has imexAuthentication TLS", id="unknown-domain"),
    pytest.param(lambda: csr(usages=("digital signature", "code signing")), "BadUsages", "exceed", id="usages"),
    pytest.param(lambda: csr(request_pem(key=rsa.generate_private_key(65537, 1024))), "WeakKey",
                 "RSA of at least 2048 bits", id="weak-key"),
    pytest.param(lambda: csr(base64.b64encode(b"not a request").decode()), "BadRequest",
                 "not a PEM certificate request", id="garbage"),
])
def test_requests_outside_the_rules_are_denied_with_the_rule(csr: object, reason: str, words: str) -> None:
    with pytest.raises(imexauth.Verdict) as denied:
        imexauth.check_request(csr(), {UID: DOMAIN})  # type: ignore[operator]
    assert denied.value.reason == reason
    assert words in str(denied.value), str(denied.value)


def test_a_node_whose_membership_has_not_arrived_waits() -> None:
    with pytest.raises(imexauth.NotYet, match="node node-3 is not \\(yet\\) a member of ComputeDomain team-a/train"):
        imexauth.check_request(csr(request_pem(cn=names.imex_node_subject("node-3")), node="node-3"), {UID: DOMAIN})


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


# -- replacing the authority under a running domain -------------------------------------------------

NOW = datetime.datetime(2026, 12, 3, tzinfo=datetime.UTC)


def _member(name: str, trusts: str | None = None, issuer: str | None = None, ready: bool = True) -> api.NodeStatus:
    return api.NodeStatus(name=name, ready=ready, imex_trusts=trusts, imex_issuer=issuer)


def _node_cert(authority: imexauth.Authority, node: str = "node-1") -> x509.Certificate:
    _, _, req = imexauth.check_request(csr(request_pem(cn=names.imex_node_subject(node)), node=node), {UID: DOMAIN})
    return x509.load_pem_x509_certificate(imexauth.sign(authority, req, node, DOMAIN, 3600, now=NOW).encode())


def test_a_rotation_goes_introduce_switch_retire_each_step_once_every_ready_member_followed() -> None:
    first = imexauth.Authorities(imexauth.new_authority("team-a", "train", UID, now=NOW))
    old_digest, old_id = api.imex_bundle_digest(first.bundle), first.signing.key_id
    steady = [_member("node-1", old_digest, old_id), _member("node-2", old_digest, old_id),
              _member("node-3", ready=False)]  # a joining node loads whatever is current when it prepares
    assert imexauth.rotation_step(first, "", steady, NOW) is None
    assert imexauth.rotation_step(first, "incident-1", steady, NOW) == "introduce"

    introducing = imexauth.advanced(first, "introduce", "incident-1", "team-a", "train", UID, generation=2)
    assert (introducing.phase, introducing.handled) == ("Introducing", "incident-1")
    assert introducing.signing == first.signing, "the new authority must not sign before every member trusts it"
    assert introducing.incoming is not None and introducing.incoming.key_id != old_id
    assert introducing.bundle == first.signing.cert_pem + introducing.incoming.cert_pem
    assert introducing.incoming.cert.subject != first.signing.cert.subject  # told apart by name too (" g2")
    both = api.imex_bundle_digest(introducing.bundle)
    half = [_member("node-1", both, old_id), _member("node-2", old_digest, old_id)]
    assert imexauth.rotation_step(introducing, "incident-1", half, NOW) is None
    assert imexauth.rotation_waits_for(introducing, half) == ["node-2"]
    trusted = [_member("node-1", both, old_id), _member("node-2", both, old_id), _member("node-3", ready=False)]
    assert imexauth.rotation_step(introducing, "incident-1", trusted, NOW) == "switch"

    switching = imexauth.advanced(introducing, "switch", "incident-1", "team-a", "train", UID, generation=2)
    assert switching.phase == "Switching" and switching.signing == introducing.incoming
    assert switching.bundle == introducing.incoming.cert_pem + first.signing.cert_pem, "the signing one comes first"
    new_id, digest = switching.signing.key_id, api.imex_bundle_digest(switching.bundle)
    renewing = [_member("node-1", digest, new_id), _member("node-2", digest, old_id)]
    assert imexauth.rotation_step(switching, "incident-1", renewing, NOW) is None
    assert imexauth.rotation_waits_for(switching, renewing) == ["node-2"]
    renewed = [_member("node-1", digest, new_id), _member("node-2", digest, new_id)]
    assert imexauth.rotation_step(switching, "incident-1", renewed, NOW) == "retire"

    done = imexauth.advanced(switching, "retire", "incident-1", "team-a", "train", UID, generation=2)
    assert (done.phase, done.bundle, done.handled) == ("", switching.signing.cert_pem, "incident-1")
    assert imexauth.rotation_step(done, "incident-1", renewed, NOW) is None, "the same request is acted on once"
    assert imexauth.rotation_step(done, "incident-2", renewed, NOW) == "introduce"


def test_an_authority_past_two_thirds_of_its_life_is_replaced_without_being_asked() -> None:
    auth = imexauth.Authorities(imexauth.new_authority("team-a", "train", UID, now=NOW))
    life = imexauth.CA_VALIDITY
    assert imexauth.rotation_step(auth, "", [], NOW + life * 0.6) is None
    assert imexauth.rotation_step(auth, "", [], NOW + life * 0.7) == "introduce"


def test_the_secret_holds_every_step_and_reads_back_as_written() -> None:
    first = imexauth.Authorities(imexauth.new_authority("team-a", "train", UID, now=NOW))
    introducing = imexauth.advanced(first, "introduce", "r1", "team-a", "train", UID, generation=2)
    switching = imexauth.advanced(introducing, "switch", "r1", "team-a", "train", UID, generation=2)
    for auth, keys in ((first, {"tls.crt", "tls.key"}), (introducing, {"tls.crt", "tls.key", "next.crt", "next.key"}),
                       (switching, {"tls.crt", "tls.key", "previous.crt"})):
        data = {k: v for k, v in imexauth.secret_data(auth).items() if v is not None}
        assert set(data) == keys
        secret = imexauth.Secret.from_dict({"metadata": {"name": "s", "annotations": {
            imexauth.HANDLED_ANNOTATION: auth.handled}}, "data": data})
        back = imexauth.authorities_of(secret)
        assert (back.bundle, back.phase, back.handled, back.signing.key_id) == (
            auth.bundle, auth.phase, auth.handled, auth.signing.key_id)


def test_a_node_certificate_names_its_authority_by_key_id() -> None:
    authority = imexauth.new_authority("team-a", "train", UID, now=NOW)
    aki = _node_cert(authority).extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    assert aki.key_identifier is not None and aki.key_identifier.hex() == authority.key_id
