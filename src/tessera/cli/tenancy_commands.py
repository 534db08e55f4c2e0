"""``tessera user``, ``access-rule``, ``department``, ``audit`` and ``report usage``: tenancy
(docs/tenancy.md, docs/accounting.md) through the REST API."""

from __future__ import annotations

import csv
import io
import sys
from typing import Annotated, Any

import typer

from tessera.cli import render
from tessera.cli.app import Output, _fmt, cli
from tessera.cli.client import CliError, connect

user_app = typer.Typer(help="Local users (sign in with tessera login --user).",
                       no_args_is_help=True)
rule_app = typer.Typer(help="Access rules: a role for a user, group or app on a scope.",
                       no_args_is_help=True)
department_app = typer.Typer(help="Departments: groups of projects with a GPU quota.",
                             no_args_is_help=True)
report_app = typer.Typer(help="Reports: GPU-hours for cost sharing.", no_args_is_help=True)
cli.add_typer(user_app, name="user")
cli.add_typer(rule_app, name="access-rule")
cli.add_typer(department_app, name="department")
cli.add_typer(report_app, name="report")

PasswordStdin = Annotated[bool, typer.Option("--password-stdin",
                                             help="Read the password from standard input")]


def read_stdin_password(flag: str = "--password-stdin") -> str:
    value = sys.stdin.readline().rstrip("\r\n")
    if not value:
        raise CliError(f"{flag}: standard input gave no password")
    return value


# -- users ---------------------------------------------------------------------------------------


@user_app.command("create")
def user_create(name: str, password_stdin: PasswordStdin = False) -> None:
    """Create a local user; without --password-stdin a first password is generated and
    printed once (it must be changed at first sign-in)."""
    body: dict[str, Any] = {"username": name}
    if password_stdin:
        body["password"] = read_stdin_password()
    client, _ = connect()
    try:
        doc = client.post("/api/v1/users", body)
    except CliError as exc:
        raise _flag(exc, {"password": "--password-stdin", "username": "NAME"}) from None
    if "tempPassword" in doc:
        typer.echo(f"user {name} created; first password (change it at first sign-in): "
                   f"{doc['tempPassword']}")
    else:
        typer.echo(f"user {name} created")


@user_app.command("list")
def user_list(output: Output = "table") -> None:
    """Local and single sign-on users."""
    client, _ = connect()
    users = client.get("/api/v1/users")["users"]
    if _fmt(output) != "table":
        render.dump(users, output)
        return
    typer.echo(render.table(["NAME", "SOURCE", "MUST CHANGE PASSWORD", "CREATED BY"],
                            [[u["username"], u["source"], "yes" if u["mustChangePassword"]
                              else "no", u["createdBy"]] for u in users]))


@user_app.command("delete")
def user_delete(name: str) -> None:
    """Delete a user with its access rules; its tokens stop working at once."""
    client, _ = connect()
    client.delete(f"/api/v1/users/{name}")
    typer.echo(f"user {name} deleted")


@user_app.command("password")
def user_password(password_stdin: PasswordStdin = False) -> None:
    """Change your own password (required after a generated first password). With
    --password-stdin: the current password on the first line, the new one on the second."""
    import getpass

    if password_stdin:
        current = read_stdin_password()
        new = read_stdin_password()
    else:
        current = getpass.getpass("Current password: ")
        new = getpass.getpass("New password: ")
    client, _ = connect()
    try:
        client.post("/api/v1/me/password", {"currentPassword": current, "newPassword": new})
    except CliError as exc:
        raise _flag(exc, {"newPassword": "new password", "currentPassword": "current password"}
                    ) from None
    typer.echo("password changed; sign in again: tessera login --user NAME")


# -- access rules --------------------------------------------------------------------------------


