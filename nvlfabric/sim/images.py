"""Which container images the simulated nodes run, and as what: `nvlfabric-sim up --images FILE`.

A simulated node has no container runtime and pulls nothing: a container runs only if its image
maps to a program on this machine; any other container is recorded and runs nothing (its log
says so). The file maps image references (names, or names with a tag) to what the image would run:

```yaml
# images.yaml
images:
  registry.example.com/ml/train:          # the image's ENTRYPOINT, as a list
    - /usr/bin/python3
    - /srv/train/main.py
  ghcr.io/example/exporter:               # or its ENTRYPOINT and CMD
    entrypoint: [/usr/local/bin/exporter]
    cmd: [--port=9100]
  registry.example.com/gpu/driver:        # and the files the image holds, at their image paths
    entrypoint: [/usr/bin/driver-plugin]
    files:
      /usr/bin/driver-plugin: /opt/build/driver-plugin   # image path: a file or directory here
      /templates: /opt/build/templates
    env:                                  # and its ENV: the container's environment under the pod's
      DRIVER_TEMPLATES: /templates
```

An image's `files` are what a real image would carry (its binaries at their paths, templates,
helper scripts): each is bound read-only into every container of the image at its image path,
over the machine's file system that is otherwise each container's root, without touching the
machine (rootfs.py); the container's volumes and CDI mounts go over them, as over an image.

A reference with a tag (`registry.example.com/ml/train:2.1`) maps that tag alone, and wins over
the reference without one: as a real node runs what each tag's image holds, one simulator can run
two releases of a program side by side (the upgrade test runs the previous release's agent image
from that release's virtualenv). Digests are not mapped.

The container's own `command` and `args` apply as Kubernetes applies them to an image:
`command` replaces the ENTRYPOINT (and drops CMD), `args` replaces CMD; both with `$(VAR)`
expanded. An image's `env` comes first, the pod's own `env` over it, as a runtime merges an image's
ENV with the container's. nvlfabric's own image (`nvlfabric/node-agent`) is always mapped
(nodeimage.py: this Python, and the IMEX keeper the simulator builds); the file may map it to
something else.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Final

import yaml
from pydantic import BaseModel, ConfigDict, Field, RootModel, ValidationError, field_validator

from nvlfabric.api import names
from nvlfabric.sim import nodeimage

AGENT_IMAGE: Final = names.AGENT_IMAGE_REPOSITORY


class ImageProgram(BaseModel):
    """What an image runs: its ENTRYPOINT and CMD."""

    model_config = ConfigDict(extra="forbid")

    entrypoint: list[str] = Field(min_length=1, description="the program and its first arguments")
    cmd: list[str] = Field(default_factory=list, description="the default arguments (the image's CMD)")
    files: dict[str, str] = Field(default_factory=dict, description=(
        "image path → the file or directory on this machine the image holds there (both absolute)"))
    env: dict[str, str] = Field(default_factory=dict, description=(
        "the image's ENV: the container's environment before the pod's own env goes over it"))

    @field_validator("files")
    @classmethod
    def _absolute(cls, files: dict[str, str]) -> dict[str, str]:
        for target, source in files.items():
            if not target.startswith("/") or target.rstrip("/") == "":
                raise ValueError(f"{target!r}: an image path is absolute and not / itself (e.g. /usr/bin/tool)")
            if not source.startswith("/"):
                raise ValueError(f"{target}: {source!r} is not an absolute path on this machine")
        return files

    def argv(self, command: list[str], args: list[str]) -> list[str]:
        """The process a container of this image runs, from its (expanded) command and args."""
        if command:
            return [*command, *args]
        return [*self.entrypoint, *(args or self.cmd)]


class _Entry(RootModel[ImageProgram | list[str]]):
    pass


class ImagesFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    images: dict[str, _Entry] = Field(default_factory=dict)

    @field_validator("images")
    @classmethod
    def _references(cls, images: dict[str, _Entry]) -> dict[str, _Entry]:
        for ref in images:
            if "@" in ref:
                raise ValueError(f"{ref!r}: give the image with a tag or without one, not with a digest")
        return images


def default_images() -> dict[str, ImageProgram]:
    """The images every simulator runs: nvlfabric's own (the agent, the keeper, the controller), as
    deploy/Dockerfile builds it: this Python's `-m nvlfabric`, and the keeper program it names."""
    return {AGENT_IMAGE: ImageProgram(entrypoint=[sys.executable, "-m", "nvlfabric"], env=nodeimage.image_env())}


def load(path: Path) -> dict[str, ImageProgram]:
    """The defaults with the file's images over them; a bad file is a ValueError naming the entry."""
    try:
        raw = yaml.safe_load(path.read_text()) or {}
        parsed = ImagesFile.model_validate(raw)
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"--images {path}: {exc}") from None
    except ValidationError as exc:
        where = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"--images {path}: {where} (see `nvlfabric-sim up --help` for the format)") from None
    out = default_images()
    for ref, entry in parsed.images.items():
        value = entry.root
        out[ref] = value if isinstance(value, ImageProgram) else ImageProgram(entrypoint=value)
    return out


def program_for(images: dict[str, ImageProgram], reference: str) -> ImageProgram | None:
    """What a container of image `reference` runs: its tag's entry, else its name's, else None."""
    tagged = reference.split("@", 1)[0]
    return images.get(tagged) or images.get(image_name(reference))


def image_name(reference: str) -> str:
    """An image reference without its tag or digest (`registry:5000/a/b:1.2@sha256:..` → `registry:5000/a/b`)."""
    name = reference.split("@", 1)[0]
    head, _, last = name.rpartition("/")
    return f"{head}/{last.split(':', 1)[0]}" if head else last.split(":", 1)[0]
