"""``tessera``: the command line, modelled on Run:ai's CLI (v1 ``submit`` and v2 ``training submit``).

Every command talks to the REST API; ``up`` and ``down`` also start and stop the local server.
Errors are one line on stderr; exit 0 ok, 1 user error, 2 server unreachable.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from tessera.cli import render
from tessera.cli.client import (
    Client,
    CliError,
    connect,
    get_token,
    load_config,
    local_credentials,
    save_config,
)
from tessera.core.errors import InvalidRequest
from tessera.core.requests import parse_gpu_request
from tessera.settings import DEFAULT_PORT, data_dir

cli = typer.Typer(
    name="tessera",
    help="Fractional GPU sharing: submit, list and manage GPU workloads and projects.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
project_app = typer.Typer(help="Projects: GPU quota (deserved, limit, over-quota weight).",
                          no_args_is_help=True)
cli.add_typer(project_app, name="project")
config_app = typer.Typer(help="CLI settings (Run:ai v1's runai config).", no_args_is_help=True)
cli.add_typer(config_app, name="config")

KIND_PATH = {"Training": "trainings", "Workspace": "workspaces", "Inference": "inferences"}
FLAG_NAMES = {
    "gpu": "-g/--gpu",
    "gpu_devices": "--gpu-devices",
    "gpu_portion": "--gpu-portion-request",
    "gpu_portion_limit": "--gpu-portion-limit",
    "gpu_memory": "--gpu-memory",
    "gpu_memory_limit": "--gpu-memory-limit",
    "gpu_model": "--gpu-model",
}

Output = Annotated[str, typer.Option("-o", "--output", help="table, json or yaml")]
ProjectOpt = Annotated[str | None, typer.Option("-p", "--project", help="Project (default: set one with tessera project set)")]


def _fmt(value: str) -> str:
    if value not in render.FORMATS:
        raise CliError(f"-o/--output: must be one of {', '.join(render.FORMATS)} (got {value!r})")
    return value


def _backend(client: Client, config: dict[str, Any]) -> str:
    """``embedded`` or ``kubernetes``: remembered from login, else asked once."""
    if "backend" not in config:
        config["backend"] = client.get("/api/v1/cluster").get("backend", "embedded")
        save_config(config)
    return str(config["backend"])


def _project(config: dict[str, Any], project: str | None) -> str:
    name = project or os.environ.get("TESSERA_PROJECT") or config.get("project")
    if not name:
        raise CliError("no project: pass -p PROJECT or run tessera project set PROJECT")
    return str(name)


# -- up / down / login ---------------------------------------------------------------------------


def _healthy(url: str, timeout: float = 0.5) -> bool:
    try:
        return Client(url, None, timeout=timeout).request("GET", "/healthz").status_code == 200
    except CliError:
        return False


def _login_local(url: str, directory: Path, backend: str = "embedded") -> None:
    creds = local_credentials(directory)
    if creds is None:
        raise CliError(f"no credentials in {directory}; is the server using this data directory?")
    token = get_token(url, creds["clientId"], creds["clientSecret"])
    config = load_config()
    config.update({"url": url, "token": token, "dataDir": str(directory), "backend": backend})
    save_config(config)


@cli.command()
def up(
    port: Annotated[int, typer.Option(help="Port on 127.0.0.1", envvar="TESSERA_PORT")] = DEFAULT_PORT,
    data_dir_opt: Annotated[str | None, typer.Option("--data-dir", help="State directory")] = None,
    simulate: Annotated[list[str] | None, typer.Option(help="Simulated GPUs, e.g. 1xV100-16GB or 2xH100-80GB")] = None,
    detach: Annotated[bool, typer.Option("--detach", "-d", help="Run in the background")] = False,
    grace: Annotated[float, typer.Option(help="Seconds between SIGTERM and SIGKILL")] = 10.0,
    policy: Annotated[str, typer.Option(help="Placement policy: fgd (fragmentation-aware), binpack, spread, best-fit, random")] = "fgd",
    runtime: Annotated[str, typer.Option("--runtime", help="Container runtime for -i IMAGE with no command: auto (podman, then docker), podman, docker or none")] = "auto",
    kubernetes: Annotated[bool, typer.Option("--kubernetes", help="Serve the API for a Kubernetes cluster (tessera-scheduler places the pods) instead of running workloads here")] = False,
    kubeconfig: Annotated[str | None, typer.Option("--kubeconfig", help="With --kubernetes: kubeconfig (default $KUBECONFIG, ~/.kube/config or in-cluster)")] = None,
    context: Annotated[str | None, typer.Option("--context", help="With --kubernetes: kubeconfig context")] = None,
    image: Annotated[str | None, typer.Option("--image", help="With --kubernetes: default container image of workloads")] = None,
) -> None:
    """Start the control plane (REST API, scheduler, local runner) on this machine, or with
    --kubernetes the REST API for a cluster."""
    if not kubernetes and (kubeconfig or context or image):
        raise CliError("--kubeconfig: needs --kubernetes (so do --context and --image)")
    if kubernetes and simulate:
        raise CliError("--simulate: embedded mode only; a cluster has its own (or kwok) nodes")
    if kubernetes:
        from tessera.kube.api_server import kube_data_dir

        directory = kube_data_dir(data_dir_opt)
    else:
        directory = data_dir(data_dir_opt)
    backend = "kubernetes" if kubernetes else "embedded"
    url = f"http://127.0.0.1:{port}"
    from tessera.api.serving import server_info

    info = server_info(directory)
    if info and _healthy(str(info.get("url"))):
        _login_local(str(info["url"]), directory, backend)
        typer.echo(f"tessera is already up at {info['url']} (data {directory})")
        return
    if kubernetes:
        kargv = ["--port", str(port), "--data-dir", str(directory)]
        if kubeconfig:
            kargv += ["--kubeconfig", str(Path(kubeconfig).expanduser().resolve())]
        if context:
            kargv += ["--context", context]
        if image:
            kargv += ["--image", image]
        if not detach:
            from tessera.kube.api_server import main as serve_kube

            raise typer.Exit(serve_kube(kargv))
        _spawn([sys.executable, "-m", "tessera.kube.api_server", *kargv], directory, url)
        _login_local(url, directory, backend)
        typer.echo(f"tessera is up at {url} (Kubernetes backend; data {directory})")
        return
    from tessera.core.placement import POLICIES

    if policy not in POLICIES:
        raise CliError(f"--policy: must be one of {', '.join(POLICIES)} (got {policy!r})")
    if runtime not in ("auto", "podman", "docker", "none"):
        raise CliError(f"--runtime: must be auto, podman, docker or none (got {runtime!r})")
    if simulate:
        from tessera.local.gpus import parse_simulate

        try:
            parse_simulate(simulate)
        except InvalidRequest as exc:
            raise CliError(f"--{exc}") from None
    argv = [sys.executable, "-m", "tessera.local.server", "--port", str(port),
            "--data-dir", str(directory), "--grace", str(grace), "--policy", policy,
            "--runtime", runtime]
    for s in simulate or []:
        argv += ["--simulate", s]
    if not detach:
        from tessera.local.server import main as serve

        code = serve(argv[3:])
        raise typer.Exit(code)
    proc = _spawn(argv, directory, url)
    _login_local(url, directory)
    info = server_info(directory) or {}
    kind = "SIMULATED" if info.get("simulated") else "real (NVML)"
    gpus: list[dict[str, Any]] = info.get("gpus", [])  # type: ignore[assignment]
    models = ", ".join(f"{g['index']}:{g['model']}" for g in gpus)
    rt = info.get("runtime") or "none (images need a command)"
    typer.echo(f"tessera is up at {url} (pid {proc.pid}); GPUs: {kind} {models}; "
               f"policy {policy}; container runtime: {rt}; data {directory}")


def _spawn(argv: list[str], directory: Path, url: str) -> subprocess.Popen[bytes]:
    """Start a detached server and wait until it answers."""
    directory.mkdir(parents=True, exist_ok=True)
    log = open(directory / "server.log", "ab")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = (directory / "server.log").read_text(errors="replace").strip().splitlines()
            raise CliError(f"the server exited: {tail[-1] if tail else proc.returncode}")
        if _healthy(url, 0.2):
            return proc
        time.sleep(0.05)
    raise CliError(f"the server did not answer at {url} within 30 s; see {directory}/server.log")


@cli.command()
def down(
    data_dir_opt: Annotated[str | None, typer.Option("--data-dir")] = None,
    stop_workloads: Annotated[bool, typer.Option("--stop-workloads", help="Also stop running workloads")] = False,
) -> None:
    """Stop the control plane. Running workloads keep running and are re-attached by the next up."""
    from tessera.api.serving import server_info

    directory = data_dir(data_dir_opt or load_config().get("dataDir"))
    info = server_info(directory)
    if not info:
        typer.echo(f"tessera is not running (no server in {directory})")
        return
    pid = int(info["pid"])  # type: ignore[call-overload]
    if stop_workloads:
        (directory / "stop-workloads").touch()
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        (directory / "server.json").unlink(missing_ok=True)
        typer.echo("tessera was not running (removed a stale server.json)")
        return
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        raise CliError(f"the server (pid {pid}) did not stop within 60 s")
    note = "workloads stopped" if stop_workloads else "running workloads keep running"
    typer.echo(f"tessera is down ({note})")


@cli.command()
def login(
    url: Annotated[str | None, typer.Option(help="Server URL")] = None,
    client_id: Annotated[str | None, typer.Option(help="Client id")] = None,
    client_secret: Annotated[str | None, typer.Option(help="Client secret (prompted if missing)")] = None,
    data_dir_opt: Annotated[str | None, typer.Option("--data-dir")] = None,
) -> None:
    """Get an API token; on the server's machine the local admin credentials are used."""
    from tessera.cli.client import server_url

    config = load_config()
    directory = data_dir(data_dir_opt or config.get("dataDir"))
    target = (url or server_url(config)).rstrip("/")
    if client_id is None or client_secret is None:
        creds = local_credentials(directory)
        if creds is not None and client_id in (None, creds["clientId"]):
            client_id, client_secret = creds["clientId"], creds["clientSecret"]
        else:
            client_id = client_id or typer.prompt("Client id")
            client_secret = client_secret or typer.prompt("Client secret", hide_input=True)
    token = get_token(target, client_id, client_secret)
    backend = Client(target, token).get("/api/v1/cluster").get("backend", "embedded")
    config.update({"url": target, "token": token, "backend": backend})
    save_config(config)
    typer.echo(f"logged in to {target} as {client_id} ({backend})")


