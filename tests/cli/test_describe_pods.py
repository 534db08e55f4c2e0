"""``tessera describe``'s pod lines, from pod documents as both backends write them: a share's
devices with request and limit, whole devices, a MIG pod's partition (Kubernetes' ``migPartition``),
an unbound pod."""

from __future__ import annotations

from tessera.cli.workload_commands import pod_lines

BASE = {"index": 0, "namespace": "team-a", "name": "w-0", "phase": "Running", "nodeName": "n1",
        "pid": None, "exitCode": None, "logPath": None, "exclusive": False, "gpuDevices": []}


def test_a_share_shows_its_device_request_and_limit() -> None:
    pod = {**BASE, "gpuDevices": [{"index": 1, "uuid": "GPU-a", "requestBytes": 5 * 2**30,
                                   "limitBytes": 8 * 2**30}]}
    assert pod_lines(pod) == ["Pod 0:       Running team-a/w-0 on n1",
                              "  GPU 1 GPU-a: request 5 GiB, limit 8 GiB"]


def test_whole_devices_and_an_unbound_pod() -> None:
    pod = {**BASE, "exclusive": True,
           "gpuDevices": [{"index": 0, "uuid": None, "requestBytes": 0, "limitBytes": 0}]}
    assert pod_lines(pod)[1] == "  GPU 0 (UUID chosen by the device plugin): whole device"
    assert pod_lines({**BASE, "nodeName": None, "phase": "Pending"}) == [
        "Pod 0:       Pending team-a/w-0 not bound"]


def test_a_mig_pod_shows_its_partition() -> None:
    pod = {**BASE, "migPartition": {"profile": "3g.20gb", "gpu": "GPU-m", "start": 4,
                                    "gpus": 0.429}}
    assert pod_lines(pod) == ["Pod 0:       Running team-a/w-0 on n1",
                              "  MIG 3g.20gb on GPU-m, slot 4"]
