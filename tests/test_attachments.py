"""Attachments (issue 15 item 4), both backends: metadata from all three codecs is kept
and shown in API reads (conversation messages, linked channel messages, search); bridges
upload bytes to a content-addressed store through PUT (413 over the limit, 400 on a hash
mismatch, only their own token); readers of the message download them, nobody else."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest

from helpers import auth, create_account, create_channel
from tidings.blobs import FolderBlobStore
from tidings.ingest import attachments as ingest_attachments

ADMIN = "tdg_test_admin"
FIXTURES = Path(__file__).parent / "ingest" / "fixtures"
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4


def fixture_frame(name: str, codec: str, key: str) -> dict:
    return {"codec": codec, "codec_version": 1, "dedupe_key": key,
            "payload": json.loads((FIXTURES / f"{name}.json").read_text())}


@pytest.fixture
def hub(client, runtime, tmp_path):
    runtime.blobs = FolderBlobStore(tmp_path / "blobs")
    alice = create_account(client, "human", "alice", admin_token=ADMIN)
    bob = create_account(client, "human", "bob", admin_token=ADMIN)
    bridges = {}
    for platform in ("signal", "whatsapp", "google"):
        r = client.post("/api/v1/bridges", json={"platform": platform, "name": f"alice {platform}",
                                                  "owner": alice["id"]}, headers=auth(ADMIN))
        assert r.status_code == 201, r.text
        bridges[platform] = r.json()
    return {"client": client, "rt": runtime, "alice": alice, "bob": bob, "bridges": bridges}


def post_frame(hub, platform, frame):
    bridge = hub["bridges"][platform]
    r = hub["client"].post(f"/api/v1/bridges/{bridge['id']}/frames", json=frame, headers=auth(bridge["token"]))
    assert r.status_code == 202, r.text
    hub["rt"].ingest.drain()


def conversation_messages(hub, platform, token=None):
    c = hub["client"]
    token = token or hub["alice"]["token"]
    bridge = hub["bridges"][platform]
    convs = c.get(f"/api/v1/bridges/{bridge['id']}/conversations", headers=auth(token)).json()["conversations"]
    out = []
    for conv in convs:
        out += c.get(f"/api/v1/conversations/{conv['id']}/messages", headers=auth(token)).json()["messages"]
    return out


def test_metadata_from_all_three_codecs_is_kept_and_shown(hub):
    post_frame(hub, "signal", fixture_frame("signal_attachment", "signal.jsonrpc", "s1"))
    post_frame(hub, "whatsapp", fixture_frame("whatsapp_image", "whatsapp.event", "w1"))
    post_frame(hub, "google", fixture_frame("google_message_media", "google.json", "g1"))
    picked = ("name", "content_type", "size_bytes", "width", "height", "caption", "available")
    (signal,) = conversation_messages(hub, "signal")
    assert [tuple(a[k] for k in picked) for a in signal["attachments"]] == [
        ("IMG_2041.jpg", "image/jpeg", 482113, 3024, 4032, "", False)]
    (whatsapp,) = conversation_messages(hub, "whatsapp")
    (att,) = whatsapp["attachments"]
    assert tuple(att[k] for k in picked) == ("", "image/jpeg", 184533, 960, 1280, "the seats!", False)
    # WhatsApp names the hash of the bytes up front
    assert att["sha256"] == base64.b64decode("n0mC7x6k0a2W9Kq5gJ3oQ5f2B3yXH0u1pVtZt4Yb6Ds=").hex()
    (google,) = conversation_messages(hub, "google")
    assert [tuple(a[k] for k in picked) for a in google["attachments"]] == [
        ("PXL_20240531.jpg", "image/jpeg", 1048576, 3072, 4080, "", False)]
    assert signal["attachments"][0]["url"] == f"/api/v1/attachments/{signal['id']}/0"


def test_a_message_without_attachments_has_no_attachments_key(hub):
    frame = fixture_frame("signal_attachment", "signal.jsonrpc", "plain")
    del frame["payload"]["params"]["envelope"]["dataMessage"]["attachments"]
    post_frame(hub, "signal", frame)
    (m,) = conversation_messages(hub, "signal")
    assert m["body"] == "The view from the hike" and "attachments" not in m


def test_a_redelivered_frame_writes_no_attachment_twice(hub):
    frame = fixture_frame("signal_attachment", "signal.jsonrpc", "")
    post_frame(hub, "signal", frame)
    post_frame(hub, "signal", frame)
    with hub["rt"].store.read() as tx:
        assert tx.raw("SELECT count(*) FROM attachments").fetchone()[0] == 1


def signal_with_png(ts: int = 1717265220000) -> dict:
    frame = fixture_frame("signal_attachment", "signal.jsonrpc", f"png{ts}")
    data = frame["payload"]["params"]["envelope"]["dataMessage"]
    frame["payload"]["params"]["envelope"]["timestamp"] = ts
    data["timestamp"] = ts
    data["attachments"] = [{"contentType": "image/png", "filename": "pumpkin-pasta.png", "id": "Zt0w8Q2k3aXn7hJ1c9Vb.png",
                            "size": len(PNG), "width": 32, "height": 32, "caption": "dinner"}]
    return frame


def put(hub, platform, body, sha=None, remote_id=None, token=None):
    bridge = hub["bridges"][platform]
    sha = sha or hashlib.sha256(body).hexdigest()
    params = {"remote_id": remote_id} if remote_id else {}
    return hub["client"].put(f"/api/v1/bridges/{bridge['id']}/attachments/{sha}", content=body, params=params,
                             headers=auth(token or bridge["token"]))


@pytest.mark.parametrize("upload_first", [True, False])
def test_upload_then_download_by_a_reader_in_either_order(hub, upload_first):
    sha = hashlib.sha256(PNG).hexdigest()
    if upload_first:
        r = put(hub, "signal", PNG, remote_id="Zt0w8Q2k3aXn7hJ1c9Vb.png")
        assert r.status_code == 201, r.text
        assert r.json() == {"sha256": sha, "size_bytes": len(PNG), "remote_id": "Zt0w8Q2k3aXn7hJ1c9Vb.png",
                            "stored": True}
    post_frame(hub, "signal", signal_with_png())
    if not upload_first:
        (m,) = conversation_messages(hub, "signal")
        assert m["attachments"][0]["available"] is False
        r = put(hub, "signal", PNG, remote_id="Zt0w8Q2k3aXn7hJ1c9Vb.png")
        assert r.status_code == 201, r.text
    (m,) = conversation_messages(hub, "signal")
    (att,) = m["attachments"]
    assert att["available"] is True and att["sha256"] == sha and att["caption"] == "dinner"
    c = hub["client"]
    got = c.get(att["url"], headers=auth(hub["alice"]["token"]))
    assert got.status_code == 200 and got.content == PNG
    assert got.headers["content-type"] == "image/png" and got.headers["x-content-type-options"] == "nosniff"
    # the same bytes again: stored once, 200
    again = put(hub, "signal", PNG, remote_id="Zt0w8Q2k3aXn7hJ1c9Vb.png")
    assert again.status_code == 200 and again.json()["stored"] is False
    # someone who may not read the message: 404, as for a message that does not exist
    for token in (hub["bob"]["token"], hub["bridges"]["google"]["token"]):
        r = c.get(att["url"], headers=auth(token))
        assert r.status_code in (403, 404)
    r = c.get(att["url"], headers=auth(hub["bob"]["token"]))
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_attachment"
    assert c.get(att["url"], headers=auth(ADMIN)).status_code == 200


def test_whatsapp_bytes_need_no_remote_id(hub):
    body = b"the seats, as a jpeg"
    frame = fixture_frame("whatsapp_image", "whatsapp.event", "w2")
    media = frame["payload"]["message"]["imageMessage"]
    media["fileSHA256"] = base64.b64encode(hashlib.sha256(body).digest()).decode()
    post_frame(hub, "whatsapp", frame)
    assert put(hub, "whatsapp", body).status_code == 201
    (m,) = conversation_messages(hub, "whatsapp")
    (att,) = m["attachments"]
    assert att["available"] is True
    assert hub["client"].get(att["url"], headers=auth(hub["alice"]["token"])).content == body


def test_upload_limits_and_checks(hub, runtime):
    runtime.attachment_max_bytes = 1000
    big = b"x" * 1001
    r = put(hub, "signal", big)
    assert r.status_code == 413 and r.json()["error"]["code"] == "too_large"
    # streamed without a Content-Length: still 413
    bridge = hub["bridges"]["signal"]

    def chunks():
        yield b"x" * 600
        yield b"x" * 600

    r = hub["client"].put(f"/api/v1/bridges/{bridge['id']}/attachments/{hashlib.sha256(b'x' * 1200).hexdigest()}",
                          content=chunks(), headers=auth(bridge["token"]))
    assert r.status_code == 413, r.text
    # a body that is not what its name says: 400, nothing kept
    wrong = hashlib.sha256(b"something else").hexdigest()
    r = put(hub, "signal", b"hello", sha=wrong)
    assert r.status_code == 400 and r.json()["error"]["code"] == "hash_mismatch"
    assert not runtime.blobs.has(wrong)
    assert not any(p.is_file() for p in (runtime.blobs.root).rglob("*")), "no partial file left behind"
    r = put(hub, "signal", b"hello", sha="not-a-hash")
    assert r.status_code == 400 and r.json()["error"]["code"] == "bad_sha256"
    # only the bridge's own token
    assert put(hub, "signal", b"hello", token=hub["bridges"]["google"]["token"]).status_code == 403
    assert put(hub, "signal", b"hello", token=hub["alice"]["token"]).status_code == 403
    assert put(hub, "signal", b"hello", token=ADMIN).status_code == 403
    # over the app's 1 MiB JSON limit is fine under the attachment limit
    runtime.attachment_max_bytes = 3 * 1024 * 1024
    assert put(hub, "signal", b"y" * (2 * 1024 * 1024)).status_code == 201


def test_a_linked_channel_message_shows_its_attachments(hub):
    c = hub["client"]
    post_frame(hub, "signal", signal_with_png(1717265210000))
    bridge = hub["bridges"]["signal"]
    convs = c.get(f"/api/v1/bridges/{bridge['id']}/conversations", headers=auth(ADMIN)).json()["conversations"]
    ch = create_channel(c, hub["alice"]["token"], "family")
    r = c.post(f"/api/v1/bridges/{bridge['id']}/links", json={"conversation_id": convs[0]["id"], "channel_id": ch},
               headers=auth(ADMIN))
    assert r.status_code == 200, r.text
    post_frame(hub, "signal", signal_with_png())
    put(hub, "signal", PNG, remote_id="Zt0w8Q2k3aXn7hJ1c9Vb.png")
    (m,) = c.get(f"/api/v1/channels/{ch}/messages", headers=auth(hub["alice"]["token"])).json()["messages"]
    (att,) = m["attachments"]
    assert att["name"] == "pumpkin-pasta.png" and att["available"] is True
    assert att["url"] == f"/api/v1/attachments/{m['id']}/0"
    assert c.get(att["url"], headers=auth(hub["alice"]["token"])).content == PNG
    assert c.get(f"/api/v1/messages/{m['id']}", headers=auth(hub["alice"]["token"])).json()["message"][
        "attachments"] == [att]
    assert c.get(att["url"], headers=auth(hub["bob"]["token"])).status_code == 404  # not in the channel
    # and search shows them too
    hit = c.get("/api/v1/search", params={"q": "view hike", "channel_id": ch},
                headers=auth(hub["alice"]["token"])).json()["results"]
    assert hit and hit[0]["message"]["attachments"] == [att]


def test_the_metadata_mapping_ignores_bad_values():
    meta = ingest_attachments.metadata({"filename": "a" * 999, "size": -1, "width": True, "height": "7",
                                        "file_sha256": "not base64!", "att_id": "x"})
    assert len(meta["name"]) == 255 and meta["size_bytes"] is None and meta["width"] is None
    assert meta["height"] is None and meta["sha256"] is None and meta["remote_id"] == "x"


def test_an_unknown_attachment_is_404(hub):
    r = hub["client"].get("/api/v1/attachments/msg_nope/0", headers=auth(ADMIN))
    assert r.status_code == 404
    r = hub["client"].get("/api/v1/attachments/msg_nope/zero", headers=auth(ADMIN))
    assert r.status_code == 400
