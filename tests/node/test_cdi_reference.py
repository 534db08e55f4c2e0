"""tessera's CDI specs as the CDI reference implementation reads them
(tags.cncf.io/container-device-interface v1.1.2, what containerd 2.x and CRI-O link; built by
tessera.testing.node_binaries into ``cdi-validate``): a share claim's and a MIG claim's specs are
valid, resolve to the devices the plugin answers the kubelet with, and inject into an OCI spec
the environment and mounts the container needs. A spec the reference rejects is shown rejected,
so the check can fail."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tessera.node.draplugin.cdi import (
    DRIVER,
    ClaimDevice,
    MigDevice,
    PluginConfig,
    cdi_name,
    cdi_spec,
    mig_cdi_spec,
    write_spec,
)
from tessera.testing.node_binaries import cdi_validate

UID = "6f1c1f64-3b1e-4bb1-9f2e-0123456789ab"


@pytest.fixture(scope="module")
def validator() -> Path:
    return cdi_validate()


def check(validator: Path, cdi_dir: Path, *devices: str) -> dict[str, Any]:
    done = subprocess.run([str(validator), str(cdi_dir), *devices], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    out: dict[str, Any] = json.loads(done.stdout)
    return out


def cfg(tmp_path: Path) -> PluginConfig:
    return PluginConfig(node="n", uuids={0: "GPU-a", 1: "GPU-b"}, cdi_dir=tmp_path / "cdi",
                        library_dir=Path("/var/lib/tessera/isolation"),
                        claims_dir=tmp_path / "claims",
                        claims_host_dir=Path("/var/lib/tessera/containers/claims"),
                        loans_host_dir=Path("/var/lib/tessera/loans"))


def test_a_share_claims_spec_is_valid_and_injects_the_library_config_and_limits(
        validator: Path, tmp_path: Path) -> None:
    c = cfg(tmp_path)
    devices = [ClaimDevice("gpu", "gpu-1", "GPU-b", 5 * 2**30, "s-1"),
               ClaimDevice("gpu", "gpu-0", "GPU-a", 2**30, "")]
    write_spec(c, UID, cdi_spec(UID, devices, c))
    names = [f"{DRIVER}/claim={cdi_name(UID, d)}" for d in devices]
    out = check(validator, c.cdi_dir, *names)
    assert out["specErrors"] == {} and out["cacheErrors"] == {}, out
    assert out["devices"] == sorted(names) and not out.get("injectError"), out
    env = out["oci"]["process"]["env"]
    assert "LD_PRELOAD=/usr/local/tessera/libtessera-cuda.so" in env
    assert "NVIDIA_VISIBLE_DEVICES=GPU-b,GPU-a" in env
    assert f"TESSERA_GPU_MEMORY_LIMIT_0={5 * 2**30}" in env
    assert f"TESSERA_GPU_MEMORY_LIMIT_1={2**30}" in env
    mounts = {m["destination"]: m for m in out["oci"]["mounts"]}
    assert mounts["/etc/ld.so.preload"]["source"] == "/var/lib/tessera/isolation/ld.so.preload"
    assert mounts["/run/tessera"]["source"] == f"/var/lib/tessera/containers/claims/{UID}/region"
    assert "rw" in mounts["/run/tessera"]["options"]
    assert mounts["/run/tessera-loans"]["source"] == "/var/lib/tessera/loans"


def test_a_mig_claims_spec_is_valid(validator: Path, tmp_path: Path) -> None:
    c = cfg(tmp_path)
    dev = MigDevice("mig", "gpu-0-mig-3g20gb-4", "GPU-a", 0, "3g.20gb", 4)
    write_spec(c, UID, mig_cdi_spec(UID, [dev], ["MIG-0b0ef2a1-5c6d-5e7f-8a9b-0c1d2e3f4a5b"]))
    out = check(validator, c.cdi_dir, f"{DRIVER}/claim={UID}-{dev.name}")
    assert out["specErrors"] == {} and not out.get("injectError"), out
    assert "NVIDIA_VISIBLE_DEVICES=MIG-0b0ef2a1-5c6d-5e7f-8a9b-0c1d2e3f4a5b" in \
        out["oci"]["process"]["env"]


def test_the_reference_rejects_what_a_runtime_would(validator: Path, tmp_path: Path) -> None:
    c = cfg(tmp_path)
    spec = cdi_spec(UID, [ClaimDevice("gpu", "gpu-0", "GPU-a", 2**30, "")], c)
    spec["containerEdits"]["mounts"][0]["containerPath"] = "relative/path"
    spec["devices"][0]["name"] = "bad name!"
    write_spec(c, UID, spec)
    out = check(validator, c.cdi_dir)
    (error,) = out["specErrors"].values()
    assert "invalid" in error.lower(), error
