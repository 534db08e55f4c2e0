"""Issue 34 item 1: the numbers and the request text wherever MIG, fractions and gangs meet, on a
real embedded server over the fake driver's NVML (an A100-40GB in MIG mode and a V100-16GB, as
tests/local/test_mig_embedded.py): the GPU total counts the MIG GPU (the Overview, fair share and
``tessera_cluster_gpus``), allocations add up to what the workloads hold, and the API document,
``list``, ``describe`` and the Submitted event all carry tessera.core.request_text's words."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tessera.isolation.build import ensure_built
from tests.local.mig_server import MigServer
from tests.node.fake_mig import nvml


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MigServer]:
    s = MigServer(tmp_path_factory.mktemp("numbers"), ensure_built())
    with s.serving("team-a", gpu="2"):
        s.submit("mig3g", "--gpu-mig-profile", "3g.20gb")
        s.submit("dyn", "--gpu-portion-request", "0.25", "--gpu-portion-limit", "0.8")
        s.submit("sweep", "-g", "0.1", "--workers", "3")
        s.submit("mem5g", "--gpu-memory", "5G")
        s.cli("project", "create", "team-b", "--gpu", "0")
        s.submit("whole", "-g", "1", project="team-b")  # waits: no idle GPU; asks for 1
        client = httpx.Client(base_url=s.url, headers={"Authorization": f"Bearer {s.token()}"},
                              timeout=30)
        for name in ("mig3g", "dyn", "sweep", "mem5g"):
            s.wait_for(client, name, "Running")
        yield s


@pytest.fixture
def client(server: MigServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.token()}"},
                      timeout=30) as c:
        yield c


def gpus_on_the_machine(server: MigServer) -> int:
    """The machine's GPUs as NVML itself counts them (the fake driver's bindings, read by another
    process), MIG or not."""
    return int(nvml(server.machine_env(), "out = nv.nvmlDeviceGetCount()"))


def test_the_gpu_total_counts_the_mig_gpu(server: MigServer, client: httpx.Client) -> None:
    machine = gpus_on_the_machine(server)
    assert machine == 2
    overview = client.get("/api/v1/overview").json()
    docs = client.get("/api/v1/workloads").json()["workloads"]
    held = sum(w["gpus"]["allocated"] for w in docs)
    mig = next(w for w in docs if w["name"] == "mig3g")["gpus"]["allocated"]
    assert mig == pytest.approx(3 / 7, abs=1e-3)  # 3g.20gb: 3 of an A100's 7 compute slices
    assert overview["gpus"]["total"] == machine
    assert overview["gpus"]["allocated"] == pytest.approx(held, abs=1e-3)
    assert overview["gpus"]["free"] == pytest.approx(machine - held, abs=1e-3)
    # fair share divides every GPU: team-a (deserving 2) gets what it asks, team-b the rest
    fair = {p["name"]: p for p in overview["projects"]}
    assert fair["team-a"]["fairShare"] == pytest.approx(fair["team-a"]["requested"], abs=1e-3)
    assert fair["team-b"]["requested"] == 1
    assert fair["team-b"]["fairShare"] == pytest.approx(
        machine - fair["team-a"]["requested"], abs=1e-3)
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    value = {(s.name, tuple(sorted(s.labels.items()))): s.value
             for f in text_string_to_metric_families(text) for s in f.samples}
    assert value[("tessera_cluster_gpus", ())] == machine
    assert value[("tessera_cluster_gpus_allocated", ())] == pytest.approx(held, abs=1e-3)


def test_every_view_says_what_was_asked(server: MigServer, client: httpx.Client) -> None:
    expected = {
        "mig3g": "MIG 3g.20gb",
        "dyn": "0.25 GPU, bursting to 0.8",
        "sweep": "3 × 0.1 GPU",
        "mem5g": "5G (4.66 GiB) of GPU memory",
    }
    listing = server.cli("list", "-p", "team-a").stdout
    assert "REQUEST" in listing.splitlines()[1]
    for name, text in expected.items():
        w: dict[str, Any] = server.workload(client, name)
        assert w["gpus"]["request"] == text
        brief = client.get("/api/v1/workloads", params={"search": name}).json()["workloads"]
        assert [b["gpus"]["request"] for b in brief if b["name"] == name] == [text]
        row = next(line for line in listing.splitlines() if line.startswith(f"{name} "))
        assert text in row, row
        described = server.cli("describe", name, "-p", "team-a").stdout
        assert f"Request:     {text} " in described, described
        [submitted] = [e for e in w["events"] if e["kind"] == "Submitted"]
        assert submitted["message"] == f"submitted to project team-a: {text}"
    mig = server.workload(client, "mig3g")
    [pod] = mig["pods"]
    assert pod["gpuPlacement"] == "MIG 3g.20gb on GPU 0, slot 0"
    assert "MIG 3g.20gb on GPU 0, slot 0" in server.cli("describe", "mig3g", "-p", "team-a").stdout
    dyn = server.workload(client, "dyn")
    assert dyn["pods"][0]["gpuPlacement"].startswith("GPU ")
    assert "(limit " in dyn["pods"][0]["gpuPlacement"]

