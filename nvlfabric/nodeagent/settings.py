"""The node agent's settings: one typed object, checked once in `main`.

Every setting has a flag and an environment-variable twin (the DaemonSet sets the latter, some from
the downward API). A bad value is one line naming the flag, its twin and what is allowed, and exit
code 2, never a traceback from deep inside the start-up.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from nvlfabric.api import names
from nvlfabric.api.computedomain import IMEXMode
from nvlfabric.daemon import process
from nvlfabric.daemon.process import SettingsError
from nvlfabric.nodeagent import checkpoint

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


@dataclass(frozen=True)
class Settings:
    node_name: str
    """This Node's name (the downward API's spec.nodeName)."""
    node_ip: str
    """This node's address for IMEX peers (the downward API's status.hostIP)."""
    kubelet_root: Path
    cdi_root: Path
    driver_root: Path
    """Where the NVIDIA driver's files are (NVML library, nvidia-imex)."""
    proc_devices: Path
    boot_id: Path
    kubeconfig: str
    """A kubeconfig file; empty: the pod's service account (`service_account_dir`)."""
    service_account_dir: str
    resync_s: float
    """How often housekeeping runs (IMEX domains, aborted checkpoint entries), in seconds. The fabric
    is read every second regardless (fabrichealth.py: its health shows within 5 s)."""
    imex_modes: frozenset[IMEXMode]
    log_format: process.LogFormat
    listen_address: str
    """Address of the health and metrics ports (the pod IP; empty: all addresses)."""
    health_port: int
    """gRPC health service that checks the kubelet sockets; 0 disables."""
    metrics_port: int
    """Prometheus metrics (/metrics); 0 disables."""
    imex_keeper_socket: Path
    """The IMEX keeper's socket (the `nvlfabric-imex` DaemonSet's pod runs this node's IMEX daemons)."""
    publish_gpus: bool = False
    """Publish the node's GPUs as DRA devices (nodeagent/gpus.py): only where no device plugin
    hands out the same GPUs (NvlfabricDriver gpu_devices='DRA')."""
    gpu_taint_effect: str = names.DEFAULT_GPU_TAINT_EFFECT
    """The effect of a sick GPU's device taint in the node's GPU slice (nodeagent/gpus.py)."""
    registration_timeout_s: float = 60.0
    """The agent exits (1) when the kubelet has not registered it this long after it started
    serving: its sockets are not where this node's kubelet looks. 0: wait for ever."""


def _parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m nvlfabric agent",
                                 description="The nvlfabric node agent: nvlfabric's DRA kubelet plugin.")

    def opt(flag: str, var: str, default: str, text: str = "", **kw: object) -> None:
        ap.add_argument(flag, default=env.get(var, default), help=f"{text} (${var})".lstrip(), **kw)  # type: ignore[arg-type]

    opt("--node-name", "NODE_NAME", "", "this Node's name")
    opt("--node-ip", "NODE_IP", "", "this node's address for IMEX peers (the downward API's status.hostIP)")
    opt("--kubelet-root", "KUBELET_ROOT", "/var/lib/kubelet")
    opt("--cdi-root", "CDI_ROOT", "/var/run/cdi")
    opt("--driver-root", "DRIVER_ROOT", "/run/nvidia/driver", "where the NVIDIA driver's files are")
    opt("--proc-devices", "PROC_DEVICES", "/proc/devices")
    opt("--boot-id", "BOOT_ID_PATH", str(checkpoint.DEFAULT_BOOT_ID_PATH))
    opt("--service-account-dir", "SERVICE_ACCOUNT_DIR", SA_DIR, "in-cluster credentials; --kubeconfig wins")
    opt("--kubeconfig", "KUBECONFIG", "")
    opt("--resync-seconds", "RESYNC_SECONDS", "30")
    opt("--imex-modes", "IMEX_MODES", "CliqueScoped,Dedicated", "comma-separated IMEX modes to prepare claims for")
    opt("--log-format", "LOG_FORMAT", "json", choices=["json", "text"])
    opt("--listen-address", "LISTEN_ADDRESS", "", "address for the health and metrics ports (the pod IP)")
    opt("--health-port", "HEALTH_PORT", "51515", "gRPC health service that checks the kubelet sockets; 0 disables")
    opt("--metrics-port", "METRICS_PORT", "0", "Prometheus metrics (/metrics); 0 disables")
    opt("--registration-timeout", "REGISTRATION_TIMEOUT", "60",
        "seconds to wait for the kubelet to register the plugin before exiting; 0: for ever")
    opt("--publish-gpus", "PUBLISH_GPUS", "false",
        "publish the node's GPUs as devices of driver gpu.nvlfabric.io, a sick one tainted; only where no device "
        "plugin hands out the same GPUs: true or false")
    opt("--gpu-taint-effect", "GPU_TAINT_EFFECT", names.DEFAULT_GPU_TAINT_EFFECT,
        "the device taint of a GPU whose NVLink fabric is unhealthy: NoSchedule (no new claim gets it), "
        "NoExecute (also evict the pods that hold it), None (only show it)")
    opt("--imex-keeper-socket", "IMEX_KEEPER_SOCKET", "",
        "the IMEX keeper's socket (default: keeper.sock in the IMEX work directory under the kubelet root)")
    return ap


