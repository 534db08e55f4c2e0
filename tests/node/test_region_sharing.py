"""A pod's region is shared by every UID of the pod and by nobody else (issue #12 item 3).

tessera-node writes the region directory 2770 and the region file 0660, owned by root (the agent)
and the group every process of the share container runs with (tessera.core.podgroups). Real
CUDA processes (cuprobe on the fake driver, the library preloaded) run under other UIDs with
``setpriv``, as a container runtime starts them: two UIDs of the pod's group share one budget; a
UID outside the group cannot open the region and fails closed.

The library, the fake driver and cuprobe are copied to a directory every UID can read (the build
cache is under /root)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera.isolation.build import NativeBuild
from tessera.node.containers import (
    REGION_DIR_MODE,
    REGION_FILE_MODE,
    Share,
    ShareDevice,
    config_dir,
    region_path,
    write_share,
)
from tests.isolation.conftest import GiB, Probe, fake_uuids
from tests.node.conftest import H100

POD_GROUP = 61000
KEY = "0123456789abcdef"
MiB = 2**20

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="running processes as other UIDs needs root "
                                "(the test sandbox and CI run as root)")


def share(group: int | None, uuid: str = "GPU-x") -> Share:
    return Share(key=KEY, namespace="team-a", pod="train", uid="pod-uid", containers=("main",),
                 devices=(ShareDevice(uuid, 8 * GiB, 8 * GiB),), group=group)


def mode_of(path: Path) -> tuple[int, int, int]:
    st = path.stat()
    return stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid


def test_region_is_the_pods_group_not_world_writable(tmp_path: Path) -> None:
    write_share(tmp_path, share(POD_GROUP))
    region = region_path(tmp_path, KEY)
    assert mode_of(region.parent) == (REGION_DIR_MODE, os.geteuid(), POD_GROUP) == (0o2770, os.geteuid(),
                                                                                    POD_GROUP)
    assert mode_of(region) == (REGION_FILE_MODE, os.geteuid(), POD_GROUP) == (0o660, os.geteuid(), POD_GROUP)


def test_an_older_world_writable_region_is_tightened(tmp_path: Path) -> None:
    """What tessera-node wrote before (0777 directory, 0666 file) is brought to the new modes
    when the share is written again; the file (and what running processes mapped) is kept."""
    region = region_path(tmp_path, KEY)
    region.parent.mkdir(parents=True)
    os.chmod(region.parent, 0o777)
    region.write_bytes(b"kept")
    os.chmod(region, 0o666)
    write_share(tmp_path, share(POD_GROUP))
    assert mode_of(region.parent)[::2] == (0o2770, POD_GROUP)
    assert mode_of(region)[::2] == (0o660, POD_GROUP)
    assert region.read_bytes() == b"kept"


def test_without_a_group_the_region_is_roots_alone_or_the_writers(tmp_path: Path) -> None:
    """A pod stating no group (one the webhook did not mutate) gets a region only root can open:
    its non-root processes fail closed rather than share a world-writable file. Processes on this
    host (host_paths: embedded mode, tests) run as the writer: its group."""
    write_share(tmp_path / "kube", share(None))
    assert mode_of(region_path(tmp_path / "kube", KEY))[::2] == (0o660, 0)
    write_share(tmp_path / "host", share(None), host_paths=True)
    assert mode_of(region_path(tmp_path / "host", KEY))[::2] == (0o660, os.getegid())


@pytest.fixture
def world_readable(native: NativeBuild) -> Iterator[Path]:
    """The library, the fake driver and cuprobe where any UID can read and run them."""
    base = Path(tempfile.mkdtemp(prefix="tessera-region-share-"))
    os.chmod(base, 0o755)
    (base / "fake").mkdir(mode=0o755)
    shutil.copy(native.library, base / "libtessera-cuda.so")
    shutil.copy(native.program("cuprobe"), base / "cuprobe")
    for name in ("libcuda.so.1", "libnvidia-ml.so.1"):
        shutil.copy(Path(native.fake_dir) / name, base / "fake" / name)
    for p in base.rglob("*"):
        os.chmod(p, 0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def as_user(base: Path, config: Path, uid: int, gid: int, groups: list[int],
            probes: list[Probe]) -> Probe:
    """cuprobe under (uid, gid, groups), the pod's config named, the library preloaded."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LD_LIBRARY_PATH": str(base / "fake"),
           "LD_PRELOAD": str(base / "libtessera-cuda.so"), "FAKE_GPU_DEVICES": H100,
           "TESSERA_GPU_CONFIG": str(config)}
    group_args = ["--groups", ",".join(map(str, groups))] if groups else ["--clear-groups"]
    p = Probe.__new__(Probe)
    p.proc = subprocess.Popen(
        ["setpriv", f"--reuid={uid}", f"--regid={gid}", *group_args, str(base / "cuprobe"), "dlsym"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        bufsize=1)
    probes.append(p)
    return p


@needs_root
def test_two_uids_of_the_pods_group_share_one_budget_others_cannot_open_it(
        native: NativeBuild, world_readable: Path, gpu_procs: list[Probe]) -> None:
    base = world_readable
    root = base / "containers"
    root.mkdir(mode=0o755)
    uuid = fake_uuids(native, H100)[0]
    write_share(root, share(POD_GROUP, uuid), 1 * MiB, host_paths=True)
    config = config_dir(root, KEY, "main") / "gpu-isolation.conf"
    for d in (root, root / KEY):
        os.chmod(d, 0o755)  # the host path down to the mounts; a pod sees only the mounts

    a = as_user(base, config, 1001, 1001, [POD_GROUP], gpu_procs).start()
    b = as_user(base, config, 1002, 1002, [POD_GROUP], gpu_procs).start()
    assert a(f"alloc {5 * GiB}")["rc"] == 0
    assert b(f"alloc {4 * GiB}")["rc"] != 0  # 5 GiB of the other UID + 4 GiB > 8 GiB
    assert b(f"alloc {2 * GiB}")["rc"] == 0
    free, total = b.info()
    assert total == 8 * GiB and free == 8 * GiB - 7 * GiB - 2 * MiB  # one budget, two contexts

    outsider = as_user(base, config, 3000, 3000, [], gpu_procs).start()
    assert outsider(f"alloc {1 * GiB}")["rc"] != 0  # fail closed
    err = outsider.stderr()
    assert "gpu-usage.region" in err and "Permission denied" in err and "fail closed" in err
