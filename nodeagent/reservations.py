"""Reserve a domain's shared channel claim for its pending pods, many in one write.

Why: kube-scheduler adds each pod to a claim's `status.reservedFor` in PreBind, one GET + PUT per
pod from the pod's own binding goroutine. The pods of one Job bind together, race on the one
shared channel claim, lose with 409 Conflict five times in a row and wait out the pod back-off
(docs/architecture.md, "Many pods on one claim start slowly"). A pod that is already in
`reservedFor` skips that write. So once a channel claim is allocated (its first pod scheduled),
this adds every pending pod that uses the claim to `reservedFor` in one JSON patch of the claim's
status: a `test` of `metadata.uid` (only the claim we looked at) and one `add` at the end of the
list per pod. Appending needs no resourceVersion, so the scheduler's own writes do not make it
conflict; when the scheduler reserved one of the pods meanwhile the API server refuses the
duplicate, and the pass reads the claim again and retries. Not a strategic-merge patch, though
`reservedFor` merges by UID: the API server turns the claim into a map and back for one, which
re-orders the keys of the opaque channel config in `status.allocation`, and the unchanged
allocation then fails validation as "field cannot be modified once set" (1.37).

What is safe to reserve: a pod in the claim's namespace that names the claim in
`spec.resourceClaims[].resourceClaimName`, is not yet bound to a node, is not being deleted and
has not finished. kube-controller-manager's resourceclaim controller keeps the entry of a pod
that exists and removes it when the pod is deleted or done, as it does for the scheduler's own.
At most 256 entries (the API's `ResourceClaimReservedForMaxSize`); pods beyond that are left to
the scheduler, which would refuse them anyway until a reservation frees. A claim whose
`reservedFor` is empty is left alone: it is about to be deallocated.

Only channel claims are touched: claims whose allocation came from nvlfabric's clique pools.

The watches: unbound pods (field selector `spec.nodeName=`, so a busy cluster's running pods
cost nothing) and resource claims; every change marks its claim for a pass, and a short pause
before each pass lets a Job controller's burst of pod creations go out as one patch.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lightkube import ApiError, Client
from lightkube.models import resource_v1 as models
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import ResourceClaim
from lightkube.types import PatchType

log = logging.getLogger("nvlfabric.reservations")

MAX_RESERVED = 256
"""resource.k8s.io: a claim's `status.reservedFor` holds at most this many consumers."""
COALESCE_S = 0.05
"""Pause before a pass, so pod creations arriving together become one patch."""


@dataclass(frozen=True)
class PendingPod:
    """An unbound pod, as reservation needs it."""

    namespace: str
    name: str
    uid: str
    claims: frozenset[str]  # the resourceClaimName values of spec.resourceClaims


