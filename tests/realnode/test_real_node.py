"""End to end on a real kubelet + containerd + runc node (see conftest.py): what kwok cannot show.

Each test's pods land on the real node by its label; kube-scheduler v1.36.3 allocates the DRA
claims against the ResourceSlice tessera-node published; the kubelet calls tessera-node's DRA
plugin; containerd applies the CDI spec it wrote; runc starts the container as a non-root user.
The container's own output (the kubelet's log files) is what the tests read."""

from __future__ import annotations

import contextlib
import json
import re
import time
import urllib.request
from typing import Any

from lightkube import ApiError, codecs
from lightkube.resources.core_v1 import Event, Node, Pod
from lightkube.types import PatchType

from tessera.core.mig import SERVES_SHARES
from tessera.kube import names
from tessera.kube.claims import ResourceClaim
from tessera.node.podresources.client import list_claim_devices
from tessera.node.resourceslice import ResourceSlice
from tessera.testing.node_images import PROBE_DIR, PROBE_IMAGE
from tessera.testing.realnode import NODE_NAME
from tessera.testing.realnode_agent import driver_env, driver_volumes
from tests.realnode.conftest import RealWorld, WebhookPath
from tests.waiting import wait_until

GIB = 2**30
POD_UID = 4321
CUDA_ERROR_OUT_OF_MEMORY = 2


def claim(name: str, ns: str, memory: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "share.gpu.tessera.io",
                "capacity": {"requests": {"memory": memory}}}}]}}}


def probe_pod(real: RealWorld, name: str, ns: str, claim_name: str, script: str) -> dict[str, Any]:
    """A pod of the probe image on the real node, as user 4321, using ``claim_name``; the
    container runs ``script`` (dash) with cuprobe at $PROBE and the test's go-file directory
    at /sync (a test touches ``go_file(real, name)`` to let the script go on)."""
    volumes, mounts = driver_volumes(real.agent)
    sync = real.agent.root / "sync"
    sync.mkdir(exist_ok=True)
    volumes = [*volumes, {"name": "sync", "hostPath": {"path": str(sync), "type": "Directory"}}]
    mounts = [*mounts, {"name": "sync", "mountPath": "/sync", "readOnly": True}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
            "spec": {"nodeSelector": {"tessera.io/real-node": "true"},
                     "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                     "securityContext": {"runAsUser": POD_UID, "runAsGroup": POD_UID},
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
                     "volumes": volumes,
                     "containers": [{
                         "name": "main", "image": PROBE_IMAGE, "imagePullPolicy": "Never",
                         "command": ["/bin/sh", "-c", script],
                         "env": [*driver_env(real.agent),
                                 {"name": "PROBE", "value": f"{PROBE_DIR}/cuprobe"}],
                         "volumeMounts": mounts,
                         "resources": {"claims": [{"name": "gpu"}]}}]}}


def phase(real: RealWorld, name: str, ns: str = "default") -> str:
    assert real.scheduler.poll() is None, "kube-scheduler exited"
    real.agent.process.check_alive()
    p = real.cluster.client().get(Pod, name, namespace=ns)
    return (p.status.phase if p.status else None) or "Pending"


def finished(real: RealWorld, name: str, timeout: float = 120.0) -> str:
    def done() -> str | None:
        ph = phase(real, name)
        return ph if ph in ("Succeeded", "Failed") else None
    try:
        return wait_until(f"pod {name} to finish on the real node", done, timeout)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{diagnose(real, name)}") from None


def diagnose(real: RealWorld, name: str, ns: str = "default") -> str:
    client = real.cluster.client()
    events = [f"{e.reason}: {e.message}" for e in client.list(Event, namespace=ns)
              if e.involvedObject.name == name]
    return (f"events of {name}: {events}\nlog: {real.node.pod_log(ns, name, 'main')}\n"
            f"kubelet log tail:\n{real.node.world.log_tail(25) if real.node.world else ''}")


