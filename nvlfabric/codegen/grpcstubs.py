"""Regenerate the *_pb2 / *_pb2_grpc modules from the .proto files of nvlfabric's gRPC contracts:
the kubelet's plugin APIs (nvlfabric/api/kubelet) and the CRI the simulator's runtime stand-in
serves (nvlfabric/sim/cri). `make generate` runs it."""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc

#: The directory that holds the `nvlfabric` package: protos are named from there, so the generated
#: modules import each other as `nvlfabric.api.kubelet.*`.
ROOT = Path(__file__).resolve().parents[2]
#: Every directory of .proto files, relative to ROOT.
PACKAGES = [Path("nvlfabric/api/kubelet"), Path("nvlfabric/sim/cri")]


def generate(out_root: Path) -> None:
    """Write the generated modules under out_root/<package>/ (out_root = the repository root)."""
    include = str(Path(protoc.__file__).parent / "_proto")
    for package in PACKAGES:
        (out_root / package).mkdir(parents=True, exist_ok=True)
        for proto in sorted((ROOT / package).glob("*.proto")):
            rel = f"{package}/{proto.name}"
            rc = protoc.main(["protoc", f"-I{ROOT}", f"-I{include}", f"--python_out={out_root}",
                              f"--pyi_out={out_root}", f"--grpc_python_out={out_root}", rel])
            if rc != 0:
                raise SystemExit(f"protoc failed on {rel}")


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
