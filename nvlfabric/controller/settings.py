"""What the controller runs with: one typed object, checked once by `python -m nvlfabric controller`
(`__main__.settings`, against the contract's limits) and read by the wiring (wiring.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from nvlfabric.api.computedomain import IMEXAuthentication, IMEXMode
from nvlfabric.daemon import process


@dataclass(frozen=True)
class Settings:
    """What the controller runs with, checked once in `main`."""

    kubeconfig: str
    """A kubeconfig file; empty: the pod's service account (`service_account_dir`)."""
    service_account_dir: str
    channels_per_clique: int
    """Size of each clique's channel pool, 1..names.MAX_CHANNELS_PER_CLIQUE."""
    imex_modes: frozenset[IMEXMode]
    """The agents' modes (NvlfabricDriver imex_modes): a domain of another one is Failed."""
    imex_authentication: IMEXAuthentication
    """The default of dedicated domains whose spec has no imexAuthentication (NvlfabricDriver)."""
    imex_cert_validity_s: float
    """How long the IMEX node certificates it signs last (agents renew them after two thirds)."""
    channel_quota_per_namespace: int
    """IMEX channels one namespace's claims may hold (controller/quota.py); 0: no quota."""
    log_format: process.LogFormat
    identity: str
    """This replica's name in the Lease: the pod's name ($POD_NAME), else hostname-pid."""
    lease_name: str
    lease_namespace: str
    lease_duration_s: float
    renew_interval_s: float
    renew_deadline_s: float
    retry_interval_s: float
    """Leader election (nvlfabric/controller/leader.py); renew < deadline < duration."""
    health_port: int
    """/healthz, /readyz and /metrics (nvlfabric/controller/endpoint.py); 0: not served."""
    listen_address: str
