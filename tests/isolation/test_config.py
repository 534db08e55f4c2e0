"""Configuration files, the Python API that writes them, and failing closed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tessera.core.errors import InvalidRequest
from tessera.isolation import (
    CONFIG_ENV,
    DeviceShare,
    library_path,
    manual_environment,
    process_environment,
    read_region,
    render_config,
    write_workload_files,
)
from tessera.isolation import __main__ as cli
from tessera.isolation import library as library_module
from tests.isolation.conftest import CTX_V100, V100X4, GiB, clean_env

FAKE_UUIDS = [  # what the fake driver reports for devices 0..3
    "GPU-66616b65-313c-4752-5d68-737e89949faa",
    "GPU-66616b65-5661-6c77-828d-98a3aeb9c4cf",
]


def file_env(native, files, devices=V100X4, **extra):
    env = clean_env(native, devices=devices, extra=extra)
    env.update(process_environment(files, library=native.library))
    return env


def test_written_files_drive_the_library_by_uuid(native, probe, tmp_path):
    files = write_workload_files(tmp_path / "w1", [
        DeviceShare(index=0, uuid=FAKE_UUIDS[1], limit_bytes=3 * GiB, request_bytes=2 * GiB),
        DeviceShare(index=1, uuid=FAKE_UUIDS[0], limit_bytes=1 * GiB),
    ])
    p = probe(file_env(native, files))
    assert p("init")["rc"] == 0
    assert p("ctx 0")["rc"] == 0  # UUID 0 is listed second: the UUID decides, not the index
    assert p.info() == (GiB - CTX_V100, GiB)  # the context is charged (model default, no overhead in the file)
    assert p("ctx 1")["rc"] == 0
    assert p.info() == (3 * GiB - CTX_V100, 3 * GiB)
    p.alloc(3 * GiB - CTX_V100)
    assert p("ctx 2")["rc"] == 2  # not in the workload: not even a context may be made there
    assert p("alloc 1")["rc"] == 2
    usage = read_region(files.region_path)
    assert usage[FAKE_UUIDS[1]].used_bytes == 3 * GiB
    assert "is not in" in p.stderr()


def test_index_only_entries_and_file_beats_environment(native, probe, tmp_path):
    files = write_workload_files(tmp_path, [DeviceShare(index=0, uuid=None, limit_bytes=GiB)])
    env = file_env(native, files, TESSERA_GPU_MEMORY_LIMIT="100Gi")
    p = probe(env).start()
    assert p.info() == (GiB - CTX_V100, GiB)


def test_context_overhead_from_the_file(native, probe, tmp_path):
    files = write_workload_files(tmp_path, [DeviceShare(index=0, uuid=None, limit_bytes=4 * GiB)],
                                 context_overhead_bytes=GiB)
    p = probe(file_env(native, files)).start()
    assert p.info() == (3 * GiB, 4 * GiB)


BAD_CONFIGS = {
    "missing": None,
    "empty": "",
    "header": "tessera-gpu-isolation 2\ndevice index=0 limit=5\n",
    "no-device": "tessera-gpu-isolation 1\n",
    "request-over-limit": "tessera-gpu-isolation 1\ndevice index=0 request=9 limit=5\n",
    "unknown-key": "tessera-gpu-isolation 1\ndevice index=0 limit=5 colour=red\n",
    "quantity-in-file": "tessera-gpu-isolation 1\ndevice index=0 limit=8Gi\n",
    "duplicate": "tessera-gpu-isolation 1\ndevice index=0 limit=5\ndevice index=0 limit=6\n",
    "relative-region": "tessera-gpu-isolation 1\nregion here\ndevice index=0 limit=5\n",
    "zero-limit": "tessera-gpu-isolation 1\ndevice index=0 limit=0\n",
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_unreadable_or_invalid_config_fails_closed(native, probe, tmp_path, case):
    path = tmp_path / "bad.conf"
    if BAD_CONFIGS[case] is not None:
        path.write_text(BAD_CONFIGS[case])
    p = probe(clean_env(native, extra={CONFIG_ENV: str(path)})).start()
    assert p("alloc 1")["rc"] == 2
    assert p(f"aalloc {GiB} null")["rc"] == 2
    assert p(f"create {GiB} 0")["rc"] == 2
    assert p(f"managed {GiB}")["rc"] == 2
    assert p.info() == (0, 0)
    err = p.stderr()
    assert str(path) in err and "fail closed" in err


@pytest.mark.parametrize("env", [
    {"TESSERA_GPU_MEMORY_LIMIT": "8X"},
    {"TESSERA_GPU_MEMORY_LIMIT": "-1"},
    {"TESSERA_GPU_MEMORY_LIMIT": "8m"},  # milli-bytes: not a memory size
    {"TESSERA_GPU_MEMORY_LIMIT_x": "1Gi"},
    {"TESSERA_GPU_MEMORY_LIMIT_32": "1Gi"},
    {"TESSERA_GPU_MEMORY_LIMIT_0": "lots"},
    {"TESSERA_GPU_MEMORY_LIMIT": "8Gi", "TESSERA_GPU_SHARED_REGION": "relative/path"},
    {"TESSERA_GPU_MEMORY_LIMIT": "8Gi", "TESSERA_GPU_SHARED_REGION": "/proc/no/such/dir/region"},
])
def test_invalid_environment_fails_closed(native, probe, env):
    p = probe(clean_env(native, extra=env)).start()
    assert p("alloc 1")["rc"] == 2
    assert "fail closed" in p.stderr()


@pytest.mark.parametrize(("text", "expected"), [
    ("8G", 8 * 10**9), ("8Gi", 8 * GiB), ("1.5Gi", 3 * GiB // 2), ("500M", 500 * 10**6),
    ("1e9", 10**9), ("8589934592", 8 * GiB), ("0.5Ki", 512),
])
def test_environment_quantities(native, probe, text, expected):
    p = probe(clean_env(native, extra={"TESSERA_GPU_MEMORY_LIMIT": text}))
    assert p("init")["rc"] == 0
    assert p("total 0")["total"] == expected


def test_foreign_region_file_fails_closed(native, probe, tmp_path):
    region = tmp_path / "region"
    region.write_bytes(b"not a region" * 1000)
    env = clean_env(native, extra={"TESSERA_GPU_MEMORY_LIMIT": "8Gi", "TESSERA_GPU_SHARED_REGION": str(region)})
    p = probe(env).start()
    assert p("alloc 1")["rc"] == 2
    assert "not a tessera shared region" in p.stderr()


def test_render_config_format(tmp_path):
    text = render_config([DeviceShare(index=0, uuid="GPU-abc", limit_bytes=100, request_bytes=50)],
                         tmp_path / "r", context_overhead_bytes=7)
    assert text == (f"tessera-gpu-isolation 1\nregion {tmp_path / 'r'}\ncontext-overhead 7\n"
                    "device index=0 uuid=GPU-abc request=50 limit=100\n")


@pytest.mark.parametrize(("devices", "field"), [
    ([], "devices"),
    ([DeviceShare(index=None, uuid=None, limit_bytes=1)], "devices[0]"),
    ([DeviceShare(index=-1, uuid=None, limit_bytes=1)], "devices[0].index"),
    ([DeviceShare(index=0, uuid="bad uuid", limit_bytes=1)], "devices[0].uuid"),
    ([DeviceShare(index=0, uuid=None, limit_bytes=0)], "devices[0].limit_bytes"),
    ([DeviceShare(index=0, uuid=None, limit_bytes=5, request_bytes=6)], "devices[0].request_bytes"),
    ([DeviceShare(index=0, uuid=None, limit_bytes=5), DeviceShare(index=0, uuid=None, limit_bytes=5)],
     "devices[1].index"),
])
def test_invalid_shares_name_the_field_and_write_nothing(tmp_path, devices, field):
    with pytest.raises(InvalidRequest) as exc:
        write_workload_files(tmp_path / "w", devices)
    assert exc.value.field == field
    assert not (tmp_path / "w").exists()


def test_process_environment_keeps_an_existing_preload(tmp_path, native):
    files = write_workload_files(tmp_path, [DeviceShare(index=0, uuid=None, limit_bytes=5)])
    env = process_environment(files, library=native.library, base={"LD_PRELOAD": "/x/libother.so"})
    assert env["LD_PRELOAD"] == f"{native.library}:/x/libother.so"
    assert env[CONFIG_ENV] == str(files.config_path)
    assert oct(files.region_path.stat().st_mode & 0o777) == "0o660"  # group-shareable, not world-writable


def test_manual_environment_validates_like_the_library(native, probe):
    env = manual_environment("2Gi", {1: "1G"}, library=native.library)
    assert env["TESSERA_GPU_MEMORY_LIMIT"] == str(2 * GiB)
    assert env["TESSERA_GPU_MEMORY_LIMIT_1"] == str(10**9)
    with pytest.raises(InvalidRequest) as exc:
        manual_environment("8X", library=native.library)
    assert exc.value.field == "limit"
    with pytest.raises(InvalidRequest):
        manual_environment(per_device={40: "1G"}, library=native.library)
    p = probe(clean_env(native, devices=V100X4, extra=env)).start(1)
    assert p.info() == (10**9 - CTX_V100, 10**9)


def test_path_command_prints_the_installed_library():
    out = subprocess.run([sys.executable, "-m", "tessera.isolation", "--path"], capture_output=True,
                         text=True, check=True).stdout.strip()
    assert Path(out) == library_path()
    assert Path(out).is_file() and Path(out).name == "libtessera-cuda.so"


def test_path_command_fails_clearly_when_not_built(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(library_module, "PACKAGE_LIB_DIR", tmp_path)
    assert cli.main(["--path"]) == 1
    assert "not built" in capsys.readouterr().err


def test_run_command_applies_limits_to_the_program(native, tmp_path):
    env = clean_env(native, preload=False, devices=V100X4)
    script = "init\nctx 1\ninfo\nctx 0\ninfo\nexit\n"
    done = subprocess.run(
        [sys.executable, "-m", "tessera.isolation", "--limit", "2Gi", "--device-limit", "1=1G",
         "--region", str(tmp_path / "r"), "--", str(native.program("cuprobe")), "dlsym"],
        input=script, env=env, capture_output=True, text=True, timeout=60, check=True)
    lines = done.stdout.splitlines()
    assert lines[2] == f"rc=0 free={10**9 - CTX_V100} total={10**9}"  # its context is charged
    assert lines[4] == f"rc=0 free={2 * GiB - CTX_V100} total={2 * GiB}"
    assert (tmp_path / "r").stat().st_size > 0


def test_run_command_keys_device_limits_by_uuid(native, tmp_path):
    """#28 class 5: --device-limit 1=1G is the GPU that is visible device 1 for the launcher,
    keyed by its UUID: a program that reorders CUDA_VISIBLE_DEVICES (here: `env` before exec)
    finds the 1 GB limit on that same GPU, now its device 0 (before: it moved to the other GPU,
    which got 1 GB while the limited one got 2 GiB)."""
    env = clean_env(native, preload=False, devices=V100X4)
    script = "init\nctx 0\ninfo\nctx 1\ninfo\nexit\n"
    done = subprocess.run(
        [sys.executable, "-m", "tessera.isolation", "--limit", "2Gi", "--device-limit", "1=1G",
         "--region", str(tmp_path / "r"), "--", "env", "CUDA_VISIBLE_DEVICES=1,0,2,3",
         str(native.program("cuprobe")), "dlsym"],
        input=script, env=env, capture_output=True, text=True, timeout=60, check=True)
    lines = done.stdout.splitlines()
    assert lines[2] == f"rc=0 free={10**9 - CTX_V100} total={10**9}"  # physical GPU 1
    assert lines[4] == f"rc=0 free={2 * GiB - CTX_V100} total={2 * GiB}"  # physical GPU 0


def test_run_command_rejects_a_device_it_cannot_see(native, tmp_path):
    env = clean_env(native, preload=False, devices=V100X4)
    done = subprocess.run([sys.executable, "-m", "tessera.isolation", "--device-limit", "7=1G", "--",
                           "true"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--device-limit" in done.stderr and "no visible GPU 7" in done.stderr


def test_run_command_rejects_a_bad_limit_before_running_anything(tmp_path):
    done = subprocess.run([sys.executable, "-m", "tessera.isolation", "--limit", "8X", "--", "true"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "limit:" in done.stderr


class ContainerProbe:
    """cuprobe started as in a share container: ``/etc/tessera`` (the file tessera-node wrote)
    mounted in a private mount namespace, on an overlay of /etc so nothing changes on the host."""

    def __init__(self, native, etc_tessera: Path | None, env: dict[str, str], tmp: Path) -> None:  # type: ignore[no-untyped-def]
        from tests.isolation.conftest import Probe

        script = ["set -e", f"mkdir -p {tmp}/u {tmp}/w",
                  f"mount -t overlay overlay -o lowerdir=/etc,upperdir={tmp}/u,workdir={tmp}/w /etc"]
        if etc_tessera is not None:
            script += ["mkdir -p /etc/tessera", f"mount --bind {etc_tessera} /etc/tessera"]
        script.append('exec "$@"')
        self.probe = Probe.__new__(Probe)
        self.probe.proc = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", "\n".join(script),
             "container", str(native.program("cuprobe")), "dlsym"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=env, bufsize=1)


def _container_env(native, **extra: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """What a process keeps after ``env -i`` in a share container (whose /etc/ld.so.preload
    names the library): the library and the fake driver, nothing of tessera's."""
    env = {"PATH": "/usr/bin:/bin", "LD_PRELOAD": str(native.library),
           "LD_LIBRARY_PATH": str(native.fake_dir), "FAKE_GPU_DEVICES": V100X4}
    env.update(extra)
    return env