def _timeout(value: str) -> float:
    try:
        if float(value) == 0:
            return 0.0
    except ValueError:
        pass
    try:
        return process.seconds(value, flag="--registration-timeout", env="REGISTRATION_TIMEOUT")
    except SettingsError as exc:
        raise SettingsError(f"{exc} (0: wait for ever)") from None


def _choice(value: str, allowed: Sequence[str], flag: str, env: str) -> str:
    """`value` when it is one of `allowed` (an environment twin is not checked by argparse)."""
    if value not in allowed:
        raise SettingsError(f"{flag} / ${env}: {value!r} is not one of {', '.join(allowed)}")
    return value


def _port(value: str, flag: str, env: str) -> int:
    return process.whole_number(value, flag=flag, env=env, low=0, high=65535, why=" (0 disables)")


def parse(argv: Sequence[str], env: Mapping[str, str] | None = None) -> Settings:
    """The settings from flags, else their environment twins, else defaults; a `SettingsError` for a bad one."""
    a = _parser(os.environ if env is None else env).parse_args(list(argv))
    if not a.node_name or not a.node_ip:
        raise SettingsError("--node-name / $NODE_NAME and --node-ip / $NODE_IP are required (the DaemonSet sets "
                            "them from the downward API: spec.nodeName, status.hostIP)")
    return Settings(
        node_name=a.node_name, node_ip=a.node_ip, kubelet_root=Path(a.kubelet_root), cdi_root=Path(a.cdi_root),
        driver_root=Path(a.driver_root), proc_devices=Path(a.proc_devices), boot_id=Path(a.boot_id),
        kubeconfig=a.kubeconfig, service_account_dir=a.service_account_dir,
        resync_s=process.seconds(a.resync_seconds, flag="--resync-seconds", env="RESYNC_SECONDS"),
        imex_modes=process.imex_modes(a.imex_modes), log_format=a.log_format, listen_address=a.listen_address,
        health_port=_port(a.health_port, "--health-port", "HEALTH_PORT"),
        metrics_port=_port(a.metrics_port, "--metrics-port", "METRICS_PORT"),
        registration_timeout_s=_timeout(a.registration_timeout),
        gpu_taint_effect=_choice(a.gpu_taint_effect, names.GPU_TAINT_EFFECTS, "--gpu-taint-effect", "GPU_TAINT_EFFECT"),
        publish_gpus=_choice(a.publish_gpus, ("true", "false"), "--publish-gpus", "PUBLISH_GPUS") == "true",
        imex_keeper_socket=Path(a.imex_keeper_socket or names.imex_keeper_socket(a.kubelet_root)))


def check_paths(cfg: Settings) -> None:
    """A `SettingsError` when the kubelet root or the driver root is not what it claims to be, so
    that a wrong `NvlfabricDriver(kubelet_root=..., driver_root=...)` stops the agent with the
    setting named (its pod restarts with back-off, the line in its logs and termination message)
    instead of running "healthy" while the kubelet never finds it or NVML never loads.

    - The kubelet makes `<root-dir>/plugins_registry` when it starts; without it nothing there is
      a kubelet's, and no kubelet would find our registration socket.
    - A driver root holds the NVML library (`discovery.LIB_DIRS`). Under the GPU Operator the
      driver container fills it once the driver is installed: until then the agent restarts and
      waits, as it should, instead of labelling the node not ready for good.
    """
    from nvlfabric.nodeagent import discovery

    registry = cfg.kubelet_root / "plugins_registry"
    if not registry.is_dir():
        raise SettingsError(
            f"--kubelet-root / $KUBELET_ROOT: {cfg.kubelet_root} has no plugins_registry directory, so it is not the "
            "kubelet's root directory (its --root-dir, /var/lib/kubelet unless changed) and the kubelet would never "
            "find this plugin; set NvlfabricDriver(kubelet_root=...) to it")
    if not cfg.driver_root.is_dir() or discovery.nvml_library(cfg.driver_root) is None:
        what = "does not exist" if not cfg.driver_root.exists() else \
            f"has no {discovery.LIB_NAME} (looked in {', '.join(discovery.LIB_DIRS[:3])}, ...)"
        raise SettingsError(
            f"--driver-root / $DRIVER_ROOT: {cfg.driver_root} {what}, so it is not an NVIDIA driver root; set "
            "NvlfabricDriver(driver_root=...) to where the driver's files are (the GPU Operator's driver container: "
            "/run/nvidia/driver; a driver installed on the host: /)")
