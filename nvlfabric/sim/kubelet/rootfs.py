"""A container on a simulated node, as a container runtime makes it: its own mount view, its node's processes.

`python -m nvlfabric.sim.kubelet.rootfs SPEC`, started by the simulated kubelet, enters the
pod's network namespace when it has one (`spec.netns`: nvlfabric/sim/podnetwork.py), then the
PID namespace its container's is made in (`spec.pidns`: each simulated node is a machine of its
own, whose /proc shows its processes only, and whose first process reaps orphans; a pod that
shares its process namespace has one of its own in it, held by its sandbox), and with
`spec.own_pidns` a new one in that for the container alone (as a runtime gives each container
that neither shares its pod's nor uses the host's): its first process is the shim as an init
(`nvlfabric-shim --init`), which reaps and ends with the container, and the kernel then kills
everything the container left running. It forks the container there, writes the container's
pid to `spec.pid_file`, and becomes its shim: it execs
`spec.shim` (nvlfabric/sim/shim, C, a few hundred kB where this interpreter is 14 MB), which
forwards signals and exits with the container's status. With `spec.cri_log` the shim is also the
container's log writer, as a runtime's shim is: the container's stdout and stderr become lines
of the CRI log format (`<RFC 3339 time> stdout|stderr F <line>`) in that file, which the real
kubelet reads for `kubectl logs`; without it they are the proxy's own, a plain log.

The container takes a mount namespace of its own (every mount below exists in it only), builds
its root and becomes the container's program:

- the root is a tmpfs at `spec.root` holding the machine's own top-level entries, each bound in
  (the "image" of every simulated container is this machine's file system); `/proc` is a procfs
  of the node's PID namespace with the node's `/proc/driver/nvidia` (`spec.proc_driver_nvidia`)
  and `/proc/devices` (`spec.proc_devices`),
  `/sys` the machine's, `/dev` is private: the usual character
  devices bound in, `/dev/pts`, `/dev/shm`, and the device nodes the container's CDI devices
  name, made there (mknod);
- each volume is bound at its real mount path (`/var/lib/kubelet`, `/var/run/secrets/...`): no
  argument or environment is rewritten. A mount path that does not exist on the machine is
  made without touching it: each directory on the way that would need a new entry is shadowed
  by a tmpfs into which its own entries are bound back;
- `/etc/hosts` is the pod's own file, as the kubelet manages it, and so is `/etc/resolv.conf`
  when the kubelet wrote one (`spec.resolv`);
- then chroot into the root, change to the working directory, exec the program with its env.

Nothing of the machine changes: the mounts vanish with the container's namespace. Failing to
set up (no privilege for namespaces, say) exits 127 with one line on stderr, which lands in the
container's log, as a runtime's CreateContainerError does.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import shutil
import signal
import stat
import sys
import time
from pathlib import Path
from typing import Any

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
CLONE_NEWNS = 0x00020000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT)
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
#: What every container's /dev has, bound from the machine's.
DEV_FILES = ("null", "zero", "full", "random", "urandom", "tty")
#: Top-level entries of the machine not bound into a container's root (made anew there instead).
OWN_TOP = {"proc", "sys", "dev"}


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    if _libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None, flags,
                   data.encode() if data else None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source} on {target}: {os.strerror(err)}")


def _bind(source: str, target: Path, *, readonly: bool = False) -> None:
    _mount(source, str(target), None, MS_BIND | MS_REC)
    if readonly:
        _mount("none", str(target), None, MS_BIND | MS_REMOUNT | MS_RDONLY)


def _mountpoint_like(source: str, target: Path) -> None:
    """An empty file or directory at `target` to mount `source` on (a symlink is copied as one)."""
    if os.path.islink(source):
        target.symlink_to(os.readlink(source))
    elif os.path.isdir(source):
        target.mkdir(exist_ok=True)
    else:
        target.touch(exist_ok=True)


class Root:
    """The container's root under construction: which of its directories are the machine's own."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.host_bound: dict[str, str] = {}  # container dir → the machine's dir bound there

    def populate(self) -> None:
        _mount("tmpfs", str(self.root), "tmpfs", MS_NOSUID, "mode=755")
        for name in sorted(os.listdir("/")):
            if name in OWN_TOP:
                continue
            source, target = f"/{name}", self.root / name
            _mountpoint_like(source, target)
            if not os.path.islink(source):
                _bind(source, target)
                self.host_bound[f"/{name}"] = source
        (self.root / "proc").mkdir()
        _mount("proc", str(self.root / "proc"), "proc", MS_NOSUID | MS_NODEV)  # this PID namespace's
        (self.root / "sys").mkdir()
        _bind("/sys", self.root / "sys")
        dev = self.root / "dev"
        dev.mkdir()
        _mount("tmpfs", str(dev), "tmpfs", MS_NOSUID, "mode=755")
        for name in DEV_FILES:
            if os.path.exists(f"/dev/{name}"):
                (dev / name).touch()
                _bind(f"/dev/{name}", dev / name)
        for name in ("pts", "shm"):
            (dev / name).mkdir()
        if os.path.isdir("/dev/pts"):
            _bind("/dev/pts", dev / "pts")
        _mount("tmpfs", str(dev / "shm"), "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")

    def resolve(self, path: str) -> str:
        """`path` in the container with its symlinks followed inside the root (absolute ones too)."""
        parts, out, hops = [p for p in path.split("/") if p], "", 0
        while parts:
            part = parts.pop(0)
            if part == "..":
                out = out.rsplit("/", 1)[0]
                continue
            if part == ".":
                continue
            candidate = f"{out}/{part}"
            real = self.root / candidate.lstrip("/")
            if real.is_symlink():
                hops += 1
                if hops > 40:
                    raise OSError(f"too many symlinks in {path}")
                link = os.readlink(real)
                parts = [p for p in link.split("/") if p] + parts
                out = "" if link.startswith("/") else out
                continue
            out = candidate
        return out or "/"

    def _shadow(self, directory: str) -> None:
        """Put a tmpfs over a directory of the machine's, with its entries bound back into it, so
        that new entries can be made in it without the machine's directory changing."""
        source = self.host_bound.pop(directory)
        target = self.root / directory.lstrip("/")
        _mount("tmpfs", str(target), "tmpfs", MS_NOSUID, "mode=755")
        for name in sorted(os.listdir(source)):
            child_source, child = f"{source}/{name}", target / name
            _mountpoint_like(child_source, child)
            if not os.path.islink(child_source):
                _bind(child_source, child)
                self.host_bound[f"{directory.rstrip('/')}/{name}"] = child_source

    def mountpoint(self, path: str, *, directory: bool) -> Path:
        """The place in the root to mount on at container path `path`, made if need be: every
        directory of the machine's on the way to the first missing entry is shadowed first."""
        resolved = self.resolve(path)
        parts = [p for p in resolved.split("/") if p]
        missing = next((i for i in range(len(parts))
                        if not (self.root.joinpath(*parts[:i + 1])).exists()), None)
        if missing is not None:
            for depth in range(1, missing + 1):
                ancestor = "/" + "/".join(parts[:depth])
                if ancestor in self.host_bound:
                    self._shadow(ancestor)
            for depth in range(missing + 1, len(parts) + 1):
                made = self.root.joinpath(*parts[:depth])
                if depth == len(parts) and not directory:
                    made.touch()
                else:
                    made.mkdir()
        return self.root / resolved.lstrip("/")


