"""A dynamic provider for ComputeDomains (`nvlfabric.io/v1alpha1`) and their shared channel claims.

A ComputeDomain (CD) is managed as one unit with its channel ResourceClaim (docs/architecture.md,
"DRA design"): every pod of the CD references that one claim by name, so the scheduler gives the
CD one IMEX channel and keeps all its pods in one clique.

The contract, method by method:

- `check` validates the inputs with the pydantic models (`ComputeDomainArgs`, whose `spec` is
  the API's own `ComputeDomainSpec`). Each failure names the property path (`spec.imexMode`,
  `labels["a/b"]`) and the fix. Values still unknown during a preview (Pulumi's sentinel string)
  are not judged, and neither is anything that depends on them. Valid inputs are returned
  normalised: the spec with its defaults filled, so state, diffs and refreshes all compare like
  with like.
- `diff` is field-level. `name`, `namespace` and the immutable spec fields (`immutable_changes`)
  are replaces; `numNodes`, `labels` and the provider settings are updates; nothing changed means
  `changes=False`. A replace deletes first (`delete_before_replace`) when the replacement reuses
  the CD's or its claim's name, which it does unless both are renamed. A value unknown during a
  preview counts as changed, and as a replace when it is a replace field.
- `create` creates the CD, then its claim `<cd>-channel` (or `spec.channelClaim.name`), owned by
  the CD (so the garbage collector removes it with the CD) and labelled
  `nvlfabric.io/compute-domain=<cd>`. Both requests ask the API server for strict field validation
  (`fieldValidation=Strict`), so an unknown or duplicate field is an error, not silently dropped;
  the spec is sent as given and the API server, holding the CRD generated from the same models,
  is the judge. Both are tried again after a temporary error (the API server unreachable or
  failing) until the deadline, as the await is, so an API server outage shorter than `timeout_s`
  is ridden out. If the claim or the await fails, what this call created is deleted before the
  error is raised (nothing half-made stays behind). An existing CD is an error listing the
  remedies, unless `adopt` is set: then its spec and labels are patched to match (its immutable
  fields must already match) and it is never rolled back.
- `read` returns the live object (drift shows on refresh) and rebuilds the inputs from it; a
  deleted CD reads as gone.
- `update` merge-patches the mutable spec fields and the labels, recreates the claim if it was
  deleted behind our back, and awaits as `create` does.
- `delete` refuses while pods use the claim (`status.reservedFor`, or pods of the namespace that
  reference it and have not finished), naming up to five of them, unless `force_delete` is set;
  then deletes the CD and the claim and waits until both are gone, naming any finalizers that
  hold them on timeout.

Awaiting (`await_for`): `None`, `Accepted` (default: the CRD is established, the CD and its claim
exist) or `Ready` (the controller reports phase Ready for the current generation); one deadline,
`timeout_s` (default 600 s), covers a whole create, update or delete. See `nvlfabric.provider.await_`.

**`channelAllocationMode: All`.** The claim is the same as for `Single`: exactly one channel
device of the clique's pool. That one device still does what the claim is for (the scheduler's
clique placement and the CD's channel identity), while `allocationMode: All` would take every
channel of the clique's pool and starve every other CD in the clique. The opaque config carries
`channelAllocationMode: All`, and the node agent injects every channel device (0-2047) into the
CD's pods when it prepares the claim. The API allows `All` only with a dedicated IMEX domain, so
those channels are only meaningful inside the CD's own domain.

**Strict field validation.** lightkube 1.0.1's `create`/`patch` take no `fieldValidation`
parameter, but its request layer accepts any query parameter; `_send` goes through it (pinned
lightkube; a test proves that an unknown field is rejected by the server).
"""

from __future__ import annotations

import dataclasses
import functools
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, Literal, Required, TypedDict, TypeVar, Unpack

from lightkube import Client
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import ResourceClaim
from lightkube.types import CascadeType, PatchType
from pulumi import Input, Output, ResourceOptions
from pulumi.dynamic import (
    CheckFailure,
    CheckResult,
    ConfigureRequest,
    CreateResult,
    DiffResult,
    ReadResult,
    Resource,
    ResourceProvider,
    UpdateResult,
)
from pulumi.runtime.rpc import UNKNOWN
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import ErrorDetails

from nvlfabric.api import computedomain as api
from nvlfabric.api import errors as api_errors
from nvlfabric.api import names
from nvlfabric.api.channelconfig import ChannelConfig, ComputeDomainRef
from nvlfabric.api.computedomain import ComputeDomainSpec, channel_claim_names, immutable_changes
from nvlfabric.api.names import CLIQUE_GROUPS_ANNOTATION, COMPUTE_DOMAIN_LABEL, DEVICE_CLASS, DRIVER
from nvlfabric.api.nvidia import Backend, NvidiaDomainSpec
from nvlfabric.kube import errors as kube_errors
from nvlfabric.provider import await_, errors, host, kube
from nvlfabric.provider.await_ import AwaitFor, Deadline, Snapshot

T = TypeVar("T")
CD: Final = create_namespaced_resource(names.GROUP, api.VERSION, api.KIND, api.PLURAL)

#: The DeviceClass and DRA driver of IMEX channels (docs/architecture.md, "DRA design").
#: The label every channel claim carries: the name of its ComputeDomain.
#: The name of the claim's one device request.
CHANNEL_REQUEST: Final = "channel"
CHANNEL_CONFIG_KIND: Final = "ChannelConfig"
#: Ten minutes, as pulumi-kubernetes: long enough for a Dedicated IMEX domain's cold start.
DEFAULT_TIMEOUT_S: Final = 600.0
#: How many pods an "in use" error names.
MAX_NAMED_PODS: Final = 5
DEPARTING_SETTLE_S: Final = 10.0
"""How long delete waits for the users of a channel to be marked for deletion (the garbage
collector does that for the pods of a workload deleted just before the domain) before a pod that
is not refuses it."""

