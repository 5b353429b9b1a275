"""The `nvidia` backend of the ComputeDomain provider: NVIDIA's ComputeDomain (`resource.nvidia.com/v1beta1`).

`ComputeDomainProvider` (nvlfabric/provider/computedomain.py) sends here every call whose inputs
(or state) say `backend: nvidia` (the seam: nvlfabric/provider/backend.py; this module never
imports nvlfabric's backend, nvlfabric/provider/nvlfabricdomain.py). The Pulumi behaviour is the
same as on nvlfabric's backend; what differs is whose object it is:

- `check` validates with `NvidiaArgs`, whose spec (`nvlfabric.api.nvidia.NvidiaDomainSpec`) refuses
  what means nothing to NVIDIA's driver (`spec.imexMode`, `spec.placement`), naming the field.
- `diff`: NVIDIA's CRD makes the whole spec immutable (CEL "A computeDomain.spec is immutable"), so
  any spec change is a replace, named by the field (`spec.numNodes`); labels and the provider
  settings are updates. A replace deletes first when it reuses the domain's or its claim
  template's name.
- `create` posts NVIDIA's ComputeDomain with strict field validation, then awaits; a failed await
  deletes it again (rollback). `adopt` takes over an existing one whose spec already matches (it
  cannot be changed), and then only sets its labels.
- Awaiting (`await_.NVIDIA_READINESS`): `Accepted` is NVIDIA's CRD established, the domain there
  and the workload ResourceClaimTemplate that NVIDIA's controller makes from
  `spec.channel.resourceClaimTemplate.name` (without its controller nothing would ever serve the
  domain, so that is said at `up` rather than by pods stuck later); `Ready` is `status.status:
  Ready` with at least `numNodes` IMEX daemons in `status.nodes`. A domain that NVIDIA's
  controller has not taken (its finalizer) within CONTROLLER_GRACE_S, in a cluster where no
  Deployment of that controller has a replica available, fails the await at once, naming it.
- `read` rebuilds the inputs from the live object (drift shows on refresh); a deleted domain
  reads as gone.
- `delete` refuses while pods whose claims come from the template run (unless `force_delete`),
  as on nvlfabric's backend, then deletes the domain and waits until it is gone (NVIDIA's
  controller removes its finalizer once it has deleted the domain's daemons and templates; the
  timeout message names the finalizer if it does not) and then until its IMEX daemon pods are
  gone too, so a destroy that uninstalls NVIDIA's driver after its domains does not strand them.

The outputs are the same keys as nvlfabric's: `claim_name` is the template's name, `channel` is
always 0 (NVIDIA's driver gives every domain channel 0), `clique` the one clique of its daemons.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Final, Literal

from lightkube import ALL_NS, ApiError, Client
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import ResourceClaimTemplate
from lightkube.types import PatchType
from pulumi.dynamic import CheckResult, CreateResult, DiffResult, ReadResult, UpdateResult
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nvlfabric.api import errors as api_errors
from nvlfabric.api import nvidia as nv
from nvlfabric.api.nvidia import Backend, NvidiaDomainSpec
from nvlfabric.kube import errors as kube_errors
from nvlfabric.provider import await_, domainclient, domaininputs, errors
from nvlfabric.provider.await_ import AwaitFor, Snapshot
from nvlfabric.provider.backend import Context
from nvlfabric.provider.domainclient import Created, get, meta, read_crd, roll_back, send
from nvlfabric.provider.domaininputs import (
    DEFAULT_TIMEOUT_S,
    SETTINGS,
    DomainName,
    Namespace,
    TimeoutS,
    contains_unknown,
    is_unknown,
    split_id,
)
from nvlfabric.provider.domainusers import wait_out_departing_users

NVIDIA_CD: Final = create_namespaced_resource(nv.GROUP, nv.VERSION, nv.KIND, nv.PLURAL)
NVIDIA_FINALIZER: Final = "resource.nvidia.com/computeDomain"
"""What NVIDIA's controller puts on a ComputeDomain at its first reconcile: the sign it runs."""
CONTROLLER_CONTAINER: Final = "compute-domain"
"""The container of NVIDIA's controller Deployment (`<chart>-controller`), whatever the release name."""
CONTROLLER_GRACE_S: Final = 10.0
"""How long a new domain may go without NVIDIA's finalizer before its controller is looked for."""
CONTROLLER_HINT: Final = ("NVIDIA's compute-domain controller makes the ResourceClaimTemplate: is NVIDIA's DRA "
                          "driver installed with resources.computeDomains.enabled=true, and its controller running?")


