"""The `nvlfabric` backend of the ComputeDomain provider: nvlfabric's own ComputeDomain (`nvlfabric.io/v1alpha1`)
and its shared channel claims.

`ComputeDomainProvider` (nvlfabric/provider/computedomain.py, whose module docstring is the
contract, method by method) hands here every call whose inputs (or state) say `backend:
nvlfabric` (or name no backend). This module holds:

- the inputs (`NvlfabricArgs`, whose `spec` is the API's own `ComputeDomainSpec`), their
  check and their field-level diff (`immutable_changes` are replaces);
- the objects: the channel claim (`channel_claim`, its opaque `channel_config`) and the
  resource's outputs from the live domain (`outputs`, `claim_drift`);
- create, read, update and delete, with their steps (the domain, its claims, the await).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Final, Literal

from lightkube import Client
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.resource_v1 import ResourceClaim
from lightkube.types import PatchType
from pulumi.dynamic import CheckResult, CreateResult, DiffResult, ReadResult, UpdateResult
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nvlfabric.api import claimhold, names
from nvlfabric.api import computedomain as api
from nvlfabric.api import errors as api_errors
from nvlfabric.api.channelconfig import ChannelConfig, ComputeDomainRef
from nvlfabric.api.computedomain import ComputeDomainSpec, channel_claim_names, immutable_changes
from nvlfabric.api.names import CLIQUE_GROUPS_ANNOTATION, COMPUTE_DOMAIN_LABEL, DEVICE_CLASS, DRIVER
from nvlfabric.api.nvidia import Backend
from nvlfabric.kube import errors as kube_errors
from nvlfabric.provider import await_, domainclient, domaininputs, errors, host
from nvlfabric.provider.await_ import AwaitFor, Deadline, Snapshot
from nvlfabric.provider.backend import Context
from nvlfabric.provider.domainclient import Created, get, meta, read_crd, roll_back, send
from nvlfabric.provider.domaininputs import (
    DEFAULT_TIMEOUT_S,
    SETTINGS,
    DomainName,
    Namespace,
    TimeoutS,
    is_unknown,
    split_id,
    user_props,
)
from nvlfabric.provider.domainusers import MAX_NAMED_PODS, claim_users, pods_in, wait_out_departing_users

CD: Final = create_namespaced_resource(names.GROUP, api.VERSION, api.KIND, api.PLURAL)
#: The name of the claim's one device request.
CHANNEL_REQUEST: Final = "channel"


class NvlfabricArgs(BaseModel):
    """The inputs of a ComputeDomain resource on the nvlfabric backend."""

    model_config = ConfigDict(extra="forbid")

    name: DomainName = Field(description="The ComputeDomain's name: a DNS label (its claim and labels derive from "
                                         "it).")
    namespace: Namespace = Field("default", description="The namespace of the ComputeDomain, its claim and its pods.")
    backend: Literal[Backend.NVLFABRIC] = Field(Backend.NVLFABRIC, description="nvlfabric's own ComputeDomain.")
    spec: ComputeDomainSpec = Field(default_factory=ComputeDomainSpec, description="The desired ComputeDomain.")
    labels: dict[str, str] = Field(default_factory=dict, description="Labels of the ComputeDomain.")
    await_for: AwaitFor = Field(AwaitFor.ACCEPTED, description="What create and update wait for.")
    timeout_s: TimeoutS = Field(DEFAULT_TIMEOUT_S, description="Seconds a create, update or delete may take.")
    adopt: bool = Field(False, description="Take over an existing ComputeDomain of this name.")
    force_delete: bool = Field(False, description="Delete even while pods use the channel claim.")

    def to_inputs(self) -> dict[str, Any]:
        """The normalised inputs (API names, defaults filled, no nulls)."""
        return {
            "name": self.name, "namespace": self.namespace, "backend": self.backend.value, "spec": dump_spec(self.spec),
            "labels": dict(self.labels),
            "await_for": self.await_for.value, "timeout_s": self.timeout_s, "adopt": self.adopt,
            "force_delete": self.force_delete,
        }


INPUT_KEYS: Final = tuple(NvlfabricArgs.model_fields)
ALLOWED: Final[domaininputs.Allowed] = {
    "": list(NvlfabricArgs.model_fields),
    "spec": [f.alias or n for n, f in ComputeDomainSpec.model_fields.items()],
    "spec.placement": list(api.Placement.model_fields),
    "spec.channelClaim": list(api.ChannelClaim.model_fields),
}


def dump_spec(spec: ComputeDomainSpec) -> dict[str, Any]:
    """The spec as the API (and the state) spell it: aliases, no nulls."""
    return spec.model_dump(mode="json", by_alias=True, exclude_none=True)


def _parse(props: Mapping[str, Any]) -> NvlfabricArgs:
    return domaininputs.parse(props, NvlfabricArgs.model_validate, ALLOWED)


# -- check and diff ----------------------------------------------------------------------------------


def check_inputs(news: Mapping[str, Any]) -> CheckResult:
    """Validate and normalise nvlfabric inputs (see `domaininputs.check`)."""
    return domaininputs.check(news, NvlfabricArgs.model_validate, ALLOWED)


def _normal_spec(raw: Any) -> dict[str, Any]:
    """The spec with defaults filled; as given when it does not validate (check already reported it)."""
    try:
        return dump_spec(ComputeDomainSpec.model_validate(raw or {}))
    except ValidationError:
        return dict(raw) if isinstance(raw, Mapping) else {}


def _spec_diff(old_raw: Any, new_raw: Any) -> tuple[list[str], bool]:
    """(the immutable spec fields that change, as replace paths; whether the spec changes at all)."""
    if is_unknown(new_raw):
        return [f"spec.{f}" for f in api.IMMUTABLE_FIELDS], True
    new_raw = new_raw or {}
    unknown = {k for k, v in new_raw.items() if domaininputs.contains_unknown(v)}
    old = _normal_spec(old_raw)
    # Unknown fields are left out of the normalisation (they could make the whole spec invalid,
    # and then the comparison falls back to the values as given).
    new = _normal_spec({k: v for k, v in new_raw.items() if k not in unknown})
    known_old = {k: v for k, v in old.items() if k not in unknown}
    known_new = {k: v for k, v in new.items() if k not in unknown}
    try:
        changed_fixed = immutable_changes(ComputeDomainSpec.model_validate(known_old),
                                          ComputeDomainSpec.model_validate(known_new))
    except ValidationError:
        changed_fixed = [f for f in api.IMMUTABLE_FIELDS if known_old.get(f) != known_new.get(f)]
    replaces = [f"spec.{f}" for f in api.IMMUTABLE_FIELDS if f in unknown or f in changed_fixed]
    return replaces, bool(replaces or unknown or known_old != known_new)


def _first_claim(name: str, spec: Mapping[str, Any]) -> str:
    return channel_claim_names(name, ComputeDomainSpec.model_validate(spec))[0]


def compute_diff(olds: Mapping[str, Any], news: Mapping[str, Any]) -> DiffResult:
    """The diff between the state (`olds`: outputs, which hold the inputs too) and checked inputs."""
    replaces = domaininputs.renamed(olds, news)
    spec_replaces, spec_changed = _spec_diff(olds.get("spec"), news.get("spec"))
    replaces += spec_replaces
    # A claim deleted out of band (found by a refresh): the update makes it anew, or says why not.
    drifted = bool(olds.get("claim_drift"))
    if not (replaces or spec_changed or domaininputs.labels_or_settings_changed(olds, news) or drifted):
        return DiffResult(changes=False)
    if not replaces:
        return DiffResult(changes=True)
    return DiffResult(changes=True, replaces=replaces,
                      delete_before_replace=domaininputs.reuses_a_name(olds, news, _first_claim))


# -- the objects -------------------------------------------------------------------------------------


def channel_config(cd_name: str, namespace: str, uid: str, spec: ComputeDomainSpec) -> dict[str, Any]:
    """The opaque config of the channel claim, for the driver `channel.nvlfabric.io` (the one schema
    is nvlfabric/api/channelconfig.py, which the node agent decodes strictly)."""
    return ChannelConfig(compute_domain=ComputeDomainRef(name=cd_name, namespace=namespace, uid=uid),
                         imex_mode=spec.imex_mode, channel_allocation_mode=spec.channel_allocation_mode).to_kube()


def channel_claim(cd_name: str, namespace: str, uid: str, spec: ComputeDomainSpec, group: int = 0) -> dict[str, Any]:
    """The CD's shared channel ResourceClaim (a MultiClique CD's claim of clique group `group`):
    one channel device, owned by the CD.

    The owner reference is a controller reference without `blockOwnerDeletion` (deletes here are
    background ones, and setting it needs update rights on the CD's finalizers where the
    OwnerReferencesPermissionEnforcement admission plugin runs). A MultiClique CD's claims say
    how many they are (`nvlfabric.io/clique-groups`), so the controller places them together.
    """
    multi = spec.groups > 1
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": channel_claim_names(cd_name, spec)[group],
            "namespace": namespace,
            "labels": {COMPUTE_DOMAIN_LABEL: cd_name},
            **({"annotations": {CLIQUE_GROUPS_ANNOTATION: str(spec.groups)}} if multi else {}),
            "ownerReferences": [{"apiVersion": api.API_VERSION, "kind": api.KIND, "name": cd_name, "uid": uid,
                                 "controller": True}],
        },
        "spec": {"devices": {
            "requests": [{"name": CHANNEL_REQUEST, "exactly": {
                "deviceClassName": DEVICE_CLASS, "allocationMode": "ExactCount", "count": 1,
                **({"selectors": [{"cel": {"expression": names.pinned_clique_selector(spec.placement.clique)}}]}
                   if spec.placement.clique else {})}}],
            "config": [{"requests": [CHANNEL_REQUEST], "opaque": {
                "driver": DRIVER, "parameters": channel_config(cd_name, namespace, uid, spec)}}],
        }},
    }


def owned_by(claim: Mapping[str, Any], uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in meta(claim).get("ownerReferences") or [])


def outputs(cd: Mapping[str, Any], settings: Mapping[str, Any]) -> dict[str, Any]:
    """The resource's outputs from the live CD (`settings`: await_for, timeout_s, adopt, force_delete)."""
    md, status = meta(cd), cd.get("status") or {}
    spec = ComputeDomainSpec.model_validate(cd.get("spec") or {})
    nodes = [{"name": n.get("name"), "ready": n.get("ready") is True} for n in status.get("nodes") or []]
    ready = status.get("readyNodes")
    total = status.get("totalNodes")
    return {
        "name": md.get("name"),
        "namespace": md.get("namespace"),
        "backend": Backend.NVLFABRIC.value,
        "spec": dump_spec(spec),
        "labels": dict(md.get("labels") or {}),
        **{k: settings.get(k, d) for k, d in SETTINGS.items()},
        "uid": md.get("uid"),
        "claim_name": channel_claim_names(str(md.get("name")), spec)[0],
        # An absent phase means Pending (see api.Phase).
        "phase": status.get("phase") or api.Phase.PENDING.value,
        "clique": status.get("clique"),
        "channel": status.get("channel"),
        "nodes": nodes,
        "ready_nodes": ready if ready is not None else sum(1 for n in nodes if n["ready"]),
        "total_nodes": total if total is not None else len(nodes),
        # Set by a read (refresh): a channel claim deleted outside the stack (see claim_drift).
        "claim_drift": None,
    }


