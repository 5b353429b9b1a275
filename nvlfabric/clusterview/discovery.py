"""Whether a cluster serves an API: a CRD's kind (JobSet, LeaderWorkerSet) or a gated Kubernetes
one (scheduling.k8s.io's Workload), found by listing at most one object of it."""

from __future__ import annotations

from lightkube import Client
from lightkube.generic_resource import create_namespaced_resource

from nvlfabric.api import errors
from nvlfabric.kube.errors import api_call


def served(client: Client, api_version: str, kind: str, plural: str, namespace: str) -> bool | None:
    """True: served; False: the API server answers 404 (no such group, version or resource);
    None: it could not tell (unreachable, forbidden)."""
    group, version = api_version.split("/")
    res = create_namespaced_resource(group, version, kind, plural)
    try:
        # (An unknown group's 404 is a plain "404 page not found", not a Status: api_call sorts both.)
        with api_call(f"list {kind} in {namespace}"):
            next(iter(client.list(res, namespace=namespace, chunk_size=1)), None)
    except errors.NotFound:
        return False
    except Exception:  # no cluster to ask (unreachable, forbidden): say nothing
        return None
    return True
