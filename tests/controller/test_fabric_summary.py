"""A ComputeDomain's summary when a member node's NVLink fabric is unhealthy (the Node condition
its agent sets): Degraded naming the node, the FabricHealthy condition, unhealthyNodes; the pods
are not touched. The whole path on the simulator: tests/e2e/test_fabric_health.py."""

from __future__ import annotations

import datetime

from nvlfabric.api import computedomain as api
from nvlfabric.controller.reconcile import summarize

T0 = datetime.datetime(2026, 11, 29, 12, 0, tzinfo=datetime.UTC)
CLIQUE = "9f410827-489f-46fd-8203-51266ca08eb7.32766"
WHY = "FabricDegraded: GPU 0 (GPU-1): NVLink fabric health LimitedCapacity"


def status(*nodes: tuple[str, bool], phase: api.Phase | None = api.Phase.READY,
           conditions: list[dict[str, object]] | None = None) -> api.ComputeDomainStatus:
    return api.ComputeDomainStatus.model_validate({
        "phase": phase, "nodes": [{"name": n, "ready": r} for n, r in nodes], "conditions": conditions or []})


def conditions(out: dict[str, object]) -> dict[str, dict[str, str]]:
    return {c["type"]: c for c in out["conditions"]}  # type: ignore[attr-defined]


def test_a_ready_domain_with_a_member_on_a_sick_node_is_degraded_naming_it() -> None:
    out = summarize(api.ComputeDomainSpec(), status(("n1", True), ("n2", True)), 3, (CLIQUE, 5), now=T0,
                    unhealthy={"n2": WHY, "elsewhere": "NvmlError: x"})
    assert out["phase"] == "Degraded" and out["readyNodes"] == 2 and out["unhealthyNodes"] == ["n2"]
    ready, fabric = conditions(out)["Ready"], conditions(out)["FabricHealthy"]
    assert (ready["status"], ready["reason"]) == ("False", "FabricUnhealthy")
    assert ready["message"] == f"2 of 2 nodes ready; node n2: NVLink fabric unhealthy: {WHY}"
    assert (fabric["status"], fabric["reason"], fabric["message"]) == ("False", "FabricUnhealthy", f"node n2: {WHY}")


def test_healthy_again_is_ready_with_the_fabric_condition_true() -> None:
    sick = summarize(api.ComputeDomainSpec(), status(("n1", True)), 1, (CLIQUE, 5), now=T0, unhealthy={"n1": WHY})
    prev = api.ComputeDomainStatus.model_validate({**sick, "nodes": [{"name": "n1", "ready": True}]})
    later = T0 + datetime.timedelta(seconds=30)
    out = summarize(api.ComputeDomainSpec(), prev, 1, (CLIQUE, 5), now=later, unhealthy={})
    assert out["phase"] == "Ready" and "unhealthyNodes" not in out
    fabric = conditions(out)["FabricHealthy"]
    assert (fabric["status"], fabric["reason"]) == ("True", "FabricHealthy")
    assert fabric["lastTransitionTime"] == later.isoformat().replace("+00:00", "Z")
    again = summarize(api.ComputeDomainSpec(), api.ComputeDomainStatus.model_validate(
        {**out, "nodes": [{"name": "n1", "ready": True}]}), 1, (CLIQUE, 5), now=later + datetime.timedelta(hours=1))
    assert conditions(again)["FabricHealthy"]["lastTransitionTime"] == fabric["lastTransitionTime"]


def test_a_joining_domain_keeps_its_phase_and_says_which_node_is_sick() -> None:
    out = summarize(api.ComputeDomainSpec(numNodes=2), status(("n1", True), phase=api.Phase.ALLOCATING), 1,
                    (CLIQUE, 5), now=T0, unhealthy={"n1": WHY})
    assert out["phase"] == "Allocating" and out["unhealthyNodes"] == ["n1"]
    assert conditions(out)["FabricHealthy"]["status"] == "False"
