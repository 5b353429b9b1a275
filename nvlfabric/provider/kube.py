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
from typing import Any

from lightkube import Client
from pulumi.dynamic import ConfigureRequest, ResourceProvider

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


class KubeProvider(ResourceProvider):
    """A dynamic provider that talks to the cluster of the stack's `kubernetes:kubeconfig` (or the
    component provider's `nvlfabric:kubeconfig`), else `$KUBECONFIG`: only the source is kept,
    the client is built on first use in the provider process."""

    # Nothing secret is captured; skipping the per-resource encryption keeps big stacks fast.
    serialize_as_secret_always = False
    #: Set by `configure` in the provider process (None: $KUBECONFIG). A class attribute, so that a
    #: provider unpickled from a state that does not hold it has it all the same.
    kubeconfig: str | None = None

    def configure(self, req: ConfigureRequest) -> None:
        self.kubeconfig = req.config.get("kubernetes:kubeconfig") or req.config.get("nvlfabric:kubeconfig")

    def _client(self) -> Any:
        return client(kubeconfig_source(self.kubeconfig))
