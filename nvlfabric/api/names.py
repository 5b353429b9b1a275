"""Every name and limit nvlfabric's rooms share: the one home of each (nothing keeps a copy).

The components accept, the providers write, the controller publishes and the node agent prepares by
these, so a limit a component accepts is by construction one the controller and the agent accept
(tests/api/test_contract.py checks the boundaries). A leaf: standard library only, so the node agent
loads it without any object models.
"""

from __future__ import annotations

import hashlib
import re
from typing import Final

from nvlfabric.api.release import __version__

# -- identity ---------------------------------------------------------------------------------------

GROUP: Final = "nvlfabric.io"
"""Our API group (the ComputeDomain CRD) and the prefix of our label, annotation and gate keys."""
DRIVER: Final = "channel.nvlfabric.io"
"""Our DRA driver: the channel pools' driver, the kubelet plugin's name, the opaque config's driver."""
DEVICE_CLASS: Final = "imex-channel.nvlfabric.io"
"""The DeviceClass every ComputeDomain's channel claim requests (`device.driver == DRIVER`)."""
GPU_DRIVER: Final = "gpu.nvlfabric.io"
"""The node's GPUs as DRA devices (the agent's second kubelet plugin, nodeagent/gpus.py): one pool
per node, named as the node, where a GPU whose fabric is unhealthy carries a device taint."""
GPU_DEVICE_CLASS: Final = "gpu.nvlfabric.io"
"""The DeviceClass of whole GPUs (`device.driver == GPU_DRIVER`)."""
GPU_TAINT_EFFECTS: Final = ("NoSchedule", "NoExecute", "None")
"""What a sick GPU's device taint does: no new claim gets it (NoSchedule, the default); also evict
the pods whose claims hold it (NoExecute: kube-controller-manager's device-taint-eviction);
only show it (None)."""
DEFAULT_GPU_TAINT_EFFECT: Final = "NoSchedule"
GPU_CDI_KIND: Final = f"k8s.{GPU_DRIVER}/gpu"
"""`k8s.gpu.nvlfabric.io/gpu`: the CDI kind of the node's GPUs (device `gpu-<index>`)."""
GPU_CDI_SPEC_FILE: Final = f"k8s.{GPU_DRIVER}-gpu.json"
"""The one CDI spec of the node's GPUs, rewritten when they change."""
NVIDIA_GPU_MAJOR: Final = 195
"""The character major of /dev/nvidia<minor> and /dev/nvidiactl (minor 255): the NVIDIA driver's fixed number."""
NAMESPACE: Final = "nvlfabric-system"
"""Where the driver runs; fixed, because the admission policies name its service accounts."""
AGENT_FIELD_MANAGER_PREFIX: Final = "nvlfabric-agent-"
"""An agent's field manager is this plus its node name: it owns its node's status entries."""
CONTROLLER_FIELD_MANAGER: Final = "nvlfabric-controller"
RACK_FIELD_MANAGER_PREFIX: Final = "nvlfabric-rack-"
"""An Nvl72Rack applies its Nodes' labels and taints as `nvlfabric-rack-<its resource name>`."""
JOB_PARALLELISM_TYPES: Final = ("pulumi-python:dynamic/nvlfabric:JobParallelism", "nvlfabric:kubernetes:JobParallelism")
"""The Pulumi types of an elastic BoundJob's Job size (provider/jobparallelism.py): a Python
program's dynamic resource, the component provider's own."""
RACK_NODES_TYPES: Final = ("pulumi-python:dynamic/nvlfabric:RackNodes", "nvlfabric:kubernetes:RackNodes")
"""The Pulumi types of an Nvl72Rack's node labelling: a Python program's dynamic resource, the
component provider's own. Racks before the first release (0.1.0) made a `kubernetes:core/v1:NodePatch` per node."""
COMPUTE_DOMAIN_TYPES: Final = ("pulumi-python:dynamic/nvlfabric:ComputeDomain", "nvlfabric:index:ComputeDomainResource")
"""The Pulumi types of a ComputeDomain's custom resource: a Python program's dynamic resource, the
component provider's own (read by the policy pack and the preview report)."""
AGENT_IMAGE_REPOSITORY: Final = "nvlfabric/node-agent"
"""The image of the node agent, the IMEX keeper and the controller (one image, three commands)."""
AGENT_IMAGE: Final = f"{AGENT_IMAGE_REPOSITORY}:{__version__}"
"""The image the driver deploys unless told otherwise: tagged with the release that deploys it, so an
upgrade of the package rolls the agents to the same release (docs/compatibility.md)."""