_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS_SUBDOMAIN = re.compile(names.DNS_SUBDOMAIN)


class ComputeDomainArgs(BaseModel):
    """The inputs of a ComputeDomain resource."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=names.DNS_LABEL, max_length=names.DNS_LABEL_MAX,
                      description="The ComputeDomain's name: a DNS label (its claim and labels derive from it).")
    namespace: str = Field("default", pattern=names.DNS_LABEL, max_length=names.DNS_LABEL_MAX,
                           description="The namespace of the ComputeDomain, its claim and its pods.")
    backend: Literal[Backend.NVLFABRIC] = Field(Backend.NVLFABRIC, description="nvlfabric's own ComputeDomain.")
    spec: ComputeDomainSpec = Field(default_factory=ComputeDomainSpec, description="The desired ComputeDomain.")
    labels: dict[str, str] = Field(default_factory=dict, description="Labels of the ComputeDomain.")
    await_for: AwaitFor = Field(AwaitFor.ACCEPTED, description="What create and update wait for.")
    timeout_s: float = Field(DEFAULT_TIMEOUT_S, gt=0, description="Seconds a create, update or delete may take.")
    adopt: bool = Field(False, description="Take over an existing ComputeDomain of this name.")
    force_delete: bool = Field(False, description="Delete even while pods use the channel claim.")

    def to_inputs(self) -> dict[str, Any]:
        """The normalised inputs (API names, defaults filled, no nulls)."""
        return {
            "name": self.name, "namespace": self.namespace, "backend": self.backend.value, "spec": _dump(self.spec),
            "labels": dict(self.labels),
            "await_for": self.await_for.value, "timeout_s": self.timeout_s, "adopt": self.adopt,
            "force_delete": self.force_delete,
        }


INPUT_KEYS: Final = tuple(ComputeDomainArgs.model_fields)
OUTPUT_KEYS: Final = ("uid", "claim_name", "phase", "clique", "channel", "nodes", "ready_nodes", "total_nodes",
                      "claim_drift")
SETTINGS: Final[Mapping[str, Any]] = {"await_for": AwaitFor.ACCEPTED.value, "timeout_s": DEFAULT_TIMEOUT_S,
                                      "adopt": False, "force_delete": False}


def _dump(spec: ComputeDomainSpec) -> dict[str, Any]:
    return spec.model_dump(mode="json", by_alias=True, exclude_none=True)


# -- check -------------------------------------------------------------------------------------------


def is_unknown(value: Any) -> bool:
    """True for Pulumi's "unknown during preview" sentinel."""
    return isinstance(value, str) and value == UNKNOWN


def _unknown_paths(value: Any, path: tuple[str, ...] = ()) -> Iterable[tuple[str, ...]]:
    if is_unknown(value):
        yield path
    elif isinstance(value, Mapping):
        for key, sub in value.items():
            yield from _unknown_paths(sub, (*path, str(key)))
    elif isinstance(value, list):
        for i, sub in enumerate(value):
            yield from _unknown_paths(sub, (*path, str(i)))


def _user_props(props: Mapping[str, Any]) -> dict[str, Any]:
    """The inputs a user sets: no `__provider`, no output placeholders, no nulls (meaning: the default)."""
    return {k: v for k, v in props.items() if not k.startswith("__") and k not in OUTPUT_KEYS and v is not None}


_FIXES: Final[Mapping[str, str]] = {
    "name": "use a DNS label: at most 63 lowercase letters, digits and '-', starting and ending with a "
            "letter or digit, e.g. 'train-1'",
    "namespace": "use the name of a namespace (a DNS label), e.g. 'default'",
    "spec.numNodes": "set a positive number of nodes, or leave it unset to be Ready when every placed member is",
    "spec.imexMode": "use CliqueScoped (the default) or Dedicated",
    "spec.channelAllocationMode": "use Single (the default) or All (All needs imexMode: Dedicated)",
    "spec.placement.scope": "use SingleClique (the only scope in v1alpha1) or leave it unset",
    "spec.placement.clique": "use '<clusterUUID>.<cliqueID>' as in the node label nvidia.com/gpu.clique, e.g. "
                             "9f410827-489f-46fd-8203-51266ca08eb7.32766, or leave it unset",
    "spec.channelClaim.name": "use a DNS subdomain (lowercase letters, digits, '-' and '.'), e.g. 'train-channel'",
    "await_for": "use 'None', 'Accepted' or 'Ready'",
    "timeout_s": "give the seconds to wait as a positive number, e.g. 600",
    "adopt": "use true or false",
    "force_delete": "use true or false",
    "labels": "give a map of label keys to string values",
    "backend": "use 'nvlfabric' (nvlfabric's driver, the default) or 'nvidia' (NVIDIA's DRA driver, already in the "
               "cluster)",
}

_ALLOWED: Final[Mapping[str, list[str]]] = {
    "": list(ComputeDomainArgs.model_fields),
    "spec": [f.alias or n for n, f in ComputeDomainSpec.model_fields.items()],
    "spec.placement": list(api.Placement.model_fields),
    "spec.channelClaim": list(api.ChannelClaim.model_fields),
}


Loc = tuple[str, ...]


def _prop(loc: Loc) -> str:
    """A property path as Pulumi shows it: `spec.placement.clique`, `labels["example.com/team"]`."""
    if len(loc) == 2 and loc[0] == "labels":
        return f'labels["{loc[1]}"]'
    return ".".join(loc)