def test_real_node_is_ready_next_to_the_kwok_nodes(real: RealWorld) -> None:
    """The real kubelet registered its Node (kubelet v1.36.3, containerd 2.x) and it is Ready,
    next to a kwok node of the same cluster."""
    client = real.cluster.client()
    node = client.get(Node, NODE_NAME)
    info = node.status.nodeInfo
    assert info.kubeletVersion == "v1.36.3"
    assert info.containerRuntimeVersion.startswith("containerd://2."), info
    assert {a.type: a.address for a in node.status.addresses}["InternalIP"] == real.node.ip
    kwok = client.get(Node, real.kwok_node)
    assert {c.type: c.status for c in kwok.status.conditions}["Ready"] == "True"


def test_real_node_runs_a_share_pod_non_root_with_the_library_and_its_limit(
        real: RealWorld) -> None:
    """A 4 GiB share of an A100-40GB through a DRA claim: kube-scheduler allocates it on the
    real node, the kubelet has tessera-node prepare it, containerd applies the CDI spec (the
    library preloaded, its config mounted), runc starts the container as uid 4321. Inside, the
    CUDA allocator is the library's, 3 GiB fit and one more GiB past the share fails with
    CUDA_ERROR_OUT_OF_MEMORY, and the config names the share's limit."""
    client = real.cluster.client()
    ns = "default"
    client.create(codecs.from_dict(claim("quarter", ns, "4Gi")))
    script = ("cat /proc/self/status; echo preload=$LD_PRELOAD; "
              "echo config=$TESSERA_GPU_CONFIG; cat $TESSERA_GPU_CONFIG; "
              f"printf 'owner_alloc\\ninit\\nctx 0\\nalloc {3 * GIB}\\nalloc {GIB}\\nexit\\n' "
              "| $PROBE")
    client.create(codecs.from_dict(probe_pod(real, "share", ns, "quarter", script)))
    result = finished(real, "share")
    log = real.node.pod_log(ns, "share", "main")
    assert result == "Succeeded", diagnose(real, "share")
    assert re.search(rf"^Uid:\s+{POD_UID}\s", log, re.M), log
    assert "preload=/usr/local/tessera/libtessera-cuda.so" in log, log
    assert "owner=libtessera-cuda.so" in log, log  # cuMemAlloc resolves to the library's
    assert f"limit={4 * GIB}" in log, log
    rcs = [int(m) for m in re.findall(r"^rc=(\d+) ptr=", log, re.M)]
    assert rcs == [0, CUDA_ERROR_OUT_OF_MEMORY], log
    c = client.get(ResourceClaim, "quarter", namespace=ns).to_dict()
    (r,) = c["status"]["allocation"]["devices"]["results"]
    assert (r["driver"], r["pool"]) == ("gpu.tessera.io", NODE_NAME)


def test_real_node_pod_resources_carry_the_dra_devices(real: RealWorld) -> None:
    """pod-resources read from the real kubelet: the running DRA pod's container lists its
    claim, driver, pool, device and CDI device (``dynamic_resources``, which the proto used to
    drop)."""
    client = real.cluster.client()
    ns = "default"
    client.create(codecs.from_dict(claim("held", ns, "2Gi")))
    client.create(codecs.from_dict(probe_pod(real, "holder", ns, "held", "sleep 600")))
    wait_until("holder running", lambda: phase(real, "holder") == "Running", 120)
    c = client.get(ResourceClaim, "held", namespace=ns).to_dict()
    (r,) = c["status"]["allocation"]["devices"]["results"]

    def listed() -> Any:
        return [d for d in list_claim_devices(real.node.pod_resources_socket)
                if d.pod == "holder"] or None
    (d,) = wait_until("the kubelet's pod-resources lists the claim", listed, 30)
    assert (d.namespace, d.container, d.claim, d.claim_namespace) == (ns, "main", "held", ns)
    assert (d.driver, d.pool, d.device) == ("gpu.tessera.io", NODE_NAME, r["device"])
    assert d.cdi_devices == (f"gpu.tessera.io/claim={c['metadata']['uid']}-{r['device']}",)

    def metrics() -> str | None:  # the claim's container has its per-container metrics
        text = urllib.request.urlopen(
            f"http://127.0.0.1:{real.agent.port}/metrics", timeout=5).read().decode()
        lines = [ln for ln in text.splitlines()
                 if ln.startswith("tessera_container_gpu_memory_limit_bytes")
                 and 'pod="holder"' in ln and 'container="main"' in ln]
        return lines[0] if lines else None
    line = wait_until("tessera-node's metrics for the claim's container", metrics, 30)
    assert float(line.rsplit(" ", 1)[1]) == 2 * GIB, line
    client.delete(Pod, "holder", namespace=ns, grace_period=0)


