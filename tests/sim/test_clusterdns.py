"""The simulator's cluster DNS (nvlfabric/sim/clusterdns.py), pure: the names it has from Services and
EndpointSlices, its answers (A records, NXDOMAIN for other names, no answer for another type of a
known name, truncation), and a parser that never fails on bytes off the network. Served to pods:
tests/sim/test_pod_network.py."""

from __future__ import annotations

import ipaddress
import struct
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from lightkube.models.core_v1 import Container, PodDNSConfig, PodDNSConfigOption, PodSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Pod

from nvlfabric.sim import clusterdns as dns
from nvlfabric.sim.kubelet.sandbox import resolv_conf


def query(name: str, qtype: int = dns.A, ident: int = 0x1234) -> bytes:
    out = struct.pack("!HHHHHH", ident, 0x0100, 1, 0, 0, 0)
    for label in name.split("."):
        out += bytes([len(label)]) + label.encode()
    return out + b"\0" + struct.pack("!HH", qtype, 1)


def answer(data: bytes) -> tuple[int, int, list[str]]:
    """(rcode, flags, the A records' addresses) of a reply."""
    _, flags, _, ancount, _, _ = struct.unpack("!HHHHHH", data[:12])
    i = 12
    while data[i]:
        i += 1 + data[i]
    i += 5
    found = []
    for _ in range(ancount):
        _, _, _, _, length = struct.unpack("!HHHIH", data[i:i + 12])
        found.append(str(ipaddress.IPv4Address(data[i + 12:i + 12 + length])))
        i += 12 + length
    return flags & 0xF, flags, found


def svc(name: str, ns: str = "ml", publish: bool = False) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns}, "spec": {"publishNotReadyAddresses": publish}}


def endpoints(service: str, *eps: tuple[str, str | None, bool], ns: str = "ml") -> dict[str, Any]:
    return {"metadata": {"namespace": ns, "labels": {dns.SERVICE_NAME_LABEL: service}}, "addressType": "IPv4",
            "endpoints": [{"addresses": [ip], "hostname": host, "conditions": {"ready": ready}}
                          for ip, host, ready in eps]}


def test_a_headless_services_pods_are_found_by_service_and_by_hostname() -> None:
    table = dns.records([svc("train"), svc("web", publish=True)], [
        endpoints("train", ("10.0.0.2", "train-0", True), ("10.0.0.3", "train-1", False)),
        endpoints("web", ("10.0.0.9", None, False)),
        endpoints("gone", ("10.0.0.7", None, True))])  # its Service is gone: nothing of it
    assert table == {"train.ml.svc.cluster.local": ["10.0.0.2"], "train-0.train.ml.svc.cluster.local": ["10.0.0.2"],
                     "web.ml.svc.cluster.local": ["10.0.0.9"]}


def test_answers_are_the_names_addresses_and_nxdomain_at_once_for_any_other() -> None:
    table = {"train-0.train.ml.svc.cluster.local": ["10.0.0.2"]}
    rcode, flags, found = answer(dns.reply(query("Train-0.train.ml.svc.cluster.local"), table) or b"")
    assert (rcode, found) == (0, ["10.0.0.2"]) and flags & 0x8000 and flags & 0x0400  # a reply, authoritative
    assert answer(dns.reply(query("10-0-0-5.ml.pod.cluster.local"), table) or b"")[::2] == (0, ["10.0.0.5"])
    assert answer(dns.reply(query("nowhere.example.invalid"), table) or b"")[::2] == (dns.NXDOMAIN, [])
    assert answer(dns.reply(query("train-1.train.ml.svc.cluster.local"), table) or b"")[0] == dns.NXDOMAIN
    # AAAA of a known name: no answer, no error (the resolver asked A and AAAA at once: both answered now).
    assert answer(dns.reply(query("train-0.train.ml.svc.cluster.local", qtype=28), table) or b"")[::2] == (0, [])


def test_an_answer_too_big_for_udp_is_cut_and_flagged_truncated() -> None:
    many = [f"10.0.{i // 250}.{i % 250 + 1}" for i in range(300)]
    reply = dns.reply(query("big.ml.svc.cluster.local"), {"big.ml.svc.cluster.local": many}) or b""
    _, flags, found = answer(reply)
    assert len(reply) <= dns.MAX_UDP and flags & 0x0200 and found == many[:len(found)] and len(found) > 60


@given(st.binary(max_size=300))
def test_the_parser_never_fails_on_bytes_off_the_network(data: bytes) -> None:
    out = dns.reply(data, {"a.b": ["10.0.0.1"]})
    assert out is None or out[:2] == data[:2]


@given(st.lists(st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True), min_size=1, max_size=6))
def test_every_query_is_answered_with_its_own_question(labels: list[str]) -> None:
    name = ".".join(labels)
    data = query(name, ident=0xBEEF)
    parsed = dns.parse_query(data)
    assert parsed is not None and parsed[2] == name
    reply = dns.reply(data, {name: ["10.1.2.3"]}) or b""
    assert reply[:2] == b"\xbe\xef" and reply[12:12 + len(data) - 12] == data[12:]
    assert answer(reply)[2] == ["10.1.2.3"]


def test_a_pods_resolv_conf_follows_its_dns_policy_as_the_kubelet_writes_it() -> None:
    def pod(**spec: Any) -> Pod:
        return Pod(metadata=ObjectMeta(name="p", namespace="ml"),
                   spec=PodSpec(containers=[Container(name="c")], **spec))

    cluster = "search ml.svc.cluster.local svc.cluster.local cluster.local\nnameserver 10.16.0.1\noptions ndots:5\n"
    assert resolv_conf(pod(), "10.16.0.1") == cluster
    assert resolv_conf(pod(hostNetwork=True, dnsPolicy="ClusterFirstWithHostNet"), "10.16.0.1") == cluster
    assert resolv_conf(pod(hostNetwork=True), "10.16.0.1") is None  # ClusterFirst on the host's network: the node's
    assert resolv_conf(pod(dnsPolicy="Default"), "10.16.0.1") is None
    assert resolv_conf(pod(), None) is None  # no cluster DNS (no pod network)
    assert resolv_conf(pod(dnsConfig=PodDNSConfig(searches=["corp.example"], options=[
        PodDNSConfigOption(name="ndots", value="2"), PodDNSConfigOption(name="edns0")])), "10.16.0.1") == (
        "search ml.svc.cluster.local svc.cluster.local cluster.local corp.example\nnameserver 10.16.0.1\n"
        "options ndots:2 edns0\n")
    assert resolv_conf(pod(dnsPolicy="None", dnsConfig=PodDNSConfig(nameservers=["192.0.2.53"])), "10.16.0.1") == (
        "nameserver 192.0.2.53\n")