def _failure(err: ErrorDetails, allowed_here: Mapping[str, list[str]] = _ALLOWED) -> tuple[Loc, CheckFailure]:
    loc = tuple(str(p) for p in err["loc"])
    path = _prop(loc)
    message = err["msg"].removeprefix("Value error, ")
    if api.ALL_NEEDS_DEDICATED_MESSAGE in message:  # the spec's cross-field rule names its own fix
        return loc, CheckFailure("spec.channelAllocationMode", api.ALL_NEEDS_DEDICATED_MESSAGE)
    if err["type"] == "literal_error" and loc == ("backend",):  # the other backend's model judges it
        return loc, CheckFailure("backend", f"unknown backend {err.get('input')!r}: {_FIXES['backend']}")
    if err["type"] == "extra_forbidden":
        allowed = ", ".join(allowed_here.get(".".join(loc[:-1]), []))
        return loc, CheckFailure(path, f"unknown property {path}" + (f"; allowed here: {allowed}" if allowed else ""))
    if err["type"] == "missing":
        return loc, CheckFailure(path, f"{path} is required" + (f": {_FIXES[path]}" if path in _FIXES else ""))
    fix = _FIXES.get(path) or _FIXES.get(loc[0] if loc else "", "")
    return loc, CheckFailure(path or "(inputs)", f"{message}: {fix}" if fix else message)


def _label_failures(labels: Mapping[str, str]) -> list[tuple[Loc, CheckFailure]]:
    failures: list[tuple[Loc, CheckFailure]] = []
    for key, value in labels.items():
        prefix, _, name = key.rpartition("/")
        loc = ("labels", key)
        if (prefix and (len(prefix) > names.DNS_SUBDOMAIN_MAX or not _DNS_SUBDOMAIN.match(prefix))) or (
                len(name) > 63 or not _LABEL_NAME.match(name)):
            failures.append((loc, CheckFailure(_prop(loc), (
                f"invalid label key {key!r}: use an optional DNS-subdomain prefix and '/', then at most 63 "
                "letters, digits, '-', '_' or '.', starting and ending with a letter or digit, e.g. 'team' or "
                "'example.com/team'"))))
        if value and (len(value) > 63 or not _LABEL_NAME.match(value)):
            failures.append((loc, CheckFailure(_prop(loc), (
                f"invalid label value {value!r}: use at most 63 letters, digits, '-', '_' or '.', starting and "
                "ending with a letter or digit (or an empty string)"))))
    return failures


def backend_of(props: Mapping[str, Any]) -> str:
    """The backend the inputs (or the state) name; absent means nvlfabric (state from before backends)."""
    return str(props.get("backend") or Backend.NVLFABRIC.value)


def check_inputs(news: Mapping[str, Any], model: type[ComputeDomainArgs] | Any = ComputeDomainArgs,
                 allowed: Mapping[str, list[str]] = _ALLOWED) -> CheckResult:
    """Validate and normalise inputs with the backend's `model` (its `allowed` properties for an
    unknown one); what is unknown (or depends on it) is passed through unjudged."""
    props = _user_props(news)
    unknown = list(_unknown_paths(props))

    def judged(found: Iterable[tuple[Loc, CheckFailure]]) -> list[CheckFailure]:
        # A failure at or under an unknown value, or of a whole that contains one, cannot be decided yet.
        return [f for loc, f in found if not any(loc[: len(u)] == u or u[: len(loc)] == loc for u in unknown)]

    try:
        args = model.model_validate(props)
    except ValidationError as exc:
        return CheckResult(dict(news), judged(_failure(e, allowed) for e in exc.errors()))
    failures = judged(_label_failures(args.labels))
    if failures or unknown:
        return CheckResult(dict(news), failures)
    return CheckResult({**{k: v for k, v in news.items() if k.startswith("__")}, **args.to_inputs()}, [])


# -- diff --------------------------------------------------------------------------------------------


def _normal_spec(raw: Any) -> dict[str, Any]:
    """The spec with defaults filled; as given when it does not validate (check already reported it)."""
    try:
        return _dump(ComputeDomainSpec.model_validate(raw or {}))
    except ValidationError:
        return dict(raw) if isinstance(raw, Mapping) else {}


def _contains_unknown(value: Any) -> bool:
    return any(True for _ in _unknown_paths(value))


def _spec_diff(old_raw: Any, new_raw: Any) -> tuple[list[str], bool]:
    """(the immutable spec fields that change, as replace paths; whether the spec changes at all)."""
    if is_unknown(new_raw):
        return [f"spec.{f}" for f in api.IMMUTABLE_FIELDS], True
    new_raw = new_raw or {}
    unknown = {k for k, v in new_raw.items() if _contains_unknown(v)}
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


def _claim_of(props: Mapping[str, Any]) -> str | None:
    name, spec = props.get("name"), props.get("spec")
    if not isinstance(name, str) or is_unknown(name) or _contains_unknown(spec):
        return None
    try:
        return channel_claim_names(name, ComputeDomainSpec.model_validate(spec or {}))[0]
    except ValidationError:
        return None


def compute_diff(olds: Mapping[str, Any], news: Mapping[str, Any]) -> DiffResult:
    """The diff between the state (`olds`: outputs, which hold the inputs too) and checked inputs."""
    replaces = []
    for key, default in (("namespace", "default"), ("name", None)):
        new = news.get(key, default)
        if is_unknown(new) or new != olds.get(key, default):
            replaces.append(key)
    spec_replaces, spec_changed = _spec_diff(olds.get("spec"), news.get("spec"))
    replaces += spec_replaces
    new_labels = news.get("labels") or {}
    labels_changed = _contains_unknown(new_labels) or dict(olds.get("labels") or {}) != dict(new_labels)
    settings_changed = any(news.get(k, d) != olds.get(k, d) for k, d in SETTINGS.items())
    # A claim deleted out of band (found by a refresh): the update makes it anew, or says why not.
    drifted = bool(olds.get("claim_drift"))
    if not (replaces or spec_changed or labels_changed or settings_changed or drifted):
        return DiffResult(changes=False)
    if not replaces:
        return DiffResult(changes=True)
    return DiffResult(changes=True, replaces=replaces, delete_before_replace=_reuses_a_name(olds, news))