def test_real_node_kubelet_watches_resource_health_without_unimplemented(
        real: RealWorld) -> None:
    """NodeWatchResources is served: the real kubelet's resource-health stream to tessera's
    plugin starts, and never fails with Unimplemented (it did every 5 s before), over more
    than two of its retry periods."""
    wait_until("the kubelet's health stream to gpu.tessera.io",
               lambda: "Successfully started WatchResources health stream"
               in real.node.kubelet_log_text(), 60)
    time.sleep(12)
    bad = [line for line in real.node.kubelet_log_text().splitlines()
           if "WatchResources" in line and ("Unimplemented" in line or "Error receiving" in line)]
    assert not bad, bad[:3]


def test_real_node_slice_is_published_only_after_the_kubelet_registered_the_plugin(
        real: RealWorld) -> None:
    """tessera-node restarted with its ResourceSlice gone: the slice reappears only once the
    real kubelet has registered the new plugin, so a pod created the moment it appears is
    prepared at once (before the fix it got FailedPrepareDynamicResources "not registered"
    and waited 83 s in the kubelet's back-off)."""
    client = real.cluster.client()
    ns = "default"
    agent = real.agent
    agent.process.stop()
    for s in client.list(ResourceSlice):
        if s.to_dict()["spec"].get("nodeName") == NODE_NAME:
            client.delete(ResourceSlice, s.to_dict()["metadata"]["name"])
    line = "the kubelet registered DRA plugin gpu.tessera.io"
    registrations_before = agent.process.log_path.read_text(errors="replace").count(line)
    agent.process.start(env=agent.env)

    def slice_up() -> bool:
        return any(s.to_dict()["spec"].get("nodeName") == NODE_NAME
                   for s in client.list(ResourceSlice))
    wait_until("tessera-node's slice is published again", slice_up, 60, interval=0.05)
    registered = agent.process.log_path.read_text(errors="replace").count(line)
    assert registered > registrations_before, "slice published before the kubelet registered"
    client.create(codecs.from_dict(claim("early", ns, "1Gi")))
    client.create(codecs.from_dict(probe_pod(real, "early", ns, "early", "echo started")))
    assert finished(real, "early") == "Succeeded", diagnose(real, "early")
    reasons = [e.reason for e in client.list(Event, namespace=ns)
               if e.involvedObject.name == "early"]
    assert "FailedPrepareDynamicResources" not in reasons, diagnose(real, "early")


def test_real_node_teardown_leaves_no_pod(real: RealWorld) -> None:
    """Deleting pods on the real node really stops their containers (the kubelet reports them
    gone), which the tier's teardown relies on."""
    client = real.cluster.client()
    ns = "default"
    client.create(codecs.from_dict(claim("gone", ns, "1Gi")))
    client.create(codecs.from_dict(probe_pod(real, "gone", ns, "gone", "sleep 600")))
    wait_until("gone running", lambda: phase(real, "gone") == "Running", 120)
    client.delete(Pod, "gone", namespace=ns, grace_period=0)

    def deleted() -> bool:
        try:
            client.get(Pod, "gone", namespace=ns)
            return False
        except ApiError:
            return True
    wait_until("pod gone", deleted, 60)


