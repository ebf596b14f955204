"""``GET /metrics``: Prometheus text (``tidings.metrics``), admin token required.

Unauthenticated scraping goes to a separate listener instead (``serve --metrics-bind``),
which a deployment can keep on a private interface.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import Response

from .. import metrics
from ..hub.tokens import Principal
from . import deps

router = APIRouter()


@router.get("/metrics", include_in_schema=False)
def prometheus(request: Request, who: Principal = Depends(deps.admin)) -> Response:
    return Response(metrics.exposition(deps.runtime(request)), media_type=metrics.CONTENT_TYPE)


def install(app: FastAPI, runtime: Any) -> None:
    app.include_router(router)
