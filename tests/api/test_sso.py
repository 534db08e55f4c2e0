"""Single sign-on against a real OIDC provider (Dex, built from the Go module proxy): the console's
authorization code flow with PKCE (followed over HTTP, as a browser would) and the CLI's device
flow (``tessera login --sso``) both give a token naming the provider's user and its groups, and
the group's access rule is what that user may do."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tessera.testing.dex import GROUP, USER, Dex, sso_server
from tessera.testing.embedded import EmbeddedServer


@pytest.fixture(scope="module")
def sso(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EmbeddedServer, Dex]]:
    with sso_server(tmp_path_factory.mktemp("sso"), "researcher") as both:
        yield both


def _check_identity(server: EmbeddedServer, token: str) -> None:
    with httpx.Client(base_url=server.url, timeout=30,
                      headers={"Authorization": f"Bearer {token}"}) as c:
        me = c.get("/api/v1/me").json()
        assert me["kind"] == "sso" and me["name"] == USER and me["groups"] == [GROUP]
        projects = [p["name"] for p in c.get("/api/v1/org-unit/projects").json()["projects"]]
        assert projects == ["writers"]
        assert c.get("/api/v1/org-unit/projects/others").status_code == 404


def test_console_code_flow_with_pkce_gives_the_groups_rules(
        sso: tuple[EmbeddedServer, Dex]) -> None:
    server, dex = sso
    assert httpx.get(f"{server.url}/api/v1/auth/oidc").json() == {"enabled": True,
                                                                  "issuer": dex.issuer}
    r = httpx.get(f"{server.url}/api/v1/auth/oidc/login")
    assert r.status_code == 302
    location = r.headers["location"]
    assert location.startswith(dex.issuer) and "code_challenge_method=S256" in location
    final = httpx.get(location, follow_redirects=True, timeout=30)
    fragment = final.url.fragment
    m = re.fullmatch(r"/sso/([A-Za-z0-9_-]+)", fragment)
    assert m, (final.url, final.text[:500])
    _check_identity(server, m.group(1))
    # a replayed callback (same code and state) is refused
    back = [h for h in final.history if "/api/v1/auth/oidc/callback" in str(h.url)]
    again = httpx.get(str(back[0].url))
    assert again.status_code == 401


def test_cli_device_flow(sso: tuple[EmbeddedServer, Dex], tmp_path: Path) -> None:
    server, dex = sso
    env = {**server.env, "TESSERA_CONFIG": str(tmp_path / "cli.json"), "TESSERA_NO_BROWSER": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "tessera.cli.main", "login", "--sso"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    m = re.search(r"open (\S+) and enter the code (\S+)", line)
    assert m, line
    # the user approves at the provider (what a browser does on the verification page)
    r = httpx.post(f"{dex.issuer}/device/auth/verify_code", data={"user_code": m.group(2)},
                   follow_redirects=True, timeout=30)
    assert r.status_code == 200, r.text[:500]
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert f"as {USER} (groups: {GROUP})" in out
    token = json.loads((tmp_path / "cli.json").read_text())["token"]
    _check_identity(server, token)


def test_device_flow_answers_match_their_models(sso: tuple[EmbeddedServer, Dex]) -> None:
    """The device flow's REST answers, against a real provider, validate against the models
    /openapi.json documents (tests/api/test_response_models.py checks the other routes)."""
    from tessera.api.openapi_types import ROUTES

    server, dex = sso
    r = httpx.post(f"{server.url}/api/v1/auth/oidc/device")
    assert r.status_code == 200, r.text
    start = ROUTES[("POST", "/api/v1/auth/oidc/device")].model_validate(r.json())
    poll = httpx.post(f"{server.url}/api/v1/auth/oidc/device/token",
                      json={"deviceCode": r.json()["deviceCode"]})
    assert poll.status_code == 428, poll.text  # not approved yet
    assert httpx.post(f"{dex.issuer}/device/auth/verify_code", data={
        "user_code": r.json()["userCode"]}, follow_redirects=True, timeout=30).status_code == 200
    assert start is not None
    done = httpx.post(f"{server.url}/api/v1/auth/oidc/device/token",
                      json={"deviceCode": r.json()["deviceCode"]})
    assert done.status_code == 200, done.text
    token = ROUTES[("POST", "/api/v1/auth/oidc/device/token")].model_validate(done.json())
    assert token.username == USER and token.groups == [GROUP]  # type: ignore[attr-defined]
