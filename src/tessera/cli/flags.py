"""Naming the flag the user typed in an error: the raw command line of this run, and the map
from the API's fields to the flags that set them."""

from __future__ import annotations

from tessera.cli.client import (
    CliError,
)

# -- submit --------------------------------------------------------------------------------------


TRAILING: list[list[str]] = []
"""The words after ``--`` on a submit command line (set by ``_App``): the command to run. Kept
apart from click's positionals so that ``submit -g 0.1 -- sleep 60`` is not read as a workload
named ``sleep`` running ``60``."""
RAW_ARGV: list[str] = []


def typed(*aliases: str) -> str:
    """The spelling of an option that the user typed (the first alias when none was)."""
    for word in RAW_ARGV:
        if word == "--":
            break
        for alias in aliases:
            if word == alias or (alias.startswith("--") and word.startswith(alias + "=")):
                return alias
    return aliases[0]


def flagged(exc: CliError, fields: dict[str, str], given: dict[str, str] | None = None) -> CliError:
    """The server's refusal with each API field path replaced by the flag the user typed, and
    the value it quotes replaced by what the user typed for that flag (``given``)."""
    if exc.status is None:
        return exc
    parts = []
    for part in str(exc).split("; "):
        field, sep, rest = part.partition(": ")
        flag = fields.get(field)
        if flag is None and sep:
            flag = next((f for k, f in fields.items() if field.startswith((k + ".", k + "["))),
                        None)
        typed_value = (given or {}).get(flag or "")
        if typed_value is not None and rest.endswith(")") and " (got " in rest:
            rest = rest[:rest.rindex(" (got ")] + f" (got {typed_value!r})"
        parts.append(f"{flag}: {rest}" if flag and sep else part)
    return CliError("; ".join(parts), exc.code, exc.status)


def _submit_fields(gpu_memory_flag: str) -> dict[str, str]:
    gpu_flag = typed("--gpu-devices", "--gpu-devices-request") if any(
        w in RAW_ARGV for w in ("--gpu-devices", "--gpu-devices-request")) else typed("-g", "--gpu")
    return {
        "name": "NAME",
        "projectId": typed("-p", "--project"),
        "spec.workers": "--workers",
        "spec.minWorkers": "--min-workers",
        "spec.command": "COMMAND (after --)",
        "spec.args": "COMMAND (after --)",
        "spec.image": typed("-i", "--image"),
        "spec.priorityClass": "--priority",
        "spec.onEviction": "--on-eviction",
        "spec.workingDir": "--working-dir",
        **{f"spec.ports[{i}].externalUrl": "--external-url" for i in range(16)},
        "spec.ports": "--port",
        "spec.parallelism": "--parallelism",
        "spec.completions": "--completions",
        "spec.backoffLimit": "--backoff-limit",
        "spec.autoscaling.minReplicas": "--min-replicas",
        "spec.autoscaling.maxReplicas": "--max-replicas",
        "spec.autoscaling.metric": "--metric",
        "spec.autoscaling.metricThreshold": "--metric-threshold",
        "spec.autoscaling.scaleDownDelaySeconds": "--scale-down-delay",
        "spec.autoscaling": "--min-replicas",
        "spec.environmentVariables": typed("-e", "--environment"),
        "spec.compute.gpuDevicesRequest": gpu_flag,
        "spec.compute.gpuPortionRequest": typed("--gpu-portion-request", "-g", "--gpu"),
        "spec.compute.gpuPortionLimit": "--gpu-portion-limit",
        "spec.compute.gpuMemoryRequest": gpu_memory_flag,
        "spec.compute.gpuMemoryLimit": "--gpu-memory-limit",
        "spec.compute.gpuModel": "--gpu-model",
        "spec.compute.gpuMigProfile": "--gpu-mig-profile",
        "spec.compute.gpuComputeRequest": "--gpu-compute-request",
        "spec.compute.gpuComputeLimit": "--gpu-compute-limit",
        "spec.compute.gpuComputeMode": "--gpu-compute-mode",
        "spec.compute": next((w for w in RAW_ARGV if w.split("=")[0] in GPU_FLAGS), "-g"),
    }


GPU_FLAGS = ("-g", "--gpu", "--gpu-devices", "--gpu-devices-request", "--gpu-memory",
             "--gpu-portion-request", "--gpu-portion-limit", "--gpu-memory-request",
             "--gpu-memory-limit")


def _project_fields() -> dict[str, str]:
    return {
        "name": "NAME",
        "resources.gpu.deserved": typed("--deserved", "--gpu"),
        "resources.gpu.limit": "--limit",
        "resources.gpu.overQuotaWeight": "--over-quota-weight",
        "resources.gpu": typed("--deserved", "--gpu"),
        "priority": "--priority",
    }
