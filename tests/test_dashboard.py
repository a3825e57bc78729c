"""The dashboard at `/ui`, driven in a real headless Chromium (Debian's `chromium` package under
Playwright; no browser is ever downloaded) against a real `reef serve` in front of the scripted
upstream, whose `fmt` scenario learns its harness with the `skills` recipe in a few seconds.

Checked: a wrong token is refused with a message and the token never lands in a URL, the
server's log or localStorage; a scenario and a newly learned release appear without reloading;
a record opens in full; a rollback through the confirmation dialog grows the chain; a conflict
(someone moved the head after the preview) is shown plainly and changes nothing; the static
files need no token, every data call does; a server without tokens opens without a sign-in.
What an operator lives in (candidates, training curves, canaries, records' filters and pages,
sessions, the tiny model learning weights) is tests/test_dashboard_operator.py.

`REEF_UI_SCREENSHOTS=1` (or `scripts/ui_screenshots`) also writes the pages to docs/ui-*.png.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import dashboard as ui
from tests.helpers.dashboard import (
    CHATTY,
    CHROMIUM,
    FEEDBACK,
    GOOD,
    SCENARIO,
    TOKEN,
    WAIT_MS,
    ask,
    client,
    releases,
    serve,
    shot,
    sign_in,
    wait_for,
)
from tests.helpers.reef_server import ReefServer
from tests.scripted_upstream import ScriptedUpstream

browser, model, page, reef = ui.browser, ui.model, ui.page, ui.reef  # the shared fixtures

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install '.[test]')")
if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
    pytest.skip(f"no chromium at {CHROMIUM}: `apt-get install -y chromium` (.ci/run does)", allow_module_level=True)


def test_static_files_need_no_token_but_every_data_call_does(reef: ReefServer) -> None:
    index = httpx.get(f"{reef.url}/ui/")
    assert index.status_code == 200 and "text/html" in index.headers["content-type"]
    assert "default-src 'none'" in index.headers["content-security-policy"]
    assert "http" not in index.text.replace("http-equiv", ""), "the page loads nothing from elsewhere"
    for name, kind in [("app.js", "javascript"), ("style.css", "text/css")]:
        asset = httpx.get(f"{reef.url}/ui/{name}")
        assert asset.status_code == 200 and kind in asset.headers["content-type"]
        assert "https://" not in asset.text and "http://" not in asset.text.replace("http://www.w3.org/2000/svg", "")
    redirect = httpx.get(f"{reef.url}/ui")
    assert redirect.status_code == 308 and redirect.headers["location"] == "ui/"
    assert httpx.get(f"{reef.url}/ui/../reef/status").status_code == 401  # httpx normalises: /reef/status
    assert httpx.get(f"{reef.url}/ui/nothing.js").status_code == 404
    assert httpx.post(f"{reef.url}/ui/", data={"token": "x"}).status_code == 405
    for path in (
        "/reef/status",
        "/reef/scenarios",
        f"/reef/scenarios/{SCENARIO}/records",
        f"/reef/scenarios/{SCENARIO}/curve",
        f"/reef/scenarios/{SCENARIO}/compare?base=a&target=b",
    ):
        assert httpx.get(f"{reef.url}{path}").status_code == 401, path


def test_a_wrong_token_is_refused_with_a_message_and_the_token_stays_out_of_urls(page: Any, reef: ReefServer) -> None:
    sign_in(page, reef, "not-the-token")
    error = page.get_by_test_id("login-error")
    sync_api.expect(error).to_be_visible()
    sync_api.expect(error).to_contain_text("Refused")
    assert page.evaluate("sessionStorage.getItem('reef-token')") is None
    shot(page, "login")

    page.get_by_test_id("token").fill(TOKEN)
    page.get_by_test_id("sign-in").click()
    sync_api.expect(page.get_by_test_id("login-form")).to_be_hidden()
    sync_api.expect(page.locator("h1", has_text="Scenarios")).to_be_visible()
    assert page.evaluate("sessionStorage.getItem('reef-token')") == TOKEN
    assert page.evaluate("localStorage.length") == 0 and page.evaluate("document.cookie") == ""
    page.reload()  # the session keeps the token: no second sign-in
    sync_api.expect(page.locator("h1", has_text="Scenarios")).to_be_visible()
    page.get_by_test_id("logout").click()
    sync_api.expect(page.get_by_test_id("login-form")).to_be_visible()
    assert page.evaluate("sessionStorage.getItem('reef-token')") is None

    assert all(TOKEN not in url for url, _ in page.seen)
    data_calls = [(url, header) for url, header in page.seen if "/reef/" in url]
    assert data_calls and all(header in (f"Bearer {TOKEN}", "Bearer not-the-token") for _, header in data_calls[1:])
    assert data_calls[0] == (f"{reef.url}/reef/status", None)  # the page asks first whether a token is needed
    assert TOKEN not in reef.logs() and "not-the-token" not in reef.logs()


def test_a_learned_release_appears_without_reloading_and_a_record_opens_in_full(page: Any, reef: ReefServer) -> None:
    first_receipt, first_release, answer = ask(reef, session="ui-demo")
    assert answer == CHATTY
    sign_in(page, reef)
    row = page.get_by_test_id(f"scenario-{SCENARIO}")
    sync_api.expect(row).to_be_visible()
    sync_api.expect(row).to_contain_text("skills")
    sync_api.expect(row.get_by_test_id("records")).to_have_text("1")
    ask(reef)  # new traffic shows up by itself
    sync_api.expect(row.get_by_test_id("records")).to_have_text("2")

    row.get_by_role("link", name=SCENARIO).click()
    chain = page.get_by_test_id("chain")
    sync_api.expect(chain.get_by_test_id("release")).to_have_count(1)
    url_before = page.url
    with client(reef) as c:  # clients report failures with the same complaint: the learner writes a rule
        c.report(first_receipt, score=0.0, feedback=FEEDBACK[0])
        for text in FEEDBACK[1:]:
            receipt, _, _ = ask(reef)
            c.report(receipt, score=0.0, feedback=text)
    learned = chain.locator("[data-testid=release].training")
    sync_api.expect(learned).to_have_count(1, timeout=WAIT_MS)  # no reload: the page polls
    assert page.url == url_before
    sync_api.expect(learned).to_contain_text("select")
    sync_api.expect(learned).to_contain_text("serving")
    learned_id = learned.get_attribute("data-release")
    assert learned_id and learned_id != first_release

    with client(reef) as c:  # the new harness answers well; its traffic is scored well
        for i in range(3):
            receipt, release_id, answer = ask(reef, f"What is {i}+{4 - i}?", session="ui-demo")
            assert release_id == learned_id and answer == GOOD
            c.report(receipt, score=1.0, feedback="right")
    page.get_by_test_id("tab-curve").click()
    sync_api.expect(page.get_by_test_id("curve").locator("circle.gate-dot")).to_have_count(3)  # 2 releases + legend
    sync_api.expect(page.get_by_test_id("curve-table")).to_contain_text("1.000")
    shot(page, "curve")

    page.get_by_test_id("tab-records").click()
    rows = page.get_by_test_id("record-row")
    sync_api.expect(rows).to_have_count(7)
    newest = rows.first
    sync_api.expect(newest).to_contain_text("right")
    sync_api.expect(newest).to_contain_text("unverified")  # an upstream provider gives no token ids
    newest.get_by_role("link").first.click()  # the receipt (the session is a link too)
    record = page.get_by_test_id("record")
    sync_api.expect(record).to_be_visible()
    sync_api.expect(page.get_by_test_id("conversation")).to_contain_text(
        "Answer with a single word only"
    )  # injected rule
    sync_api.expect(page.get_by_test_id("conversation")).to_contain_text("What is 2+2?")
    sync_api.expect(page.get_by_test_id("response-text")).to_have_text(GOOD)
    sync_api.expect(page.get_by_test_id("reports")).to_contain_text("right")
    sync_api.expect(record).to_contain_text("unverified")
    shot(page, "record")

    page.goto(f"{reef.url}/ui/#/s/{SCENARIO}/release/{learned_id}")
    diff = page.get_by_test_id("diff")
    sync_api.expect(diff).to_contain_text("rules/fb-single-word-only.md")
    sync_api.expect(diff.locator(".add", has_text="Answer with a single word only")).to_have_count(1)
    shot(page, "diff")


def test_rollback_asks_for_confirmation_grows_the_chain_and_a_conflict_is_shown_plainly(
    page: Any, reef: ReefServer
) -> None:
    before = wait_for(
        lambda: (r := releases(reef)) and any(x["operation"] == "training" for x in r) and r,
        what="the learned release (the previous test)",
    )
    first = before[-1]  # the creation
    sign_in(page, reef, where=f"#/s/{SCENARIO}/chain")
    chain = page.get_by_test_id("chain")
    nodes = chain.get_by_test_id("release")
    sync_api.expect(nodes).to_have_count(len(before))

    creation = chain.locator(f"[data-release='{first['release_id']}']")
    creation.get_by_test_id("rollback").click()
    dialog = page.get_by_test_id("confirm-dialog")
    sync_api.expect(dialog).to_be_visible()
    sync_api.expect(page.get_by_test_id("preview")).to_contain_text("rules/fb-single-word-only.md")  # the rule goes
    sync_api.expect(page.get_by_test_id("preview").locator(".del")).not_to_have_count(0)
    shot(page, "rollback-confirm")
    page.get_by_test_id("confirm-cancel").click()  # cancelling changes nothing
    sync_api.expect(dialog).to_be_hidden()
    assert len(releases(reef)) == len(before)

    creation.get_by_test_id("rollback").click()
    sync_api.expect(page.get_by_test_id("confirm-ok")).to_be_enabled()
    page.get_by_test_id("confirm-ok").click()
    sync_api.expect(dialog).to_be_hidden()
    sync_api.expect(nodes).to_have_count(len(before) + 1)
    top = nodes.first
    sync_api.expect(top).to_contain_text("rollback")
    sync_api.expect(top).to_contain_text("head")
    after = releases(reef)
    assert len(after) == len(before) + 1 and after[0]["operation"] == "rollback"
    assert after[0]["content_id"] == first["content_id"]
    assert ask(reef)[2] == CHATTY  # served at once: the rule is gone

    # a conflict: the preview was made against a head someone else then moved
    learned = next(r for r in after if r["operation"] == "training")
    chain.locator(f"[data-release='{learned['release_id']}']").get_by_test_id("rollback").click()
    sync_api.expect(page.get_by_test_id("confirm-ok")).to_be_enabled()
    with client(reef) as c:
        moved = c.rollback(SCENARIO, first["release_id"])["release"]  # another operator, through the API
    page.get_by_test_id("confirm-ok").click()
    conflict = page.get_by_test_id("conflict")
    sync_api.expect(conflict).to_be_visible()
    sync_api.expect(conflict).to_contain_text("Conflict: someone moved the head")
    sync_api.expect(conflict).to_contain_text("Nothing was changed")
    shot(page, "conflict")
    final = releases(reef)
    assert len(final) == len(after) + 1 and final[0]["release_id"] == moved["release_id"]  # only theirs
    page.get_by_test_id("confirm-cancel").click()
    sync_api.expect(nodes).to_have_count(len(final))  # the page catches up with the moved head
    sync_api.expect(nodes.first).to_contain_text("head")
    sync_api.expect(nodes.first).to_have_attribute("data-release", moved["release_id"])
    page.mouse.move(0, 0)
    shot(page, "chain")

    page.get_by_role("link", name="Scenarios").click()
    sync_api.expect(page.get_by_test_id(f"scenario-{SCENARIO}")).to_contain_text("rollback")
    shot(page, "scenarios")
    assert TOKEN not in reef.logs()


def test_a_release_held_for_review_appears_and_is_promoted_through_the_confirmation(
    page: Any, model: ScriptedUpstream, tmp_path: Path
) -> None:
    with serve(model, tmp_path, publish="review") as reef:
        first_receipt, first_release, _ = ask(reef)
        sign_in(page, reef, where=f"#/s/{SCENARIO}/chain")
        nodes = page.get_by_test_id("chain").get_by_test_id("release")
        sync_api.expect(nodes).to_have_count(1)
        with client(reef) as c:
            c.report(first_receipt, score=0.0, feedback=FEEDBACK[0])
            for text in FEEDBACK[1:]:
                c.report(ask(reef)[0], score=0.0, feedback=text)
        pending = page.locator("[data-testid=release].pending")
        sync_api.expect(pending).to_have_count(1)  # appears by itself
        sync_api.expect(pending).to_contain_text("pending review")
        assert ask(reef)[1] == first_release  # held: not served
        pending.get_by_test_id("promote").click()
        sync_api.expect(page.get_by_test_id("preview")).to_contain_text("rules/fb-single-word-only.md")
        page.get_by_test_id("confirm-ok").click()
        sync_api.expect(page.get_by_test_id("confirm-dialog")).to_be_hidden()
        top = nodes.first
        sync_api.expect(top).to_contain_text("promote")
        sync_api.expect(top).to_contain_text("serving")
        sync_api.expect(pending).to_contain_text("promoted")
        sync_api.expect(pending.get_by_test_id("promote")).to_have_count(0)
        _, release_id, answer = ask(reef)
        assert release_id == top.get_attribute("data-release") and answer == GOOD


# Every records call the page makes is held this long in the page itself: a server slower than the poll.
SLOW_RECORDS = """
window.recordsCalls = 0; window.recordsInFlight = 0; window.mostRecordsInFlight = 0;
const realFetch = window.fetch.bind(window);
window.fetch = async (input, init) => {
  if (!String(input).includes("/records?")) return realFetch(input, init);
  window.recordsCalls += 1; window.recordsInFlight += 1;
  window.mostRecordsInFlight = Math.max(window.mostRecordsInFlight, window.recordsInFlight);
  try {
    await new Promise((resolve) => setTimeout(resolve, 2500));
    return await realFetch(input, init);
  } finally {
    window.recordsInFlight -= 1;
  }
};
"""


def test_a_slow_server_gets_one_poll_at_a_time_from_an_open_page(page: Any, reef: ReefServer) -> None:
    """The page polls every 2 s; a records call that takes 2.5 s must not start a second one
    beside it, neither from the poll nor from a navigation meanwhile."""
    ask(reef)
    page.add_init_script(SLOW_RECORDS)
    sign_in(page, reef, where=f"#/s/{SCENARIO}/records")
    page.wait_for_function("() => window.recordsInFlight === 1")
    page.evaluate(f"location.hash = '#/s/{SCENARIO}/records/'")  # a navigation while the poll waits
    page.wait_for_function("() => window.recordsCalls >= 3", timeout=WAIT_MS)
    assert page.evaluate("window.mostRecordsInFlight") == 1
    sync_api.expect(page.get_by_test_id("record-row").first).to_be_visible()


@pytest.mark.parametrize("link", ["#/s/%E0%A4%A", "#/s/%/records", f"#/s/{SCENARIO}/record/%E0%A4%A"])
def test_a_malformed_escape_in_the_link_shows_an_error_and_the_page_goes_on(
    page: Any, reef: ReefServer, link: str
) -> None:
    ask(reef)
    sign_in(page, reef, where=link)
    sync_api.expect(page.locator("main .error")).to_be_visible()  # the server says what is wrong with the name
    page.evaluate("location.hash = '#/'")
    sync_api.expect(page.get_by_test_id(f"scenario-{SCENARIO}")).to_be_visible()  # not frozen


def test_the_dashboard_works_on_a_server_without_a_token(page: Any, model: ScriptedUpstream, tmp_path: Path) -> None:
    """Token-less (the default on loopback), the page is served and its own calls pass the
    cross-site checks (same origin, a loopback Host), under `localhost` as under 127.0.0.1."""
    with serve(model, tmp_path, tokens=()) as reef:
        ask(reef)
        with client(reef) as c:
            creation = c.releases(SCENARIO)["releases"][0]
            c.rollback(SCENARIO, creation["release_id"])  # a second release, so the first can be rolled back to
        page.goto(f"http://localhost:{reef.port}/ui/#/s/{SCENARIO}/chain")  # no sign-in: no token to give
        nodes = page.get_by_test_id("chain").get_by_test_id("release")
        sync_api.expect(nodes).to_have_count(2)
        sync_api.expect(page.get_by_test_id("login-form")).to_be_hidden()
        sync_api.expect(page.get_by_test_id("logout")).to_be_hidden()  # nothing to sign out of
        page.locator(f"[data-release='{creation['release_id']}']").get_by_test_id("rollback").click()
        sync_api.expect(page.get_by_test_id("confirm-ok")).to_be_enabled()
        page.get_by_test_id("confirm-ok").click()  # a POST with this page's Origin
        sync_api.expect(page.get_by_test_id("confirm-dialog")).to_be_hidden()
        sync_api.expect(nodes).to_have_count(3)
        sync_api.expect(nodes.first).to_contain_text("rollback")
        page.get_by_test_id("tab-records").click()
        sync_api.expect(page.get_by_test_id("record-row")).to_have_count(1)


LFS_DIFF = """diff --git a/adapter_model.safetensors b/adapter_model.safetensors
index 1111111..2222222 100644
--- a/adapter_model.safetensors
+++ b/adapter_model.safetensors
@@ -1,3 +1,3 @@
 version https://git-lfs.github.com/spec/v1
