"""`python -m nvlfabric.sim.kubelet`: run the simulated kubelets of a simulator's nodes in this process.

`nvlfabric-sim up --racks N` starts this as one background process; tests may run it directly.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from pathlib import Path

from lightkube import AsyncClient
from lightkube.config.kubeconfig import KubeConfig
from lightkube.models.authentication_v1 import BoundObjectReference, TokenRequestSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Pod, ServiceAccount

from nvlfabric.sim import hardware
from nvlfabric.sim.images import ImageProgram
from nvlfabric.sim.kubelet.kubelet import KubeletConfig, SimKubelet
from nvlfabric.sim.kubelet.leaseclient import LeaseClient, connections_for
from nvlfabric.sim.nodes import NODES_PER_RACK, rack_nodes
from nvlfabric.sim.podnetwork import PodNetwork


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m nvlfabric.sim.kubelet", description=__doc__)
    ap.add_argument("--state-dir", type=Path, required=True)
    ap.add_argument("--kubeconfig", type=Path, required=True)
    ap.add_argument("--racks", type=int, default=1)
    ap.add_argument("--nodes-per-rack", type=int, default=NODES_PER_RACK)
    ap.add_argument("--first-rack", type=int, default=0, help="number of the first rack (names, addresses)")
    ap.add_argument("--hollow-racks", type=int, default=0,
                    help="the last N racks are hollow: their DaemonSets' pods run nothing "
                         "(nvlfabric/sim/kubelet/hollow.py)")
    ap.add_argument("--images", default="{}", help='JSON: image (no tag) → its ENTRYPOINT (a list), or '
                                                   '{"entrypoint": [...], "cmd": [...], "files": {...}}: run as a '
                                                   'local process (nvlfabric/sim/images.py)')
    ap.add_argument("--pki-dir", type=Path, default=None,
                    help="the cluster CA's directory (ca.crt, ca.key): serve each node's kubelet API (kubectl logs)")
    ap.add_argument("--exclude", action="append", default=[], metavar="NODE",
                    help="a node of the racks this process does not run (a real kubelet does); repeatable")
    ap.add_argument("--pod-network", type=int, default=None, metavar="J",
                    help="pods that are not hostNetwork get a network namespace on pod network J "
                         "(nvlfabric/sim/podnetwork.py); without it every pod shares its node's network")
    ap.add_argument("--gpus-by-dra", action="store_true",
                    help="the nodes advertise no device plugin's nvidia.com/gpu: their agents publish the GPUs as "
                         "DRA devices (NvlfabricDriver gpu_devices='DRA')")
    ap.add_argument("--log-level", default="INFO")
    return ap


async def run(args: argparse.Namespace) -> None:
    config = KubeConfig.from_file(str(args.kubeconfig))
    client = AsyncClient(config=config, field_manager="nvlfabric-sim-kubelet")
    context = config.get()
    assert context is not None, f"{args.kubeconfig} has no current context"
    server = context.cluster.server

    async def token_for(namespace: str, service_account: str, pod_name: str) -> str:
        # A token bound to the pod, so it carries the node-name claim a real projected token has.
        pod = await client.get(Pod, pod_name, namespace=namespace)
        assert pod.metadata is not None
        req = ServiceAccount.Token(metadata=ObjectMeta(name=service_account, namespace=namespace),
                                   spec=TokenRequestSpec(
            audiences=[], expirationSeconds=3600,
            boundObjectRef=BoundObjectReference(kind="Pod", apiVersion="v1", name=pod_name, uid=pod.metadata.uid)))
        resp = await client.create(req, service_account, namespace=namespace)
        assert resp.status is not None
        return str(resp.status.token)

    nodes = [n for n in rack_nodes(args.state_dir, args.racks, args.nodes_per_rack, first_rack=args.first_rack,
                                   hollow_racks=args.hollow_racks) if n.name not in args.exclude]
    kubelet = SimKubelet(
        client, nodes,
        KubeletConfig(images={k: ImageProgram(entrypoint=v) if isinstance(v, list) else ImageProgram.model_validate(v)
                              for k, v in json.loads(args.images).items()}, api_server=server,
                      pki_dir=args.pki_dir, dra_gpus=args.gpus_by_dra,
                      pod_network=PodNetwork(args.pod_network) if args.pod_network is not None else None,
                      hardware_env={n.name: hardware.node_env(args.state_dir, n) for n in nodes if not n.hollow}),
        token_requester=token_for,
        leases=LeaseClient.from_config(config, connections=connections_for(len(nodes))))
    await kubelet.start()
    logging.getLogger("nvlfabric.sim.kubelet").info("simulated kubelets ready: %d nodes", len(kubelet.nodes))
    print("ready", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await kubelet.stop()
    await client.close()
    await kubelet.leases.close()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpx2", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    asyncio.run(run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
