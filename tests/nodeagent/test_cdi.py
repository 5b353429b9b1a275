"""CDI specs for channel claims, /proc/devices parsing and channel device nodes."""

from __future__ import annotations

import contextlib
import json
import os
import stat
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from nvlfabric.api import names
from nvlfabric.api.kubelet.cdi import DeviceNode, Spec
from nvlfabric.nodeagent import cdi
from nvlfabric.sim.kubelet.cdi import UnresolvableDevices, load, resolve
from nvlfabric.sim.nodes import IMEX_CHANNELS_MAJOR, NVIDIA_CAPS_MAJOR, proc_devices_text

UID = "4a1b2c3d-0000-4e5f-8a9b-0c1d2e3f4a5b"
DIGIT_UID = "0badf00d-1111-4222-8333-444455556666"


@pytest.fixture
def cdi_dirs(tmp_path: Path) -> list[Path]:
    """The runtime's CDI directories, static then dynamic (the agent writes to the dynamic one)."""
    dirs = [tmp_path / "etc-cdi", tmp_path / "run-cdi"]
    for d in dirs:
        d.mkdir()
    return dirs


def write(cdi_dir: Path, uid: str = UID, channels: tuple[int, ...] = (5,), cd: str = "llm-cd") -> cdi.SpecWrite:
    spec = cdi.claim_spec(claim_uid=uid, channels=channels, major=IMEX_CHANNELS_MAJOR, compute_domain=cd)
    return cdi.write_claim_spec(cdi_dir, uid, spec)


# ----------------------------------------------------------------------------------------------
# Specs


def test_a_single_channel_claim_resolves_to_its_device_node_and_env(cdi_dirs: list[Path]) -> None:
    result = write(cdi_dirs[1])
    assert result.changed
    assert result.path == cdi_dirs[1] / f"k8s.channel.nvlfabric.io-claim_{UID}.json"
    assert result.device_ids == (f"k8s.channel.nvlfabric.io/claim={UID}-channel-5",)
    edits = resolve(cdi_dirs, list(result.device_ids))
    assert edits.device_nodes == [DeviceNode(path="/dev/nvidia-caps-imex-channels/channel5", type="c",
                                             major=IMEX_CHANNELS_MAJOR, minor=5)]
    assert edits.env == ["NVLFABRIC_COMPUTE_DOMAIN=llm-cd", "NVLFABRIC_IMEX_CHANNEL=5"]


def test_the_spec_file_is_valid_strict_cdi_at_version_0_5_0(cdi_dirs: list[Path]) -> None:
    result = write(cdi_dirs[1], uid=DIGIT_UID)
    data = json.loads(result.path.read_text())
    spec = Spec.model_validate(data)  # strict: any unknown field would fail
    assert spec.cdi_version == "0.5.0" and spec.kind == "k8s.channel.nvlfabric.io/claim"
    assert [d.name for d in spec.devices] == [f"{DIGIT_UID}-channel-5"]  # starts with a digit: needs 0.5.0
    assert load(cdi_dirs).errors == []


def test_a_claim_with_several_channels_gets_one_device_with_a_node_per_channel(cdi_dirs: list[Path]) -> None:
    result = write(cdi_dirs[1], channels=(9, 3, 7, 3))
    assert result.device_ids == (f"k8s.channel.nvlfabric.io/claim={UID}-channels",)
    edits = resolve(cdi_dirs, list(result.device_ids))
    assert [(n.path, n.major, n.minor) for n in edits.device_nodes] == [
        (f"/dev/nvidia-caps-imex-channels/channel{c}", IMEX_CHANNELS_MAJOR, c) for c in (3, 7, 9)]
    assert "NVLFABRIC_IMEX_CHANNEL=3,7,9" in edits.env


def test_an_all_claim_is_one_set_device_whatever_its_size(cdi_dirs: list[Path]) -> None:
    """Allocation mode All: the set's name `<uid>-channels` for the claim's own channel alone, the
    name an earlier agent gave its 2048-channel device, so the kubelet's device ID resolves after
    the agent narrows it (issue 49)."""
    every = cdi.claim_spec(claim_uid=UID, channels=range(2048), major=IMEX_CHANNELS_MAJOR, compute_domain="cd")
    own = cdi.claim_spec(claim_uid=UID, channels=[5], major=IMEX_CHANNELS_MAJOR, compute_domain="cd",
                         channel_set=True)
    assert [d.name for d in every.devices] == [d.name for d in own.devices] == [f"{UID}-channels"]
    result = cdi.write_claim_spec(cdi_dirs[1], UID, own)
    edits = resolve(cdi_dirs, list(result.device_ids))
    assert [(n.path, n.minor) for n in edits.device_nodes] == [("/dev/nvidia-caps-imex-channels/channel5", 5)]
    assert "NVLFABRIC_IMEX_CHANNEL=5" in edits.env
    assert cdi.device_name("u", [5], channel_set=True) == "u-channels"


