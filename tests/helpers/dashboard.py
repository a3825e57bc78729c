"""What the dashboard's browser tests share (tests/test_dashboard.py, tests/test_dashboard_operator.py):
Debian's `chromium` under Playwright (never a downloaded browser), a real `reef serve` in front
of the scripted upstream whose `fmt` scenario learns a rule with the `skills` recipe, and the
embedded tiny model's `tiny` scenario learning weights with `sao` and a canary.

Import the fixtures (`model`, `browser`, `page`) into a test module to use them there.
`REEF_UI_SCREENSHOTS=1` (or `scripts/ui_screenshots`) makes `shot` write docs/ui-*.png.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterator

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
DOCS = Path(__file__).resolve().parents[2] / "docs"
SCREENSHOTS = os.environ.get("REEF_UI_SCREENSHOTS") == "1"
WAIT_MS = 30_000


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
                    "scorer": "tests.helpers.dashboard:exact_answer",
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
    from playwright.sync_api import sync_playwright  # here: a module importing this one first skips without it

    with sync_playwright() as playwright:
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


TINY = "tiny"


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