# -- IMEX authentication (imexAuthentication: TLS) -------------------------------------------------

IMEX_SIGNER: Final = "nvlfabric.io/imex"
"""The CertificateSigningRequest signerName of IMEX node certificates: the controller signs them with
the domain's own authority, for member nodes only (nvlfabric/controller/imexauth.py)."""
AGENT_SERVICE_ACCOUNT: Final = "nvlfabric-agent"
AGENT_USERNAME: Final = f"system:serviceaccount:{NAMESPACE}:{AGENT_SERVICE_ACCOUNT}"
"""Who may ask for an IMEX node certificate (with the node its token is bound to)."""
NODE_NAME_EXTRA: Final = "authentication.kubernetes.io/node-name"
"""The user-info extra a pod-bound service account token carries: the pod's node."""
IMEX_CA_SECRET_PREFIX: Final = "imex-ca-"
"""A TLS domain's authority is the Secret `imex-ca-<domain uid>` in NAMESPACE (type kubernetes.io/tls)."""
IMEX_TARGET_SUFFIX: Final = ".imex.nvlfabric.io"
"""Every certificate of a domain names `<domain uid>.imex.nvlfabric.io` (IMEX_SECURITY_TARGET_OVERRIDE)."""
COMPUTE_DOMAIN_UID_LABEL: Final = "nvlfabric.io/compute-domain-uid"
ROTATE_IMEX_AUTHORITY_ANNOTATION: Final = "nvlfabric.io/rotate-imex-authority"
"""Set on a TLS ComputeDomain (any new value, e.g. a timestamp) to replace its authority under the
running domain; the value last acted on is kept on the authority Secret (controller/imexauth.py)."""
DEFAULT_IMEX_CERT_VALIDITY_S: Final = 24 * 3600
"""How long an IMEX node certificate lasts; agents renew it after two thirds."""
MIN_IMEX_CERT_VALIDITY_S: Final = 10


def imex_node_subject(node: str) -> str:
    """The common name of node `node`'s IMEX certificates (its requests must ask for exactly this)."""
    return f"system:nvlfabric:imex:{node}"


def imex_target(domain_uid: str) -> str:
    """The name every IMEX certificate of domain `domain_uid` carries (and the daemons check)."""
    return f"{domain_uid}{IMEX_TARGET_SUFFIX}"


# -- the node's IMEX work directory ----------------------------------------------------------------
# Shared by the agent and the IMEX keeper (two DaemonSets), and bounded by the driver component.

IMEX_KEEPER_SOCKET: Final = "keeper.sock"
IMEX_KEEPER_BINARY: Final = "nvlfabric-imex-keeper"
"""The keeper's program (C, nvlfabric/nodeagent/keeper/): the node image has it on its PATH
(/usr/local/bin), and `python -m nvlfabric imex` replaces itself with it."""
IMEX_KEEPER_BINARY_ENV: Final = "NVLFABRIC_IMEX_KEEPER"
"""Where the keeper's program is when it is not on the PATH (an image laid out otherwise; the
simulator's node image names the one it built)."""
MAX_UNIX_SOCKET_PATH: Final = 107
"""A unix socket path has at most 107 bytes (sun_path is 108 with its NUL)."""


