"""``tessera submit`` and ``tessera TYPE submit``: flags to a request body, errors naming the flag the user typed."""

from __future__ import annotations

import os
import shlex
from typing import Annotated, Any

import typer

from tessera.api.compute_fields import submission_compute
from tessera.cli import render
from tessera.cli.app import FLAG_NAMES, KIND_PATH, Output, ProjectOpt, _backend, _fmt, _project, cli
from tessera.cli.client import (
    CliError,
    connect,
)
from tessera.cli.flags import (
    TRAILING,
    _submit_fields,
    flagged,
    typed,
)
from tessera.core.errors import InvalidRequest
from tessera.core.mig import parse_profile
from tessera.core.requests import parse_gpu_request

# -- submit --------------------------------------------------------------------------------------


def _compute(
    gpu: str | None, gpu_devices: str | None, gpu_memory: str | None, portion: str | None,
    portion_limit: str | None, memory_request: str | None, memory_limit: str | None,
    gpu_model: str | None,
) -> dict[str, Any]:
    """Validate the GPU flags with the core's rules (errors name the flag) and build ``compute``."""
    if gpu_memory is not None and memory_request is not None:
        raise CliError("--gpu-memory-request: give --gpu-memory or --gpu-memory-request, not both")
    memory = memory_request if memory_request is not None else gpu_memory
    try:
        req = parse_gpu_request(
            gpu=gpu, gpu_devices=gpu_devices, gpu_portion=portion, gpu_portion_limit=portion_limit,
            gpu_memory=memory, gpu_memory_limit=memory_limit, gpu_model=gpu_model,
            memory_unit_required=True,
        )
    except InvalidRequest as exc:
        flag = typed(*FLAG_NAMES.get(exc.field, exc.field).split("/"))
        if exc.field == "gpu_memory" and memory_request is not None:
            flag = "--gpu-memory-request"
        shown = "" if exc.value is None else f" (got {exc.value!r})"
        raise CliError(f"{flag}: {exc.rule}{shown}") from None
    compute = submission_compute(req, memory, memory_limit)
    if gpu_model:
        compute["gpuModel"] = gpu_model
    return compute


def _compute_share(compute: dict[str, Any], request: str | None, limit: str | None, mode: str | None) -> None:
    """--gpu-compute-request/-limit/-mode into spec.compute; ranges are checked here (errors
    name the flag), the rest (the cluster's mode, whole GPUs, MIG) by the server's validator."""
    from tessera.core import compute as rules

    try:
        if request is not None:
            compute["gpuComputeRequest"] = str(rules._fraction(request, rules.FLAG_REQUEST))
        if limit is not None:
            compute["gpuComputeLimit"] = str(rules._fraction(limit, rules.FLAG_LIMIT))
        if mode is not None:
            compute["gpuComputeMode"] = rules.check_mode(mode, rules.FLAG_MODE)
    except InvalidRequest as exc:
        shown = "" if exc.value is None else f" (got {exc.value!r})"
        raise CliError(f"{exc.field}: {exc.rule}{shown}") from None
    if request is not None and limit is not None and float(limit) < float(request):
        raise CliError(f"{rules.FLAG_LIMIT}: must be at least {rules.FLAG_REQUEST} ({request}) (got {limit!r})")


def _env(pairs: list[str] | None) -> list[dict[str, str]]:
    out = []
    for pair in pairs or []:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise CliError(f"-e/--environment: must be NAME=VALUE (got {pair!r})")
        out.append({"name": name, "value": value})
    return out


