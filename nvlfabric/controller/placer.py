"""Placement as a service: which clique a channel claim's group goes to, decided before any of its
pods is scheduled (the rules are placement.py's, pure; the why: docs/architecture.md, "Placement
by fit").

Two callers, one placement at a time (`Placer._placing`), so neither counts room the other just
took:
- the reservation pass (reservations.py), for a claim whose group is complete and wholly gated:
  its pioneer's gate then lifts with `nodeSelector` pinning it to the chosen clique;
- Kueue admission (admission.py, `Placer.admit`), for a job whose pods do not exist yet: the room
  is held for them (reservationplan.ADMITTED_HOLD_S).
A job of several claims (a MultiClique domain's groups) gets a clique per claim, all at once or
none. No room: the pods stay gated, and a Warning Event `NoCliqueRoom` on the claim and its first
pod says why (`NoRoomEvents`). Of the reservation machinery this reads only its state
(reservationstate.py): it writes no reservation and lifts no gate, so admission, and next
node-loss replacements, place without the writer.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lightkube import Client

from nvlfabric.api import computedomain as api
from nvlfabric.api import errors
from nvlfabric.controller import placement
from nvlfabric.controller.cache import Informers, cluster_use
from nvlfabric.controller.events import event
from nvlfabric.controller.reservationplan import ClaimState, Key, complete, group_of, stale_admissions
from nvlfabric.controller.reservationstate import ReservationState

log = logging.getLogger("nvlfabric.reservations")

NO_ROOM_EVENT_S = 60.0
"""How often the same no-room Event is repeated for one claim (or Kueue workload, admission.py)."""

Job = tuple[list[placement.Group], set[str], list[Key]]
"""A job to place: its groups to place together, the cliques its other groups hold already, its claims."""


class Placer:
    def __init__(self, client: Client, state: ReservationState, cache: Informers, *, channels_per_clique: int,
                 imex_modes: frozenset[str]) -> None:
        self.client, self.state, self.cache = client, state, cache
        self.channels_per_clique = channels_per_clique
        self.imex_modes = imex_modes
        """A claim of another mode is never placed nor let through: no node would prepare it, and
        its allocation would hold a channel for nothing (its domain is Failed, feasibility.py)."""
        self._admitted: dict[Key, tuple[placement.Reserved, float]] = {}
        """Groups placed at admission, before any of their pods exists: the room they hold, since when."""
        self._placing = threading.Lock()  # one placement at a time: the reservation passes' and admissions
        self.no_room = NoRoomEvents(client, state)
        cache.claims.listen(lambda kind, key, old, new: self.no_room.forget(key) if new is None else None)

    def place(self, keys: Sequence[Key]) -> None:
        """Choose a clique for each claim whose group is complete and still wholly gated; a job of
        several claims gets one clique per claim, all at once or none."""
        with self._placing:
            self._place_now(keys)

    def _place_now(self, keys: Sequence[Key]) -> None:
        state, now = self.state, time.monotonic()
        with state.lock:
            for key in [k for k, st in state.claims.items() if k in state.placed and st.allocated
                        and not state.pods.users(k)]:
                del state.placed[key]  # all its pods are bound: their nodes count them now
                self._admitted.pop(key, None)
            jobs = jobs_to_place(keys, state.claims, state.placed, lambda k: self._waiting(k, now))
            tolerations = {id(groups): [dict(t) for t in min(
                (p for k in job_keys for p in state.pods.users(k)), key=lambda p: (p.created, p.name)).tolerations]
                for groups, _, job_keys in jobs}
            held, channels = self._held(), channels_left(state.claims, state.placed, self.channels_per_clique)
        if not jobs:
            return
        try:
            nodes, used = cluster_use(self.cache)
        except errors.ApiStatusError as exc:
            log.warning("%s; placing at the next pass", exc)
            return
        rooms_for: dict[str, list[placement.NodeRoom]] = {}  # jobs of the same tolerations share them
        for groups, taken, _ in jobs:
            tolerated = tolerations[id(groups)]
            if (same := repr(tolerated)) not in rooms_for:
                rooms_for[same] = placement.rooms_of(nodes, used, tolerated)
            rooms = rooms_for[same]
            free = {c: channels.get(c, self.channels_per_clique) for c in {r.clique for r in rooms}}
            got = placement.place(groups, rooms, free, held, exclude=taken)
            if isinstance(got, placement.NoRoom):
                for g in groups:
                    self.no_room.say(g.key, got)
                continue
            for g in groups:
                clique = got[g.key]
                held.append(placement.Reserved(clique, g.pods, g.gpus_per_pod))
                channels[clique] = free[clique] = free[clique] - 1
                with state.lock:
                    state.placed[g.key] = clique
                    self.no_room.forget(g.key)
                    state.dirty.add(g.key)
                log.info("claim %s/%s: %d pods x %d GPUs placed in clique %s", *g.key, g.pods, g.gpus_per_pod,
                         clique)

    def admit(self, groups: Sequence[placement.Group],
              tolerations: Sequence[Mapping[str, str]] = ()) -> dict[Key, str] | placement.NoRoom | str:
        """Place a job before its pods exist (a Kueue workload's pod sets, controller/admission.py):
        each group (its claim's key, pods, GPUs per pod, node selector) gets a clique with room and a
        free channel, all at once or none, and holds that room until its pods come. A group whose
        claim is allocated already (its domain kept it through a restart) keeps its clique. Returns
        the cliques, why there is no room, or (a str) why it cannot be judged yet."""
        state = self.state
        with self._placing:  # the whole of it: no pass places meanwhile on the same snapshot
            with state.lock:
                missing = [f"{k[0]}/{k[1]}" for k in (g.key for g in groups) if k not in state.claims]
                if missing:
                    return f"channel claim {missing[0]} does not exist (yet)"
                # A domain pinned to a clique (placement.clique) keeps its groups there.
                groups = [dataclasses.replace(g, clique=state.claims[g.key].pinned or g.clique) for g in groups]
                done = {g.key: c for g in groups
                        if (c := state.placed.get(g.key) or (state.claims[g.key].clique
                                                             if state.claims[g.key].allocated else None))}
                todo = [g for g in groups if g.key not in done]
                held, channels = self._held(), channels_left(state.claims, state.placed, self.channels_per_clique)
            if not todo:
                return done
            try:
                nodes, used = cluster_use(self.cache)
            except errors.ApiStatusError as exc:
                return str(exc)
            rooms = placement.rooms_of(nodes, used, [dict(t) for t in tolerations])
            free = {c: channels.get(c, self.channels_per_clique) for c in {r.clique for r in rooms}}
            got = placement.place(todo, rooms, free, held, exclude=set(done.values()))
            if isinstance(got, placement.NoRoom):
                return got
            now = time.monotonic()
            with state.lock:
                for g in todo:
                    state.placed[g.key] = got[g.key]
                    self._admitted[g.key] = (placement.Reserved(got[g.key], g.pods, g.gpus_per_pod), now)
                    log.info("claim %s/%s: %d pods x %d GPUs placed in clique %s at admission", *g.key, g.pods,
                             g.gpus_per_pod, got[g.key])
            return {**done, **got}

    def joiners(self, releases: Sequence[tuple[Any, str | None]]) -> list[tuple[Any, str | None]]:
        """Of the gates about to lift, those of pods joining a domain already placed and running (a
        replacement of a lost member, a domain grown) only where their clique has a node for them,
        spares included: a lifted pod with no node would wait Pending, and a pod that names an
        allocated claim cannot go anywhere else. The others stay gated, holding no GPU, with a
        Warning Event `WaitingForNode` on them and on their claim; every pass looks again."""
        state = self.state
        out: list[tuple[Any, str | None]] = []
        joining: dict[Key, list[Any]] = {}
        with state.lock:
            for p, clique in releases:
                key = next(((p.namespace, c) for c in sorted(p.claims) if (p.namespace, c) not in state.placed
                            and (st := state.claims.get((p.namespace, c))) is not None and st.allocated and st.ours
                            and st.clique), None)
                if clique is not None or key is None or p.gpus <= 0:
                    out.append((p, clique))
                else:
                    joining.setdefault(key, []).append(p)
            inflight = {k: sum(1 for u in state.pods.users(k) if not u.gated) for k in joining}
            cliques = {k: state.claims[k].clique for k in joining}
        if not joining:
            return out
        try:
            nodes, used = cluster_use(self.cache)
        except errors.ApiStatusError as exc:
            log.warning("%s; joining pods wait for the next pass", exc)
            return out
        for key, pods in sorted(joining.items()):
            pods.sort(key=lambda p: (p.created, p.name))
            first = pods[0]
            rooms = [r for r in placement.rooms_of(nodes, used, [dict(t) for t in first.tolerations])
                     if r.clique == cliques[key]]
            left = placement.slots(rooms, first.gpus, dict(first.node_selector)) - inflight[key]
            out.extend((p, None) for p in pods[:max(0, left)])
            for p in pods[max(0, left):]:
                self.no_room.waiting(key, p, str(cliques[key]))
        return out

    def is_channel_claim(self, namespace: str, name: str) -> bool:
        """Whether claim namespace/name is a ComputeDomain's channel claim (as the claim watch shows it)."""
        with self.state.lock:
            claim = self.state.claims.get((namespace, name))
            return claim is not None and bool(claim.job) and claim.domain is not None

    def _held(self) -> list[placement.Reserved]:
        """Room the placed claims' pending pods still need (call with the lock held): bound pods
        are counted on their nodes already; a group placed at admission whose pods do not exist
        yet, its whole demand."""
        state = self.state
        with_users = {k for k in state.placed if state.pods.users(k)}
        for key in stale_admissions(self._admitted, with_users, time.monotonic()):
            del self._admitted[key]
            if not state.pods.users(key):  # admitted, and no pod came: its workload went
                state.placed.pop(key, None)
        out = []
        for key, clique in state.placed.items():
            users = state.pods.users(key)
            if users:
                out.append(placement.Reserved(clique, len(users), max(p.gpus for p in users)))
            elif (admitted := self._admitted.get(key)) is not None:
                out.append(admitted[0])
        return out

    def _waiting(self, key: Key, now: float) -> placement.Group | None:
        """The claim's group if it is to be placed now (call with the lock held): complete, every
        user still gated (an ungated one allocates the claim by itself: nothing to steer), and
        neither allocated nor placed yet, of a mode the driver allows."""
        state = self.state
        claim, users = state.claims.get(key), state.pods.users(key)
        if (claim is None or claim.allocated or key in state.placed or not users or not all(p.gated for p in users)
                or not complete(users, now - state.pods.newest_user.get(key, now))
                or not self._allowed(key, claim)):
            return None
        return group_of(key, users, claim.pinned)

    def _allowed(self, key: Key, claim: ClaimState) -> bool:
        """Of a mode the driver allows, and, where the domains are watched, its owner a live domain
        whose claim it is: a stray claim (controller/strayclaims.py) is never placed, so its gated
        pods never get it a channel before the controller deletes it."""
        if claim.imex_mode and claim.imex_mode not in self.imex_modes:
            return False
        if not self.cache.domains.synced.is_set():
            return True  # a Reserver of its own cache (tests) does not watch domains
        if claim.domain is None:
            return False
        record = self.cache.domains.get((key[0], claim.domain[0]))
        return (record is not None and record.cd is not None and record.obj.metadata is not None
                and record.obj.metadata.uid == claim.domain[1]
                and key[1] in api.channel_claim_names(record.cd.metadata.name, record.cd.spec))


def jobs_to_place(keys: Sequence[Key], claims: Mapping[Key, ClaimState], placed: Mapping[Key, str],
                  waiting: Callable[[Key], placement.Group | None]) -> list[Job]:
    """What to place: per job, the groups to place together, the cliques its other groups hold
    already (placed or allocated), and its keys. A MultiClique domain's claims are one job, placed
    only once every one of them exists and is complete. `waiting(key)`: the claim's group if it is
    to be placed now."""
    out = []
    done: set[Key] = set()
    for key in keys:
        claim = claims.get(key)
        if key in done or claim is None:
            continue
        if claim.groups <= 1 or not claim.job:
            job_keys = [key]
        else:
            job_keys = sorted(k for k, st in claims.items()
                              if k[0] == key[0] and st.job == claim.job and st.groups == claim.groups)
        done.update(job_keys)
        if len(job_keys) < claim.groups:
            continue  # a claim of the domain is not there (yet): none of its groups starts
        groups = {k: g for k in job_keys if (g := waiting(k)) is not None}
        taken = {c for k in job_keys if k not in groups if (c := placed.get(k) or claims[k].clique) is not None}
        settled = len(groups) + sum(1 for k in job_keys if k in placed or claims[k].allocated)
        if groups and settled == len(job_keys):
            out.append((list(groups.values()), taken, list(groups)))
    return out


def channels_left(claims: Mapping[Key, ClaimState], placed: Mapping[Key, str], per_clique: int) -> dict[str, int]:
    """Clique → channels left in its pool: every allocated claim's devices (whatever its shape:
    a pool counts devices, not claims), and one per claim placed and not allocated yet."""
    used: dict[str, int] = {}
    for key, st in claims.items():
        if st.allocated and st.clique:
            used[st.clique] = used.get(st.clique, 0) + st.channels
        elif not st.allocated and (clique := placed.get(key)):
            used[clique] = used.get(clique, 0) + 1
    return {c: max(0, per_clique - n) for c, n in used.items()}


class NoRoomEvents:
    """The Warning Event `NoCliqueRoom` on a claim that finds no room and on its first pod, repeated
    at most every NO_ROOM_EVENT_S while the reason stays the same (every pass looks again)."""

    def __init__(self, client: Client, state: ReservationState) -> None:
        self.client, self.state = client, state
        self._said: dict[Key, tuple[str, float]] = {}  # claim → (message, when) of its last Event

    def forget(self, key: Key) -> None:
        """The claim was placed, or is gone: its next no-room is news."""
        self._said.pop(key, None)

    def waiting(self, key: Key, pod: Any, clique: str) -> None:
        """A pod joining its placed domain finds no node in its clique: `WaitingForNode` on it and its claim."""
        message = (f"pod {pod.name} joins ComputeDomain claim {key[1]} in clique {clique}, and no node there has "
                   f"{pod.gpus} free GPUs for it: it stays gated, holding no GPU, until one has (a rack's spare, a "
                   "node back, or a job finished); it never goes to another clique")
        said = (key[0], f"pod/{pod.uid}")  # a pod's own entry beside its claim's
        last = self._said.get(said)
        if last is not None and time.monotonic() - last[1] < NO_ROOM_EVENT_S:
            return
        self._said[said] = (message, time.monotonic())
        log.warning("claim %s/%s: %s", *key, message)
        with self.state.lock:
            claim = self.state.claims.get(key)
        targets = (("Pod", "v1", pod.name, pod.uid),
                   ("ResourceClaim", "resource.k8s.io/v1", key[1], claim.uid if claim else ""))
        for kind, api_version, name, uid in targets:
            event(self.client, key[0], kind, api_version, name, uid, "WaitingForNode", message)

    def say(self, key: Key, why: placement.NoRoom) -> None:
        message = why.message()
        last = self._said.get(key)
        if last is not None and last[0] == message and time.monotonic() - last[1] < NO_ROOM_EVENT_S:
            return
        self._said[key] = (message, time.monotonic())
        log.warning("claim %s/%s: %s", *key, message)
        with self.state.lock:
            claim = self.state.claims.get(key)
            users = sorted(self.state.pods.users(key), key=lambda p: (p.created, p.name))
        targets = [("ResourceClaim", "resource.k8s.io/v1", key[1], claim.uid if claim else "")]
        if users:
            targets.append(("Pod", "v1", users[0].name, users[0].uid))
        for kind, api_version, name, uid in targets:
            event(self.client, key[0], kind, api_version, name, uid, why.reason, message)
