"""Provider benchmark → bench/results/provider.json.

A stack of 100 ComputeDomains (each with its channel claim) through the real Pulumi CLI against
the local control plane:
- up_100_cds_s        first `pulumi up` (creates 100 domains + 100 claims, awaiting Accepted)
- preview_100_cds_s   `pulumi preview` of the unchanged stack (goal <= 30 s on 2 cores)
- noop_up_100_cds_s   `pulumi up` of the unchanged stack (a no-op)
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from lightkube import Client  # noqa: E402
from lightkube.config.kubeconfig import KubeConfig  # noqa: E402

from nvlfabric.sim.cluster import install_crd  # noqa: E402
from nvlfabric.testbed.controlplane import ControlPlane, Ports  # noqa: E402
from nvlfabric.testbed.pulumi_cli import project_from_fixture  # noqa: E402

PORTS = Ports(etcd_client=63790, etcd_peer=63800, apiserver=56444, scheduler=60259)
RESULTS = REPO / "bench" / "results" / "provider.json"
COUNT = 100


def say(msg: str) -> None:
    print(f"[bench provider {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def timed(proj: object, *args: str) -> float:
    t0 = time.monotonic()
    proj.run(*args, timeout=1800)  # type: ignore[attr-defined]
    return round(time.monotonic() - t0, 2)


def main() -> int:
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="nvlbp-", dir="/tmp") as tmp:
        cp = ControlPlane(state_dir=Path(tmp) / "sim", ports=PORTS, progress=lambda m: None)
        cp.up()
        try:
            client = Client(config=KubeConfig.from_file(str(cp.kubeconfig)))
            install_crd(client)
            proj = project_from_fixture(REPO / "bench" / "fixtures" / "cd100", Path(tmp) / "proj",
                                        kubeconfig=cp.kubeconfig, venv=Path(sys.prefix))
            proj.run("stack", "init", "bench")
            proj.run("config", "set", "count", str(COUNT))
            say(f"pulumi up: creating {COUNT} ComputeDomains")
            results["up_100_cds_s"] = timed(proj, "up", "--yes", "--skip-preview")
            deployed = proj.json("stack", "export")["deployment"]["resources"]  # type: ignore[attr-defined]
            cds = [r for r in deployed if r["type"].endswith(":ComputeDomain")]
            if len(cds) != COUNT:
                raise SystemExit(f"bench: expected {COUNT} ComputeDomains in the stack, found {len(cds)}")
            say(f"up {results['up_100_cds_s']}s ({len(cds)} ComputeDomains); previewing the unchanged stack")
            results["preview_100_cds_s"] = timed(proj, "preview")
            say(f"preview {results['preview_100_cds_s']}s; no-op up")
            results["noop_up_100_cds_s"] = timed(proj, "up", "--yes")
            say(f"no-op up {results['noop_up_100_cds_s']}s; destroying")
            proj.run("destroy", "--yes", "--skip-preview", timeout=1800)
        finally:
            cp.down()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    for k, v in results.items():
        print(f"{k:22} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