def claim_drift(client: Client, cd: Mapping[str, Any]) -> str | None:
    """What happened to the domain's channel claims behind this stack's back, or None: a claim
    missing (`pulumi up` makes it anew), or marked for deletion while pods still hold it (the
    domain loses it when they stop; new pods of the domain cannot start). A read (refresh)
    reports it as the output `claim_drift`, so `refresh --diff` shows it and `up` acts on it."""
    md = meta(cd)
    ns, name = str(md.get("namespace")), str(md.get("name"))
    for claim_name in channel_claim_names(name, ComputeDomainSpec.model_validate(cd.get("spec") or {})):
        claim = get(client, ResourceClaim, claim_name, ns)
        ref = f"ResourceClaim {ns}/{claim_name}"
        if claim is None:
            return f"{ref}, the channel claim of ComputeDomain {ns}/{name}, was deleted outside this stack: " \
                   "`pulumi up` creates it anew"
        if meta(claim).get("deletionTimestamp"):
            users = claim_users(claim, pods_in(client, ns), claim_name)
            return (f"{ref}, the channel claim of ComputeDomain {ns}/{name}, was deleted outside this stack and "
                    f"is held by {len(users)} pods until they stop ({', '.join(users[:MAX_NAMED_PODS])}); new "
                    "pods of the domain cannot start, and no claim of that name can be made until then: let them "
                    "finish (or delete the workload), then run `pulumi up` to create it anew")
    return None