# -- projects ------------------------------------------------------------------------------------


def _project_body(deserved: float, limit: float | None, weight: float, priority: int) -> dict[str, Any]:
    return {"resources": {"gpu": {"deserved": deserved, "limit": limit, "overQuotaWeight": weight}},
            "priority": priority}


@project_app.command("create")
def project_create(
    name: str,
    deserved: Annotated[float, typer.Option("--deserved", "--gpu", help="Deserved (guaranteed) GPUs")] = 0.0,
    limit: Annotated[float | None, typer.Option("--limit", help="Most GPUs the project may use")] = None,
    weight: Annotated[float, typer.Option("--over-quota-weight", help="Share of idle GPUs")] = 1.0,
    priority: Annotated[int, typer.Option(help="Project priority (higher first)")] = 50,
) -> None:
    """Create a project with a GPU quota."""
    client, _ = connect()
    body = {"name": name, **_project_body(deserved, limit, weight, priority)}
    try:
        p = client.post("/api/v1/org-unit/projects", body)
    except CliError as exc:
        raise flagged(exc, _project_fields()) from None
    typer.echo(f"project {p['name']} created (id {p['id']}, deserved {deserved:g} GPUs"
               f"{'' if limit is None else f', limit {limit:g}'})")


@project_app.command("update")
def project_update(
    name: str,
    deserved: Annotated[float | None, typer.Option("--deserved", "--gpu", help="Deserved (guaranteed) GPUs")] = None,
    limit: Annotated[float | None, typer.Option("--limit", help="Most GPUs the project may use")] = None,
    no_limit: Annotated[bool, typer.Option("--no-limit", help="Remove the limit")] = False,
    weight: Annotated[float | None, typer.Option("--over-quota-weight", help="Share of idle GPUs")] = None,
    priority: Annotated[int | None, typer.Option(help="Project priority (higher first)")] = None,
) -> None:
    """Change only the given settings of a project's quota (the rest stay as they are)."""
    if limit is not None and no_limit:
        raise CliError("--no-limit: give --limit N or --no-limit, not both")
    gpu: dict[str, Any] = {}
    if deserved is not None:
        gpu["deserved"] = deserved
    if limit is not None or no_limit:
        gpu["limit"] = limit
    if weight is not None:
        gpu["overQuotaWeight"] = weight
    body: dict[str, Any] = {"resources": {"gpu": gpu}} if gpu else {}
    if priority is not None:
        body["priority"] = priority
    if not body:
        raise CliError("project update: give at least one of --deserved/--gpu, --limit, "
                       "--no-limit, --over-quota-weight, --priority")
    client, _ = connect()
    try:
        before = client.get(f"/api/v1/org-unit/projects/{name}")
        after = client.patch(f"/api/v1/org-unit/projects/{name}", body)
    except CliError as exc:
        raise flagged(exc, _project_fields()) from None
    changes = []
    labels = (("deserved", "deserved"), ("limit", "limit"), ("overQuotaWeight", "over-quota weight"))
    for key, label in labels:
        old, new = before["resources"]["gpu"][key], after["resources"]["gpu"][key]
        if old != new:
            changes.append(f"{label} {_quota(old)} -> {_quota(new)}")
    if before["priority"] != after["priority"]:
        changes.append(f"priority {before['priority']} -> {after['priority']}")
    typer.echo(f"project {name} updated: " + (", ".join(changes) or "nothing changed"))


