"""What an operator lives in on the dashboard, driven in a real headless Chromium (as
tests/test_dashboard.py) against a real `reef serve`: every candidate with its fate and the
gate's numbers, counted from the commit log (the same after a restart); records paged past the
newest 50, filtered, with the client that sent them, and one conversation's turns; on the
embedded tiny model learning weights, the training curves of each candidate, the canary's
traffic on the learning curve, a weights release's training summary in place of its adapter's
files, and a label that wraps instead of being clipped.

`REEF_UI_SCREENSHOTS=1` (or `scripts/ui_screenshots`) also writes docs/ui-*.png.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.helpers import dashboard as ui
from tests.helpers.dashboard import (
    CHROMIUM,
    DOCS,
    FEEDBACK,
    SCENARIO,
    SCREENSHOTS,
    TINY,
    TOKEN,
    ask,
    client,
    serve,
    serve_tiny,
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

CODEX_AGENT = "codex_cli_rs/0.171.0 (Debian 12; x86_64) xterm"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def learn_a_rule(reef: ReefServer) -> None:
    """Three failures with the same complaint: the `fmt` scenario's learner publishes a rule."""
    with client(reef) as c:
        for text in FEEDBACK:
            c.report(ask(reef)[0], score=0.0, feedback=text)
    wait_for(lambda: candidates(reef, SCENARIO)["counts"]["published"] == 1, what="the learned rule")


def candidates(reef: ReefServer, scenario: str) -> dict[str, Any]:
    return httpx.get(f"{reef.url}/reef/scenarios/{scenario}/candidates", headers=AUTH).json()


def learner_of(reef: ReefServer, scenario: str) -> dict[str, Any]:
    status = httpx.get(f"{reef.url}/reef/status", headers=AUTH).json()
    return next(learner for learner in status["learning"]["learners"] if learner["scenario"] == scenario)


def test_candidates_and_the_learner_counts_come_from_the_commit_log_and_survive_a_restart(
    page: Any, model: ScriptedUpstream, tmp_path: Path
) -> None:
    with serve(model, tmp_path) as first:
        learn_a_rule(first)
    with serve(model, tmp_path) as again:  # the same state directory: a restart
        assert learner_of(again, SCENARIO)["published"] == 0  # the process's own counter starts over
        sign_in(page, again, where=f"#/s/{SCENARIO}/candidates")
        sync_api.expect(page.get_by_test_id("learner-card")).to_contain_text("1 published")
        row = page.locator("[data-testid=candidate-row][data-fate=published]")
        sync_api.expect(row).to_have_count(1)
        sync_api.expect(row.get_by_test_id("gate")).to_contain_text("select")
        sync_api.expect(row.get_by_role("link", name="release")).to_have_count(1)  # the release it became
        sync_api.expect(page.get_by_test_id("candidate-counts")).to_contain_text("1 published")