def device_node(root: Path, node: dict[str, Any]) -> None:
    path = root / "dev" / node["path"].removeprefix("/dev/").lstrip("/") if node["path"].startswith("/dev/") \
        else root / node["path"].lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    kind = stat.S_IFBLK if node.get("type") == "b" else stat.S_IFCHR
    if path.exists():
        path.unlink()
    os.mknod(path, (node.get("fileMode") or 0o666) | kind, os.makedev(int(node["major"]), int(node["minor"])))


def build(spec: dict[str, Any]) -> None:
    root = Root(Path(spec["root"]))
    root.populate()
    if (nvidia := spec.get("proc_driver_nvidia")) and os.path.isdir(nvidia):
        # What the NVIDIA kernel module shows in /proc on a GPU node (version, capabilities):
        # procfs cannot make it, so a tmpfs over /proc/driver holds a copy of the node's
        # directory. A copy, not a bind: on a node /proc/driver/nvidia is no mount point, and
        # NVIDIA's plugin unmounts whatever is mounted below it (the runtime's masks of params).
        driver = root.root / "proc" / "driver"
        _mount("tmpfs", str(driver), "tmpfs", MS_NOSUID | MS_NODEV, "mode=555")
        shutil.copytree(nvidia, driver / "nvidia", symlinks=True)
        _mount("none", str(driver), None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    if (devices := spec.get("proc_devices")) and os.path.isfile(devices):
        # The loaded driver's majors (nvidia-caps-imex-channels...) are in the kernel's
        # /proc/devices, which drivers read inside their container to make channel nodes.
        _bind(devices, root.root / "proc" / "devices", readonly=True)
    for m in sorted(spec.get("mounts", []), key=lambda m: m["target"].count("/")):
        target = root.mountpoint(m["target"], directory=os.path.isdir(m["source"]))
        _bind(m["source"], target, readonly=bool(m.get("readonly")))
    for node in spec.get("devices", []):
        device_node(root.root, node)
    if spec.get("hosts") is not None:
        hosts = Path(spec["hosts"])
        _bind(str(hosts), root.mountpoint("/etc/hosts", directory=False))
    if spec.get("resolv") is not None:
        _bind(spec["resolv"], root.mountpoint("/etc/resolv.conf", directory=False))


def _call(fn: str, *args: Any) -> None:
    if getattr(_libc, fn)(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{fn}: {os.strerror(err)}")


def _container(spec: dict[str, Any]) -> int:
    """In the forked child: a mount namespace of its own, the root built, then the program."""
    try:
        _call("unshare", CLONE_NEWNS)
        _mount("none", "/", None, MS_REC | MS_PRIVATE)  # nothing of ours propagates to the machine
        build(spec)
        os.chroot(spec["root"])
        os.chdir(spec.get("cwd") or "/")
        program = spec["argv"][0]
        path = program if "/" in program else shutil.which(program, path=spec["env"].get("PATH")) or program
        os.execve(path, spec["argv"], spec["env"])
    except OSError as exc:
        print(f"nvlfabric-sim: cannot start the container ({exc})", file=sys.stderr, flush=True)
    return 127


def namespace_init(unshare_pid: int, timeout_s: float = 5.0) -> int | None:
    """The host pid of the first process of the PID namespace `unshare --pid --fork` (pid
    `unshare_pid`) made: its one child. None if it did not start within `timeout_s`."""
    children = Path(f"/proc/{unshare_pid}/task/{unshare_pid}/children")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            found = children.read_text().split()
        except OSError:
            found = []
        if found:
            return int(found[0])
        time.sleep(0.01)
    return None


def _own_namespace(spec: dict[str, Any]) -> None:
    """In the forked child (in the namespace the container's is made in): a PID namespace of the
    container's own inside it. Its first process is the shim as an init, the container its child
    (pid 2); when the container exits, so does its init, and the kernel kills the rest. (A new
    namespace can be made only from inside its parent, hence this child, which stays as the
    init's shim: it waits for it and forwards signals.)"""
    try:
        _call("unshare", CLONE_NEWPID)
        init = os.fork()
        if init == 0:
            container = os.fork()
            if container == 0:
                os._exit(_container(spec))
            os.execv(spec["shim"], [spec["shim"], "--init", str(container)])
        os.execv(spec["shim"], [spec["shim"], str(init)])
    except OSError as exc:
        print(f"nvlfabric-sim: cannot start the container ({exc})", file=sys.stderr, flush=True)
    os._exit(127)


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[1]).read_text())
    if spec.get("netns"):  # the pod's network namespace (podnetwork.py): its shim's and container's
        with open(spec["netns"]) as ns:
            _call("setns", ns.fileno(), CLONE_NEWNET)
    if spec.get("pidns"):
        with open(spec["pidns"]) as ns:
            _call("setns", ns.fileno(), CLONE_NEWPID)  # for the children from now on
    own = bool(spec.get("own_pidns"))
    pipes = {"stdout": os.pipe(), "stderr": os.pipe()} if spec.get("cri_log") else {}
    child = os.fork()
    if child == 0:
        for fd, (_, write) in zip((1, 2), pipes.values(), strict=False):
            os.dup2(write, fd)
        for read, write in pipes.values():
            os.close(read)
            os.close(write)
        if own:
            _own_namespace(spec)
        os._exit(_container(spec))
    # Signals that come before the shim runs are the container's too.
    for sig in FORWARDED:
        signal.signal(sig, lambda n, _f: os.kill(child, n))
    if spec.get("pid_file"):
        # The container itself, for kill -9 from outside (in its own namespace: its init's child).
        init = namespace_init(child) if own else None  # (own: child → the namespace's init → the container)
        container_pid = namespace_init(init) if init is not None else child
        Path(spec["pid_file"]).write_text(f"{container_pid or child}\n")
    argv = [spec["shim"], str(child)]
    if pipes:
        for read, write in pipes.values():
            os.close(write)
            os.set_inheritable(read, True)
        argv += [spec["cri_log"], *(str(read) for read, _ in pipes.values())]
    os.execv(spec["shim"], argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