def _total(native, tmp_path: Path, etc: Path | None, **env: str) -> tuple[int, str]:  # type: ignore[no-untyped-def]
    (tmp_path / "ov").mkdir(exist_ok=True)
    p = ContainerProbe(native, etc, _container_env(native, **env), tmp_path / "ov").probe
    try:
        assert p("init")["rc"] == 0
        r = p("ctx 0")
        if r["rc"] != 0:
            return -1, p.stderr()
        info = p("info")
        alloc = p(f"alloc {2 * GiB}")
        return (info["total"] if alloc["rc"] == 0 else -alloc["rc"]), ""
    finally:
        p.close()


def test_the_containers_file_is_the_authority_env_may_only_narrow(native, tmp_path):  # type: ignore[no-untyped-def]
    etc = tmp_path / "etc-tessera"
    files = write_workload_files(etc, [DeviceShare(index=0, uuid=None, limit_bytes=4 * GiB)])
    assert files.config_path == etc / "gpu-isolation.conf"
    # env -i: nothing of tessera's in the environment, still capped by the file
    assert _total(native, tmp_path, etc) == (4 * GiB, "")
    # the environment cannot widen the limit...
    assert _total(native, tmp_path, etc, TESSERA_GPU_MEMORY_LIMIT="100Gi") == (4 * GiB, "")
    assert _total(native, tmp_path, etc, TESSERA_GPU_MEMORY_LIMIT_0="100Gi") == (4 * GiB, "")
    # ...nor point the library at another file
    other = tmp_path / "mine"
    mine = write_workload_files(other, [DeviceShare(index=0, uuid=None, limit_bytes=100 * GiB)])
    assert _total(native, tmp_path, etc, TESSERA_GPU_CONFIG=str(mine.config_path)) == (4 * GiB, "")
    # but it may narrow it (below 2 GiB the 2 GiB allocation is refused: rc 2, out of memory)
    assert _total(native, tmp_path, etc, TESSERA_GPU_MEMORY_LIMIT="3Gi") == (3 * GiB, "")
    assert _total(native, tmp_path, etc, TESSERA_GPU_MEMORY_LIMIT_0="1Gi") == (-2, "")


def test_a_share_container_without_its_file_fails_closed(native, tmp_path):  # type: ignore[no-untyped-def]
    etc = tmp_path / "etc-tessera-empty"
    etc.mkdir()
    total, _ = _total(native, tmp_path, etc, TESSERA_GPU_MEMORY_LIMIT="100Gi")
    assert total == -2  # every allocation refused, whatever the environment says


def test_embedded_region_is_0660_in_a_0750_directory(tmp_path):
    """Embedded mode's region (the server's own user runs every process): not world-readable or
    writable, a directory it creates 0750; an existing directory is not changed."""
    files = write_workload_files(tmp_path / "new" / "w1", [DeviceShare(index=0, uuid=None, limit_bytes=5)])
    assert files.region_path.stat().st_mode & 0o7777 == 0o660
    assert files.region_path.parent.stat().st_mode & 0o7777 == 0o750
    (tmp_path / "mine").mkdir(mode=0o755)
    os.chmod(tmp_path / "mine", 0o755)
    write_workload_files(tmp_path / "mine", [DeviceShare(index=0, uuid=None, limit_bytes=5)])
    assert (tmp_path / "mine").stat().st_mode & 0o7777 == 0o755
