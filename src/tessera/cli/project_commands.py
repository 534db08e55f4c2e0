"""``tessera project ...`` and ``tessera config project``."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from tessera.api.fair_share_doc import fair_share_text
from tessera.cli import render
from tessera.cli.app import Output, _fmt, config_app, project_app
from tessera.cli.client import (
    CliError,
    connect,
    save_config,
)
from tessera.cli.flags import _project_fields, flagged

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
    department: Annotated[str | None, typer.Option("--department", help="Its department (whose quota bounds its projects')")] = None,
) -> None:
    """Create a project with a GPU quota."""
    client, _ = connect()
    body = {"name": name, **_project_body(deserved, limit, weight, priority)}
    if department:
        body["parentId"] = department
    try:
        p = client.post("/api/v1/org-unit/projects", body)
    except CliError as exc:
        raise flagged(exc, {**_project_fields(), "parentId": "--department"}) from None
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


@project_app.command("describe")
def project_describe(name: str, output: Output = "table") -> None:
    """A project's quota, what it holds, and its fair share (of which how much from usage history)."""
    fmt = _fmt(output)
    client, _ = connect()
    p = client.get(f"/api/v1/org-unit/projects/{name}")
    if fmt != "table":
        render.dump(p, fmt)
        return
    gpu, status = p["resources"]["gpu"], p.get("status") or {}
    lines = [f"project {p['name']}" + (f" (department {p['parentId']})" if p.get("parentId") else ""),
             f"deserved {gpu['deserved']:g} GPU, limit {_quota(gpu['limit'])}, "
             f"over-quota weight {gpu['overQuotaWeight']:g}, priority {p['priority']}",
             f"allocated {render.gpus(status.get('allocated', {}).get('gpu', 0.0))} GPU",
             fair_share_text(status) or "fair share: not computed yet (no scheduling cycle has run)"]
    hours = status.get("usageGpuHours")
    if hours:
        lines.append(f"usage history {hours:g} GPU-hours (decayed)")
    typer.echo("\n".join(lines))


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
