"""The page after issue 15 (D57), in the system Chromium over the demo on both backends: the
admin posts where it is a member and reads elsewhere; only real mentions are highlighted;
the status counters have human labels with the raw name as the tooltip. Each test keeps a
screenshot in ``artifacts/``."""

from __future__ import annotations

import pytest
from test_web_page import ADMIN_TOKEN, ARTIFACTS, PageWatch, chromium, demo_hub  # noqa: F401 (fixtures)

from helpers import auth
from helpers import post_text as post
from tidings.demo import DEMO_TOKENS

pytestmark = pytest.mark.slow


def _open_as_admin(chromium, server):  # noqa: F811
    from playwright.sync_api import expect

    context = chromium.new_context(viewport={"width": 1440, "height": 900})
    page = context.new_page()
    watch = PageWatch(page)
    page.goto(f"{server.url}/#token={ADMIN_TOKEN}")
    expect(page.locator("#conn")).to_have_text("live")
    expect(page.locator("#channel-title")).to_have_text("# general")
    return context, page, watch


def _shot(page, name):
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name))


def test_the_admin_posts_where_it_is_a_member_and_reads_elsewhere(chromium, demo_hub):  # noqa: F811
    from playwright.sync_api import expect

    rt, server, http = demo_hub
    context, page, watch = _open_as_admin(chromium, server)
    expect(page.locator("#composer")).to_be_visible()
    page.locator("#composer-input").fill("Hello from the admin")
    page.locator("#composer-input").press("Enter")
    expect(page.locator("#messages .msg .text").last).to_have_text("Hello from the admin")
    expect(page.locator("#messages .msg .author").last).to_have_text("tidings")
    r = http.get("/api/v1/channels/%23general/messages", headers=auth(ADMIN_TOKEN))
    assert r.json()["messages"][-1]["text"] == "Hello from the admin"
    _shot(page, "web-admin-posts.png")
    page.locator('#channel-list [data-channel-name="research"]').click()
    expect(page.locator("#channel-title")).to_have_text("# research")
    expect(page.locator("#composer")).to_be_hidden()
    expect(page.locator("#composer-note")).to_contain_text("Read only")
    assert watch.problems == []
    context.close()


def test_only_real_mentions_are_highlighted(chromium, demo_hub):  # noqa: F811
    from playwright.sync_api import expect

    rt, server, http = demo_hub
    channels = {c["name"]: c["id"] for c in http.get("/api/v1/channels", headers=auth(ADMIN_TOKEN)).json()["channels"]}
    context, page, watch = _open_as_admin(chromium, server)
    text = "@assistant and @Scout, not @nobody nor @alice; @everyone, mail bob@example.com"
    post(http, DEMO_TOKENS["bob"], channels["general"], text)
    expect(page.locator("#messages .msg .text").last).to_have_text(text)
    last = page.locator("#messages .msg .text").last
    expect(last.locator(".handle-ref")).to_have_text(["@assistant", "@Scout", "@nobody", "@alice", "@everyone", "@example.com"])
    expect(last.locator(".mention")).to_have_text(["@assistant", "@Scout", "@everyone"])
    _shot(page, "web-mentions.png")
    # In signal-family only the assistant is an agent member: @scout is plain text there.
    post(http, DEMO_TOKENS["alice"], channels["signal-family"], "@scout and @assistant")
    page.locator('#channel-list [data-channel-name="signal-family"]').click()
    last = page.locator("#messages .msg .text").last
    expect(last).to_have_text("@scout and @assistant")
    expect(last.locator(".mention")).to_have_text(["@assistant"])
    assert watch.problems == []
    context.close()


def test_status_counters_have_human_labels_and_the_raw_name_as_tooltip(chromium, demo_hub):  # noqa: F811
    from playwright.sync_api import expect

    rt, server, http = demo_hub
    context, page, watch = _open_as_admin(chromium, server)
    for raw, label in [("held", "agent posts held mid-turn"), ("settled", "held posts sent after the turn"),
                       ("scan_recovered", "messages routed by the recovery scan"), ("steered", "mentions steered"),
                       ("backlog", "frames waiting")]:
        term = page.locator(f'#status [data-stat="{raw}"] dt')
        expect(term).to_have_text(label)
        expect(term).to_have_attribute("title", raw)
    labels = page.locator("#status dt").all_text_contents()
    assert labels and all("_" not in label for label in labels), labels
    page.locator('#status [data-stat="scan_recovered"] dt').hover()
    _shot(page, "web-counters.png")
    assert watch.problems == []
    context.close()
