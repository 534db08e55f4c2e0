"""``/docs`` (Swagger UI) and ``/redoc`` served from assets inside the installed packages.

FastAPI's own pages load their scripts from a CDN, so they render blank on a machine without
internet. The assets here come from the ``fastapi-offline`` wheel (Swagger UI and ReDoc
bundles, with their licenses), served under ``/static-docs``; no web fonts are requested.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

STATIC_URL = "/static-docs"
REDOC_POLICY = ("default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
                "script-src 'self' 'unsafe-inline'; worker-src 'self' blob:; font-src 'self' data:; "
                "connect-src 'self'")


def assets_dir() -> Path:
    import fastapi_offline

    return Path(fastapi_offline.__file__).parent / "static"


def mount_offline_docs(app: FastAPI, docs_url: str = "/docs", redoc_url: str = "/redoc") -> None:
    """Add the two pages to ``app`` (created with ``docs_url=None, redoc_url=None``)."""
    app.mount(STATIC_URL, StaticFiles(directory=assets_dir()), name="static-docs")
    openapi_url = app.openapi_url or "/openapi.json"
    oauth2_redirect = app.swagger_ui_oauth2_redirect_url or "/docs/oauth2-redirect"

    @app.get(docs_url, include_in_schema=False)
    def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{app.title} - Swagger UI",
            oauth2_redirect_url=oauth2_redirect,
            swagger_js_url=f"{STATIC_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{STATIC_URL}/swagger-ui.css",
            swagger_favicon_url=f"{STATIC_URL}/favicon.png",
        )

    @app.get(oauth2_redirect, include_in_schema=False)
    def swagger_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get(redoc_url, include_in_schema=False)
    def redoc() -> HTMLResponse:
        page = get_redoc_html(
            openapi_url=openapi_url,
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{STATIC_URL}/redoc.standalone.js",
            redoc_favicon_url=f"{STATIC_URL}/favicon.png",
            with_google_fonts=False,
        )
        # ReDoc's bundle draws its vendor's logo from cdn.redoc.ly; this page's policy lets the
        # browser load nothing but this server's own assets, so no request leaves the machine.
        page.headers["Content-Security-Policy"] = REDOC_POLICY
        return page
