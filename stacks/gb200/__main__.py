"""nvlfabric on a real GB200 NVL72 cluster, driven entirely by stack config (Pulumi.prod.yaml
documents every key). The same components as stacks/dev; what differs from the simulator is only
configuration: a pushed agent image, the driver root of your NVIDIA driver install, the racks'
real node names and cliques, GPU limits in the pods (`nvidia.com/gpu`, from the device plugin).
"""

from typing import Any

import pulumi

from nvlfabric.components import BoundJob, ComputeDomain, Nvl72Rack, NvlfabricDriver

config = pulumi.Config()

driver = NvlfabricDriver(
    "nvlfabric", image=config.require("image"), driver_root=config.get("driverRoot") or "/run/nvidia/driver",
    kubelet_root=config.get("kubeletRoot") or "/var/lib/kubelet",
    channels_per_clique=config.get_int("channelsPerClique") or 128)

racks = {r["name"]: Nvl72Rack(r["name"], nodes=r["nodes"], expected_clique=r.get("expectedClique"),
                              taints=r.get("taints"))
         for r in config.require_object("racks")}

domains: dict[str, ComputeDomain] = {}
for d in config.require_object("domains"):
    spec = {k: d[k] for k in ("numNodes", "imexMode", "channelAllocationMode") if k in d}
    domains[d["name"]] = ComputeDomain(d["name"], namespace=d.get("namespace", "default"), spec=spec,
                                       opts=pulumi.ResourceOptions(depends_on=[driver]))

workloads: dict[str, BoundJob] = {}
for w in config.require_object("workloads"):
    if w["domain"] not in domains:
        raise ValueError(f"workloads[{w['name']}].domain: no ComputeDomain named {w['domain']!r} in 'domains' "
                         f"(have: {', '.join(sorted(domains))})")
    container: dict[str, Any] = {"name": "main", "image": w["image"]}
    if w.get("command"):
        container["command"] = w["command"]
    # Tolerate the racks' GPU taint, so the workload can land on them.
    tolerations = [{"key": t["key"], "operator": "Exists", "effect": t.get("effect", "NoSchedule")}
                   for r in config.require_object("racks") for t in r.get("taints") or []]
    workloads[w["name"]] = BoundJob(
        w["name"], compute_domain=domains[w["domain"]], kind=w.get("kind", "Job"), parallelism=w["pods"],
        gpus_per_pod=w.get("gpusPerPod", 4), wait=w.get("wait", False), master_port=w.get("masterPort", 29500),
        pod_template={"spec": {"containers": [container],
                               "tolerations": [dict(t) for t in {tuple(sorted(t.items())) for t in tolerations}]}})

pulumi.export("racks", {n: {"gpus": r.gpus, "free_gpus": r.free_gpus, "discovered_cliques": r.discovered_cliques,
                            "clique_mismatches": r.clique_mismatches} for n, r in racks.items()})
pulumi.export("domains", {n: {"claim": d.claim_name, "clique": d.clique, "channel": d.channel, "phase": d.phase}
                          for n, d in domains.items()})
pulumi.export("workloads", {n: w.job_name for n, w in workloads.items()})
