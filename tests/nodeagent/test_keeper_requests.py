"""What the IMEX keeper answers to requests that are not what an agent sends: a refusal naming the
field and the fix, the keeper staying up (it holds every daemon of the node), and, under AddressSanitizer,
never a crash or a sanitizer report whatever bytes arrive on its socket."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nvlfabric.nodeagent import imex, imexkeeper
from nvlfabric.nodeagent.imexkeeper import Ensure, Stop
from nvlfabric.sim.cluster import eventually
from tests.support.imexnodes import Nodes, ip
from tests.support.keepers import Keeper, program

DOMAIN_RULE = "1 to 63 of a-z, 0-9, '-' and '.', starting and ending with a letter or digit"
SANITIZER_REPORTS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:")


def refusal(error: str) -> bytes:
    """The reply line of a refusal, as every agent release decodes it (compact, ASCII, Reply's fields in order)."""
    return (json.dumps({"ok": False, "error": error, "done": None, "domains": []}, separators=(",", ":")) +
            "\n").encode()


ENSURE = '"op": "ensure", "domain": "a", "bind_address": "127.0.30.1", "cmd_port": 2, "members": ["127.0.30.1"]'

BAD_LINES = [
    ('{' + ENSURE + ', "server_port": "50000"}', 'Ensure.server_port: "50000" is not an integer'),
    ('{' + ENSURE + ', "server_port": true}', "Ensure.server_port: true is not an integer"),  # a bool is no int
    ('{' + ENSURE + ', "server_port": 1.0}', "Ensure.server_port: 1.0 is not an integer"),
    ('{' + ENSURE + ', "server_port": 70000}', "Ensure.server_port: 70000 is not a port number (1..65535)"),
    ('{' + ENSURE + ', "server_port": 123456789012345678901234567890}',
     "Ensure.server_port: 123456789012345678901234567890 is not an integer"),
    ('{"op": "ensure", "domain": "a", "bind_address": "x", "server_port": 1, "cmd_port": 2, "members": [1]}',
     "Ensure.members[0]: 1 is not a string"),
    ('{"op": "ensure", "domain": "a", "bind_address": "x", "server_port": 1, "cmd_port": 2, "members": "x"}',
     'Ensure.members: "x" is not a list of strings'),
    ('{"op": "ensure", "domain": "a", "bind_address": "x", "server_port": 1, "members": []}',
     "Ensure.cmd_port: missing"),
    ('{"op": "ensure", "domain": "a\\u0000", "bind_address": "x", "server_port": 1, "cmd_port": 2, "members": []}',
     'Ensure.domain: "a\\u0000" holds a NUL character'),
    ('{"op": "stop"}', "Stop.domain: missing"),
    ('{"op": "stop", "domain": "a", "force": true}', 'Stop: unknown field "force"; a Stop has op, domain'),
    ('{"op": "status", "op": "status"}', 'not JSON: key "op" given twice'),
    ('{"op": "restart"}', 'op: "restart" is not one of "ensure", "stop", "status"'),
    ('{"op": ["status"]}', 'op: ["status"] is not one of "ensure", "stop", "status"'),
    ('{}', 'op: missing; one of "ensure", "stop", "status"'),
    ('[{"op": "status"}]', "a request is a JSON object"),
    ("not json", "not JSON: expected a value at byte 0"),
    ('{"op": "status", "x": 1', "not JSON: expected ',' or '}', but the line ends"),
    ('{"op": "status", "x": "1', "not JSON: unterminated string at byte 22"),
    ('{"op": "status", "x": 1]', "not JSON: expected ',' or '}' at byte 23"),
    ('{"op": "status"} {}', "not JSON: unexpected text after the value at byte 17"),
    ('{"op": "st\\u00e9tus"}', 'op: "st\\u00e9tus" is not one of "ensure", "stop", "status"'),
    ('{"op": "\\ud800"}', "not JSON: lone surrogate escape at byte 8"),
    ('{"op": NaN}', "not JSON: expected a value at byte 7"),
    ("[" * 40 + "]" * 40, "not JSON: nested too deep at byte 32"),
    ("", "not JSON: expected a value, but the line ends"),
]


@pytest.fixture
def keeper(nodes: Nodes) -> Keeper:
    return nodes.keeper(1)


@pytest.mark.parametrize(("line", "error"), BAD_LINES)
def test_a_bad_request_is_refused_naming_the_field(keeper: Keeper, line: str, error: str) -> None:
    want = refusal(f"bad request: {error}")
    assert keeper.raw(line.encode() + b"\n") == want
    assert keeper.raw(line.encode(), half_close=True) == want  # a line may also end where the client stops sending
    assert keeper.status() == [] and keeper.proc.poll() is None


def test_bytes_that_are_not_utf8_are_refused_where_they_are(keeper: Keeper) -> None:
    assert keeper.raw(b'{"op": "st\xffatus"}\n') == refusal("bad request: not JSON: not UTF-8 at byte 10")
    assert keeper.raw(b'{"op": "\xed\xa0\x80"}\n') == refusal("bad request: not JSON: not UTF-8 at byte 8")


def test_long_values_are_quoted_shortened(keeper: Keeper) -> None:
    reply = imexkeeper.decode_reply(keeper.raw(json.dumps({"op": "stop", "domain": "a" * 5000}).encode() + b"\n"))
    assert reply.error == f'bad request: Stop.domain: "{"a" * 60}... is not a domain id ({DOMAIN_RULE})'


def ensure(**fields: Any) -> Ensure:
    base: dict[str, Any] = {"domain": "clique-a", "bind_address": ip(1), "server_port": 50000, "cmd_port": 50005,
                            "members": [ip(1)]}
    return Ensure(**{**base, **fields})


@pytest.mark.parametrize(("req", "error"), [
    (ensure(domain="Bad_ID"), f'Ensure.domain: "Bad_ID" is not a domain id ({DOMAIN_RULE})'),
    (ensure(domain="../etc"), f'Ensure.domain: "../etc" is not a domain id ({DOMAIN_RULE})'),
    (ensure(domain="a" * 64), f'Ensure.domain: "{"a" * 60}... is not a domain id ({DOMAIN_RULE})'),
    (ensure(bind_address="not-an-ip"), 'Ensure.bind_address: "not-an-ip" is not an IPv4 or IPv6 address'),
    (ensure(bind_address="10.0.0.01"), 'Ensure.bind_address: "10.0.0.01" is not an IPv4 or IPv6 address'),
    (ensure(server_port=7, cmd_port=7), "Ensure.cmd_port: 7 is the server_port too; the two ports must differ"),
    (ensure(members=[ip(1), "x y"]), 'Ensure.members: "x y" is neither an IP address nor a host name'),
    (ensure(members=[ip(1), ip(2), ip(1)]), f'Ensure.members: "{ip(1)}" is listed twice'),
    (ensure(members=[ip(2)]),
     f'Ensure.members: this node\'s address {ip(1)} (bind_address) is not among the members ["{ip(2)}"]'),
    (ensure(tls_target="a\nb"), 'Ensure.tls_target: "a\\nb" holds a line break'),
    (Stop(domain="../etc"), f'Stop.domain: "../etc" is not a domain id ({DOMAIN_RULE})'),
])
def test_a_domain_the_keeper_cannot_run_is_refused_and_nothing_changes(keeper: Keeper, nodes: Nodes,
                                                                        req: Ensure | Stop, error: str) -> None:
    (nodes.root / "etc").mkdir()
    with pytest.raises(imex.ImexError) as err:
        keeper.call(req)
    assert str(err.value) == f"the IMEX keeper refused: bad request: {error}"
    assert keeper.status() == [] and keeper.proc.poll() is None
    assert [p.name for p in nodes.workdir(1).iterdir() if p.is_dir()] == [] and (nodes.root / "etc").is_dir()


def test_an_ensure_without_tls_is_what_a_keeper_of_the_previous_release_reads() -> None:
    """The keeper's DaemonSet is OnDelete: after an upgrade the old keepers serve the new agents, and
    they refuse unknown fields. Only a TLS domain's Ensure carries the new one."""
    assert "tls_target" not in json.loads(imexkeeper.encode(ensure()))
    assert json.loads(imexkeeper.encode(ensure(tls_target="u.imex.nvlfabric.io")))["tls_target"] == \
        "u.imex.nvlfabric.io"


def test_a_silent_client_does_not_hold_up_the_agent(keeper: Keeper) -> None:
    silent = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(3)]
    try:
        for s in silent:
            s.connect(str(keeper.socket))
            s.sendall(b'{"op": "sta')  # and never the rest
        t0 = time.monotonic()
        assert keeper.status() == []
        assert time.monotonic() - t0 < 1.0
        silent[0].settimeout(10)
        assert silent[0].recv(10) == b""  # dropped, without a reply, after the read timeout (5 s)
        assert time.monotonic() - t0 > 3.0
    finally:
        for s in silent:
            s.close()


