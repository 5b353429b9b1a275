"""`NvlfabricDriver`: nvlfabric's DRA driver installed as Pulumi resources.

Installs the ComputeDomain CRD and every object of the driver manifest (`nvlfabric.manifests`:
`crds/`, `driver/driver.yaml`)
(namespace, DeviceClass, RBAC, admission policies, the node-agent and IMEX-keeper DaemonSets and
the controller Deployment) through `pulumi_kubernetes.yaml.v2.ConfigGroup`, so the manifests stay the one source
and this component only applies its settings to them. Every object is labelled
`app.kubernetes.io/part-of: nvlfabric` and `app.kubernetes.io/component`.
"""

from __future__ import annotations

import copy
from typing import Any, Final, Literal

import pulumi
import pulumi_kubernetes as k8s
import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from nvlfabric import manifests
from nvlfabric.api import names
from nvlfabric.api.computedomain import IMEXAuthentication, IMEXMode
from nvlfabric.api.names import COMPONENT_LABEL
from nvlfabric.components import program
from nvlfabric.components.args import PART_OF, validate

_ABS_PATH = r"^/[^\s]*$"
# [registry host[:port]/]path[:tag][@sha256:digest], as container image references are written.
_IMAGE = (r"^([A-Za-z0-9][-A-Za-z0-9]*(\.[A-Za-z0-9][-A-Za-z0-9]*)*(:[0-9]{1,5})?/)?"
          r"[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*"
          r"(:[\w][\w.-]{0,127})?(@sha256:[0-9a-f]{64})?$")


class NvlfabricDriverArgs(BaseModel):
    """The settings of the driver install."""

    model_config = ConfigDict(extra="forbid")

    image: str = Field(names.AGENT_IMAGE, pattern=_IMAGE,
                       description="the node agent/controller image; default nvlfabric/node-agent tagged with this "
                                   "release of nvlfabric, e.g. nvlfabric/node-agent:0.1.0")
    driver_root: str = Field("/run/nvidia/driver", pattern=_ABS_PATH,
                             description="an absolute host path where the NVIDIA driver is installed "
                                         "(/run/nvidia/driver with the GPU operator, / for a host install)")
    kubelet_root: str = Field("/var/lib/kubelet", pattern=_ABS_PATH,
                              description="the kubelet's absolute root directory on the host (--root-dir)")
    channels_per_clique: int = Field(
        names.DEFAULT_CHANNELS_PER_CLIQUE, ge=1, le=names.MAX_CHANNELS_PER_CLIQUE,
        description=f"IMEX channels per NVLink clique, 1..{names.MAX_CHANNELS_PER_CLIQUE} (channels 1..N are handed "
                    "out; channel 0 never is)")
    channel_quota_per_namespace: int = Field(
        names.DEFAULT_CHANNEL_QUOTA_PER_NAMESPACE, ge=0, le=names.MAX_CHANNEL_QUOTA_PER_NAMESPACE,
        description=f"the IMEX channels one namespace's claims may hold, 0..{names.MAX_CHANNEL_QUOTA_PER_NAMESPACE} "
                    "(0 turns the quota off); the controller keeps it as a ResourceQuota in each namespace with "
                    "ComputeDomains, and a platform raises it for one namespace with the Namespace annotation "
                    f"{names.CHANNEL_QUOTA_ANNOTATION}")
    imex_modes: list[IMEXMode] = Field(
        default_factory=lambda: [IMEXMode.CLIQUE_SCOPED, IMEXMode.DEDICATED], min_length=1,
        description="the IMEX modes the agents accept for ComputeDomains: CliqueScoped (one persistent IMEX "
                    "daemon per clique on each node) and/or Dedicated (a daemon per ComputeDomain); allow only "
                    "one to keep nodes at one IMEX daemon each")
    imex_authentication: IMEXAuthentication = Field(
        IMEXAuthentication.DISABLED,
        description="the default imexAuthentication of Dedicated ComputeDomains whose spec does not say: TLS (each "
                    "domain's IMEX daemons authenticate with certificates of the domain's own authority, issued by "
                    "the controller to member nodes only) or Disabled; a domain keeps what it started with")
    imex_cert_validity_s: int = Field(
        names.DEFAULT_IMEX_CERT_VALIDITY_S, ge=names.MIN_IMEX_CERT_VALIDITY_S,
        description="seconds an IMEX node certificate lasts; agents renew it after two thirds, under the running "
                    "domain")
    gpu_devices: Literal["DevicePlugin", "DRA"] = Field(
        "DevicePlugin",
        description="who hands out the nodes' GPUs: DevicePlugin (NVIDIA's device plugin or another, as "
                    "nvidia.com/gpu; nvlfabric publishes none) or DRA (each agent publishes its node's GPUs as "
                    "devices of driver gpu.nvlfabric.io, a GPU whose NVLink fabric is unhealthy carrying a device "
                    "taint, and DeviceClass gpu.nvlfabric.io serves nvidia.com/gpu requests on nodes without a "
                    "device plugin); never DRA where a device plugin offers the same GPUs, which would hand a GPU "
                    "out twice")
    gpu_taint_effect: Literal["NoSchedule", "NoExecute", "None"] = Field(
        names.DEFAULT_GPU_TAINT_EFFECT,
        description="what the device taint of a GPU whose NVLink fabric is unhealthy does (DRA device taints on the "
                    "node's GPU slice, driver gpu.nvlfabric.io): NoSchedule (no new claim gets the GPU; running pods "
                    "stay), NoExecute (also evict the pods whose claims hold it, unless they tolerate the taint), None "
                    "(only show it)")
    labels: dict[str, str] = Field(default_factory=dict, description="extra labels for every object")

    @field_validator("kubelet_root")
    @classmethod
    def _socket_fits(cls, root: str) -> str:
        sock = names.imex_keeper_socket(root)
        if len(sock.encode()) > names.MAX_UNIX_SOCKET_PATH:
            raise ValueError(f"too long: the IMEX keeper's socket under it would have {len(sock.encode())} bytes, "
                             f"a unix socket path at most {names.MAX_UNIX_SOCKET_PATH}; use a shorter kubelet root "
                             f"({sock})")
        return root

    @field_validator("imex_modes")
    @classmethod
    def _unique_modes(cls, modes: list[IMEXMode]) -> list[IMEXMode]:
        if len(set(modes)) != len(modes):
            raise ValueError("each IMEX mode at most once")
        return modes


