"""Fuzzing the node agent's inputs: what the kubelet sends over the DRA socket, and what users put
in their claims' opaque configuration.

The agent runs as its own process (the real entry point) on a simulated node against the real API
server. Whatever arrives, the process stays up, the socket keeps answering, every claim of a call
gets an answer, and an error names the claim (and, for a configuration, the offending field).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from lightkube import ApiError, Client
from lightkube.resources.resource_v1 import ResourceClaim

from nvlfabric.api.channelconfig import ChannelConfig
from nvlfabric.api.kubelet import dra_v1_pb2
from nvlfabric.controller import pools
from nvlfabric.nodeagent import checkpoint
from nvlfabric.nodeagent.driver import claim_name
from nvlfabric.nodeagent.server import ClaimRef
from nvlfabric.sim import agenthost, agentprocess, channelclaims, draclient
from tests.conftest import Cluster

pytestmark = pytest.mark.cluster
RACKS = range(240, 245)  # loopback addresses 127.10.<rack>.1: the first one free
CHANNELS = 96


@dataclass
class Fuzz:
    client: Client
    host: agenthost.Host
    agent: agentprocess.AgentProcess
    kubelet: draclient.Kubelet
    good: list[channelclaims.Claim]  # valid claims, prepared at the start
    answers: dict[str, object]
    config: dict[str, Any]  # the first good claim's (valid) opaque config
    next_channel: int = 10

    def channel(self) -> int:
        self.next_channel = self.next_channel + 1 if self.next_channel < CHANNELS else 10
        return self.next_channel

    def assert_alive(self) -> None:
        """The process runs and a valid claim still prepares, with the same answer as at first."""
        assert self.agent.alive, f"the agent died ({self.agent.returncode}); log:\n{self.agent.tail()}"
        c = self.good[0]
        assert self.kubelet.prepare([c]) == {c.uid: self.answers[c.uid]}, self.agent.tail()


@pytest.fixture(scope="module")
def fuzz(cluster: Cluster) -> Iterator[Fuzz]:
    client = cluster.client
    state = Path(tempfile.mkdtemp(prefix="nvlf-", dir="/tmp"))
    host = agenthost.make_host(state, RACKS)
    agenthost.register(client, host)
    pools.apply(client, host.clique, channels=CHANNELS)  # what the controller would publish
    agent = agentprocess.AgentProcess(host, cluster.kubeconfig)
    kubelet = draclient.Kubelet(host.endpoint)
    created: list[str] = []
    try:
        good = []
        for i in range(3):
            config = channelclaims.compute_domain(client, f"fz-{os.urandom(3).hex()}")
            created.append(config.compute_domain.name)
            good.append(channelclaims.allocated_claim(client, host, f"{config.compute_domain.name}-channel",
                                                      config.to_kube(), channel=i + 1))
        agent.start()
        answers: dict[str, object] = dict(kubelet.prepare(good))
        assert all(not isinstance(a, str) for a in answers.values()), answers
        c = good[0]
        config = client.get(ResourceClaim, c.name, namespace=c.namespace).spec.devices.config[0].opaque.parameters
        yield Fuzz(client, host, agent, kubelet, good, answers, dict(config))
    finally:
        kubelet.close()
        agent.close()
        agenthost.stop_daemons(host)
        for rc in client.list(ResourceClaim, namespace="default", labels={"nvlfabric.io/fuzz": "1"}):
            with contextlib.suppress(ApiError):
                client.delete(ResourceClaim, rc.metadata.name, namespace="default")
        for name in created:
            channelclaims.delete_domain(client, name)
        agenthost.unregister(client, host)
        pools.withdraw(client, host.clique)
        agenthost.remove_host(host)


# ----------------------------------------------------------------------------------------------
# The DRA socket


_chars = st.characters(exclude_categories=("Cs",))  # protobuf strings are UTF-8: no lone surrogates
_odd = st.one_of(
    st.just(""),
    st.text(_chars, max_size=40),
    st.text(st.sampled_from("abc-.xyz0"), min_size=1, max_size=70),
    st.from_regex(r"\A[a-z0-9][a-z0-9.-]{0,250}[a-z0-9]\Z"),
    st.sampled_from(["default", "kube-system", "..", "../../api/v1/nodes", "a/b", "a?b=1", "%2e%2e", "Default",
                     " default", "default\n", "\x00", "😀", "é"]),
    st.builds(lambda ch, n: ch * n, st.sampled_from("a-Z9é"), st.integers(254, 30_000)),
)
_uid = st.one_of(st.just(""), st.uuids().map(str), _odd)


@st.composite
def claim_lists(draw: st.DrawFn, fuzz: Fuzz) -> list[channelclaims.Claim]:
    """Up to 20 claims: junk, real ones, real ones with a field swapped, duplicates."""
    def one() -> channelclaims.Claim:
        kind = draw(st.sampled_from(["junk", "junk", "real", "swapped", "absent"]))
        real = draw(st.sampled_from(fuzz.good))
        if kind == "real":
            return real
        if kind == "swapped":
            which = draw(st.sampled_from(["namespace", "name", "uid"]))
            value = draw(_uid if which == "uid" else _odd)
            return channelclaims.Claim(**{**real.__dict__, which: value})
        if kind == "absent":  # well-formed but no such claim
            return channelclaims.Claim("default", f"absent-{draw(st.integers(0, 10**6))}", str(draw(st.uuids())))
        return channelclaims.Claim(draw(_odd), draw(_odd), draw(_uid))

    claims = [one() for _ in range(draw(st.integers(0, 20)))]
    if claims and draw(st.booleans()):
        claims += draw(st.lists(st.sampled_from(claims), max_size=3))  # duplicates
    return claims


def _answered(claims: list[channelclaims.Claim], results: dict[str, Any], op: str) -> None:
    last = {c.uid: c for c in claims}  # a UID sent twice gets one answer, for its last mention
    assert set(results) == set(last), f"{op}: answers for {sorted(results)[:5]}, asked {sorted(last)[:5]}"
    for uid, c in last.items():
        r = results[uid]
        if isinstance(r, str) and r:  # an error: it names the claim, briefly
            assert f"claim {claim_name(ClaimRef(c.namespace, c.name, c.uid))}" in r, (c, r)
            assert len(r) < 2000, r
        elif isinstance(r, list):  # each of our claims holds one channel device, however often it is named
            mentions = sum(x.uid == uid for x in claims)
            assert len(r) == 1, f"{op}: claim {c.ref} named {mentions} times got {len(r)} devices: {r}"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_malformed_kubelet_requests_get_an_answer_per_claim(fuzz: Fuzz, data: st.DataObject) -> None:
    claims = data.draw(claim_lists(fuzz))
    prepared = fuzz.kubelet.prepare(claims)
    _answered(claims, prepared, "prepare")
    good = {c.uid: c for c in fuzz.good}
    for uid, r in prepared.items():
        c = {c.uid: c for c in claims}[uid]
        if not isinstance(r, str):  # only a real claim, named exactly, prepares
            assert uid in good and good[uid] == c and r == fuzz.answers[uid], (c, r)
    # Unprepare never fails for claims the agent does not know; the real ones come back after.
    unprepared = fuzz.kubelet.unprepare(claims)
    _answered(claims, unprepared, "unprepare")
    assert all(r == "" for r in unprepared.values()), unprepared
    fuzz.assert_alive()
    fuzz.kubelet.prepare(fuzz.good)
    cp, report = checkpoint.load(fuzz.host.checkpoint, fuzz.host.boot_id)
    assert report.ok and {e.uid for e in cp.claims} <= set(good), "junk reached the checkpoint"


def test_thousands_of_claims_in_one_call(fuzz: Fuzz) -> None:
    absent = [channelclaims.Claim("default", f"absent-{i}", str(uuid.uuid4())) for i in range(2000)]
    claims = [*absent, *fuzz.good, *absent[:50]]
    prepared = fuzz.kubelet.prepare(claims, timeout=120)
    _answered(claims, prepared, "prepare")
    assert all("does not exist" in str(prepared[c.uid]) for c in absent)
    assert all(prepared[c.uid] == fuzz.answers[c.uid] for c in fuzz.good)
    assert set(fuzz.kubelet.unprepare(absent).values()) == {""}
    fuzz.assert_alive()


def test_a_request_too_large_for_grpc_is_refused_and_the_agent_carries_on(fuzz: Fuzz) -> None:
    huge = [channelclaims.Claim("default", "x" * 1_000_000, str(i)) for i in range(5)]
    with pytest.raises(grpc.RpcError) as err:
        fuzz.kubelet.prepare(huge)
    assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    empty = fuzz.kubelet.stub().NodePrepareResources(dra_v1_pb2.NodePrepareResourcesRequest(), timeout=10)
    assert not empty.claims
    fuzz.assert_alive()


# ----------------------------------------------------------------------------------------------
# Opaque configuration in real claims


_scalar = st.one_of(st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False),
                    st.text(_chars, max_size=20))
_json_scalar = st.one_of(st.none(), _scalar)
_json = st.recursive(_json_scalar, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(_chars, min_size=1, max_size=10), inner, max_size=3)),
    max_leaves=6)


_not_str = _json.filter(lambda v: not isinstance(v, str))
# A null is dropped on the way (absent, i.e. the default): values meant to break a field are never null.
_present = st.one_of(_scalar, st.lists(_json, max_size=3),
                     st.dictionaries(st.text(_chars, min_size=1, max_size=10), _json, max_size=3))


@st.composite
def broken_configs(draw: st.DrawFn, valid: dict[str, Any]) -> tuple[dict[str, Any], set[str]]:
    """A valid config with one to three things certainly wrong; returns it and the fields broken."""
    cfg: dict[str, Any] = {**valid, "computeDomain": dict(valid["computeDomain"])}
    fields: set[str] = set()
    bad_sub = {  # values each computeDomain field must refuse, besides non-strings
        "name": ["", "Upper", "a/../b", "x" * 300, "😀", "a_b"],
        "namespace": ["", "kube-system", "Default", "😀"],
        "uid": ["", "a/b", "x" * 300, "😀", " spaced"],
    }
    for _ in range(draw(st.integers(1, 3))):
        what = draw(st.sampled_from(["apiVersion", "kind", "imexMode", "extra", "cd-type", "cd-field", "cd-missing",
                                     "cd-extra", "missing"]))
        cd = cfg.get("computeDomain")
        if what in ("apiVersion", "kind", "imexMode"):
            value = draw(st.one_of(_present, st.sampled_from(["v1", "nvlfabric.io/v1beta1", "ChannelConfig ",
                                                           "Dedicated ", "dedicated", "", "😀"])))
            if value in (valid.get(what), "CliqueScoped", "Dedicated"):
                continue
            cfg[what] = value
            fields.add(what)
        elif what == "extra":
            key = draw(st.text(_chars, min_size=1, max_size=12).filter(
                lambda k: k not in ("apiVersion", "kind", "computeDomain", "imexMode")))
            cfg[key] = draw(_present)
            fields.add(key)
        elif what == "cd-type":
            cfg["computeDomain"] = draw(st.one_of(_json_scalar, st.lists(_json, max_size=2)))
            fields.add("computeDomain")
        elif what == "cd-field" and isinstance(cd, dict):
            sub = draw(st.sampled_from(sorted(bad_sub)))
            cd[sub] = draw(st.one_of(_not_str, st.sampled_from(bad_sub[sub])))
            fields.add(f"computeDomain.{sub}")
        elif what == "cd-missing" and isinstance(cd, dict):
            sub = draw(st.sampled_from(sorted(bad_sub)))
            cd.pop(sub, None)
            fields.add(f"computeDomain.{sub}")
        elif what == "cd-extra" and isinstance(cd, dict):
            key = draw(st.sampled_from(["Name", "cluster", "uid2", "😀"]))
            cd[key] = draw(_present)
            fields.add(f"computeDomain.{key}")
        elif what == "missing":
            cfg.pop("computeDomain", None)
            fields.add("computeDomain")
    return cfg, fields


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_malformed_opaque_configs_are_refused_naming_claim_and_field(fuzz: Fuzz, data: st.DataObject) -> None:
    cfg, fields = data.draw(broken_configs(fuzz.config))
    name = f"fz-bad-{uuid.uuid4().hex[:8]}"
    try:
        claim = channelclaims.allocated_claim(fuzz.client, fuzz.host, name, cfg, channel=fuzz.channel(),
                                              labels=FUZZ_LABEL,
                                              owner=ChannelConfig.model_validate(fuzz.config).compute_domain)
    except ApiError as exc:  # the API server refuses some (say, numbers JSON cannot hold): never reach the agent
        assert exc.status.code in (400, 422), exc.status
        event(f"refused by the API server ({exc.status.code})")
        return
    try:
        r = fuzz.kubelet.prepare([claim])[claim.uid]
        if not fields:  # every drawn change was a no-op: a valid config, in a claim that is not its domain's claim
            assert isinstance(r, str) and r.startswith(f"claim default/{name} is not a channel claim of "
                                                       "ComputeDomain "), r
            return
        assert isinstance(r, str), f"config {cfg!r} (broken: {sorted(fields)}) was prepared: {r}"
        event("refused by the agent")
        assert r.startswith(f"claim default/{name}: ") and "config" in r, r
        assert any(f in r for f in fields), (sorted(fields), r)
        assert fuzz.kubelet.unprepare([claim]) == {claim.uid: ""}
        assert claim.uid not in fuzz.host.cdi_specs()
    finally:
        with contextlib.suppress(ApiError):
            fuzz.client.delete(ResourceClaim, name, namespace="default")
    fuzz.assert_alive()


def test_non_object_parameters_are_refused_by_the_api_server(fuzz: Fuzz) -> None:
    for params in ([1, 2], "text", 5, True):
        with pytest.raises(ApiError) as err:
            channelclaims.allocated_claim(fuzz.client, fuzz.host, f"fz-nd-{uuid.uuid4().hex[:6]}", params,
                                          channel=9, labels=FUZZ_LABEL)
        assert "must be a valid JSON object" in err.value.status.message


FUZZ_LABEL = {"nvlfabric.io/fuzz": "1"}
