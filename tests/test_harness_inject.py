"""Inject mode without a server: the request sent, the record's entry and its undo, the cost of
an empty harness; seeding settings; runtimes leave `harness/*` alone."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from reef.commit.artifacts import ArtifactStore, content_id_of
from reef.config import HarnessConfig, load_config
from reef.core.chat import ChatRequest, Message
from reef.core.errors import InvalidInput
from reef.core.types import ArtifactKind, ReleaseRef
from reef.runtimes.upstream import UpstreamRuntime
from reef.surfaces.harness import HarnessTree, Skill, render_system
from reef.surfaces.inject import HarnessInjector, client_request
from reef.surfaces.seed import HarnessSeeds
from tests.helpers.reef_server import ReefServer

TREE = HarnessTree(
    system="Be careful.",
    rules={"tests": "Write tests."},
    skills={"empty-token": Skill("empty-token", "Empty tokens", "Check the empty string.")},
)


def chat(*messages: Message) -> ChatRequest:
    return ChatRequest(model="m", messages=messages, dialect="openai")


def injector(
    tmp_path: Path, mode: str = "inject", **files: dict[str, bytes]
) -> tuple[HarnessInjector, dict[str, ReleaseRef]]:
    inj = HarnessInjector(HarnessConfig(mode=mode), ArtifactStore(tmp_path / "a.git"))
    refs = {}
    for name, content in files.items():
        ref = ReleaseRef("r-" + name, content_id_of(content), "load-1")
        inj.remember(ref.content_id, content)
        refs[name] = ref
    return inj, refs


def test_injection_prefixes_the_system_prompt_and_the_record_entry_restores_the_client_request(tmp_path: Path) -> None:
    inj, refs = injector(tmp_path, tree=TREE.to_files())
    own = chat(Message("system", "Mine."), Message("user", "the empty token case"))
    sent, added = asyncio.run(inj.inject("s", own, refs["tree"]))
    assert sent.messages[0].content == render_system(TREE, "Mine.\nthe empty token case") + "\n\nMine."
    assert sent.messages[1:] == own.messages[1:]
    assert added == {
        "mode": "inject",
        "content_id": TREE.content_id,
        "skills": ["empty-token"],
        "inserted": False,
        "prefix_chars": len(sent.messages[0].content) - len("Mine."),
    }
    assert client_request(sent.to_json(), added) == own.to_json()
    bare = chat(Message("user", "hi"))
    sent, added = asyncio.run(inj.inject("s", bare, refs["tree"]))
    assert sent.messages[0] == Message("system", render_system(TREE, "hi")) and added is not None
    assert added["inserted"] is True and client_request(sent.to_json(), added) == bare.to_json()
    assert client_request(bare.to_json(), None) == bare.to_json()


def test_no_harness_and_pull_mode_return_the_request_itself(tmp_path: Path) -> None:
    inj, refs = injector(tmp_path, weights={"adapter_config.json": b"{}"}, empty={})
    request = chat(Message("user", "hi"))
    for ref in refs.values():
        sent, added = asyncio.run(inj.inject("s", request, ref))
        assert sent is request and added is None
    pull, pulled = injector(tmp_path, mode="pull", tree=TREE.to_files())
    sent, added = asyncio.run(pull.inject("s", request, pulled["tree"]))
    assert sent is request and added is None


def test_an_invalid_harness_in_a_release_serves_without_it(tmp_path: Path) -> None:
    inj, refs = injector(tmp_path, bad={"harness/notes.txt": b"x"})
    request = chat(Message("user", "hi"))
    assert asyncio.run(inj.inject("s", request, refs["bad"])) == (request, None)


def test_trees_are_parsed_once_per_content_id_and_the_cache_is_bounded(tmp_path: Path) -> None:
    inj = HarnessInjector(HarnessConfig(), ArtifactStore(tmp_path / "a.git"), max_trees=2)
    first = inj.remember("c1", TREE.to_files())
    assert inj.remember("c1", TREE.to_files()) is first
    inj.remember("c2", {})
    inj.remember("c3", {})
    assert inj.remember("c1", TREE.to_files()) is not first  # evicted, parsed again


def test_harness_settings_per_scenario_and_unknown_keys(tmp_path: Path) -> None:
    config = HarnessConfig.model_validate(
        {"mode": "inject", "seed_dir": str(tmp_path), "scenarios": {"a": {"mode": "pull"}, "b": {"seed_dir": "/x"}}}
    )
    assert (config.mode_for("a"), config.mode_for("b"), config.mode_for("c")) == ("pull", "inject", "inject")
    assert config.seed_dir_for("b") == Path("/x") and config.seed_dir_for("a") == tmp_path
    path = tmp_path / "serve.yaml"
    path.write_text("harness:\n  mode: inject\n  seeddir: ./h\n  scenarios:\n    a: {mode: push}\n")
    with pytest.raises(InvalidInput) as info:
        load_config(path, env={})
    assert "unknown key 'harness.seeddir'" in str(info.value) and "harness.scenarios.a.mode" in str(info.value)


def test_seeds_are_read_once_and_a_bad_one_names_its_file(tmp_path: Path) -> None:
    TREE.write_dir(tmp_path / "seed")
    seeds = HarnessSeeds(HarnessConfig(seed_dir=tmp_path / "seed"))
    candidate = seeds.candidate_for("any")
    assert candidate is not None and candidate.kind is ArtifactKind.HARNESS
    assert candidate.content_id == TREE.content_id and candidate.source["kind"] == "seed"
    assert HarnessSeeds(HarnessConfig()).candidate_for("any") is None
    (tmp_path / "seed" / "rules" / "Bad Name.md").write_text("x")
    with pytest.raises(InvalidInput, match="harness seed .*Bad Name"):
        HarnessSeeds(HarnessConfig(seed_dir=tmp_path / "seed"))


def test_reef_serve_refuses_to_start_with_a_bad_seed(tmp_path: Path) -> None:
    (tmp_path / "seed").mkdir()
    (tmp_path / "seed" / "notes.txt").write_text("x")
    server = ReefServer(
        tmp_path,
        {"upstream": {"url": "http://127.0.0.1:9/v1"}, "harness": {"seed_dir": str(tmp_path / "seed")}},
        startup_timeout=60,
    )
    with pytest.raises(RuntimeError, match="notes.txt: not a harness file"):
        server.start()
    server.stop()


def test_runtimes_leave_harness_files_alone() -> None:
    runtime = UpstreamRuntime("http://127.0.0.1:9/v1")
    files = {**TREE.to_files(), "harness/extensions/model.safetensors": b"not weights"}
    assert asyncio.run(runtime.load(content_id_of(files), files)).startswith("upstream:")
    from reef.core.training import adapter_part, weights_kind

    assert not adapter_part({"harness/extensions/x/adapter_config.json": b"{}"})
    assert weights_kind({"harness/extensions/x/adapter_config.json": b"{}", **files}) is None
    assert adapter_part({"adapter_config.json": b"{}", **TREE.to_files()}) == {"adapter_config.json": b"{}"}


def test_tool_results_do_not_count_as_mentions(tmp_path: Path) -> None:
    inj, refs = injector(tmp_path, tree=TREE.to_files())
    request = chat(
        Message("user", "read the file"),
        Message("assistant", "", tool_call_id=None),
        Message("tool", "def empty_token(): ...", tool_call_id="c1"),
    )
    sent, added = asyncio.run(inj.inject("s", request, refs["tree"]))
    assert added is not None and added["skills"] == [] and "Check the empty string." not in sent.messages[0].content
