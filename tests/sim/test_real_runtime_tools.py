"""The real container runtime, built from its Go modules by tools/build.py (issue 52, item 1): runc
runs a container from a busybox rootfs on this machine, and containerd starts on a root, state and
socket of its own, from the config a containerd node runs with (CRI plugin, CDI on), and answers
`ctr`: what a node needs of them, checked apart from a cluster (tests/sim/test_real_kubelet.py
runs the node)."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvlfabric.sim import containerdnode
from nvlfabric.sim.paths import load_tools

BUSYBOX = Path("/bin/busybox")  # Debian's busybox-static (make sysdeps)


def tool(name: str) -> Path:
    return load_tools().binary(name)


def cni_dir() -> Path:
    found = load_tools().cni_dir
    assert found is not None and found.is_dir(), "no CNI plugins: `make tools` builds them into build/cni"
    return found


def test_runc_runs_a_container_from_a_busybox_rootfs(tmp_path: Path) -> None:
    if not BUSYBOX.exists():
        pytest.fail(f"{BUSYBOX} is missing: `make sysdeps` installs Debian's busybox-static")
    bundle = tmp_path / "bundle"
    (bundle / "rootfs" / "bin").mkdir(parents=True)
    shutil.copy2(BUSYBOX, bundle / "rootfs" / "bin" / "busybox")
    runc = str(tool("runc"))
    assert "runc version 1.5.3" in subprocess.run([runc, "--version"], capture_output=True, text=True,
                                                  check=True).stdout
    subprocess.run([runc, "spec"], cwd=bundle, check=True)
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"]["terminal"] = False
    spec["process"]["args"] = ["/bin/busybox", "sh", "-c", "echo hello from $(/bin/busybox hostname); "
                                                           "/bin/busybox ps -o pid,args"]
    (bundle / "config.json").write_text(json.dumps(spec))
    name = f"nvlfabric-test-{tmp_path.name[-12:]}"
    root = tmp_path / "runc-root"
    done = subprocess.run([runc, "--root", str(root), "run", "--bundle", str(bundle), name],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "hello from runc"  # the spec's own hostname: a UTS namespace of its own
    # A PID namespace of its own: its one process (the shell exec'd ps) is PID 1, no host process seen.
    assert [ln.split(maxsplit=1) for ln in lines[2:]] == [["1", "/bin/busybox ps -o pid,args"]], done.stdout


@contextlib.contextmanager
def containerd(tmp_path: Path) -> Iterator[Path]:
    """containerd on a root, state and socket of its own, from the config a containerd node of the
    simulator runs with (sim/containerdnode.py: containerd's own format, v3)."""
    dirs = containerdnode.ContainerdDirs(tmp_path)
    block = containerdnode.PodNetworkBlock(bridge="nvlsimtest", subnet="10.240.0.0/12", gateway="10.240.0.1",
                                           first="10.240.0.130", last="10.240.0.254")
    containerdnode.write(dirs, runc=tool("runc"), cni_bin=cni_dir(), pause_image="localhost/nvlfabric-sim/pause:1",
                         block=block)
    sock, config = dirs.socket, dirs.config
    log = (tmp_path / "containerd.log").open("w")
    proc = subprocess.Popen([str(tool("containerd")), "--config", str(config)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while not sock.exists():
            assert proc.poll() is None, (tmp_path / "containerd.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "containerd did not make its socket within 30 s"
            time.sleep(0.1)
        yield sock
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def test_containerd_starts_with_its_cri_plugin_and_cdi_and_answers_ctr(tmp_path: Path) -> None:
    with containerd(tmp_path) as sock:
        ctr = [str(tool("ctr")), "--address", str(sock)]
        version = subprocess.run([*ctr, "version"], capture_output=True, text=True, timeout=30)
        assert version.returncode == 0, version.stderr
        assert "Server:" in version.stdout and "v2.4.2" in version.stdout.split("Server:")[1], version.stdout
        plugins = subprocess.run([*ctr, "plugins", "ls"], capture_output=True, text=True, timeout=30, check=True)
        rows = {(line.split()[0], line.split()[1]): line.split()[-1] for line in plugins.stdout.splitlines()[1:]
                if len(line.split()) >= 3}
        assert rows.get(("io.containerd.grpc.v1", "cri")) == "ok", plugins.stdout
        assert rows.get(("io.containerd.cri.v1", "runtime")) == "ok", plugins.stdout
        shim = tool("containerd-shim-runc-v2")
        assert subprocess.run([str(shim), "-v"], capture_output=True, text=True, timeout=30).returncode == 0
    cni = cni_dir()
    for plugin in ("bridge", "host-local", "loopback", "portmap"):
        answer = subprocess.run([str(cni / plugin)], env={"CNI_COMMAND": "VERSION"}, input='{"cniVersion":"1.0.0"}',
                                capture_output=True, text=True, timeout=30)
        assert "1.0.0" in json.loads(answer.stdout)["supportedVersions"], (plugin, answer.stdout, answer.stderr)
