"""kube-apiserver and tessera trusting the same OIDC issuer (docs/tenancy.md#single-sign-on-oidc):
a real Dex serving HTTPS with a CA and certificate made here, a real kube-apiserver started with
``--oidc-issuer-url`` and friends pointing at it, and tessera's API server (as its
ServiceAccount, with deploy/api-rbac.yaml) using the same issuer. One Dex ID token for the user
``kilgore@kilgore.trout`` (group ``authors``) is given to kubectl: Kubernetes authenticates it
as that user and group, and the RoleBindings tessera made from its access rules allow and deny
exactly what tessera's own API does; deleting the rule takes the access away in both."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urljoin, urlparse

import httpx
import pytest
from lightkube.resources.rbac_authorization_v1 import RoleBinding

from tessera.kube import names
from tessera.kube.tenancy_sync import MANAGED
from tessera.testing import pki
from tessera.testing.cluster import TestCluster, kubeconfig_text
from tessera.testing.dex import CLIENT_ID, CLIENT_SECRET, GROUP, USER, Dex
from tessera.testing.embedded import free_port
from tessera.testing.kube_api import KubeApiServer
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[3]
CALLBACK = "http://127.0.0.1:9/oidc-test-callback"
"""A redirect URI nothing serves: the test reads the code from the redirect itself."""


class OidcApiServer(KubeApiServer):
    def __init__(self, root: Path, kubeconfig: Path, port: int, dex: Dex) -> None:
        super().__init__(root, kubeconfig, port=port)
        self.dex = dex

    @property
    def env(self) -> dict[str, str]:
        assert self.dex.tls is not None
        return {**super().env, "TESSERA_OIDC_ISSUER": self.dex.issuer,
                "TESSERA_OIDC_CLIENT_ID": CLIENT_ID, "TESSERA_OIDC_CLIENT_SECRET": CLIENT_SECRET,
                "SSL_CERT_FILE": str(self.dex.tls[2])}  # the issuer's private CA


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[tuple[TestCluster, Dex, OidcApiServer]]:
    root = tmp_path_factory.mktemp("kube-oidc")
    ca = pki.generate(root / "dex-ca")
    cert, key = pki.issue_serving_cert(ca, root / "dex-tls", "dex", ["127.0.0.1"])
    api_port = free_port()
    dex = Dex(root / "dex", [f"http://127.0.0.1:{api_port}/api/v1/auth/oidc/callback", CALLBACK],
              tls=(cert, key, ca.ca_cert)).start()
    cluster = TestCluster(device_classes=False, extra_args={"kube-apiserver": [
        f"--oidc-issuer-url={dex.issuer}", f"--oidc-client-id={CLIENT_ID}",
        f"--oidc-ca-file={ca.ca_cert}", "--oidc-username-claim=email",
        "--oidc-username-prefix=-", "--oidc-groups-claim=groups"]})
    server: OidcApiServer | None = None
    try:
        cluster.start()
        cluster.kubectl("apply", "-f", str(ROOT / "deploy" / "crds"))
        cluster.kubectl("wait", "--for=condition=Established", "--timeout=30s",
                        "crd/projects.tessera.io", "crd/podgroups.tessera.io")
        cluster.kubectl("apply", "-f", str(ROOT / "deploy" / "api-rbac.yaml"))
        kubeconfig = cluster.service_account_kubeconfig(names.SYSTEM_NAMESPACE, "tessera-api")
        server = OidcApiServer(root / "tessera", kubeconfig, api_port, dex)
        server.start()
        yield cluster, dex, server
    finally:
        if server is not None:
            server.cleanup()
        cluster.stop()
        dex.stop()


def dex_id_token(dex: Dex) -> str:
    """Dex's own ID token for its user: the authorization-code flow, followed redirect by
    redirect as a browser would (the mock connector signs in without a form)."""
    url = f"{dex.issuer}/auth?" + urlencode({
        "client_id": CLIENT_ID, "redirect_uri": CALLBACK, "response_type": "code",
        "scope": "openid email profile groups", "state": "kube-oidc-test"})
    with httpx.Client(verify=dex.verify, timeout=30) as c:
        for _ in range(10):
            r = c.get(url)
            assert r.status_code in (302, 303), (r.status_code, r.text[:500])
            url = urljoin(str(r.url), r.headers["location"])
            if url.startswith(CALLBACK):
                break
        code = parse_qs(urlparse(url).query)["code"][0]
        r = c.post(f"{dex.issuer}/token", data={
            "grant_type": "authorization_code", "code": code, "redirect_uri": CALLBACK},
            auth=(CLIENT_ID, CLIENT_SECRET))
        assert r.status_code == 200, r.text
    return str(r.json()["id_token"])


def tessera_token(server: OidcApiServer, dex: Dex) -> str:
    """tessera's token for the same user, through the console's single sign-on (PKCE)."""
    r = httpx.get(f"{server.url}/api/v1/auth/oidc/login")
    assert r.status_code == 302, r.text
    url = r.headers["location"]
    assert url.startswith(dex.issuer)
    with httpx.Client(verify=dex.verify, timeout=30) as c:
        for _ in range(12):
            r = c.get(url)
            if r.status_code not in (302, 303):
                break
            url = urljoin(str(r.url), r.headers["location"])
            if "#/sso/" in url:
                break
    m = re.search(r"#/sso/([A-Za-z0-9_-]+)$", url)
    assert m, (url, r.status_code, r.text[:300])
    return m.group(1)


def test_kubectl_and_tessera_agree_on_an_oidc_user(
        stack: tuple[TestCluster, Dex, OidcApiServer], tmp_path: Path) -> None:
    cluster, dex, server = stack
    with server.http() as admin:
        for p in ("oidc-writers", "oidc-readers", "oidc-other"):
            assert admin.post("/api/v1/org-unit/projects", json={"name": p}).status_code == 201
        r = admin.post("/api/v1/authorization/access-rules", json={
            "subjectType": "group", "subjectId": GROUP, "roleName": "researcher",
            "scopeType": "project", "scopeId": "oidc-writers"})
        assert r.status_code == 201, r.text
        group_rule = r.json()["id"]
        r = admin.post("/api/v1/authorization/access-rules", json={
            "subjectType": "user", "subjectId": USER, "roleName": "viewer",
            "scopeType": "project", "scopeId": "oidc-readers"})
        assert r.status_code == 201, r.text
    client = cluster.client()
    wait_until("tessera's RoleBindings", lambda: all(list(client.list(
        RoleBinding, namespace=ns, labels=MANAGED)) for ns in ("oidc-writers", "oidc-readers")),
        timeout=30)

    kubeconfig = tmp_path / "kilgore.kubeconfig"
    kubeconfig.write_text(kubeconfig_text(cluster.server, cluster.pki.ca_cert,  # type: ignore[union-attr]
                                          user="kilgore", token=dex_id_token(dex)))
    os.chmod(kubeconfig, 0o600)

    def kubectl(*args: str) -> str:
        out = cluster.kubectl(*args, kubeconfig=kubeconfig, check=False)
        return (out.stdout + out.stderr).strip()

    # Kubernetes authenticates Dex's token as the user and its group (no prefix, as tessera's)
    who = json.loads(kubectl("auth", "whoami", "-o", "json"))
    assert who["status"]["userInfo"]["username"] == USER
    assert GROUP in who["status"]["userInfo"]["groups"]

    def can(verb: str, resource: str, ns: str | None) -> str:
        out = cluster.kubectl("auth", "can-i", verb, resource, *(["-n", ns] if ns else []),
                              kubeconfig=kubeconfig, check=False)
        return out.stdout.strip()  # (stderr: a warning for a cluster-scoped resource)

    # researcher through the group in oidc-writers; viewer as the user in oidc-readers
    assert can("create", "pods", "oidc-writers") == "yes"
    assert can("create", "pods/exec", "oidc-writers") == "yes"
    assert can("delete", "pods", "oidc-writers") == "yes"
    assert can("list", "pods", "oidc-readers") == "yes"
    assert can("create", "pods", "oidc-readers") == "no"
    assert can("list", "pods", "oidc-other") == "no"
    assert can("create", "rolebindings", "oidc-writers") == "no"
    assert can("list", "nodes", None) == "no"  # nothing cluster-wide
    pod = json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "hello"},
                      "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
    manifest = tmp_path / "pod.json"
    manifest.write_text(pod)
    assert "pod/hello created" in kubectl("create", "-n", "oidc-writers", "-f", str(manifest))
    refused = kubectl("create", "-n", "oidc-readers", "-f", str(manifest))
    assert f'User "{USER}" cannot create resource "pods"' in refused, refused

    # tessera's own API, signed in through the same issuer, agrees
    token = tessera_token(server, dex)
    with httpx.Client(base_url=server.url, timeout=30,
                      headers={"Authorization": f"Bearer {token}"}) as me:
        who_t = me.get("/api/v1/me").json()
        assert who_t["name"] == USER and who_t["groups"] == [GROUP]
        seen = sorted(p["name"] for p in me.get("/api/v1/org-unit/projects").json()["projects"])
        assert seen == ["oidc-readers", "oidc-writers"]
        r = me.post("/api/v1/workloads/trainings", json={
            "name": "w", "projectId": "oidc-readers", "spec": {"command": "sleep", "args": "1"}})
        assert r.status_code == 403, r.text

    # the rule goes, and with it the access through kubectl
    with server.http() as admin:
        r = admin.delete(f"/api/v1/authorization/access-rules/{group_rule}")
        assert r.status_code == 204, r.text
    wait_until("the group's access gone", lambda: can("create", "pods", "oidc-writers") == "no",
               timeout=30)
    assert can("list", "pods", "oidc-readers") == "yes"
