"""``python -m tessera.node`` (also ``tessera-node``): the node agent and its one-shot commands."""

from __future__ import annotations

import sys

from tessera.node.cli import main

if __name__ == "__main__":
    sys.exit(main())
