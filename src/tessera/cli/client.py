"""The CLI's side of the REST API: settings, token and one-line errors.

Exit codes: 0 ok, 1 user error (refused request, unknown name, bad flag), 2 server unreachable.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx

from tessera.local.paths import DEFAULT_PORT, config_file, data_dir


class CliError(Exception):
    """A one-line error for the user; ``code`` is the exit status."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def load_config() -> dict[str, Any]:
    path = config_file()
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    except (OSError, ValueError):
        return {}


def save_config(values: dict[str, Any]) -> None:
    path = config_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(values, f, indent=1)


def local_server(directory: Path | None = None) -> dict[str, Any] | None:
    d = directory or data_dir(load_config().get("dataDir"))
    try:
        info: dict[str, Any] = json.loads((d / "server.json").read_text())
        return info
    except (OSError, ValueError):
        return None


def server_url(config: dict[str, Any]) -> str:
    env = os.environ.get("TESSERA_URL")
    if env:
        return env.rstrip("/")
    if config.get("url"):
        return str(config["url"]).rstrip("/")
    info = local_server()
    if info and info.get("url"):
        return str(info["url"])
    return f"http://127.0.0.1:{DEFAULT_PORT}"


def local_credentials(directory: Path | None = None) -> dict[str, str] | None:
    d = directory or data_dir(load_config().get("dataDir"))
    try:
        creds: dict[str, str] = json.loads((d / "credentials.json").read_text())
        return creds
    except (OSError, ValueError):
        return None


class Client:
    def __init__(self, url: str, token: str | None, timeout: float = 30.0) -> None:
        self.url = url
        self.token = token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=url, headers=headers, timeout=timeout)

    def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            r = self.http.request(method, path, **kw)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError) as exc:
            raise CliError(
                f"cannot reach the tessera server at {self.url} ({type(exc).__name__}); "
                "start it with: tessera up",
                2,
            ) from None
        except httpx.TimeoutException:
            raise CliError(f"the tessera server at {self.url} did not answer in time", 2) from None
        if r.status_code >= 400:
            try:
                message = r.json().get("message") or r.text
            except ValueError:
                message = r.text or r.reason_phrase
            if r.status_code == 401:
                message = f"{message} (run: tessera login)"
            raise CliError(str(message).replace("\n", " "), 1)
        return r

    def get(self, path: str, **kw: Any) -> Any:
        return self.request("GET", path, **kw).json()

    def post(self, path: str, body: Any = None) -> Any:
        r = self.request("POST", path, json=body)
        return r.json() if r.content else None

    def put(self, path: str, body: Any) -> Any:
        return self.request("PUT", path, json=body).json()

    def delete(self, path: str) -> None:
        self.request("DELETE", path)


def get_token(url: str, client_id: str, secret: str) -> str:
    c = Client(url, None)
    body = {"grantType": "client_credentials", "clientId": client_id, "clientSecret": secret}
    return str(c.post("/api/v1/token", body)["accessToken"])


def connect() -> tuple[Client, dict[str, Any]]:
    """A client for the configured server, logging in with the local admin when no token is set."""
    config = load_config()
    url = server_url(config)
    token = os.environ.get("TESSERA_TOKEN") or config.get("token")
    if not token:
        creds = local_credentials()
        if creds is None:
            raise CliError("not logged in: run tessera login", 1)
        token = get_token(url, creds["clientId"], creds["clientSecret"])
        config.update({"url": url, "token": token})
        save_config(config)
    return Client(url, token), config