def _label(obj: dict[str, Any], extra: dict[str, str]) -> None:
    meta = obj.setdefault("metadata", {})
    lab = meta.setdefault("labels", {}) or {}
    meta["labels"] = {**extra, **lab, **PART_OF}
    meta["labels"].setdefault(COMPONENT_LABEL, "driver")


def _set_env(container: dict[str, Any], name: str, value: str) -> None:
    env = container.setdefault("env", [])
    for item in env:
        if item.get("name") == name:
            item.clear()
            item.update({"name": name, "value": value})
            return
    env.append({"name": name, "value": value})


#: driver.yaml's kinds that pulumi-kubernetes 4.25's SDK has no class for (Kubernetes 1.36's
#: MutatingAdmissionPolicy): created one by one as generic custom resources, not by the ConfigGroup.
UNTYPED_KINDS: Final = ("MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding")


def driver_objects(args: NvlfabricDriverArgs, manifest: str | None = None) -> list[dict[str, Any]]:
    """The objects of driver.yaml with `args` applied (pure: tested without a cluster)."""
    text = manifest if manifest is not None else manifests.read(manifests.DRIVER_FILE)
    docs = [d for d in yaml.safe_load_all(text) if d]
    out = []
    for doc in docs:
        obj = copy.deepcopy(doc)
        _label(obj, args.labels)
        if obj["kind"] == "DeviceClass" and obj["metadata"]["name"] == names.GPU_DEVICE_CLASS \
                and args.gpu_devices == "DRA":
            obj["spec"]["extendedResourceName"] = names.GPU_RESOURCE
        if obj["kind"] in ("DaemonSet", "Deployment"):
            pod = obj["spec"]["template"]["spec"]
            for c in pod["containers"]:
                c["image"] = args.image
                if obj["kind"] == "Deployment":
                    _set_env(c, "CHANNELS_PER_CLIQUE", str(args.channels_per_clique))
                    _set_env(c, "CHANNEL_QUOTA_PER_NAMESPACE", str(args.channel_quota_per_namespace))
                    # Only when set: an install that does not use them keeps the controller's template
                    # of earlier releases (an upgrade's preview shows no change there).
                    if args.imex_authentication is not IMEXAuthentication.DISABLED:
                        _set_env(c, "IMEX_AUTHENTICATION", args.imex_authentication.value)
                    if args.imex_cert_validity_s != names.DEFAULT_IMEX_CERT_VALIDITY_S:
                        _set_env(c, "IMEX_CERT_VALIDITY", str(args.imex_cert_validity_s))
                if any(e.get("name") == "PUBLISH_GPUS" for e in c.get("env") or []):
                    _set_env(c, "PUBLISH_GPUS", "true" if args.gpu_devices == "DRA" else "false")
                if any(e.get("name") == "GPU_TAINT_EFFECT" for e in c.get("env") or []):
                    _set_env(c, "GPU_TAINT_EFFECT", args.gpu_taint_effect)
                if any(e.get("name") == "IMEX_MODES" for e in c.get("env") or []):
                    _set_env(c, "IMEX_MODES", ",".join(m.value for m in args.imex_modes))
                for m in c.get("volumeMounts") or []:
                    if m.get("name") == "kubelet":
                        m["mountPath"] = args.kubelet_root
                if any(e.get("name") == "KUBELET_ROOT" for e in c.get("env") or []):
                    _set_env(c, "KUBELET_ROOT", args.kubelet_root)
            for v in pod.get("volumes") or []:
                if v.get("name") == "kubelet" and "hostPath" in v:
                    v["hostPath"]["path"] = args.kubelet_root
                if v.get("name") == "driver-root" and "hostPath" in v:
                    v["hostPath"]["path"] = args.driver_root
        out.append(obj)
    return out


