"""tools/build.py: caching, failure reporting and the manifest, with the real go command."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def load_build() -> ModuleType:
    spec = importlib.util.spec_from_file_location("nvlfabric_tools_build", REPO / "tools" / "build.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


build = load_build()


def tiny_tool(tmp_path: Path, source: str) -> object:
    wrapper = tmp_path / "wrapper"
    (wrapper / "cmd" / "hello").mkdir(parents=True)
    (wrapper / "go.mod").write_text("module example.com/hello\n\ngo 1.24\n")
    (wrapper / "cmd" / "hello" / "main.go").write_text(source)

    def recipe(tool: object, out: Path) -> list[object]:
        return [build.Step("go build hello", ["go", "build", "-o", str(out / "hello"), "./cmd/hello"], wrapper)]

    return build.Tool("hello", "example.com/hello", "v0.0.1", wrapper, ["hello"], recipe)


GOOD = 'package main\n\nimport "fmt"\n\nfunc main() { fmt.Println("hi") }\n'
BAD = "package main\n\nfunc main() { undefinedThing() }\n"


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NVLFABRIC_TOOLS_CACHE", str(tmp_path / "cache"))


def test_a_built_tool_is_cached_by_key_and_reused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tool = tiny_tool(tmp_path, GOOD)
    first = build.build_tool(tool, force=False)
    assert first["cached"] is False and first["peak_rss_mb"] > 0
    out = subprocess.run([str(Path(first["dir"]) / "hello")], capture_output=True, text=True, check=True)
    assert out.stdout == "hi\n"
    assert build.build_tool(tool, force=False)["cached"] is True
    assert "cached" in capsys.readouterr().out
    assert tool.cache_dir().name.startswith("hello-v0.0.1-linux-")


def test_changing_the_wrapper_changes_the_cache_key(tmp_path: Path) -> None:
    tool = tiny_tool(tmp_path, GOOD)
    before = tool.key()
    (tool.wrapper / "go.mod").write_text("module example.com/hello\n\ngo 1.25\n")
    assert tool.key() != before


def test_a_failed_build_names_module_version_and_first_error_and_caches_nothing(tmp_path: Path) -> None:
    tool = tiny_tool(tmp_path, BAD)
    with pytest.raises(build.BuildError) as excinfo:
        build.build_tool(tool, force=False)
    msg = str(excinfo.value)
    assert "example.com/hello v0.0.1" in msg
    assert "undefined: undefinedThing" in msg
    assert "full log:" in msg
    assert not tool.cache_dir().exists()


def test_first_error_skips_download_noise() -> None:
    out = "go: downloading example.com/x v1.0.0\n# example.com/y\n./main.go:3:1: syntax error: unexpected }\n"
    assert build.first_error(out) == "./main.go:3:1: syntax error: unexpected }"


def test_unknown_tool_names_the_known_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert build.main(["nonesuch"]) == 2
    out = capsys.readouterr().out
    assert "unknown tool(s) nonesuch" in out and "kubernetes" in out and "pulumi" in out


def test_the_yaml_host_is_linked_into_the_plugin_cache_and_bin(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """With ambient plugins ignored the CLI finds a language host that is not beside its own
    binary only in $PULUMI_HOME/plugins/language-<name>-<version>/."""
    (wrapper := tmp_path / "wrapper").mkdir()
    (wrapper / "go.mod").write_text("module example.com/yaml\n")
    tool = build.Tool("pulumi-yaml", "github.com/pulumi/pulumi-yaml", "v1.25.0", wrapper,
                      ["pulumi-language-yaml"], build.pulumi_yaml_recipe)
    (tool.cache_dir() / "bin").mkdir(parents=True)
    binary = tool.cache_dir() / "bin" / "pulumi-language-yaml"
    binary.write_text("#!/bin/sh\n")
    monkeypatch.setattr(build, "BUILD", tmp_path / "build")
    monkeypatch.setattr(build, "TOOLS", [tool])
    manifest = build.install_links()
    assert manifest["missing"] == []
    plugin = tmp_path / "build" / "pulumi-home" / "plugins" / "language-yaml-v1.25.0" / "pulumi-language-yaml"
    assert plugin.resolve() == binary.resolve()
    assert (tmp_path / "build" / "bin" / "pulumi-language-yaml").resolve() == binary.resolve()
    step = build.pulumi_yaml_recipe(tool, tmp_path / "out")[0]
    assert step.argv[-1] == "./cmd/pulumi-language-yaml" and "pkg/version.Version=1.25.0" in " ".join(step.argv)