def _quota(value: float | None) -> str:
    return "none" if value is None else f"{value:g}"


@project_app.command("list")
def project_list(output: Output = "table") -> None:
    """Projects with their quota and what they use now."""
    fmt = _fmt(output)
    client, config = connect()
    projects = client.get("/api/v1/org-unit/projects")["projects"]
    simulated = client.get("/api/v1/cluster")["simulated"]
    if fmt != "table":
        render.dump({"projects": projects, "simulated": simulated}, fmt)
        return
    current = config.get("project")
    rows = []
    for p in projects:
        gpu = p["resources"]["gpu"]
        rows.append([
            p["name"] + (" (current)" if p["name"] == current else ""),
            f"{gpu['deserved']:g}",
            "-" if gpu["limit"] is None else f"{gpu['limit']:g}",
            f"{gpu['overQuotaWeight']:g}",
            str(p["priority"]),
            render.gpus(p["status"]["allocated"]["gpu"]),
        ])
    typer.echo(render.table(["PROJECT", "DESERVED GPUs", "LIMIT", "OVER-QUOTA WEIGHT", "PRIORITY",
                             "ALLOCATED GPUs"], rows))
    if simulated:
        typer.echo("GPUs are SIMULATED (no NVIDIA driver on this machine)")


@project_app.command("set")
def project_set(name: str) -> None:
    """Make NAME the default project of later commands."""
    client, config = connect()
    client.get(f"/api/v1/org-unit/projects/{name}")
    config["project"] = name
    save_config(config)
    typer.echo(f"project {name} is now the default")