def crd_objects(args: NvlfabricDriverArgs) -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(manifests.read(manifests.CRD_FILE)) if d]
    for d in docs:
        _label(d, args.labels)
        d["metadata"]["labels"][COMPONENT_LABEL] = "crd"
    return docs


class NvlfabricDriver(pulumi.ComponentResource):
    """nvlfabric's DRA driver: the ComputeDomain CRD, the DeviceClass, RBAC, admission policies,
    the node agent and the IMEX keeper (DaemonSets) and the controller (Deployment)."""

    namespace: pulumi.Output[str]
    device_class: pulumi.Output[str]
    crd: pulumi.Output[str]
    image: pulumi.Output[str]

    def __init__(self, resource_name: str, *, image: str = names.AGENT_IMAGE,
                 driver_root: str = "/run/nvidia/driver", kubelet_root: str = "/var/lib/kubelet",
                 channels_per_clique: int = names.DEFAULT_CHANNELS_PER_CLIQUE,
                 channel_quota_per_namespace: int = names.DEFAULT_CHANNEL_QUOTA_PER_NAMESPACE,
                 imex_modes: list[str] | None = None,
                 imex_authentication: str = "Disabled", imex_cert_validity_s: int = names.DEFAULT_IMEX_CERT_VALIDITY_S,
                 gpu_devices: str = "DevicePlugin", gpu_taint_effect: str = names.DEFAULT_GPU_TAINT_EFFECT,
                 labels: dict[str, str] | None = None, opts: pulumi.ResourceOptions | None = None,
                 **unknown: Any) -> None:
        self.args = validate(NvlfabricDriverArgs, "NvlfabricDriver", resource_name, {
            "image": image, "driver_root": driver_root, "kubelet_root": kubelet_root,
            "channels_per_clique": channels_per_clique, "channel_quota_per_namespace": channel_quota_per_namespace,
            "labels": labels or {},
            "imex_authentication": imex_authentication, "imex_cert_validity_s": imex_cert_validity_s,
            "gpu_devices": gpu_devices, "gpu_taint_effect": gpu_taint_effect,
            **({"imex_modes": imex_modes} if imex_modes is not None else {})}, unknown)
        program.driver_modes(resource_name, {m.value for m in self.args.imex_modes})
        super().__init__("nvlfabric:index:NvlfabricDriver", resource_name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.crd_group = k8s.yaml.v2.ConfigGroup(f"{resource_name}-crd", objs=crd_objects(self.args), opts=child)
        objs = driver_objects(self.args)
        self.group = k8s.yaml.v2.ConfigGroup(
            f"{resource_name}-driver", objs=[o for o in objs if o["kind"] not in UNTYPED_KINDS],
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.crd_group]))
        # Kinds newer than pulumi-kubernetes 4.25's SDK: a ConfigGroup's children of those kinds fail
        # the program ("unknown resource type"), a generic custom resource of the same token does not.
        self.untyped = [k8s.apiextensions.CustomResource(
            f"{resource_name}-{o['metadata']['name']}-{o['kind'].lower()}", api_version=o["apiVersion"], kind=o["kind"],
            metadata=o["metadata"], spec=o["spec"], opts=child) for o in objs if o["kind"] in UNTYPED_KINDS]
        self.namespace = pulumi.Output.from_input(names.NAMESPACE)
        # Outputs resolve once the objects exist, so dependants wait for the install.
        self.device_class = self.group.resources.apply(lambda _: names.DEVICE_CLASS)
        self.crd = self.crd_group.resources.apply(lambda _: "computedomains.nvlfabric.io")
        self.image = pulumi.Output.from_input(self.args.image)
        self.register_outputs({"namespace": self.namespace, "device_class": self.device_class,
                               "crd": self.crd, "image": self.image})