def test_two_claims_resolve_independently(cdi_dirs: list[Path]) -> None:
    a = write(cdi_dirs[1], uid=UID, channels=(1,), cd="a")
    b = write(cdi_dirs[1], uid=DIGIT_UID, channels=(2,), cd="b")
    edits = resolve(cdi_dirs, [*b.device_ids])
    assert [n.minor for n in edits.device_nodes] == [2] and "NVLFABRIC_COMPUTE_DOMAIN=b" in edits.env
    assert len(resolve(cdi_dirs, [*a.device_ids, *b.device_ids]).device_nodes) == 2


def test_writing_the_same_spec_again_does_not_touch_the_file(cdi_dirs: list[Path]) -> None:
    first = write(cdi_dirs[1])
    before = first.path.stat()
    second = write(cdi_dirs[1])
    assert not second.changed and second.device_ids == first.device_ids
    after = first.path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    third = write(cdi_dirs[1], cd="other-cd")
    assert third.changed and "NVLFABRIC_COMPUTE_DOMAIN=other-cd" in resolve(cdi_dirs, list(third.device_ids)).env


def test_a_failed_write_keeps_the_old_spec_and_leaves_no_file_the_runtime_would_read(
        cdi_dirs: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    first = write(cdi_dirs[1])
    old = first.path.read_bytes()

    def crash(src: object, dst: object) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match=r"writing the CDI spec .*claim_4a1b2c3d"):
        write(cdi_dirs[1], cd="other-cd")
    monkeypatch.undo()
    assert first.path.read_bytes() == old
    assert [p.name for p in cdi_dirs[1].iterdir()] == [first.path.name]


def test_removal_deletes_the_spec_and_tolerates_a_missing_one(cdi_dirs: list[Path]) -> None:
    result = write(cdi_dirs[1])
    assert cdi.remove_claim_spec(cdi_dirs[1], UID) is True
    assert not result.path.exists()
    with pytest.raises(UnresolvableDevices):
        resolve(cdi_dirs, list(result.device_ids))
    assert cdi.remove_claim_spec(cdi_dirs[1], UID) is False
    assert cdi.remove_claim_spec(cdi_dirs[1].parent / "no-such-dir", UID) is False


@pytest.mark.parametrize(("channels", "match"), [
    ((), "at least one"), ((2048,), "0..2047"), ((-1,), "0..2047"),
])
def test_bad_channels_are_refused(channels: tuple[int, ...], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        cdi.claim_spec(claim_uid=UID, channels=channels, major=1, compute_domain="cd")


@pytest.mark.parametrize("uid", ["", "-leading", "has/slash", "a b"])
def test_claim_uids_that_cannot_name_a_device_are_refused(uid: str) -> None:
    with pytest.raises((ValueError, ValidationError)):
        cdi.spec_file_name(uid)


def test_names_follow_the_documented_layout() -> None:
    assert names.CDI_KIND == "k8s.channel.nvlfabric.io/claim" and names.CDI_VENDOR == "k8s.channel.nvlfabric.io"
    assert cdi.spec_file_name("u") == "k8s.channel.nvlfabric.io-claim_u.json"
    assert cdi.device_name("u", [2047]) == "u-channel-2047"
    assert cdi.device_name("u", [1, 2]) == "u-channels"


# ----------------------------------------------------------------------------------------------
# /proc/devices


def test_the_major_comes_from_the_character_devices_section(tmp_path: Path) -> None:
    path = tmp_path / "devices"
    path.write_text(proc_devices_text())
    assert cdi.read_major(path, names.IMEX_CHANNEL_DEVICE) == IMEX_CHANNELS_MAJOR
    assert cdi.read_major(path, "nvidia-caps") == NVIDIA_CAPS_MAJOR
    assert cdi.read_major(path, "/dev/vc/0") == 4
    with pytest.raises(cdi.MajorNotFound, match=r"no character device 'sd'"):
        cdi.read_major(path, "sd")  # a block device


def test_a_missing_driver_or_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "devices"
    path.write_text("Character devices:\n  1 mem\n\nBlock devices:\n  8 sd\n")
    with pytest.raises(cdi.MajorNotFound, match=r"nvidia-caps-imex-channels.*is the NVIDIA driver loaded"):
        cdi.read_major(path, names.IMEX_CHANNEL_DEVICE)
    with pytest.raises(cdi.MajorNotFound, match=str(tmp_path / "nope")):
        cdi.read_major(tmp_path / "nope", names.IMEX_CHANNEL_DEVICE)
    path.write_text("hello\n507 nvidia-caps-imex-channels\n")
    with pytest.raises(cdi.MajorNotFound, match="no 'Character devices:' section"):
        cdi.read_major(path, names.IMEX_CHANNEL_DEVICE)


device_names = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=24).filter(
    lambda s: not s.endswith(":"))
