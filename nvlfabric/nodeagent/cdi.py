"""CDI specs for prepared channel claims, and the channel device nodes behind them.

Names (DRA driver `channel.nvlfabric.io`; the `k8s.<driver>` vendor convention of the DRA example
driver and NVIDIA's compute-domain plugin):

- vendor `k8s.channel.nvlfabric.io`, class `claim`, so the kind is `k8s.channel.nvlfabric.io/claim`;
- one transient spec file per claim, `k8s.channel.nvlfabric.io-claim_<claimUID>.json` (the CDI
  transient-spec name `vendor-class_<id>`), written to the dynamic CDI directory (`/var/run/cdi`);
- device names carry the claim UID, so a runtime never serves a cached spec under a reused name:
  `<claimUID>-channel-<N>` for one channel (allocation mode Single), `<claimUID>-channels` for a set
  (allocation mode All, however many channels the set holds).

Each device injects, for every channel N it holds, the node `/dev/nvidia-caps-imex-channels/channel<N>`
(type c, the major of `nvidia-caps-imex-channels` in /proc/devices, minor N). The runtime creates the
node inside the container from type/major/minor; nothing has to exist on the host. The env
`NVLFABRIC_COMPUTE_DOMAIN=<ComputeDomain name>` and `NVLFABRIC_IMEX_CHANNEL=<N>` (comma-separated,
ascending, when the device holds several channels) tell the workload what it got.

Allocation mode All: NVIDIA injects all 2048 channels of the node, which gives the pod every other
ComputeDomain's channel too and defeats channel isolation (and a 2048-node spec is ~250 kB that every
runtime re-reads). Here "All" means every channel of *the claim's ComputeDomain* on this node, never
another domain's: one device, `<claimUID>-channels`, with one deviceNode per channel in the CD's set
(a domain's claim holds one channel, so today the set is that one channel). The set's name does not
depend on its size, so a spec an earlier agent wrote with all 2048 channels is narrowed under the
device ID the kubelet already holds (prepared.py).

`cdiVersion` is 0.5.0, the lowest that covers what we use: device names may start with a digit from
0.5.0 on, and ours start with the claim UID, which often does. deviceNodes with type/major/minor and
env exist since 0.3.0; we use no annotations (0.6.0), hostPath, intelRdt or netDevices.

Writes are atomic (temporary file that does not end in `.json`, so the runtime never reads it;
fsync; rename) and idempotent (identical content is not rewritten); removal tolerates a missing file.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from nvlfabric.api import names
from nvlfabric.api.kubelet.cdi import ContainerEdits, Device, DeviceNode, Spec
from nvlfabric.api.names import IMEX_CHANNEL_COUNT
from nvlfabric.nodeagent import files

__all__ = [
    "CDI_VERSION",
    "ENV_CHANNEL",
    "ENV_COMPUTE_DOMAIN",
    "MajorNotFound",
    "SpecWrite",
    "channel_device_node",
    "channel_path",
    "claim_spec",
    "device_name",
    "host_channel_path",
    "read_major",
    "release_channel_device_node",
    "remove_claim_spec",
    "remove_temp_files",
    "spec_file_name",
    "write_claim_spec",
]

CDI_VERSION = "0.5.0"


ENV_COMPUTE_DOMAIN = "NVLFABRIC_COMPUTE_DOMAIN"
ENV_CHANNEL = "NVLFABRIC_IMEX_CHANNEL"

_UID = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_.\-]*[A-Za-z0-9])?$")


def _check_channels(channels: Iterable[int]) -> list[int]:
    chosen = sorted(set(channels))
    if not chosen:
        raise ValueError("a claim needs at least one IMEX channel")
    bad = [c for c in chosen if not 0 <= c < IMEX_CHANNEL_COUNT]
    if bad:
        raise ValueError(f"IMEX channels must lie in 0..{IMEX_CHANNEL_COUNT - 1}, got {bad}")
    return chosen


def channel_list(channels: Sequence[int]) -> str:
    """Sorted channels as the env var shows them: `7`, `3,9`, or a run as `0-2047` (allocation mode
    All would otherwise put 2048 numbers into every container's environment)."""
    if len(channels) > 2 and channels[-1] - channels[0] == len(channels) - 1:
        return f"{channels[0]}-{channels[-1]}"
    return ",".join(str(c) for c in channels)


def _check_uid(claim_uid: str) -> str:
    if not _UID.match(claim_uid):
        raise ValueError(f"claim UID {claim_uid!r} cannot be part of a CDI device or file name")
    return claim_uid


def spec_file_name(claim_uid: str) -> str:
    """`k8s.channel.nvlfabric.io-claim_<claimUID>.json`."""
    return f"{names.CDI_SPEC_PREFIX}{_check_uid(claim_uid)}.json"


def device_name(claim_uid: str, channels: Sequence[int], *, channel_set: bool = False) -> str:
    """`<claimUID>-channel-<N>` for one channel, `<claimUID>-channels` for several or for a set
    (`channel_set`: allocation mode All, whatever its size)."""
    chosen = _check_channels(channels)
    uid = _check_uid(claim_uid)
    return f"{uid}-channel-{chosen[0]}" if len(chosen) == 1 and not channel_set else f"{uid}-channels"


def channel_path(channel: int) -> str:
    """The channel's device node path (in the container, and under the driver root on the host)."""
    return f"{names.IMEX_CHANNEL_DIR}/channel{channel}"


def claim_spec(*, claim_uid: str, channels: Sequence[int], major: int, compute_domain: str,
               channel_set: bool = False) -> Spec:
    """The transient spec of one prepared claim: one device holding all of the claim's channels
    (`channel_set`: allocation mode All, named as a set)."""
    chosen = _check_channels(channels)
    nodes = [DeviceNode(path=channel_path(c), type="c", major=major, minor=c) for c in chosen]
    edits = ContainerEdits(
        env=[f"{ENV_COMPUTE_DOMAIN}={compute_domain}", f"{ENV_CHANNEL}={channel_list(chosen)}"],
        device_nodes=nodes,
    )
    device = Device(name=device_name(claim_uid, chosen, channel_set=channel_set), container_edits=edits)
    return Spec(cdi_version=CDI_VERSION, kind=names.CDI_KIND, devices=[device])


@dataclass(frozen=True)
class SpecWrite:
    path: Path
    device_ids: tuple[str, ...]
    """Fully qualified CDI device ids, as returned to the kubelet (`k8s.channel.nvlfabric.io/claim=...`)."""
    changed: bool
    """False when the file already had exactly this content and was left alone."""


def write_claim_spec(cdi_dir: str | os.PathLike[str], claim_uid: str, spec: Spec) -> SpecWrite:
    """Write `spec` as the claim's transient spec file in `cdi_dir`, unless it already says exactly that."""
    directory = Path(cdi_dir)
    path = directory / spec_file_name(claim_uid)
    data = spec.to_json().encode()
    ids = tuple(spec.qualified(d.name) for d in spec.devices)
    try:
        if path.read_bytes() == data:
            return SpecWrite(path, ids, changed=False)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise OSError(exc.errno, f"reading the CDI spec {path}: {exc.strerror}") from exc
    try:
        directory.mkdir(parents=True, exist_ok=True)
        files.atomic_write(path, data)
    except OSError as exc:
        raise OSError(exc.errno, f"writing the CDI spec {path}: {exc.strerror or exc}") from exc
    return SpecWrite(path, ids, changed=True)


def remove_claim_spec(cdi_dir: str | os.PathLike[str], claim_uid: str) -> bool:
    """Delete the claim's spec file; False if it was not there."""
    path = Path(cdi_dir) / spec_file_name(claim_uid)
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise OSError(exc.errno, f"removing the CDI spec {path}: {exc.strerror}") from exc
    return True


def claim_spec_uids(cdi_dir: str | os.PathLike[str]) -> list[str]:
    """UIDs of the claims whose spec file is in `cdi_dir` (what is on disk, whatever the checkpoint says)."""
    prefix, suffix = names.CDI_SPEC_PREFIX, ".json"
    return sorted(p.name[len(prefix):-len(suffix)] for p in Path(cdi_dir).glob(f"{prefix}*{suffix}")
                  if _UID.match(p.name[len(prefix):-len(suffix)]))


# --------------------------------------------------------------------------------------------------
# /proc/devices and channel device nodes.


class MajorNotFound(LookupError):
    """The character device is not registered (driver not loaded?) or /proc/devices is malformed."""


_ENTRY = re.compile(r"^\s*(\d+)\s+(\S.*?)\s*$")


def read_major(proc_devices_path: str | os.PathLike[str], name: str) -> int:
    """The major number of the character device `name` from a /proc/devices-format file.

    Only the "Character devices:" section counts (block majors are a separate number space); lines
    that are not `<major> <name>` are skipped. The first entry with exactly this name wins.
    """
    path = Path(proc_devices_path)
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise MajorNotFound(f"reading {path} for the major of {name!r}: {exc}") from exc
    in_char = seen_char = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.endswith(":") and not _ENTRY.match(stripped):
            in_char = stripped == "Character devices:"
            seen_char = seen_char or in_char
            continue
        if in_char and (m := _ENTRY.match(line)) and m.group(2) == name:
            return int(m.group(1))
    if not seen_char:
        raise MajorNotFound(f"{path} has no 'Character devices:' section (not a /proc/devices file?)")
    raise MajorNotFound(f"no character device {name!r} in {path}: is the NVIDIA driver loaded "
                        f"(it registers {name!r} at module load)?")


def host_channel_path(driver_root: str | os.PathLike[str], channel: int) -> Path:
    """Where the agent creates the channel's device node on the host (under the driver root)."""
    return Path(driver_root) / channel_path(channel).lstrip("/")


def _is_channel_node(path: Path, major: int, channel: int) -> bool:
    try:
        st = path.lstat()
    except FileNotFoundError:
        return False
    return (stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) == major and os.minor(st.st_rdev) == channel
            and stat.S_IMODE(st.st_mode) == 0o666)


