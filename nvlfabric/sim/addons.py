"""Controllers platform teams already run, started by the simulator on request
(`nvlfabric-sim up --addons jobset,lws,kueue`): the real ones (JobSet, LeaderWorkerSet, Kueue), built from their Go
modules by tools/build.py, with their own CRDs, RBAC and webhooks from their modules' kustomize
config (copied beside the binary into the tools cache at build time).

How an addon runs here, as close to its Deployment as a local process gets:
- its CRDs, its ClusterRole and a ServiceAccount of its namespace bound to it; the process runs
  with a TokenRequest token of that ServiceAccount, so its RBAC is the one its manifests grant;
- its webhooks: the webhook configurations of its manifests, pointed at `https://127.0.0.1:<port>`
  (the API server calls a URL, there is no Service network) with the simulator's CA as caBundle,
  and a serving certificate for the Service's DNS name and 127.0.0.1 (nvlfabric/sim/pki.py) in place
  of the certificate rotator a Deployment runs (whose Secret and fixed /tmp directory two
  simulators on one machine would share);
- its log in the state directory's `logs/<addon>.log`; it is up once its readiness endpoint answers.
"""

from __future__ import annotations

import base64
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from lightkube import Client, codecs
from lightkube.config.kubeconfig import KubeConfig
from lightkube.core.exceptions import ApiError
from lightkube.models.authentication_v1 import TokenRequestSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.core_v1 import Namespace, ServiceAccount

from nvlfabric.sim import pki

CRD_ESTABLISHED_S = 30.0


@dataclass(frozen=True)
class Addon:
    name: str
    binary: str
    namespace: str
    prefix: str
    """kustomize's namePrefix of the addon's own install (object names are the manifests' with it)."""
    service_account: str
    service: str
    """The webhook Service's name (its DNS name is what the serving certificate carries)."""
    config_api: str
    """The apiVersion of its manager's Configuration file (they share controller-runtime's shape)."""
    extra_config: dict[str, Any] = field(default_factory=dict)
    """What its Configuration needs beyond that shape."""
    fixed_cert_dir: str | None = None
    """A directory its code reads a certificate from, whatever its configuration says (its
    Deployment mounts a Secret there): given the addon's serving certificate when it has none."""


ADDONS: dict[str, Addon] = {
    "jobset": Addon("jobset", "jobset-manager", "jobset-system", "jobset-", "jobset-controller-manager",
                    "jobset-webhook-service", "config.jobset.x-k8s.io/v1alpha1"),
    "lws": Addon("lws", "lws-manager", "lws-system", "lws-", "lws-controller-manager", "lws-webhook-service",
                 "config.lws.x-k8s.io/v1alpha1"),
    # Kueue manages the kinds BoundJob queues (Jobs and JobSets; LeaderWorkerSet would need its pod
    # integration), only those labelled with a queue; its on-demand visibility API is an aggregated
    # API server, which the simulator's API server has no front proxy for: off.
    "kueue": Addon("kueue", "kueue-manager", "kueue-system", "kueue-", "kueue-controller-manager",
                   "kueue-webhook-service", "config.kueue.x-k8s.io/v1beta1", {
                       "namespace": "kueue-system", "manageJobsWithoutQueueName": False,
                       "integrations": {"frameworks": ["batch/job", "jobset.x-k8s.io/jobset"]},
                       "featureGates": {"VisibilityOnDemand": False}},
                   # Without its certificate rotator Kueue reads its metrics certificate from here, and
                   # exits if it is absent, though metrics are off (cmd/kueue/main.go).
                   fixed_cert_dir="/etc/kueue/metrics/certs"),
}


def parse(value: str) -> tuple[str, ...]:
    """`--addons jobset,...` as names in the order they start (ADDONS': Kueue after the kinds it
    queues, whose CRDs it looks for at start), or a ValueError naming the known ones."""
    names = tuple(dict.fromkeys(a.strip() for a in value.split(",") if a.strip()))
    unknown = [a for a in names if a not in ADDONS]
    if unknown:
        raise ValueError(f"unknown addon(s) {', '.join(unknown)}; known: {', '.join(ADDONS)}")
    return tuple(a for a in ADDONS if a in names)


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def manifests(addon: Addon, config: Path, webhook_port: int, ca_bundle: bytes) -> list[dict[str, Any]]:
    """The addon's objects as its kustomization installs them (prefix, namespace), webhooks by URL."""
    objs = [*(d for f in sorted((config / "crd" / "bases").glob("*.yaml")) for d in _docs(f)),
            *_docs(config / "rbac" / "role.yaml"), *_docs(config / "webhook" / "manifests.yaml")]
    for obj in objs:
        meta = obj["metadata"]
        if obj["kind"] != "CustomResourceDefinition":
            meta["name"] = addon.prefix + meta["name"]
        for hook in obj.get("webhooks") or []:
            path = hook["clientConfig"].pop("service")["path"]
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{webhook_port}{path}",
                                    "caBundle": base64.b64encode(ca_bundle).decode()}
    objs.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                 "metadata": {"name": f"{addon.prefix}manager-rolebinding"},
                 "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                             "name": f"{addon.prefix}manager-role"},
                 "subjects": [{"kind": "ServiceAccount", "name": addon.service_account,
                               "namespace": addon.namespace}]})
    return objs


