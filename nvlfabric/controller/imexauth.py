"""IMEX credentials of `imexAuthentication: TLS` ComputeDomains: an authority per domain, and node
certificates for its members only.

Why this shape: IMEX trusts whoever completes its handshake, and NVIDIA's driver runs it without
authentication, so any process that reaches a node's IMEX port on the fabric network is a peer. A
TLS domain's daemons instead trust exactly one certificate authority, the domain's own, and the
controller signs a node's certificate for it only while that node is a member.

- The authority: an EC P-256 key and self-signed certificate per domain, kept in the Secret
  `imex-ca-<domain uid>` of the controller's namespace (type kubernetes.io/tls; never a ConfigMap,
  never the tenant's namespace, where the tenant could read it). Its certificate, which is public,
  goes to the domain's `status.imexCABundle` for the members' daemons to trust. The Secret is
  deleted once its domain is gone.
- Node certificates: the agent makes its key on its node (it never leaves it) and asks with a
  CertificateSigningRequest of signer `nvlfabric.io/imex`. The controller approves and signs it
  only when the requester is the agent's service account with a token bound to node N, the
  request names N and exactly the domain's target `<uid>.imex.nvlfabric.io`, the domain wants TLS,
  and N reports membership of it (its agent's report on its Node); else it denies it and says which
  rule failed. A request from a node whose report has not arrived yet waits `MEMBERSHIP_WAIT_S`
  before it is denied (the report and the request are written a moment apart).

Replacing the authority under a running domain (annotation nvlfabric.io/rotate-imex-authority set
to a new value, or the authority past two thirds of its life) goes in three steps, each taken only
once every ready member reports it has followed the one before (`imexTrusts`, `imexIssuer` in its
status entry), so no two members ever stop trusting each other and no link is dropped:
1. introduce: a new authority is made and published after the current one (`status.imexCABundle`
   holds both; the first one still signs). Members load the two-certificate bundle (SIGUSR1).
2. switch: once every member trusts both, the new one signs and the old one follows it in the
   bundle. Members see their certificate is not of the first authority and renew.
3. retire: once every member's certificate is of the new authority, the old one leaves the bundle.
The Secret keeps the state (`next.*` while introducing, `previous.crt` while switching, and the
request value acted on), so a restarted controller goes on where it stopped.

The pass only reads CertificateSigningRequests while some TLS domain exists, so a cluster without
one pays nothing for this.
"""

from __future__ import annotations

import base64
import datetime
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from lightkube import Client, operators
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.certificates_v1 import CertificateSigningRequest
from lightkube.resources.core_v1 import Secret
from lightkube.types import PatchType

from nvlfabric.api import computedomain as api
from nvlfabric.api import errors, names
from nvlfabric.kube.errors import api_call

log = logging.getLogger("nvlfabric.controller.imexauth")

CA_VALIDITY = datetime.timedelta(days=5 * 365)
ROTATE_AFTER = 2 / 3
"""An authority is replaced once two thirds of its life have passed (as node certificates are)."""
HANDLED_ANNOTATION = f"{names.GROUP}/rotation-handled"
"""On the authority Secret: the rotate-imex-authority value the controller last acted on."""
BACKDATE = datetime.timedelta(seconds=60)
"""Certificates start a minute early: a member whose clock runs behind still accepts them."""
MEMBERSHIP_WAIT_S = 15.0
CLEANUP_AFTER_S = 3600.0
"""Answered requests of our signer are deleted after an hour (agents delete theirs once served)."""
ALLOWED_USAGES = frozenset({"digital signature", "key encipherment", "server auth", "client auth"})


def effective(spec: api.ComputeDomainSpec, status: api.ComputeDomainStatus | None,
              default: api.IMEXAuthentication) -> api.IMEXAuthentication | None:
    """What a domain runs with: fixed once recorded in its status; else its spec, else the driver's
    default. None for a clique-scoped domain (its IMEX domain is the clique's, shared)."""
    if spec.imex_mode is not api.IMEXMode.DEDICATED:
        return None
    if status is not None and status.imex_authentication is not None:
        return status.imex_authentication
    return spec.imex_authentication or default


@dataclass(frozen=True)
class Authority:
    cert_pem: str
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @property
    def key_id(self) -> str:
        """The authority's key identifier (hex): what a node certificate it signed names as its issuer."""
        return self.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value.digest.hex()


