"""Events the controller records on objects (what `kubectl describe` shows)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from lightkube import Client
from lightkube.models.core_v1 import EventSource, ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event

from nvlfabric.api import errors
from nvlfabric.kube.errors import api_call

log = logging.getLogger("nvlfabric.reservations")

def event(client: Client, namespace: str, kind: str, api_version: str, name: str, uid: str, reason: str,
          message: str, type_: str = "Warning") -> None:
    """A core/v1 Event on an object (what `kubectl describe` shows); a failure only logs."""
    now = datetime.now(UTC)
    try:
        with api_call(f"record event {reason} on {kind} {namespace}/{name}"):
            client.create(Event(
                metadata=ObjectMeta(generateName=f"{name}.", namespace=namespace),
                involvedObject=ObjectReference(kind=kind, apiVersion=api_version, name=name, namespace=namespace,
                                               uid=uid or None),
                reason=reason, message=message[:1024], type=type_, count=1, firstTimestamp=now, lastTimestamp=now,
                source=EventSource(component="nvlfabric-controller")))
    except errors.ApiStatusError as exc:
        log.info("%s", exc)
