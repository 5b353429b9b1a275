"""The Kubernetes client the dynamic providers use, built lazily and never pickled.

Pulumi pickles a dynamic provider (with dill) into the stack state; a live client holds sockets
and cannot be pickled, and a pickled one would pin stale credentials. So providers keep only
the *source* of their configuration and build a client on first use in the provider process:
stack config `kubernetes:kubeconfig` (a path or the YAML itself), else `$KUBECONFIG`, else
`~/.kube/config`.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from lightkube import Client

from nvlfabric.kube import client as kube_client

_clients: dict[str, Client] = {}
_lock = threading.Lock()


def kubeconfig_source(configured: str | None) -> str:
    """The kubeconfig to use: configured value (path or YAML), else $KUBECONFIG, else the default."""
    if configured:
        return configured
    return os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")


def client(source: str) -> Client:
    """A shared client per kubeconfig source (the provider server runs RPCs on 4 threads)."""
    with _lock:
        if source not in _clients:
            _clients[source] = kube_client.from_kubeconfig(source, field_manager="nvlfabric")
        return _clients[source]