def test_real_node_driver_cap_holds_an_allocation_the_library_does_not_see(
        real: RealWorld) -> None:
    """On a driver of branch r615+ tessera-node also sets NVML's per-cgroup hard limit on the
    share pod's cgroup (the DriverLimits sync step): an allocation that bypasses the library
    (the fake driver's unhooked entry point, as a process that escaped the preload would make)
    is refused by the driver once the pod's share is used, where on older drivers only the
    library's accounting stands (tests/node/test_memlimits.py). The 256 MiB it did get past the
    library is an escape on a DRA claim's container: tessera-node's escape detection reports it
    (a GPUIsolationEscape Event on the pod)."""
    client = real.cluster.client()
    ns = "default"
    client.create(codecs.from_dict(claim("capped", ns, "4Gi")))
    script = ("while [ ! -e /sync/capped ]; do sleep 0.2; done; "
              f"(printf 'init\\nctx 0\\nalloc {3 * GIB}\\nunhooked {2 * GIB}\\n"
              f"unhooked {256 * 2**20}\\n'; sleep 120) | $PROBE")
    client.create(codecs.from_dict(probe_pod(real, "capped", ns, "capped", script)))
    wait_until("capped running", lambda: phase(real, "capped") == "Running", 120)
    pod_uid = client.get(Pod, "capped", namespace=ns).metadata.uid
    agent_log = real.agent.process.log_path

    def limit_set() -> bool:
        return any("driver limit set" in line and pod_uid in line
                   for line in agent_log.read_text(errors="replace").splitlines())
    wait_until("tessera-node set the driver limit on the pod's cgroup", limit_set, 60)
    (real.agent.root / "sync" / "capped").touch()

    def answered() -> list[int] | None:
        log = real.node.pod_log(ns, "capped", "main")
        rcs = [int(m) for m in re.findall(r"^rc=(\d+) ptr=", log, re.M)]
        return rcs if len(rcs) == 3 else None
    rcs = wait_until("the probe's three allocations", answered, 60)
    assert rcs == [0, CUDA_ERROR_OUT_OF_MEMORY, 0], real.node.pod_log(ns, "capped", "main")

    def escape() -> list[str] | None:
        return [e.message or "" for e in client.list(Event, namespace=ns)
                if e.involvedObject.name == "capped" and e.reason == "GPUIsolationEscape"] or None
    messages = wait_until("escape detection on the claim's container", escape, 60)
    assert "capped" in messages[0], messages
    client.delete(Pod, "capped", namespace=ns, grace_period=0)


def test_real_node_mig_partition_claim_reaches_the_container(real: RealWorld) -> None:
    """A claim of class mig.tessera.io (profile 3g.20gb) on the real node: kube-scheduler
    allocates a partition of the MIG-mode GPU, the kubelet has tessera-node (with the chart's
    MIG opt-in) make it through NVML, containerd injects its MIG UUID, and the CUDA program in
    the container (as uid 4321) gets a context on that partition with the partition's memory:
    1 GiB fits, 21 GiB does not."""
    client = real.cluster.client()
    ns = "default"
    client.create(codecs.from_dict({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "mig", "namespace": ns},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "mig.tessera.io",
            "selectors": [{"cel": {"expression":
                                   'device.attributes["gpu.tessera.io"].profile == "3g.20gb"'}}],
        }}]}}}))
    # CUDA_VISIBLE_DEVICES from NVIDIA_VISIBLE_DEVICES: what the NVIDIA container runtime does
    # with the device it is given (the fake CUDA reads the former).
    script = ("echo visible=$NVIDIA_VISIBLE_DEVICES; export CUDA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES; "
              f"printf 'init\\ncount\\nctx 0\\ninfo\\nalloc {GIB}\\nalloc {21 * GIB}\\nexit\\n' "
              "| $PROBE")
    client.create(codecs.from_dict(probe_pod(real, "mig", ns, "mig", script)))
    assert finished(real, "mig") == "Succeeded", diagnose(real, "mig")
    log = real.node.pod_log(ns, "mig", "main")
    assert re.search(r"^visible=MIG-[0-9a-f-]{36}$", log, re.M), log
    assert "rc=0 count=1" in log, log
    total = int(re.search(r"^rc=0 free=\d+ total=(\d+)", log, re.M).group(1))  # type: ignore[union-attr]
    assert 19 * GIB < total <= 20 * GIB, log
    rcs = [int(m) for m in re.findall(r"^rc=(\d+) ptr=", log, re.M)]
    assert rcs == [0, CUDA_ERROR_OUT_OF_MEMORY], log


