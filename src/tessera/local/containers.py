"""Container images in embedded mode: podman or docker runs an image's own entrypoint with the
pod's GPU share.

A pod that has an image and no command is started as ``RUNTIME run --rm --name NAME ... IMAGE``
in the foreground (the runner's process group; its output is the pod's log), with:

* the devices: by CDI (``--device nvidia.com/gpu=UUID``) when the runtime is podman and a CDI
  spec for NVIDIA GPUs is installed, else ``NVIDIA_VISIBLE_DEVICES`` / ``CUDA_VISIBLE_DEVICES``
  (the NVIDIA container toolkit's runtime hook reads the former);
* the isolation library and the pod's config file bind-mounted read-only at the same paths,
  with ``LD_PRELOAD`` and ``TESSERA_GPU_CONFIG`` set, so the same limits hold as for a process;
* the pod's ``TESSERA_*`` environment.

``exec`` and ``bash`` go through ``RUNTIME exec`` into the container by name. Detection runs
``RUNTIME info`` once at server start: a client with no daemon (docker without dockerd) or a
runtime that cannot start containers here does not count as installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

RUNTIMES = ("podman", "docker")
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
# Variables a container gets from the pod's environment (the host's PATH, HOME... stay out).
PASSED = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "LD_PRELOAD", "TESSERA_GPU_CONFIG")


@dataclass(frozen=True)
class Runtime:
    name: str
    """``podman`` or ``docker``."""
    path: str
    cdi: bool = False
    """Devices by CDI name (podman with an NVIDIA CDI spec installed)."""

    def container_name(self, pod_key: str) -> str:
        return f"tessera-{pod_key}"

    def run_argv(
        self, pod_key: str, image: str, env: Mapping[str, str], uuids: Sequence[str],
        mounts: Sequence[str] = (), workdir: str | None = None, args: Sequence[str] = (),
        ports: Sequence[tuple[int, int]] = (),
    ) -> list[str]:
        """The argv that runs ``image`` (its entrypoint, or ``args`` as its command) as a pod."""
        argv = [self.path, "run", "--rm", "--name", self.container_name(pod_key),
                "--init", "--pull=missing"]
        if self.cdi:
            argv += [f"--device=nvidia.com/gpu={u}" for u in uuids]
        for key in sorted(env):
            if key in PASSED or key.startswith("TESSERA_"):
                argv += ["--env", f"{key}={env[key]}"]
        for path in mounts:
            argv += ["--volume", f"{path}:{path}:ro"]
        for container_port, host_port in ports:
            argv += ["--publish", f"127.0.0.1:{host_port}:{container_port}"]
        if workdir:
            argv += ["--workdir", workdir]
        argv.append(image)
        argv += list(args)
        return argv

    def exec_argv(self, pod_key: str, command: Sequence[str], tty: bool) -> list[str]:
        return [self.path, "exec", "-i", *(["-t"] if tty else []),
                self.container_name(pod_key), *command]

    def stop_argv(self, pod_key: str, grace: float) -> list[str]:
        return [self.path, "stop", "--time", str(max(0, int(grace))),
                self.container_name(pod_key)]


def _works(path: str) -> tuple[bool, str]:
    try:
        r = subprocess.run([path, "info"], capture_output=True, text=True, timeout=15,
                           stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"{Path(path).name} info: {type(exc).__name__}"
    if r.returncode != 0:
        lines = (r.stderr or r.stdout).strip().splitlines()
        return False, f"{Path(path).name} info failed: {lines[-1][:160] if lines else r.returncode}"
    return True, ""


def _has_nvidia_cdi() -> bool:
    for d in CDI_DIRS:
        with_specs = Path(d)
        if with_specs.is_dir() and any(
            "nvidia" in p.name for p in with_specs.iterdir() if p.suffix in (".yaml", ".json")
        ):
            return True
    return False


def detect(choice: str = "auto", which: object = shutil.which) -> tuple[Runtime | None, str]:
    """The container runtime to use (``auto``: podman, then docker; ``none``: none) and, when
    there is none, why, in words."""
    if choice == "none":
        return None, "no container runtime (--runtime none)"
    candidates = RUNTIMES if choice == "auto" else (choice,)
    notes = []
    for name in candidates:
        path = which(name)  # type: ignore[operator]
        if not path:
            notes.append(f"{name} is not installed")
            continue
        ok, why = _works(str(path))
        if ok:
            return Runtime(name, str(path), cdi=name == "podman" and _has_nvidia_cdi()), ""
        notes.append(why)
    return None, "; ".join(notes)


def refusal(why: str) -> str:
    """The one-line refusal of an image with no command when no runtime works here."""
    return ("running an image's own entrypoint needs a container runtime (podman or docker) and "
            f"none works here ({why}); install one (tessera up --runtime podman|docker), or give "
            "the command to run after --, e.g. -- python train.py")


def isolation_mounts(env: Mapping[str, str]) -> list[str]:
    """The isolation library and the pod's config file: mounted read-only at the same paths."""
    out = []
    for key in ("LD_PRELOAD", "TESSERA_GPU_CONFIG"):
        for path in filter(None, env.get(key, "").split(":")):
            if os.path.isabs(path) and path not in out:
                out.append(path)
    return out
