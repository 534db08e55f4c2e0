"""Every command block marked ```bash runnable in README.md and docs/*.md runs as written, as a
user would type it: the venv on PATH (as after `. .venv/bin/activate`), the repository root as
the working directory, a fresh config, data directory and port. Also: the docs agree with the
code on the default placement policy and on `tessera up`'s options."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```bash runnable\n(.*?)^```", re.MULTILINE | re.DOTALL)


def runnable_blocks() -> list[tuple[str, str]]:
    out = []
    for doc in DOCS:
        for i, m in enumerate(FENCE.finditer(doc.read_text())):
            out.append((f"{doc.relative_to(ROOT)}#{i + 1}", m.group(1)))
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_readme_quickstart_is_marked_runnable() -> None:
    names = [name for name, _ in runnable_blocks()]
    assert "README.md#1" in names
    assert any(n.startswith("docs/embedded.md#") for n in names)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "block"), runnable_blocks(), ids=lambda v: v if "#" in v else "")
def test_runnable_block(name: str, block: str, tmp_path: Path) -> None:
    venv_bin = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items()
           if k not in ("TESSERA_URL", "TESSERA_TOKEN", "TESSERA_PROJECT")}
    env.update({
        "PATH": f"{venv_bin}{os.pathsep}{env.get('PATH', '')}",
        "VIRTUAL_ENV": str(venv_bin.parent),
        "TESSERA_CONFIG": str(tmp_path / "config.json"),
        "TESSERA_DATA_DIR": str(tmp_path / "data"),
        "TESSERA_PORT": str(_free_port()),
    })
    try:
        r = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=240)
        assert r.returncode == 0, f"{name} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    finally:
        subprocess.run([str(venv_bin / "tessera"), "down", "--stop-workloads"], env=env,
                       capture_output=True, timeout=120)


def test_docs_name_the_default_policy_tessera_up_uses() -> None:
    import inspect

    from tessera.cli.main import up

    assert inspect.signature(up).parameters["policy"].default == "fgd"
    readme = (ROOT / "README.md").read_text()
    assert "`fgd` (fragmentation-aware, the default)" in readme


def test_docs_mention_no_option_tessera_up_lacks() -> None:
    from typer.testing import CliRunner

    from tessera.cli.main import cli

    help_text = CliRunner().invoke(cli, ["up", "--help"], terminal_width=200).output
    for doc in DOCS:
        for m in re.finditer(r"tessera up( [^`\n|]*)", doc.read_text()):
            for flag in re.findall(r"(--[a-z][a-z-]*)", m.group(1)):
                assert flag in help_text, f"{doc.name}: `tessera up {flag}` is not an option"


def test_no_doc_documents_the_removed_scheduler_option() -> None:
    for doc in DOCS:
        assert "--scheduler simple" not in doc.read_text(), doc.name