@dataclass(frozen=True)
class Authorities:
    """A TLS domain's authorities as its Secret keeps them: the one that signs, and during a
    rotation the one coming in (trusted, not yet signing) or the one going out (trusted, no
    longer signing)."""

    signing: Authority
    incoming: Authority | None = None
    retiring_pem: str | None = None
    handled: str = ""
    """The rotate-imex-authority value last acted on."""

    @property
    def bundle(self) -> str:
        """What the members trust, the signing authority first."""
        return self.signing.cert_pem + (self.incoming.cert_pem if self.incoming else "") + (self.retiring_pem or "")

    @property
    def phase(self) -> str:
        return "Introducing" if self.incoming else "Switching" if self.retiring_pem else ""


def rotation_waits_for(auth: Authorities, members: Iterable[api.NodeStatus]) -> list[str]:
    """The ready members the current rotation step waits for (pure; [] outside a rotation). Only
    ready ones count: a joining node loads whatever the bundle is when it prepares."""
    ready = [m for m in members if m.ready]
    if auth.incoming is not None:
        digest = api.imex_bundle_digest(auth.bundle)
        return sorted(m.name for m in ready if m.imex_trusts != digest)
    if auth.retiring_pem is not None:
        return sorted(m.name for m in ready if m.imex_issuer != auth.signing.key_id)
    return []


def rotation_step(auth: Authorities, requested: str, members: Iterable[api.NodeStatus],
                  now: datetime.datetime) -> str | None:
    """The next step of the domain's authority rotation ("introduce", "switch", "retire"), or None
    while there is none to take (pure). `members`: the domain's status entries."""
    if auth.phase:
        if rotation_waits_for(auth, members):
            return None
        return "switch" if auth.incoming is not None else "retire"
    if requested and requested != auth.handled:
        return "introduce"
    start, end = auth.signing.cert.not_valid_before_utc, auth.signing.cert.not_valid_after_utc
    return "introduce" if now >= start + (end - start) * ROTATE_AFTER else None


