"""``tessera login --user NAME [--password-stdin]``: a user's token
saved in the CLI's config file (``TESSERA_CONFIG``) like an application's."""

from __future__ import annotations

import getpass
import sys
from typing import Any

import typer

from tessera.cli.client import Client, CliError, save_config


def login_password(target: str, user: str | None, password_stdin: bool,
                   config: dict[str, Any]) -> None:
    if not user:
        raise CliError("--user: is required with --password-stdin")
    if password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
        if not password:
            raise CliError("--password-stdin: standard input gave no password")
    else:
        password = getpass.getpass(f"Password for {user}: ")
    reply = Client(target, None).post("/api/v1/token", {
        "grantType": "password", "username": user, "password": password})
    token = str(reply["accessToken"])
    config.update({"url": target, "token": token})
    config.pop("backend", None)
    save_config(config)
    if reply.get("mustChangePassword"):
        typer.echo(f"logged in to {target} as {user}; the first password must be changed: "
                   "tessera user password")
        return
    typer.echo(f"logged in to {target} as {user}")

