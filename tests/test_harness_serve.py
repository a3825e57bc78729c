"""The harness as served: a seeded scenario's requests carry it to the runtime (inject mode, both
client dialects and both upstream dialects), pull mode leaves requests alone and clients fetch
it with GET /reef/harness, releases show their diff, and review-held releases are promoted.

A real `reef serve` in front of a scripted upstream; assertions are on what the upstream
received and on the records Reef kept."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import anthropic
import httpx
import openai
import pytest

from reef.client import ReefClient, ReefClientError
from reef.commit.artifacts import ArtifactStore
from reef.commit.commit_log import JsonlCommitLog
from reef.commit.release_chain import Candidate, ReleaseChain
from reef.core.canonical import scenario_key
from reef.core.types import ArtifactKind, Verdict
from reef.surfaces.harness import HarnessTree, Mutation, render_system
from tests.helpers.reef_server import ReefServer
from tests.scripted_upstream import ScriptedUpstream

TOKEN = "harness-token-5d1e"
SYSTEM = "You are the Reef test agent."
RULE = "Always name the file you changed."
SKILL_BODY = "Check for the empty string before parsing a token."
USER = [{"role": "user", "content": "fix the parser"}]


def write_seed(root: Path) -> Path:
    (root / "rules").mkdir(parents=True)
    (root / "skills" / "empty-token").mkdir(parents=True)
    (root / "system.md").write_text(SYSTEM + "\n")
    (root / "rules" / "name-files.md").write_text(RULE + "\n")
    (root / "skills" / "empty-token" / "SKILL.md").write_text(
        f"---\nname: empty-token\ndescription: Handling empty tokens\n---\n{SKILL_BODY}\n"
    )
    return root


@pytest.fixture(scope="module")
def seed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_seed(tmp_path_factory.mktemp("seed"))


def settings(upstream: ScriptedUpstream, seed: Path, dialect: str = "openai") -> dict:
    return {
        "tokens": [TOKEN],
        "learner": {"enabled": False},
        "recipes": {"default": "skills"},
        "upstream": {
            "url": upstream.base_url if dialect == "openai" else upstream.root_url,
            "model": "provider-model",
            "dialect": dialect,
            "timeout": 5,
        },
        "harness": {"seed_dir": str(seed), "scenarios": {"pulled": {"mode": "pull"}}},
    }


@pytest.fixture(scope="module")
def reef(upstream: ScriptedUpstream, seed: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReefServer]:
    with ReefServer(tmp_path_factory.mktemp("reef"), settings(upstream, seed)) as server:
        yield server


@pytest.fixture(autouse=True)
def fresh_script(upstream: ScriptedUpstream) -> None:
    upstream.clear()


@pytest.fixture
def oai(reef: ReefServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=reef.base_url, api_key=TOKEN, max_retries=0, timeout=20)


@pytest.fixture
def ant(reef: ReefServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=reef.url, api_key=TOKEN, max_retries=0, timeout=20)


@pytest.fixture
def client(reef: ReefServer) -> Iterator[ReefClient]:
    with ReefClient(reef.url, TOKEN) as c:
        yield c


def seed_tree(seed: Path) -> HarnessTree:
    return HarnessTree.from_dir(seed)


def sent_system(upstream: ScriptedUpstream) -> str | None:
    """The system prompt of the last request the upstream received (either dialect)."""
    body = upstream.requests[-1].body
    if "system" in body:
        return body["system"]
    first = body["messages"][0]
    return first["content"] if first["role"] == "system" else None


# -- inject mode ---------------------------------------------------------------------------------


def test_openai_client_requests_carry_the_seeded_harness_and_the_record_says_what_was_added(
    oai: openai.OpenAI, upstream: ScriptedUpstream, client: ReefClient, seed: Path
) -> None:
    headers = {"x-reef-scenario": "inject-oai"}
    raw = oai.chat.completions.with_raw_response.create(model="m", messages=USER, extra_headers=headers)
    expected = render_system(seed_tree(seed), "fix the parser")
    assert sent_system(upstream) == expected
    assert SYSTEM in expected and RULE in expected and "- empty-token: Handling empty tokens" in expected
    assert SKILL_BODY not in expected  # not mentioned, so only the catalogue line
    assert upstream.requests[-1].body["messages"][1:] == USER
    record = client.record(raw.headers["x-reef-agent-record-id"])["record"]
    assert record["harness"]["content_id"] == seed_tree(seed).content_id
    assert record["harness"]["skills"] == [] and record["harness"]["mode"] == "inject"
    assert record["request"]["messages"][0] == {"role": "system", "content": expected}  # as sent
    creation = client.releases("inject-oai")["releases"][-1]
    assert raw.headers["x-reef-release-id"] == creation["release_id"]
    assert creation["content_id"] == seed_tree(seed).content_id  # the creation release holds the seed


def test_a_mentioned_skill_brings_its_body_and_a_client_system_prompt_is_kept_after_the_harness(
    ant: anthropic.Anthropic, upstream: ScriptedUpstream, client: ReefClient
) -> None:
    raw = ant.messages.with_raw_response.create(
        model="claude-x",
        max_tokens=50,
        system="Client rules here.",
        messages=[{"role": "user", "content": "use the empty-token skill"}],
        extra_headers={"x-reef-scenario": "inject-ant"},
    )
    system = sent_system(upstream)
    assert system is not None and system.endswith("\n\nClient rules here.")
    assert system.startswith(SYSTEM) and f"## Skill: empty-token\n{SKILL_BODY}" in system
    record = client.record(raw.headers["x-reef-agent-record-id"])["record"]
    assert record["harness"]["skills"] == ["empty-token"] and record["harness"]["inserted"] is False


def test_streamed_requests_are_injected_too(oai: openai.OpenAI, upstream: ScriptedUpstream) -> None:
    stream = oai.chat.completions.create(
        model="m", messages=USER, stream=True, extra_headers={"x-reef-scenario": "inject-stream"}
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert (sent_system(upstream) or "").startswith(SYSTEM)


def test_an_anthropic_upstream_gets_the_harness_as_its_system_field(
    upstream: ScriptedUpstream, seed: Path, tmp_path: Path
) -> None:
    with ReefServer(tmp_path, settings(upstream, seed, dialect="anthropic")) as server:
        oai = openai.OpenAI(base_url=server.base_url, api_key=TOKEN, max_retries=0, timeout=20)
        oai.chat.completions.create(model="m", messages=[{"role": "system", "content": "Mine."}, *USER])
    body = upstream.requests[-1].body
    assert upstream.requests[-1].path == "/v1/messages"
    assert body["system"] == render_system(seed_tree(seed), "Mine.\nfix the parser") + "\n\nMine."
    assert all(m["role"] != "system" for m in body["messages"])


def test_retries_with_a_client_receipt_stay_idempotent_with_injection_on(
    oai: openai.OpenAI, ant: anthropic.Anthropic, upstream: ScriptedUpstream
) -> None:
    upstream.script(text="first answer")
    headers = {"x-reef-scenario": "inject-retry", "x-reef-agent-record-id": "harness-retry-1"}
    first = oai.chat.completions.create(model="m", messages=USER, extra_headers=headers)
    again = oai.chat.completions.create(model="m", messages=USER, extra_headers=headers)
    assert again.choices[0].message.content == first.choices[0].message.content == "first answer"
    assert len(upstream.requests) == 1  # the retry was answered from the record
    upstream.script(text="streamed answer")
    stream_headers = {**headers, "x-reef-agent-record-id": "harness-retry-3"}
    for _ in range(2):
        streamed = oai.chat.completions.create(model="m", messages=USER, extra_headers=stream_headers, stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == "streamed answer"
    assert len(upstream.requests) == 2
    with pytest.raises(openai.APIStatusError) as info:
        oai.chat.completions.create(model="m", messages=[{"role": "user", "content": "other"}], extra_headers=headers)
    assert info.value.status_code == 409
    ant_headers = {"x-reef-scenario": "inject-retry", "x-reef-agent-record-id": "harness-retry-2"}
    kwargs = dict(model="c", max_tokens=20, system="Own.", messages=USER, extra_headers=ant_headers)
    one = ant.messages.create(**kwargs)
    two = ant.messages.create(**kwargs)
    assert one.content[0].text == two.content[0].text and len(upstream.requests) == 3


# -- pull mode -----------------------------------------------------------------------------------


def test_pull_mode_injects_nothing_and_the_client_fetches_the_tree(
    oai: openai.OpenAI, upstream: ScriptedUpstream, client: ReefClient, reef: ReefServer, seed: Path
) -> None:
    raw = oai.chat.completions.with_raw_response.create(
        model="m", messages=USER, extra_headers={"x-reef-scenario": "pulled"}
    )
    assert upstream.requests[-1].body["messages"] == USER
    assert client.record(raw.headers["x-reef-agent-record-id"])["record"].get("harness") is None
    pulled = client.harness("pulled")
    tree = seed_tree(seed)
    assert pulled["mode"] == "pull" and pulled["release_id"] == raw.headers["x-reef-release-id"]
    assert pulled["content_id"] == tree.content_id
    assert pulled["files"] == {
        "system.md": SYSTEM + "\n",
        "rules/name-files.md": RULE + "\n",
        "skills/empty-token/SKILL.md": tree.skills["empty-token"].to_markdown(),
    }
    assert pulled["skills"] == [{"name": "empty-token", "description": "Handling empty tokens"}]
    assert pulled["system_prompt"] == render_system(tree, "")
    by_header = httpx.get(
        f"{reef.url}/reef/harness", headers={"authorization": f"Bearer {TOKEN}", "x-reef-scenario": "pulled"}
    ).json()
    assert by_header["release_id"] == pulled["release_id"]
    assert client.harness("pulled", release_id=pulled["release_id"])["files"] == pulled["files"]


def test_harness_route_errors(client: ReefClient, oai: openai.OpenAI) -> None:
    oai.chat.completions.create(model="m", messages=USER, extra_headers={"x-reef-scenario": "pulled"})
    for kwargs, status in (
        ({"scenario": "no-such-scenario"}, 404),
        ({"scenario": "bad name!"}, 400),
        ({"scenario": "pulled", "release_id": "f" * 40}, 404),
        ({"scenario": "pulled", "release_id": "../x"}, 400),
    ):
        with pytest.raises(ReefClientError) as info:
            client.harness(**kwargs)
        assert info.value.status == status, kwargs


# -- diff, promote, rollback ---------------------------------------------------------------------


def hold_for_review(reef: ReefServer, scenario: str, tree: HarnessTree) -> str:
    """What the harness gate does with `publish: review`: a pending release (written to the
    same state directory by another process, as a learner may)."""
    artifacts = ArtifactStore(reef.state_dir / "artifacts.git")
    log = JsonlCommitLog(reef.state_dir / "commits" / f"{scenario_key(scenario)}.jsonl", scenario=scenario)
    try:
        chain = ReleaseChain(scenario, log, artifacts)
        pending = chain.publish(
            Candidate(tree.to_files(), ArtifactKind.HARNESS),
            chain.head().release_id,
            verdict=Verdict("review", {"wins": 3, "losses": 0}),
        )
    finally:
        log.close()
    return pending.release_id


def test_diff_promote_and_rollback_of_a_harness_release(
    oai: openai.OpenAI, upstream: ScriptedUpstream, client: ReefClient, reef: ReefServer, seed: Path
) -> None:
    scenario = "review"
    headers = {"x-reef-scenario": scenario}
    creation = oai.chat.completions.with_raw_response.create(model="m", messages=USER, extra_headers=headers)
    creation_id = creation.headers["x-reef-release-id"]
    created = client.diff(scenario, creation_id)
    assert created["parent_release_id"] is None and "+" + RULE in created["diff"]
    assert created["changed"] == [
        "harness/rules/name-files.md",
        "harness/skills/empty-token/SKILL.md",
        "harness/system.md",
    ]

    new_rule = "Run the tests before answering."
    tree = seed_tree(seed).apply([Mutation("create", "rule", "run-tests", body=new_rule + "\n")])
    pending_id = hold_for_review(reef, scenario, tree)
    diff = client.diff(scenario, pending_id)
    assert diff["parent_release_id"] == creation_id and diff["changed"] == ["harness/rules/run-tests.md"]
    assert "+" + new_rule in diff["diff"] and "reef-artifact.json" not in diff["diff"]
    oai.chat.completions.create(model="m", messages=USER, extra_headers=headers)
    assert new_rule not in (sent_system(upstream) or "")  # pending: not served yet

    with pytest.raises(ReefClientError) as stale:
        client.promote(scenario, pending_id, expected_head="a" * 40)
    assert stale.value.status == 409
    for release_id, status in ((creation_id, 400), ("b" * 40, 404)):
        with pytest.raises(ReefClientError) as info:
            client.promote(scenario, release_id)
        assert info.value.status == status
    promoted = client.promote(scenario, pending_id, expected_head=creation_id)
    assert promoted["release"]["operation"] == "promote" and promoted["release"]["content_id"] == tree.content_id
    raw = oai.chat.completions.with_raw_response.create(model="m", messages=USER, extra_headers=headers)
    assert raw.headers["x-reef-release-id"] == promoted["release"]["release_id"]
    assert new_rule in (sent_system(upstream) or "")
    assert client.harness(scenario)["files"]["rules/run-tests.md"] == new_rule + "\n"
    with pytest.raises(ReefClientError) as again:
        client.promote(scenario, pending_id)
    assert again.value.status == 409

    rolled = client.rollback(scenario, creation_id)["release"]
    oai.chat.completions.create(model="m", messages=USER, extra_headers=headers)
    assert new_rule not in (sent_system(upstream) or "") and RULE in (sent_system(upstream) or "")
    back = client.diff(scenario, rolled["release_id"])
    assert back["changed"] == ["harness/rules/run-tests.md"] and "-" + new_rule in back["diff"]
    with pytest.raises(ReefClientError) as unknown:
        client.diff(scenario, "c" * 40)
    assert unknown.value.status == 404


def test_unknown_scenarios_are_404_on_every_route(client: ReefClient) -> None:
    for call in (lambda: client.diff("ghost", "a" * 40), lambda: client.promote("ghost", "a" * 40)):
        with pytest.raises(ReefClientError) as info:
            call()
        assert info.value.status == 404


def test_the_embedded_model_sees_the_harness_in_its_prompt_tokens(
    tiny_model_dir: Path, seed: Path, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    settings = {
        "embedded": {"model_dir": str(tiny_model_dir), "default_max_tokens": 4, "threads": 1},
        "learner": {"enabled": False},
        "harness": {"seed_dir": str(seed)},
    }
    with ReefServer(tmp_path, settings) as server, ReefClient(server.url) as reef_client:
        oai = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=60)
        raw = oai.chat.completions.with_raw_response.create(model="m", messages=USER)
        record = reef_client.record(raw.headers["x-reef-agent-record-id"])["record"]
    prompt = AutoTokenizer.from_pretrained(tiny_model_dir).decode(record["response"]["prompt_token_ids"])
    assert SYSTEM in prompt and RULE in prompt and "fix the parser" in prompt
    assert record["harness"]["content_id"] == seed_tree(seed).content_id and record["spans"]


def test_token_counts_include_the_injected_harness(ant: anthropic.Anthropic, oai: openai.OpenAI) -> None:
    for scenario in ("count-inject", "pulled"):
        oai.chat.completions.create(model="m", messages=USER, extra_headers={"x-reef-scenario": scenario})
    counts = {
        s: ant.messages.count_tokens(model="c", messages=USER, extra_headers={"x-reef-scenario": s}).input_tokens
        for s in ("count-inject", "pulled", "never-created")
    }
    assert counts["count-inject"] > counts["pulled"] == counts["never-created"] > 0


def test_cli_harness_out_diff_and_promote(oai: openai.OpenAI, reef: ReefServer, seed: Path, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from reef.cli import main

    raw = oai.chat.completions.with_raw_response.create(
        model="m", messages=USER, extra_headers={"x-reef-scenario": "cli"}
    )
    release_id = raw.headers["x-reef-release-id"]
    out = tmp_path / "pulled"
    (out / "rules").mkdir(parents=True)
    (out / "rules" / "stale.md").write_text("a rule the release no longer has")
    (out / "notes.txt").write_text("mine")
    runner = CliRunner()
    auth = ["--url", reef.url, "--token", TOKEN]
    result = runner.invoke(main, ["harness", "cli", *auth, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert HarnessTree.from_files(
        {
            "harness/" + p.relative_to(out).as_posix(): p.read_bytes()
            for p in out.rglob("*")
            if p.is_file() and p.name != "notes.txt"
        }
    ) == seed_tree(seed)
    assert not (out / "rules" / "stale.md").exists() and (out / "notes.txt").read_text() == "mine"
    shown = runner.invoke(main, ["harness", "cli", *auth])
    assert shown.exit_code == 0 and release_id in shown.output and RULE in shown.output
    diff = runner.invoke(main, ["diff", "cli", release_id, *auth])
    assert diff.exit_code == 0 and "+" + SYSTEM in diff.output
    refused = runner.invoke(main, ["promote", "cli", release_id, *auth])
    assert refused.exit_code == 1 and "HTTP 400" in refused.output and "not pending" in refused.output