-oid sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa
-size 2048
+oid sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb
+size 4096
"""


def test_an_adapter_diff_is_summarised_never_dumped(page: Any, reef: ReefServer) -> None:
    """Weights change as LFS pointers; the page names size and hash, never the bytes. (The
    scripted upstream cannot load weights, so the diff route's answer is played here.)"""
    release = releases(reef)[-1]["release_id"]
    body = {
        "scenario": SCENARIO,
        "release_id": release,
        "parent_release_id": None,
        "operation": "training",
        "changed": ["adapter_model.safetensors"],
        "diff": LFS_DIFF,
    }
    page.route("**/reef/scenarios/*/releases/*/diff", lambda route: route.fulfill(json=body))
    sign_in(page, reef, where=f"#/s/{SCENARIO}/release/{release}")
    diff = page.get_by_test_id("diff")
    sync_api.expect(diff).to_contain_text("adapter weights (LFS): 2.0 KiB (aaaaaaaaaaaa) → 4.0 KiB (bbbbbbbbbbbb)")
    sync_api.expect(diff.locator("pre")).to_have_count(0)


def test_the_weights_gate_tasks_are_named_by_their_place_in_the_tasks_file(page: Any, reef: ReefServer) -> None:
    """The weights gate's per-task results carry no excerpt, only `index`; the table shows it.
    (The scripted upstream cannot train weights, so the chain's answer is played here, in the
    shape reef/commit/gate.py writes.)"""
    chain = {"releases": releases(reef)}
    release = chain["releases"][-1]
    per_task = [{"current": 1.0, "candidate": 0.0, "index": 7}, {"current": 0.0, "candidate": 1.0, "index": 41}]
    release["verdict"] = {
        "decision": "select",
        "metrics": {"gate": "tasks", "wins": 1, "losses": 1, "per_task": per_task},
    }
    page.route(f"**/reef/scenarios/{SCENARIO}/releases", lambda route: route.fulfill(json=chain))
    sign_in(page, reef, where=f"#/s/{SCENARIO}/release/{release['release_id']}")
    view = page.get_by_test_id("release-view")
    view.locator("details summary").click()
    rows = view.locator("details tbody tr")
    sync_api.expect(rows).to_have_count(2)
    sync_api.expect(rows.nth(0).locator("td").first).to_have_text("#7")
    sync_api.expect(rows.nth(1).locator("td").first).to_have_text("#41")
