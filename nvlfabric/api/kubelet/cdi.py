"""The Container Device Interface (CDI) spec format, as container runtimes read it.

The one schema of a CDI spec file in this project: the node agent writes specs with it and the
simulated kubelet (standing in for a CDI-enabled runtime) reads and resolves them with it.
Decoding is strict, as the runtimes' is: an unknown field makes the whole file unusable.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

# vendor and class: letters, digits, '_', '-', '.'; start with a letter, end with a letter or digit.
_VENDOR = r"[A-Za-z](?:[A-Za-z0-9_.\-]*[A-Za-z0-9])?"
_CLASS = r"[A-Za-z](?:[A-Za-z0-9_.\-]*[A-Za-z0-9])?"
# device names: letters, digits, '_', '-', '.', ':'; alphanumeric at both ends.
_DEVICE = r"[A-Za-z0-9](?:[A-Za-z0-9_.:\-]*[A-Za-z0-9])?"
KIND_RE = re.compile(rf"^{_VENDOR}/{_CLASS}$")
QUALIFIED_RE = re.compile(rf"^(?P<kind>{_VENDOR}/{_CLASS})=(?P<name>{_DEVICE})$")

DeviceName = Annotated[str, StringConstraints(pattern=rf"^{_DEVICE}$")]
Kind = Annotated[str, StringConstraints(pattern=KIND_RE.pattern)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class DeviceNode(_Strict):
    path: str
    host_path: str | None = Field(default=None, alias="hostPath")
    type: str | None = None
    major: int | None = None
    minor: int | None = None
    file_mode: int | None = Field(default=None, alias="fileMode")
    permissions: str | None = None
    uid: int | None = None
    gid: int | None = None


class Mount(_Strict):
    host_path: str = Field(alias="hostPath")
    container_path: str = Field(alias="containerPath")
    type: str | None = None
    options: list[str] = Field(default_factory=list)


class Hook(_Strict):
    hook_name: str = Field(alias="hookName")
    path: str
    args: list[str] = Field(default_factory=list)
    env: list[str] = Field(default_factory=list)
    timeout: int | None = None


class ContainerEdits(_Strict):
    env: list[str] = Field(default_factory=list)
    device_nodes: list[DeviceNode] = Field(default_factory=list, alias="deviceNodes")
    mounts: list[Mount] = Field(default_factory=list)
    hooks: list[Hook] = Field(default_factory=list)
    additional_gids: list[int] = Field(default_factory=list, alias="additionalGids")

    def merged(self, other: ContainerEdits) -> ContainerEdits:
        return ContainerEdits(
            env=[*self.env, *other.env],
            device_nodes=[*self.device_nodes, *other.device_nodes],
            mounts=[*self.mounts, *other.mounts],
            hooks=[*self.hooks, *other.hooks],
            additional_gids=[*self.additional_gids, *other.additional_gids],
        )


class Device(_Strict):
    name: DeviceName
    annotations: dict[str, str] = Field(default_factory=dict)
    container_edits: ContainerEdits = Field(default_factory=ContainerEdits, alias="containerEdits")


class Spec(_Strict):
    cdi_version: str = Field(alias="cdiVersion", pattern=r"^\d+\.\d+\.\d+$")
    kind: Kind
    annotations: dict[str, str] = Field(default_factory=dict)
    devices: list[Device] = Field(min_length=1)
    container_edits: ContainerEdits = Field(default_factory=ContainerEdits, alias="containerEdits")

    def qualified(self, device: str) -> str:
        return f"{self.kind}={device}"

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, exclude_defaults=True, indent=2) + "\n"
