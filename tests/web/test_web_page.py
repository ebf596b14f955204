"""The live web page in headless Chromium (Debian's ``/usr/bin/chromium``, driven by the
Python ``playwright`` package) against a real server over the demo world.

It follows what a user does: open the page from the demo guide's link, see the channels
and messages, watch a message posted through the API arrive without a reload, see agents
flip live and offline with their owed counts, see a quarantined frame and its cause appear
on its bridge, survive a bus overrun, sign in by hand as a human who sees only their own
channels and no admin panel, and see a post whose bus publish was lost arrive by the next
tick. The screenshot is kept at ``artifacts/web-page.png``.

Every wait is a page condition (Playwright's ``expect`` with a timeout), never a sleep.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers import auth
from helpers import post_text as post
from live import LiveServer, SSEStream
from tidings.api import create_app
from tidings.demo import DEMO_TOKENS, seed_demo
from tidings.faults import Faults
from tidings.runtime import Runtime

CHROMIUM = os.environ.get("TIDINGS_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
ADMIN_TOKEN = "tdg_demo_admin"
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"

pytestmark = pytest.mark.slow


@pytest.fixture
def chromium():
    """A headless Chromium. Missing browser = a clear failure, never a silent skip."""
    if not Path(CHROMIUM).exists():
        pytest.fail(
            f"{CHROMIUM} is missing: the web page test needs Debian's Chromium "
            "(`apt-get install -y chromium`; .ci/run installs it)", pytrace=False
        )
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=10_000)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def demo_hub(backend_url):
    """The demo world on a real server (both backends), ticking every 0.4 s."""
    rt = Runtime(backend_url, admin_token=ADMIN_TOKEN, faults=Faults())
    app = create_app(rt, manage_runtime=True)
    app.state.web_tick_s = 0.4
    server = LiveServer(app)
    seed_demo(rt, server.url)
    with server, server.client() as http:
        yield rt, server, http


class PageWatch:
    """Collects what must never happen on the page: uncaught errors and 5xx answers."""

    def __init__(self, page):
        self.problems: list[str] = []
        page.on("pageerror", lambda exc: self.problems.append(f"page error: {exc}"))
        page.on("console", self._console)
        page.on("response", lambda r: r.status >= 500 and self.problems.append(f"{r.status} {r.url}"))

    def _console(self, msg):
        # A refused token is logged by the browser as a failed load; that one is expected.
        if msg.type == "error" and "status of 401" not in msg.text:
            self.problems.append(f"console error: {msg.text}")


def test_the_live_page_for_the_admin_and_for_a_human(chromium, demo_hub):
    from playwright.sync_api import expect

    rt, server, http = demo_hub
    channels = {c["name"]: c["id"] for c in http.get("/api/v1/channels", headers=auth(ADMIN_TOKEN)).json()["channels"]}
    bridge = http.get("/api/v1/bridges", headers=auth(ADMIN_TOKEN)).json()["bridges"][0]

    # -- the admin opens the demo guide's link ---------------------------------------------------
    context = chromium.new_context(viewport={"width": 1440, "height": 900})
    page = context.new_page()
    watch = PageWatch(page)
    page.goto(f"{server.url}/#token={ADMIN_TOKEN}")
    expect(page.locator("#conn")).to_have_text("live")
    assert page.evaluate("location.hash") == "" and "tdg_" not in page.url  # dropped from the URL
    assert page.evaluate("localStorage.getItem('tidings.token')") == ADMIN_TOKEN
    expect(page.locator("#whoami")).to_have_text("admin")
    expect(page.locator("#channel-list .channel-name")).to_have_text(["general", "research", "signal-family"])
    expect(page.locator("#home-list .channel-name")).to_have_text(["assistant", "scout"])
    expect(page.locator("#channel-title")).to_have_text("# general")
    expect(page.locator("#messages .msg")).to_have_count(1)
    expect(page.locator("#messages .msg").first).to_contain_text("Welcome to Tidings, everyone!")
    expect(page.locator("#messages .msg .author").first).to_have_text("alice")

    # A message posted through the API appears live, as text (markup is not interpreted).
    hostile = 'Fresh from the API <img src=x onerror="window.pwned=1"> <b>not bold</b>'
    post(http, DEMO_TOKENS["bob"], channels["general"], hostile)
    expect(page.locator("#messages .msg")).to_have_count(2)
    expect(page.locator("#messages .msg .text").last).to_have_text(hostile)
    assert page.locator("#messages img, #messages b").count() == 0
    assert page.evaluate("window.pwned") is None

    # A message in another channel marks it unread; opening it shows the history.
    post(http, DEMO_TOKENS["bob"], channels["research"], "@assistant can you check the numbers too?")
    expect(page.locator('#channel-list [data-channel-name="research"] .badge')).to_have_text("1")
    page.locator('#channel-list [data-channel-name="research"]').click()
    expect(page.locator("#channel-title")).to_have_text("# research")
    expect(page.locator("#messages .msg .text")).to_have_text(
        ["@scout can you dig up last week's numbers?", "@assistant can you check the numbers too?"])
    expect(page.locator("#messages .mention")).to_have_text(["@scout", "@assistant"])

    # Agents: both offline; the assistant (a plain member of research) now owes a mention.
    assistant = page.locator('tr[data-agent="assistant"]')
    scout = page.locator('tr[data-agent="scout"]')
    expect(assistant.locator(".state")).to_have_text("offline")
    expect(assistant.locator(".owed")).to_have_text("1")
    expect(scout.locator(".state")).to_have_text("offline")
    expect(scout.locator(".owed")).to_have_text("0")

    # The bridge: nothing quarantined yet; a malformed frame appears with its cause.
    card = page.locator(f'.bridge[data-bridge="{bridge["id"]}"]')
    expect(card.locator(".bridge-name")).to_have_text("Alice's phone")
    expect(card.locator('[data-stat="quarantined"] .stat-value')).to_have_text("0")
    broken = {"codec": "signal.jsonrpc", "codec_version": 1, "dedupe_key": "web-test-broken",
              "payload": {"jsonrpc": "2.0", "method": "receive", "params": {"envelope": "not an envelope"}}}
    rt.ingest.append(bridge["id"], rt.ingest.parse([broken], "signal"))
    expect(card.locator('[data-stat="quarantined"] .stat-value')).to_have_text("1")
    expect(card.locator(".quarantined-frame .cause")).to_have_text(
        "decode: signal.jsonrpc: payload.params.envelope must be an object, got a string")
    expect(card.locator(".quarantined-frame .codec")).to_have_text("signal.jsonrpc")
    expect(card.locator('[data-stat="backlog"] .stat-value')).to_have_text("0")
    expect(page.locator('#status [data-stat="quarantined"] .stat-value')).to_have_text("1")

    # Scout opens its session: live on the page, and the status counts the live session.
    with SSEStream(f"{server.url}/api/v1/session", auth(DEMO_TOKENS["scout"])) as session:
        assert session.next()[0] == "session"
        expect(scout.locator(".state")).to_have_text("live")
        expect(page.locator('#status [data-stat="live_sessions"] .stat-value')).to_have_text("1")

        # A bus overrun loses the hint; the page resyncs from the durable API and shows it.
        rt.faults.arm("bus.overrun", 1)
        post(http, DEMO_TOKENS["bob"], channels["research"], "sent while the bus overran every reader")
        expect(page.locator("#messages .msg .text").last).to_have_text("sent while the bus overran every reader")
        expect(page.locator("#conn")).to_contain_text("live")
        expect(page.locator('#status [data-stat="overruns"] .stat-value')).not_to_have_text("0")

        page.locator('#channel-list [data-channel-name="general"]').click()
        expect(page.locator("#messages .msg")).to_have_count(2)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "web-page.png"))
    expect(scout.locator(".state")).to_have_text("offline")
    assert watch.problems == []
    context.close()

    # -- a human signs in by hand -------------------------------------------------------------------
    context = chromium.new_context(viewport={"width": 1440, "height": 900})
    page = context.new_page()
    watch = PageWatch(page)
    page.goto(f"{server.url}/")
    expect(page.locator("#login")).to_be_visible()
    page.locator("#token-input").fill("tdg_not_a_token")
    page.locator("#login-button").click()
    expect(page.locator("#login-error")).to_contain_text("unknown or revoked token")
    page.locator("#token-input").fill(DEMO_TOKENS["alice"])
    page.locator("#token-input").press("Enter")
    expect(page.locator("#conn")).to_have_text("live")
    expect(page.locator("#whoami")).to_have_text("@alice · human")
    expect(page.locator("#channel-list .channel-name")).to_have_text(["general", "research", "signal-family"])
    expect(page.locator("#home-list .channel-name")).to_have_text(["assistant"])  # not bob's scout
    expect(page.locator("#messages .msg")).to_have_count(2)
    expect(page.locator("#status-panel")).to_be_hidden()
    expect(page.locator("#agents-title")).to_have_text("Your agents")
    expect(page.locator("tr.agent-row")).to_have_count(1)
    expect(page.locator('tr[data-agent="assistant"] .owed')).to_have_text("1")
    expect(page.locator(".bridge .bridge-name")).to_have_text(["Alice's phone"])  # she owns it

    # She posts from the page; bob's post arrives live.
    page.locator("#composer-input").fill("On my way, @assistant")
    page.locator("#composer-input").press("Enter")
    expect(page.locator("#messages .msg .text").last).to_have_text("On my way, @assistant")
    expect(page.locator("#composer-input")).to_have_value("")
    post(http, DEMO_TOKENS["bob"], channels["general"], "see you soon")
    expect(page.locator("#messages .msg .text").last).to_have_text("see you soon")
    # A post whose bus publish is lost (the crash window) still shows up, by the next tick.
    rt.faults.arm("bus.drop_publish", 1)
    post(http, DEMO_TOKENS["bob"], channels["general"], "published nowhere, committed all the same")
    assert rt.faults.fired.get("bus.drop_publish") == 1
    expect(page.locator("#messages .msg .text").last).to_have_text("published nowhere, committed all the same")
    texts = [m["text"] for m in http.get(f"/api/v1/channels/{channels['general']}/messages",
                                          headers=auth(DEMO_TOKENS["alice"])).json()["messages"]]
    assert texts[-3:] == ["On my way, @assistant", "see you soon", "published nowhere, committed all the same"]

    # A reload keeps her signed in (local storage); signing out forgets the token.
    page.reload()
    expect(page.locator("#whoami")).to_have_text("@alice · human")
    page.locator("#sign-out").click()
    expect(page.locator("#login")).to_be_visible()
    assert page.evaluate("localStorage.getItem('tidings.token')") is None
    assert watch.problems == []
    context.close()
