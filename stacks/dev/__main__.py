"""The dev stack: nvlfabric on the local GB200 NVL72 simulator (`make demo` brings up 2 racks).

The driver install, the simulator's racks, three single-rack ComputeDomains with a training Job
each, and one job across both racks: a MultiClique domain of two clique groups with one BoundJob of
16 pods, 8 per rack. Each group's pods share their rack's channel of the domain; nvlfabric's
controller places every group where all its pods fit, without any affinity written here.

Where JobSet runs (`make demo ADDONS=jobset`, or `nvlfabric-sim up --addons jobset`), one more job
over both racks is a JobSet: 4 pods, a replicated Job per rack, recreated whole up to 3 times if
one of its pods fails (JobSet's failure policy), on the same domain, cliques and channels (all of
stacks/dev's jobs then take 27 nodes: each rack has room for its share however the single-rack
jobs land).
"""

import pulumi

import nvlfabric.components
from nvlfabric.components import BoundJob, ComputeDomain, Nvl72Rack, NvlfabricDriver

config = pulumi.Config()
racks = config.get_int("racks") or 2
nodes_per_rack = config.get_int("nodesPerRack") or 18
first_rack = config.get_int("firstRack") or 0  # the simulator's --first-rack (a demo uses racks 0 and 1)
namespace = config.get("workloadNamespace") or "default"

driver = NvlfabricDriver("nvlfabric", channels_per_clique=config.get_int("channelsPerClique") or 128)
rack_components = {
    f"rack-{r}": Nvl72Rack(f"rack-{r}", nodes=[f"rack-{r}-node-{i:02d}" for i in range(nodes_per_rack)])
    for r in range(first_rack, first_rack + racks)
}

# (domain, pods): a 4-node pretraining run, a 2-node fine-tune, a single-node evaluation.
WORKLOADS = [("pretrain", 4), ("finetune", 2), ("eval", 1)]
domains = {}
jobs = {}
for name, pods in WORKLOADS:
    cd = ComputeDomain(name, namespace=namespace, opts=pulumi.ResourceOptions(depends_on=[driver]))
    jobs[name] = BoundJob(
        # 4 nvidia.com/gpu per pod (the default): a whole compute tray, as the simulated nodes
        # advertise 4 GPUs each like a GB200 node with NVIDIA's device plugin.
        name, compute_domain=cd, parallelism=pods,
        pod_template={"spec": {
            # One pod per node (the GPU limit already forces it; the spread says so explicitly).
            "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                           "whenUnsatisfiable": "ScheduleAnyway",
                                           "labelSelector": {"matchLabels": {"batch.kubernetes.io/job-name": name}}}],
            "containers": [{"name": "trainer", "image": "registry.invalid/nvlfabric/train:dev",
                            "args": ["--domain", name]}],
        }})
    domains[name] = cd

# One training job over two racks: two clique groups of 8 pods x 4 GPUs, a channel in each rack.
multirack = ComputeDomain("multirack", namespace=namespace, opts=pulumi.ResourceOptions(depends_on=[driver]),
                          spec={"numNodes": 16, "placement": {"scope": "MultiClique", "cliques": 2}})
jobs["multirack"] = BoundJob("multirack", compute_domain=multirack, parallelism=16, pod_template={"spec": {
    "containers": [{"name": "trainer", "image": "registry.invalid/nvlfabric/train:dev",
                    "command": ["torchrun", "--nnodes=$(NVLFABRIC_WORLD_SIZE)", "--node-rank=$(NVLFABRIC_RANK)",
                                "--master-addr=$(NVLFABRIC_MASTER_ADDR)", "train.py"]}]}})
domains["multirack"] = multirack

# (0.1.0 has no cluster_serves, and tests/e2e/test_upgrade.py runs this program on it: no JobSet there.)
cluster_serves = getattr(nvlfabric.components, "cluster_serves", lambda kind, namespace: False)
if cluster_serves("JobSet", namespace):  # JobSet's CRD and controller are installed
    jobset = ComputeDomain("jobset", namespace=namespace, opts=pulumi.ResourceOptions(depends_on=[driver]),
                           spec={"numNodes": 4, "placement": {"scope": "MultiClique", "cliques": 2}})
    jobs["jobset"] = BoundJob("jobset", kind="JobSet", compute_domain=jobset, parallelism=4, max_restarts=3,
                              pod_template={"spec": {"containers": [{
                                  "name": "trainer", "image": "registry.invalid/nvlfabric/train:dev",
                                  "command": ["torchrun", "--nnodes=$(NVLFABRIC_WORLD_SIZE)",
                                              "--node-rank=$(NVLFABRIC_RANK)",
                                              "--master-addr=$(NVLFABRIC_MASTER_ADDR)", "train.py"]}]}})
    domains["jobset"] = jobset

pulumi.export("device_class", driver.device_class)
pulumi.export("rack_gpus", {n: r.gpus for n, r in rack_components.items()})
pulumi.export("compute_domains", {n: cd.claims for n, cd in domains.items()})
pulumi.export("jobs", {n: j.job_name for n, j in jobs.items()})
