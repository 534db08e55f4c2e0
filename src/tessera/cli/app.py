"""The Typer app and what every command shares: output formats, the project and backend in use."""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer

from tessera.cli import render
from tessera.cli.client import (
    Client,
    CliError,
    save_config,
)

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