def test_real_node_headroom_is_measured_and_reported(real: RealWorld) -> None:
    """tessera-node, under the chart's privileges on the real node, measures each whole GPU's
    context headroom by creating a CUDA context there (not the model's default) and reports it
    on the Node (``tessera.io/gpu-inventory``, ``tessera.io/gpu-headroom``); the share pods'
    configs charge that measured headroom per context."""
    import json

    from tessera import wire

    def inventory() -> Any:
        ann = real.cluster.client().get(Node, NODE_NAME).metadata.annotations or {}
        raw = ann.get(wire.NODE_GPU_INVENTORY)
        return (json.loads(raw), ann.get(wire.NODE_GPU_HEADROOM)) if raw else None
    inv, headroom = wait_until("tessera-node's inventory on the real Node", inventory, 60)
    whole = next(g for g in inv["gpus"] if not g["mig"])
    assert whole["headroomSource"] == "measured", whole
    assert whole["headroom"] == 448 * 2**20, whole  # the fake A100's CUDA 12 context
    assert headroom is not None and str(whole["headroom"]) in headroom.split(",")


# -- the annotation path (webhook, tessera-scheduler, reservation pods on nvidia.com/gpu) ------

def runai_probe_pod(real: RealWorld, name: str, annotations: dict[str, str],
                    script: str) -> dict[str, Any]:
    """A Run:ai-style share pod (the share as annotations; the webhook mutates it) of the probe
    image, pinned to the real node, as uid 4321, with the node's driver mounted and /sync."""
    volumes, mounts = driver_volumes(real.agent)
    sync = real.agent.root / "sync"
    sync.mkdir(exist_ok=True)
    volumes = [*volumes, {"name": "sync", "hostPath": {"path": str(sync), "type": "Directory"}}]
    mounts = [*mounts, {"name": "sync", "mountPath": "/sync", "readOnly": True}]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": annotations},
            "spec": {"schedulerName": "runai-scheduler",
                     "nodeSelector": {"tessera.io/real-node": "true"},
                     "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                     "securityContext": {"runAsUser": POD_UID, "runAsGroup": POD_UID},
                     "volumes": volumes,
                     "containers": [{
                         "name": "main", "image": PROBE_IMAGE, "imagePullPolicy": "Never",
                         "command": ["/bin/sh", "-c", script],
                         "env": [*driver_env(real.agent),
                                 {"name": "PROBE", "value": f"{PROBE_DIR}/cuprobe"}],
                         "volumeMounts": mounts}]}}


def gone(real: RealWorld, *pods: str, ns: str = "default") -> None:
    client = real.cluster.client()
    for name in pods:
        with contextlib.suppress(ApiError):
            client.delete(Pod, name, namespace=ns, grace_period=0)

    def none_left() -> bool:
        left = {p.metadata.name for p in client.list(Pod, namespace=ns)}
        return not left & set(pods)
    wait_until(f"pods {pods} gone", none_left, 60)


