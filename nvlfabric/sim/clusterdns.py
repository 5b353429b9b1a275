"""The simulator's cluster DNS: what CoreDNS with its `kubernetes` plugin answers a pod, for the
names the simulator has addresses for, and NXDOMAIN at once for every other.

A pod with a network of its own (nvlfabric/sim/podnetwork.py) cannot reach this machine's
nameserver, so with the machine's /etc/resolv.conf every lookup of a name not in its /etc/hosts
waited out the resolver's 5 s timeout twice (NVIDIA's IMEX daemons, which resolve their peers by
name, spent 10 of their 17 s to a Ready domain there). The simulated kubelet gives such a pod a
resolv.conf naming this server, at the pod network's gateway, port 53, with the search path a
kubelet writes for `dnsPolicy: ClusterFirst` (sandbox.py).

Answers, from the Services and EndpointSlices the API server has (polled every POLL_S):
- `<service>.<namespace>.svc.<domain>`: the addresses of the Service's endpoints (the ready
  ones, and every one of a Service that publishes not-ready addresses); there are no virtual
  Service IPs here (no kube-proxy), so a ClusterIP Service's name answers its endpoints too;
- `<hostname>.<service>.<namespace>.svc.<domain>`: the endpoint of that hostname (a pod with
  `hostname` and `subdomain` under a headless Service: an Indexed Job's, a JobSet's, a
  StatefulSet's pods);
- `<a-b-c-d>.<namespace>.pod.<domain>`: a.b.c.d;
- an A query for any other name: NXDOMAIN; another type for a name that has addresses: no
  answer (NOERROR), so that a resolver asking A and AAAA at once is answered at once.
UDP only (an answer of 100 addresses still fits 1232 bytes; a bigger one is cut and flagged
truncated).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import logging
import struct
import sys
from collections.abc import Iterable, Mapping
from typing import Any, Final, cast

from lightkube import AsyncClient, KubeConfig
from lightkube.resources.core_v1 import Service
from lightkube.resources.discovery_v1 import EndpointSlice

log = logging.getLogger("nvlfabric.sim.clusterdns")

CLUSTER_DOMAIN: Final = "cluster.local"
PORT: Final = 53
POLL_S: Final = 1.0
TTL_S: Final = 5
MAX_UDP: Final = 1232
A: Final = 1
NXDOMAIN: Final = 3
SERVICE_NAME_LABEL: Final = "kubernetes.io/service-name"


def records(services: Iterable[Mapping[str, Any]], slices: Iterable[Mapping[str, Any]],
            domain: str = CLUSTER_DOMAIN) -> dict[str, list[str]]:
    """Name (lower case, no trailing dot) → its addresses, from Services and EndpointSlices as dicts (pure)."""
    publish_all = {(s["metadata"]["namespace"], s["metadata"]["name"])
                   for s in services if (s.get("spec") or {}).get("publishNotReadyAddresses")}
    known = {(s["metadata"]["namespace"], s["metadata"]["name"]) for s in services}
    out: dict[str, list[str]] = {}
    for sl in slices:
        meta = sl.get("metadata") or {}
        ns, svc = meta.get("namespace", ""), (meta.get("labels") or {}).get(SERVICE_NAME_LABEL, "")
        if (ns, svc) not in known or sl.get("addressType") != "IPv4":
            continue
        name = f"{svc}.{ns}.svc.{domain}".lower()
        out.setdefault(name, [])
        for ep in sl.get("endpoints") or []:
            ready = (ep.get("conditions") or {}).get("ready") is not False or (ns, svc) in publish_all
            addresses = [a for a in ep.get("addresses") or [] if a]
            if not addresses or not ready:
                continue
            out[name].extend(a for a in addresses if a not in out[name])
            if hostname := ep.get("hostname"):
                out.setdefault(f"{hostname}.{name}".lower(), []).extend(addresses)
    return out


def pod_address(name: str, domain: str = CLUSTER_DOMAIN) -> str | None:
    """`a-b-c-d.<namespace>.pod.<domain>` → a.b.c.d (pure)."""
    labels = name.split(".")
    suffix = ["pod", *domain.split(".")]
    if len(labels) != 2 + len(suffix) or labels[2:] != suffix:
        return None
    try:
        return str(ipaddress.IPv4Address(labels[0].replace("-", ".")))
    except ValueError:
        return None


def parse_query(data: bytes) -> tuple[int, int, str, int, bytes] | None:
    """(id, flags, name, qtype, the question's bytes) of a one-question query, or None (pure)."""
    if len(data) < 12:
        return None
    ident, flags, qdcount = struct.unpack("!HHH", data[:6])
    if qdcount != 1 or flags & 0x8000:
        return None
    labels, i = [], 12
    while i < len(data):
        n = data[i]
        if n == 0:
            break
        if n & 0xC0 or i + 1 + n > len(data):
            return None
        labels.append(data[i + 1:i + 1 + n].decode("ascii", errors="replace"))
        i += 1 + n
    if i + 5 > len(data):
        return None
    qtype = struct.unpack("!H", data[i + 1:i + 3])[0]
    return ident, flags, ".".join(labels).lower(), qtype, data[12:i + 5]


def reply(data: bytes, table: Mapping[str, list[str]], domain: str = CLUSTER_DOMAIN) -> bytes | None:
    """The answer to query `data` from `table` (pure); None when it is no query to answer."""
    query = parse_query(data)
    if query is None:
        return None
    ident, flags, name, qtype, question = query
    addresses = table.get(name)
    if addresses is None and (pod := pod_address(name, domain)) is not None:
        addresses = [pod]
    rd = flags & 0x0100
    if addresses is None:  # not a name of ours: NXDOMAIN, at once (authoritative for the cluster)
        return struct.pack("!HHHHHH", ident, 0x8400 | rd | NXDOMAIN, 1, 0, 0, 0) + question
    answers = [struct.pack("!HHHIH", 0xC00C, A, 1, TTL_S, 4) + ipaddress.IPv4Address(a).packed
               for a in addresses] if qtype == A else []
    room = (MAX_UDP - 12 - len(question)) // 16  # an A record is 16 bytes
    truncated = len(answers) > room
    answers = answers[:room]
    return (struct.pack("!HHHHHH", ident, 0x8400 | rd | (0x0200 if truncated else 0), 1, len(answers), 0, 0)
            + question + b"".join(answers))


class _Protocol(asyncio.DatagramProtocol):
    def __init__(self, table: dict[str, list[str]]) -> None:
        self.table = table
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        if (out := reply(data, self.table)) is not None and self.transport is not None:
            self.transport.sendto(out, addr)


async def serve(kubeconfig: str, listen: str, port: int = PORT) -> None:
    """Answer on `listen`:`port` until cancelled, the table refreshed from the API every POLL_S."""
    table: dict[str, list[str]] = {}
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_datagram_endpoint(lambda: _Protocol(table), local_addr=(listen, port))
    client = AsyncClient(config=KubeConfig.from_file(kubeconfig))
    print(f"serving cluster DNS ({CLUSTER_DOMAIN}) on {listen}:{port}", flush=True)
    try:
        while True:
            try:
                services = [s.to_dict() async for s in client.list(Service, namespace="*")]
                slices = [s.to_dict() async for s in client.list(EndpointSlice, namespace="*")]
                fresh = records(services, slices)
                table.clear()
                table.update(fresh)
            except Exception as exc:  # the API server away: keep answering from what was read
                log.warning("cluster DNS: reading Services and EndpointSlices failed: %s", exc)
            await asyncio.sleep(POLL_S)
    finally:
        transport.close()
        await client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nvlfabric.sim.clusterdns", description=__doc__.split("\n")[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--listen", required=True, help="the address to answer on (the pod network's gateway)")
    parser.add_argument("--port", type=int, default=PORT)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx2").setLevel(logging.WARNING)  # (a line per poll otherwise)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.kubeconfig, args.listen, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
