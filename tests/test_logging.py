"""Reef's own log, through a real `reef serve` (log_format json, then text) in front of a scripted
upstream: one line per request with its receipt, scenario, release, dialect, route, status,
latency and tokens (plain and streaming, OpenAI and Anthropic, a refused request, a report);
learner and gate events at info; and nothing in the log holds the bearer token, the upstream key,
a prompt, an answer or a report's feedback. Also the upstream side of /metrics: time to first
token per route and scenario, and the learners' counters."""

from __future__ import annotations

import json
import re
import time
from typing import Any, Callable, Iterator

import httpx
import pytest

from tests.helpers.reef_server import ReefServer
from tests.scripted_upstream import ScriptedUpstream

TOKEN = "log-token-61c0a9e2"
UPSTREAM_KEY = "sk-upstream-logkey-4f7b"
PROMPT = "prompt-marker-a81f3 what is the tide doing"
ANSWER = "answer-marker-9c2d7 the tide is high"
FEEDBACK = "feedback-marker-5e0b1 too wordy"
REFUSED_TEXT = "refused-marker-33d8"
RULE_MARKER = "single word"
GOOD, CHATTY = "4", "Sure! The answer is 4 (chatty-marker-7d21)."
LEARN_FEEDBACK = [
    "Answer with a single word only.",
    "Only a single word answer, please.",
    "Answer with a single word only!",
]
FIELDS = (
    "receipt",
    "scenario",
    "release_id",
    "dialect",
    "route",
    "status",
    "latency_ms",
    "prompt_tokens",
    "completion_tokens",
)
VALUE = r'"(?:[^"\\]|\\.)*"|[^\s"]*'  # a JSON-quoted string, or a bare word
LINE = re.compile(rf"^(\S+) ([A-Z]+) (\S+) (.*?)((?: \w+=(?:{VALUE}))*)$")  # ts LEVEL logger message key=value...
FIELD = re.compile(rf"(\w+)=({VALUE})")


def exact_answer(task: dict[str, Any], text: str) -> float:
    """The harness gate's scorer, loaded by dotted path."""
    return 1.0 if text.strip() == task["expected"] else 0.0


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedUpstream]:
    """Scripted answers first; with none queued, a stand-in model that answers GOOD only when the
    system prompt carries the rule the harness learner will propose."""
    with ScriptedUpstream() as up:
        up.answer_by_system({RULE_MARKER: GOOD}, otherwise=CHATTY)
        yield up


@pytest.fixture(scope="module", params=["json", "text"])
def reef(
    request: pytest.FixtureRequest, upstream: ScriptedUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ReefServer]:
    work = tmp_path_factory.mktemp(f"reef-log-{request.param}")
    tasks = work / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"prompt": f"What is {i}+{4 - i}?", "expected": "4"}) + "\n" for i in range(4)))
    settings = {
        "tokens": [TOKEN],
        "log_level": "info",
        "log_format": request.param,
        "upstream": {"url": upstream.base_url, "model": "provider-model", "api_key": UPSTREAM_KEY, "timeout": 5},
        "recipes": {"scenarios": {"fmt": "skills", "logs": "sao"}},  # logs: a weights recipe, idle here
        "learner": {
            "poll_interval": 0.05,
            "skills": {
                "proposer": "distill",
                "min_recurrence": 3,
                "batch_size": 8,
                "successes": 0,
                "gate": {"tasks": str(tasks), "scorer": "tests.test_logging:exact_answer", "margin": 1},
            },
        },
    }
    with ReefServer(work, settings) as server:
        server.log_format = request.param  # type: ignore[attr-defined]
        yield server


def auth(token: str = TOKEN) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def parse(reef: ReefServer) -> list[dict[str, Any]]:
    """Every log line as a dict (`logger`, `message`, then the fields); json lines must all be JSON."""
    lines = [line for line in reef.logs().splitlines() if line.strip()]
    if reef.log_format == "json":  # type: ignore[attr-defined]
        return [json.loads(line) for line in lines]  # one object per line, every line
    out = []
    for line in lines:
        match = LINE.match(line)
        if not match or line.startswith("reef: "):
            continue  # the startup banner, a traceback's lines
        _, level, logger, message, rest = match.groups()
        fields = {key: _value(raw) for key, raw in FIELD.findall(rest or "")}
        out.append({"level": level.lower(), "logger": logger, "message": message, **fields})
    return out