def channel_device_node(driver_root: str | os.PathLike[str], channel: int, major: int) -> Path:
    """Ensure `<driver_root>/dev/nvidia-caps-imex-channels/channel<N>` is char device major:N, mode 0666.

    A node that is already right is left alone; anything else at that path (a stale major after a
    driver reload, a plain file) is replaced atomically. Needs CAP_MKNOD.
    """
    _check_channels([channel])
    path = host_channel_path(driver_root, channel)
    if _is_channel_node(path, major, channel):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    try:
        os.mknod(tmp, stat.S_IFCHR | 0o666, os.makedev(major, channel))
    except PermissionError as exc:
        raise PermissionError(
            exc.errno or errno.EPERM,
            f"creating the IMEX channel device node {path} (char {major}:{channel}) was refused: "
            f"mknod needs CAP_MKNOD; run the node agent as root or with CAP_MKNOD ({exc.strerror})",
        ) from exc
    try:
        os.chmod(tmp, 0o666)  # mknod's mode is filtered by the umask
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return path


def remove_temp_files(cdi_dir: str | os.PathLike[str], driver_root: str | os.PathLike[str]) -> list[Path]:
    """Temporary files of our interrupted writes (an agent killed mid-write), removed at agent start:
    `.<our spec file>.*.tmp` in the CDI dir and `.channel<N>.*.tmp` beside the channel nodes. Never
    read as specs (they do not end in `.json`), but they would pile up."""
    removed: list[Path] = []
    candidates = [*Path(cdi_dir).glob(f".{names.CDI_SPEC_PREFIX}*.json.*.tmp"),
                  *host_channel_path(driver_root, 0).parent.glob(".channel*.tmp")]
    for path in candidates:
        with contextlib.suppress(OSError):
            path.unlink()
            removed.append(path)
    return removed


def channel_device_nodes(driver_root: str | os.PathLike[str]) -> list[int]:
    """Channels that have a device node under the driver root."""
    found = []
    for path in host_channel_path(driver_root, 0).parent.glob("channel*"):
        number = path.name.removeprefix("channel")
        if number.isdigit() and int(number) < IMEX_CHANNEL_COUNT:
            found.append(int(number))
    return sorted(found)


def release_channel_device_node(driver_root: str | os.PathLike[str], channel: int) -> bool:
    """Remove the channel's host device node; False if it was not there."""
    path = host_channel_path(driver_root, channel)
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True
