"""/docs and /redoc load every asset from the server itself (no CDN), and the assets are real."""

from __future__ import annotations

import re

import httpx

from tessera.testing.embedded import EmbeddedServer

ASSET = re.compile(r"""(?:src|href)=["']([^"']+)["']""")


def _assets(client: httpx.Client, page: str) -> list[str]:
    r = client.get(page)
    assert r.status_code == 200, r.text
    found = ASSET.findall(r.text)
    assert found, r.text
    return found


def test_docs_and_redoc_serve_their_assets_locally(server: EmbeddedServer) -> None:
    with httpx.Client(base_url=server.url, timeout=10) as client:
        for page, must in (("/docs", "swagger-ui-bundle.js"), ("/redoc", "redoc.standalone.js")):
            urls = _assets(client, page)
            assert any(u.endswith(must) for u in urls), urls
            for url in urls:
                assert url.startswith("/"), f"{page} loads {url} from elsewhere"
                got = client.get(url)
                assert got.status_code == 200, url
                if url.endswith(".js"):
                    assert len(got.content) > 100_000, url
            assert "fonts.googleapis" not in client.get(page).text
        assert client.get("/openapi.json").json()["info"]["title"] == "tessera API"