@config_app.command("project")
def config_project(name: str) -> None:
    """Make NAME the default project (the same as tessera project set NAME)."""
    project_set(name)


@project_app.command("delete")
def project_delete(name: str) -> None:
    """Delete a project (it must have no workloads)."""
    client, config = connect()
    client.delete(f"/api/v1/org-unit/projects/{name}")
    if config.get("project") == name:
        config.pop("project")
        save_config(config)
    typer.echo(f"project {name} deleted")


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
    compute: dict[str, Any] = {}
    if req.kind.value == "whole":
        compute["gpuDevicesRequest"] = req.devices
    elif req.kind.value == "portion":
        compute.update(gpuRequestType="portion", gpuDevicesRequest=req.devices,
                       gpuPortionRequest=str(req.portion))
        if req.portion_limit is not None:
            compute["gpuPortionLimit"] = str(req.portion_limit)
    elif req.kind.value == "memory":
        compute.update(gpuRequestType="memory", gpuDevicesRequest=req.devices,
                       gpuMemoryRequest=str(memory))
        if memory_limit is not None:
            compute["gpuMemoryLimit"] = str(memory_limit)
    if gpu_model:
        compute["gpuModel"] = gpu_model
    return compute


def _env(pairs: list[str] | None) -> list[dict[str, str]]:
    out = []
    for pair in pairs or []:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise CliError(f"-e/--environment: must be NAME=VALUE (got {pair!r})")
        out.append({"name": name, "value": value})
    return out


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
        "spec.ports": "--port",
        "spec.environmentVariables": typed("-e", "--environment"),
        "spec.compute.gpuDevicesRequest": gpu_flag,
        "spec.compute.gpuPortionRequest": typed("--gpu-portion-request", "-g", "--gpu"),
        "spec.compute.gpuPortionLimit": "--gpu-portion-limit",
        "spec.compute.gpuMemoryRequest": gpu_memory_flag,
        "spec.compute.gpuMemoryLimit": "--gpu-memory-limit",
        "spec.compute.gpuModel": "--gpu-model",
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


def _submit(
    kind: str | None, name: str | None, command: list[str] | None, project: str | None,
    gpu: str | None, gpu_devices: str | None, gpu_memory: str | None, portion: str | None,
    portion_limit: str | None, memory_request: str | None, memory_limit: str | None,
    gpu_model: str | None, interactive: bool, priority: str | None,
    environment: list[str] | None, workers: int, min_workers: int | None, image: str,
    working_dir: str | None, output: str, on_eviction: str = "requeue",
    name_prefix: str | None = None, ports: list[str] | None = None,
) -> None:
    fmt = _fmt(output)
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
    if priority is not None and priority not in PRIORITY_NAMES:
        raise CliError(f"--priority: must be one of {', '.join(PRIORITY_NAMES)} (got {priority!r})")
    compute = _compute(gpu, gpu_devices, gpu_memory, portion, portion_limit, memory_request,
                       memory_limit, gpu_model)
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
        spec["workingDir"] = working_dir
    elif command and _backend(client, config) != "kubernetes":
        spec["workingDir"] = os.getcwd()  # embedded mode runs the command here
    spec["onEviction"] = on_eviction
    if port_specs:
        spec["ports"] = port_specs
    if min_workers is not None:
        spec["minWorkers"] = min_workers
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
    typer.echo(f"{w['type'].lower()} {w['name']} submitted to project {w['projectName']}: "
               f"{w['gpus']['request']}" + (" (name generated)" if generated else "")
               + "".join(f"; {url}" for url in w.get("serviceUrls") or []))


