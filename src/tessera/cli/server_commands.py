"""``tessera up``, ``down`` and ``login``: starting and stopping the local server, and logging in."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from tessera.cli.app import cli
from tessera.cli.client import (
    Client,
    CliError,
    get_token,
    load_config,
    local_credentials,
    save_config,
)
from tessera.core.errors import InvalidRequest
from tessera.settings import DEFAULT_PORT, data_dir

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
    gpu_compute_mode: Annotated[str, typer.Option("--gpu-compute-mode", envvar="TESSERA_GPU_COMPUTE_MODE", help="Cluster default compute-share mode: off (driver time-slicing), fair or strict (docs/compute-share.md)")] = "off",
    fair_share_history: Annotated[str | None, typer.Option("--fair-share-history", envvar="TESSERA_FAIR_SHARE_HISTORY", help="Time-based fair share: off (default) or window=7d,half-life=1d,k=1,save-every=30s (docs/scheduling.md)")] = None,
    fair_share_history_for: Annotated[list[str] | None, typer.Option("--fair-share-history-for", help="A department's own window and half-life, e.g. research:window=1d,half-life=6h (repeatable)")] = None,
    mig_serves_shares: Annotated[bool, typer.Option("--mig-serves-shares", envvar="TESSERA_MIG_SERVES_SHARES", help="A share no shared GPU can hold is served by the smallest MIG profile that holds it, on this machine's GPUs in MIG mode (docs/mig.md); on Kubernetes, label the nodes instead")] = False,
) -> None:
    """Start the control plane (REST API, scheduler, local runner) on this machine, or with
    --kubernetes the REST API for a cluster."""
    if gpu_compute_mode not in ("off", "fair", "strict"):
        raise CliError(f"--gpu-compute-mode: must be one of off, fair, strict (got {gpu_compute_mode!r})")
    os.environ["TESSERA_GPU_COMPUTE_MODE"] = gpu_compute_mode  # read by the server's validator
    if not kubernetes and (kubeconfig or context or image):
        raise CliError("--kubeconfig: needs --kubernetes (so do --context and --image)")
    if kubernetes and mig_serves_shares:
        raise CliError("--mig-serves-shares: embedded mode only; on Kubernetes an operator labels "
                       "the nodes tessera.io/mig-serves-shares=true (docs/mig.md)")
    history_argv = _history_argv(fair_share_history, fair_share_history_for, kubernetes)
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
    _check_port(port)
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
    if mig_serves_shares:
        argv.append("--mig-serves-shares")
    argv += history_argv
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


def _history_argv(text: str | None, overrides: list[str] | None, kubernetes: bool) -> list[str]:
    """The time-based fair share flags checked here (refused naming the flag and the rule) and
    passed on to the server."""
    if text is None and not overrides:
        return []
    if kubernetes:
        raise CliError("--fair-share-history: on Kubernetes it is the scheduler's setting (Helm "
                       "value policy.fairShareHistory, or tessera-scheduler --fair-share-history)")
    import argparse

    from tessera.api.fair_share_flags import history_from_args

    try:
        history_from_args(argparse.Namespace(fair_share_history=text, fair_share_history_for=overrides))
    except InvalidRequest as exc:
        raise CliError(str(exc)) from None
    argv = [] if text is None else ["--fair-share-history", text]
    for o in overrides or []:
        argv += ["--fair-share-history-for", o]
    return argv


def _check_port(port: int) -> None:
    """Refuse a port another process holds, before starting a server that would only die of it
    (its reason left in server.log)."""
    import errno
    import socket

    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise CliError(f"port {port} is in use; use --port or TESSERA_PORT") from None
            raise CliError(f"--port: cannot listen on 127.0.0.1:{port} ({exc.strerror})") from None


def _spawn(argv: list[str], directory: Path, url: str) -> subprocess.Popen[bytes]:
    """Start a detached server and wait until it answers."""
    directory.mkdir(parents=True, exist_ok=True)
    log = open(directory / "server.log", "ab")  # noqa: SIM115 - handed to the child
    before = log.tell()  # this start's lines only: the log is kept across starts
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            with open(directory / "server.log", "rb") as f:
                f.seek(before)
                log_text = f.read().decode(errors="replace")
            if "address already in use" in log_text.lower():
                port = url.rsplit(":", 1)[-1]
                raise CliError(f"port {port} is in use; use --port or TESSERA_PORT")
            tail = log_text.strip().splitlines()
            raise CliError(f"the server exited: {tail[-1] if tail else proc.returncode}"
                           f" (log: {directory}/server.log)")
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
    user: Annotated[str | None, typer.Option("--user", help="Sign in as this local user")] = None,
    password_stdin: Annotated[bool, typer.Option("--password-stdin", help="With --user: read the password from standard input")] = False,
    sso: Annotated[bool, typer.Option("--sso", help="Sign in through the server's single sign-on (browser or device code)")] = False,
) -> None:
    """Get an API token: --user NAME (a local user's password), --sso (single sign-on), an
    application's --client-id/--client-secret, or on the server's machine the local admin."""
    from tessera.cli.client import server_url

    config = load_config()
    directory = data_dir(data_dir_opt or config.get("dataDir"))
    target = (url or server_url(config)).rstrip("/")
    if user is not None or password_stdin:
        from tessera.cli.login_user import login_password

        login_password(target, user, password_stdin, config)
        return
    if sso:
        from tessera.cli.login_sso import login_sso

        login_sso(target, config, open_browser=os.environ.get("TESSERA_NO_BROWSER") != "1")
        return
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


@cli.command()
def logout() -> None:
    """Revoke the saved API token on the server and forget it here."""
    from tessera.cli.client import server_url

    config = load_config()
    token = config.get("token")
    if not token:
        typer.echo("not logged in (no saved token)")
        return
    target = str(config.get("url") or server_url(config)).rstrip("/")
    try:
        Client(target, token).delete("/api/v1/token")
        note = "token revoked"
    except CliError as exc:
        if exc.status != 401:
            raise
        note = "the token was already invalid"
    config.pop("token", None)
    save_config(config)
    typer.echo(f"logged out of {target} ({note})")