@rule_app.command("create")
def rule_create(
    role: Annotated[str, typer.Option("--role", help="admin, department-admin, researcher or viewer")],
    user: Annotated[str | None, typer.Option("--user", help="A user")] = None,
    group: Annotated[str | None, typer.Option("--group", help="A single sign-on group")] = None,
    app: Annotated[str | None, typer.Option("--app", help="An application")] = None,
    project: Annotated[str | None, typer.Option("--project", "-p", help="Scope: a project")] = None,
    department: Annotated[str | None, typer.Option("--department", help="Scope: a department")] = None,
    cluster: Annotated[bool, typer.Option("--cluster", help="Scope: the whole cluster")] = False,
) -> None:
    """Give a role to one subject on one scope."""
    subjects = [(k, v) for k, v in (("user", user), ("group", group), ("app", app)) if v]
    if len(subjects) != 1:
        raise CliError("--user: give exactly one of --user, --group, --app")
    scopes = [(k, v) for k, v in (("project", project), ("department", department)) if v]
    if cluster:
        scopes.append(("cluster", ""))
    if len(scopes) != 1:
        raise CliError("--project: give exactly one of --project, --department, --cluster")
    body = {"subjectType": subjects[0][0], "subjectId": subjects[0][1], "roleName": role,
            "scopeType": scopes[0][0], "scopeId": scopes[0][1]}
    client, _ = connect()
    try:
        rule = client.post("/api/v1/authorization/access-rules", body)
    except CliError as exc:
        raise _flag(exc, {"roleName": "--role", "scopeId": f"--{scopes[0][0]}",
                          "subjectId": f"--{subjects[0][0]}"}) from None
    typer.echo(f"access rule {rule['id']} created: {rule['subjectType']} {rule['subjectId']} "
               f"is {rule['roleName']} on {_scope(rule)}")


def _scope(rule: dict[str, Any]) -> str:
    return "the cluster" if rule["scopeType"] == "cluster" else \
        f"{rule['scopeType']} {rule['scopeId']}"


@rule_app.command("list")
def rule_list(output: Output = "table") -> None:
    """The access rules you may read."""
    client, _ = connect()
    rules = client.get("/api/v1/authorization/access-rules")["accessRules"]
    if _fmt(output) != "table":
        render.dump(rules, output)
        return
    typer.echo(render.table(["ID", "SUBJECT", "ROLE", "SCOPE", "CREATED BY"],
                            [[r["id"], f"{r['subjectType']} {r['subjectId']}", r["roleName"],
                              _scope(r), r["createdBy"]] for r in rules]))


@rule_app.command("delete")
def rule_delete(rule_id: str) -> None:
    """Delete an access rule (by the ID tessera access-rule list shows)."""
    client, _ = connect()
    client.delete(f"/api/v1/authorization/access-rules/{rule_id}")
    typer.echo(f"access rule {rule_id} deleted")


# -- departments ---------------------------------------------------------------------------------


def _quota(deserved: float, limit: float | None, weight: float) -> dict[str, Any]:
    return {"resources": {"gpu": {"deserved": deserved, "limit": limit,
                                  "overQuotaWeight": weight}}}


DEPARTMENT_FIELDS = {"resources.gpu.deserved": "--deserved", "resources.gpu.limit": "--limit",
                     "resources.gpu.overQuotaWeight": "--over-quota-weight", "name": "NAME"}


@department_app.command("create")
def department_create(
    name: str,
    deserved: Annotated[float, typer.Option("--deserved", "--gpu", help="GPUs its projects may deserve in all")] = 0.0,
    limit: Annotated[float | None, typer.Option("--limit", help="Most GPUs its projects may use together (the scheduler holds back what would go past it)")] = None,
    weight: Annotated[float, typer.Option("--over-quota-weight")] = 1.0,
) -> None:
    """Create a department (projects join it with tessera project create --department)."""
    client, _ = connect()
    try:
        client.post("/api/v1/org-unit/departments", {"name": name, **_quota(deserved, limit, weight)})
    except CliError as exc:
        raise _flag(exc, DEPARTMENT_FIELDS) from None
    typer.echo(f"department {name} created (deserved {deserved:g} GPUs"
               f"{'' if limit is None else f', limit {limit:g}'})")


@department_app.command("update")
def department_update(
    name: str,
    deserved: Annotated[float | None, typer.Option("--deserved", "--gpu")] = None,
    limit: Annotated[float | None, typer.Option("--limit")] = None,
    no_limit: Annotated[bool, typer.Option("--no-limit")] = False,
    weight: Annotated[float | None, typer.Option("--over-quota-weight")] = None,
) -> None:
    """Change a department's quota (never below what its projects deserve)."""
    client, _ = connect()
    gpu = client.get(f"/api/v1/org-unit/departments/{name}")["resources"]["gpu"]
    body = _quota(gpu["deserved"] if deserved is None else deserved,
                  None if no_limit else (gpu["limit"] if limit is None else limit),
                  gpu["overQuotaWeight"] if weight is None else weight)
    try:
        client.put(f"/api/v1/org-unit/departments/{name}", body)
    except CliError as exc:
        raise _flag(exc, DEPARTMENT_FIELDS) from None
    typer.echo(f"department {name} updated")


