"""A ComputeDomain resource's inputs, whichever backend serves it: checks, and the parts of a diff they share.

Each backend has its own pydantic model of the inputs (its `spec` differs); what is common is here:

- the keys, limits and defaults both share (`OUTPUT_KEYS`, `SETTINGS`, `DEFAULT_TIMEOUT_S`, the field
  types `DomainName`, `Namespace` and `TimeoutS`), which the ComputeDomain component's arguments take
  too, and which backend inputs or a state name (`backend_of`);
- Pulumi's "unknown during preview" values (`is_unknown`, `contains_unknown`), which are never judged;
- `check`: validate with the backend's model, name each failure's property path (`spec.imexMode`,
  `labels["a/b"]`) and its fix, pass through what is unknown (or depends on it) unjudged, and
  return the inputs normalised; `parse` for calls whose inputs never went through `check`;
- for diffs: the identity fields that are replaces on both backends (`renamed`), whether the
  labels or the provider settings change (`labels_or_settings_changed`), and whether a
  replacement reuses a name, so that the old object must go first (`reuses_a_name`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Annotated, Any, Final, Protocol, TypeVar

from pulumi.dynamic import CheckFailure, CheckResult
from pulumi.runtime.rpc import UNKNOWN
from pydantic import Field, ValidationError
from pydantic_core import ErrorDetails

from nvlfabric.api import computedomain as api
from nvlfabric.api import names
from nvlfabric.api.nvidia import Backend
from nvlfabric.provider import errors
from nvlfabric.provider.await_ import AwaitFor

#: Ten minutes, as pulumi-kubernetes: long enough for a Dedicated IMEX domain's cold start.
DEFAULT_TIMEOUT_S: Final = 600.0
DomainName = Annotated[str, Field(pattern=names.DNS_LABEL, max_length=names.DNS_LABEL_MAX)]
"""A ComputeDomain's name: a DNS label, as its CRD's `metadata.name` (api.computedomain.ObjectMeta)."""
Namespace = Annotated[str, Field(pattern=names.DNS_LABEL, max_length=names.DNS_LABEL_MAX)]
"""The namespace of a ComputeDomain, its claims and its pods (a DNS label)."""
TimeoutS = Annotated[float, Field(gt=0)]
"""Seconds a create, update or delete may take (`timeout_s`, default DEFAULT_TIMEOUT_S)."""
OUTPUT_KEYS: Final = ("uid", "claim_name", "phase", "clique", "channel", "nodes", "ready_nodes", "total_nodes",
                      "claim_drift")
#: The provider's own settings (not in the cluster: they come from the state) and their defaults.
SETTINGS: Final[Mapping[str, Any]] = {"await_for": AwaitFor.ACCEPTED.value, "timeout_s": DEFAULT_TIMEOUT_S,
                                      "adopt": False, "force_delete": False}

Loc = tuple[str, ...]
Allowed = Mapping[str, list[str]]
"""The properties allowed under each path ("" the top, "spec", "spec.channelClaim"), for the
message about an unknown one."""

_LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS_SUBDOMAIN = re.compile(names.DNS_SUBDOMAIN)

FIXES: Final[Mapping[str, str]] = {
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
"""The fix each failure names, by property path (or its first part); the same on both backends."""


class Args(Protocol):
    """What a backend's input model gives once valid."""

    @property
    def labels(self) -> dict[str, str]: ...

    def to_inputs(self) -> dict[str, Any]:
        """The normalised inputs (API names, defaults filled, no nulls)."""
        ...


A = TypeVar("A")


# -- unknown values ----------------------------------------------------------------------------------


def is_unknown(value: Any) -> bool:
    """True for Pulumi's "unknown during preview" sentinel."""
    return isinstance(value, str) and value == UNKNOWN


def _unknown_paths(value: Any, path: Loc = ()) -> Iterable[Loc]:
    if is_unknown(value):
        yield path
    elif isinstance(value, Mapping):
        for key, sub in value.items():
            yield from _unknown_paths(sub, (*path, str(key)))
    elif isinstance(value, list):
        for i, sub in enumerate(value):
            yield from _unknown_paths(sub, (*path, str(i)))


def contains_unknown(value: Any) -> bool:
    return any(True for _ in _unknown_paths(value))


# -- check -------------------------------------------------------------------------------------------


def user_props(props: Mapping[str, Any]) -> dict[str, Any]:
    """The inputs a user sets: no `__provider`, no output placeholders, no nulls (meaning: the default)."""
    return {k: v for k, v in props.items() if not k.startswith("__") and k not in OUTPUT_KEYS and v is not None}


def backend_of(props: Mapping[str, Any]) -> str:
    """The backend the inputs (or the state) name; absent means nvlfabric (state from before backends)."""
    return str(props.get("backend") or Backend.NVLFABRIC.value)


def split_id(id_: str, props: Mapping[str, Any]) -> tuple[str, str]:
    """(namespace, name) of a resource id `namespace/name`, else of the state."""
    ns, _, name = id_.rpartition("/")
    return (ns or str(props.get("namespace") or "default")), (name or str(props.get("name")))


def prop(loc: Loc) -> str:
    """A property path as Pulumi shows it: `spec.placement.clique`, `labels["example.com/team"]`."""
    if len(loc) == 2 and loc[0] == "labels":
        return f'labels["{loc[1]}"]'
    return ".".join(loc)