def test_records_page_past_fifty_filter_by_client_and_score_and_open_a_session(page: Any, reef: ReefServer) -> None:
    oai = openai.OpenAI(base_url=reef.base_url, api_key=TOKEN, max_retries=0, timeout=30)
    for i in range(52):  # the openai SDK names itself in its User-Agent
        oai.chat.completions.create(
            model="any", messages=[{"role": "user", "content": f"q{i}"}], extra_headers={"x-reef-scenario": SCENARIO}
        )
    receipts = []
    for turn in range(3):  # one conversation of another client
        answer = httpx.post(
            f"{reef.base_url}/chat/completions",
            json={"model": "any", "messages": [{"role": "user", "content": f"turn {turn}"}]},
            headers={**AUTH, "user-agent": CODEX_AGENT, "x-reef-scenario": SCENARIO, "x-reef-session": "codex-s1"},
        )
        receipts.append(answer.headers["x-reef-agent-record-id"])
    with client(reef) as c:
        for receipt in receipts[1:]:
            c.report(receipt, score=1.0, feedback="right")
    total = httpx.get(f"{reef.url}/reef/scenarios/{SCENARIO}", headers=AUTH).json()["records"]

    seen, before = [], None  # the listing's pages, by seq, cover every record once
    while True:
        listing = httpx.get(
            f"{reef.url}/reef/scenarios/{SCENARIO}/records",
            params={"limit": 50, **({"before_seq": before} if before else {})},
            headers=AUTH,
        ).json()
        seen += [r["id"] for r in listing["records"]]
        before = listing["next_before_seq"]
        if before is None:
            break
    assert len(seen) == len(set(seen)) == total

    sign_in(page, reef, where=f"#/s/{SCENARIO}/records")
    rows = page.get_by_test_id("record-row")
    sync_api.expect(rows).to_have_count(50)
    sync_api.expect(rows.first.get_by_test_id("client")).to_have_text(CODEX_AGENT.split(" ")[0])
    sync_api.expect(rows.nth(3).get_by_test_id("client")).to_contain_text("OpenAI/Python")
    page.get_by_test_id("records-older").click()
    sync_api.expect(rows).to_have_count(total - 50)
    page.get_by_test_id("records-newest").click()
    sync_api.expect(rows).to_have_count(50)

    page.get_by_test_id("filter-client").fill("codex")
    page.get_by_test_id("filter-apply").click()
    sync_api.expect(rows).to_have_count(3)
    page.get_by_test_id("filter-min_score").fill("1")
    page.get_by_test_id("filter-apply").click()
    sync_api.expect(rows).to_have_count(2)
    sync_api.expect(page.get_by_test_id("filter-client")).to_have_value("codex")  # the filters stay in the link
    assert "client%3Dcodex" in page.url
    shot(page, "records")

    rows.first.get_by_test_id("session-link").click()
    turns = page.get_by_test_id("turn")
    sync_api.expect(turns).to_have_count(3)
    for i, receipt in enumerate(receipts):  # all turns of the conversation, oldest first
        sync_api.expect(turns.nth(i)).to_have_attribute("data-record", receipt)
        sync_api.expect(turns.nth(i)).to_contain_text(f"turn {i}")
    sync_api.expect(page.get_by_test_id("session")).to_contain_text(CODEX_AGENT)
    shot(page, "session")


def test_how_a_scenario_learns_shows_where_the_server_says_it_and_a_long_label_is_not_clipped(
    page: Any, reef: ReefServer
) -> None:
    """`training_mode` and `instructions` come from other parts of the server, the canary from a
    weights learner: the answers are played here (the scripted upstream learns a harness)."""
    ask(reef)
    scenario = httpx.get(f"{reef.url}/reef/scenarios/{SCENARIO}", headers=AUTH).json()
    scenario.update(training_mode="hybrid", instructions="Prefer one-word answers.")
    status = httpx.get(f"{reef.url}/reef/status", headers=AUTH).json()
    canary = {"fraction": 0.5, "running": True, "release_id": "canary-0123456789abcdef", "withdrawn": 0}
    status["learning"]["learners"] = [{**learner_of(reef, SCENARIO), "canary": canary}]
    page.route(f"**/reef/scenarios/{SCENARIO}", lambda route: route.fulfill(json=scenario))
    page.route(  # the page's first call, without a token, still meets the server: it asks for one
        "**/reef/status",
        lambda route: route.fulfill(json=status) if route.request.headers.get("authorization") else route.continue_(),
    )
    sign_in(page, reef, where=f"#/s/{SCENARIO}/chain")
    mode = page.get_by_test_id("scenario-mode")
    sync_api.expect(mode).to_contain_text("hybrid")
    sync_api.expect(mode.get_by_test_id("instructions")).to_contain_text("Prefer one-word answers.")
    label = page.get_by_test_id("canary").locator(".big")
    sync_api.expect(label).to_have_text("50% · canary 0123456789")
    assert label.evaluate("el => el.scrollWidth <= el.clientWidth"), "the canary's label is clipped"


