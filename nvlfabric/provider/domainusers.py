"""Who uses a ComputeDomain's channel, and delete's wait for them to go (both backends).

A domain's users are the pods that its channel claim is reserved for, or that reference it and
have not finished; on the nvidia backend the domain's "claim" is NVIDIA's ResourceClaimTemplate,
and its users are the pods whose claims are made from it. Delete refuses (`InUse`, naming up to
MAX_NAMED_PODS of them) while a user stays, and waits while every one is on its way out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from lightkube import Client
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import ResourceClaim

from nvlfabric.kube import errors as kube_errors
from nvlfabric.provider import errors
from nvlfabric.provider.await_ import Condition, Deadline, Seen, Snapshot
from nvlfabric.provider.backend import Context
from nvlfabric.provider.domainclient import get, meta

#: How many pods an "in use" error names.
MAX_NAMED_PODS: Final = 5
DEPARTING_SETTLE_S: Final = 10.0
"""How long delete waits for the users of a channel to be marked for deletion (the garbage
collector does that for the pods of a workload deleted just before the domain) before a pod that
is not refuses it."""


def claim_users(claim: Mapping[str, Any] | None, pods: Iterable[Mapping[str, Any]], claim_name: str, *,
                ref_key: str = "resourceClaimName") -> list[str]:
    """'namespace/name' of the pods using the claim: reserved for, or referencing it and not finished
    (`ref_key` resourceClaimTemplateName: the pods whose claims are made from the template of that name)."""
    users = [f"{meta(claim).get('namespace')}/{ref.get('name')}"
             for ref in ((claim or {}).get("status") or {}).get("reservedFor") or []
             if ref.get("resource") == "pods"]
    for pod in pods:
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue  # a finished pod holds no channel
        refs = (pod.get("spec") or {}).get("resourceClaims") or []
        if any(r.get(ref_key) == claim_name for r in refs):
            users.append(f"{meta(pod).get('namespace')}/{meta(pod).get('name')}")
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


def pods_in(client: Client, namespace: str) -> list[dict[str, Any]]:
    """The namespace's pods, as plain dicts."""
    with kube_errors.api_call(f"list pods in namespace {namespace}"):
        return [p.to_dict() for p in client.list(Pod, namespace=namespace)]


@dataclass(frozen=True)
class Users:
    """One look at a channel's users ('namespace/name'): all of them, and those not on their way out."""

    all: list[str]
    staying: list[str]


def wait_out_departing_users(ctx: Context, client: Client, snap: Snapshot, deadline: Deadline) -> None:
    """Return once no pod uses the claim; wait while every user is on its way out (marked for
    deletion, or gone and only still listed in reservedFor), until `deadline`; refuse (`InUse`)
    while a user stays, once DEPARTING_SETTLE_S have given the garbage collector time to mark
    the pods of a workload deleted just before (BoundJob's Job and StatefulSet are deleted in
    the background and not awaited: see nvlfabric/components/workloadmanifests.py, NOT_AWAITED)."""
    settled_at = ctx.clock.monotonic() + DEPARTING_SETTLE_S
    template = snap.claim_kind == "ResourceClaimTemplate"

    def observe() -> Users:
        claim = None if template else get(client, ResourceClaim, snap.claim_name, snap.namespace)
        pods = pods_in(client, snap.namespace)
        users = claim_users(claim, pods, snap.claim_name,
                            ref_key="resourceClaimTemplateName" if template else "resourceClaimName")
        live = {f"{meta(p).get('namespace')}/{meta(p).get('name')}": p for p in pods}
        return Users(users, [u for u in users if u in live and not meta(live[u]).get("deletionTimestamp")])

    def check(users: Users) -> Seen:
        if not users.all:
            return Seen(True, "no pod uses it")
        if users.staying and ctx.clock.monotonic() >= settled_at:
            message = in_use_message(snap.cd_ref, snap.claim_ref, users.staying)
            return Seen(False, message, fatal=True, error=errors.InUse(message))
        # Progress only while every user is departing (a staying one may yet be refused), and not
        # once the deadline has passed: then the timeout says it.
        quiet = bool(users.staying) or deadline.expired()
        return Seen(False, f"{len(users.all)} still there: " + ", ".join(users.all[:MAX_NAMED_PODS]),
                    progress="" if quiet else
                    f"{snap.cd_ref}: waiting for {len(users.all)} pods using its channel to stop")

    # An API error while looking ends the delete at once, as it always has (retried=()).
    ctx.wait(awaited=f"the pods using {snap.claim_ref} to stop", observe=observe,
             condition=Condition("no pod uses the channel", check), deadline=deadline, retried=())
