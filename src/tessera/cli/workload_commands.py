"""Reading and acting on workloads: list, describe, logs, exec, suspend/resume/delete, wait, top; the per-type command groups."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Annotated, Any

import typer

from tessera.cli import render
from tessera.cli.app import KIND_PATH, Output, ProjectOpt, _fmt, _project, cli
from tessera.cli.client import (
    Client,
    CliError,
    connect,
)
from tessera.cli.flags import typed
from tessera.cli.submit_commands import FRAMEWORKS, _register_submit
from tessera.core.request_text import mig_placement_text

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
            pclass, g.get("request") or "-", f"{g['allocated']:.2f} ({g['requested']:.2f})",
            f"{running} ({workers - running if phase == 'Pending' else 0})",
            ",".join(urls or []),
        ])
    out = [f"Showing workloads for {scope}"
           + (" — GPUs are SIMULATED (no NVIDIA driver here)" if simulated else "")]
    out.append(render.table(["NAME", "STATUS", "AGE", "NODE", "GPU", "IMAGE", "TYPE", "PROJECT",
                             "PRIORITY", "REQUEST", "GPUs Allocated (Requested)", "PODs Running (Pending)",
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
    lines += [x for x in (elastic_line(w),) if x]
    if w.get("gang") or (w.get("minWorkers") or 1) > 1:
        lines.append(f"Gang:        {w.get('minWorkers')} of {w['workers']} pod(s) start "
                     "together" + (f" ({w['gang']})" if w.get("gang") else ""))
    lines += [
        f"GPUs:        {'SIMULATED (no NVIDIA driver here)' if w['simulated'] else 'real (NVML)'}",
        f"Request:     {w['gpus']['request']} "
        f"(= {w['gpus']['requested']:.2f} GPUs; allocated {w['gpus']['allocated']:.2f})",
        f"Isolation:   {w['isolation']}",
        *([f"Compute:     {w['computeShare']['text']}"] if w.get("computeShare") else []),
        f"Scheduler:   {w['scheduler']}",
        f"Image:       {w.get('image') or '-'}"
        + (" (its entrypoint runs)" if w.get("image") and not spec["command"] else ""),
        f"Command:     {' '.join(x for x in (spec['command'], spec['args']) if x) or '-'}",
        f"Service URL: {', '.join(w.get('serviceUrls') or []) or '-'}",
        f"Created:     {w['createdAt']}   Started: {w['startedAt'] or '-'}   "
        f"Completed: {w['completedAt'] or '-'}",
    ]
    for pod in w["pods"]:
        lines += pod_lines(pod)
    lines.append("Events:")
    ev_rows = [[e["time"], e["kind"], e["message"]] for e in w["events"]]
    lines += ["  " + line for line in render.table(["TIME", "EVENT", "MESSAGE"], ev_rows).splitlines()]
    typer.echo("\n".join(lines))


def elastic_line(w: dict[str, Any]) -> str | None:
    """``describe``'s line for an elastic workload (resized while it runs), else None."""
    low, high = w.get("minWorkers") or w["workers"], w["workers"]
    if low >= high:
        return None
    line = (f"Elastic:     {w.get('runningPods', 0)} of {low} to {high} pod(s) running (grows "
            f"into idle GPUs, shrinks back to {low})")
    wait = w.get("elasticWaiting")  # the last cycle's reason it is below its maximum
    return f"{line}; {wait}" if wait else line


def pod_lines(pod: dict[str, Any]) -> list[str]:
    """A pod of ``describe``: where it runs, then its GPUs (devices with their share, or its MIG
    partition), then its log."""
    where = (f"{pod['namespace']}/{pod['name']} " if pod.get("name") else "") + (
        f"on {pod['nodeName']}" if pod["nodeName"] else "not bound")
    lines = [f"Pod {pod['index']}:       {pod['phase']} {where}"
             + (f", pid {pod['pid']}" if pod.get("pid") else "")
             + (f", exit code {pod['exitCode']}" if pod["exitCode"] is not None else "")]
    for d in pod["gpuDevices"]:
        share = "whole device" if pod["exclusive"] else (
            f"request {render.size(d['requestBytes'])}, limit {render.size(d['limitBytes'])}")
        lines.append(f"  GPU {d['index']} {d['uuid'] or '(UUID chosen by the device plugin)'}:"
                     f" {share}")
    mig = pod.get("migDevice") or pod.get("migPartition")  # embedded / Kubernetes
    if mig:
        lines.append("  " + mig_placement_text(
            {"gpuIndex": mig.get("gpuIndex", mig.get("gpu")), **mig}))
    if pod.get("logPath"):
        lines.append(f"  Log: {pod['logPath']}")
    return lines


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
        if kind == "Training":
            for fw in FRAMEWORKS:
                sub = typer.Typer(help=f"Distributed {fw} training: --workers N start together "
                                  f"(Run:ai's runai training {fw} submit).", no_args_is_help=True)
                _register_submit(sub, kind, f"Submit a distributed {fw} training (a gang of "
                                 "--workers pods with the rendezvous variables set).", fw)
                group.add_typer(sub, name=fw)
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
                f"{h['name']} ({'whole' if h['exclusive'] else render.size(h['bytes'])}"
                + (f", GPU time {h['gpuTime1s']:.0%}" if "gpuTime1s" in h else "") + ")"
                for h in g["workloads"]) or "idle"
            lines.append(
                f"  GPU {g['index']} {g['model']:<12} {render.size(g['memoryBytes']):>7} "
                f"[{render.bar(frac)}] {render.size(allocated)}/{render.size(usable)} "
                f"{frac:4.0%}  {holders}")
        for g in node.get("migGpus") or []:  # embedded mode's GPUs in MIG mode (docs/mig.md)
            parts = ", ".join(f"{p['profile']}@{p['start']} {p['workload'] or 'idle'}"
                              + ("" if p["managed"] else " (not tessera's)")
                              for p in g["partitions"] or []) or "not cut"
            lines.append(f"  NVML GPU {g['index']} {g['model']} in MIG mode: {parts}")
        if any(g.get("headroomBytes") for n in c["nodes"] for g in n["gpus"]):
            lines.append("(each GPU keeps back headroom for the driver and CUDA contexts: "
                         "shares come out of the rest)")
    typer.echo("\n".join(lines))