def test_a_request_line_is_at_most_a_mib(keeper: Keeper) -> None:
    def line(pad: int) -> bytes:
        return b'{"op": "status", "pad": "' + b"x" * pad + b'"}\n'

    assert keeper.raw(line((1 << 20) - 100)) == refusal(
        'bad request: Status: unknown field "pad"; a Status has op')  # read whole, and refused for what it says
    assert keeper.raw(line(1 << 20)) == refusal("bad request: longer than 1 MiB")
    assert keeper.status() == []


# -- under AddressSanitizer -------------------------------------------------------------------------

TOKENS = ['{', '}', '[', ']', ',', ':', ' ', '"', '\\', '\\u', 'd800', 'dc00', '00e9', '"op"', '"ensure"', '"stop"',
          '"status"', '"domain"', '"members"', '"server_port"', '"cmd_port"', '"bind_address"', '"tls_target"',
          '"clique-z"', '"127.0.30.9"', '1', '0', '-', '.', 'e', '+', '65535', 'null', 'true', 'false', 'NaN', 'é',
          '\x00', '\x7f', '12345678901234567890', '1e400', '-0', '1.5', '\t', '\r', '\U0001f600', '"\\ud83d\\ude00"']
VALID = [b'{"op": "status"}', b'{"op": "stop", "domain": "clique-z"}',
         b'{"op": "ensure", "domain": "clique-z", "bind_address": "127.0.30.9", "server_port": 1, "cmd_port": 2, '
         b'"members": ["127.0.30.9", "node-a", "::1"], "tls_target": "z"}']

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids, max_size=4),
    max_leaves=12)


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    line = bytearray(draw(st.sampled_from(VALID)))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(line) - 1))
        what = draw(st.integers(0, 2))
        if what == 0:
            del line[at]
        elif what == 1:
            line[at] = draw(st.integers(0, 255))
        else:
            line[at:at] = draw(st.sampled_from(TOKENS)).encode("utf-8", "surrogatepass")
    return bytes(line)


