"""tessera-node's functions under exactly the privileges the Helm chart gives its container
(issue 27, item 1): ``helm template`` renders the DaemonSet, tessera.testing.chart_privileges
runs each function under that capability set, user and no_new_privs (setpriv), against pod
processes that run as another user in their own PID namespace, as on a node. Each capability the
chart grants is shown needed (the same function fails without it) and the chart grants no other,
so removing one from the chart, or adding one, fails here. (Every tessera-node the kube tests
start runs under the same wrapper: tessera.testing.node_agents.)"""

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

from tessera.isolation.build import NativeBuild
from tessera.testing.chart_privileges import Privileges, chart_privileges
from tests.node.conftest import machine_env

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="setpriv and other users need root")

POD_UID = 4321
A100_40 = "NVIDIA A100-SXM4-40GB=40Gi"
GRANTED = {"chown", "fsetid", "kill", "sys_ptrace"}


@pytest.fixture(scope="module")
def chart() -> Privileges:
    return chart_privileges()


def run_as(priv: Privileges, code: str, env: dict[str, str] | None = None) -> dict[str, object]:
    """``code`` (which sets ``out``) in a fresh Python under ``priv``; returns ``out``."""
    program = "import json, os\nout = {}\n" + textwrap.dedent(code) + "\nprint(json.dumps(out))"
    done = subprocess.run(priv.wrap([sys.executable, "-c", program]), capture_output=True,
                          text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory other users can reach (pytest's tmp_path is root's alone)."""
    d = Path(tempfile.mkdtemp(prefix="tessera-privileges-"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        subprocess.run(["rm", "-rf", str(d)], check=False)


@pytest.fixture
def pod_process(shared_dir: Path) -> Iterator[tuple[int, int]]:
    """A pod's process: user POD_UID, PID 1 of its own PID namespace, holding an
    open-file-description lock on byte 64 of a file (as the library holds its ledger entry).
    Yields (its host pid, the file's inode)."""
    target = shared_dir / "ledger"
    target.write_bytes(b"\0" * 4096)
    target.chmod(0o666)
    holder = textwrap.dedent(f"""
        import fcntl, os, struct, sys, time
        fd = os.open({str(target)!r}, os.O_RDWR)
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi", fcntl.F_WRLCK, 0, 64, 1, 0))
        print(os.getpid(), flush=True)
        time.sleep(120)
    """)
    proc = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--kill-child", "setpriv", f"--reuid={POD_UID}",
         f"--regid={POD_UID}", "--clear-groups", sys.executable, "-c", holder],
        stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "1"  # PID 1 in its namespace
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        yield int(children[0]), target.stat().st_ino
    finally:
        proc.kill()
        proc.wait()


def test_the_chart_grants_exactly_the_capabilities_tested_here(chart: Privileges) -> None:
    assert chart.capabilities == GRANTED
    assert chart.uid == 0 and chart.no_new_privs
    assert chart_privileges("nodeAgent.manageMig=true").capabilities == GRANTED | {"sys_admin"}


SHARE = """
from pathlib import Path
from tessera.node.containers import Share, ShareDevice, region_path, write_share
share = Share(key="0123456789abcdef", namespace="ns", pod="p", uid="u", containers=("main",),
              devices=(ShareDevice("GPU-1", 2**30, 2**30),), group={gid})
try:
    write_share(Path({root!r}), share)
except Exception as exc:
    out["error"] = str(exc)
else:
    st = region_path(Path({root!r}), share.key).parent.stat()
    out["gid"], out["mode"] = st.st_gid, st.st_mode & 0o7777
"""


def test_share_files_get_the_pods_group_with_chown_and_fsetid(chart: Privileges,
                                                              shared_dir: Path) -> None:
    def code(root: str) -> str:  # each run on fresh directories
        return SHARE.format(gid=POD_UID, root=str(shared_dir / root))

    assert run_as(chart, code("chart")) == {"gid": POD_UID, "mode": 0o2770}
    assert "Operation not permitted" in str(run_as(chart.without("chown"), code("no-chown"))[
        "error"])
    # without FSETID the kernel silently drops the set-group-ID bit of a group it is not in
    assert run_as(chart.without("fsetid"), code("no-fsetid")) == {"gid": POD_UID, "mode": 0o770}


def test_reclaim_finds_a_pod_process_through_fdinfo_and_kills_it(
        chart: Privileges, pod_process: tuple[int, int]) -> None:
    host_pid, inode = pod_process
    find = f"""
    from types import SimpleNamespace
    from tessera.node.ledger import owner_pid
    out["pid"] = owner_pid(SimpleNamespace(inode={inode}), SimpleNamespace(offset=64, pid=1))
    """
    assert run_as(chart, find) == {"pid": host_pid}
    assert run_as(chart.without("sys_ptrace"), find) == {"pid": None}
    kill = f"""
    import signal
    try:
        os.kill({host_pid}, signal.SIGKILL)
        out["killed"] = True
    except PermissionError:
        out["killed"] = False
    """
    assert run_as(chart.without("kill"), kill) == {"killed": False}
    assert run_as(chart, kill) == {"killed": True}


def test_mig_partitions_need_the_charts_opt_in(native: NativeBuild, tmp_path: Path) -> None:
    env = machine_env(native, tmp_path / "gpu.state", devices=A100_40,
                      extra={"FAKE_GPU_MIG_0": "1"})
    create = [sys.executable, "-m", "tessera.node", "mig", "create", "0", "3g.20gb", "4",
              "--journal", str(tmp_path / "journal.json"), "--json"]
    refused = subprocess.run(chart_privileges().wrap(create), env=env, capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode != 0
    assert "Insufficient Permissions" in refused.stderr + refused.stdout, refused.stderr
    made = subprocess.run(chart_privileges("nodeAgent.manageMig=true").wrap(create), env=env,
                          capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["uuid"].startswith("MIG-")


def test_the_agent_is_given_libcuda_to_measure_the_headroom() -> None:
    """NVIDIA_DRIVER_CAPABILITIES must include compute (libcuda) beside utility (NVML): with
    utility alone the agent could not create a context and every node fell back to the model's
    default headroom (tessera.node.headroom)."""
    from tessera.testing.chart_privileges import agent_container
    from tessera.testing.webhook import helm_template

    env = {e["name"]: e.get("value") for e in agent_container(helm_template())["env"]}
    assert set(env["NVIDIA_DRIVER_CAPABILITIES"].split(",")) >= {"compute", "utility"}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
