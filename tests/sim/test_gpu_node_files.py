"""A simulated node carries what GPU software probes on a GB200 node, agreeing with its NVML.

nvidia-smi and libcuda in the driver root answer from the node's NVML stand-in; libcuda is named
after the driver version NVML reports; the GPUs' character devices have the minors NVML reports
and the majors of the node's /proc/devices; the IMEX management capability's file names its
device's minor (../shared/reference/real-kubelet.md, "What GPU software looks for on a node").
"""

from __future__ import annotations

import ctypes
import os
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from nvlfabric.sim import hardware
from nvlfabric.sim.nodes import SimNode, proc_devices_text, rack_nodes
from nvlfabric.sim.nvml.topology import DEFAULT_CUDA_DRIVER_VERSION, DEFAULT_DRIVER_VERSION


@dataclass(frozen=True)
class GpuNode:
    node: SimNode
    env: dict[str, str]  # the node's hardware identity, as its kubelet gives its processes
    missing: list[str]  # device files that could not be made here


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> GpuNode:
    state = tmp_path_factory.mktemp("gpu-node")
    (n,) = rack_nodes(state, racks=1, nodes_per_rack=1, first_rack=0)
    topo = hardware.write_topology(state, [n])
    n.prepare_dirs()
    hardware.install_driver_root(n, hardware.build_standins(state / "build"), topo.driver_version)
    missing = hardware.install_host_files(n, [g.minor for g in topo.nodes[0].gpus], topo.driver_version)
    return GpuNode(n, {**os.environ, **hardware.node_env(state, n)}, missing)


def _majors() -> dict[str, int]:
    char = proc_devices_text().split("Block devices:")[0]
    return {name: int(major) for major, name in (line.split() for line in char.splitlines()[1:] if line.strip())}


def test_nvidia_smi_lists_the_gpus_nvml_reports(node: GpuNode) -> None:
    n, env = node.node, node.env
    smi = n.driver_root / "usr" / "bin" / "nvidia-smi"
    listed = subprocess.run([str(smi), "-L"], env=env, capture_output=True, text=True, check=True).stdout
    lib = str(n.driver_root / "usr" / "lib64" / "libnvidia-ml.so.1")
    old = os.environ.copy()
    os.environ.update(env)
    try:
        nvml = ctypes.CDLL(lib)
        assert nvml.nvmlInit_v2() == 0
        count = ctypes.c_uint()
        assert nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 0
        uuids = []
        for i in range(count.value):
            handle = ctypes.c_void_p()
            assert nvml.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle)) == 0
            buf = ctypes.create_string_buffer(96)
            assert nvml.nvmlDeviceGetUUID(handle, buf, 96) == 0
            uuids.append(buf.value.decode())
    finally:
        os.environ.clear()
        os.environ.update(old)
    assert count.value == 4
    assert listed.splitlines() == [f"GPU {i}: NVIDIA GB200 (UUID: {u})" for i, u in enumerate(uuids)]
    csv = subprocess.run([str(smi), "--query-gpu=index,uuid,driver_version", "--format=csv,noheader"], env=env,
                         capture_output=True, text=True, check=True).stdout
    assert csv.splitlines()[0] == f"0, {uuids[0]}, {DEFAULT_DRIVER_VERSION}"
    # Without its NVML (no node identity), the real message and exit code 9.
    bare = subprocess.run([str(smi)], env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
    assert bare.returncode == 9 and "couldn't communicate with the NVIDIA driver" in bare.stderr


def test_libcuda_is_named_after_the_driver_version_and_answers_from_nvml(
        node: GpuNode) -> None:
    n, env = node.node, node.env
    lib64 = n.driver_root / "usr" / "lib64"
    for lib in ("libcuda.so", "libnvidia-ml.so"):  # as a real driver lays them out
        real = lib64 / f"{lib}.{DEFAULT_DRIVER_VERSION}"
        assert real.is_file() and not real.is_symlink(), f"{real.name} is not the library itself"
        assert os.readlink(lib64 / f"{lib}.1") == real.name and os.readlink(lib64 / lib) == f"{lib}.1"
        assert Path(os.path.realpath(lib64 / f"{lib}.1")) == real.resolve()
    probe = ("import ctypes,sys\nc=ctypes.CDLL(sys.argv[1])\nassert c.cuInit(0)==0\nv=ctypes.c_int()\n"
             "n=ctypes.c_int()\nc.cuDriverGetVersion(ctypes.byref(v))\nc.cuDeviceGetCount(ctypes.byref(n))\n"
             "b=ctypes.create_string_buffer(64)\nassert c.cuDeviceGetName(b,64,0)==0\n"
             "print(v.value,n.value,b.value.decode())\n")
    out = subprocess.run([sys.executable, "-c", probe, str(lib64 / "libcuda.so.1")], env=env, capture_output=True,
                         text=True, check=True).stdout.split(maxsplit=2)
    assert out == [str(DEFAULT_CUDA_DRIVER_VERSION), "4", "NVIDIA GB200\n"]


def test_the_driver_roots_files_are_regular_files_a_find_sees(node: GpuNode) -> None:
    root = node.node.driver_root
    found = subprocess.run(["find", str(root), "-type", "f"], capture_output=True, text=True, check=True).stdout
    names = {Path(p).name for p in found.split()}
    assert {"nvidia-smi", "nvidia-imex", "nvidia-imex-ctl", f"libcuda.so.{DEFAULT_DRIVER_VERSION}",
            f"libnvidia-ml.so.{DEFAULT_DRIVER_VERSION}"} <= names, names
    links = subprocess.run(["find", str(root), "-type", "l"], capture_output=True, text=True, check=True).stdout
    for link in links.split():  # what links there is, links within the driver root
        assert Path(os.path.realpath(link)).is_relative_to(root.resolve()), link


def test_the_device_files_agree_with_nvml_and_proc_devices(node: GpuNode) -> None:
    n, missing = node.node, node.missing
    caps = (n.host_dir("/proc/driver/nvidia") / "capabilities" / "fabric-imex-mgmt").read_text()
    minor = int(caps.split("DeviceFileMinor:")[1].split()[0])
    assert (n.host_dir("/proc/driver/nvidia") / "version").read_text().startswith(
        "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  " + DEFAULT_DRIVER_VERSION)
    if missing:
        pytest.skip(f"no CAP_MKNOD here: {missing[0]}")
    majors = _majors()
    dev = n.host_dir("/dev")
    for i in range(4):
        st = (dev / f"nvidia{i}").stat()
        assert stat.S_ISCHR(st.st_mode) and os.major(st.st_rdev) == majors["nvidia-frontend"] == 195
        assert os.minor(st.st_rdev) == i
    cap = (dev / "nvidia-caps" / f"nvidia-cap{minor}").stat()
    assert stat.S_ISCHR(cap.st_mode) and os.major(cap.st_rdev) == majors["nvidia-caps"]
    assert os.minor((dev / "nvidiactl").stat().st_rdev) == 255
    assert Path(dev / "nvidia-uvm").exists()
    for name in [f"nvidia{i}" for i in range(4)] + ["nvidiactl", "nvidia-uvm", f"nvidia-caps/nvidia-cap{minor}"]:
        # The driver root's dev/ has the same device nodes (a driver container looks there).
        there, here = (n.driver_root / "dev" / name).stat(), (dev / name).stat()
        assert stat.S_ISCHR(there.st_mode) and there.st_rdev == here.st_rdev, name
