"""Every `tessera` command starts a Python process that imports the whole CLI: the CLI must not
pull in the scheduling cycle (core.cycle, about 130 ms of imports) or the servers, which only
the server process needs. A module the CLI shares with the API keeps such imports for type
checking only (api/fair_share_doc.py)."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("tessera.core.cycle", "tessera.local.control", "fastapi", "uvicorn", "tessera.kube")


def test_importing_the_cli_loads_no_scheduler_and_no_server() -> None:
    code = ("import sys, tessera.cli.main; "
            f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [], f"the CLI imports {out.stdout.strip()}"
