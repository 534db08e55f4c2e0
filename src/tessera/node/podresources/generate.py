"""Regenerates api_pb2.py / api_pb2_grpc.py from api.proto (needs grpcio-tools, a dev dependency).

    python -m tessera.node.podresources.generate
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    from grpc_tools import protoc  # type: ignore[import-untyped,unused-ignore]

    rc = protoc.main(["protoc", f"-I{HERE}", f"--python_out={HERE}", f"--pyi_out={HERE}",
                      f"--grpc_python_out={HERE}",
                      str(HERE / "api.proto")])
    if rc != 0:
        return int(rc)
    grpc_file = HERE / "api_pb2_grpc.py"
    # protoc writes a top-level import; the stubs live in this package.
    text = re.sub(r"^import api_pb2 as api__pb2$", "from . import api_pb2 as api__pb2",
                  grpc_file.read_text(), flags=re.M)
    grpc_file.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