def _port(text: str) -> dict[str, int]:
    """``--port 8888`` or ``--port HOST:CONTAINER`` (8080:80), as Run:ai and docker write it."""
    parts = text.split(":")
    if len(parts) > 2 or not all(p.isdigit() and 1 <= int(p) <= 65535 for p in parts):
        raise CliError(f"--port: must be PORT or HOST_PORT:CONTAINER_PORT, each 1-65535 "
                       f"(got {text!r})")
    if len(parts) == 1:
        return {"container": int(parts[0])}
    return {"container": int(parts[1]), "external": int(parts[0])}


DEFAULT_PREFIX = {"Training": "job", "Workspace": "job", "Inference": "job"}
PRIORITY_NAMES = ("train", "build-preemptible", "build", "interactive", "inference")


def _register_submit(group: typer.Typer, kind: str | None, help_text: str) -> None:
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
        output: Output = "table",
    ) -> None:
        _submit(kind, name, command, project, gpu, gpu_devices, gpu_memory, portion,
                portion_limit, memory_request, memory_limit, gpu_model, interactive, priority,
                environment, workers, min_workers, image, working_dir, output, on_eviction,
                name_prefix, ports)

    submit.__doc__ = help_text
    group.command("submit")(submit)


_register_submit(cli, None, "Submit a workload (a training; --interactive makes a workspace).")


# -- reading -------------------------------------------------------------------------------------


def _find(client: Client, config: dict[str, Any], name: str, project: str | None,
          kind: str | None = None) -> dict[str, Any]:
    proj = _project(config, project)
    filters = [f"name=={name}", f"projectName=={proj}"]
    if kind:
        filters.append(f"type=={kind}")
    found = client.get("/api/v1/workloads", params={"filterBy": filters, "limit": 2})["workloads"]
    if not found:
        raise CliError(f"no workload {name} in project {proj}")
    w: dict[str, Any] = found[0]
    return w


PHASES = ("Pending", "Running", "Stopping", "Stopped", "Completed", "Failed", "Deleting")
TABLE_FIELDS = ("name,phase,createdAt,nodeName,gpuDevices,image,type,projectName,priorityClass,gpus,"
                "workers,runningPods,serviceUrls")


def _list(kind: str | None, project: str | None, all_projects: bool, status: str | None,
          output: str) -> None:
    fmt = _fmt(output)
    client, config = connect()
    filters = []
    scope = "all projects"
    if not all_projects:
        proj = project or os.environ.get("TESSERA_PROJECT") or config.get("project")
        if proj:
            filters.append(f"projectName=={proj}")
            scope = f"project {proj}"
    if kind:
        filters.append(f"type=={kind}")
    if status:
        match = [ph for ph in PHASES if ph.lower() == status.strip().lower()]
        if not match:
            raise CliError(f"{typed('--status', '--state')}: must be one of {', '.join(PHASES)} "
                           f"(got {status!r})")
        filters.append(f"phase=={match[0]}")
    rows: list[Any] = []
    simulated = False
    offset = 0
    params: dict[str, Any] = {"filterBy": filters, "limit": 10000}
    if fmt == "table":
        params.update(fields=TABLE_FIELDS, shape="rows")
    while True:
        page = client.get("/api/v1/workloads", params={**params, "offset": offset})
        rows.extend(page["rows"] if fmt == "table" else page["workloads"])
        simulated = simulated or bool(page.get("simulated"))
        if page["next"] is None:
            break
        offset = page["next"]
    if fmt != "table":
        render.dump({"workloads": rows, "total": len(rows), "simulated": simulated}, fmt)
        return
    now = time.time()
    table = []
    ages = render.Ages(now)
    for (name, phase, created, node, devices, image, kind_, proj, pclass, g, workers, running,
         urls) in rows:
        table.append([
            name, phase, ages(created), node or "-", devices or "-", image or "-", kind_, proj,
            pclass, f"{g['allocated']:.2f} ({g['requested']:.2f})",
            f"{running} ({workers - running if phase == 'Pending' else 0})",
            ",".join(urls or []),
        ])
    out = [f"Showing workloads for {scope}"
           + (" — GPUs are SIMULATED (no NVIDIA driver here)" if simulated else "")]
    out.append(render.table(["NAME", "STATUS", "AGE", "NODE", "GPU", "IMAGE", "TYPE", "PROJECT",
                             "PRIORITY", "GPUs Allocated (Requested)", "PODs Running (Pending)",
                             "SERVICE URL(S)"], table))
    sys.stdout.write("\n".join(out) + "\n")


