"""Pod networks: each pod that is not `hostNetwork` gets a network namespace and an address of its own.

On a real node a CNI plugin gives every such pod a network namespace with an address of the
node's pod CIDR, so two pods may both listen on port 8080, and the kubelet probes, and other pods
reach, the pod at its IP. The simulator does the same with the kernel's own parts:

- one Linux bridge per simulator (`nvlsim<j>`) holding the gateway address, the first of the
  simulator's /12 (`10.<16 j>.0.0/12`, j in 1..15; 10.0.0.0/12 holds the Service range);
- per node a /25 of it, derived from its rack and index (so every process of the simulator, the
  simulated kubelet and the CRI stand-ins alike, knows it without asking): 126 pod addresses;
- per pod, a named network namespace (`ip netns`, so it outlives a restart of the kubelet that
  made it, as the pod's sandbox does) with loopback, an `eth0` of a veth pair whose other end is
  on the bridge, and a default route through the gateway. The API server listens on the gateway
  too, which is where such a pod's KUBERNETES_SERVICE_HOST points.

Services get a /24 of 10.0.0.0/12 per simulator (`10.0.<j>.0/24`), so the `kubernetes` Service's
cluster IP (`10.0.<j>.1`) is this simulator's alone. Where pods take KUBERNETES_SERVICE_HOST from
a real kubelet as it is (containerd nodes: nothing of ours stands between), `route_api_service`
does kube-proxy's part for that one Service: a DNAT of `10.0.<j>.1:443` to the API server at the
gateway, for the machine's own processes (hostNetwork pods) and for pods on the bridge, in an
iptables chain of the simulator's own that `down` removes.

`hostNetwork` pods (nvlfabric's agent and IMEX keeper) stay in the machine's namespace at their
node's loopback address, as before. Pods reach each other and the machine's gateway address, not
the nodes' loopback addresses (the kernel routes 127/8 nowhere but `lo`): which is why IMEX
daemons, which peer at node addresses, run in `hostNetwork` pods. Which simulator owns which j is
recorded under /run/nvlfabric-sim, so that two simulators on one machine (a demo and the test
suite) never share a subnet, and a crashed one's network is taken back by the next `up`.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import ipaddress
import secrets
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

NETNS_DIR = Path("/run/netns")
OWNERS_DIR = Path("/run/nvlfabric-sim")
SUBNETS = range(1, 16)
#: Addresses per node (a /25 of the simulator's /12); a real kubelet's default max-pods is 110.
NODE_BLOCK = 128
RACK_SLOTS = 32
"""Blocks per rack: a rack's nodes (18 in an NVL72) take their index's block, the rest are spare."""


class PodNetworkError(RuntimeError):
    """The pod network cannot be made; the message says why and what to do."""


def _ip(*args: str, stdin: str | None = None) -> None:
    try:
        done = subprocess.run(["ip", *args], input=stdin, capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise PodNetworkError("`ip` (iproute2) is not on this machine; `make sim-up` installs it, or "
                              "`apt-get install iproute2`") from None
    if done.returncode != 0:
        raise PodNetworkError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")


async def _aip(*args: str, stdin: str | None = None) -> None:
    proc = await asyncio.create_subprocess_exec("ip", *args, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                                stderr=subprocess.PIPE)
    _, err = await proc.communicate(stdin.encode() if stdin else None)
    if proc.returncode != 0:
        raise PodNetworkError(f"ip {' '.join(args)}: {err.decode(errors='replace').strip() or proc.returncode}")


def _iptables(*args: str) -> None:
    if shutil.which("iptables") is None:
        raise PodNetworkError("iptables is not installed (Debian's iptables): containerd nodes need it to reach "
                              "the API server at the `kubernetes` Service's address")
    res = subprocess.run(["iptables", "-t", "nat", *args], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise PodNetworkError(f"iptables -t nat {' '.join(args)}: {res.stderr.strip() or res.returncode}")


@dataclass(frozen=True)
class PodNetwork:
    index: int
    """j: the simulator's /12 is 10.<16 j>.0.0/12, its bridge nvlsim<j>."""

    @property
    def subnet(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(f"10.{16 * self.index}.0.0/12")

    @property
    def gateway(self) -> str:
        return str(self.subnet.network_address + 1)

    @property
    def bridge(self) -> str:
        return f"nvlsim{self.index}"

    @property
    def prefix(self) -> str:
        """Of this simulator's network namespaces' names."""
        return f"{self.bridge}-"

    @property
    def service_range(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(f"10.0.{self.index}.0/24")

    @property
    def api_service_ip(self) -> str:
        """The `kubernetes` Service's cluster IP: the range's first address, as the API server picks it."""
        return str(self.service_range.network_address + 1)

    @property
    def nat_chain(self) -> str:
        return f"NVLSIM{self.index}-SERVICES"

    def node_addresses(self, rack: int, index: int) -> list[str]:
        """The pod addresses of node `index` of rack `rack`, in the order they are handed out."""
        if not (0 <= index < RACK_SLOTS and 0 <= rack < 255):
            raise PodNetworkError(f"rack {rack} node {index}: pod networks hold racks 0..254 of up to "
                                  f"{RACK_SLOTS} nodes")
        base = self.subnet.network_address + (rack * RACK_SLOTS + index + 1) * NODE_BLOCK
        return [str(base + i) for i in range(1, NODE_BLOCK - 1)]

    def namespace(self, ip: str) -> str:
        return f"{self.prefix}{ip}"

    def namespace_path(self, ip: str) -> Path:
        return NETNS_DIR / self.namespace(ip)

    def in_use(self) -> set[str]:
        """Pod addresses whose namespace exists (made by any process of this simulator)."""
        try:
            names = [p.name for p in NETNS_DIR.iterdir()]
        except FileNotFoundError:
            return set()
        return {n[len(self.prefix):] for n in names if n.startswith(self.prefix)}

    # -- the machine's side --------------------------------------------------------------------

    def up(self) -> None:
        """The bridge with the gateway address (nothing when it is there)."""
        if Path(f"/sys/class/net/{self.bridge}").exists():
            return
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    def route_api_service(self, port: int) -> None:
        """`kubernetes` Service → the API server at the gateway's `port` (iptables nat; see above)."""
        self._unroute()
        rule = ["-d", f"{self.api_service_ip}/32", "-p", "tcp", "--dport", "443", "-j", "DNAT",
                "--to-destination", f"{self.gateway}:{port}"]
        _iptables("-N", self.nat_chain)
        _iptables("-A", self.nat_chain, *rule)
        for hook in ("OUTPUT", "PREROUTING"):
            _iptables("-I", hook, "-j", self.nat_chain)

    def _unroute(self) -> None:
        if shutil.which("iptables") is None:
            return
        for hook in ("OUTPUT", "PREROUTING"):
            while subprocess.run(["iptables", "-t", "nat", "-D", hook, "-j", self.nat_chain],
                                 capture_output=True, check=False).returncode == 0:
                pass
        for op in ("-F", "-X"):
            subprocess.run(["iptables", "-t", "nat", op, self.nat_chain], capture_output=True, check=False)

    def down(self) -> None:
        """Every pod namespace of this simulator, its Service routes, then its bridge."""
        self._unroute()
        for ip in self.in_use():
            with contextlib.suppress(PodNetworkError):
                _ip("netns", "delete", self.namespace(ip))
        if Path(f"/sys/class/net/{self.bridge}").exists():
            with contextlib.suppress(PodNetworkError):
                _ip("link", "delete", self.bridge)

    # -- a pod's side --------------------------------------------------------------------------

    async def sandbox(self, ip: str) -> Path:
        """The pod's network namespace at `ip`: kept when it exists whole (a restarted kubelet's
        pod), made again when it exists half made (a creation that failed midway)."""
        path, name = self.namespace_path(ip), self.namespace(ip)
        if path.exists():
            if await self._whole(name, ip):
                return path
            await _aip("netns", "delete", name)
        # The host end's name is new each time, not derived from the address: a namespace whose
        # name is gone lives on while a process still holds it, and its veth pair with it, so a
        # name made from an address handed out again would already exist.
        host_end = f"nvh{secrets.token_hex(6)}"
        try:
            # The host end is made with the pod's end already inside: two calls in all, not six.
            await _aip("-batch", "-", stdin=f"netns add {name}\n"
                       f"link add {host_end} type veth peer name eth0 netns {name}\n"
                       f"link set {host_end} master {self.bridge} up\n")
            await _aip("-n", name, "-batch", "-", stdin=f"link set lo up\n"
                       f"addr add {ip}/{self.subnet.prefixlen} dev eth0\nlink set eth0 up\n"
                       f"route add default via {self.gateway}\n")
        except PodNetworkError:  # nothing half made is left to be taken for whole
            if path.exists():
                with contextlib.suppress(PodNetworkError):
                    await _aip("netns", "delete", name)
            raise
        return path

    @staticmethod
    async def _whole(name: str, ip: str) -> bool:
        """Whether namespace `name` has its `eth0` at `ip`."""
        proc = await asyncio.create_subprocess_exec("ip", "-n", name, "-o", "-4", "addr", "show", "dev", "eth0",
                                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        out, _ = await proc.communicate()
        return proc.returncode == 0 and f" {ip}/" in out.decode(errors="replace")

    async def remove(self, ip: str) -> None:
        """The pod's namespace (its veth pair goes with it)."""
        if self.namespace_path(ip).exists():
            await _aip("netns", "delete", self.namespace(ip))


@contextlib.contextmanager
def _owners_locked() -> Iterator[None]:
    OWNERS_DIR.mkdir(parents=True, exist_ok=True)
    with (OWNERS_DIR / "podnet.lock").open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def claim(state_dir: Path, running: Callable[[Path], bool]) -> PodNetwork:
    """This simulator's pod network, made: its own from a previous `up` when recorded, else the
    first j no running simulator holds (`running(its state dir)`; a crashed one's is taken back)."""
    me = str(state_dir.resolve())
    with _owners_locked():
        owners = {j: OWNERS_DIR / f"podnet-{j}" for j in SUBNETS}
        mine = next((j for j, f in owners.items() if f.exists() and f.read_text() == me), None)
        if mine is None:
            for j, f in owners.items():
                owner = f.read_text() if f.exists() else ""
                if not owner or not running(Path(owner)):
                    mine = j
                    break
        if mine is None:
            raise PodNetworkError(f"all {len(SUBNETS)} pod networks of this machine are held by running "
                                  f"simulators (see {OWNERS_DIR}); stop one, or use --pod-network host")
        net = PodNetwork(mine)
        net.down()  # a crashed holder's namespaces and bridge, or this simulator's own of last time
        net.up()
        owners[mine].write_text(me)
        return net


def release(state_dir: Path) -> None:
    """Take down the pod network `state_dir`'s simulator holds, if any."""
    me = str(state_dir.resolve())
    with _owners_locked():
        for j in SUBNETS:
            f = OWNERS_DIR / f"podnet-{j}"
            if f.exists() and f.read_text() == me:
                PodNetwork(j).down()
                f.unlink()
