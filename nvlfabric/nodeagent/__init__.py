"""The node agent: nvlfabric's DRA kubelet plugin on every GPU node (`python -m nvlfabric agent`).

Discovers the NVLink fabric through NVML, prepares IMEX channels for claims (device nodes, CDI
specs, IMEX domains, a checkpoint) and reports its node's entry of each ComputeDomain's status. It
shares only `nvlfabric.api` with the cluster controller, and loads neither Pulumi nor lightkube.
"""
