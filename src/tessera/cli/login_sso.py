"""``tessera login --sso``: the OIDC device flow through the tessera server. The CLI shows the
provider's verification URL and code (and opens a browser where one is at hand), then polls
until the user approved; the token lands in the config file like any other."""

from __future__ import annotations

import contextlib
import time
import webbrowser
from typing import Any

import typer

from tessera.cli.client import Client, CliError, save_config


def login_sso(target: str, config: dict[str, Any], open_browser: bool = True) -> None:
    client = Client(target, None)
    start = client.post("/api/v1/auth/oidc/device")
    url = start.get("verificationUriComplete") or start["verificationUri"]
    typer.echo(f"To sign in, open {url} and enter the code {start['userCode']}", err=False)
    if open_browser:
        with contextlib.suppress(Exception):  # no browser here: the URL above is enough
            webbrowser.open(url)
    deadline = time.monotonic() + float(start["expiresIn"])
    interval = max(1.0, float(start.get("interval") or 5))
    while time.monotonic() < deadline:
        time.sleep(interval)
        try:
            reply = client.post("/api/v1/auth/oidc/device/token", {"deviceCode": start["deviceCode"]})
        except CliError as exc:
            if exc.status == 428:
                if "slow_down" in str(exc):
                    interval += 5
                continue
            raise
        config.update({"url": target, "token": str(reply["accessToken"])})
        config.pop("backend", None)
        save_config(config)
        groups = ", ".join(reply.get("groups") or []) or "none"
        typer.echo(f"logged in to {target} as {reply['username']} (groups: {groups})")
        return
    raise CliError("--sso: the code expired before it was approved; run tessera login --sso again")
