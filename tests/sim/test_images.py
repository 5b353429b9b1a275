"""`nvlfabric-sim up --images FILE`: the file's format, its errors, and Kubernetes' command/args rules."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nvlfabric.cli.sim import main
from nvlfabric.sim import images
from nvlfabric.sim.images import AGENT_IMAGE, ImageProgram, image_name


def test_a_file_maps_images_as_entrypoints_or_entrypoint_and_cmd_over_the_defaults(tmp_path: Path) -> None:
    f = tmp_path / "images.yaml"
    f.write_text("images:\n  registry.example.com/ml/train: [/usr/bin/python3, /srv/train.py]\n"
                 "  ghcr.io/x/exporter: {entrypoint: [/bin/exporter], cmd: [--port=9100]}\n")
    got = images.load(f)
    assert got["registry.example.com/ml/train"] == ImageProgram(entrypoint=["/usr/bin/python3", "/srv/train.py"])
    assert got["ghcr.io/x/exporter"].cmd == ["--port=9100"]
    assert got["ghcr.io/x/exporter"].files == {}
    assert got[AGENT_IMAGE].entrypoint == [sys.executable, "-m", "nvlfabric"]  # nvlfabric's own stays mapped


def test_an_image_names_its_files_by_image_path(tmp_path: Path) -> None:
    f = tmp_path / "images.yaml"
    f.write_text("images:\n  ghcr.io/x/driver:\n    entrypoint: [/usr/bin/driver]\n"
                 "    files: {/usr/bin/driver: /opt/build/driver, /templates: /opt/build/templates}\n")
    assert images.load(f)["ghcr.io/x/driver"].files == {"/usr/bin/driver": "/opt/build/driver",
                                                        "/templates": "/opt/build/templates"}


def test_a_tag_maps_that_tag_alone_and_wins_over_the_untagged_name(tmp_path: Path) -> None:
    """Two releases of one image side by side, as nodes that pulled each tag would run them."""
    f = tmp_path / "images.yaml"
    f.write_text("images:\n  localhost:5000/ml/train: [/bin/new]\n  localhost:5000/ml/train:0.1.0: [/old/bin/train]\n")
    got = images.load(f)
    assert images.program_for(got, "localhost:5000/ml/train:0.1.0").entrypoint == ["/old/bin/train"]
    assert images.program_for(got, "localhost:5000/ml/train:0.2.0").entrypoint == ["/bin/new"]
    assert images.program_for(got, "localhost:5000/ml/train").entrypoint == ["/bin/new"]
    assert images.program_for(got, "localhost:5000/ml/train:0.1.0@sha256:" + "b" * 64).entrypoint == [
        "/old/bin/train"]
    assert images.program_for(got, "localhost:5000/ml/other:0.1.0") is None
    assert images.program_for(got, f"{AGENT_IMAGE}:9.9.9") == images.default_images()[AGENT_IMAGE]


@pytest.mark.parametrize(("text", "words"), [
    ("images:\n  ghcr.io/x/y@sha256:" + "a" * 64 + ": [/bin/y]\n", "with a tag or without one, not with"),
    ("images:\n  ghcr.io/x/y: {entrypoint: []}\n", "images.ghcr.io/x/y"),
    ("images:\n  ghcr.io/x/y: {command: [/bin/y]}\n", "command"),
    ("imges: {}\n", "imges"),
    ("images:\n  ghcr.io/x/y: {entrypoint: [/bin/y], files: {templates: /opt/t}}\n", "'templates': an image path"),
    ("images:\n  ghcr.io/x/y: {entrypoint: [/bin/y], files: {/: /opt/root}}\n", "not / itself"),
    ("images:\n  ghcr.io/x/y: {entrypoint: [/bin/y], files: {/t: opt/t}}\n", "/t: 'opt/t' is not an absolute"),
    ("images: [\n", "--images"),
])
def test_a_bad_file_is_one_line_naming_the_entry(tmp_path: Path, text: str, words: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "images.yaml"
    f.write_text(text)
    with pytest.raises(ValueError, match="--images") as err:
        images.load(f)
    assert words in str(err.value), str(err.value)
    # ... and `nvlfabric-sim up` says it and exits 1 before starting anything.
    assert main(["--state-dir", str(tmp_path / "sim"), "up", "--images", str(f)]) == 1
    assert words in capsys.readouterr().err


def test_command_replaces_the_entrypoint_and_args_the_cmd_as_kubernetes_does() -> None:
    image = ImageProgram(entrypoint=["/bin/tool", "-v"], cmd=["serve"])
    assert image.argv([], []) == ["/bin/tool", "-v", "serve"]
    assert image.argv([], ["check"]) == ["/bin/tool", "-v", "check"]
    assert image.argv(["/bin/sh", "-c"], []) == ["/bin/sh", "-c"]  # CMD goes with the ENTRYPOINT
    assert image.argv(["/bin/sh", "-c"], ["echo hi"]) == ["/bin/sh", "-c", "echo hi"]


_part = st.from_regex(r"\A[a-z0-9]([a-z0-9._-]{0,10}[a-z0-9])?\Z", fullmatch=True)


@given(st.one_of(st.none(), st.builds(lambda h, p: f"{h}:{p}" if p else h, _part, st.one_of(
           st.none(), st.integers(1, 65535)))), st.lists(_part, min_size=1, max_size=3),
       st.one_of(st.none(), _part), st.one_of(st.none(), st.text("0123456789abcdef", min_size=64, max_size=64)))
def test_image_name_drops_exactly_the_tag_and_the_digest(registry: str | None, path: list[str], tag: str | None,
                                                        digest: str | None) -> None:
    name = "/".join([*([registry] if registry else []), *path])
    ref = name + (f":{tag}" if tag else "") + (f"@sha256:{digest}" if digest else "")
    assert image_name(ref) == name