def imex_workdir(kubelet_root: str) -> str:
    """Where the IMEX domains' files and the keeper's socket live on a node."""
    return f"{kubelet_root.rstrip('/')}/plugins/{DRIVER}/imex"


def imex_keeper_socket(kubelet_root: str) -> str:
    return f"{imex_workdir(kubelet_root)}/{IMEX_KEEPER_SOCKET}"


# -- the kubelet's DRA calls ----------------------------------------------------------------------

KUBELET_PREPARE_TIMEOUT_S: Final = 45.0
"""How long the kubelet waits for a DRA plugin's NodePrepareResources or NodeUnprepareResources call
before it gives up and retries: the node agent finishes (or gives up, saying why) inside it, and
the simulated kubelet waits as long."""

# -- CDI and IMEX channel device nodes -------------------------------------------------------------
# The node agent writes claim specs and channel nodes by these; the kubelet's runtime (and the
# simulator's stand-ins for the kubelet and the node) read them.

CDI_VENDOR: Final = f"k8s.{DRIVER}"
"""The CDI vendor of our claim specs (the `k8s.<driver>` convention of DRA drivers)."""
CDI_CLASS: Final = "claim"
CDI_KIND: Final = f"{CDI_VENDOR}/{CDI_CLASS}"
"""`k8s.channel.nvlfabric.io/claim`: the kind of every CDI device id the agent returns."""
CDI_SPEC_PREFIX: Final = f"{CDI_VENDOR}-{CDI_CLASS}_"
"""A claim's transient spec file is this, the claim UID, `.json` (CDI's `vendor-class_<id>`)."""
IMEX_CHANNEL_DEVICE: Final = "nvidia-caps-imex-channels"
"""The character device the driver registers for IMEX channels (its major is in /proc/devices)."""
IMEX_CHANNEL_DIR: Final = "/dev/nvidia-caps-imex-channels"
"""Where channel N's node lives: `<dir>/channel<N>` (in the container, and under a driver root)."""

# -- label, annotation and gate keys ----------------------------------------------------------------

CLIQUE_LABEL: Final = "nvlfabric.io/clique"
"""On a Node: its NVLink clique `<clusterUuid>.<cliqueId>`, set by the node's agent."""
FABRIC_READY_LABEL: Final = "nvlfabric.io/fabric-ready"
"""On a Node: `true`/`false`, whether its agent found the NVLink fabric ready."""
NODE_REPORT_PREFIX: Final = "nvlfabric.io/cd-"
"""On a Node: annotations `nvlfabric.io/cd-<hash of namespace/name>`, its agent's report for one
ComputeDomain (the entry the controller copies into the domain's `status.nodes`): each agent
writes only its own Node, and the controller alone writes the domain's status."""
FABRIC_CONDITION: Final = "NVLinkFabricReady"
"""A Node condition its agent owns: True while every GPU's NVLink fabric is registered and healthy;
False names the GPUs and NVML's reason (the controller marks the node's ComputeDomains Degraded)."""
FABRIC_UNHEALTHY_TAINT: Final = "nvlfabric.io/fabric-unhealthy"
"""A Node taint (effect NoSchedule only) its agent sets while the fabric is unhealthy, value the
condition's reason: new pods stay off the node, running ones are told, never evicted."""
RACK_LABEL: Final = "nvlfabric.io/rack"
"""On a Node: the rack an `Nvl72Rack` declared it in."""
EXPECTED_CLIQUE_LABEL: Final = "nvlfabric.io/expected-clique"
"""On a Node: the clique its rack declaration expects (checked against CLIQUE_LABEL)."""
SPARES_LABEL: Final = f"{GROUP}/spares"
"""On a Node: how many of its clique's nodes are kept free as hot spares (an `Nvl72Rack`'s
`spares`, written on each of the rack's Nodes; absent means none): new ComputeDomains are not
placed on them, replacements of lost members (and growing domains) are. A count, not named nodes:
any fully free node of the clique is a spare. The controller reads a clique's spares as the
largest value over its Nodes."""
POOL_LABEL: Final = "nvlfabric.io/pool"
"""On a ResourceSlice: the channel pool it belongs to."""
COMPUTE_DOMAIN_LABEL: Final = "nvlfabric.io/compute-domain"
"""On a channel claim and on bound workloads: the ComputeDomain's name."""
WORKLOAD_LABEL: Final = "nvlfabric.io/workload"
"""On a bound workload's pods: the workload's name (with COMPUTE_DOMAIN_LABEL, its headless
Service's selector)."""
RESERVATION_GATE: Final = "nvlfabric.io/channel-reservation"
"""A pod scheduling gate (BoundJob adds it): the controller lifts it once the pod is in its
channel claim's reservedFor, so the scheduler never races itself on the shared claim."""
DISRUPTION_REASON: Final = "DeletionByNvlfabric"
"""The reason of the DisruptionTarget condition the controller sets on a pod of a lost member
node before deleting it (as PodGC's DeletionByPodGC): a Job's podFailurePolicy that ignores
DisruptionTarget then replaces the pod without counting it as a failure."""
GROUP_SIZE_ANNOTATION: Final = "nvlfabric.io/group-size"
"""On a bound workload's pods: how many pods of the workload share its channel claim. The
controller places the claim's clique only once it sees that many, where all of them fit."""
PART_OF_LABEL: Final = "app.kubernetes.io/part-of"
COMPONENT_LABEL: Final = "app.kubernetes.io/component"
PART_OF: Final = "nvlfabric"