def _reuses_a_name(olds: Mapping[str, Any], news: Mapping[str, Any]) -> bool:
    """Whether a replacement would reuse the CD's or its claim's name (then the old must go first)."""
    new_claim = _claim_of(news)
    if is_unknown(news.get("namespace")) or is_unknown(news.get("name")) or new_claim is None:
        return True
    if news.get("namespace", "default") != olds.get("namespace", "default"):
        return False
    return news.get("name") == olds.get("name") or new_claim == (olds.get("claim_name") or _claim_of(olds))


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


def _release_hold(client: Client, claim_name: str, ns: str) -> None:
    """Take the domain's hold off its claim, now being deleted (api.hold_consumer), so that the
    claim is deallocated and goes without waiting for the controller to do the same. Best effort:
    a claim already gone, changed meanwhile or not ours to patch is left to the controller."""
    claim = _get(client, ResourceClaim, claim_name, ns)
    patch = api.release_hold_patch(dict(claim)) if claim is not None else None
    if patch is None:
        return
    try:
        with kube_errors.api_call(f"release the hold on ResourceClaim {ns}/{claim_name}"):
            client.patch(ResourceClaim.Status, claim_name, patch, namespace=ns, patch_type=PatchType.JSON)
    except api_errors.ApiStatusError as exc:
        _progress(f"{exc}; the controller releases it")


