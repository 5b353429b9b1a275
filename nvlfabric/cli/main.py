"""`nvlfabric preview-report`: the Markdown impact report of a `pulumi preview --json`.

    pulumi preview --json > preview.json
    nvlfabric preview-report preview.json > report.md     # reads the cluster of $KUBECONFIG too

`--no-cluster` leaves the cluster out (running pods and free GPUs then show as unknown); a
cluster that cannot be read is a warning on stderr and the same report. Exit 2 on input that is
not a preview, naming what was expected.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from nvlfabric.review import impact, markdown, preview


@dataclass(frozen=True)
class Settings:
    preview: str
    """A file with `pulumi preview --json` output, or '-' for stdin."""
    kubeconfig: str
    """The cluster to read ('' : $KUBECONFIG, else ~/.kube/config)."""
    cluster: bool
    title: str


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="nvlfabric", description="nvlfabric's tools for platform repos")
    sub = ap.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("preview-report", help="a Markdown impact report of `pulumi preview --json`",
                         description=__doc__.split("\n\n")[0])
    rep.add_argument("preview", nargs="?", default="-", help="the preview's JSON file ('-': stdin, the default)")
    rep.add_argument("--kubeconfig", default="", help="the cluster to read (default: $KUBECONFIG)")
    rep.add_argument("--no-cluster", action="store_true", help="do not read the cluster")
    rep.add_argument("--title", default="nvlfabric preview", help="the report's heading")
    sub.add_parser("policy-pack", help="print the directory of nvlfabric's policy pack "
                                       "(pulumi preview --policy-pack \"$(nvlfabric policy-pack)\")")
    return ap


def report(cfg: Settings, text: str) -> str:
    pv = preview.load(text)
    facts = None
    if cfg.cluster:
        nodes = impact.declared_racks(pv)
        try:
            from nvlfabric.provider import kube
            from nvlfabric.review import cluster

            facts = cluster.read(kube.client(kube.kubeconfig_source(cfg.kubeconfig or None)), nodes)
        except Exception as exc:  # any failure to read costs only the facts, as at preview
            print(f"nvlfabric preview-report: could not read the cluster ({type(exc).__name__}: {exc}); running "
                  "pods and free GPUs are left unknown", file=sys.stderr)
    return markdown.render(impact.build(pv, facts), title=cfg.title)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.command == "policy-pack":
        from importlib.resources import files

        print(files("nvlfabric.policy") / "pack")
        return 0
    cfg = Settings(preview=args.preview, kubeconfig=args.kubeconfig, cluster=not args.no_cluster, title=args.title)
    try:
        text = sys.stdin.read() if cfg.preview == "-" else Path(cfg.preview).read_text()
    except OSError as exc:
        print(f"nvlfabric preview-report: cannot read {cfg.preview}: {exc.strerror}", file=sys.stderr)
        return 2
    try:
        sys.stdout.write(report(cfg, text))
    except preview.PreviewError as exc:
        print(f"nvlfabric preview-report: {cfg.preview}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