@department_app.command("list")
def department_list(output: Output = "table") -> None:
    """Departments you may read, with their projects."""
    client, _ = connect()
    ds = client.get("/api/v1/org-unit/departments")["departments"]
    if _fmt(output) != "table":
        render.dump(ds, output)
        return
    rows = []
    for d in ds:
        g = d["resources"]["gpu"]
        rows.append([d["name"], f"{g['deserved']:g}", "-" if g["limit"] is None
                     else f"{g['limit']:g}", f"{d['projectsDeserved']:g}",
                     ",".join(d["projects"]) or "-"])
    typer.echo(render.table(["NAME", "DESERVED", "LIMIT", "PROJECTS DESERVE", "PROJECTS"], rows))


@department_app.command("delete")
def department_delete(name: str) -> None:
    """Delete an empty department."""
    client, _ = connect()
    client.delete(f"/api/v1/org-unit/departments/{name}")
    typer.echo(f"department {name} deleted")


# -- audit and reports ---------------------------------------------------------------------------


@cli.command("audit")
def audit(
    since: Annotated[str | None, typer.Option("--from", help="ISO 8601, e.g. 2026-11-27T00:00:00Z")] = None,
    until: Annotated[str | None, typer.Option("--to", help="ISO 8601")] = None,
    limit: Annotated[int, typer.Option("--limit")] = 100,
    output: Output = "table",
) -> None:
    """The audit trail (admins): every change, who made it, from where, and the result."""
    client, _ = connect()
    try:
        entries = client.get("/api/v1/audit/log", {"from": since, "to": until,
                                                   "limit": limit})["entries"]
    except CliError as exc:
        raise _flag(exc, {"from": "--from", "to": "--to", "limit": "--limit"}) from None
    if _fmt(output) != "table":
        render.dump(entries, output)
        return
    typer.echo(render.table(["TIME", "WHO", "FROM", "WHAT", "STATUS", "RESULT"],
                            [[e["timestamp"], e["subject"], e["source"],
                              f"{e['method']} {e['path']}", str(e["httpStatus"]),
                              e["result"][:80]] for e in entries]))


@report_app.command("usage")
def report_usage(
    since: Annotated[str, typer.Option("--from", help="ISO 8601 start")],
    until: Annotated[str, typer.Option("--to", help="ISO 8601 end")],
    by: Annotated[str, typer.Option("--by", help="project, department, user or workload")] = "project",
    output: Annotated[str, typer.Option("-o", "--output", help="table, json or csv")] = "table",
) -> None:
    """GPU-hours allocated (and used, where measured) per project, department, user or
    workload over a time range."""
    if output not in ("table", "json", "csv"):
        raise CliError(f"-o/--output: must be table, json or csv (got {output!r})")
    client, _ = connect()
    try:
        rows = client.get("/api/v1/reports/usage", {"from": since, "to": until, "by": by})["rows"]
    except CliError as exc:
        raise _flag(exc, {"from": "--from", "to": "--to", "by": "--by"}) from None
    keys = [by, "gpu_hours_allocated", "gpu_hours_used"]
    if output == "json":
        render.dump(rows, "json")
    elif output == "csv":
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=keys, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
        sys.stdout.write(out.getvalue())
    else:
        typer.echo(render.table([by.upper(), "GPU-HOURS ALLOCATED", "GPU-HOURS USED"],
                                [[str(r[by]), f"{r['gpu_hours_allocated']:.2f}",
                                  "-" if r.get("gpu_hours_used") is None
                                  else f"{r['gpu_hours_used']:.2f}"] for r in rows]))


def _flag(exc: CliError, names: dict[str, str]) -> CliError:
    """The server's field names in a refusal replaced by the flags the user wrote."""
    message = str(exc)
    for field, flag in names.items():
        if message.startswith(f"{field}:"):
            message = flag + message[len(field):]
            break
    return CliError(message, exc.code, exc.status)
