"""Interactive API docs at ``/docs`` (and ``/api/docs``), served entirely from this
machine: the Swagger UI files come from the installed ``swagger-ui-bundle-v2`` package,
never from a CDN, so the page works offline. The schema is FastAPI's ``/openapi.json``."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS = "/docs/assets"


def swagger_ui_dir() -> str:
    """The folder of the installed Swagger UI distribution."""
    import swagger_ui_bundle

    return swagger_ui_bundle.swagger_ui_path


def install(app: FastAPI, runtime: Any) -> None:
    app.mount(ASSETS, StaticFiles(directory=swagger_ui_dir()), name="docs-assets")

    def page() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title="Tidings API",
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS}/favicon-32x32.png",
        )

    app.add_api_route("/docs", page, methods=["GET"], include_in_schema=False)
    app.add_api_route("/api/docs", page, methods=["GET"], include_in_schema=False)