request_lines = st.one_of(
    st.binary(max_size=120),
    st.lists(st.sampled_from(TOKENS), max_size=40).map(lambda t: "".join(t).encode("utf-8", "surrogatepass")),
    st.builds(lambda fields, op: json.dumps({**fields, "op": op}).encode(),
              st.dictionaries(st.sampled_from(["domain", "bind_address", "server_port", "cmd_port", "members",
                                               "tls_target", "force", "é"]), json_values, max_size=7),
              st.sampled_from(["ensure", "stop", "status"]) | json_values),
    mutated(),
    st.integers(1, 200).map(lambda n: b"[" * n + b"]" * n),
)


def sanitizer_reports(keeper: Keeper) -> list[str]:
    return [line for line in keeper.log.read_text(errors="replace").splitlines()
            if any(r in line for r in SANITIZER_REPORTS)]


def test_malformed_requests_never_crash_the_asan_build(nodes: Nodes, tmp_path: Path) -> None:
    """Any local process may connect: whatever it sends, the answer is a Reply and the keeper runs on.
    (No driver: a request that would start a daemon is refused for its missing binary.)"""
    keeper = nodes.keeper(1, program=program(asan=True), driver_root=tmp_path / "no-driver")

    @settings(max_examples=3000, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(request_lines)
    def check(line: bytes) -> None:
        raw = keeper.raw(line + b"\n")
        assert raw.endswith(b"\n") and keeper.proc.poll() is None, (line, keeper.tail())
        reply = imexkeeper.decode_reply(raw)
        assert reply.ok or reply.error

    check()
    assert keeper.terminate() == 0, keeper.tail()
    assert sanitizer_reports(keeper) == []


def test_the_asan_build_runs_a_domains_life_cleanly(nodes: Nodes) -> None:
    """Start, a new member, a keeper killed and its daemon adopted, a crash, a restart, a stop, SIGTERM:
    no sanitizer report on the way, and an exit without leaks."""
    asan = program(asan=True)
    nodes.keeper(1, program=asan)
    d = nodes.domain(1)
    assert d.run([ip(1)]) == "started"
    d.wait_ready(10)
    assert d.run([ip(1), ip(2)]) == "members changed"
    nodes.keeper(1).kill()
    keeper = nodes.keeper(1, program=asan)
    (state,) = keeper.status()
    assert state.adopted and d.run([ip(1)]) == "members changed"
    pid = d.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    assert eventually("the exit", d.poll, timeout=10, interval=0.05) == 255
    assert d.run([ip(1)]) == "started"
    d.wait_ready(10)
    d.stop()
    assert keeper.status() == [] and not d.dir.exists()
    assert keeper.terminate() == 0, keeper.tail()
    assert sanitizer_reports(keeper) == []  # both keepers': they share node 1's log