def test_the_tiny_model_learns_and_the_open_page_shows_candidates_training_curves_and_canaries(
    page: Any, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The embedded model, real LoRA training in the training process, the gate, a published
    adapter, a canary at half the requests: the page, opened before any of it and never
    reloaded, shows the new release, each candidate's steps and the canary's traffic."""
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

        def ready() -> bool:  # a published adapter and a canary's scored traffic
            rows = candidates(reef, TINY)["candidates"]
            published = any(r["fate"] == "published" for r in rows)
            return published and any(r["canary"] and r["canary"]["reports"] for r in rows)

        ask_and_report(1)
        sign_in(page, reef, where=f"#/s/{TINY}/chain")
        nodes = page.get_by_test_id("chain").get_by_test_id("release")
        sync_api.expect(nodes).to_have_count(1)  # the creation only
        page.evaluate("window.reefTestMarker = 'not reloaded'")  # gone if the page ever reloads
        deadline, sent = time.monotonic() + 120, 1
        while not ready() and time.monotonic() < deadline:
            ask_and_report(4, sent)
            sent += 4
        assert ready(), "no published adapter and scored canary traffic within 120 s"
        rows = candidates(reef, TINY)["candidates"]
        published = next(r for r in rows if r["fate"] == "published")
        assert published["steps"] and {"loss", "kl", "clipped_fraction", "tokens", "advantage"} <= set(
            published["steps"][0]
        )
        learned = page.locator(f"[data-testid=release][data-release='{published['release_id']}']")
        sync_api.expect(learned).to_contain_text("weights")  # appears by itself: the page polls

        page.get_by_test_id("tab-curve").click()  # the same page: a tab, not a reload
        sync_api.expect(page.get_by_test_id("curve").get_by_test_id("canary-mark")).not_to_have_count(0)
        sync_api.expect(page.get_by_test_id("canary-table")).to_contain_text("canary")
        for big in page.locator(".card .big").all():  # a long label (the canary's) wraps, never clipped
            assert big.evaluate("el => el.scrollWidth <= el.clientWidth"), big.inner_text()
        shot(page, "canary")

        page.get_by_test_id("tab-candidates").click()
        table = page.get_by_test_id("candidates")
        sync_api.expect(table.locator(f"[data-batch='{published['batch_id']}']")).to_contain_text("published")
        sync_api.expect(page.get_by_test_id("train-loss").locator("circle")).not_to_have_count(0)
        sync_api.expect(page.get_by_test_id("train-kl").locator("circle")).not_to_have_count(0)
        assert page.evaluate("window.reefTestMarker") == "not reloaded"
        shot(page, "candidates")

        page.get_by_test_id("candidates").get_by_role("link", name=f"release {published['release_id'][:10]}").click()
        summary = page.get_by_test_id("training-summary")
        sync_api.expect(summary).to_contain_text("loss")
        sync_api.expect(summary).to_contain_text(f"{published['records']}")
        sync_api.expect(page.get_by_test_id("diff")).to_be_hidden()  # the adapter's files: folded away
        page.get_by_test_id("adapter-files").locator("summary").click()
        sync_api.expect(page.get_by_test_id("diff")).to_contain_text("adapter weights (LFS)")
        page.get_by_test_id("adapter-files").locator("summary").click()
        shot(page, "weights")

        records = httpx.get(f"{reef.url}/reef/scenarios/{TINY}/records", params={"limit": 50}, headers=AUTH).json()
        by_canary = [r for r in records["records"] if str(r["release_id"]).startswith("canary-")]
        page.get_by_role("link", name=TINY).first.click()
        page.get_by_test_id("tab-records").click()
        sync_api.expect(page.get_by_test_id("record-row")).to_have_count(len(records["records"]))
        for r in by_canary[:3]:  # labelled as the canary's
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
        "candidates",
        "session",
        "weights",
    ):
        assert (DOCS / f"ui-{name}.png").stat().st_size > 10_000, name