def _describe(kind: str | None, name: str, project: str | None, output: str) -> None:
    fmt = _fmt(output)
    client, config = connect()
    brief = _find(client, config, name, project, kind)
    w = client.get(f"/api/v1/workloads/{KIND_PATH[brief['type']]}/{brief['workloadId']}")
    if fmt != "table":
        render.dump(w, fmt)
        return
    spec = w["spec"]
    lines = [
        f"Name:        {w['name']}  ({w['workloadId']})",
        f"Project:     {w['projectName']}",
        f"Type:        {w['type']}, priority {w['priorityClass']}, "
        f"{'preemptible' if w['preemptible'] else 'not preemptible'}",
        f"Status:      {w['phase']}" + (f" (exit code {w['exitCode']})" if w["exitCode"] is not None else ""),
    ]
    if w["phase"] == "Pending":
        lines.append(f"Why pending: {w['phaseMessage']}")
    elif w["phaseMessage"]:
        lines.append(f"Message:     {w['phaseMessage']}")
    lines += [
        f"GPUs:        {'SIMULATED (no NVIDIA driver here)' if w['simulated'] else 'real (NVML)'}",
        f"Request:     {w['gpus']['request']} x {w['workers']} pod(s) "
        f"(= {w['gpus']['requested']:.2f} GPUs; allocated {w['gpus']['allocated']:.2f})",
        f"Isolation:   {w['isolation']}",
        f"Scheduler:   {w['scheduler']}",
        f"Image:       {w.get('image') or '-'}"
        + (" (its entrypoint runs)" if w.get("image") and not spec["command"] else ""),
        f"Command:     {' '.join(x for x in (spec['command'], spec['args']) if x) or '-'}",
        f"Service URL: {', '.join(w.get('serviceUrls') or []) or '-'}",
        f"Created:     {w['createdAt']}   Started: {w['startedAt'] or '-'}   "
        f"Completed: {w['completedAt'] or '-'}",
    ]
    for pod in w["pods"]:
        where = (f"{pod['namespace']}/{pod['name']} " if pod.get("name") else "") + (
            f"on {pod['nodeName']}" if pod["nodeName"] else "not bound")
        lines.append(f"Pod {pod['index']}:       {pod['phase']} {where}"
                     + (f", pid {pod['pid']}" if pod.get("pid") else "")
                     + (f", exit code {pod['exitCode']}" if pod["exitCode"] is not None else ""))
        for d in pod["gpuDevices"]:
            share = "whole device" if pod["exclusive"] else (
                f"request {render.size(d['requestBytes'])}, limit {render.size(d['limitBytes'])}")
            lines.append(f"  GPU {d['index']} {d['uuid'] or '(UUID chosen by the device plugin)'}:"
                         f" {share}")
        if pod.get("logPath"):
            lines.append(f"  Log: {pod['logPath']}")
    lines.append("Events:")
    ev_rows = [[e["time"], e["kind"], e["message"]] for e in w["events"]]
    lines += ["  " + line for line in render.table(["TIME", "EVENT", "MESSAGE"], ev_rows).splitlines()]
    typer.echo("\n".join(lines))


def _logs(kind: str | None, name: str, project: str | None, follow: bool, pod: int) -> None:
    client, config = connect()
    w = _find(client, config, name, project, kind)
    base = f"/api/v1/workloads/{KIND_PATH[w['type']]}/{w['workloadId']}"
    offset = 0
    while True:
        r = client.request("GET", f"{base}/logs", params={"pod": pod, "offset": offset})
        if r.content:
            sys.stdout.buffer.write(r.content)
            sys.stdout.flush()
        offset = int(r.headers.get("x-next-offset", offset))
        if not follow:
            return
        if r.content:
            continue
        phase = client.get(base)["phase"]
        if phase not in ("Pending", "Running", "Stopping"):
            r = client.request("GET", f"{base}/logs", params={"pod": pod, "offset": offset})
            sys.stdout.buffer.write(r.content)
            return
        time.sleep(0.5)


