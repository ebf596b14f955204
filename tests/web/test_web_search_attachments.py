"""The page's search box, attachments and network times (issue 15 item 4 of part B), in
headless Chromium against a real server over the demo world with the Signal sample
capture ingested through the bridge API (both backends).

A Signal message with an attachment arrives in ``#signal-family`` showing the time it was
sent on the network (June 2024), not when the hub received it; its attachment shows its
name, type and dimensions, and once the bridge uploads the bytes, the image itself. The
search box finds the channel message and the bridge message with the match marked, and a
channel hit opens its channel. Screenshot: ``artifacts/web-search-attachments.png``.
Every wait is a page condition, never a sleep.
"""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from pathlib import Path

import pytest
from test_web_page import ADMIN_TOKEN, ARTIFACTS, PageWatch, chromium  # noqa: F401 (fixture)

from helpers import auth
from live import LiveServer
from tidings.api import create_app
from tidings.blobs import FolderBlobStore
from tidings.demo import seed_demo
from tidings.faults import Faults
from tidings.ingest.demo import DEMO_BRIDGE_TOKEN
from tidings.runtime import Runtime

pytestmark = pytest.mark.slow
SAMPLE = Path(__file__).resolve().parents[1] / "ingest" / "fixtures" / "signal_sample.jsonl"
REMOTE_ID = "Zt0w8Q2k3aXn7hJ1c9Vb.png"  # the sample's pumpkin-pasta.png


def tiny_png(width: int = 12, height: int = 8) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    rows = b"".join(b"\x00" + b"\xe8\x7a\x1e" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


@pytest.fixture
def sample_hub(backend_url, tmp_path):
    rt = Runtime(backend_url, admin_token=ADMIN_TOKEN, faults=Faults(), attachments_dir=str(tmp_path / "blobs"))
    app = create_app(rt, manage_runtime=True)
    app.state.web_tick_s = 0.4
    server = LiveServer(app)
    seed_demo(rt, server.url)
    with server, server.client() as http:
        bridge = http.get("/api/v1/bridges", headers=auth(ADMIN_TOKEN)).json()["bridges"][0]
        frames = [json.loads(line) for line in SAMPLE.read_text().splitlines() if line.strip()]
        r = http.post(f"/api/v1/bridges/{bridge['id']}/frames", json={"frames": frames},
                      headers=auth(DEMO_BRIDGE_TOKEN))
        assert r.status_code == 202, r.text
        yield rt, server, http, bridge


def test_search_attachments_and_network_times_on_the_page(chromium, sample_hub):  # noqa: F811
    from playwright.sync_api import expect

    rt, server, http, bridge = sample_hub
    assert isinstance(rt.blobs, FolderBlobStore)
    context = chromium.new_context(viewport={"width": 1440, "height": 900})
    page = context.new_page()
    watch = PageWatch(page)
    page.goto(f"{server.url}/#token={ADMIN_TOKEN}")
    expect(page.locator("#conn")).to_have_text("live")
    page.locator('#channel-list [data-channel-name="signal-family"]').click()
    expect(page.locator("#channel-title")).to_have_text("# signal-family")

    # the attachment's metadata, before the bytes exist
    recipe = page.locator("li.msg", has_text="recipe, for reference")
    figure = recipe.locator("figure.attachment")
    expect(figure.locator(".att-name")).to_have_text("pumpkin-pasta.png")
    expect(figure.locator(".att-facts")).to_have_text("image/png · 206.4 KB · 1170×2532")
    expect(figure.locator(".att-missing")).to_have_text("not uploaded")
    # the network time: sent in June 2024, whatever the hub's clock says
    sent = recipe.locator("time.at")
    expect(sent).to_have_attribute("data-network", "1717265220000")
    assert sent.get_attribute("datetime") == "2024-06-01T18:07:00.000Z"
    assert "sent on the network" in sent.get_attribute("title")

    # the bridge uploads the bytes; the next render shows the image
    png = tiny_png()
    r = http.put(f"/api/v1/bridges/{bridge['id']}/attachments/{hashlib.sha256(png).hexdigest()}",
                 params={"remote_id": REMOTE_ID}, content=png, headers=auth(DEMO_BRIDGE_TOKEN))
    assert r.status_code == 201, r.text
    page.locator('#channel-list [data-channel-name="general"]').click()
    expect(page.locator("#channel-title")).to_have_text("# general")
    page.locator('#channel-list [data-channel-name="signal-family"]').click()
    image = page.locator("li.msg", has_text="recipe, for reference").locator("img.att-image")
    expect(image).to_be_visible()
    page.wait_for_function("img => img.complete && img.naturalWidth === 12", arg=image.element_handle())
    expect(page.locator("li.msg", has_text="recipe, for reference").locator(".att-download")).to_be_visible()

    # the search box: both the linked channel message and the bridge message, match marked
    page.locator("#search-input").fill("recipe")
    page.locator("#search-input").press("Enter")
    expect(page.locator("#search-results")).to_be_visible()
    hits = page.locator("#search-list .search-hit")
    expect(hits).to_have_count(2)
    expect(page.locator("#search-list .hit-channel mark")).to_have_text("recipe")
    expect(page.locator("#search-list .hit-bridge mark")).to_have_text("recipe")
    expect(page.locator("#search-list .hit-channel .hit-attachments")).to_contain_text("pumpkin-pasta.png")
    expect(page.locator("#search-note")).to_contain_text("2 results")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "web-search-attachments.png"))
    # markup in a message stays text in the snippet
    general = next(c["id"] for c in http.get("/api/v1/channels", headers=auth(ADMIN_TOKEN)).json()["channels"]
                   if c["name"] == "general")
    http.post(f"/api/v1/channels/{general}/messages", json={"text": "<img src=x> zucchini & co"},
              headers=auth("tdg_demo_alice"))
    page.locator("#search-input").fill("zucchini")
    page.locator("#search-input").press("Enter")
    expect(page.locator("#search-list .hit-snippet")).to_contain_text("src=x> zucchini & co")
    assert page.locator("#search-list img").count() == 0
    # a channel hit opens its channel
    page.locator("#search-list .hit-channel .hit-where").click()
    expect(page.locator("#channel-title")).to_have_text("# general")
    expect(page.locator("#search-results")).to_be_hidden()
    # nothing found
    page.locator("#search-input").fill("kohlrabi")
    page.locator("#search-input").press("Enter")
    expect(page.locator("#search-note")).to_have_text("nothing found for “kohlrabi”")
    assert watch.problems == []
    context.close()