def _submit(
    kind: str | None, name: str | None, command: list[str] | None, project: str | None,
    gpu: str | None, gpu_devices: str | None, gpu_memory: str | None, portion: str | None,
    portion_limit: str | None, memory_request: str | None, memory_limit: str | None,
    gpu_model: str | None, interactive: bool, priority: str | None,
    environment: list[str] | None, workers: int, min_workers: int | None, image: str,
    working_dir: str | None, output: str, on_eviction: str = "requeue",
    name_prefix: str | None = None, ports: list[str] | None = None,
    mig_profile: str | None = None,
    compute_share: tuple[str | None, str | None, str | None] = (None, None, None),
    framework: str | None = None,
    sweep: tuple[int | None, int | None, int | None] = (None, None, None),
    scaling: dict[str, Any] | None = None,
    external_url: bool = False,
) -> None:
    fmt = _fmt(output)
    if workers < 1:
        raise CliError(f"--workers: must be at least 1 (got {workers})")
    if min_workers is not None and not 1 <= min_workers <= workers:
        raise CliError(f"--min-workers: must be from 1 to --workers ({workers}) "
                       f"(got {min_workers})")
    if framework is not None:  # tessera training pytorch|jax|... submit (docs/workloads.md)
        environment = [*(environment or []), f"{FRAMEWORK_ENV}={framework}"]
    if TRAILING:
        if command:
            raise CliError(f"NAME: give one workload name before -- (got {' '.join([name or '', *command])!r}); "
                           "the command goes after --")
        command = TRAILING[0]
    elif command and name is not None:
        pass  # `submit NAME CMD ARGS...` without --: the old spelling, kept
    if interactive and kind in ("Training", "Inference"):
        raise CliError(f"--interactive: a {kind.lower()} is not interactive; submit a workspace "
                       "instead: tessera workspace submit (or tessera submit --interactive)")
    if kind is None:
        kind = "Workspace" if interactive else "Training"
    if not command and not image:
        raise CliError("COMMAND: give the command to run after --, e.g. -- python train.py "
                       "(or -i IMAGE to run the image's own entrypoint)")
    if name is not None and name_prefix is not None:
        raise CliError("--job-name-prefix: give a NAME or --job-name-prefix, not both")
    if on_eviction not in ("requeue", "fail"):
        raise CliError(f"--on-eviction: must be requeue or fail (got {on_eviction!r})")
    port_specs = [_port(p) for p in ports or []]
    if external_url and not port_specs:
        raise CliError("--external-url: give --port too (the port the URL reaches, e.g. "
                       "--port 8888 --external-url)")
    for p in port_specs if external_url else []:
        p["externalUrl"] = True
    if priority is not None and priority not in PRIORITY_NAMES:
        raise CliError(f"--priority: must be one of {', '.join(PRIORITY_NAMES)} (got {priority!r})")
    if mig_profile is not None:
        given = [f for f, v in (("-g/--gpu", gpu), ("--gpu-devices", gpu_devices),
                                ("--gpu-memory", gpu_memory), ("--gpu-portion-request", portion),
                                ("--gpu-portion-limit", portion_limit),
                                ("--gpu-memory-request", memory_request),
                                ("--gpu-memory-limit", memory_limit), ("--gpu-model", gpu_model))
                 if v is not None]
        if given:
            raise CliError(f"--gpu-mig-profile: give a MIG profile or {given[0]}, not both "
                           "(a MIG partition is the whole GPU request)")
        try:
            compute: dict[str, Any] = {"gpuMigProfile": parse_profile(mig_profile,
                                                                      "--gpu-mig-profile")}
        except InvalidRequest as exc:
            raise CliError(str(exc)) from None
    else:
        compute = _compute(gpu, gpu_devices, gpu_memory, portion, portion_limit, memory_request,
                           memory_limit, gpu_model)
    _compute_share(compute, *compute_share)
    client, config = connect()
    spec: dict[str, Any] = {
        "image": image,
        "environmentVariables": _env(environment),
        "compute": compute,
        "workers": workers,
    }
    if command:
        spec["command"] = shlex.quote(command[0])
        spec["args"] = shlex.join(command[1:])
    if working_dir:
        embedded = command and _backend(client, config) != "kubernetes"
        spec["workingDir"] = os.path.abspath(working_dir) if embedded else working_dir
    elif command and _backend(client, config) != "kubernetes":
        spec["workingDir"] = os.getcwd()  # embedded mode runs the command here
    spec["onEviction"] = on_eviction
    if port_specs:
        spec["ports"] = port_specs
    if min_workers is not None:
        spec["minWorkers"] = min_workers
    auto = {k: v for k, v in (scaling or {}).items() if v is not None}
    if auto:
        if kind != "Inference":
            flag = {"minReplicas": "--min-replicas", "maxReplicas": "--max-replicas",
                    "metric": "--metric", "metricThreshold": "--metric-threshold",
                    "scaleDownDelaySeconds": "--scale-down-delay"}[next(iter(auto))]
            raise CliError(f"{flag}: only an inference scales: tessera inference submit")
        if "metricThreshold" not in auto and auto.get("maxReplicas", 1) > 1:
            raise CliError("--metric-threshold: give the per-replica value of --metric above "
                           "which a replica is added")
        auto.setdefault("metricThreshold", 1)
        spec["autoscaling"] = auto
    for key, value in zip(("parallelism", "completions", "backoffLimit"), sweep, strict=True):
        if value is not None:
            spec[key] = value
    if priority is not None:
        spec["priorityClass"] = priority
    generated = name is None
    body: dict[str, Any] = {
        "name": name if name is not None else (name_prefix or DEFAULT_PREFIX[kind]),
        "projectId": _project(config, project),
        "spec": spec,
    }
    if generated:
        body["useGivenNameAsPrefix"] = True
    memory_flag = "--gpu-memory-request" if memory_request is not None else "--gpu-memory"
    for attempt in range(5):
        try:
            w = client.post(f"/api/v1/workloads/{KIND_PATH[kind]}", body)
            break
        except CliError as exc:
            if generated and exc.status == 409 and attempt < 4:
                continue  # the generated suffix was taken: draw another
            typed_values = {memory_flag: memory_request if memory_request is not None
                            else gpu_memory, "--gpu-memory-limit": memory_limit}
            raise flagged(exc, _submit_fields(memory_flag),
                          {k: v for k, v in typed_values.items() if v is not None}) from None
    if fmt != "table":
        render.dump(w, fmt)
        return
    if w.get("sweep"):
        sw = w["sweep"]
        typer.echo(f"sweep {sw['name']} submitted to project {sw['project']}: "
                   f"{sw['completions']} trials of {w['gpus']['request']}, "
                   f"{sw['parallelism']} at a time (trials {sw['name']}-0 .. "
                   f"{sw['name']}-{sw['completions'] - 1})")
        return
    typer.echo(f"{w['type'].lower()} {w['name']} submitted to project {w['projectName']}: "
               f"{w['gpus']['request']}" + (" (name generated)" if generated else "")
               + "".join(f"; {url}" for url in w.get("serviceUrls") or []))