# -- a distributed launcher's environment -----------------------------------------------------------
# BoundJob sets these in every container of a bound pod (a variable the user set is left alone), so
# `torchrun --nnodes=$(NVLFABRIC_WORLD_SIZE) --node-rank=$(NVLFABRIC_RANK)
# --master-addr=$(NVLFABRIC_MASTER_ADDR) --master-port=$(NVLFABRIC_MASTER_PORT)` needs no wiring.
# Ranks count pods, not processes: a launcher that starts several processes per pod (torchrun's
# --nproc-per-node) numbers them itself and overwrites RANK and WORLD_SIZE in its workers.

RANK_ENV: Final = "NVLFABRIC_RANK"
"""The pod's rank among the workload's pods, 0..world size - 1 (torchrun's --node-rank)."""
WORLD_SIZE_ENV: Final = "NVLFABRIC_WORLD_SIZE"
"""How many pods the workload runs at once (torchrun's --nnodes)."""
NNODES_ENV: Final = "NVLFABRIC_NNODES"
"""An elastic job's (BoundJob max_parallelism) size range, `<min>:<max>` as torchrun's --nnodes
takes it; such a job has no world size in its env (its pods stay while it grows and shrinks, and
an environment cannot change): the launcher's rendezvous counts the pods that came."""
MASTER_ADDR_ENV: Final = "NVLFABRIC_MASTER_ADDR"
"""The stable DNS name of rank 0's pod (torchrun's --master-addr)."""
MASTER_PORT_ENV: Final = "NVLFABRIC_MASTER_PORT"
"""The port rank 0 listens on for the rendezvous (torchrun's --master-port)."""
DEFAULT_MASTER_PORT: Final = 29500
"""torch.distributed's own default."""
TORCH_RANK_ENVS: Final = ("NODE_RANK", "RANK")
"""PyTorch's names, set to the pod's rank too: `env://` initialisation with one process per pod
reads RANK, launchers read NODE_RANK."""
TORCH_WORLD_SIZE_ENV: Final = "WORLD_SIZE"
TORCH_MASTER_ADDR_ENV: Final = "MASTER_ADDR"
TORCH_MASTER_PORT_ENV: Final = "MASTER_PORT"
JOB_COMPLETION_INDEX: Final = "batch.kubernetes.io/job-completion-index"
"""The annotation the Job controller sets on an Indexed Job's pods (JobSet's too): their index."""
STATEFULSET_POD_INDEX: Final = "apps.kubernetes.io/pod-index"
"""The label the StatefulSet controller sets on its pods: their ordinal."""
LWS_WORKER_INDEX: Final = "leaderworkerset.sigs.k8s.io/worker-index"
"""The label LeaderWorkerSet sets on a group's pods: 0 for the leader, 1..size-1 the workers."""
LWS_LEADER_ADDRESS_ENV: Final = "LWS_LEADER_ADDRESS"
"""LeaderWorkerSet puts it first in every container's env: the leader pod's DNS name."""

