"""Regenerate the *_pb2 / *_pb2_grpc modules from the .proto files beside this file."""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc

HERE = Path(__file__).resolve().parent
#: The directory that holds the `nvlfabric` package: protos are named from there, so the generated
#: modules import each other as `nvlfabric.api.kubelet.*`.
ROOT = HERE.parents[2]
PACKAGE = HERE.relative_to(ROOT)
PROTOS = sorted(HERE.glob("*.proto"))


def generate(out_root: Path) -> None:
    """Write the generated modules under out_root/nvlfabric/api/kubelet/ (out_root = the repository root)."""
    (out_root / PACKAGE).mkdir(parents=True, exist_ok=True)
    include = str(Path(protoc.__file__).parent / "_proto")
    for proto in PROTOS:
        rel = f"{PACKAGE}/{proto.name}"
        rc = protoc.main(["protoc", f"-I{ROOT}", f"-I{include}", f"--python_out={out_root}",
                          f"--pyi_out={out_root}", f"--grpc_python_out={out_root}", rel])
        if rc != 0:
            raise SystemExit(f"protoc failed on {rel}")


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
