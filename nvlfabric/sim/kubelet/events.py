"""Pod events as the kubelet's event recorder writes them: best effort, never failing the caller."""

from __future__ import annotations

import logging

from lightkube import AsyncClient
from lightkube.models.core_v1 import EventSource, ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event, Pod

from nvlfabric.api import errors
from nvlfabric.kube.errors import api_call
from nvlfabric.sim.kubelet.processes import PodProcess
from nvlfabric.sim.kubelet.state import now

log = logging.getLogger("nvlfabric.sim.kubelet")


async def pod_event(client: AsyncClient, pod: Pod, reason: str, message: str, *, warning: bool) -> None:
    assert pod.metadata is not None
    log.info("pod %s/%s: %s: %s", pod.metadata.namespace, pod.metadata.name, reason, message)
    node = pod.spec.nodeName if pod.spec else ""
    ev = Event(
        metadata=ObjectMeta(generateName=f"{pod.metadata.name}.", namespace=pod.metadata.namespace),
        involvedObject=ObjectReference(kind="Pod", apiVersion="v1", name=pod.metadata.name,
                                       namespace=pod.metadata.namespace, uid=pod.metadata.uid),
        reason=reason, message=message[:1024], type="Warning" if warning else "Normal",
        source=EventSource(component="kubelet", host=node), firstTimestamp=now(), lastTimestamp=now(), count=1,
    )
    # Best effort, as the kubelet's recorder: an event lost to a busy API server (a pool or
    # connect timeout under load: docs/architecture.md, Simulator) must not fail what it reports
    # on, least of all the pod sync's error path, whose retry would then never come.
    try:
        with api_call(f"create event {reason} of pod {pod.metadata.namespace}/{pod.metadata.name}"):
            await client.create(ev)
    except errors.NvlfabricError as exc:
        log.info("pod %s/%s: event %s not written (%s)", pod.metadata.namespace, pod.metadata.name, reason, exc)


async def container_event(client: AsyncClient, proc: PodProcess, reason: str, message: str, *,
                          warning: bool) -> None:
    """An event of the pod a running container belongs to (the pod read first). Best effort, as
    the kubelet's event recorder: an event lost to a busy API server must not stop what reported
    it (a prober)."""
    try:
        pod = await client.get(Pod, proc.pod_name, namespace=proc.namespace)
        await pod_event(client, pod, reason, message, warning=warning)
    except Exception as exc:  # transport errors (pool, read timeouts) as well as API ones
        log.info("pod %s/%s: event %s not written (%s)", proc.namespace, proc.pod_name, reason, exc)
