"""lightkube clients from the credentials our processes are given.

- a kubeconfig: a path (the first of a `KUBECONFIG` list) or the YAML itself (Pulumi stack config
  `kubernetes:kubeconfig` may hold either);
- else a pod's service account (the controller in its Deployment).
"""

from __future__ import annotations

import os

import yaml
from lightkube import Client
from lightkube.config.kubeconfig import KubeConfig


def kubeconfig(source: str) -> KubeConfig:
    """A kubeconfig from a path (or a `os.pathsep`-separated list: the first) or from its YAML text."""
    if "\n" in source or source.lstrip().startswith(("apiVersion", "{")):
        return KubeConfig.from_dict(yaml.safe_load(source))
    return KubeConfig.from_file(source.split(os.pathsep)[0])


def from_kubeconfig(source: str, *, field_manager: str) -> Client:
    return Client(config=kubeconfig(source), field_manager=field_manager)


def from_kubeconfig_or_service_account(source: str, service_account_dir: str, *, field_manager: str) -> Client:
    """A client from `source` when given, else from the service account mounted at `service_account_dir`."""
    if source:
        return from_kubeconfig(source, field_manager=field_manager)
    config = KubeConfig.from_service_account(service_account=service_account_dir)
    return Client(config=config, field_manager=field_manager)
