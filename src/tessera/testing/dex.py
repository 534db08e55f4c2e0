"""Dex, a real OIDC provider, for the single sign-on tests: built from the Go module proxy by
``tessera.testing.binaries`` (pinned), started on a free loopback port with an in-memory store,
one static client (tessera) and Dex's ``mockCallback`` connector, which signs in the fixed user
``kilgore@kilgore.trout`` in groups ``authors`` without a form (so a test can follow the
redirects), with the approval screen skipped. With ``tls`` (certificate, key, CA) it serves
HTTPS, as kube-apiserver requires of an OIDC issuer."""

from __future__ import annotations

import contextlib
import os
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from tessera.testing import binaries
from tessera.testing.embedded import EmbeddedServer, free_port

USER = "kilgore@kilgore.trout"
GROUP = "authors"
CLIENT_ID = "tessera"
CLIENT_SECRET = "tessera-test-secret"


class Dex:
    def __init__(self, root: Path, redirect_uris: list[str],
                 tls: tuple[Path, Path, Path] | None = None) -> None:
        self.root = root
        self.port = free_port()
        self.tls = tls
        self.issuer = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}/dex"
        self.redirect_uris = redirect_uris
        self.proc: subprocess.Popen[bytes] | None = None

    def config(self) -> str:
        uris = "\n".join(f"      - {u}" for u in [*self.redirect_uris, "/dex/device/callback"])
        return f"""issuer: {self.issuer}
storage:
  type: memory
web:
{self._web()}
oauth2:
  skipApprovalScreen: true
staticClients:
  - id: {CLIENT_ID}
    name: tessera
    secret: {CLIENT_SECRET}
    redirectURIs:
{uris}
connectors:
  - type: mockCallback
    id: mock
    name: Example
enablePasswordDB: false
"""

    def _web(self) -> str:
        if self.tls is None:
            return f"  http: 127.0.0.1:{self.port}"
        cert, key, _ = self.tls
        return f"  https: 127.0.0.1:{self.port}\n  tlsCert: {cert}\n  tlsKey: {key}"

    @property
    def verify(self) -> ssl.SSLContext | bool:
        """What an HTTPS client checks Dex's certificate against."""
        return ssl.create_default_context(cafile=str(self.tls[2])) if self.tls else True

    def start(self) -> Dex:
        dex = binaries.ensure(["dex"])["dex"]
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "dex.yaml").write_text(self.config())
        log = open(self.root / "dex.log", "ab")  # noqa: SIM115 - owned by the child
        self.proc = subprocess.Popen([str(dex), "serve", str(self.root / "dex.yaml")],
                                     stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dex exited: {(self.root / 'dex.log').read_text()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.issuer}/.well-known/openid-configuration",
                             timeout=0.5, verify=self.verify).status_code == 200:
                    return self
            time.sleep(0.1)
        raise RuntimeError("dex did not answer in 30 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextlib.contextmanager
def sso_server(root: Path, role: str) -> Iterator[tuple[EmbeddedServer, Dex]]:
    """An embedded server signing in through a Dex of its own (``TESSERA_OIDC_*`` set while the
    block runs), with projects ``writers`` and ``others`` and ``GROUP`` given ``role`` on
    ``writers``; both stopped after."""
    port = free_port()
    dex = Dex(root / "dex", [f"http://127.0.0.1:{port}/api/v1/auth/oidc/callback"]).start()
    saved = dict(os.environ)
    os.environ.update({"TESSERA_OIDC_ISSUER": dex.issuer, "TESSERA_OIDC_CLIENT_ID": CLIENT_ID,
                       "TESSERA_OIDC_CLIENT_SECRET": CLIENT_SECRET})
    s = EmbeddedServer(root / "tessera", port=port)
    try:
        s.start()
        with s.http() as admin:
            for p in ("writers", "others"):
                admin.post("/api/v1/org-unit/projects", json={"name": p}).raise_for_status()
            r = admin.post("/api/v1/authorization/access-rules", json={
                "subjectType": "group", "subjectId": GROUP, "roleName": role,
                "scopeType": "project", "scopeId": "writers"})
            assert r.status_code == 201, r.text
        yield s, dex
    finally:
        os.environ.clear()
        os.environ.update(saved)
        s.cleanup()
        dex.stop()