def _value(raw: str) -> Any:
    if raw == "-":
        return None
    if raw.startswith('"'):
        return json.loads(raw)
    if raw in ("true", "false"):
        return raw == "true"
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            pass
    return raw


def wait_for(condition: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def request_lines(reef: ReefServer) -> list[dict[str, Any]]:
    return [e for e in parse(reef) if e["logger"] == "reef.request"]


def test_every_request_gets_one_line_with_its_fields(reef: ReefServer, upstream: ScriptedUpstream) -> None:
    chat = {"model": "gpt-test", "messages": [{"role": "user", "content": PROMPT}]}
    anth = {"model": "claude-test", "max_tokens": 50, "messages": [{"role": "user", "content": PROMPT}]}
    sent: list[tuple[httpx.Response, str, str, bool]] = []  # response, dialect, route, stream
    for stream in (False, True):
        upstream.script(text=ANSWER, usage=(11, 7))
        r = httpx.post(
            f"{reef.base_url}/chat/completions",
            json={**chat, "stream": stream},
            headers={**auth(), "x-reef-scenario": "logs"},
        )
        sent.append((r, "openai", "chat_completions", stream))
        upstream.script(text=ANSWER, usage=(13, 5))
        r = httpx.post(
            f"{reef.url}/v1/messages",
            json={**anth, "stream": stream},
            headers={"x-api-key": TOKEN, "x-reef-scenario": "logs"},
        )
        sent.append((r, "anthropic", "messages", stream))
    for response, *_ in sent:
        assert response.status_code == 200, response.text
        assert ANSWER.split()[0] in response.text
    refused = httpx.post(f"{reef.base_url}/chat/completions", json=chat, headers=auth(TOKEN + "-typo"))
    malformed = httpx.post(
        f"{reef.url}/v1/messages",
        json={"model": "m", "messages": REFUSED_TEXT},
        headers={"x-api-key": TOKEN, "x-reef-scenario": "logs"},
    )
    assert refused.status_code == 401 and malformed.status_code == 400
    receipt = sent[0][0].headers["x-reef-agent-record-id"]
    report = httpx.post(
        f"{reef.url}/reef/report", json={"references": [receipt], "score": 0.5, "feedback": FEEDBACK}, headers=auth()
    )
    assert report.status_code == 200, report.text

    lines = wait_for(
        lambda: (ls := request_lines(reef)) and any(e.get("path") == "/reef/report" for e in ls) and ls,
        what="the report's line",
    )
    for response, dialect, route, stream in sent:
        receipt = response.headers["x-reef-agent-record-id"]
        mine = [e for e in lines if e.get("receipt") == receipt]
        assert len(mine) == 1, (receipt, mine)
        line = mine[0]
        assert set(FIELDS) <= set(line), line
        assert line["level"] == "info" and line["message"] == "request"
        assert (
            line["scenario"],
            line["release_id"],
            line["dialect"],
            line["route"],
            line["status"],
            line["stream"],
        ) == ("logs", response.headers["x-reef-release-id"], dialect, route, 200, stream)
        assert line["latency_ms"] > 0
        assert (line["prompt_tokens"], line["completion_tokens"]) == ((11, 7) if dialect == "openai" else (13, 5))
    unauthorized = [e for e in lines if e.get("status") == 401]
    assert len(unauthorized) == 1
    assert unauthorized[0]["receipt"] is None and unauthorized[0]["route"] == "chat_completions"
    assert unauthorized[0]["dialect"] == "openai" and unauthorized[0]["latency_ms"] >= 0
    bad = [e for e in lines if e.get("status") == 400]
    assert len(bad) == 1 and bad[0]["route"] == "messages" and bad[0]["scenario"] == "logs"
    reports = [e for e in lines if e.get("path") == "/reef/report"]
    assert len(reports) == 1 and reports[0]["status"] == 200 and reports[0]["method"] == "POST"
    # reads are debug: a status poll or a scrape adds no info line
    httpx.get(f"{reef.url}/reef/status", headers=auth())
    httpx.get(f"{reef.url}/metrics", headers=auth())
    time.sleep(0.2)
    assert not [e for e in request_lines(reef) if e.get("path") in ("/reef/status", "/metrics")]


def test_learner_and_gate_events_are_logged(reef: ReefServer, upstream: ScriptedUpstream) -> None:
    events = lambda: [e for e in parse(reef) if e["logger"] == "reef.learning"]  # noqa: E731
    _ask(reef)  # the scenario's first request creates it, and its learner
    started = wait_for(lambda: [e for e in events() if e["message"] == "learner started"], what="the fmt learner")
    assert started[0]["scenario"] == "fmt" and started[0]["recipe"] == "skills" and started[0]["level"] == "info"
    for text in LEARN_FEEDBACK:  # recurring feedback: the distill proposer makes a rule, the gate judges it
        receipt = _ask(reef)
        assert (
            httpx.post(
                f"{reef.url}/reef/report",
                json={"references": [receipt], "score": 0.0, "feedback": text},
                headers=auth(),
            ).status_code
            == 200
        )
    verdict = wait_for(
        lambda: [e for e in events() if e["message"] == "gate verdict"], timeout=60, what="a gate verdict line"
    )[0]
    assert verdict["scenario"] == "fmt" and verdict["decision"] == "select" and verdict["level"] == "info"
    assert verdict["batch_id"] and verdict["seconds"] >= 0 and verdict["gate_wins"] == 4
    releases = httpx.get(f"{reef.url}/reef/scenarios/fmt/releases", headers=auth()).json()["releases"]
    assert verdict["head_release_id"] == releases[0]["release_id"] and releases[0]["operation"] == "training"
    idle = [e for e in events() if e["message"] == "no learner"]
    assert idle and idle[0]["reason"] == "the upstream runtime cannot load trained weights"
    metrics = httpx.get(f"{reef.url}/metrics", headers=auth()).text
    assert 'reef_learner_published_total{recipe="skills",scenario="fmt"} 1.0' in metrics
    assert 'reef_learner_candidates_total{recipe="skills",scenario="fmt"} 1.0' in metrics


def _ask(reef: ReefServer) -> str:
    r = httpx.post(
        f"{reef.base_url}/chat/completions",
        headers={**auth(), "x-reef-scenario": "fmt"},
        json={"model": "m", "messages": [{"role": "user", "content": "What is 2+2?"}]},
    )
    assert r.status_code == 200, r.text
    return r.headers["x-reef-agent-record-id"]


def test_time_to_first_token_is_a_histogram_per_route_and_scenario(reef: ReefServer) -> None:
    metrics = httpx.get(f"{reef.url}/metrics", headers=auth()).text
    for route in ("chat_completions", "messages"):
        count = re.search(rf'reef_time_to_first_token_seconds_count{{route="{route}",scenario="logs"}} (\S+)', metrics)
        assert count and float(count.group(1)) == 1.0, route  # one stream each; plain requests are not counted
    assert "reef_embedded_queue_wait_seconds_count 0.0" in metrics  # the upstream runtime has no queue
    assert "reef_runtime_loads" not in metrics  # nor resident loads of its own


def test_nothing_secret_or_private_reaches_the_logs(reef: ReefServer) -> None:
    logs = reef.logs()
    assert "reef.request" in logs and "gate verdict" in logs  # the other tests ran first and were logged
    for secret in (
        TOKEN,
        UPSTREAM_KEY,
        PROMPT,
        ANSWER,
        FEEDBACK,
        REFUSED_TEXT,
        CHATTY,
        *LEARN_FEEDBACK,
        "What is 2+2",
        "tide",
        "marker",
    ):
        assert secret not in logs, secret