def _exec(kind: str | None, name: str, command: list[str], project: str | None, pod: int) -> None:
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise CliError("COMMAND: give the command to run, e.g. tessera exec frac05 -- nvidia-smi")
    client, config = connect()
    w = _find(client, config, name, project, kind)
    if w["phase"] != "Running":
        raise CliError(f"workload {name} is {w['phase']}; exec needs it Running")
    pods = client.get(f"/api/v1/workloads/{KIND_PATH[w['type']]}/{w['workloadId']}/pods")["pods"]
    match = [p for p in pods if p["index"] == pod]
    if not match:
        raise CliError(f"--pod: workload {name} has no pod {pod}")
    if "env" not in match[0]:
        # The pod runs elsewhere (Kubernetes): the server runs COMMAND in it (pods/exec).
        r = client.post(f"/api/v1/workloads/{KIND_PATH[w['type']]}/{w['workloadId']}/exec",
                        {"pod": pod, "command": command})
        sys.stdout.write(r["stdout"])
        sys.stderr.write(r["stderr"])
        raise typer.Exit(int(r["exitCode"]))
    env = {**os.environ, **match[0]["env"]}
    if match[0].get("container"):
        # An image's entrypoint runs in a container: exec goes through its runtime.
        runtime, _, container = str(match[0]["container"]).partition(":")
        tty = sys.stdin.isatty() and sys.stdout.isatty()
        command = [runtime, "exec", "-i", *(["-t"] if tty else []), container, *command]
        env = dict(os.environ)
    try:
        code = subprocess.call(command, env=env)
    except FileNotFoundError:
        raise CliError(f"COMMAND: {command[0]} not found") from None
    raise typer.Exit(code)


def _action(kind: str | None, names: list[str], project: str | None, verb: str) -> None:
    client, config = connect()
    for name in names:
        w = _find(client, config, name, project, kind)
        path = f"/api/v1/workloads/{KIND_PATH[w['type']]}/{w['workloadId']}"
        if verb == "delete":
            client.delete(path)
            typer.echo(f"workload {name} deleted")
        else:
            client.post(f"{path}/{verb}")
            typer.echo(f"workload {name} {'suspended' if verb == 'suspend' else 'resumed'}")


def _register_verbs(group: typer.Typer, kind: str | None) -> None:
    label = (kind or "workload").lower()

    @group.command("list")
    def list_(
        what: Annotated[str | None, typer.Argument(help="jobs or workloads (Run:ai v1's `list jobs`); the same as nothing", show_default=False)] = None,
        project: ProjectOpt = None,
        all_projects: Annotated[bool, typer.Option("-A", "--all-projects")] = False,
        status: Annotated[str | None, typer.Option("--status", "--state", help="e.g. Running")] = None,
        output: Output = "table",
    ) -> None:
        """List workloads (columns like runai list)."""
        if what not in (None, "jobs", "workloads", "job", "workload"):
            raise CliError(f"list: unknown listing {what!r}; tessera list (or list jobs) lists "
                           "workloads, tessera project list lists projects")
        _list(kind, project, all_projects, status, output)

    @group.command("describe")
    def describe(name: str, project: ProjectOpt = None, output: Output = "table") -> None:
        """Placement, limits, isolation, events and why it is pending."""
        _describe(kind, name, project, output)

    @group.command("logs")
    def logs(
        name: str, project: ProjectOpt = None,
        follow: Annotated[bool, typer.Option("-f", "--follow")] = False,
        pod: Annotated[int, typer.Option("--pod")] = 0,
    ) -> None:
        """Print the workload's output."""
        _logs(kind, name, project, follow, pod)

    @group.command("exec")
    def exec_(
        name: str,
        command: Annotated[list[str] | None, typer.Argument()] = None,
        project: ProjectOpt = None,
        pod: Annotated[int, typer.Option("--pod")] = 0,
    ) -> None:
        """Run COMMAND in the workload's GPU environment (e.g. -- nvidia-smi)."""
        _exec(kind, name, command or [], project, pod)

    @group.command("bash")
    def bash(
        name: str, project: ProjectOpt = None, pod: Annotated[int, typer.Option("--pod")] = 0,
    ) -> None:
        """An interactive shell in the workload's GPU environment (Run:ai's runai bash)."""
        _exec(kind, name, ["bash"], project, pod)

    @group.command("delete")
    def delete(names: list[str], project: ProjectOpt = None) -> None:
        """Delete workloads (their processes are stopped)."""
        _action(kind, names, project, "delete")

    @group.command("suspend")
    def suspend(names: list[str], project: ProjectOpt = None) -> None:
        """Stop workloads, keeping them to resume later."""
        _action(kind, names, project, "suspend")

    @group.command("resume")
    def resume(names: list[str], project: ProjectOpt = None) -> None:
        """Queue suspended workloads again."""
        _action(kind, names, project, "resume")

    del label


_register_verbs(cli, None)
KIND_GROUPS = (("Training", "training"), ("Workspace", "workspace"), ("Inference", "inference"))