def pending_pod(pod: Mapping[str, Any]) -> PendingPod | None:
    """The pod as a reservation candidate, or None when it must not be reserved ahead: bound to a
    node already (the scheduler has done its part), being deleted, finished, or naming no claim."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    if spec.get("nodeName") or meta.get("deletionTimestamp") or status.get("phase") in ("Succeeded", "Failed"):
        return None
    claims = frozenset(c["resourceClaimName"] for c in spec.get("resourceClaims") or [] if c.get("resourceClaimName"))
    if not claims or not meta.get("uid"):
        return None
    return PendingPod(meta.get("namespace") or "default", meta["name"], meta["uid"], claims)


def to_reserve(namespace: str, claim: str, reserved: Sequence[str], pods: Iterable[PendingPod],
               limit: int = MAX_RESERVED) -> list[PendingPod]:
    """The pods to add to claim `namespace/claim`'s reservedFor (pure): those using the claim and
    not reserved yet, oldest name first, no more than the room left under `limit`."""
    have = set(reserved)
    room = max(0, limit - len(have))
    out = sorted((p for p in pods if p.namespace == namespace and claim in p.claims and p.uid not in have),
                 key=lambda p: (p.name, p.uid))
    unique = list({p.uid: p for p in out}.values())
    return unique[:room]


def reservation_patch(claim_uid: str, pods: Sequence[PendingPod]) -> list[dict[str, Any]]:
    """A JSON patch of the claim's status appending `pods` to a non-empty `reservedFor`, applied
    only while the claim still has `claim_uid`."""
    return [{"op": "test", "path": "/metadata/uid", "value": claim_uid},
            *({"op": "add", "path": "/status/reservedFor/-",
               "value": {"resource": "pods", "name": p.name, "uid": p.uid}} for p in pods)]


@dataclass
class _Claim:
    uid: str
    reserved: list[str]


def _claim_state(claim: models.ResourceClaim, driver: str) -> _Claim | None:
    """The claim when it is an allocated channel claim (allocated by `driver`), else None."""
    st = claim.status
    if claim.metadata is None or st is None or st.allocation is None or st.allocation.devices is None:
        return None
    if not any(r.driver == driver for r in st.allocation.devices.results or []):
        return None
    return _Claim(claim.metadata.uid or "", [r.uid for r in st.reservedFor or []])


class Reserver:
    """Watches unbound pods and channel claims; reserves each allocated claim for its pods."""

    def __init__(self, client: Client, driver: str, *, coalesce_s: float = COALESCE_S) -> None:
        self.client, self.driver, self.coalesce_s = client, driver, coalesce_s
        self._lock = threading.Condition()
        self._pods: dict[str, PendingPod] = {}  # by uid
        self._claims: dict[tuple[str, str], _Claim] = {}  # allocated channel claims by (namespace, name)
        self._dirty: set[tuple[str, str]] = set()
        self.patches = 0  # status patches written (tests and logs)
        self.reserved = 0  # pods reserved ahead

    # -- watches -------------------------------------------------------------------------------

    def _pod_event(self, kind: str, obj: Pod) -> None:
        raw = obj.to_dict()
        uid = (raw.get("metadata") or {}).get("uid", "")
        pod = None if kind == "DELETED" else pending_pod(raw)
        with self._lock:
            if pod is None:
                self._pods.pop(uid, None)
                return
            self._pods[uid] = pod
            self._dirty.update((pod.namespace, c) for c in pod.claims if (pod.namespace, c) in self._claims)
            self._lock.notify()

    def _claim_event(self, kind: str, obj: ResourceClaim) -> None:
        if obj.metadata is None:
            return
        key = (obj.metadata.namespace or "default", obj.metadata.name or "")
        state = None if kind == "DELETED" else _claim_state(obj, self.driver)
        with self._lock:
            if state is None:
                self._claims.pop(key, None)
                return
            self._claims[key] = state
            self._dirty.add(key)
            self._lock.notify()

    def _follow(self, res: Any, on_event: Callable[[str, Any], None], reset: Callable[[], None],
                stop: Callable[[], bool], **selector: Any) -> None:
        """List, then watch from the list's resourceVersion; after any error, list again."""
        while not stop():
            try:
                listing = self.client.list(res, namespace="*", **selector)
                items = list(listing)
                reset()
                for obj in items:
                    on_event("ADDED", obj)
                for kind, obj in self.client.watch(res, namespace="*", resource_version=listing.resourceVersion,
                                                   server_timeout=60, **selector):
                    if stop():
                        return
                    on_event(kind, obj)
            except Exception as exc:  # a watch that fails is re-listed, never fatal
                log.debug("watch of %s ended: %s; listing again", res.__name__, exc)
                time.sleep(1.0)

    def _reset_pods(self) -> None:
        with self._lock:
            self._pods.clear()

    def _reset_claims(self) -> None:
        with self._lock:
            self._claims.clear()

    # -- passes --------------------------------------------------------------------------------

    def pass_once(self) -> None:
        """Reserve every dirty claim for its pending pods (what the worker does after each pause)."""
        with self._lock:
            dirty, self._dirty = self._dirty, set()
        for key in sorted(dirty):
            self._reserve(*key)

    def _plan(self, key: tuple[str, str]) -> tuple[_Claim, list[PendingPod]] | None:
        with self._lock:
            claim = self._claims.get(key)
            if claim is None or not claim.reserved:
                return None
            return claim, to_reserve(*key, claim.reserved, self._pods.values())

    def _reserve(self, namespace: str, name: str, attempts: int = 3) -> None:
        key = (namespace, name)
        for attempt in range(attempts):
            plan = self._plan(key)
            if plan is None or not plan[1]:
                return
            claim, pods = plan
            try:
                out = self.client.patch(ResourceClaim.Status, name, reservation_patch(claim.uid, pods),
                                        namespace=namespace, patch_type=PatchType.JSON)
            except ApiError as exc:
                # 422: the scheduler reserved one of the pods meanwhile, the list is full, or the
                # claim was replaced; 404: it is gone. Read it again and retry with the truth.
                log.info("claim %s/%s: reserving %d pods ahead failed (attempt %d): %s", namespace, name, len(pods),
                         attempt + 1, exc.status.message)
                self._refresh(key)
                continue
            self._store(key, out)
            self.patches += 1
            self.reserved += len(pods)
            log.info("claim %s/%s: reserved for %d pending pods ahead of the scheduler", namespace, name, len(pods))
            return

    def _refresh(self, key: tuple[str, str]) -> None:
        try:
            self._store(key, self.client.get(ResourceClaim, key[1], namespace=key[0]))
        except ApiError as exc:
            if exc.status.code != 404:
                raise
            with self._lock:
                self._claims.pop(key, None)

    def _store(self, key: tuple[str, str], claim: models.ResourceClaim) -> None:
        state = _claim_state(claim, self.driver)
        with self._lock:
            if state is None:
                self._claims.pop(key, None)
            else:
                self._claims[key] = state

    def run(self, stop: Callable[[], bool]) -> None:
        """Both watches in threads of their own; passes here until `stop()`."""
        for res, handler, reset, selector in (
                (Pod, self._pod_event, self._reset_pods, {"fields": {"spec.nodeName": ""}}),
                (ResourceClaim, self._claim_event, self._reset_claims, {})):
            threading.Thread(target=self._follow, args=(res, handler, reset, stop), kwargs=selector,
                             name=f"watch-{res.__name__}", daemon=True).start()
        while not stop():
            with self._lock:
                if not self._dirty:
                    self._lock.wait(timeout=1.0)
                    continue
            time.sleep(self.coalesce_s)
            try:
                self.pass_once()
            except Exception:  # one failed pass must not end reservation
                log.exception("reservation pass failed")