def test_real_node_loan_is_reclaimed_across_two_pods(real: RealWorld,
                                                     webhook_path: WebhookPath) -> None:
    """A dynamic fraction on the real node, through the webhook and tessera-scheduler: pod A
    (Run:ai gpu-fraction 0.25, gpu-fraction-limit 0.8 of an A100-40GB) borrows 31 GiB while
    the GPU is free; pod B (0.25) then allocates 9 GiB within its 10 GiB request, which only
    the loan keeps from fitting. B's allocation waits, tessera-node (under the chart's
    capabilities and user) finds A's GPU process, running as uid 4321 in its own PID
    namespace, by its host PID and kills it; B is served, A's pod stays (docs/isolation.md,
    "Loans"), and both pods get their Event. The reservation pod runs on the real kubelet
    holding ``nvidia.com/gpu`` from the device-plugin double (the kubelet called Allocate)."""
    client = real.cluster.client()
    ns = "default"
    script_a = (f"(printf 'init\\nctx 0\\nalloc {31 * GIB}\\n'; sleep 300) | $PROBE")
    script_b = ("while [ ! -e /sync/owner ]; do sleep 0.2; done; "
                f"(printf 'init\\nctx 0\\nalloc {9 * GIB}\\n'; sleep 300) | $PROBE")
    try:
        client.create(codecs.from_dict(runai_probe_pod(
            real, "borrower", {"gpu-fraction": "0.25", "gpu-fraction-limit": "0.8"}, script_a)))

        def borrowed() -> bool:
            return "rc=0 ptr=" in real.node.pod_log(ns, "borrower", "main")
        try:
            wait_until("the borrower's 31 GiB", borrowed, 120)
        except AssertionError as exc:
            node = client.get(Node, NODE_NAME)
            raise AssertionError(
                f"{exc}\n{diagnose(real, 'borrower')}\nnode allocatable "
                f"{node.status.allocatable}, annotations {node.metadata.annotations}\n"
                f"device plugin: {webhook_path.device_plugin.log_tail(10)}") from None
        borrower = client.get(Pod, "borrower", namespace=ns)
        assert borrower.spec.nodeName == NODE_NAME


        def reserved() -> list[str] | None:  # the reservation pod runs, holding nvidia.com/gpu
            return [p.metadata.name for p in client.list(
                Pod, namespace="*", labels={names.RESERVATION_LABEL: "true"})
                if p.spec.nodeName == NODE_NAME and p.status.phase == "Running"] or None
        wait_until("a running reservation pod on the real node", reserved, 60)
        assert f"allocate ['{real.agent.uuids[0]}']" in \
            webhook_path.device_plugin.log_path.read_text(), "the kubelet did not call Allocate"
        client.create(codecs.from_dict(runai_probe_pod(
            real, "owner", {"gpu-fraction": "0.25"}, script_b)))
        wait_until("owner running", lambda: phase(real, "owner") == "Running", 120)
        (real.agent.root / "sync" / "owner").touch()

        def served() -> list[int] | None:
            rcs = [int(m) for m in re.findall(r"^rc=(\d+) ptr=",
                                              real.node.pod_log(ns, "owner", "main"), re.M)]
            return rcs or None
        assert wait_until("the owner's 9 GiB", served, 60) == [0], diagnose(real, "owner")
        # its GPU process was killed (SIGKILL: the container's shell says so), never its pod
        wait_until("the borrower's GPU process killed", lambda: re.search(
            r"^Killed$", real.node.pod_log(ns, "borrower", "main"), re.M), 30)
        reclaimed = wait_until("the borrower's Event", lambda: [
            e.message or "" for e in client.list(Event, namespace=ns)
            if e.involvedObject.name == "borrower" and e.reason == "GPUMemoryLoanReclaimed"]
            or None, 30)
        assert re.search(rf"GPU memory loan of [\d.]+ GiB reclaimed for {ns}/owner on "
                         rf"{real.agent.uuids[0]}: process \d+ of {ns}/borrower \(holding "
                         r"31\.\d GiB\) was killed", reclaimed[0]), reclaimed
        assert wait_until("the owner's Event", lambda: [
            e for e in client.list(Event, namespace=ns)
            if e.involvedObject.name == "owner" and e.reason == "GPUMemoryLoanReturned"], 30)
        assert phase(real, "owner") == "Running"  # nothing within a request is taken
        assert phase(real, "borrower") == "Running"  # the pod stays; only its process went
    finally:
        (real.agent.root / "sync" / "owner").unlink(missing_ok=True)
        gone(real, "borrower", "owner")


