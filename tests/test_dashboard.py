"""The dashboard at `/ui`, driven in a real headless Chromium (Debian's `chromium` package under
Playwright; no browser is ever downloaded) against a real `reef serve` in front of the scripted
upstream, whose `fmt` scenario learns its harness with the `skills` recipe in a few seconds.

Checked: a wrong token is refused with a message and the token never lands in a URL, the
server's log or localStorage; a scenario and a newly learned release appear without reloading;
a record opens in full; a rollback through the confirmation dialog grows the chain; a conflict
(someone moved the head after the preview) is shown plainly and changes nothing; the static
files need no token, every data call does; on the embedded tiny model, the canary's card shows
and the records the canary served are labelled as its.

`REEF_UI_SCREENSHOTS=1` (or `scripts/ui_screenshots`) also writes the pages to docs/ui-*.png.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import openai
import pytest

from reef.client import ReefClient
from tests.helpers.reef_server import ReefServer
from tests.scripted_upstream import ScriptedUpstream

CHROMIUM = os.environ.get("REEF_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TOKEN = "ui-token-7c1e93a0b5"
SCENARIO = "fmt"
RULE_MARKER = "single word"
GOOD, CHATTY = "4", "Sure! The answer is 4."
FEEDBACK = ["Answer with a single word only.", "Only a single word answer, please.", "Answer with a single word only!"]
DOCS = Path(__file__).resolve().parents[1] / "docs"
SCREENSHOTS = os.environ.get("REEF_UI_SCREENSHOTS") == "1"
WAIT_MS = 30_000

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install '.[test]')")
if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
    pytest.skip(f"no chromium at {CHROMIUM}: `apt-get install -y chromium` (.ci/run does)", allow_module_level=True)


def exact_answer(task: dict[str, Any], text: str) -> float:
    """The gate's scorer, loaded by dotted path: the answer and nothing else."""
    return 1.0 if text.strip() == task["expected"] else 0.0


@pytest.fixture(scope="module")
def model() -> Iterator[ScriptedUpstream]:
    """A stand-in model that answers tersely only when a rule in its system prompt asks."""
    with ScriptedUpstream() as upstream:
        upstream.answer_by_system({RULE_MARKER: GOOD}, otherwise=CHATTY)
        yield upstream


def serve(model: ScriptedUpstream, work: Path, publish: str = "auto", tokens: tuple[str, ...] = (TOKEN,)) -> ReefServer:
    """`reef serve` whose `fmt` scenario learns a rule after three failures with the same feedback."""
    tasks = work / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"prompt": f"What is {i}+{4 - i}?", "expected": "4"}) + "\n" for i in range(4)))
    settings = {
        "tokens": list(tokens),
        "log_level": "info",
        "upstream": {"url": model.base_url, "model": "scripted"},
        "recipes": {"scenarios": {SCENARIO: "skills"}},
        "learner": {
            "poll_interval": 0.05,
            "skills": {
                "proposer": "distill",
                "min_recurrence": 3,
                "batch_size": 8,
                "successes": 0,
                "gate": {
                    "tasks": str(tasks),
                    "scorer": "tests.test_dashboard:exact_answer",
                    "margin": 1,
                    "publish": publish,
                },
            },
        },
    }
    return ReefServer(work, settings)


@pytest.fixture(scope="module")
def reef(model: ScriptedUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReefServer]:
    with serve(model, tmp_path_factory.mktemp("reef-ui")) as server:
        yield server


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 860}, device_scale_factor=1)
    context.set_default_timeout(WAIT_MS)
    tab = context.new_page()
    tab.seen = []  # (url, authorization header) of every request the page made
    tab.on("request", lambda r: tab.seen.append((r.url, r.headers.get("authorization"))))
    tab.errors = []
    tab.on("pageerror", lambda e: tab.errors.append(str(e)))
    yield tab
    context.close()
    assert not tab.errors, f"JavaScript errors on the page: {tab.errors}"


def client(reef: ReefServer) -> ReefClient:
    return ReefClient(reef.url, TOKEN)


def ask(reef: ReefServer, text: str = "What is 2+2?", session: str | None = None) -> tuple[str, str, str]:
    """One request of the scenario: (receipt, release id, answer)."""
    oai = openai.OpenAI(base_url=reef.base_url, api_key=TOKEN, max_retries=0, timeout=30)
    headers = {"x-reef-scenario": SCENARIO, **({"x-reef-session": session} if session else {})}
    raw = oai.chat.completions.with_raw_response.create(
        model="any", messages=[{"role": "user", "content": text}], extra_headers=headers
    )
    return (
        raw.headers["x-reef-agent-record-id"],
        raw.headers["x-reef-release-id"],
        raw.parse().choices[0].message.content or "",
    )