class NvidiaArgs(BaseModel):
    """The inputs of a ComputeDomain resource on the nvidia backend."""

    model_config = ConfigDict(extra="forbid")

    name: DomainName
    namespace: Namespace = "default"
    backend: Literal[Backend.NVIDIA]
    spec: NvidiaDomainSpec = Field(default_factory=NvidiaDomainSpec)
    labels: dict[str, str] = Field(default_factory=dict)
    await_for: AwaitFor = AwaitFor.ACCEPTED
    timeout_s: TimeoutS = DEFAULT_TIMEOUT_S
    adopt: bool = False
    force_delete: bool = False

    def to_inputs(self) -> dict[str, Any]:
        return {"name": self.name, "namespace": self.namespace, "backend": self.backend.value,
                "spec": self.spec.dump(), "labels": dict(self.labels), "await_for": self.await_for.value,
                "timeout_s": self.timeout_s, "adopt": self.adopt, "force_delete": self.force_delete}


ALLOWED: Final[domaininputs.Allowed] = {
    "": list(NvidiaArgs.model_fields),
    "spec": ["numNodes", "channelAllocationMode", "channelClaim"],
    "spec.channelClaim": ["name"],
}


def check_inputs(news: Mapping[str, Any]) -> CheckResult:
    """Validate and normalise nvidia inputs (see `domaininputs.check`)."""
    return domaininputs.check(news, NvidiaArgs.model_validate, ALLOWED)


def _normal_spec(raw: Any) -> dict[str, Any]:
    try:
        return NvidiaDomainSpec.model_validate(raw or {}).dump()
    except ValidationError:
        return dict(raw) if isinstance(raw, Mapping) else {}


def _template_name(name: str, spec: Mapping[str, Any]) -> str:
    return NvidiaDomainSpec.model_validate(spec).template_name(name)


def _template_of(props: Mapping[str, Any]) -> str | None:
    return domaininputs.claim_name_of(props, _template_name)


