"""A release is one version everywhere a user meets it (docs/compatibility.md, "Versions"), and the
dynamic providers an older release pickled into a stack's state still load.

Pure: files of the checkout, its git tags and the installed package's metadata."""

from __future__ import annotations

import importlib
import re
import subprocess
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from pulumi.dynamic import ResourceProvider

import nvlfabric
from nvlfabric import manifests
from nvlfabric.api import names
from nvlfabric.components import NvlfabricDriverArgs, plugin_dir
from nvlfabric.components.schema import package_schema, semver, version
from tests.support import installed

REPO = Path(__file__).resolve().parents[2]
CHANGELOG = REPO / "CHANGELOG.md"
RELEASE_FILE = "nvlfabric/api/release.py"
RELEASE = re.compile(r"^## (\d+\.\d+\.\d+) — (\d{4}-\d{2}-\d{2})$", re.M)

PICKLED = (
    "nvlfabric.provider.computedomain.ComputeDomainProvider",
    "nvlfabric.provider.deviceclass.DeviceClassProvider",
    "nvlfabric.provider.racknodes.RackNodesProvider",
    "nvlfabric.provider.jobparallelism.JobParallelismProvider",
    "nvlfabric.provider.kube.KubeProvider",
)
"""The dynamic providers' paths as stacks' states hold them since 0.1.0 (jobparallelism: 0.2.0) (docs/compatibility.md):
a class that moves leaves its old path importable, and a new one joins this list."""


def _sections() -> dict[str, str]:
    """CHANGELOG section heading → its text."""
    parts = re.split(r"^(## .+)$", CHANGELOG.read_text(), flags=re.M)
    return {parts[i].removeprefix("## "): parts[i + 1] for i in range(1, len(parts), 2)}


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True, text=True,
                          timeout=60).stdout


def test_the_version_is_a_release_or_the_next_ones_development() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+(\.dev\d+|rc\d+)?", nvlfabric.__version__), nvlfabric.__version__
    assert version() == semver(nvlfabric.__version__) == package_schema()["version"]
    assert semver("0.2.0.dev0") == "0.2.0-dev.0" and semver("1.0.0rc1") == "1.0.0-rc.1"
    with pytest.raises(ValueError, match=r"is not X\.Y\.Z"):
        semver("0.2")


def test_every_shipped_pin_is_this_version() -> None:
    assert metadata.version("nvlfabric") == nvlfabric.__version__, "reinstall: make venv"
    image = f"nvlfabric/node-agent:{nvlfabric.__version__}"
    assert image == names.AGENT_IMAGE == NvlfabricDriverArgs().image
    deployed = {c["image"] for d in yaml.safe_load_all(manifests.read(manifests.DRIVER_FILE)) if d
                and d["kind"] in ("DaemonSet", "Deployment") for c in d["spec"]["template"]["spec"]["containers"]}
    assert deployed == {image}, "driver.yaml's images (kubectl apply users get these)"
    requirement = (REPO / "nvlfabric/components/plugin/requirements.txt").read_text().splitlines()[-1]
    assert requirement == plugin_dir.requirement() == f"nvlfabric[pulumi]=={nvlfabric.__version__}"
    lock = REPO / "examples/yaml-consumer/sdks/nvlfabric" / f"nvlfabric-{version()}.yaml"
    assert yaml.safe_load(lock.read_text())["version"] == version()
    assert [p.name for p in lock.parent.glob("nvlfabric-*.yaml")] == [lock.name]
    prod = yaml.safe_load((REPO / "stacks/gb200/Pulumi.prod.yaml").read_text())["config"]
    assert prod["nvlfabric-gb200:image"].endswith(f"/nvlfabric/node-agent:{nvlfabric.__version__}")


def test_the_changelog_has_this_version_and_each_release_says_how_to_upgrade() -> None:
    sections = _sections()
    releases = RELEASE.findall(CHANGELOG.read_text())
    assert releases, "no release section (## X.Y.Z — YYYY-MM-DD)"
    for heading, text in sections.items():
        if RELEASE.match(f"## {heading}"):
            assert "### Upgrading" in text, f"CHANGELOG {heading}: no Upgrading notes"
    if ".dev" in nvlfabric.__version__ or "rc" in nvlfabric.__version__:
        assert next(iter(sections)) == "Unreleased", "main between releases collects notes under ## Unreleased"
        newest = re.sub(r"(\.dev\d+|rc\d+)$", "", nvlfabric.__version__)
        assert all(tuple(map(int, v.split("."))) < tuple(map(int, newest.split("."))) for v, _ in releases)
    else:
        assert releases[0][0] == nvlfabric.__version__, "the newest CHANGELOG release is this version"


def test_each_release_is_tagged_on_a_commit_that_carries_its_version() -> None:
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout (an sdist): no tags to check")
    tags = set(_git("tag", "--list", "v*").split())
    for release, _ in RELEASE.findall(CHANGELOG.read_text()):
        tag = f"v{release}"
        if tag not in tags and release == nvlfabric.__version__:
            continue  # the release commit itself, before `git tag` (docs/compatibility.md, "Releasing")
        if tag in tags:
            source = _git("show", f"{tag}:{RELEASE_FILE}")
            assert f'__version__ = "{release}"' in source, f"{tag} does not carry version {release}"
            continue
        # A clone made without tags (a CI checkout of the branch alone): the release commit must
        # still be in the history, or the CHANGELOG names a release nobody made.
        assert not tags, f"CHANGELOG has {release} but git has no tag {tag}"
        assert installed.commit_setting(release), \
            f"CHANGELOG has {release}, but no commit of {RELEASE_FILE} sets it (and no tag {tag})"


@pytest.mark.parametrize("path", PICKLED)
def test_an_old_states_providers_load_from_their_paths(path: str) -> None:
    module, _, name = path.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    assert isinstance(cls, type) and issubclass(cls, ResourceProvider)


def test_every_dynamic_provider_is_on_the_kept_list() -> None:
    for module in ("computedomain", "deviceclass", "racknodes", "kube", "nvidiadomain", "jobparallelism"):
        importlib.import_module(f"nvlfabric.provider.{module}")

    def subclasses(cls: type) -> set[type]:
        return {s for c in cls.__subclasses__() for s in {c, *subclasses(c)}}

    ours = {f"{c.__module__}.{c.__qualname__}" for c in subclasses(ResourceProvider)
            if c.__module__.startswith("nvlfabric.")}
    assert ours <= set(PICKLED), f"add to PICKLED and docs/compatibility.md: {sorted(ours - set(PICKLED))}"
