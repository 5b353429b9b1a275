"""What keeps tenants' channels apart on the controller's side (issue 49): which channel claims are
strays it deletes (controller/strayclaims.py), each namespace's channel quota (controller/quota.py),
and placement that says ChannelPoolExhausted when only channels are missing (controller/placement.py).
The rules are pure; the sweep and the quota against a real API server are in tests/e2e/test_tenants_on_sim.py."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from nvlfabric.api import computedomain as api
from nvlfabric.api import names
from nvlfabric.controller import placement, quota
from nvlfabric.controller.strayclaims import ChannelClaim, channel_claim, why_stray
from nvlfabric.provider.computedomain import channel_claim as provider_claim

UID, OTHER = "11111111-2222-3333-4444-555555555555", "99999999-2222-3333-4444-555555555555"


def test_the_providers_claim_is_its_domains_own() -> None:
    claim = channel_claim(provider_claim("train", "team", UID, api.ComputeDomainSpec()))
    assert claim == ChannelClaim(uid="", owner=("train", UID), configured=("train", UID), terminating=False)
    assert why_stray("team", "train-channel", claim, (UID, ["train-channel"])) is None


def test_claims_of_other_classes_are_not_looked_at() -> None:
    assert channel_claim({"spec": {"devices": {"requests": [
        {"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}}]}}}) is None


def _claim(**change: Any) -> dict[str, Any]:
    raw = provider_claim("train", "team", UID, api.ComputeDomainSpec())
    raw["metadata"].update(change)
    return raw


def test_each_way_a_claim_is_not_its_domains_is_named() -> None:
    own = (UID, ["train-channel"])
    orphan = channel_claim(_claim(ownerReferences=[]))
    assert orphan is not None and "no owner reference" in str(why_stray("team", "x", orphan, own))
    unserved = channel_claim(_claim(ownerReferences=[{"apiVersion": "nvlfabric.io/v9", "kind": api.KIND,
                                                      "name": "train", "uid": UID, "controller": True}]))
    assert unserved is not None and unserved.owner is None  # not a served version: no owner at all
    theirs = channel_claim(provider_claim("train", "team", OTHER, api.ComputeDomainSpec()))
    assert theirs is not None
    why = why_stray("team", "train-channel", theirs, own)
    assert why == f"its owner reference and configuration name ComputeDomain team/train with uid {OTHER}, but that " \
                  f"domain's uid is {UID}"
    assert why_stray("team", "train-channel", theirs, None) == "ComputeDomain team/train, its owner, does not exist"
    second = channel_claim(_claim(name="train-extra"))
    assert second is not None
    assert why_stray("team", "train-extra", second, own) == \
        "ComputeDomain team/train's channel claim is train-channel, not train-extra"


@given(st.sampled_from([UID, OTHER]), st.sampled_from([UID, OTHER]), st.sampled_from(["train", "other"]),
       st.sampled_from(["train-channel", "other-channel", "x"]), st.booleans())
def test_only_the_claim_its_live_domain_would_make_is_not_a_stray(owner_uid: str, live_uid: str, owner: str,
                                                                   name: str, live: bool) -> None:
    """Whatever the owner, uid and name: not a stray exactly when it is what the provider makes for
    the live domain."""
    raw = provider_claim(owner, "team", owner_uid, api.ComputeDomainSpec())
    claim = channel_claim(raw)
    assert claim is not None
    domain = (live_uid, [f"{owner}-channel"]) if live else None
    ours = live and owner_uid == live_uid and name == f"{owner}-channel"
    assert (why_stray("team", name, claim, domain) is None) == ours


def test_the_quota_is_the_namespaces_annotation_when_it_is_a_bound() -> None:
    assert quota.bound_of(64, None) == (64, "the driver's channel_quota_per_namespace")
    assert quota.bound_of(64, "8") == (8, f"the namespace's annotation {names.CHANNEL_QUOTA_ANNOTATION}")
    for bad in ("many", "-1", "1e3", str(names.MAX_CHANNEL_QUOTA_PER_NAMESPACE + 1)):
        bound, source = quota.bound_of(64, bad)
        assert bound == 64 and f"={bad!r} is not a whole number" in source, source
    body = quota.manifest("team", 8, "x")
    assert body["spec"] == {"hard": {"imex-channel.nvlfabric.io.deviceclass.resource.k8s.io/devices": "8"}}


def test_a_group_that_only_lacks_a_channel_is_told_channel_pool_exhausted() -> None:
    """Issue 49: a team whose domain could not get a channel read NoCliqueRoom (or NoChannel) though
    the nodes had room: the pool was what was full."""
    nodes = [placement.NodeRoom(f"n{i}", "c1", 4, {}) for i in range(2)]
    group = placement.Group(("team", "train-channel"), pods=2, gpus_per_pod=4)
    full = placement.place([group], nodes, {"c1": 0})
    assert isinstance(full, placement.NoRoom) and full.reason == "ChannelPoolExhausted"
    assert "every channel of clique c1 is allocated (ChannelPoolExhausted)" in full.message()
    crowded = placement.place([placement.Group(("team", "big"), pods=3, gpus_per_pod=4)], nodes, {"c1": 5})
    assert isinstance(crowded, placement.NoRoom) and crowded.reason == "NoCliqueRoom"