def test_real_node_mig_served_share_reaches_the_library(real: RealWorld,
                                                        webhook_path: WebhookPath) -> None:
    """A share served by a MIG partition (docs/mig.md, "Shares served by the smallest fitting
    profile") on the real node: the whole GPU 0 is held by a whole-GPU pod (its reservation
    through the device plugin), the node is labelled ``tessera.io/mig-serves-shares=true``, and
    a Run:ai 0.25 share is bound by tessera-scheduler with a 1g.10gb partition of the MIG-mode
    GPU 1. tessera-node makes it and writes the share's isolation files with its ``MIG-…`` UUID;
    in the container (uid 4321, the library preloaded by /etc/ld.so.preload) the library takes
    that device: a context is made, 9 GiB within the share (9856 MiB, the partition's memory)
    fit, one more GiB past it is CUDA_ERROR_OUT_OF_MEMORY."""
    client = real.cluster.client()
    ns = "default"
    whole = runai_probe_pod(real, "whole", {}, "sleep 600")
    whole["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    whole["spec"]["schedulerName"] = names.SCHEDULER_NAME
    script = ("echo visible=$NVIDIA_VISIBLE_DEVICES; "
              "export CUDA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES; cat /etc/tessera/*; "
              f"printf 'owner_alloc\\ninit\\nctx 0\\nalloc {9 * GIB}\\nalloc {GIB}\\nexit\\n' "
              "| $PROBE")
    try:
        client.create(codecs.from_dict(whole))
        try:
            wait_until("the whole-GPU pod running", lambda: phase(real, "whole") == "Running", 90)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{diagnose(real, 'whole')}") from None
        client.patch(Node, NODE_NAME, {"metadata": {"labels": {SERVES_SHARES: "true"}}},
                     patch_type=PatchType.MERGE)
        client.create(codecs.from_dict(runai_probe_pod(
            real, "served", {"gpu-fraction": "0.25"}, script)))
        try:
            result = finished(real, "served", 120)
        except AssertionError as exc:
            agent_log = real.agent.process.log_path.read_text(errors="replace").splitlines()
            raise AssertionError(f"{exc}\ntessera-node: " + "\n".join(
                line for line in agent_log if "served" in line or "MIG" in line
                or "rror" in line)[-3000:]) from None
        log = real.node.pod_log(ns, "served", "main")
        assert result == "Succeeded", diagnose(real, "served")
        pod = client.get(Pod, "served", namespace=ns)
        held = json.loads(pod.metadata.annotations[names.MIG_PARTITION])
        assert (held["profile"], held["gpu"]) == ("1g.10gb", real.agent.uuids[1]), held
        uuid = re.search(r"^visible=(MIG-[0-9a-f-]{36})$", log, re.M)
        assert uuid, log
        assert log.count(uuid.group(1)) >= 2, log  # the library's config names the MIG UUID
        assert "owner=libtessera-cuda.so" in log, log
        rcs = [int(m) for m in re.findall(r"^rc=(\d+) ptr=", log, re.M)]
        assert rcs == [0, CUDA_ERROR_OUT_OF_MEMORY], log
    finally:
        client.patch(Node, NODE_NAME, {"metadata": {"labels": {SERVES_SHARES: None}}},
                     patch_type=PatchType.MERGE)
        gone(real, "whole", "served")
