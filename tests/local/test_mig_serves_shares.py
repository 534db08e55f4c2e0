"""Shares served by the smallest fitting MIG profile in embedded mode (docs/mig.md), end to
end: a real server on the fake NVML with an A100-40GB in MIG mode and a whole V100, the switch
``TESSERA_MIG_SERVES_SHARES`` (what ``tessera up --mig-serves-shares`` passes on). A share goes
to the V100 while it fits; one that does not is served by a partition of the smallest profile
that holds it; without the switch it waits."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera.isolation.build import NativeBuild, ensure_built
from tests.local.mig_server import HOLD, MigServer, env_of
from tests.waiting import wait_until


@pytest.fixture(scope="module")
def native() -> NativeBuild:
    return ensure_built()


@pytest.fixture
def serving(native: NativeBuild, tmp_path: Path) -> Iterator[MigServer]:
    s = MigServer(tmp_path, native, TESSERA_MIG_SERVES_SHARES="true")
    with s.serving("team-a"):
        yield s


def share(server: MigServer, name: str, *gpu: str, project: str = "team-a") -> None:
    r = server.cli("submit", name, "-p", project, *gpu, "--", *HOLD, check=False)
    assert r.returncode == 0, r.stderr


def test_shares_no_shared_gpu_holds_are_served_by_the_smallest_profile(
        serving: MigServer) -> None:
    with serving.http() as client:
        share(serving, "big", "-g", "0.8")  # the V100 first, as without MIG
        big = serving.wait_for(client, "big", "Running")
        assert "served by" not in big["phaseMessage"] and big["pods"][0]["gpuDevices"]
        # 0.25 no longer fits the V100: two of the A100's eight memory slots, 1g.10gb.
        share(serving, "quarter", "-g", "0.25")
        q = serving.wait_for(client, "quarter", "Running")
        assert "served by MIG 1g.10gb on GPU 0 (made at memory slot" in q["phaseMessage"], q
        uuid = env_of(q)["NVIDIA_VISIBLE_DEVICES"]
        assert uuid.startswith("MIG-") and env_of(q)["CUDA_VISIBLE_DEVICES"] == uuid
        # Counted as the profile it holds (1/7), like a workload that asked for 1g.10gb.
        assert q["gpus"]["allocated"] == 0.143
        # Memory in Kubernetes units: 5G (4768 MiB) fits 1g.5gb (4864 MiB), 5Gi does not.
        share(serving, "m5g", "--gpu-memory", "5G")
        share(serving, "m5gi", "--gpu-memory", "5Gi")
        assert "served by MIG 1g.5gb" in serving.wait_for(client, "m5g", "Running")["phaseMessage"]
        assert "served by MIG 1g.10gb" in serving.wait_for(client, "m5gi",
                                                          "Running")["phaseMessage"]
        assert sorted(p["profile"] for p in serving.partitions()) == [
            "1g.10gb", "1g.10gb", "1g.5gb"]
        # The quarter ends: its 1g.10gb stays idle and the next quarter reuses it.
        serving.cli("delete", "quarter", "-p", "team-a")
        share(serving, "quarter2", "-g", "0.25")
        q2 = serving.wait_for(client, "quarter2", "Running")
        assert "served by MIG 1g.10gb on GPU 0 (an idle partition reused)" in q2["phaseMessage"]
        assert env_of(q2)["NVIDIA_VISIBLE_DEVICES"] == uuid
        for name in ("quarter2", "m5g", "m5gi"):
            serving.cli("delete", name, "-p", "team-a")
        # Larger than the V100 could ever hold: taken at submission, served by 3g.20gb.
        share(serving, "m18", "--gpu-memory", "18Gi")
        m18 = serving.wait_for(client, "m18", "Running")
        assert "served by MIG 3g.20gb on GPU 0" in m18["phaseMessage"], m18
        assert m18["gpus"]["allocated"] == 0.429
        # No profile has room for 0.75 (7g.40gb) while m18 runs: it waits with both reasons.
        share(serving, "most", "-g", "0.75")
        most = serving.wait_for(client, "most", "Pending", "nor on a MIG GPU")
        assert "; nor on a MIG GPU: no MIG profile that holds 0.75 GPU has room on this " \
               "machine's MIG GPUs (GPU 0 A100-40GB:" in most["phaseMessage"], most
        assert any(p["profile"] == "3g.20gb" for p in serving.partitions())


def test_without_the_switch_shares_wait_for_a_shared_gpu(native: NativeBuild,
                                                         tmp_path: Path) -> None:
    s = MigServer(tmp_path, native)
    with s.serving("team-a"), s.http() as client:
        share(s, "big", "-g", "0.8")
        s.wait_for(client, "big", "Running")
        share(s, "quarter", "-g", "0.25")
        q = s.wait_for(client, "quarter", "Pending", "free")
        assert "MIG" not in q["phaseMessage"]
        assert s.partitions() == []
        r = s.cli("submit", "m20", "-p", "team-a", "--gpu-memory", "18Gi", "--", *HOLD,
                  check=False)
        assert r.returncode != 0 and "is larger than every GPU in the cluster" in r.stderr


def test_a_bad_switch_value_is_refused_naming_it(tmp_path: Path) -> None:
    env = {**os.environ, "TESSERA_MIG_SERVES_SHARES": "maybe"}
    r = subprocess.run([sys.executable, "-m", "tessera.local.server", "--data-dir",
                        str(tmp_path / "data"), "--simulate", "1xV100-16GB"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert ("TESSERA_MIG_SERVES_SHARES: must be true or false (whether this node's GPUs in MIG "
            "mode may serve shares by the smallest fitting profile) (got 'maybe')") in r.stderr


def test_a_served_share_is_counted_by_the_cycle_as_its_profile(serving: MigServer) -> None:
    """The cycle decides a served share (asked as its profile from the cycle after it waited
    for room): the project's limit counts the profile, and the wait is the cycle's own."""
    with serving.http() as client:
        share(serving, "whole", "-g", "1")  # the V100: no shared room for the rest
        serving.wait_for(client, "whole", "Running")
        serving.cli("project", "create", "small", "--gpu", "0.28", "--limit", "0.28")
        share(serving, "q1", "-g", "0.25", project="small")
        q1 = serving.wait_for(client, "q1", "Running")
        assert "served by MIG 1g.10gb" in q1["phaseMessage"] and q1["gpus"]["allocated"] == 0.143
        # 0.13 as a share would fit the limit (0.143 + 0.13 = 0.273), as its 1g.10gb it does
        # not (0.286): the cycle keeps it waiting for the limit, counting the profile.
        share(serving, "q2", "-g", "0.13", project="small")
        q2 = wait_until("q2 waiting for its project's limit", lambda: next(
            (w for w in [serving.workload(client, "q2")] if "limit" in w["phaseMessage"]), None))
        assert q2["phase"] == "Pending" and q2["phaseMessage"] == ("project small is at its limit of 0.28 GPU: 0.14 in use, "
                                      "this needs 0.14 more"), q2