# -- Kueue ------------------------------------------------------------------------------------------

KUEUE_API_VERSION: Final = "kueue.x-k8s.io/v1beta1"
KUEUE_QUEUE_LABEL: Final = "kueue.x-k8s.io/queue-name"
"""The label by which Kueue queues a Job or a JobSet in a LocalQueue of its namespace."""
PLACEMENT_CHECK_CONTROLLER: Final = "nvlfabric.io/placement"
"""The controllerName of Kueue AdmissionChecks that nvlfabric's controller answers: a workload is
admitted only once all its groups are placed, each in a clique with room (controller/admission.py)."""

# -- hardware and API limits ------------------------------------------------------------------------

IMEX_CHANNEL_COUNT: Final = 2048
"""IMEX channels 0..2047 exist on every node (/dev/nvidia-caps-imex-channels/channelN)."""
MAX_CHANNEL: Final = IMEX_CHANNEL_COUNT - 1
MAX_CHANNELS_PER_CLIQUE: Final = MAX_CHANNEL
"""A clique's pool holds channels 1..N: channel 0 is never handed out (drivers may create it for
everybody, `NVreg_CreateImexChannel0`, so it isolates nothing), hence at most 2047."""
DEFAULT_CHANNELS_PER_CLIQUE: Final = 128
"""One ResourceSlice's worth (MAX_DEVICES_PER_SLICE): enough ComputeDomains per rack for most."""
DEFAULT_CHANNEL_QUOTA_PER_NAMESPACE: Final = 64
"""How many IMEX channels (devices of DEVICE_CLASS) one namespace's claims may hold, unless the
platform says otherwise (the driver setting `channel_quota_per_namespace`, or a namespace's
CHANNEL_QUOTA_ANNOTATION): one per SingleClique domain, one per clique group of a MultiClique one.
The controller keeps it as a ResourceQuota (CHANNEL_QUOTA_NAME) in every namespace holding a
ComputeDomain (docs/tenants.md, "Quota"). 64: the largest domain (MAX_CLIQUES_PER_DOMAIN groups)
fits, and it is half of a default pool (DEFAULT_CHANNELS_PER_CLIQUE), so one team alone cannot
drain a clique."""
MAX_CHANNEL_QUOTA_PER_NAMESPACE: Final = MAX_CHANNELS_PER_CLIQUE * 64
"""0 turns the quota off; above this it would bound nothing (every channel of 64 full cliques)."""
CHANNEL_QUOTA_NAME: Final = "nvlfabric-imex-channels"
"""The ResourceQuota the controller keeps in a namespace with ComputeDomains."""
CHANNEL_QUOTA_ANNOTATION: Final = "nvlfabric.io/channel-quota"
"""On a Namespace (which a tenant with `edit` cannot change): that namespace's channel quota, in
place of the driver's default."""
CHANNEL_QUOTA_RESOURCE: Final = f"{DEVICE_CLASS}.deviceclass.resource.k8s.io/devices"
"""The ResourceQuota key that counts a namespace's claimed devices of DEVICE_CLASS."""
MAX_DEVICES_PER_SLICE: Final = 128
"""resource.k8s.io/v1 allows at most 128 devices in one ResourceSlice."""
MAX_PODS_PER_CLAIM: Final = 256
"""A ResourceClaim's `status.reservedFor` holds at most 256 consumers: the pods of one domain."""
GPUS_PER_NODE: Final = 4
"""A GB200 compute tray: 4 GPUs (a node)."""
GPU_RESOURCE: Final = "nvidia.com/gpu"
"""The extended resource a node's GPUs are advertised as (NVIDIA's device plugin's name)."""
NODES_PER_CLIQUE: Final = 18
"""An NVL72 rack: 18 trays in one NVLink clique."""
GPUS_PER_CLIQUE: Final = GPUS_PER_NODE * NODES_PER_CLIQUE
MAX_CLIQUES_PER_DOMAIN: Final = 64
"""A multi-clique ComputeDomain spans at most this many cliques (one channel claim each): 64 racks,
4608 GPUs, beyond any one training job we know of and well inside what the controller lists."""
CLIQUE_GROUP_ANNOTATION: Final = "nvlfabric.io/clique-group"
"""On a bound pod of a multi-clique ComputeDomain: the index of its clique group (its claim)."""
CLIQUE_GROUP_LABEL: Final = CLIQUE_GROUP_ANNOTATION
"""The same key as a label of a multi-clique workload's pod templates (one template per group), so
a group's pods and its selector can be told apart."""
RANK_ANNOTATION: Final = "nvlfabric.io/rank"
"""On such a pod, written by the controller as it lifts the pod's gate: its rank in the whole job,
group index x group size + the pod's index in its group (Kubernetes' env cannot add), which the
pod's NVLFABRIC_RANK reads through the downward API."""
SCHEDULING_API_GROUP: Final = "scheduling.k8s.io"
WORKLOAD_API_VERSIONS: Final = ("v1beta1", "v1alpha3")
"""Where Kubernetes serves Workload, PodGroup and CompositePodGroup (1.37: the first two in
v1beta1, which its scheduler watches, and v1alpha3; CompositePodGroup in v1alpha3 only): the
first version that serves a kind is used."""
POD_GROUP_ANNOTATION: Final = "nvlfabric.io/pod-group"
"""On a pod template of a job Kubernetes schedules: its PodGroup, which the driver's
MutatingAdmissionPolicy `nvlfabric-pod-group` writes into the pod's spec.schedulingGroup at
creation (pulumi-kubernetes 4.25 drops that field from the templates it creates)."""
POD_GROUP_TEMPLATE: Final = "clique"
"""A BoundJob's Workload: the pod group template of a clique group (gang, topology on CLIQUE_LABEL)."""
COMPOSITE_GROUP_TEMPLATE: Final = "job"
"""... and of the whole job over several cliques (gang over all its clique groups)."""
CLIQUE_GROUPS_ANNOTATION: Final = "nvlfabric.io/clique-groups"
"""On each channel claim of a multi-clique ComputeDomain: how many claims (one per clique) the
domain has, so the controller places them all at once or none."""

