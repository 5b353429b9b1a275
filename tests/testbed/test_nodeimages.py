"""The containerd nodes' images (testbed/nodeimages.py): the names containerd gives them, and a
cache that rebuilds exactly when what an image is built from changes."""

from __future__ import annotations

from pathlib import Path

import pytest

from nvlfabric.sim.paths import Tools, load_tools
from nvlfabric.testbed import nodeimages, realkubelets
from nvlfabric.testbed.runstate import ControlPlaneError


@pytest.mark.parametrize(("asked", "stored"), [
    ("nvlfabric/node-agent:0.2.0", "docker.io/nvlfabric/node-agent:0.2.0"),
    ("busybox:1", "docker.io/library/busybox:1"),
    ("registry.example.com/ml/train:2", "registry.example.com/ml/train:2"),
    ("localhost/nvlfabric-sim/pause:1", "localhost/nvlfabric-sim/pause:1"),
    ("registry:5000/a:1", "registry:5000/a:1"),
])
def test_references_are_spelled_as_containerd_stores_what_a_pod_asks_for(asked: str, stored: str) -> None:
    assert nodeimages.containerd_reference(asked) == stored


def _key(repo: Path) -> str:
    return nodeimages._digest([b"recipe"], nodeimages._tree(repo, nodeimages.CONTEXT), repo)


def test_the_node_images_key_follows_the_sources_it_copies_and_nothing_else(tmp_path: Path) -> None:
    (tmp_path / "nvlfabric" / "api").mkdir(parents=True)
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'nvlfabric'\n")
    (tmp_path / "README.md").write_text("# nvlfabric\n")
    module = tmp_path / "nvlfabric" / "api" / "names.py"
    module.write_text("X = 1\n")
    first = _key(tmp_path)
    # Bytecode, tool caches and files outside the build context are not what the image is built from.
    (tmp_path / "nvlfabric" / "api" / "__pycache__").mkdir()
    (tmp_path / "nvlfabric" / "api" / "__pycache__" / "names.cpython-311.pyc").write_bytes(b"\0")
    (tmp_path / "nvlfabric" / ".mypy_cache").mkdir()
    (tmp_path / "nvlfabric" / ".mypy_cache" / "x.json").write_text("{}")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text("")
    assert _key(tmp_path) == first
    module.write_text("X = 2\n")
    assert _key(tmp_path) != first
    module.write_text("X = 1\n")
    assert _key(tmp_path) == first
    module.rename(module.with_name("other.py"))  # same bytes, another path: another image
    assert _key(tmp_path) != first


def test_a_missing_dockerfile_says_a_checkout_is_needed(tmp_path: Path) -> None:
    with pytest.raises(nodeimages.ImageBuildError, match="needs an nvlfabric checkout"):
        nodeimages.node_image(lambda _: None, repo=tmp_path)


def test_containerd_nodes_refuse_what_they_cannot_run_on_naming_the_fix() -> None:
    """`up --real-kubelets N --runtime containerd` is checked before anything starts."""
    tools = load_tools()
    with pytest.raises(ControlPlaneError, match="leave --pod-network namespaced"):
        realkubelets.check(1, 2, tools, runtime="containerd", pod_network="host")
    with pytest.raises(ControlPlaneError, match=r"--runtime 'cri-o': give one of standin, containerd"):
        realkubelets.check(1, 2, tools, runtime="cri-o")
    bare = Tools(bin_dir=tools.bin_dir, pulumi_home=tools.pulumi_home, versions=tools.versions, cni_dir=None)
    with pytest.raises(ControlPlaneError, match="needs the CNI plugins: run `make tools`"):
        realkubelets.check(1, 2, bare, runtime="containerd")