def _release_hold(client: Client, claim_name: str, ns: str) -> None:
    """Take the domain's hold off its claim, now being deleted (claimhold.hold_consumer), so that the
    claim is deallocated and goes without waiting for the controller to do the same. Best effort:
    a claim already gone, changed meanwhile or not ours to patch is left to the controller."""
    claim = get(client, ResourceClaim, claim_name, ns)
    patch = claimhold.release_hold_patch(dict(claim)) if claim is not None else None
    if patch is None:
        return
    try:
        with kube_errors.api_call(f"release the hold on ResourceClaim {ns}/{claim_name}"):
            client.patch(ResourceClaim.Status, claim_name, patch, namespace=ns, patch_type=PatchType.JSON)
    except api_errors.ApiStatusError as exc:
        host.progress(f"{exc}; the controller releases it")


# -- create, read, update, delete --------------------------------------------------------------------


def create(ctx: Context, props: dict[str, Any]) -> CreateResult:
    # The spec goes to the API server as given (it judges it, strictly); the rest is ours to parse.
    spec = user_props(props).get("spec") or {}
    settings = _parse({**user_props(props), "spec": {}})
    ns, name = settings.namespace, settings.name
    deadline = ctx.deadline(settings.timeout_s)
    client = ctx.client()
    created: Created = []
    try:
        cd = _create_cd(ctx, client, settings, spec, created, deadline)
        _ensure_claims(ctx, client, cd, created, deadline)
        cd = _await(ctx, client, cd, settings.await_for, deadline)
    except Exception as exc:
        roll_back(client, ns, created, exc)
        raise
    return CreateResult(f"{ns}/{name}", outputs(cd, settings.to_inputs()))


