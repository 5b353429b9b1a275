"""What the kubelet writes into a pod's configMap, secret, downwardAPI and projected volumes.

The files a container finds in such a volume, as the kubelet materialises them: every key of the
ConfigMap (`data` and `binaryData`) or Secret (`data`, base64-decoded) as a file named after it,
or only the `items` listed, at their paths; downward-API files for `fieldRef`s (labels and
annotations as `key="value"` lines, sorted); projected volumes as the union of their sources, the
service-account token among them. File modes are `items[].mode`, else the volume's
`defaultMode` (0644). A missing ConfigMap or Secret fails the pod's start (`FailedMount`), unless
the volume says `optional: true`, as on a real node. Written once, when the container starts:
later changes to the ConfigMap do not reach a running pod here (the real kubelet syncs them).
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import ConfigMap, Pod, Secret

DEFAULT_MODE = 0o644


class MountError(Exception):
    """A volume's source is missing; the message is the kubelet's FailedMount event text."""


@dataclass
class File:
    data: bytes
    mode: int


Files = dict[str, File]  # path in the volume → content


def _keyed(data: dict[str, bytes], items: Any, default_mode: int) -> Files:
    if not items:
        return {key: File(value, default_mode) for key, value in sorted(data.items())}
    out: Files = {}
    for item in items:
        if item.key in data:
            out[item.path] = File(data[item.key], item.mode if item.mode is not None else default_mode)
        else:  # a listed key the object lacks is an error even for an optional source, as the kubelet has it
            raise MountError(f'configmap/secret references non-existent key "{item.key}"')
    return out


class Sources:
    """The ConfigMaps and Secrets volumes read, each kept for `ttl_s`: the kubelet reads them
    through a cache too, and a DaemonSet rolling out on 144 nodes would otherwise read the same
    `kube-root-ca.crt` 144 times at once from one client's connection pool."""

    def __init__(self, client: AsyncClient, ttl_s: float = 1.0) -> None:
        self.client, self.ttl_s = client, ttl_s
        self._seen: dict[tuple[type, str, str], tuple[float, Any]] = {}
        self._pending: dict[tuple[type, str, str], asyncio.Task[Any]] = {}

    async def get(self, kind: type[ConfigMap] | type[Secret], name: str, namespace: str) -> Any:
        key = (kind, namespace, name)
        if (hit := self._seen.get(key)) is not None and time.monotonic() - hit[0] < self.ttl_s:
            return hit[1]
        task = self._pending.get(key)
        if task is None:  # one read for all who ask at once
            task = self._pending[key] = asyncio.create_task(self.client.get(kind, name, namespace=namespace))
            task.add_done_callback(lambda _t: self._pending.pop(key, None))
        obj = await asyncio.shield(task)
        self._seen[key] = (time.monotonic(), obj)
        return obj


async def _read(client: Sources, kind: type[ConfigMap] | type[Secret], name: str, namespace: str,
                optional: bool) -> Any:
    """The object, None when it is missing and `optional`, else the kubelet's FailedMount text."""
    try:
        return await client.get(kind, name, namespace)
    except ApiError as exc:
        if exc.status.code != 404:
            raise
        if optional:
            return None
        raise MountError(f'{kind.__name__.lower()} "{name}" not found') from exc


async def _config_map(client: Sources, name: str, namespace: str, optional: bool) -> dict[str, bytes] | None:
    if (cm := await _read(client, ConfigMap, name, namespace, optional)) is None:
        return None
    data = {k: v.encode() for k, v in (cm.data or {}).items()}
    data.update({k: base64.b64decode(v) for k, v in (cm.binaryData or {}).items()})
    return data


async def _secret(client: Sources, name: str, namespace: str, optional: bool) -> dict[str, bytes] | None:
    if (secret := await _read(client, Secret, name, namespace, optional)) is None:
        return None
    return {k: base64.b64decode(v) for k, v in (secret.data or {}).items()}


def _field(pod: Pod, path: str) -> str:
    """A downward-API file's content for `fieldRef.fieldPath`."""
    assert pod.metadata is not None
    meta = pod.metadata
    if path in ("metadata.labels", "metadata.annotations"):
        values = (meta.labels if path.endswith("labels") else meta.annotations) or {}
        return "\n".join(f"{k}={json.dumps(v)}" for k, v in sorted(values.items()))
    for prefix, found in (("metadata.labels", meta.labels), ("metadata.annotations", meta.annotations)):
        if path.startswith(prefix + "['") and path.endswith("']"):
            return str((found or {}).get(path[len(prefix) + 2:-2], ""))
    return {"metadata.name": meta.name, "metadata.namespace": meta.namespace, "metadata.uid": meta.uid}.get(path) or ""


def _downward(pod: Pod, items: Any, default_mode: int) -> Files:
    return {item.path: File(_field(pod, item.fieldRef.fieldPath).encode(),
                            item.mode if item.mode is not None else default_mode)
            for item in items or [] if item.fieldRef is not None}


async def contents(client: Sources, pod: Pod, token: Callable[[], Awaitable[str | None]]) -> dict[str, Files]:
    """Volume name → its files, for each configMap, secret, downwardAPI and projected volume.
    `token` gives the pod's service-account token (asked only if a projected volume needs one)."""
    assert pod.metadata is not None and pod.spec is not None
    namespace = pod.metadata.namespace or "default"
    out: dict[str, Files] = {}
    for vol in pod.spec.volumes or []:
        if vol.configMap is not None:
            mode = vol.configMap.defaultMode if vol.configMap.defaultMode is not None else DEFAULT_MODE
            data = await _config_map(client, vol.configMap.name or "", namespace, bool(vol.configMap.optional))
            out[vol.name] = _keyed(data or {}, vol.configMap.items, mode)
        elif vol.secret is not None:
            mode = vol.secret.defaultMode if vol.secret.defaultMode is not None else DEFAULT_MODE
            data = await _secret(client, vol.secret.secretName or "", namespace, bool(vol.secret.optional))
            out[vol.name] = _keyed(data or {}, vol.secret.items, mode)
        elif vol.downwardAPI is not None:
            mode = vol.downwardAPI.defaultMode if vol.downwardAPI.defaultMode is not None else DEFAULT_MODE
            out[vol.name] = _downward(pod, vol.downwardAPI.items, mode)
        elif vol.projected is not None:
            mode = vol.projected.defaultMode if vol.projected.defaultMode is not None else DEFAULT_MODE
            files: Files = {}
            for source in vol.projected.sources or []:
                if source.configMap is not None:
                    data = await _config_map(client, source.configMap.name or "", namespace,
                                             bool(source.configMap.optional))
                    files.update(_keyed(data or {}, source.configMap.items, mode))
                elif source.secret is not None:
                    data = await _secret(client, source.secret.name or "", namespace, bool(source.secret.optional))
                    files.update(_keyed(data or {}, source.secret.items, mode))
                elif source.downwardAPI is not None:
                    files.update(_downward(pod, source.downwardAPI.items, mode))
                elif source.serviceAccountToken is not None and (value := await token()) is not None:
                    # 0600 unless the volume says otherwise: a token is a credential.
                    files[source.serviceAccountToken.path] = File(
                        value.encode(), vol.projected.defaultMode if vol.projected.defaultMode is not None else 0o600)
            out[vol.name] = files
    return out


def write(directory: Path, files: Files) -> None:
    for rel, f in files.items():
        path = directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(f.data)
        path.chmod(f.mode)