# -- IMEX ports -------------------------------------------------------------------------------------
# Every member of an IMEX domain listens on the same two ports, and two domains on one node must not
# share them: a domain's port slot k shifts IMEX's default pair by IMEX_PORT_STRIDE x k. The agent
# (nodeagent/imexconfig.py), the controller (which assigns slots) and the simulator's daemon all
# count by these.

IMEX_SERVER_PORT: Final = 50000
"""IMEX's default peer port (its config key SERVER_PORT): slot 0's."""
IMEX_CMD_PORT: Final = 50005
"""IMEX's default command port (IMEX_CMD_PORT): slot 0's."""
IMEX_PORT_STRIDE: Final = 10
"""Slots are 10 ports apart: room for both ports of a slot (0 and +5) and none shared with a neighbour."""
MAX_IMEX_PORT_SLOT: Final = 99
"""Dedicated IMEX domains use port slots 1..99 (slot 0, the IMEX default ports, is the clique's
persistent domain): every port stays below 51000."""

# -- name rules ---------------------------------------------------------------------------------------

DNS_LABEL: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_LABEL_MAX: Final = 63
DNS_SUBDOMAIN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DNS_SUBDOMAIN_MAX: Final = 253
CLIQUE: Final = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\.[0-9]{1,10}$"
"""`<clusterUUID>.<cliqueID>` as NVIDIA's GPU Feature Discovery and DRA driver format it: the
canonical lowercase UUID of the NVLink domain, a dot, the clique (NVLink partition) as a decimal
uint32. Example `9f410827-489f-46fd-8203-51266ca08eb7.32766`."""
CLIQUE_MAX: Final = 47
_DNS_LABEL_RE: Final = re.compile(DNS_LABEL)
_DNS_SUBDOMAIN_RE: Final = re.compile(DNS_SUBDOMAIN)