def read(ctx: Context, id_: str, props: dict[str, Any]) -> ReadResult:
    ns, name = split_id(id_, props)
    client = ctx.client()
    live = get(client, CD, name, ns)
    if live is None:  # deleted behind our back (or its CRD is gone)
        return ReadResult(None, {})
    outs = outputs(live, props)
    outs["claim_drift"] = claim_drift(client, live)
    return ReadResult(f"{ns}/{name}", outs, {k: outs[k] for k in INPUT_KEYS})


def update(ctx: Context, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
    args = _parse(user_props(news))
    deadline = ctx.deadline(args.timeout_s)
    client = ctx.client()
    ref = f"ComputeDomain {args.namespace}/{args.name}"
    new_spec = dump_spec(args.spec)
    dropped = {k: None for k in (olds.get("labels") or {}) if k not in args.labels}
    patch = {"metadata": {"labels": {**dropped, **args.labels}},
             "spec": {f: new_spec.get(f) for f in ALLOWED["spec"] if f not in api.IMMUTABLE_FIELDS}}
    with kube_errors.api_call(f"update {ref}"):
        cd = dict(send(client, "patch", CD, patch, name=args.name, namespace=args.namespace,
                       headers={"Content-Type": PatchType.MERGE.value}))
    _ensure_claims(ctx, client, cd, [], deadline, repair=True)
    cd = _await(ctx, client, cd, args.await_for, deadline)
    return UpdateResult(outputs(cd, args.to_inputs()))


def delete(ctx: Context, id_: str, props: dict[str, Any]) -> None:
    ns, name = split_id(id_, props)
    force = bool(props.get("force_delete"))
    deadline = ctx.deadline(float(props.get("timeout_s") or DEFAULT_TIMEOUT_S))
    client = ctx.client()
    cd = get(client, CD, name, ns)
    snap = Snapshot(namespace=ns, name=name, claim_name=_claim_name(name, cd, props))
    ours = _claim_filter(name, uid=str(meta(cd).get("uid") or props.get("uid") or ""))
    # The claim, then a MultiClique CD's other groups' claims (the first one is awaited below, these
    # are owned by the CD as well, so the garbage collector would remove them after it too).
    spec = ComputeDomainSpec.model_validate((cd or {}).get("spec") or {})
    claims = [n for n in (snap.claim_name, *channel_claim_names(name, spec)[1:])
              if ours(get(client, ResourceClaim, n, ns)) is not None]
    if not force:
        for claim_name in claims:
            wait_out_departing_users(ctx, client, dataclasses.replace(snap, claim_name=claim_name), deadline)
    if cd is not None:
        domainclient.delete(client, CD, name, ns, action=f"delete {snap.cd_ref}")
    for claim_name in claims:
        domainclient.delete(client, ResourceClaim, claim_name, ns, action=f"delete ResourceClaim {ns}/{claim_name}")
        _release_hold(client, claim_name, ns)

    def observe() -> Snapshot:
        return Snapshot(namespace=ns, name=name, claim_name=snap.claim_name, cd=get(client, CD, name, ns),
                        claim=ours(get(client, ResourceClaim, snap.claim_name, ns)))

    ctx.wait(awaited=await_.awaited_deletion(snap), observe=observe,
             condition=await_.deleted(claim_may_linger=force), deadline=deadline)


# -- steps -------------------------------------------------------------------------------------------


def _create_cd(ctx: Context, client: Client, args: NvlfabricArgs, spec: Mapping[str, Any],
               created: Created, deadline: Deadline) -> dict[str, Any]:
    ns, name = args.namespace, args.name
    ref = f"ComputeDomain {ns}/{name}"
    body = {"apiVersion": api.API_VERSION, "kind": api.KIND,
            "metadata": {"name": name, "namespace": ns, **({"labels": args.labels} if args.labels else {})},
            "spec": domaininputs.whole_numbers(dict(spec))}
    try:
        cd = ctx.retrying(deadline, f"create {ref}",
                          lambda: dict(send(client, "post", CD, CD.from_dict(body), namespace=ns)))
    except api_errors.NotFound as exc:
        raise api_errors.NotFound(
            action=exc.action, code=exc.code, reason=exc.reason, message=exc.message,
            hint=f"is the ComputeDomain CRD ({api.CRD_NAME}) installed, and does namespace {ns} exist?",
        ) from exc
    except api_errors.AlreadyExists:
        if not args.adopt:
            raise errors.ObjectExists(
                f"{ref} already exists and this stack did not create it. To manage it from this program "
                "set adopt=True (its spec and labels are then made to match; its immutable fields must "
                f"already match); or delete it first (kubectl delete computedomain -n {ns} {name}); or "
                "choose another name") from None
        with kube_errors.api_call(f"adopt {ref} (patch its spec and labels to match)"):
            return dict(send(client, "patch", CD, {"metadata": {"labels": args.labels}, "spec": dict(spec)},
                             name=name, namespace=ns, headers={"Content-Type": PatchType.MERGE.value}))
    created.append(("ComputeDomain", CD, name))
    return cd


def _ensure_claims(ctx: Context, client: Client, cd: Mapping[str, Any], created: Created, deadline: Deadline, *,
                   repair: bool = False) -> None:
    """Create the CD's channel claim (a MultiClique CD's, one per clique group). `repair`: an
    update, which recreates a claim deleted out of band, and fails (`ClaimDeleting`) on one
    that is being deleted but held by pods: no claim of its name can be made until they stop."""
    spec = ComputeDomainSpec.model_validate(cd.get("spec") or {})
    for group in range(spec.groups):
        claim = _ensure_claim(ctx, client, cd, created, deadline, group)
        if repair and meta(claim).get("deletionTimestamp"):
            raise errors.ClaimDeleting(claim_drift(client, cd) or "")


def _ensure_claim(ctx: Context, client: Client, cd: Mapping[str, Any], created: Created, deadline: Deadline,
                  group: int = 0) -> dict[str, Any]:
    """Create one channel claim of the CD; an existing one is fine only if the CD owns it."""
    md = meta(cd)
    ns, name, uid = str(md.get("namespace")), str(md.get("name")), str(md.get("uid"))
    body = channel_claim(name, ns, uid, ComputeDomainSpec.model_validate(cd.get("spec") or {}), group)
    claim_name = body["metadata"]["name"]
    ref = f"ResourceClaim {ns}/{claim_name}"
    try:
        claim: dict[str, Any] = ctx.retrying(deadline, f"create {ref}", lambda: send(
            client, "post", ResourceClaim, ResourceClaim.from_dict(body), namespace=ns).to_dict())
    except api_errors.AlreadyExists:
        live = get(client, ResourceClaim, claim_name, ns)
        if live is not None and owned_by(live, uid):
            return live
        raise errors.ObjectExists(
            f"{ref} already exists and does not belong to ComputeDomain {ns}/{name}, whose channel claim it "
            f"would be. Delete it if nothing uses it (kubectl delete resourceclaim -n {ns} {claim_name}), or "
            "give the ComputeDomain another claim name (spec.channelClaim.name) or another name") from None
    created.append(("ResourceClaim", ResourceClaim, claim_name))
    return claim


def _observe(client: Client, ns: str, name: str, claim_name: str) -> Snapshot:
    crd, readable = read_crd(client, api.CRD_NAME)
    return Snapshot(namespace=ns, name=name, claim_name=claim_name, crd=crd, crd_readable=readable,
                    cd=get(client, CD, name, ns), claim=get(client, ResourceClaim, claim_name, ns))


def _await(ctx: Context, client: Client, cd: Mapping[str, Any], level: AwaitFor, deadline: Deadline,
           ) -> dict[str, Any]:
    """Wait per the readiness table; returns the CD as last seen."""
    md = meta(cd)
    ns, name = str(md.get("namespace")), str(md.get("name"))
    claim_name = _first_claim(name, cd.get("spec") or {})
    if not await_.READINESS[level]:
        return dict(cd)
    snap = ctx.wait(
        awaited=await_.awaited(Snapshot(namespace=ns, name=name, claim_name=claim_name), level),
        observe=lambda: _observe(client, ns, name, claim_name),
        condition=await_.readiness(level), deadline=deadline,
        hint=("raise timeout_s, or set await_for='Accepted' to not wait for the members"
              if level is AwaitFor.READY else ""),
    )
    assert snap.cd is not None  # the condition requires it
    return dict(snap.cd)


def _claim_name(name: str, cd: Mapping[str, Any] | None, props: Mapping[str, Any]) -> str:
    """The CD's claim name: from state, else from the live spec, else the default."""
    if props.get("claim_name"):
        return str(props["claim_name"])
    return _first_claim(name, (cd or {}).get("spec") or {})


def _claim_filter(cd_name: str, *, uid: str) -> Callable[[dict[str, Any] | None], dict[str, Any] | None]:
    """Keeps a claim only if it belongs to the CD (owned by its uid, or labelled with its name)."""

    def ours(claim: dict[str, Any] | None) -> dict[str, Any] | None:
        if claim is None:
            return None
        labelled = (meta(claim).get("labels") or {}).get(COMPUTE_DOMAIN_LABEL) == cd_name
        return claim if labelled or (uid and owned_by(claim, uid)) else None

    return ours