def install(addon: Addon, client: Client, config: Path, webhook_port: int, ca_bundle: bytes) -> str:
    """Apply the addon's objects; a token of its ServiceAccount."""
    for ns, sa in ((addon.namespace, None), (addon.namespace, addon.service_account)):
        try:
            client.create(ServiceAccount(metadata=ObjectMeta(name=sa, namespace=ns)) if sa
                          else Namespace(metadata=ObjectMeta(name=ns)))
        except ApiError as exc:
            if exc.status.code != 409:
                raise
    objs = manifests(addon, config, webhook_port, ca_bundle)
    for obj in objs:
        client.apply(codecs.from_dict(obj), field_manager="nvlfabric-sim", force=True)
    # The manager maps its kinds at start and exits on one the API server does not serve yet.
    crds = [o["metadata"]["name"] for o in objs if o["kind"] == "CustomResourceDefinition"]
    deadline = time.monotonic() + CRD_ESTABLISHED_S
    while waiting := [n for n in crds if not _established(client.get(CustomResourceDefinition, n))]:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the addon's CRD {waiting[0]} is not Established after {CRD_ESTABLISHED_S:.0f} s")
        time.sleep(0.2)
    req = client.create(ServiceAccount.Token(
        metadata=ObjectMeta(name=addon.service_account, namespace=addon.namespace),
        spec=TokenRequestSpec(audiences=[], expirationSeconds=7 * 24 * 3600)),
        addon.service_account, namespace=addon.namespace)
    assert req.status is not None
    return str(req.status.token)


def _established(crd: CustomResourceDefinition) -> bool:
    return any(c.type == "Established" and c.status == "True"
               for c in (crd.status.conditions if crd.status else None) or [])


def kubeconfig(admin_kubeconfig: Path, token: str, user: str, out: Path) -> None:
    """The admin kubeconfig's cluster, with the addon's token as its user."""
    config = yaml.safe_load(admin_kubeconfig.read_text())
    config["users"] = [{"name": user, "user": {"token": token}}]
    for ctx in config["contexts"]:
        ctx["context"]["user"] = user
    out.write_text(yaml.safe_dump(config, sort_keys=False))
    out.chmod(0o600)


def manager_config(addon: Addon, port: int, health_port: int, cert_dir: Path) -> dict[str, Any]:
    """The addon manager's Configuration for one local process: no leader election, no certificate
    rotator (the serving certificate is the simulator's), webhooks and health on loopback."""
    return {"apiVersion": addon.config_api, "kind": "Configuration", **addon.extra_config,
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "webhook": {"port": port, "host": "127.0.0.1", "certDir": str(cert_dir)},
            "metrics": {"bindAddress": "0"},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"}}


@dataclass(frozen=True)
class Prepared:
    argv: list[str]
    ready_url: str


def prepare(addon: Addon, *, state_dir: Path, client: Client, binary: Path, webhook_port: int,
            health_port: int) -> Prepared:
    """Install the addon and write what its process runs with; its command line and readiness URL."""
    work = state_dir / "addons" / addon.name
    work.mkdir(parents=True, exist_ok=True)
    pki_dir = state_dir / "pki"
    crt, key = pki.webhook_serving(pki_dir, f"{addon.service}.{addon.namespace}.svc", work / "certs")
    if addon.fixed_cert_dir is not None:
        _provide_fixed_cert(Path(addon.fixed_cert_dir), crt, key)
    config = binary.resolve().parent / f"{addon.name}-config"
    token = install(addon, client, config, webhook_port, (pki_dir / "ca.crt").read_bytes())
    kubeconfig(state_dir / "kubeconfig", token, addon.service_account, work / "kubeconfig")
    (work / "config.yaml").write_text(json.dumps(manager_config(addon, webhook_port, health_port, work / "certs")))
    return Prepared([str(binary), f"--kubeconfig={work / 'kubeconfig'}", f"--config={work / 'config.yaml'}",
                     "--zap-log-level=info"], f"http://127.0.0.1:{health_port}/readyz")


def _provide_fixed_cert(where: Path, crt: Path, key: Path) -> None:
    """Put a certificate and key where the addon's code insists on reading them, unless some are
    there (another simulator's: any valid pair serves, nothing is served with it)."""
    if (where / "tls.crt").exists() and (where / "tls.key").exists():
        return
    try:
        where.mkdir(parents=True, exist_ok=True)
        (where / "tls.crt").write_bytes(crt.read_bytes())
        (where / "tls.key").write_bytes(key.read_bytes())
        (where / "tls.key").chmod(0o600)
    except OSError as exc:
        raise RuntimeError(f"the addon reads a certificate from {where}, which its Deployment mounts and this "
                           f"machine lacks, and it cannot be written here ({exc}); create it (tls.crt, tls.key: any "
                           "valid pair) or run the simulator as root") from exc


def admin_client(kubeconfig_path: Path) -> Client:
    return Client(config=KubeConfig.from_file(str(kubeconfig_path)), field_manager="nvlfabric-sim")
