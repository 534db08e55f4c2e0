"""Regenerates the gRPC stubs from dra.proto and registration.proto (needs grpcio-tools).

    python -m tessera.node.draplugin.generate
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    from grpc_tools import protoc  # type: ignore[import-untyped,unused-ignore]

    for name in ("dra", "registration", "health"):
        rc = protoc.main(["protoc", f"-I{HERE}", f"--python_out={HERE}", f"--pyi_out={HERE}",
                          f"--grpc_python_out={HERE}", str(HERE / f"{name}.proto")])
        if rc != 0:
            return int(rc)
        grpc_file = HERE / f"{name}_pb2_grpc.py"
        text = re.sub(rf"^import {name}_pb2 as {name}__pb2$",
                      f"from . import {name}_pb2 as {name}__pb2", grpc_file.read_text(), flags=re.M)
        grpc_file.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
