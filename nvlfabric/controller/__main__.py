"""`python -m nvlfabric controller`: the cluster controller (the Deployment's container).

Every setting has a flag and an environment-variable twin (the Deployment sets the latter). Settings
are checked before anything starts, against the same limits the components accept
(`nvlfabric.api.names`), so a bad value is one clear line and exit code 2, not a crash loop.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import dataclass

from nvlfabric.api import names, process

log = logging.getLogger("nvlfabric.controller")
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


@dataclass(frozen=True)
class Settings:
    """What the controller runs with, checked once in `main`."""

    kubeconfig: str
    """A kubeconfig file; empty: the pod's service account (`service_account_dir`)."""
    service_account_dir: str
    channels_per_clique: int
    """Size of each clique's channel pool, 1..names.MAX_CHANNELS_PER_CLIQUE."""
    log_format: process.LogFormat


def _parser() -> argparse.ArgumentParser:
    env = os.environ.get
    ap = argparse.ArgumentParser(prog="python -m nvlfabric controller", description=__doc__.splitlines()[0])
    ap.add_argument("--kubeconfig", default=env("KUBECONFIG", ""))
    ap.add_argument("--service-account-dir", default=env("SERVICE_ACCOUNT_DIR", SA_DIR),
                    help="in-cluster credentials; --kubeconfig / $KUBECONFIG take precedence")
    ap.add_argument("--channels-per-clique",
                    default=env("CHANNELS_PER_CLIQUE", str(names.DEFAULT_CHANNELS_PER_CLIQUE)),
                    help=f"each clique's channel pool size, 1..{names.MAX_CHANNELS_PER_CLIQUE} ($CHANNELS_PER_CLIQUE)")
    ap.add_argument("--log-format", choices=["json", "text"], default=env("LOG_FORMAT", "json"))
    return ap


def channels_per_clique(value: str) -> int:
    """The pool size from its flag or environment value, or a `process.SettingsError` saying what is allowed."""
    return process.whole_number(
        value, flag="--channels-per-clique", env="CHANNELS_PER_CLIQUE", low=1, high=names.MAX_CHANNELS_PER_CLIQUE,
        why=f" (channel 0 is never handed out, so a clique has at most {names.MAX_CHANNELS_PER_CLIQUE}); set "
            "NvlfabricDriver(channels_per_clique=...) within that range")


def settings(argv: list[str]) -> Settings:
    args = _parser().parse_args(argv)
    return Settings(kubeconfig=args.kubeconfig, service_account_dir=args.service_account_dir,
                    channels_per_clique=channels_per_clique(args.channels_per_clique), log_format=args.log_format)


def main(argv: list[str] | None = None) -> int:
    try:
        cfg = settings(sys.argv[1:] if argv is None else argv)
    except process.SettingsError as exc:
        print(f"nvlfabric controller: {exc}", file=sys.stderr)
        return 2
    process.setup_logging(cfg.log_format)
    stop = process.stop_on_signals()
    # Imported after the settings are checked: lightkube and the models take a while to load.
    from nvlfabric.controller.reconcile import Controller
    from nvlfabric.kube import client as kube_client

    client = kube_client.from_kubeconfig_or_service_account(
        cfg.kubeconfig, cfg.service_account_dir, field_manager=names.CONTROLLER_FIELD_MANAGER)
    Controller(client, channels_per_clique=cfg.channels_per_clique).run(stop=stop.is_set)
    return 0


if __name__ == "__main__":
    sys.exit(main())
