"""The CLI's side of the REST API: settings, token and one-line errors.

Exit codes: 0 ok, 1 user error (refused request, unknown name, bad flag), 2 server unreachable.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import urllib.parse
from pathlib import Path
from typing import Any

from tessera.settings import DEFAULT_PORT, config_file, data_dir


class CliError(Exception):
    """A one-line error for the user; ``code`` is the exit status."""

    def __init__(self, message: str, code: int = 1, status: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.status = status
        """The HTTP status when the server refused the request."""


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


class Reply:
    def __init__(self, status: int, headers: dict[str, str], content: bytes) -> None:
        self.status_code = status
        self.headers = headers
        self.content = content

    def json(self) -> Any:
        return json.loads(self.content)


class Client:
    """A small keep-alive HTTP client (http.client): the CLI starts in a fraction of the time
    httpx needs, which matters for a command run thousands of times a day."""

    def __init__(self, url: str, token: str | None, timeout: float = 30.0) -> None:
        self.url = url
        self.token = token
        self.timeout = timeout
        parts = urllib.parse.urlsplit(url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or (443 if self._https else 80)
        self._prefix = parts.path.rstrip("/")
        self._conn: http.client.HTTPConnection | None = None

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            if self._https:
                self._conn = http.client.HTTPSConnection(self._host, self._port,
                                                         timeout=self.timeout)
            else:
                self._conn = http.client.HTTPConnection(self._host, self._port,
                                                        timeout=self.timeout)
        return self._conn

    def request(self, method: str, path: str, params: dict[str, Any] | None = None,
                json_body: Any = None) -> Reply:
        target = self._prefix + path
        if params:
            target += "?" + urllib.parse.urlencode(
                {k: v for k, v in params.items() if v is not None}, doseq=True)
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        body = None
        if json_body is not None:
            body = json.dumps(json_body).encode()
            headers["Content-Type"] = "application/json"
        for attempt in (0, 1):
            conn = self._connection()
            try:
                conn.request(method, target, body=body, headers=headers)
                resp = conn.getresponse()
                reply = Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
                break
            except (ConnectionRefusedError, socket.gaierror) as exc:
                raise CliError(
                    f"cannot reach the tessera server at {self.url} ({type(exc).__name__}); "
                    "start it with: tessera up", 2) from None
            except TimeoutError:
                raise CliError(f"the tessera server at {self.url} did not answer in time",
                               2) from None
            except (http.client.HTTPException, OSError) as exc:
                conn.close()
                self._conn = None
                if attempt:
                    raise CliError(f"cannot reach the tessera server at {self.url} "
                                   f"({type(exc).__name__}); start it with: tessera up", 2) from None
        if reply.status_code >= 400:
            try:
                message = reply.json().get("message") or reply.content.decode()
            except ValueError:
                message = reply.content.decode(errors="replace") or str(reply.status_code)
            if reply.status_code == 401 and "tessera login" not in str(message):
                message = f"{message} (run: tessera login)"
            raise CliError(str(message).replace("\n", " "), 1, reply.status_code)
        return reply

    def get(self, path: str, params: dict[str, Any] | None = None) -> Any:
        return self.request("GET", path, params=params).json()

    def post(self, path: str, body: Any = None) -> Any:
        r = self.request("POST", path, json_body=body)
        return r.json() if r.content else None

    def put(self, path: str, body: Any) -> Any:
        return self.request("PUT", path, json_body=body).json()

    def patch(self, path: str, body: Any) -> Any:
        return self.request("PATCH", path, json_body=body).json()

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
