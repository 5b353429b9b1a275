"""The IMEX config model (nvlfabric/sim/imex/config.py) against the stand-in daemon's own parser.

`nvidia-imex --check-config` parses a config (and the nodes file when present), prints the effective
settings and exits. The fuzz tests run the sanitizer build (ASan + UBSan) when it can be built.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nvlfabric.sim.imex.config import (
    ConfigSyntaxError,
    ImexConfig,
    WaitForQuorum,
    render_nodes,
    validate_node_entry,
    write_config,
    write_nodes_file,
)
from tests.sim.imex_fixtures import build_imex

KEYS = list(ImexConfig.model_fields)
SANITIZER_FAILURE = 99
SCALE = max(1, int(os.environ.get("NVLFABRIC_IMEX_FUZZ_SCALE", "1")))  # more examples for a deep run
ENV = {**os.environ, "ASAN_OPTIONS": f"exitcode={SANITIZER_FAILURE}:detect_leaks=1",
       "UBSAN_OPTIONS": f"exitcode={SANITIZER_FAILURE}:print_stacktrace=1"}


@pytest.fixture(scope="session")
def imex_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_imex(tmp_path_factory.mktemp("imex-bin"))


@pytest.fixture(scope="session")
def fuzz_bin(tmp_path_factory: pytest.TempPathFactory, imex_bin: Path) -> Path:
    """The sanitizer build when the toolchain has ASan/UBSan, else the plain one."""
    try:
        return build_imex(tmp_path_factory.mktemp("imex-asan"), asan=True)
    except RuntimeError:
        return imex_bin


@pytest.fixture(scope="session")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("imex-cfg")


def check(bin_dir: Path, path: Path) -> subprocess.CompletedProcess[str]:
    """`nvidia-imex --check-config`, run in an empty directory so that relative paths name nothing."""
    cwd = path.parent / "empty-cwd"
    cwd.mkdir(exist_ok=True)
    return subprocess.run([str(bin_dir / "nvidia-imex"), "-c", str(path), "--check-config"], capture_output=True,
                          text=True, errors="replace", timeout=30, check=False, env=ENV, cwd=cwd)


def effective(stdout: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in stdout.split("\n") if line and not line.startswith("#"))


def expected(cfg: ImexConfig) -> dict[str, str]:
    rendered = effective(cfg.render())
    return {k: v for k, v in rendered.items() if k in effective_keys()}


def effective_keys() -> set[str]:
    return {"LOG_LEVEL", "LOG_FILE_NAME", "LOG_APPEND_TO_LOG", "DAEMONIZE", "BIND_INTERFACE_IP", "SERVER_PORT",
            "IMEX_NODE_CONFIG_FILE", "IMEX_WAIT_FOR_QUORUM", "IMEX_CMD_ENABLED", "IMEX_CMD_BIND_INTERFACE_IP",
            "IMEX_CMD_PORT", "IMEX_CMD_UNIX_DOMAIN_PATH", "IMEX_NODE_DISCONNECTED_GRACE_TIME"}


def test_defaults_are_the_daemons_defaults(imex_bin: Path, scratch: Path) -> None:
    empty = scratch / "empty.cfg"
    empty.write_text("# nothing set\n")
    proc = check(imex_bin, empty)
    assert proc.returncode == 0, proc.stderr
    assert effective(proc.stdout) == expected(ImexConfig())
    assert ImexConfig.parse(empty.read_text()) == ImexConfig()


def test_rendered_keys_are_the_real_ones() -> None:
    text = ImexConfig().render(header="written by nvlfabric")
    assert text.startswith("# written by nvlfabric\n")
    for key in ("LOG_LEVEL=4", "LOG_FILE_NAME=/var/log/nvidia-imex.log", "DAEMONIZE=1", "BIND_INTERFACE_IP=",
                "SERVER_PORT=50000", "IMEX_NODE_CONFIG_FILE=/etc/nvidia-imex/nodes_config.cfg",
                "IMEX_WAIT_FOR_QUORUM=RECOVERY", "IMEX_CMD_ENABLED=1", "IMEX_CMD_PORT=50005",
                "IMEX_ENABLE_AUTH_ENCRYPTION=0", "IMEX_NODE_DISCONNECTED_GRACE_TIME=-1"):
        assert f"\n{key}\n" in text


def test_child_process_config() -> None:
    cfg = ImexConfig.for_child_process(nodes_file="/imexd/nodes.cfg", cmd_bind_ip="10.1.2.3")
    assert (cfg.DAEMONIZE, cfg.LOG_FILE_NAME, cfg.IMEX_CMD_BIND_INTERFACE_IP, cfg.BIND_INTERFACE_IP) == (
        0, "", "10.1.2.3", "")
    assert cfg.IMEX_WAIT_FOR_QUORUM is WaitForQuorum.RECOVERY
    with pytest.raises(ValueError, match="IPv4"):
        ImexConfig.for_child_process(nodes_file="/n", cmd_bind_ip="fe80::1")


def test_model_rejects_what_cannot_be_written() -> None:
    for bad in ({"LOG_FILE_NAME": "a\nb"}, {"SERVER_PORT": 0}, {"LOG_LEVEL": 6}, {"IMEX_NODE_CONFIG_FILE": ""},
                {"BIND_INTERFACE_IP": "1.2.3"}, {"LOG_FILE_NAME": " padded"}, {"NO_SUCH_KEY": 1}):
        with pytest.raises(ValueError):
            ImexConfig.model_validate(bad)


def test_nodes_file_writer(tmp_path: Path) -> None:
    path = write_nodes_file(tmp_path / "nodes.cfg", ["10.0.0.1", "compute-domain-daemon-0001"])
    assert path.read_text() == "10.0.0.1\ncompute-domain-daemon-0001\n"
    for bad in (["10.0.0.1", "10.0.0.1"], ["fe80::1"], ["two words"], [""]):
        with pytest.raises(ValueError):
            render_nodes(bad)
    assert validate_node_entry("node_1.rack-2") == "node_1.rack-2"


def test_parse_errors_name_line_and_key() -> None:
    with pytest.raises(ConfigSyntaxError) as info:
        ImexConfig.parse("# c\nLOG_LEVEL=4\nSERVER_PORT=0\n")
    assert (info.value.line, info.value.key) == (3, "SERVER_PORT")
    with pytest.raises(ConfigSyntaxError) as info:
        ImexConfig.parse("\n\nno equals here\n")
    assert info.value.line == 3 and "KEY=VALUE" in str(info.value)


# ------------------------------------------------------------------------------------------------
# Property tests

_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x2FF, exclude_characters="\x7f"), max_size=24)
_ipv4 = st.ip_addresses(v=4).map(str)
_port = st.integers(1, 65535)

valid_configs = st.builds(
    ImexConfig,
    LOG_LEVEL=st.integers(0, 5),
    LOG_FILE_NAME=_text.map(str.strip),
    LOG_APPEND_TO_LOG=st.sampled_from([0, 1]),
    DAEMONIZE=st.sampled_from([0, 1]),
    BIND_INTERFACE_IP=st.one_of(st.just(""), _ipv4),
    SERVER_PORT=_port,
    IMEX_NODE_CONFIG_FILE=_text.map(lambda t: ("/nonexistent/imex/" + t).strip()),
    IMEX_WAIT_FOR_QUORUM=st.sampled_from(WaitForQuorum),
    IMEX_CMD_ENABLED=st.sampled_from([0, 1]),
    IMEX_CMD_BIND_INTERFACE_IP=st.one_of(st.just(""), _ipv4),
    IMEX_CMD_PORT=_port,
    IMEX_CMD_UNIX_DOMAIN_PATH=_text.map(str.strip),
    IMEX_NODE_DISCONNECTED_GRACE_TIME=st.integers(-1, 10**9),
    LOG_FILE_MAX_SIZE=st.integers(0, 10**9),
    IMEX_GSS_TIMEOUT_SEC=st.integers(-1, 10**9),
    IMEX_AUTH_SOURCE=st.sampled_from(["", "FILE", "ENV_PATH", "ENV_VAL"]),
    STATS_FILE_NAME=_text.map(str.strip),
)


@settings(max_examples=40 * SCALE, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=valid_configs)
def test_every_valid_model_is_accepted_with_the_same_values(fuzz_bin: Path, scratch: Path, cfg: ImexConfig) -> None:
    path = write_config(scratch / "valid.cfg", cfg, header="generated")
    proc = check(fuzz_bin, path)
    assert proc.returncode == 0, proc.stderr
    assert effective(proc.stdout) == expected(cfg)
    assert ImexConfig.parse(path.read_text()) == cfg


_odd_chars = st.characters(codec="utf-8", exclude_categories=["Cs"])
_values = st.one_of(
    st.integers(-70000, 70000).map(str),
    st.sampled_from(["", "NONE", "RECOVERY", "1.2.3.4", "127.0.20.1", "::1", "0x10", "+1", "-1", "1_0", "07",
                     "999999999999999999999", "SSL_TLS", "FILE", "1 2", "4 # comment", "=", "a=b"]),
    st.text(_odd_chars, max_size=20),
)
_keys = st.one_of(st.sampled_from(KEYS), st.text(st.sampled_from("ABCZ_09 az-=.#\t"), max_size=12),
                  st.text(_odd_chars, max_size=8))
_lines = st.one_of(
    st.tuples(_keys, st.sampled_from(["=", " = ", "=\t", ""]), _values).map("".join),
    st.sampled_from(["", "# comment", "   ", "#", "\t# x", "\x00", "KEY\x00=1", "LOG_LEVEL=4\r"]),
    st.text(_odd_chars, max_size=30),
)
config_texts = st.tuples(st.lists(_lines, max_size=12), st.sampled_from(["\n", "\r\n"]), st.booleans()).map(
    lambda t: t[1].join(t[0]) + (t[1] if t[2] else ""))

_ERROR = re.compile(r"^nvidia-imex: error: (?P<path>.+?):(?P<line>\d+): .+\n$", re.S)


@settings(max_examples=150 * SCALE, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=config_texts)
def test_config_fuzz_never_crashes_and_agrees_with_the_model(fuzz_bin: Path, scratch: Path, text: str) -> None:
    path = scratch / "fuzz.cfg"
    path.write_bytes(text.encode("utf-8"))
    proc = check(fuzz_bin, path)
    assert proc.returncode in (0, 1), f"exit {proc.returncode}\n{proc.stderr}"
    try:
        model: ImexConfig | None = ImexConfig.parse(text)
        model_error: ConfigSyntaxError | None = None
    except ConfigSyntaxError as exc:
        model, model_error = None, exc
    if proc.returncode == 0:
        assert model is not None, f"daemon accepted what the model rejects: {model_error}"
        assert effective(proc.stdout) == expected(model)
        return
    if proc.stderr.startswith("nvidia-imex: error: nodes file: "):
        return  # IMEX_NODE_CONFIG_FILE names something unreadable, e.g. "/"
    match = _ERROR.match(proc.stderr)
    assert match, f"unclear error: {proc.stderr!r}"
    if match["path"] != str(path):  # an existing file named by IMEX_NODE_CONFIG_FILE is no nodes file
        assert model is not None and match["path"] == model.IMEX_NODE_CONFIG_FILE, proc.stderr
        return
    if "not implemented by the IMEX stand-in" in proc.stderr:
        assert model is not None and model.IMEX_ENABLE_AUTH_ENCRYPTION == 1
        return
    assert model_error is not None, f"model accepted what the daemon rejects: {proc.stderr}"
    assert model_error.line == int(match["line"]), (model_error, proc.stderr)


_entries = st.one_of(st.sampled_from(["127.0.0.1", "10.0.0.1", "10.0.0.1", "fe80::1", "1.2.3", "a b", "#x", ""]),
                     _ipv4, st.from_regex(r"[a-z0-9][a-z0-9.-]{0,20}", fullmatch=True),
                     st.text(_odd_chars, max_size=10))


@settings(max_examples=80 * SCALE, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(entries=st.lists(_entries, max_size=8))
def test_nodes_file_fuzz_never_crashes(fuzz_bin: Path, scratch: Path, entries: list[str]) -> None:
    nodes = scratch / "fuzz-nodes.cfg"
    nodes.write_bytes("\n".join(entries).encode("utf-8"))
    cfg = scratch / "fuzz-nodes-daemon.cfg"
    write_config(cfg, ImexConfig(IMEX_NODE_CONFIG_FILE=str(nodes)))
    proc = check(fuzz_bin, cfg)
    assert proc.returncode in (0, 1), f"exit {proc.returncode}\n{proc.stderr}"
    lines = [e.strip(" \t\r\v\f") for e in "\n".join(entries).split("\n")]
    wanted = [e for e in lines if e and not e.startswith("#")]
    try:
        render_nodes(wanted)
        writer_ok = "\x00" not in "\n".join(entries)
    except ValueError:
        writer_ok = False
    if proc.returncode == 0:
        assert f"{len(wanted)} entries" in proc.stdout
        assert writer_ok, wanted
    else:
        assert re.match(rf"^nvidia-imex: error: {re.escape(str(nodes))}:\d+: ", proc.stderr), proc.stderr
        assert not writer_ok, (wanted, proc.stderr)