def _meta(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return (obj or {}).get("metadata") or {}


def owned_by(claim: Mapping[str, Any], uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in _meta(claim).get("ownerReferences") or [])


def outputs(cd: Mapping[str, Any], settings: Mapping[str, Any]) -> dict[str, Any]:
    """The resource's outputs from the live CD (`settings`: await_for, timeout_s, adopt, force_delete)."""
    meta, status = _meta(cd), cd.get("status") or {}
    spec = ComputeDomainSpec.model_validate(cd.get("spec") or {})
    nodes = [{"name": n.get("name"), "ready": n.get("ready") is True} for n in status.get("nodes") or []]
    ready = status.get("readyNodes")
    total = status.get("totalNodes")
    return {
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
        "backend": Backend.NVLFABRIC.value,
        "spec": _dump(spec),
        "labels": dict(meta.get("labels") or {}),
        **{k: settings.get(k, d) for k, d in SETTINGS.items()},
        "uid": meta.get("uid"),
        "claim_name": channel_claim_names(str(meta.get("name")), spec)[0],
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
    meta = _meta(cd)
    ns, name = str(meta.get("namespace")), str(meta.get("name"))
    names = channel_claim_names(name, ComputeDomainSpec.model_validate(cd.get("spec") or {}))
    for claim_name in names:
        claim = _get(client, ResourceClaim, claim_name, ns)
        ref = f"ResourceClaim {ns}/{claim_name}"
        if claim is None:
            return f"{ref}, the channel claim of ComputeDomain {ns}/{name}, was deleted outside this stack: " \
                   "`pulumi up` creates it anew"
        if _meta(claim).get("deletionTimestamp"):
            with kube_errors.api_call(f"list pods in namespace {ns}"):
                pods = [p.to_dict() for p in client.list(Pod, namespace=ns)]
            users = claim_users(claim, pods, claim_name)
            return (f"{ref}, the channel claim of ComputeDomain {ns}/{name}, was deleted outside this stack and "
                    f"is held by {len(users)} pods until they stop ({', '.join(users[:MAX_NAMED_PODS])}); new "
                    "pods of the domain cannot start, and no claim of that name can be made until then: let them "
                    "finish (or delete the workload), then run `pulumi up` to create it anew")
    return None


def claim_users(claim: Mapping[str, Any] | None, pods: Iterable[Mapping[str, Any]], claim_name: str, *,
                ref_key: str = "resourceClaimName") -> list[str]:
    """'namespace/name' of the pods using the claim: reserved for, or referencing it and not finished
    (`ref_key` resourceClaimTemplateName: the pods whose claims are made from the template of that name)."""
    users = [f"{_meta(claim).get('namespace')}/{ref.get('name')}"
             for ref in ((claim or {}).get("status") or {}).get("reservedFor") or []
             if ref.get("resource") == "pods"]
    for pod in pods:
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue  # a finished pod holds no channel
        refs = (pod.get("spec") or {}).get("resourceClaims") or []
        if any(r.get(ref_key) == claim_name for r in refs):
            users.append(f"{_meta(pod).get('namespace')}/{_meta(pod).get('name')}")
    return list(dict.fromkeys(users))


def in_use_message(cd_ref: str, claim_ref: str, users: list[str]) -> str:
    named = ", ".join(users[:MAX_NAMED_PODS])
    if len(users) > MAX_NAMED_PODS:
        named += f" and {len(users) - MAX_NAMED_PODS} more"
    pods = "1 pod uses" if len(users) == 1 else f"{len(users)} pods use"
    return (f"{cd_ref} is still in use: {pods} its channel "
            f"{claim_ref}: {named}. Delete the workload first (the pods and what creates them), or set "
            "force_delete=True (and run `pulumi up` to record it) to delete anyway: running pods keep their "
            "channel until they stop, new ones cannot start")


def _progress(message: str) -> None:
    # pulumi.log is not connected inside dynamic providers; their stderr reaches the CLI.
    print(f"nvlfabric: {message}", file=sys.stderr, flush=True)


# -- the provider ------------------------------------------------------------------------------------


F = TypeVar("F", bound=Callable[..., Any])
host.install()  # in the dynamic provider host: our errors as their message, no traceback


def _plain_errors(method: F) -> F:
    """Our own errors reach the engine as their message: Pulumi's dynamic provider host prints the
    whole traceback of whatever a method raises (a missing namespace was ~60 chained lines with the
    message last), so the error is raised afresh here, without its chain or the frames below."""
    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except api_errors.NvlfabricError as exc:
            error = exc
        raise error.with_traceback(None) from None

    return wrapper  # type: ignore[return-value]


class ComputeDomainProvider(ResourceProvider):
    """CRUD for a ComputeDomain and its shared channel claim, with await (see the module docstring)."""

    # Nothing secret is captured; skipping the per-resource encryption keeps big stacks fast.
    serialize_as_secret_always = False

    def __init__(self) -> None:
        self.kubeconfig: str | None = None
        #: The clock and poll intervals of awaits; None means the real clock and `await_.POLL`.
        self.clock: await_.Clock | None = None
        self.poll: await_.Poll | None = None
        #: Backend nvidia: how long a new domain may lack NVIDIA's finalizer before its controller
        #: is looked for (None: nvidiadomain.CONTROLLER_GRACE_S).
        self.controller_grace_s: float | None = None
        self.on_progress: Callable[[str], None] | None = None

    def configure(self, req: ConfigureRequest) -> None:
        self.kubeconfig = req.config.get("kubernetes:kubeconfig") or req.config.get("nvlfabric:kubeconfig")

    def _client(self) -> Client:
        return kube.client(kube.kubeconfig_source(getattr(self, "kubeconfig", None)))

    def _deadline(self, timeout_s: float) -> Deadline:
        return Deadline.after(timeout_s, clock=getattr(self, "clock", None) or await_.SYSTEM_CLOCK)

    # -- engine entry points

    # The nvidia backend's operations are nvlfabric/provider/nvidiadomain.py, built on this module's
    # helpers (so imported where used).

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        backend = news.get("backend")
        if is_unknown(backend):  # which model judges the rest is not known yet
            return CheckResult(dict(news), [])
        if backend_of(news) == Backend.NVIDIA:
            from nvlfabric.provider import nvidiadomain  # (it imports this module)
            return nvidiadomain.check_inputs(news)
        return check_inputs(news)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        new_backend = news.get("backend")
        if is_unknown(new_backend) or backend_of(news) != backend_of(olds):
            # Another backend is another object (nvlfabric.io's or resource.nvidia.com's), made
            # before the old one goes: the migration's preview shows each domain replaced for this.
            return DiffResult(changes=True, replaces=["backend"], delete_before_replace=False)
        if backend_of(news) == Backend.NVIDIA:
            from nvlfabric.provider import nvidiadomain  # (it imports this module)
            return nvidiadomain.compute_diff(olds, news)
        return compute_diff(olds, news)

    @_plain_errors
    def create(self, props: dict[str, Any]) -> CreateResult:
        if backend_of(props) == Backend.NVIDIA:
            from nvlfabric.provider import nvidiadomain  # (it imports this module)
            return nvidiadomain.create(self, props)
        # The spec goes to the API server as given (it judges it, strictly); the rest is ours to parse.
        spec = _user_props(props).get("spec") or {}
        settings = _parse({**_user_props(props), "spec": {}})
        ns, name = settings.namespace, settings.name
        deadline = self._deadline(settings.timeout_s)
        client = self._client()
        created: list[tuple[str, Any, str]] = []
        try:
            cd = self._create_cd(client, settings, spec, created, deadline)
            self._ensure_claims(client, cd, created, deadline)
            cd = self._await(client, cd, settings.await_for, deadline)
        except Exception as exc:
            self._roll_back(client, ns, created, exc)
            raise
        return CreateResult(f"{ns}/{name}", outputs(cd, settings.to_inputs()))

    @_plain_errors
    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        if backend_of(props) == Backend.NVIDIA:
            from nvlfabric.provider import nvidiadomain  # (it imports this module)
            return nvidiadomain.read(self, id_, props)
        ns, name = _split_id(id_, props)
        client = self._client()
        live = _get(client, CD, name, ns)
        if live is None:  # deleted behind our back (or its CRD is gone)
            return ReadResult(None, {})
        outs = outputs(live, props)
        outs["claim_drift"] = claim_drift(client, live)
        return ReadResult(f"{ns}/{name}", outs, {k: outs[k] for k in INPUT_KEYS})

    @_plain_errors
    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        if backend_of(news) == Backend.NVIDIA:
            from nvlfabric.provider import nvidiadomain  # (it imports this module)
            return nvidiadomain.update(self, olds, news)
        args = _parse(_user_props(news))
        deadline = self._deadline(args.timeout_s)
        client = self._client()
        ref = f"ComputeDomain {args.namespace}/{args.name}"
        new_spec = _dump(args.spec)
        dropped = {k: None for k in (olds.get("labels") or {}) if k not in args.labels}
        patch = {"metadata": {"labels": {**dropped, **args.labels}},
                 "spec": {f: new_spec.get(f) for f in _ALLOWED["spec"] if f not in api.IMMUTABLE_FIELDS}}
        with kube_errors.api_call(f"update {ref}"):
            cd = dict(_send(client, "patch", CD, patch, name=args.name, namespace=args.namespace,
                            headers={"Content-Type": PatchType.MERGE.value}))
        self._ensure_claims(client, cd, [], deadline, repair=True)
        cd = self._await(client, cd, args.await_for, deadline)
        return UpdateResult(outputs(cd, args.to_inputs()))

    @_plain_errors
    def delete(self, id_: str, props: dict[str, Any]) -> None:
        if backend_of(props) == Backend.NVIDIA:
            from nvlfabric.provider import nvidiadomain  # (it imports this module)
            return nvidiadomain.delete(self, id_, props)
        ns, name = _split_id(id_, props)
        force = bool(props.get("force_delete"))
        deadline = self._deadline(float(props.get("timeout_s") or DEFAULT_TIMEOUT_S))
        client = self._client()
        cd = _get(client, CD, name, ns)
        snap = Snapshot(namespace=ns, name=name, claim_name=_claim_name(name, cd, props))
        ours = _claim_filter(name, uid=str(_meta(cd).get("uid") or props.get("uid") or ""))
        claim = ours(_get(client, ResourceClaim, snap.claim_name, ns))
        # A MultiClique CD's other groups' claims (the first one is awaited below, these are owned
        # by the CD as well, so the garbage collector would remove them after it too).
        spec = ComputeDomainSpec.model_validate((cd or {}).get("spec") or {})
        others = [(n, c) for n in channel_claim_names(name, spec)[1:]
                  if (c := ours(_get(client, ResourceClaim, n, ns))) is not None]
        if not force:
            for claim_name, c in [(snap.claim_name, claim), *others]:
                if c is not None:
                    self._wait_out_departing_users(client, dataclasses.replace(snap, claim_name=claim_name), deadline)
        if cd is not None:
            _delete(client, CD, name, ns, action=f"delete {snap.cd_ref}")
        for claim_name, c in [(snap.claim_name, claim), *others]:
            if c is not None:
                _delete(client, ResourceClaim, claim_name, ns, action=f"delete ResourceClaim {ns}/{claim_name}")
                _release_hold(client, claim_name, ns)

        def observe() -> Snapshot:
            return Snapshot(namespace=ns, name=name, claim_name=snap.claim_name, cd=_get(client, CD, name, ns),
                            claim=ours(_get(client, ResourceClaim, snap.claim_name, ns)))

        await_.wait(awaited=await_.awaited_deletion(snap), observe=observe,
                    condition=await_.deleted(claim_may_linger=force), deadline=deadline,
                    poll=getattr(self, "poll", None) or await_.POLL, on_progress=self._on_progress())

    # -- steps

    def _on_progress(self) -> Callable[[str], None]:
        return getattr(self, "on_progress", None) or _progress

    def _retrying(self, deadline: Deadline, action: str, call: Callable[[], T]) -> T:
        """`call()` under `api_call(action)`, tried again after a temporary error (the API server
        unreachable, overloaded or failing) until the operation's deadline, as the await is. Tried
        once, an outage between the domain's create and its claim's failed the create, the roll-back
        could not reach the server either, and the domain left behind made every later `pulumi up`
        fail with ObjectExists. (A create whose answer was lost but which was applied still reads as
        AlreadyExists on the next try: for the claim that is fine, it is owned by the domain.)"""
        poll = getattr(self, "poll", None) or await_.POLL
        delay, said = poll.initial_s, ""
        while True:
            try:
                with kube_errors.api_call(action):
                    return call()
            except api_errors.TemporaryError as exc:
                remaining = deadline.remaining()
                if remaining <= 0.0:
                    raise
                if str(exc) != said:  # once per kind of failure, not every try
                    said = str(exc)
                    self._on_progress()(f"{exc}; trying again until the timeout ({deadline.timeout_s:.0f} s)")
                deadline.clock.sleep(min(exc.delay_s or delay, remaining))
                delay = min(delay * poll.factor, poll.max_s)

    def _create_cd(self, client: Client, args: ComputeDomainArgs, spec: Mapping[str, Any],
                   created: list[tuple[str, Any, str]], deadline: Deadline) -> dict[str, Any]:
        ns, name = args.namespace, args.name
        ref = f"ComputeDomain {ns}/{name}"
        body = {"apiVersion": api.API_VERSION, "kind": api.KIND,
                "metadata": {"name": name, "namespace": ns, **({"labels": args.labels} if args.labels else {})},
                "spec": whole_numbers(dict(spec))}
        try:
            cd = self._retrying(deadline, f"create {ref}",
                                lambda: dict(_send(client, "post", CD, CD.from_dict(body), namespace=ns)))
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
                return dict(_send(client, "patch", CD, {"metadata": {"labels": args.labels}, "spec": dict(spec)},
                                  name=name, namespace=ns, headers={"Content-Type": PatchType.MERGE.value}))
        created.append(("ComputeDomain", CD, name))
        return cd

    def _ensure_claims(self, client: Client, cd: Mapping[str, Any], created: list[tuple[str, Any, str]],
                       deadline: Deadline, *, repair: bool = False) -> None:
        """Create the CD's channel claim (a MultiClique CD's, one per clique group). `repair`: an
        update, which recreates a claim deleted out of band, and fails (`ClaimDeleting`) on one
        that is being deleted but held by pods: no claim of its name can be made until they stop."""
        spec = ComputeDomainSpec.model_validate(cd.get("spec") or {})
        for group in range(spec.groups):
            claim = self._ensure_claim(client, cd, created, deadline, group)
            if repair and _meta(claim).get("deletionTimestamp"):
                raise errors.ClaimDeleting(claim_drift(client, cd) or "")

    def _ensure_claim(self, client: Client, cd: Mapping[str, Any], created: list[tuple[str, Any, str]],
                      deadline: Deadline, group: int = 0) -> dict[str, Any]:
        """Create one channel claim of the CD; an existing one is fine only if the CD owns it."""
        meta = _meta(cd)
        ns, name, uid = str(meta.get("namespace")), str(meta.get("name")), str(meta.get("uid"))
        body = channel_claim(name, ns, uid, ComputeDomainSpec.model_validate(cd.get("spec") or {}), group)
        claim_name = body["metadata"]["name"]
        ref = f"ResourceClaim {ns}/{claim_name}"
        try:
            claim: dict[str, Any] = self._retrying(deadline, f"create {ref}", lambda: _send(
                client, "post", ResourceClaim, ResourceClaim.from_dict(body), namespace=ns).to_dict())
        except api_errors.AlreadyExists:
            live = _get(client, ResourceClaim, claim_name, ns)
            if live is not None and owned_by(live, uid):
                return live
            raise errors.ObjectExists(
                f"{ref} already exists and does not belong to ComputeDomain {ns}/{name}, whose channel claim it "
                f"would be. Delete it if nothing uses it (kubectl delete resourceclaim -n {ns} {claim_name}), or "
                "give the ComputeDomain another claim name (spec.channelClaim.name) or another name") from None
        created.append(("ResourceClaim", ResourceClaim, claim_name))
        return claim

    def _wait_out_departing_users(self, client: Client, snap: Snapshot, deadline: Deadline) -> None:
        """Return once no pod uses the claim; wait while every user is on its way out (marked for
        deletion, or gone and only still listed in reservedFor), until `deadline`; refuse (`InUse`)
        while a user stays, once DEPARTING_SETTLE_S have given the garbage collector time to mark
        the pods of a workload deleted just before (BoundJob's Job and StatefulSet are deleted in
        the background and not awaited: see nvlfabric/components/workload.py)."""
        clock = getattr(self, "clock", None) or await_.SYSTEM_CLOCK
        settle = clock.monotonic() + DEPARTING_SETTLE_S
        poll = getattr(self, "poll", None) or await_.POLL
        delay, said = poll.initial_s, -1
        # On the nvidia backend the domain's "claim" is NVIDIA's ResourceClaimTemplate: its users
        # are the pods whose claims are made from it.
        template = snap.claim_kind == "ResourceClaimTemplate"
        while True:
            claim = None if template else _get(client, ResourceClaim, snap.claim_name, snap.namespace)
            with kube_errors.api_call(f"list pods in namespace {snap.namespace}"):
                pods = [p.to_dict() for p in client.list(Pod, namespace=snap.namespace)]
            users = claim_users(claim, pods, snap.claim_name,
                                ref_key="resourceClaimTemplateName" if template else "resourceClaimName")
            if not users:
                return
            live = {f"{_meta(p).get('namespace')}/{_meta(p).get('name')}": p for p in pods}
            staying = [u for u in users if u in live and not _meta(live[u]).get("deletionTimestamp")]
            if staying and clock.monotonic() >= settle:
                raise errors.InUse(in_use_message(snap.cd_ref, snap.claim_ref, staying))
            if deadline.expired():
                raise errors.AwaitTimeout(
                    awaited=f"the pods using {snap.claim_ref} to stop", seen=f"{len(users)} still there: "
                    + ", ".join(users[:MAX_NAMED_PODS]), last=snap, timeout_s=deadline.timeout_s)
            if not staying and len(users) != said:
                said = len(users)
                self._on_progress()(f"{snap.cd_ref}: waiting for {len(users)} pods using its channel to stop")
            clock.sleep(min(delay, deadline.remaining()))
            delay = min(delay * poll.factor, poll.max_s)

    def _observe(self, client: Client, ns: str, name: str, claim_name: str) -> Snapshot:
        crd, readable = None, True
        try:
            crd = _get(client, CustomResourceDefinition, api.CRD_NAME, None)
        except api_errors.Forbidden:
            readable = False
        return Snapshot(namespace=ns, name=name, claim_name=claim_name, crd=crd, crd_readable=readable,
                        cd=_get(client, CD, name, ns), claim=_get(client, ResourceClaim, claim_name, ns))

    def _await(self, client: Client, cd: Mapping[str, Any], level: AwaitFor, deadline: Deadline) -> dict[str, Any]:
        """Wait per the readiness table; returns the CD as last seen."""
        meta = _meta(cd)
        ns, name = str(meta.get("namespace")), str(meta.get("name"))
        claim_name = channel_claim_names(name, ComputeDomainSpec.model_validate(cd.get("spec") or {}))[0]
        if not await_.READINESS[level]:
            return dict(cd)
        snap = await_.wait(
            awaited=await_.awaited(Snapshot(namespace=ns, name=name, claim_name=claim_name), level),
            observe=lambda: self._observe(client, ns, name, claim_name),
            condition=await_.readiness(level), deadline=deadline,
            poll=getattr(self, "poll", None) or await_.POLL, on_progress=self._on_progress(),
            hint=("raise timeout_s, or set await_for='Accepted' to not wait for the members"
                  if level is AwaitFor.READY else ""),
        )
        assert snap.cd is not None  # the condition requires it
        return dict(snap.cd)

    def _roll_back(self, client: Client, ns: str, created: list[tuple[str, Any, str]], exc: Exception) -> None:
        """Delete what this create made (newest first), and say so on `exc`."""
        for kind, res, name in reversed(created):
            try:
                _delete(client, res, name, ns, action=f"roll back: delete {kind} {ns}/{name}")
            except api_errors.NvlfabricError as failed:
                exc.add_note(f"could not roll back: {kind} {ns}/{name} is left behind ({failed}); delete it with "
                             f"kubectl delete {kind.lower()} -n {ns} {name}")
            else:
                exc.add_note(f"rolled back: deleted {kind} {ns}/{name}")


# -- client helpers ----------------------------------------------------------------------------------


def _send(client: Client, method: str, res: Any, obj: Any, *, namespace: str, name: str | None = None,
          headers: dict[str, str] | None = None) -> Any:
    """A create or patch with `fieldValidation=Strict`, through lightkube's request layer (see module doc)."""
    return client._client.request(method, res=res, obj=obj, name=name, namespace=namespace, headers=headers,
                                  params={"fieldValidation": "Strict"})


def _get(client: Client, res: Any, name: str, namespace: str | None) -> dict[str, Any] | None:
    """The object as a plain dict, or None when it does not exist."""
    kind = getattr(res, "__name__", "object")
    where = f"{namespace}/{name}" if namespace else name
    try:
        with kube_errors.api_call(f"read {kind} {where}"):
            obj = client.get(res, name, namespace=namespace) if namespace else client.get(res, name)
    except api_errors.NotFound:
        return None
    return obj.to_dict() if hasattr(obj, "to_dict") else dict(obj)


def _delete(client: Client, res: Any, name: str, namespace: str, *, action: str) -> None:
    """Delete in the background (dependents by the garbage collector); already gone is fine."""
    try:
        with kube_errors.api_call(action):
            client.delete(res, name, namespace=namespace, cascade=CascadeType.BACKGROUND)
    except api_errors.NotFound:
        pass


def _parse(props: Mapping[str, Any]) -> ComputeDomainArgs:
    """The inputs as `ComputeDomainArgs`; invalid ones (never past `check`) fail as `check` would say."""
    try:
        return ComputeDomainArgs.model_validate(props)
    except ValidationError as exc:
        reasons = "; ".join(f"{f.property}: {f.reason}" for _, f in map(_failure, exc.errors()))
        raise errors.InvalidInputs(f"invalid ComputeDomain inputs: {reasons}") from None


def whole_numbers(value: Any) -> Any:
    """`value` with every whole float (Pulumi's numbers arrive as floats: numNodes 2.0) as an int.
    The API server takes 2.0 for an integer field but hands it to CEL as a double, and the spec's
    size rules (`numNodes <= 18`) then fail with "expected int, got float64"."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: whole_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [whole_numbers(v) for v in value]
    return value


def _claim_name(name: str, cd: Mapping[str, Any] | None, props: Mapping[str, Any]) -> str:
    """The CD's claim name: from state, else from the live spec, else the default."""
    if props.get("claim_name"):
        return str(props["claim_name"])
    return channel_claim_names(name, ComputeDomainSpec.model_validate((cd or {}).get("spec") or {}))[0]


def _claim_filter(cd_name: str, *, uid: str) -> Callable[[dict[str, Any] | None], dict[str, Any] | None]:
    """Keeps a claim only if it belongs to the CD (owned by its uid, or labelled with its name)."""

    def ours(claim: dict[str, Any] | None) -> dict[str, Any] | None:
        if claim is None:
            return None
        labelled = (_meta(claim).get("labels") or {}).get(COMPUTE_DOMAIN_LABEL) == cd_name
        return claim if labelled or (uid and owned_by(claim, uid)) else None

    return ours


def _split_id(id_: str, props: Mapping[str, Any]) -> tuple[str, str]:
    ns, _, name = id_.rpartition("/")
    return (ns or str(props.get("namespace") or "default")), (name or str(props.get("name")))


# -- the resource ------------------------------------------------------------------------------------


class ResourceInputs(TypedDict, total=False):
    """A ComputeDomain resource's inputs (the keyword arguments of both resource classes)."""

    name: Required[Input[str]]
    namespace: Input[str]
    backend: Input[str]
    spec: ComputeDomainSpec | NvidiaDomainSpec | Input[Mapping[str, Any]] | None
    labels: Input[Mapping[str, str]] | None
    await_for: AwaitFor | str | None
    timeout_s: Input[float]
    adopt: Input[bool]
    force_delete: Input[bool]


def resource_inputs(**inputs: Unpack[ResourceInputs]) -> dict[str, Any]:
    """The properties a ComputeDomain resource registers (inputs with their defaults, and its outputs
    as None), whoever serves its CRUD: the dynamic provider here, or nvlfabric's component provider
    for other languages (`nvlfabric.components.served`)."""
    spec = inputs.get("spec")
    labels = inputs.get("labels")
    await_for = inputs.get("await_for", AwaitFor.ACCEPTED)
    return {
        "name": inputs["name"],
        "namespace": inputs.get("namespace", "default"),
        "backend": inputs.get("backend", Backend.NVLFABRIC.value),
        "spec": _dump(spec) if isinstance(spec, ComputeDomainSpec) else spec.dump()
        if isinstance(spec, NvidiaDomainSpec) else spec if spec is not None else {},
        "labels": labels if labels is not None else {},
        # Python's None here means "do not wait" (a null input would mean the default).
        "await_for": str(await_for if await_for is not None else AwaitFor.NONE),
        "timeout_s": inputs.get("timeout_s", DEFAULT_TIMEOUT_S),
        "adopt": inputs.get("adopt", False),
        "force_delete": inputs.get("force_delete", False),
        **dict.fromkeys(OUTPUT_KEYS),
    }


class ComputeDomainOutputs:
    """What a ComputeDomain resource outputs, whichever class registered it."""

    name: Output[str]
    namespace: Output[str]
    spec: Output[dict[str, Any]]
    labels: Output[dict[str, str]]
    uid: Output[str]
    claim_name: Output[str]
    phase: Output[str]
    clique: Output[str | None]
    channel: Output[int | None]
    nodes: Output[list[dict[str, Any]]]
    ready_nodes: Output[int]
    total_nodes: Output[int]
    claim_drift: Output[str | None]
    """Set by a refresh when a channel claim was deleted outside the stack (see `claim_drift`)."""


class ComputeDomain(Resource, ComputeDomainOutputs, module="nvlfabric", name="ComputeDomain"):
    """An nvlfabric ComputeDomain and its shared channel claim, managed by `ComputeDomainProvider`.

    Pods join it by listing `claim_name` in `spec.resourceClaims[].resourceClaimName`.
    """

    def __init__(self, resource_name: str, opts: ResourceOptions | None = None,
                 **inputs: Unpack[ResourceInputs]) -> None:
        super().__init__(ComputeDomainProvider(), resource_name, resource_inputs(**inputs), opts)