def compute_diff(olds: Mapping[str, Any], news: Mapping[str, Any]) -> DiffResult:
    """Like nvlfabric's, but every spec field is a replace (NVIDIA's spec is immutable)."""
    replaces = domaininputs.renamed(olds, news)
    new_raw = news.get("spec")
    if is_unknown(new_raw):
        replaces.append("spec")
    else:
        old, new = _normal_spec(olds.get("spec")), (new_raw or {})
        # (unknown values stay as they are, and count as changed)
        new = _normal_spec({k: v for k, v in new.items() if not contains_unknown(v)}) | {
            k: v for k, v in new.items() if contains_unknown(v)}
        replaces += [f"spec.{k}" for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    if not replaces:
        return DiffResult(changes=domaininputs.labels_or_settings_changed(olds, news))
    return DiffResult(changes=True, replaces=replaces,
                      delete_before_replace=domaininputs.reuses_a_name(olds, news, _template_name))


def outputs(obj: Mapping[str, Any], settings: Mapping[str, Any]) -> dict[str, Any]:
    """The resource's outputs from NVIDIA's live ComputeDomain (the same keys as nvlfabric's)."""
    meta = obj.get("metadata") or {}
    name = str(meta.get("name"))
    spec = nv.spec_of(name, obj.get("spec") or {})
    status = nv.DomainStatus.model_validate(obj.get("status") or {})
    nodes = [{"name": n.name, "ready": n.status == nv.READY} for n in status.nodes]
    cliques = {n.clique_id for n in status.nodes if n.clique_id}
    ready = status.status == nv.READY and bool(obj.get("status"))
    return {
        "name": name, "namespace": meta.get("namespace"), "backend": Backend.NVIDIA.value, "spec": spec.dump(),
        "labels": dict(meta.get("labels") or {}),
        **{k: settings.get(k, d) for k, d in SETTINGS.items()},
        "uid": meta.get("uid"), "claim_name": spec.template_name(name),
        # NVIDIA's two states in nvlfabric's phases: Ready, else Pending until a daemon joins.
        "phase": "Ready" if ready else "Allocating" if nodes else "Pending",
        "clique": next(iter(cliques)) if len(cliques) == 1 else None,
        "channel": 0, "nodes": nodes, "ready_nodes": sum(1 for n in nodes if n["ready"]), "total_nodes": len(nodes),
        "claim_drift": None,
    }


def _parse(props: Mapping[str, Any]) -> NvidiaArgs:
    return domaininputs.parse(domaininputs.user_props(props), NvidiaArgs.model_validate, ALLOWED)


def _snapshot(client: Client | None, ns: str, name: str, template: str) -> Snapshot:
    base = Snapshot(namespace=ns, name=name, claim_name=template, crd_name=nv.CRD_NAME,
                    crd_hint="install NVIDIA's DRA driver (its chart's CRDs) first, or use backend 'nvlfabric'",
                    claim_kind="ResourceClaimTemplate")
    if client is None:
        return base
    crd, readable = read_crd(client, nv.CRD_NAME)
    return dataclasses.replace(base, crd=crd, crd_readable=readable, cd=get(client, NVIDIA_CD, name, ns),
                               claim=get(client, ResourceClaimTemplate, template, ns))


def controller_state(deployments: list[dict[str, Any]]) -> str | None:
    """Why NVIDIA's compute-domain controller cannot be running, from the cluster's Deployments
    (pure); None when a Deployment of it has a replica available."""
    ours = [d for d in deployments if any(c.get("name") == CONTROLLER_CONTAINER for c in (
        ((d.get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers") or [])]
    if not ours:
        return (f"no Deployment in the cluster runs NVIDIA's compute-domain controller (a container named "
                f"{CONTROLLER_CONTAINER}): install NVIDIA's DRA driver with resources.computeDomains.enabled=true, "
                "or use backend 'nvlfabric'")
    if any(((d.get("status") or {}).get("availableReplicas") or 0) > 0 for d in ours):
        return None
    d = ours[0]
    meta, want = d.get("metadata") or {}, (d.get("spec") or {}).get("replicas", 1)
    return (f"its Deployment {meta.get('namespace')}/{meta.get('name')} has 0 of {want} replicas available "
            f"(kubectl -n {meta.get('namespace')} describe deployment {meta.get('name')})")


def controller_taken(client: Client, deadline: await_.Deadline, grace_s: float) -> await_.Condition[Snapshot]:
    """NVIDIA's controller has taken the domain (its finalizer, or the template it makes). Past
    `grace_s` without either, its Deployment is looked for once: none, or none available, ends
    the wait at once, saying so, instead of at the timeout (600 s by default)."""
    looked: list[str | None] = []

    def check(s: Snapshot) -> await_.Seen:
        if s.cd is None or s.claim is not None or NVIDIA_FINALIZER in ((s.cd.get("metadata") or {}).get(
                "finalizers") or []):
            return await_.Seen(True, "NVIDIA's controller took the domain")
        waited = deadline.timeout_s - deadline.remaining()
        seen = f"NVIDIA's compute-domain controller has not taken {s.cd_ref} (no finalizer {NVIDIA_FINALIZER})"
        if waited < grace_s:
            return await_.Seen(False, seen)
        if not looked:
            try:
                listed = client.list(Deployment, namespace="*")
                looked.append(controller_state([d.to_dict() for d in listed]))
            except (ApiError, api_errors.NvlfabricError):  # no right to list Deployments: wait as before
                looked.append(None)
        if looked[0] is None:
            return await_.Seen(False, seen)
        return await_.Seen(False, f"{seen} after {waited:.0f} s: {looked[0]}", fatal=True)

    return await_.Condition("NVIDIA's controller took the domain", check)


def _await(ctx: Context, client: Client, args: NvidiaArgs, deadline: await_.Deadline) -> dict[str, Any]:
    template = args.spec.template_name(args.name)
    snap = _snapshot(None, args.namespace, args.name, template)
    levels = await_.NVIDIA_READINESS[args.await_for]
    if not levels:
        live = get(client, NVIDIA_CD, args.name, args.namespace)
        return dict(live or {})
    taken = controller_taken(client, deadline, ctx.controller_grace_s)
    at = levels.index(await_.CD_EXISTS) + 1
    seen = ctx.wait(
        awaited=await_.awaited(snap, args.await_for),
        observe=lambda: _snapshot(client, args.namespace, args.name, template),
        condition=await_.all_of(*levels[:at], taken, *levels[at:]), deadline=deadline,
        hint=CONTROLLER_HINT if args.await_for is AwaitFor.ACCEPTED else
        "raise timeout_s, or set await_for='Accepted' to not wait for the domain's IMEX daemons")
    assert seen.cd is not None  # the condition requires it
    return dict(seen.cd)


def create(ctx: Context, props: dict[str, Any]) -> CreateResult:
    args = _parse(props)
    ns, name = args.namespace, args.name
    ref = f"NVIDIA ComputeDomain {ns}/{name}"
    deadline = ctx.deadline(args.timeout_s)
    client = ctx.client()
    body = nv.domain_object(name, ns, args.labels, args.spec)
    created: Created = []
    try:
        try:
            ctx.retrying(deadline, f"create {ref}",
                         lambda: dict(send(client, "post", NVIDIA_CD, NVIDIA_CD.from_dict(body), namespace=ns)))
        except api_errors.NotFound as exc:
            raise api_errors.NotFound(
                action=exc.action, code=exc.code, reason=exc.reason, message=exc.message,
                hint=f"is NVIDIA's DRA driver installed (its CRD {nv.CRD_NAME}), and does namespace {ns} exist? "
                     "Without it use backend 'nvlfabric'") from exc
        except api_errors.AlreadyExists:
            _adopt(client, args, ref)
        else:
            created.append(("ComputeDomain", NVIDIA_CD, name))
        live = _await(ctx, client, args, deadline)
    except Exception as exc:
        roll_back(client, ns, created, exc)
        raise
    return CreateResult(f"{ns}/{name}", outputs(live, args.to_inputs()))


def _adopt(client: Client, args: NvidiaArgs, ref: str) -> None:
    """Take over an existing domain (adopt=True) whose spec is already the declared one: NVIDIA's
    spec cannot change, so a different one is refused, naming the fields."""
    ns, name = args.namespace, args.name
    if not args.adopt:
        raise errors.ObjectExists(
            f"{ref} already exists and this stack did not create it. To manage it from this program set "
            "adopt=True (its spec must already match: NVIDIA's spec is immutable; its labels are then set); or "
            f"delete it first (kubectl delete computedomains.resource.nvidia.com -n {ns} {name}); or choose "
            "another name")
    live = get(client, NVIDIA_CD, name, ns) or {}
    have = nv.spec_of(name, live.get("spec") or {}).dump()
    want = args.spec.dump()
    differ = [f"spec.{k} (live {have.get(k)!r}, declared {want.get(k)!r})" for k in sorted(set(have) | set(want))
              if have.get(k) != want.get(k)]
    if differ:
        raise errors.ObjectExists(
            f"{ref} exists with another spec: {', '.join(differ)}. NVIDIA's ComputeDomain spec is immutable, so "
            "it cannot be adopted as declared: declare its spec as it is, or delete it and let `pulumi up` make it")
    with kube_errors.api_call(f"adopt {ref} (set its labels)"):
        send(client, "patch", NVIDIA_CD, {"metadata": {"labels": args.labels}}, name=name, namespace=ns,
             headers={"Content-Type": PatchType.MERGE.value})


def read(ctx: Context, id_: str, props: dict[str, Any]) -> ReadResult:
    ns, name = split_id(id_, props)
    live = get(ctx.client(), NVIDIA_CD, name, ns)
    if live is None:
        return ReadResult(None, {})
    outs = outputs(live, props)
    return ReadResult(f"{ns}/{name}", outs, {k: outs[k] for k in NvidiaArgs.model_fields})


def update(ctx: Context, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
    """Labels and settings only: every spec change is a replace (see `compute_diff`)."""
    args = _parse(news)
    deadline = ctx.deadline(args.timeout_s)
    client = ctx.client()
    dropped = {k: None for k in (olds.get("labels") or {}) if k not in args.labels}
    with kube_errors.api_call(f"update NVIDIA ComputeDomain {args.namespace}/{args.name}"):
        send(client, "patch", NVIDIA_CD, {"metadata": {"labels": {**dropped, **args.labels}}}, name=args.name,
             namespace=args.namespace, headers={"Content-Type": PatchType.MERGE.value})
    return UpdateResult(outputs(_await(ctx, client, args, deadline), args.to_inputs()))


def delete(ctx: Context, id_: str, props: dict[str, Any]) -> None:
    ns, name = split_id(id_, props)
    deadline = ctx.deadline(float(props.get("timeout_s") or DEFAULT_TIMEOUT_S))
    client = ctx.client()
    template = str(props.get("claim_name") or _template_of(props) or f"{name}-channel")
    snap = _snapshot(None, ns, name, template)
    if not props.get("force_delete"):
        wait_out_departing_users(ctx, client, snap, deadline)
    uid = str(meta(get(client, NVIDIA_CD, name, ns)).get("uid") or "")
    domainclient.delete(client, NVIDIA_CD, name, ns, action=f"delete NVIDIA {snap.cd_ref}")

    def gone(s: Snapshot) -> await_.Seen:
        return await_.Seen(s.cd is None, await_.still_there(s.cd_ref, s.cd) if s.cd is not None else "gone")

    ctx.wait(awaited=f"NVIDIA {snap.cd_ref} to be deleted",
             observe=lambda: dataclasses.replace(snap, cd=get(client, NVIDIA_CD, name, ns)),
             condition=await_.Condition("deleted", gone), deadline=deadline)
    if uid:
        _wait_out_daemons(ctx, client, snap.cd_ref, uid, deadline)


def _daemon_pods(client: Client, uid: str) -> list[str] | None:
    """'namespace/name' of the domain's IMEX daemon pods (NVIDIA's label, value the domain's uid);
    None when these credentials may not list pods in every namespace."""
    try:
        with kube_errors.api_call("list NVIDIA's IMEX daemon pods"):
            pods = client.list(Pod, namespace=ALL_NS, labels={nv.DOMAIN_LABEL: uid})
            return [f"{p.metadata.namespace}/{p.metadata.name}" for p in pods if p.metadata is not None]
    except api_errors.Forbidden:
        return None


def _wait_out_daemons(ctx: Context, client: Client, cd_ref: str, uid: str, deadline: await_.Deadline) -> None:
    """Wait until the domain's IMEX daemon pods are gone, not only the domain: NVIDIA's controller
    drops its finalizer once it has deleted their DaemonSet, while the pods still stop and their
    claims are still to be unprepared by NVIDIA's kubelet plugin. Driver and domains are often
    destroyed together: deleted before they are gone, the plugin leaves them Terminating for good
    (the kubelet: "DRA driver compute-domain.nvidia.com is not registered")."""
    def gone(pods: list[str] | None) -> await_.Seen:
        if not pods:
            return await_.Seen(True, "gone")
        named = ", ".join(pods[:3]) + (f" and {len(pods) - 3} more" if len(pods) > 3 else "")
        return await_.Seen(False, f"{len(pods)} IMEX daemon pod(s) still stopping: {named}")

    ctx.wait(awaited=f"the IMEX daemons of NVIDIA {cd_ref} to stop", observe=lambda: _daemon_pods(client, uid),
             condition=await_.Condition("daemons gone", gone), deadline=deadline,
             hint="NVIDIA's kubelet plugin unprepares their claims: keep NVIDIA's driver installed until they are gone")
