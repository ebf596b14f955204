"""Attachment bytes over HTTP (rules in ``hub.attachments``).

* ``PUT /api/v1/bridges/{id}/attachments/{sha256}[?remote_id=…]`` — the bridge's own token;
  the raw bytes as the body, streamed to the blob store (never buffered whole), at most
  ``runtime.attachment_max_bytes`` (413 ``too_large``, checked on ``Content-Length`` first
  and again while streaming); 400 ``hash_mismatch`` when they do not hash to the name.
  201 when stored, 200 when those bytes were already there.
* ``GET /api/v1/attachments/{message_id}/{ordinal}`` — the bytes, for whoever may read the
  message; 404 ``attachment_not_uploaded`` while the bridge has not sent them.

The app's 1 MiB body limit does not apply to the PUT (``api.limits``): it has its own.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from ..errors import BadRequest, TooLarge
from ..hub import attachments as attachments_hub
from . import deps

router = APIRouter()


@router.put("/api/v1/bridges/{bridge_id}/attachments/{sha256}")
async def upload(bridge_id: str, sha256: str, request: Request, remote_id: str | None = None) -> JSONResponse:
    rt = deps.runtime(request)
    who = await run_in_threadpool(deps.principal, request)
    attachments_hub.check_uploader(who, bridge_id)
    sha = attachments_hub.check_sha256(sha256)
    remote = attachments_hub.check_remote_id(remote_id)
    limit = rt.attachment_max_bytes
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > limit:
                raise TooLarge(f"an attachment may be at most {limit} bytes")
        except ValueError:
            raise BadRequest("Content-Length is not a number") from None
    upload = attachments_hub.Upload(rt.blobs, sha, limit)
    try:
        async for chunk in request.stream():
            if chunk:
                upload.write(chunk)
        size = upload.finish()
    except BaseException:
        upload.abort()
        raise
    await run_in_threadpool(attachments_hub.record, rt.store, bridge_id, remote, sha, size)
    body = {"sha256": sha, "size_bytes": size, "remote_id": remote, "stored": not upload.existed}
    return JSONResponse(body, status_code=200 if upload.existed else 201)


@router.get("/api/v1/attachments/{message_id}/{ordinal}")
def download(message_id: str, ordinal: str, request: Request) -> StreamingResponse:
    rt = deps.runtime(request)
    who = deps.account_caller(request)
    try:
        number = int(ordinal)
    except ValueError:
        raise BadRequest("ordinal must be an integer") from None
    att = attachments_hub.readable_attachment(rt.store, who, message_id, number)
    file, headers, media_type = attachments_hub.open_download(rt.blobs, att)
    return StreamingResponse(attachments_hub.chunks(file), media_type=media_type, headers=headers)


def install(app: FastAPI, runtime: Any) -> None:
    app.include_router(router)