def _add_kind_groups(only: str | None) -> None:
    """The per-type groups (``tessera training submit``), built only when asked for: Typer
    builds every command on each run, and three groups of nine commands cost a CLI start-up."""
    for kind, name in KIND_GROUPS:
        if only is not None and only != name:
            continue
        group = typer.Typer(help=f"{kind} workloads (Run:ai v2 CLI spelling).",
                            no_args_is_help=True)
        _register_submit(group, kind, f"Submit a {kind.lower()}.")
        _register_verbs(group, kind)
        cli.add_typer(group, name=name)


@cli.command()
def wait(
    names: list[str],
    project: ProjectOpt = None,
    status: Annotated[str, typer.Option("--for", help="Status to wait for")] = "Running",
    timeout: Annotated[float, typer.Option(help="Seconds")] = 60.0,
) -> None:
    """Wait until every named workload has STATUS (exit 1 on timeout or if one ends otherwise)."""
    client, config = connect()
    deadline = time.monotonic() + timeout
    final = {"Completed", "Failed", "Stopped"}
    for name in names:
        while True:
            w = _find(client, config, name, project)
            if w["phase"] == status:
                break
            if w["phase"] in final and status not in final:
                raise CliError(f"workload {name} is {w['phase']}: {w['phaseMessage']}")
            if time.monotonic() > deadline:
                raise CliError(f"workload {name} is still {w['phase']} after {timeout:g} s: "
                               f"{w['phaseMessage']}")
            time.sleep(0.1)
    typer.echo(f"{', '.join(names)}: {status}")


@cli.command()
def top(output: Output = "table") -> None:
    """GPU occupancy: each device's allocated share and who holds it."""
    fmt = _fmt(output)
    client, _ = connect()
    c = client.get("/api/v1/cluster")
    if fmt != "table":
        render.dump(c, fmt)
        return
    kind = "SIMULATED GPUs (no NVIDIA driver here)" if c["simulated"] else f"driver {c['driver']}"
    lines = [f"{kind}; isolation: {c['isolation']}"]
    for node in c["nodes"]:
        lines.append(f"node {node['name']}")
        for g in node["gpus"]:
            # Shares come out of the memory less the headroom the driver keeps (shown apart).
            usable = g["memoryBytes"] - g.get("headroomBytes", 0)
            whole = any(h["exclusive"] for h in g["workloads"])
            allocated = usable if whole else min(g["allocatedBytes"], usable)
            frac = allocated / usable
            holders = ", ".join(
                f"{h['name']} ({'whole' if h['exclusive'] else render.size(h['bytes'])})"
                for h in g["workloads"]) or "idle"
            lines.append(
                f"  GPU {g['index']} {g['model']:<12} {render.size(g['memoryBytes']):>7} "
                f"[{render.bar(frac)}] {render.size(allocated)}/{render.size(usable)} "
                f"{frac:4.0%}  {holders}")
        if any(g.get("headroomBytes") for n in c["nodes"] for g in n["gpus"]):
            lines.append("(each GPU keeps back headroom for the driver and CUDA contexts: "
                         "shares come out of the rest)")
    typer.echo("\n".join(lines))


def _top_level_names() -> set[str]:
    names = {"project", "config"}
    for c in cli.registered_commands:
        callback = c.callback
        names.add(c.name or (callback.__name__.replace("_", "-") if callback else ""))
    return names


class _App:
    """The console script: runs the Typer app and turns every failure into one line and a code."""

    def __call__(self, args: list[str] | None = None) -> None:
        argv = list(sys.argv[1:] if args is None else args)
        RAW_ARGV[:] = argv
        TRAILING.clear()
        words = [a for a in argv if not a.startswith("-")][:2]
        if "submit" in words and "--" in argv:
            cut = argv.index("--")
            TRAILING.append(argv[cut + 1:])
            argv = argv[:cut]
        args = argv
        first = next((a for a in argv if not a.startswith("-")), None)
        names = {name for _, name in KIND_GROUPS}
        if first in names:
            _add_kind_groups(first)
        elif first is None or first not in _top_level_names():
            _add_kind_groups(None)
        try:
            result = cli(args=args, standalone_mode=False, prog_name="tessera")
        except CliError as exc:
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(exc.code)
        except KeyboardInterrupt:
            sys.exit(130)
        except Exception as exc:
            # Typer's (vendored) click raises usage errors and aborts here in non-standalone mode.
            if hasattr(exc, "format_message"):
                message = exc.format_message()
                if not message:
                    sys.exit(0)
                print(f"error: {message}", file=sys.stderr)
                sys.exit(1)
            if type(exc).__name__ == "Abort":
                print("error: aborted", file=sys.stderr)
                sys.exit(1)
            raise
        sys.exit(result if isinstance(result, int) else 0)


app = _App()

if __name__ == "__main__":
    app()