def is_dns_label(value: str) -> bool:
    """An RFC 1123 label: what Kubernetes requires of namespaces and most object names."""
    return len(value) <= DNS_LABEL_MAX and _DNS_LABEL_RE.match(value) is not None


def is_dns_subdomain(value: str) -> bool:
    """An RFC 1123 subdomain: what Kubernetes requires of claim, class and other object names."""
    return len(value) <= DNS_SUBDOMAIN_MAX and _DNS_SUBDOMAIN_RE.match(value) is not None


# -- channel pools: format and parse ---------------------------------------------------------------

POOL_PREFIX: Final = "clique-"
DEVICE_PREFIX: Final = "channel-"


def pool_name(clique: str) -> str:
    """The channel pool of `clique`: `clique-<clique>`."""
    return f"{POOL_PREFIX}{clique}"


def clique_of_pool(pool: str) -> str | None:
    """The clique a pool name stands for, or None when it is not one of our pool names."""
    clique = pool.removeprefix(POOL_PREFIX)
    return clique if pool.startswith(POOL_PREFIX) and clique else None


def pinned_clique_selector(clique: str) -> str:
    """CEL that admits only channels of `clique`'s pool (the channel devices carry a `clique`
    attribute), so the scheduler places a pinned domain's pods there or nowhere."""
    return f'device.attributes["{DRIVER}"].clique == "{clique}"'


_PINNED_RE: Final = re.compile(r'^device\.attributes\["' + re.escape(DRIVER) + r'"\]\.clique == "([^"]+)"$')


def pinned_clique_of(expression: str) -> str | None:
    """The clique a channel claim's selector pins (the inverse of `pinned_clique_selector`), or None."""
    m = _PINNED_RE.match(expression)
    return m.group(1) if m else None


def gpu_device(index: int) -> str:
    """A node's GPU as a device of GPU_DRIVER: `gpu-<index>` (NVML's index when first seen this boot)."""
    return f"gpu-{index}"


def gpu_slice_name(node: str) -> str:
    """The ResourceSlice of `node`'s GPUs: `<node>-gpus`, or a digest of the node name when that
    would be longer than an object name may be."""
    name = f"{node}-gpus"
    if len(name) <= 253:
        return name
    return f"{node[:200].rstrip('.-')}-{hashlib.sha256(node.encode()).hexdigest()[:16]}-gpus"


def channel_device(channel: int) -> str:
    """The pool device for channel `channel`: `channel-<n>`."""
    return f"{DEVICE_PREFIX}{channel}"


def channel_of_device(device: str) -> int | None:
    """The channel a device name stands for (`channel-7` → 7), or None when it is not 1..2047."""
    digits = device.removeprefix(DEVICE_PREFIX)
    # Canonical decimal only: `channel-07` or `channel-٣` would be another device's name.
    if not (device.startswith(DEVICE_PREFIX) and digits.isascii() and digits.isdigit()) or digits != str(int(digits)):
        return None
    channel = int(digits)
    return channel if 1 <= channel <= MAX_CHANNEL else None
