"""The controller's parts, built and started: what `python -m nvlfabric controller` runs once its
settings are checked (`__main__.py`).

Every replica serves its probes and metrics (endpoint.py) and stands for the Lease (leader.py);
only the holder builds and runs the work, all on one set of informers (cache.py), so each kind
is listed and watched once:
- the reconciler's passes: pools, domain summaries, port slots, IMEX authentication, tenancy
  (reconcile.py);
- the reservation passes, which place the claims they reserve (reservations.py, placer.py);
- Kueue's admission checks, answered through the same placement (admission.py).
The parts know nothing of each other beyond the informers and the placement they share: this is
the one module that knows them all (and the import contracts in pyproject.toml hold the rest to
that).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from lightkube import Client

from nvlfabric.api import names
from nvlfabric.api.release import __version__
from nvlfabric.controller import endpoint, leader
from nvlfabric.controller.admission import Admitter
from nvlfabric.controller.cache import Informers
from nvlfabric.controller.reconcile import Controller
from nvlfabric.controller.reservations import Reserver
from nvlfabric.controller.settings import Settings
from nvlfabric.kube import client as kube_client

log = logging.getLogger("nvlfabric.controller")


def run(cfg: Settings, stop: threading.Event) -> bool:
    """Serve the probes, wait for the Lease, and work while holding it, until `stop` is set: True;
    False when leadership was lost (the caller exits, so its work never overlaps the new leader's)."""
    client = kube_client.from_kubeconfig_or_service_account(
        cfg.kubeconfig, cfg.service_account_dir, field_manager=names.CONTROLLER_FIELD_MANAGER)
    elector = leader.Elector(client, name=cfg.lease_name, namespace=cfg.lease_namespace, identity=cfg.identity,
                             timings=leader.Timings(cfg.lease_duration_s, cfg.renew_interval_s, cfg.renew_deadline_s,
                                                    cfg.retry_interval_s))
    health = endpoint.Health(stale_s=2 * cfg.lease_duration_s, leading=lambda: elector.leading,
                             last_read=lambda: elector.last_read)
    try:
        endpoint.serve(cfg.health_port, cfg.listen_address, health)
    except OSError as exc:  # no probes answer then: the kubelet's liveness probe restarts us
        log.error("cannot serve /healthz, /readyz and /metrics on %s:%d: %s", cfg.listen_address or "*",
                  cfg.health_port, exc)
    log.info("nvlfabric %s: controller %s, standby until it holds Lease %s/%s", __version__, cfg.identity,
             cfg.lease_namespace, cfg.lease_name)
    return elector.lead(lambda should_stop: work(client, cfg, should_stop), stop, on_tick=health.tick)


def work(client: Client, cfg: Settings, stop: Callable[[], bool]) -> None:
    """The leader's work until `stop()`: the parts built on one set of informers, reservations and
    admission in threads of their own, the informers started, then the reconciler's passes here."""
    cache = Informers.of(client)
    controller = Controller(client, channels_per_clique=cfg.channels_per_clique, imex_modes=cfg.imex_modes,
                            imex_authentication=cfg.imex_authentication, imex_cert_validity_s=cfg.imex_cert_validity_s,
                            channel_quota_per_namespace=cfg.channel_quota_per_namespace, informers=cache)
    reserver = Reserver(client, names.DRIVER, channels_per_clique=cfg.channels_per_clique,
                        imex_modes=cfg.imex_modes, informers=cache)
    threading.Thread(target=reserver.run, args=(stop,), name="reserver", daemon=True).start()
    # Kueue's admission checks of nvlfabric place through the reservation passes' own placement.
    threading.Thread(target=Admitter(client, reserver.placer).run, args=(stop,), name="admission",
                     daemon=True).start()
    cache.start(stop)
    controller.run(stop=stop)