def new_authority(namespace: str, name: str, uid: str, *, now: datetime.datetime | None = None,
                  generation: int = 1) -> Authority:
    """A self-signed authority for the domain; `generation` > 1 (a replacement) is in its name, so
    the two authorities of a rotation are told apart by name as well as by key identifier."""
    now = now or datetime.datetime.now(datetime.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    suffix = f" g{generation}" if generation > 1 else ""
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "nvlfabric"),
                         x509.NameAttribute(NameOID.COMMON_NAME,
                                            f"IMEX {namespace}/{name} {uid}"[:64 - len(suffix)] + suffix)])
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - BACKDATE)
            .not_valid_after(now + CA_VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return Authority(cert.public_bytes(serialization.Encoding.PEM).decode(), key, cert)


def _authority(data: Mapping[str, str], prefix: str) -> Authority:
    cert_pem = base64.b64decode(data[f"{prefix}.crt"]).decode()
    key = serialization.load_pem_private_key(base64.b64decode(data[f"{prefix}.key"]), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError("the authority's key is not an EC key")
    return Authority(cert_pem, key, x509.load_pem_x509_certificate(cert_pem.encode()))


def authorities_of(secret: Secret) -> Authorities:
    """The domain's authorities as its Secret stores them (the current one, the next during a rotation)."""
    data = secret.data or {}
    annotations = (secret.metadata.annotations if secret.metadata else None) or {}
    return Authorities(_authority(data, "tls"), _authority(data, "next") if "next.crt" in data else None,
                       base64.b64decode(data["previous.crt"]).decode() if "previous.crt" in data else None,
                       annotations.get(HANDLED_ANNOTATION, ""))


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _key_pem(authority: Authority) -> str:
    return authority.key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()).decode()


def secret_data(auth: Authorities) -> dict[str, str | None]:
    """The Secret's data for `auth`, as a merge patch (None: the key goes)."""
    return {"tls.crt": _b64(auth.signing.cert_pem), "tls.key": _b64(_key_pem(auth.signing)),
            "next.crt": _b64(auth.incoming.cert_pem) if auth.incoming else None,
            "next.key": _b64(_key_pem(auth.incoming)) if auth.incoming else None,
            "previous.crt": _b64(auth.retiring_pem) if auth.retiring_pem else None}


def advanced(auth: Authorities, step: str, requested: str, namespace: str, name: str, uid: str,
             generation: int) -> Authorities:
    """`auth` after `step` (pure apart from making a key for "introduce")."""
    if step == "introduce":
        return Authorities(auth.signing, new_authority(namespace, name, uid, generation=generation),
                           None, requested or auth.handled)
    if step == "switch":
        assert auth.incoming is not None
        return Authorities(auth.incoming, None, auth.signing.cert_pem, auth.handled)
    return Authorities(auth.signing, None, None, auth.handled)


class Verdict(Exception):
    """A request that is denied: `reason` (CamelCase) and a message saying the rule."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


class NotYet(Exception):
    """A request that may become valid soon (its node's membership report has not arrived)."""


@dataclass(frozen=True)
class TlsDomain:
    namespace: str
    name: str
    uid: str
    members: frozenset[str]


def check_request(csr: Any, domains: Mapping[str, TlsDomain]) -> tuple[TlsDomain, str, x509.CertificateSigningRequest]:
    """(domain, node, parsed request) of a request this signer may sign, else `Verdict` (deny) or
    `NotYet` (wait). Pure apart from parsing."""
    spec = csr.spec
    if spec.username != names.AGENT_USERNAME:
        raise Verdict("NotTheAgent", f"only the nvlfabric node agent ({names.AGENT_USERNAME}) may ask signer "
                                     f"{names.IMEX_SIGNER}; this request is from {spec.username}")
    node = ((spec.extra or {}).get(names.NODE_NAME_EXTRA) or [""])[0]
    if not node:
        raise Verdict("NoNode", f"the requester's token is not bound to a node ({names.NODE_NAME_EXTRA}); IMEX "
                                "certificates are issued to an agent pod's own node only")
    if not set(spec.usages or []) <= ALLOWED_USAGES:
        raise Verdict("BadUsages", f"usages {sorted(spec.usages or [])} exceed {sorted(ALLOWED_USAGES)}")
    try:
        req = x509.load_pem_x509_csr(base64.b64decode(spec.request) if isinstance(spec.request, str)
                                     else spec.request)
    except ValueError as exc:
        raise Verdict("BadRequest", f"spec.request is not a PEM certificate request: {exc}") from None
    if not req.is_signature_valid:
        raise Verdict("BadRequest", "the request's signature does not verify")
    key = req.public_key()
    if not (isinstance(key, ec.EllipticCurvePublicKey) or (isinstance(key, rsa.RSAPublicKey) and key.key_size >= 2048)):
        raise Verdict("WeakKey", "the key must be EC, or RSA of at least 2048 bits")
    cns = [a.value for a in req.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    if cns != [names.imex_node_subject(node)]:
        raise Verdict("WrongNode", f"the request names {cns}, but the requester's node is {node}: it must name "
                                   f"exactly {names.imex_node_subject(node)!r}")
    try:
        dns = req.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.DNSName)
    except x509.ExtensionNotFound:
        dns = []
    uids = [d.removesuffix(names.IMEX_TARGET_SUFFIX) for d in dns if d.endswith(names.IMEX_TARGET_SUFFIX)]
    if len(dns) != 1 or len(uids) != 1:
        raise Verdict("WrongTarget", f"the request must name exactly one DNS name <domain uid>"
                                     f"{names.IMEX_TARGET_SUFFIX}, it names {dns}")
    domain = domains.get(uids[0])
    if domain is None:
        raise Verdict("NoSuchDomain", f"no ComputeDomain with uid {uids[0]} has imexAuthentication TLS")
    if node not in domain.members:
        raise NotYet(f"node {node} is not (yet) a member of ComputeDomain {domain.namespace}/{domain.name}")
    return domain, node, req


def sign(authority: Authority, req: x509.CertificateSigningRequest, node: str, domain: TlsDomain,
         validity_s: float, *, now: datetime.datetime | None = None) -> str:
    now = now or datetime.datetime.now(datetime.UTC)
    not_after = min(now + datetime.timedelta(seconds=validity_s), authority.cert.not_valid_after_utc)
    key = req.public_key()
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME,
                                                        f"{domain.namespace}/{domain.name}"[:64]),
                                     x509.NameAttribute(NameOID.COMMON_NAME, names.imex_node_subject(node))]))
            .issuer_name(authority.cert.subject).public_key(key)
            .serial_number(x509.random_serial_number()).not_valid_before(now - BACKDATE).not_valid_after(not_after)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(names.imex_target(domain.uid))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=isinstance(key, rsa.RSAPublicKey),
                                         content_commitment=False, data_encipherment=False, key_agreement=False,
                                         key_cert_sign=False, crl_sign=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(authority.key.public_key()),
                           critical=False)
            .sign(authority.key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def _answered(csr: Any) -> bool:
    status = csr.status
    if status is None:
        return False
    return bool(status.certificate) or any(c.type in ("Denied", "Failed") for c in status.conditions or [])


def _age_s(obj: Any, now: datetime.datetime) -> float:
    created = obj.metadata.creationTimestamp if obj.metadata else None
    return (now - created).total_seconds() if isinstance(created, datetime.datetime) else 0.0


class Issuer:
    """The controller's side: authorities per TLS domain, and the signer of node certificates."""

    def __init__(self, client: Client, *, validity_s: float = names.DEFAULT_IMEX_CERT_VALIDITY_S) -> None:
        self.client = client
        self.validity_s = validity_s
        self._authorities: dict[str, Authorities] = {}
        self._secrets: set[str] | None = None
        """Domain uids whose authority Secret exists (read once, then kept as written and deleted)."""

    def _known_secrets(self) -> set[str]:
        if self._secrets is None:
            with api_call(f"list the IMEX authority Secrets in {names.NAMESPACE}"):
                found = self.client.list(Secret, namespace=names.NAMESPACE,
                                         labels={names.COMPUTE_DOMAIN_UID_LABEL: operators.exists()})
                self._secrets = {(s.metadata.labels or {})[names.COMPUTE_DOMAIN_UID_LABEL]
                                 for s in found if s.metadata}
        return self._secrets

    def authorities(self, namespace: str, name: str, uid: str, requested: str = "") -> Authorities:
        """The domain's authorities: from its Secret, made and stored on first use (a rotation
        request the domain already carries then is taken as done: the authority is new)."""
        if uid in self._authorities:
            return self._authorities[uid]
        secret_name = f"{names.IMEX_CA_SECRET_PREFIX}{uid}"
        try:
            with api_call(f"read Secret {names.NAMESPACE}/{secret_name}"):
                auth = authorities_of(self.client.get(Secret, secret_name, namespace=names.NAMESPACE))
        except errors.NotFound:
            auth = Authorities(new_authority(namespace, name, uid), handled=requested)
            data = {k: v for k, v in secret_data(auth).items() if v is not None}
            secret = Secret(
                metadata=ObjectMeta(name=secret_name, namespace=names.NAMESPACE,
                                    labels={names.COMPUTE_DOMAIN_UID_LABEL: uid,
                                            names.PART_OF_LABEL: names.PART_OF},
                                    annotations={f"{names.GROUP}/compute-domain": f"{namespace}/{name}",
                                                 HANDLED_ANNOTATION: requested}),
                type="kubernetes.io/tls", data=data)
            try:
                with api_call(f"create Secret {names.NAMESPACE}/{secret_name}"):
                    self.client.create(secret)
                log.info("ComputeDomain %s/%s: created its IMEX authority (Secret %s/%s)", namespace, name,
                         names.NAMESPACE, secret_name)
            except errors.AlreadyExists:  # another replica won the race: use what it stored
                with api_call(f"read Secret {names.NAMESPACE}/{secret_name}"):
                    auth = authorities_of(self.client.get(Secret, secret_name, namespace=names.NAMESPACE))
        self._authorities[uid] = auth
        self._known_secrets().add(uid)
        return auth

    def rotate(self, namespace: str, name: str, uid: str, requested: str, members: Iterable[api.NodeStatus], *,
               now: datetime.datetime | None = None) -> tuple[Authorities, str | None]:
        """The domain's authorities after the rotation step now due, if any, stored in its Secret
        first (what the members are then told follows what a restarted controller would read);
        and the step taken. No API call when no step is due."""
        now = now or datetime.datetime.now(datetime.UTC)
        auth = self.authorities(namespace, name, uid, requested)
        members = list(members)
        step = rotation_step(auth, requested, members, now)
        if step is None:
            return auth, None
        generation = self._generation(auth)
        new = advanced(auth, step, requested, namespace, name, uid, generation)
        secret_name = f"{names.IMEX_CA_SECRET_PREFIX}{uid}"
        with api_call(f"update Secret {names.NAMESPACE}/{secret_name} (IMEX authority rotation: {step})"):
            self.client.patch(Secret, secret_name, {"metadata": {"annotations": {HANDLED_ANNOTATION: new.handled}},
                                                    "data": secret_data(new)},
                              namespace=names.NAMESPACE, patch_type=PatchType.MERGE)
        self._authorities[uid] = new
        log.info("ComputeDomain %s/%s: IMEX authority rotation: %s (%d ready member(s))", namespace, name,
                 {"introduce": "a new authority is trusted beside the current one",
                  "switch": "the new authority signs; members renew their certificates",
                  "retire": "the old authority is no longer trusted; rotation complete"}[step],
                 sum(1 for m in members if m.ready))
        return new, step

    @staticmethod
    def _generation(auth: Authorities) -> int:
        cn = auth.signing.cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        last = str(cn[0].value).rsplit(" g", 1) if cn else []
        return (int(last[1]) if len(last) == 2 and last[1].isdigit() else 1) + 1

    def collect(self, live: Iterable[str]) -> None:
        """Delete the authorities of domains that are gone (their certificates then chain to nothing)."""
        known = self._known_secrets()
        for uid in sorted(known - set(live)):
            try:
                with api_call(f"delete Secret {names.NAMESPACE}/{names.IMEX_CA_SECRET_PREFIX}{uid}"):
                    self.client.delete(Secret, f"{names.IMEX_CA_SECRET_PREFIX}{uid}", namespace=names.NAMESPACE)
            except errors.NotFound:
                pass
            known.discard(uid)
            self._authorities.pop(uid, None)
            log.info("deleted the IMEX authority of ComputeDomain uid %s (the domain is gone)", uid)

    def serve(self, domains: Mapping[str, TlsDomain], *, now: datetime.datetime | None = None) -> None:
        """Answer the pending requests of signer nvlfabric.io/imex; delete old answered ones."""
        now = now or datetime.datetime.now(datetime.UTC)
        with api_call(f"list CertificateSigningRequests of signer {names.IMEX_SIGNER}"):
            requests = list(self.client.list(CertificateSigningRequest,
                                             fields={"spec.signerName": names.IMEX_SIGNER}))
        for csr in requests:
            name = str(csr.metadata.name if csr.metadata else "")
            try:
                if _answered(csr):
                    if _age_s(csr, now) > CLEANUP_AFTER_S:
                        with api_call(f"delete CertificateSigningRequest {name}"):
                            self.client.delete(CertificateSigningRequest, name)
                    continue
                try:
                    domain, node, req = check_request(csr, domains)
                except NotYet as exc:
                    if _age_s(csr, now) < MEMBERSHIP_WAIT_S:
                        continue
                    raise Verdict("NotADomainMember", f"{exc}; certificates of a domain's authority go to its "
                                                      "members only") from None
                authority = self.authorities(domain.namespace, domain.name, domain.uid).signing
                self._answer(name, "Approved", "DomainMember",
                             f"node {node} is a member of ComputeDomain {domain.namespace}/{domain.name}")
                pem = sign(authority, req, node, domain, self.validity_s, now=now)
                with api_call(f"issue CertificateSigningRequest {name}"):
                    self.client.patch(CertificateSigningRequest.Status, name,
                                      {"status": {"certificate": base64.b64encode(pem.encode()).decode()}},
                                      patch_type=PatchType.MERGE)
                log.info("issued IMEX certificate %s to node %s for ComputeDomain %s/%s", name, node,
                         domain.namespace, domain.name)
            except Verdict as exc:
                log.warning("denied CertificateSigningRequest %s: %s", name, exc)
                try:
                    self._answer(name, "Denied", exc.reason, str(exc))
                except errors.NvlfabricError as failed:
                    log.warning("CertificateSigningRequest %s: %s", name, failed)
            except errors.NvlfabricError as exc:
                log.warning("CertificateSigningRequest %s: %s", name, exc)

    def _answer(self, name: str, kind: str, reason: str, message: str) -> None:
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        with api_call(f"{kind.lower().removesuffix('d')} CertificateSigningRequest {name}"):
            self.client.patch(CertificateSigningRequest.Approval, name, {"status": {"conditions": [
                {"type": kind, "status": "True", "reason": reason, "message": message,
                 "lastUpdateTime": stamp, "lastTransitionTime": stamp}]}}, patch_type=PatchType.MERGE)