def _port(text: str) -> dict[str, Any]:
    """``--port 8888`` or ``--port HOST:CONTAINER`` (8080:80), as Run:ai and docker write it."""
    parts = text.split(":")
    if len(parts) > 2 or not all(p.isascii() and p.isdigit() and 1 <= int(p) <= 65535 for p in parts):
        raise CliError(f"--port: must be PORT or HOST_PORT:CONTAINER_PORT, each 1-65535 "
                       f"(got {text!r})")
    if len(parts) == 1:
        return {"container": int(parts[0])}
    return {"container": int(parts[1]), "external": int(parts[0])}


DEFAULT_PREFIX = {"Training": "job", "Workspace": "job", "Inference": "job"}
PRIORITY_NAMES = ("train", "build-preemptible", "build", "interactive", "inference")


FRAMEWORK_ENV = "TESSERA_FRAMEWORK"
"""Set in every worker of ``tessera training FRAMEWORK submit`` (embedded mode adds that
framework's rendezvous variables: tessera.local.distributed)."""
FRAMEWORKS = ("pytorch", "mpi", "jax", "tensorflow", "xgboost")
"""Run:ai's distributed training types; each is a thin variant of ``training submit``: a gang
of ``--workers`` pods that start together."""


def _register_submit(group: typer.Typer, kind: str | None, help_text: str,
                     framework: str | None = None) -> None:
    def submit(
        name: Annotated[str | None, typer.Argument(help="Workload name (generated when left out, like Run:ai's job-XXXX)")] = None,
        command: Annotated[list[str] | None, typer.Argument(help="Command after --")] = None,
        project: ProjectOpt = None,
        gpu: Annotated[str | None, typer.Option("-g", "--gpu", help="0.5 (a share) or 2 (whole GPUs)")] = None,
        gpu_devices: Annotated[str | None, typer.Option("--gpu-devices", "--gpu-devices-request", help="Devices (with a share: each gets it)")] = None,
        gpu_memory: Annotated[str | None, typer.Option("--gpu-memory", help="GPU memory with a unit: 5G, 5GB, 4Gi, 2500M (see docs/units.md)")] = None,
        portion: Annotated[str | None, typer.Option("--gpu-portion-request", help="Guaranteed share (0-1)")] = None,
        portion_limit: Annotated[str | None, typer.Option("--gpu-portion-limit", help="Burst share cap")] = None,
        memory_request: Annotated[str | None, typer.Option("--gpu-memory-request", help="Guaranteed memory")] = None,
        memory_limit: Annotated[str | None, typer.Option("--gpu-memory-limit", help="Burst memory cap")] = None,
        gpu_model: Annotated[str | None, typer.Option("--gpu-model", help="Allowed models, A|B")] = None,
        interactive: Annotated[bool, typer.Option("--interactive", help="A workspace (build, not preemptible); refused by training and inference submit")] = False,
        priority: Annotated[str | None, typer.Option("--priority", help="train, build or inference")] = None,
        environment: Annotated[list[str] | None, typer.Option("-e", "--environment", help="NAME=VALUE")] = None,
        workers: Annotated[int, typer.Option("--workers", help="Pods, each with the GPU request")] = 1,
        min_workers: Annotated[int | None, typer.Option("--min-workers", help="Gang minimum")] = None,
        image: Annotated[str, typer.Option("-i", "--image", help="Container image; with no command its entrypoint runs (embedded mode: through podman or docker)")] = "",
        working_dir: Annotated[str | None, typer.Option("--working-dir")] = None,
        on_eviction: Annotated[str, typer.Option("--on-eviction", help="requeue or fail when evicted")] = "requeue",
        name_prefix: Annotated[str | None, typer.Option("--job-name-prefix", help="Prefix of the generated name")] = None,
        ports: Annotated[list[str] | None, typer.Option("--port", help="Expose a port: 8888 or HOST:CONTAINER; the URL shows in list and describe (SERVICE URL)")] = None,
        external_url: Annotated[bool, typer.Option("--external-url", help="Reach --port from outside: the server's external address (embedded) or an Ingress (Kubernetes); the URL shows in describe")] = False,
        gpu_mig_profile: Annotated[str | None, typer.Option("--gpu-mig-profile", "--mig-profile", help="A MIG partition instead of a share: 3g.20gb (GPUs in MIG mode; docs/mig.md); --mig-profile is Run:ai's spelling")] = None,
        compute_request: Annotated[str | None, typer.Option("--gpu-compute-request", help="Guaranteed share of the GPU's time, 0-1 (default: the portion; docs/compute-share.md)")] = None,
        compute_limit: Annotated[str | None, typer.Option("--gpu-compute-limit", help="Ceiling on the GPU time share, request-1 (fair default 1, strict: the request)")] = None,
        compute_mode: Annotated[str | None, typer.Option("--gpu-compute-mode", help="off, fair or strict (default: the cluster's)")] = None,
        parallelism: Annotated[int | None, typer.Option("--parallelism", help="A sweep: trials that run at once")] = None,
        completions: Annotated[int | None, typer.Option("--completions", "--runs", help="A sweep: trials to complete; each sees JOB_COMPLETION_INDEX 0..N-1")] = None,
        backoff_limit: Annotated[int | None, typer.Option("--backoff-limit", help="A sweep: failed trials retried in all (default 6)")] = None,
        min_replicas: Annotated[int | None, typer.Option("--min-replicas", help="Inference: replicas when idle")] = None,
        max_replicas: Annotated[int | None, typer.Option("--max-replicas", help="Inference: replicas at most")] = None,
        metric: Annotated[str | None, typer.Option("--metric", help="Inference: concurrency or throughput")] = None,
        metric_threshold: Annotated[float | None, typer.Option("--metric-threshold", help="Inference: per replica; above it a replica is added")] = None,
        scale_down_delay: Annotated[float | None, typer.Option("--scale-down-delay", help="Inference: the cool-down: fewer replicas are decided this many seconds after the need fell (idle: after the last connection closed), within 1 s more; the pods then go (docs/workloads.md) (default 30)")] = None,
        output: Output = "table",
    ) -> None:
        _submit(kind, name, command, project, gpu, gpu_devices, gpu_memory, portion,
                portion_limit, memory_request, memory_limit, gpu_model, interactive, priority,
                environment, workers, min_workers, image, working_dir, output, on_eviction,
                name_prefix, ports, gpu_mig_profile, (compute_request, compute_limit, compute_mode),
                framework, (parallelism, completions, backoff_limit),
                {"minReplicas": min_replicas, "maxReplicas": max_replicas, "metric": metric,
                 "metricThreshold": metric_threshold, "scaleDownDelaySeconds": scale_down_delay},
                external_url)

    submit.__doc__ = help_text
    group.command("submit")(submit)


_register_submit(cli, None, "Submit a workload (a training; --interactive makes a workspace).")
