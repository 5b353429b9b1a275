"""`python -m nvlfabric controller`: the cluster controller (the Deployment's container).

Every setting has a flag and an environment-variable twin (the Deployment sets the latter). Settings
are checked before anything starts, against the same limits the components accept
(`nvlfabric.api.names`), so a bad value is one clear line and exit code 2, not a crash loop.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys

from nvlfabric.api import names
from nvlfabric.api.computedomain import IMEXAuthentication, IMEXMode
from nvlfabric.controller.settings import Settings
from nvlfabric.daemon import process

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def _parser() -> argparse.ArgumentParser:
    env = os.environ.get
    ap = argparse.ArgumentParser(prog="python -m nvlfabric controller", description=__doc__.splitlines()[0])
    ap.add_argument("--kubeconfig", default=env("KUBECONFIG", ""))
    ap.add_argument("--service-account-dir", default=env("SERVICE_ACCOUNT_DIR", SA_DIR),
                    help="in-cluster credentials; --kubeconfig / $KUBECONFIG take precedence")
    ap.add_argument("--channels-per-clique",
                    default=env("CHANNELS_PER_CLIQUE", str(names.DEFAULT_CHANNELS_PER_CLIQUE)),
                    help=f"each clique's channel pool size, 1..{names.MAX_CHANNELS_PER_CLIQUE} ($CHANNELS_PER_CLIQUE)")
    ap.add_argument("--imex-modes", default=env("IMEX_MODES", ",".join(m.value for m in IMEXMode)),
                    help="comma-separated IMEX modes the node agents prepare ($IMEX_MODES)")
    ap.add_argument("--imex-authentication", default=env("IMEX_AUTHENTICATION", IMEXAuthentication.DISABLED.value),
                    help="default imexAuthentication of dedicated ComputeDomains: "
                         f"{' or '.join(m.value for m in IMEXAuthentication)} ($IMEX_AUTHENTICATION)")
    ap.add_argument("--imex-cert-validity", default=env("IMEX_CERT_VALIDITY", str(names.DEFAULT_IMEX_CERT_VALIDITY_S)),
                    help="seconds an IMEX node certificate lasts ($IMEX_CERT_VALIDITY)")
    ap.add_argument("--channel-quota-per-namespace",
                    default=env("CHANNEL_QUOTA_PER_NAMESPACE", str(names.DEFAULT_CHANNEL_QUOTA_PER_NAMESPACE)),
                    help="IMEX channels one namespace's claims may hold, kept as a ResourceQuota; 0: no quota "
                         "($CHANNEL_QUOTA_PER_NAMESPACE)")
    ap.add_argument("--log-format", choices=["json", "text"], default=env("LOG_FORMAT", "json"))
    ap.add_argument("--identity", default=env("POD_NAME", ""),
                    help="this replica's holder identity in the Lease ($POD_NAME; default hostname-pid)")
    ap.add_argument("--lease-name", default=env("LEASE_NAME", "nvlfabric-controller"))
    ap.add_argument("--lease-namespace", default=env("POD_NAMESPACE", names.NAMESPACE),
                    help="the Lease's namespace, the controller's own ($POD_NAMESPACE)")
    ap.add_argument("--lease-duration", default=env("LEASE_DURATION", "10"),
                    help="seconds an unrenewed Lease still holds ($LEASE_DURATION)")
    ap.add_argument("--renew-interval", default=env("RENEW_INTERVAL", "3"),
                    help="seconds between the leader's renews ($RENEW_INTERVAL)")
    ap.add_argument("--renew-deadline", default=env("RENEW_DEADLINE", "7"),
                    help="seconds without a renew after which the leader stops ($RENEW_DEADLINE)")
    ap.add_argument("--retry-interval", default=env("RETRY_INTERVAL", "2"),
                    help="seconds between a standby's reads of the Lease ($RETRY_INTERVAL)")
    ap.add_argument("--health-port", default=env("HEALTH_PORT", "8080"),
                    help="port of /healthz, /readyz and /metrics; 0: none ($HEALTH_PORT)")
    ap.add_argument("--listen-address", default=env("LISTEN_ADDRESS", ""),
                    help="address the health port binds to; empty: all ($LISTEN_ADDRESS)")
    return ap


def channels_per_clique(value: str) -> int:
    """The pool size from its flag or environment value, or a `process.SettingsError` saying what is allowed."""
    return process.whole_number(
        value, flag="--channels-per-clique", env="CHANNELS_PER_CLIQUE", low=1, high=names.MAX_CHANNELS_PER_CLIQUE,
        why=f" (channel 0 is never handed out, so a clique has at most {names.MAX_CHANNELS_PER_CLIQUE}); set "
            "NvlfabricDriver(channels_per_clique=...) within that range")


def imex_authentication(value: str) -> IMEXAuthentication:
    try:
        return IMEXAuthentication(value)
    except ValueError:
        raise process.SettingsError(
            f"--imex-authentication / $IMEX_AUTHENTICATION: {value!r} is not one of "
            f"{', '.join(m.value for m in IMEXAuthentication)}; set NvlfabricDriver(imex_authentication=...)") from None


def imex_cert_validity(value: str) -> float:
    validity = process.seconds(value, flag="--imex-cert-validity", env="IMEX_CERT_VALIDITY")
    if validity < names.MIN_IMEX_CERT_VALIDITY_S:
        raise process.SettingsError(f"--imex-cert-validity / $IMEX_CERT_VALIDITY: {value!r} is under "
                                    f"{names.MIN_IMEX_CERT_VALIDITY_S} s; agents renew after two thirds of it")
    return validity


def settings(argv: list[str]) -> Settings:
    args = _parser().parse_args(argv)
    duration = process.seconds(args.lease_duration, flag="--lease-duration", env="LEASE_DURATION")
    renew = process.seconds(args.renew_interval, flag="--renew-interval", env="RENEW_INTERVAL")
    deadline = process.seconds(args.renew_deadline, flag="--renew-deadline", env="RENEW_DEADLINE")
    retry = process.seconds(args.retry_interval, flag="--retry-interval", env="RETRY_INTERVAL")
    if not renew < deadline < duration:
        raise process.SettingsError(
            f"--renew-interval ({renew:g}) < --renew-deadline ({deadline:g}) < --lease-duration ({duration:g}) "
            "must hold: a leader renews before its deadline and stops before its Lease expires for the others")
    return Settings(kubeconfig=args.kubeconfig, service_account_dir=args.service_account_dir,
                    channels_per_clique=channels_per_clique(args.channels_per_clique),
                    imex_modes=process.imex_modes(args.imex_modes), log_format=args.log_format,
                    imex_authentication=imex_authentication(args.imex_authentication),
                    imex_cert_validity_s=imex_cert_validity(args.imex_cert_validity),
                    channel_quota_per_namespace=process.whole_number(
                        args.channel_quota_per_namespace, flag="--channel-quota-per-namespace",
                        env="CHANNEL_QUOTA_PER_NAMESPACE", low=0, high=names.MAX_CHANNEL_QUOTA_PER_NAMESPACE,
                        why="; set NvlfabricDriver(channel_quota_per_namespace=...) within that range (0: no quota)"),
                    identity=args.identity or f"{socket.gethostname()}-{os.getpid()}", lease_name=args.lease_name,
                    lease_namespace=args.lease_namespace, lease_duration_s=duration, renew_interval_s=renew,
                    renew_deadline_s=deadline, retry_interval_s=retry,
                    health_port=process.whole_number(args.health_port, flag="--health-port", env="HEALTH_PORT",
                                                     low=0, high=65535),
                    listen_address=args.listen_address)


def main(argv: list[str] | None = None) -> int:
    try:
        cfg = settings(sys.argv[1:] if argv is None else argv)
    except process.SettingsError as exc:
        print(f"nvlfabric controller: {exc}", file=sys.stderr)
        return 2
    process.setup_logging(cfg.log_format)
    stop = process.stop_on_signals()
    # Imported after the settings are checked: lightkube and the models take a while to load.
    from nvlfabric.controller import wiring

    if wiring.run(cfg, stop):
        return 0
    # Leadership lost: exit at once, without waiting for a pass or a reservation under way (os._exit:
    # no thread is joined), and the kubelet restarts this replica as a standby, so its work never
    # overlaps the new leader's.
    logging.shutdown()
    os._exit(1)


if __name__ == "__main__":
    sys.exit(main())
