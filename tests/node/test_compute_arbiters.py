"""tessera-node's compute arbiters (tessera.node.compute_arbiters): made under exactly the
privileges the Helm chart gives tessera-node, usable by a pod's process running as another user
and group, and out of the tenants' reach where it matters (they cannot create, replace or delete
an arbiter). The end-to-end check on the API server is tests/kube/node/test_compute_share_kube.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera.core.errors import InvalidRequest
from tessera.isolation import arbiter
from tessera.node.compute_arbiters import (
    ComputeArbiters,
    ComputeEntry,
    ComputeSetupError,
    arbiter_path,
    conf_text,
    entry_of,
)
from tessera.node.containers import Share, ShareDevice, config_dir, write_share
from tessera.testing.chart_privileges import chart_privileges

POD_UID = 4321
UUID = "GPU-11111111-2222-3333-4444-555555555555"
ANN = {"tessera.io/gpu-compute-request": "0.3", "tessera.io/gpu-compute-limit": "0.8",
       "tessera.io/gpu-compute-mode": "fair"}


@pytest.fixture
def ledger() -> Iterator[Path]:
    """The node's ledger directory as tessera-node prepares it (1777), reachable by other users."""
    d = Path(tempfile.mkdtemp(prefix="tessera-compute-"))
    d.chmod(0o755)
    (d / "loans").mkdir()
    (d / "loans").chmod(0o1777)
    try:
        yield d / "loans"
    finally:
        subprocess.run(["rm", "-rf", str(d)], check=False)


def test_entry_from_the_webhooks_annotations() -> None:
    e = entry_of("0123456789abcdef", [UUID], ANN, "inference")
    assert e == ComputeEntry("0123456789abcdef", (UUID,), 0.3, 0.8, latency=True)
    assert entry_of("k", [UUID], {}) is None
    assert entry_of("k", [UUID], {**ANN, "tessera.io/gpu-compute-mode": "off"}) is None
    with pytest.raises(InvalidRequest) as exc:
        entry_of("k", [UUID], {**ANN, "tessera.io/gpu-compute-limit": "0.1"})
    assert exc.value.field == "tessera.io/gpu-compute-limit"
    with pytest.raises(InvalidRequest):
        entry_of("k", [UUID], {**ANN, "tessera.io/gpu-compute-request": "2"})


def test_entries_are_written_kept_and_removed(ledger: Path) -> None:
    arbiters = ComputeArbiters(ledger)
    e = entry_of("0123456789abcdef", [UUID], ANN)
    assert e is not None
    text = arbiters.apply(e)
    assert text.splitlines()[1:] == [f"arbiter /run/tessera-loans/compute/{UUID}.share",
                                     "workload 0123456789abcdef"]
    (u,) = arbiter.usage(arbiter_path(ledger, UUID))
    assert (u.key, round(u.request, 3), round(u.limit, 3)) == ("0123456789abcdef", 0.3, 0.8)
    # A corrupt arbiter (its users refuse to launch) is made again, with the entries in it.
    arbiter_path(ledger, UUID).write_bytes(b"junk")
    arbiters.apply(e)
    assert [x.key for x in arbiter.usage(arbiter_path(ledger, UUID))] == ["0123456789abcdef"]
    assert arbiters.forget_gone([]) == ["0123456789abcdef"]
    assert arbiter.usage(arbiter_path(ledger, UUID)) == []
    with pytest.raises(ComputeSetupError, match="without a ledger directory"):
        ComputeArbiters(None).apply(e)


def test_the_conf_is_in_the_config_directory_when_it_appears(tmp_path: Path) -> None:
    """The kubelet starts the container once KEY/conf/CONTAINER exists; gpu-compute.conf must be
    in it from then on, or the first kernels would run ungated."""
    share = Share(key="0123456789abcdef", namespace="ns", pod="p", uid="u", containers=("main",),
                  devices=(ShareDevice(UUID, 2**30, 2**30),))
    e = ComputeEntry(share.key, (UUID,), 0.3, 0.3)
    write_share(tmp_path, share, extra={"gpu-compute.conf": conf_text(e)})
    d = config_dir(tmp_path, share.key, "main")
    assert sorted(p.name for p in d.iterdir()) == ["gpu-compute.conf", "gpu-isolation.conf"]
    assert (d / "gpu-compute.conf").read_text() == conf_text(e)


AGENT = """
from pathlib import Path
from tessera.node.compute_arbiters import ComputeArbiters, ComputeEntry, arbiter_path
a = ComputeArbiters(Path({ledger!r}))
try:
    a.apply(ComputeEntry("0123456789abcdef", ({uuid!r},), 0.3, 0.3))
except Exception as exc:
    out["error"] = str(exc)
p = arbiter_path(Path({ledger!r}), {uuid!r})
out["mode"] = oct(p.stat().st_mode & 0o7777)
out["dir"] = oct(p.parent.stat().st_mode & 0o7777)
"""

TENANT = """
import mmap
p = {path!r}
fd = os.open(p, os.O_RDWR)
m = mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
out["mapped"] = len(m)
for what, call in (("create", lambda: open(os.path.join(os.path.dirname(p), "x.share"), "w")),
                   ("unlink", lambda: os.unlink(p)),
                   ("replace", lambda: os.rename(p, p + ".old"))):
    try:
        call()
        out[what] = "done"
    except PermissionError:
        out[what] = "refused"
"""


def run(argv: list[str], code: str) -> dict[str, object]:
    program = "import json, os\nout = {}\n" + textwrap.dedent(code) + "\nprint(json.dumps(out))"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    done = subprocess.run([*argv, sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.skipif(os.geteuid() != 0, reason="setpriv and other users need root")
def test_the_charts_agent_makes_it_and_a_pods_user_maps_it_but_cannot_replace_it(ledger: Path) -> None:
    made = run(chart_privileges().wrap([]), AGENT.format(ledger=str(ledger), uuid=UUID))
    assert made == {"mode": "0o666", "dir": "0o755"}
    tenant = ["setpriv", f"--reuid={POD_UID}", f"--regid={POD_UID}", "--clear-groups", "--"]
    got = run(tenant, TENANT.format(path=str(arbiter_path(ledger, UUID))))
    assert got["mapped"] == os.path.getsize(arbiter_path(ledger, UUID))
    assert (got["create"], got["unlink"], got["replace"]) == ("refused", "refused", "refused")