def wait_for(condition: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def releases(reef: ReefServer) -> list[dict[str, Any]]:
    with client(reef) as c:
        return c.releases(SCENARIO)["releases"]


def sign_in(page: Any, reef: ReefServer, token: str = TOKEN, where: str = "") -> None:
    page.goto(f"{reef.url}/ui/{where}")
    page.get_by_test_id("token").fill(token)
    page.get_by_test_id("sign-in").click()


def shot(page: Any, name: str) -> None:
    if SCREENSHOTS:
        page.wait_for_timeout(300)  # let the last poll's render settle
        page.screenshot(path=str(DOCS / f"ui-{name}.png"), full_page=True)


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
    assert data_calls and all(header in (f"Bearer {TOKEN}", "Bearer not-the-token") for _, header in data_calls)
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
    shot(page, "records")
    newest.get_by_role("link").click()
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
        page.goto(f"http://localhost:{reef.port}/ui/#/s/{SCENARIO}/chain")
        page.get_by_test_id("sign-in").click()  # no token to give
        nodes = page.get_by_test_id("chain").get_by_test_id("release")
        sync_api.expect(nodes).to_have_count(2)
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


def serve_tiny(model_dir: Path, work: Path) -> ReefServer:
    """`reef serve` running the embedded tiny model whose `tiny` scenario learns weights with
    `sao`: a LoRA step per four scored samples, judged by the offline gate on held-out reports
    (a generous bound: this shows the page following learning, not the gate's taste); the
    candidate under test serves half its requests (the canary)."""
    settings = {
        "tokens": [TOKEN],
        "log_level": "info",
        "embedded": {"model_dir": str(model_dir), "default_max_tokens": 8, "threads": 1},
        "recipes": {"scenarios": {TINY: "sao"}},
        "learner": {
            "poll_interval": 0.1,
            "train_threads": 1,
            "canary": {TINY: 0.5},
            "canary_max_fraction": 0.5,
            "sao": {"batch_size": 4, "steps_per_candidate": 1, "lr": 0.01, "max_staleness": 5},
            "gate": {"holdout_fraction": 0.5, "offline_bound": 1000.0},
        },
    }
    return ReefServer(work, settings)


TINY = "tiny"


def test_the_tiny_model_learns_and_the_open_page_shows_the_new_release_in_the_chain_and_on_the_curve(
    page: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The embedded model, real LoRA training in the training process, the gate, a published
    adapter: the page, opened before any of it and never reloaded, shows the new release."""
    with serve_tiny(tiny_model_dir, tmp_path) as reef:
        oai = openai.OpenAI(base_url=reef.base_url, api_key=TOKEN, max_retries=0, timeout=60)

        def ask_and_report(n: int, offset: int = 0) -> None:
            with client(reef) as c:
                for i in range(offset, offset + n):
                    raw = oai.chat.completions.with_raw_response.create(
                        model="tiny",
                        messages=[{"role": "user", "content": f"Say {i}."}],
                        temperature=1.0,
                        extra_headers={"x-reef-scenario": TINY},
                    )
                    c.report(raw.headers["x-reef-agent-record-id"], score=float(i % 2))

        def trained() -> list[dict[str, Any]]:
            with client(reef) as c:
                return [r for r in c.releases(TINY)["releases"] if r["operation"] == "training"]

        ask_and_report(1)
        sign_in(page, reef, where=f"#/s/{TINY}/chain")
        nodes = page.get_by_test_id("chain").get_by_test_id("release")
        sync_api.expect(nodes).to_have_count(1)  # the creation only
        url_before = page.url
        page.evaluate("window.reefTestMarker = 'not reloaded'")  # gone if the page ever reloads
        deadline, sent = time.monotonic() + 90, 1
        while not trained() and time.monotonic() < deadline:  # scored traffic until a candidate is published
            ask_and_report(4, sent)
            sent += 4
        published = wait_for(trained, timeout=max(deadline - time.monotonic(), 1.0), what="a published adapter")[-1]
        learned = page.locator(f"[data-testid=release][data-release='{published['release_id']}']")
        sync_api.expect(learned).to_have_count(1)  # appears by itself: the page polls
        assert page.url == url_before
        sync_api.expect(learned).to_contain_text("select")
        sync_api.expect(learned).to_contain_text("weights")
        assert published["verdict"]["metrics"]["gate"] == "offline"

        page.get_by_test_id("tab-curve").click()  # the same page: a tab, not a reload
        table = page.get_by_test_id("curve-table")
        sync_api.expect(table.locator("tbody tr")).not_to_have_count(1)
        sync_api.expect(table).to_contain_text(published["release_id"][:8])
        sync_api.expect(page.get_by_test_id("curve").locator("line.tick")).not_to_have_count(1)  # one per release
        sync_api.expect(page.get_by_test_id("curve").locator("line.live-bar")).not_to_have_count(1)  # scored traffic
        assert page.url == f"{reef.url}/ui/#/s/{TINY}/curve"  # a hash change: the page was never reloaded
        assert page.evaluate("window.reefTestMarker") == "not reloaded"
        sync_api.expect(page.get_by_test_id("canary")).to_contain_text("50%")  # the canary's card
        sync_api.expect(page.get_by_test_id("canary")).to_contain_text("withdrawn")
        shot(page, "canary")

        records = httpx.get(
            f"{reef.url}/reef/scenarios/{TINY}/records",
            params={"limit": 50},
            headers={"Authorization": f"Bearer {TOKEN}"},
        ).json()["records"]
        by_canary = [r for r in records if str(r["release_id"]).startswith("canary-")]  # labelled as the canary's
        page.get_by_test_id("tab-records").click()
        rows = page.get_by_test_id("record-row")
        sync_api.expect(rows).to_have_count(len(records))
        for r in by_canary[:3]:
            label = f"canary {r['release_id'][len('canary-') :][:10]}"
            sync_api.expect(page.locator(f"[data-record='{r['id']}']")).to_contain_text(label)


def test_screenshots_exist_when_asked() -> None:
    if not SCREENSHOTS:
        pytest.skip("REEF_UI_SCREENSHOTS=1 writes docs/ui-*.png")
    for name in (
        "login",
        "scenarios",
        "chain",
        "curve",
        "records",
        "record",
        "diff",
        "rollback-confirm",
        "conflict",
        "canary",
    ):
        assert (DOCS / f"ui-{name}.png").stat().st_size > 10_000, name