entries = st.lists(st.tuples(st.integers(0, 4095), device_names), max_size=8)
pad = st.sampled_from(["", " ", "  ", "\t"])
junk = st.lists(st.sampled_from(["", "   ", "garbage line", "12", "x 12 y", "# comment"]), max_size=3)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chars=entries, blocks=entries, major=st.integers(0, 4095), where=st.sampled_from(["char", "block", "none"]),
       lead=pad, noise=junk, trailing_blank=st.booleans(), position=st.integers(0, 8))
def test_proc_devices_parsing_fuzz(tmp_path: Path, chars: list[tuple[int, str]], blocks: list[tuple[int, str]],
                                   major: int, where: str, lead: str, noise: list[str], trailing_blank: bool,
                                   position: int) -> None:
    name = names.IMEX_CHANNEL_DEVICE
    chars = [(m, n) for m, n in chars if n != name]
    blocks = [(m, n) for m, n in blocks if n != name]
    if where == "char":
        chars.insert(min(position, len(chars)), (major, name))
    elif where == "block":
        blocks.insert(min(position, len(blocks)), (major, name))
    lines = ["Character devices:", *(f"{lead}{m:>3} {n}" for m, n in chars), *noise, "",
             "Block devices:", *(f"{lead}{m:>3} {n}" for m, n in blocks)]
    path = tmp_path / "devices"
    path.write_text("\n".join(lines) + ("\n" if trailing_blank else ""))
    if where == "char":
        assert cdi.read_major(path, name) == major
    else:
        with pytest.raises(cdi.MajorNotFound, match="no character device"):
            cdi.read_major(path, name)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=300))
def test_proc_devices_parsing_never_fails_unexpectedly(tmp_path: Path, text: str) -> None:
    path = tmp_path / "devices"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    with contextlib.suppress(cdi.MajorNotFound):
        assert cdi.read_major(path, names.IMEX_CHANNEL_DEVICE) >= 0


# ----------------------------------------------------------------------------------------------
# Channel device nodes


def test_mknod_creates_a_char_device_with_the_channel_as_minor(tmp_path: Path) -> None:
    old_umask = os.umask(0o077)  # the mode must not depend on the agent's umask
    try:
        path = cdi.channel_device_node(tmp_path, 42, IMEX_CHANNELS_MAJOR)
    finally:
        os.umask(old_umask)
    assert path == tmp_path / "dev" / "nvidia-caps-imex-channels" / "channel42"
    st_ = path.lstat()
    assert stat.S_ISCHR(st_.st_mode) and stat.S_IMODE(st_.st_mode) == 0o666
    assert (os.major(st_.st_rdev), os.minor(st_.st_rdev)) == (IMEX_CHANNELS_MAJOR, 42)


def test_an_existing_correct_node_is_kept_and_a_wrong_one_replaced(tmp_path: Path) -> None:
    path = cdi.channel_device_node(tmp_path, 3, IMEX_CHANNELS_MAJOR)
    inode = path.lstat().st_ino
    assert cdi.channel_device_node(tmp_path, 3, IMEX_CHANNELS_MAJOR).lstat().st_ino == inode
    # the driver was reloaded with another dynamic major
    cdi.channel_device_node(tmp_path, 3, 300)
    assert os.major(path.lstat().st_rdev) == 300
    path.unlink()
    path.write_text("not a device")
    cdi.channel_device_node(tmp_path, 3, IMEX_CHANNELS_MAJOR)
    assert stat.S_ISCHR(path.lstat().st_mode)
    assert sorted(p.name for p in path.parent.iterdir()) == ["channel3"]


def test_release_removes_the_node_and_tolerates_a_missing_one(tmp_path: Path) -> None:
    path = cdi.channel_device_node(tmp_path, 0, IMEX_CHANNELS_MAJOR)
    assert cdi.release_channel_device_node(tmp_path, 0) is True and not path.exists()
    assert cdi.release_channel_device_node(tmp_path, 0) is False


def test_mknod_without_the_capability_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "mknod", refuse)
    with pytest.raises(PermissionError, match=r"channel7 \(char 507:7\) was refused: mknod needs CAP_MKNOD"):
        cdi.channel_device_node(tmp_path, 7, IMEX_CHANNELS_MAJOR)