def failure(err: ErrorDetails, allowed: Allowed) -> tuple[Loc, CheckFailure]:
    """One validation error as a failure that names its property and the fix."""
    loc = tuple(str(p) for p in err["loc"])
    path = prop(loc)
    message = err["msg"].removeprefix("Value error, ")
    if api.ALL_NEEDS_DEDICATED_MESSAGE in message:  # the spec's cross-field rule names its own fix
        return loc, CheckFailure("spec.channelAllocationMode", api.ALL_NEEDS_DEDICATED_MESSAGE)
    if err["type"] == "literal_error" and loc == ("backend",):  # the other backend's model judges it
        return loc, CheckFailure("backend", f"unknown backend {err.get('input')!r}: {FIXES['backend']}")
    if err["type"] == "extra_forbidden":
        allowed_here = ", ".join(allowed.get(".".join(loc[:-1]), []))
        return loc, CheckFailure(path, f"unknown property {path}"
                                 + (f"; allowed here: {allowed_here}" if allowed_here else ""))
    if err["type"] == "missing":
        return loc, CheckFailure(path, f"{path} is required" + (f": {FIXES[path]}" if path in FIXES else ""))
    fix = FIXES.get(path) or FIXES.get(loc[0] if loc else "", "")
    return loc, CheckFailure(path or "(inputs)", f"{message}: {fix}" if fix else message)


def label_failures(labels: Mapping[str, str]) -> list[tuple[Loc, CheckFailure]]:
    """Label keys and values the API server would refuse."""
    failures: list[tuple[Loc, CheckFailure]] = []
    for key, value in labels.items():
        prefix, _, name = key.rpartition("/")
        loc = ("labels", key)
        if (prefix and (len(prefix) > names.DNS_SUBDOMAIN_MAX or not _DNS_SUBDOMAIN.match(prefix))) or (
                len(name) > 63 or not _LABEL_NAME.match(name)):
            failures.append((loc, CheckFailure(prop(loc), (
                f"invalid label key {key!r}: use an optional DNS-subdomain prefix and '/', then at most 63 "
                "letters, digits, '-', '_' or '.', starting and ending with a letter or digit, e.g. 'team' or "
                "'example.com/team'"))))
        if value and (len(value) > 63 or not _LABEL_NAME.match(value)):
            failures.append((loc, CheckFailure(prop(loc), (
                f"invalid label value {value!r}: use at most 63 letters, digits, '-', '_' or '.', starting and "
                "ending with a letter or digit (or an empty string)"))))
    return failures


def check(news: Mapping[str, Any], model: Callable[[Mapping[str, Any]], Args], allowed: Allowed) -> CheckResult:
    """Validate and normalise inputs with the backend's model (`model`: its `model_validate`;
    `allowed`: its properties, for an unknown one); what is unknown (or depends on it) is passed
    through unjudged."""
    props = user_props(news)
    unknown = list(_unknown_paths(props))

    def judged(found: Iterable[tuple[Loc, CheckFailure]]) -> list[CheckFailure]:
        # A failure at or under an unknown value, or of a whole that contains one, cannot be decided yet.
        return [f for loc, f in found if not any(loc[: len(u)] == u or u[: len(loc)] == loc for u in unknown)]

    try:
        args = model(props)
    except ValidationError as exc:
        return CheckResult(dict(news), judged(failure(e, allowed) for e in exc.errors()))
    failures = judged(label_failures(args.labels))
    if failures or unknown:
        return CheckResult(dict(news), failures)
    return CheckResult({**{k: v for k, v in news.items() if k.startswith("__")}, **args.to_inputs()}, [])


def parse(props: Mapping[str, Any], model: Callable[[Mapping[str, Any]], A], allowed: Allowed) -> A:
    """The inputs as the backend's model (`model`: its `model_validate`); invalid ones (never past
    `check`) fail as `check` would say."""
    try:
        return model(props)
    except ValidationError as exc:
        reasons = "; ".join(f"{f.property}: {f.reason}" for _, f in (failure(e, allowed) for e in exc.errors()))
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


# -- diff --------------------------------------------------------------------------------------------


def renamed(olds: Mapping[str, Any], news: Mapping[str, Any]) -> list[str]:
    """The identity fields (`namespace`, `name`) that change or are unknown: replaces on every backend."""
    return [key for key, default in (("namespace", "default"), ("name", None))
            if is_unknown(news.get(key, default)) or news.get(key, default) != olds.get(key, default)]


def labels_or_settings_changed(olds: Mapping[str, Any], news: Mapping[str, Any]) -> bool:
    """Whether the labels (unknown ones count as changed) or the provider settings change: updates."""
    new_labels = news.get("labels") or {}
    labels_changed = contains_unknown(new_labels) or dict(olds.get("labels") or {}) != dict(new_labels)
    return labels_changed or any(news.get(k, d) != olds.get(k, d) for k, d in SETTINGS.items())


def claim_name_of(props: Mapping[str, Any], claim_name: Callable[[str, Mapping[str, Any]], str]) -> str | None:
    """The name of the domain's claim (or claim template) by the backend's `claim_name(name, spec)`;
    None while the name or the spec is unknown, or when the spec does not validate."""
    name, spec = props.get("name"), props.get("spec")
    if not isinstance(name, str) or is_unknown(name) or contains_unknown(spec):
        return None
    try:
        return claim_name(name, spec or {})
    except ValidationError:
        return None


def reuses_a_name(olds: Mapping[str, Any], news: Mapping[str, Any],
                  claim_name: Callable[[str, Mapping[str, Any]], str]) -> bool:
    """Whether a replacement would reuse the domain's or its claim's name (then the old must go
    first); whatever is unknown is taken to."""
    new_claim = claim_name_of(news, claim_name)
    if is_unknown(news.get("namespace")) or is_unknown(news.get("name")) or new_claim is None:
        return True
    if news.get("namespace", "default") != olds.get("namespace", "default"):
        return False
    return news.get("name") == olds.get("name") or new_claim == (olds.get("claim_name")
                                                                   or claim_name_of(olds, claim_name))
