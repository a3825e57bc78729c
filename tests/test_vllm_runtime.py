"""`reef serve --runtime vllm` against a REAL vLLM (the CPU build) that Reef starts and supervises:
both SDKs, plain and streaming, records with vLLM's token ids and log-probs verified against the
frozen release; LoRA releases hot-loaded into the engine (served by the adapter, rolled back,
unloaded; a corrupt adapter refused while the old release keeps serving); an adapter release
exported as a PEFT folder (`reef export release`) loaded into vLLM directly, answering with the
token ids Reef served for it; a kill -9 of vLLM
answered with 503s until Reef has restarted it and loaded the serving adapter again; the learner
trains on vLLM's records and vLLM serves what it published; a canary (the candidate under test)
loaded into vLLM serves an opted-in scenario, its records verified and taken in as samples; a
full-weight release pushed into vLLM (its disk path) under load with no request failed, and the
base pushed back by a rollback to it.

One vLLM for the module (it takes about 50 s to start and 25 s more for its first request here).
It needs the vLLM environment (`scripts/setup --vllm`, or `.ci/run`); without it these tests skip.
The model is a tiny random Llama with SmolLM2's tokenizer and head_dim 32 (vLLM's CPU attention
takes no smaller head), so greedy output is gibberish but deterministic.
"""

from __future__ import annotations

import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import anthropic
import httpx
import openai
import pytest

from reef.client import ReefClient, ReefClientError
from reef.runtimes.vllm_env import default_env_dir, env_ready
from tests.helpers.reef_server import ReefServer

pytestmark = pytest.mark.slow
USER = [{"role": "user", "content": "Name a colour."}]
ENV = Path(os.environ["REEF_VLLM_ENV"]) if os.environ.get("REEF_VLLM_ENV") else default_env_dir()
# the learner trains scenarios that get reports (only `learns` here), on the model vLLM serves; a
# generous offline bound: the test is about the loop's mechanics on the engine, not the gate's taste
LEARNER = {
    "poll_interval": 0.1,
    "train_threads": 1,
    "canary": {"canaried": 1.0},
    "canary_max_fraction": 1.0,
    "sao": {"batch_size": 4, "steps_per_candidate": 1, "lr": 0.01, "max_staleness": 5},
    "gate": {"holdout_fraction": 0.3, "offline_bound": 1000.0},
}


@pytest.fixture(scope="module")
def releases(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """A state directory whose scenario `tuned` holds: the base (no weights), a good LoRA adapter,
    a corrupt one, and a rollback to the base at its head (so serving starts on the base)."""
    if not env_ready(ENV):
        pytest.skip(f"no vLLM environment at {ENV}: run `scripts/setup --vllm` (or `python -m reef.runtimes.vllm_env`)")
    from reef.commit.release_chain import Candidate
    from reef.commit.state import ReefState
    from reef.core.types import ArtifactKind, Verdict
    from tests.helpers.full_weights import full_weight_files
    from tests.helpers.lora import lora_files
    from tests.helpers.vllm_model import build_vllm_tiny_model

    work = tmp_path_factory.mktemp("reef-vllm")
    model = build_vllm_tiny_model(tiny_model_dir, work / "model")
    good = lora_files(model, work / "lora")
    corrupt = {**good, "adapter_model.safetensors": b"\x00" * 64 + b"not a safetensors file"}
    state = ReefState.open(work / "state")
    try:
        chain = state.create("tuned", "sao")
        base = chain.head()
        select = Verdict("select", {"wins": 3})
        adapter = chain.publish(Candidate(good, ArtifactKind.WEIGHTS), base.release_id, verdict=select)
        broken = chain.publish(Candidate(corrupt, ArtifactKind.WEIGHTS), adapter.release_id, verdict=select)
        chain.rollback(base.release_id, broken.release_id)
        full_chain = state.create("full", "sao")  # a full-weight release, its base serving at first
        full_base = full_chain.head()
        full = full_chain.publish(
            Candidate(full_weight_files(model, seed=1), ArtifactKind.WEIGHTS), full_base.release_id, verdict=select
        )
        full_chain.rollback(full_base.release_id, full.release_id)
    finally:
        state.close()
    return {
        "work": work,
        "model": model,
        "base": base.release_id,
        "adapter": adapter.release_id,
        "broken": broken.release_id,
        "full_base": full_base.release_id,
        "full": full.release_id,
    }


@pytest.fixture(scope="module")
def reef(releases: dict[str, object]) -> Iterator[ReefServer]:
    work = Path(str(releases["work"]))
    settings = {
        "state_dir": str(work / "state"),
        "runtime": "vllm",
        "learner": LEARNER,
        "vllm": {
            "model_dir": str(releases["model"]),
            "model_name": "tiny",
            "env_dir": str(ENV),
            "default_max_tokens": 8,
            "load_timeout": 60,
            "extra_args": ["--enforce-eager"],
        },
    }  # no compile: no 25 s warm-up
    started = time.monotonic()
    env = {"REEF_CACHE_DIR": str(work / "cache"), "VLLM_SERVER_DEV_MODE": "1"}  # the weight-reload routes
    with ReefServer(work, settings, env=env, startup_timeout=300) as server:
        print(f"\nvLLM runtime: reef serve healthy after {time.monotonic() - started:.1f}s")
        yield server


@pytest.fixture(scope="module")
def oai(reef: ReefServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=reef.base_url, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def client(reef: ReefServer) -> Iterator[ReefClient]:
    with ReefClient(reef.url, timeout=120) as c:
        yield c


def fetch(client: ReefClient, receipt: str) -> dict:
    """The stored record, with `verified` (invariant 2) put into it."""
    answer = client.record(receipt)
    return {**answer["record"], "verified": answer["verified"]}


def greedy(oai: openai.OpenAI, scenario: str = "tuned") -> tuple[str, str]:
    """(text, receipt) of a greedy answer in `scenario`."""
    raw = oai.chat.completions.with_raw_response.create(
        model="tiny", messages=USER, max_tokens=8, temperature=0, extra_headers={"x-reef-scenario": scenario}
    )
    return raw.parse().choices[0].message.content or "", raw.headers["x-reef-agent-record-id"]


def test_a_plain_answer_is_recorded_with_vllms_token_ids_and_logprobs(oai: openai.OpenAI, client: ReefClient) -> None:
    started = time.monotonic()
    raw = oai.chat.completions.with_raw_response.create(model="tiny", messages=USER, max_tokens=8, temperature=0)
    print(f"first request (vLLM warm-up) {time.monotonic() - started:.1f}s")
    completion = raw.parse()
    assert completion.choices[0].logprobs is None  # log-probs go to the record, not the client
    record = fetch(client, raw.headers["x-reef-agent-record-id"])
    tokens = record["token_ids"]
    assert tokens and len(tokens) == len(record["logprobs"]) == completion.usage.completion_tokens == 8
    assert all(lp <= 0 for lp in record["logprobs"])
    assert record["verified"] is True
    assert [(s["start"], s["end"], s["runtime_load_id"]) for s in record["spans"]] == [
        (0, 8, record["release"]["runtime_load_id"])
    ]
    assert record["response"]["prompt_token_ids"][:2] == [1, 9690]  # <|im_start|>system: SmolLM2's template
    started = time.monotonic()
    oai.chat.completions.create(model="tiny", messages=USER, max_tokens=8, temperature=0)
    print(f"a warm request (8 tokens) {time.monotonic() - started:.2f}s")


def test_streams_in_both_dialects_are_recorded_and_verified(
    reef: ReefServer, oai: openai.OpenAI, client: ReefClient
) -> None:
    raw = oai.chat.completions.with_raw_response.create(model="tiny", messages=USER, max_tokens=6, stream=True, seed=7)
    chunks = list(raw.parse())
    reef_chunk = next(c for c in chunks if not c.choices and getattr(c, "reef", None))
    assert reef_chunk.reef["verified"] is True
    assert all(c.choices[0].logprobs is None for c in chunks if c.choices)
    record = fetch(client, raw.headers["x-reef-agent-record-id"])
    assert record["status"] == "complete" and len(record["token_ids"]) == len(record["logprobs"]) == 6

    ant = anthropic.Anthropic(base_url=reef.url, api_key="unused", max_retries=0, timeout=120)
    with ant.messages.stream(model="tiny", max_tokens=5, messages=USER) as stream:
        "".join(stream.text_stream)
        final = stream.get_final_message()
    assert final.usage.output_tokens == 5
    record = fetch(client, final.id.removeprefix("msg_"))
    assert record["status"] == "complete" and record["verified"] is True and len(record["token_ids"]) == 5
    plain = ant.messages.create(model="tiny", max_tokens=4, messages=USER)
    assert fetch(client, plain.id.removeprefix("msg_"))["verified"] is True
    assert ant.messages.count_tokens(model="tiny", messages=USER).input_tokens == len(
        record["response"]["prompt_token_ids"]
    )


def test_models_and_status_name_the_engine(oai: openai.OpenAI, client: ReefClient) -> None:
    assert [m.id for m in oai.models.list()] == ["tiny"]
    status = client.status()
    assert status["serving"]["runtime"] == "vllm" and status["provenance"]["runtime_verifies_tokens"] is True
    assert status["serving"]["adapters"] == []


def test_an_adapter_release_is_served_rolled_back_and_unloaded(
    oai: openai.OpenAI, client: ReefClient, releases: dict[str, object]
) -> None:
    base_text, _ = greedy(oai)
    swapped = client.rollback("tuned", str(releases["adapter"]))["serving"]
    load = swapped["runtime_load_id"]
    assert client.status()["serving"]["adapters"] == [load]
    tuned_text, receipt = greedy(oai)
    assert tuned_text != base_text  # the adapter's random B matrices change the greedy answer
    stored = fetch(client, receipt)
    assert stored["verified"] is True and {s["runtime_load_id"] for s in stored["spans"]} == {load}

    # a corrupt adapter is refused; the adapter release keeps serving and nothing is left loaded
    with pytest.raises(ReefClientError):
        client.rollback("tuned", str(releases["broken"]))
    assert greedy(oai)[0] == tuned_text
    assert client.status()["serving"]["adapters"] == [load]

    client.rollback("tuned", str(releases["base"]))
    assert greedy(oai)[0] == base_text
    deadline = time.monotonic() + 10
    while client.status()["serving"]["adapters"] and time.monotonic() < deadline:
        time.sleep(0.1)  # unloaded once no request pins it
    assert client.status()["serving"]["adapters"] == []


def test_an_exported_adapter_loads_into_vllm_and_answers_as_reef_served_it(
    reef: ReefServer, oai: openai.OpenAI, client: ReefClient, releases: dict[str, object], tmp_path: Path
) -> None:
    """`reef export release` writes the adapter release as a PEFT folder; loaded into the same
    vLLM directly (`POST /v1/load_lora_adapter`, as any vLLM user would), it gives, greedily on
    the exact prompt tokens Reef sent, the very token ids Reef served and recorded."""
    from click.testing import CliRunner

    from reef.cli import main

    client.rollback("tuned", str(releases["adapter"]))
    _, receipt = greedy(oai)
    served = fetch(client, receipt)
    assert served["verified"] is True and served["token_ids"]
    assert served["release"]["release_id"] != releases["adapter"]  # the rollback's release: the adapter's content

    dest = tmp_path / "exported"
    exported = CliRunner().invoke(
        main,
        ["export", "release", "tuned", str(releases["adapter"]), str(dest), "--state-dir", str(reef.state_dir)],
        catch_exceptions=False,
    )
    assert exported.exit_code == 0, exported.output
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in dest.iterdir()}

    assert reef.process is not None
    command = (Path("/proc") / str(_vllm_pid(reef.process.pid)) / "cmdline").read_bytes().split(b"\0")
    vllm = f"http://127.0.0.1:{int(command[command.index(b'--port') + 1])}"
    loaded = httpx.post(
        f"{vllm}/v1/load_lora_adapter", timeout=120, json={"lora_name": "exported", "lora_path": str(dest)}
    )
    assert loaded.status_code == 200, loaded.text
    try:
        answer = httpx.post(
            f"{vllm}/v1/completions",
            timeout=120,
            json={
                "model": "exported",
                "prompt": served["response"]["prompt_token_ids"],
                "max_tokens": 8,
                "temperature": 0,
                "return_token_ids": True,
            },
        ).json()
        base = httpx.post(
            f"{vllm}/v1/completions",
            timeout=120,
            json={
                "model": "tiny",
                "prompt": served["response"]["prompt_token_ids"],
                "max_tokens": 8,
                "temperature": 0,
                "return_token_ids": True,
            },
        ).json()
    finally:
        httpx.post(f"{vllm}/v1/unload_lora_adapter", timeout=60, json={"lora_name": "exported"})
    assert answer["choices"][0]["token_ids"] == served["token_ids"], answer
    assert base["choices"][0]["token_ids"] != served["token_ids"]  # the adapter is what makes the difference


def _vllm_pid(reef_pid: int) -> int:
    """The vLLM API server reef serve started (its child running vllm.entrypoints)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            command = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == reef_pid and b"vllm.entrypoints.openai.api_server" in command:
            return int(entry.name)
    raise AssertionError("no vLLM child of reef serve")


def test_a_killed_vllm_is_restarted_with_the_serving_adapter(
    reef: ReefServer, oai: openai.OpenAI, client: ReefClient, releases: dict[str, object]
) -> None:
    load = client.rollback("tuned", str(releases["adapter"]))["serving"]["runtime_load_id"]
    tuned_text, _ = greedy(oai)
    assert reef.process is not None
    stop = threading.Event()
    with ThreadPoolExecutor(3) as pool:  # load through the kill: three clients sending all along
        load_runs = [pool.submit(_keep_asking, reef, stop) for _ in range(3)]
        time.sleep(1)
        os.kill(_vllm_pid(reef.process.pid), 9)
        killed = time.monotonic()
        _wait_until_served_again(reef, killed)
        stop.set()
        answers = [a for run in load_runs for a in run.result()]
    print(
        f"vLLM back {time.monotonic() - killed:.1f}s after kill -9; under load: "
        f"{sum(1 for s, _ in answers if s == 200)} answered, {sum(1 for s, _ in answers if s == 503)} refused (503)"
    )
    assert {status for status, _ in answers} <= {200, 503} and any(s == 503 for s, _ in answers)
    for status, receipt in answers:  # nothing acknowledged is lost: every receipt names a stored record
        if receipt:
            stored = client.record(receipt)["record"]
            assert stored["status"] == ("complete" if status == 200 else "incomplete"), (status, stored["status"])
    assert all(receipt for status, receipt in answers if status == 200)
    assert greedy(oai)[0] == tuned_text  # the adapter is back, same name
    assert client.status()["serving"]["adapters"] == [load]


def _keep_asking(reef: ReefServer, stop: threading.Event, scenario: str = "tuned") -> list[tuple[int, str | None]]:
    """Plain requests until `stop`: (status, receipt) of each."""
    answers = []
    with httpx.Client(timeout=120) as http:
        while not stop.is_set():
            response = http.post(
                f"{reef.base_url}/chat/completions",
                headers={"x-reef-scenario": scenario},
                json={"model": "tiny", "messages": USER, "max_tokens": 8, "temperature": 1.0},
            )
            answers.append((response.status_code, response.headers.get("x-reef-agent-record-id")))
            if response.status_code != 200:
                time.sleep(0.5)
    return answers


def _wait_until_served_again(reef: ReefServer, killed: float) -> None:
    refusals = 0
    while True:
        response = httpx.post(
            f"{reef.base_url}/chat/completions",
            timeout=120,
            headers={"x-reef-scenario": "tuned"},
            json={"model": "tiny", "messages": USER, "max_tokens": 8, "temperature": 0},
        )
        if response.status_code == 200:
            break
        assert response.status_code == 503, response.text
        assert response.json()["error"]["message"] and response.headers.get("retry-after")
        refusals += 1
        ant = httpx.post(
            f"{reef.url}/v1/messages", timeout=30, json={"model": "tiny", "max_tokens": 4, "messages": USER}
        )
        assert ant.status_code in (503, 200) and (ant.status_code == 200 or ant.json()["type"] == "error")
        assert time.monotonic() - killed < 240, "vLLM was not restarted"
        time.sleep(1)
    assert refusals >= 1


def test_a_full_weight_release_is_pushed_into_vllm_under_load(
    reef: ReefServer, oai: openai.OpenAI, client: ReefClient, releases: dict[str, object]
) -> None:
    """A rollback to scenario `full`'s full-weight release pushes it into vLLM (pause, reload
    from its folder, prefix cache reset, resume) while three clients ask in that scenario: none
    fails, the greedy answer changes and its record is verified (the release's load served every
    token); a rollback to the base pushes the base back and its answer returns."""

    def greedy_ids() -> list[int]:
        record = fetch(client, greedy(oai, "full")[1])
        assert record["verified"] is True
        return record["token_ids"]

    base_ids = greedy_ids()
    stop = threading.Event()
    with ThreadPoolExecutor(3) as pool:
        runs = [pool.submit(_keep_asking, reef, stop, "full") for _ in range(3)]
        time.sleep(0.5)
        started = time.monotonic()
        client.rollback("full", str(releases["full"]))
        pushed = time.monotonic() - started
        time.sleep(0.5)
        stop.set()
        answers = [a for run in runs for a in run.result()]
    assert answers and {status for status, _ in answers} == {200}
    assert greedy_ids() != base_ids
    client.rollback("full", str(releases["full_base"]))
    assert greedy_ids() == base_ids
    print(f"vLLM full-weight push by a rollback: {pushed:.2f}s, {len(answers)} requests meanwhile, 0 failed")


def test_the_learner_trains_on_vllms_records_and_vllm_serves_what_it_published(
    reef: ReefServer, oai: openai.OpenAI, client: ReefClient
) -> None:
    """The whole weights loop on the engine: vLLM's records (its token ids and processed
    log-probs) are the samples, the trainer (fp32 on the CPU, the same weights) makes a candidate
    from them, the gate admits it, vLLM loads it, and the next request is served by it."""
    base_text, _ = greedy(oai, "learns")
    deadline = time.monotonic() + 240
    published: list[dict] = []
    i = 0
    while not published:
        assert time.monotonic() < deadline, f"nothing published: {client.status()['learning']}"
        for _ in range(4):
            raw = oai.chat.completions.with_raw_response.create(
                model="tiny",
                messages=[{"role": "user", "content": f"Say {i}."}],
                max_tokens=8,
                temperature=1.0,
                extra_headers={"x-reef-scenario": "learns"},
            )
            client.report(raw.headers["x-reef-agent-record-id"], score=float(i % 2))
            i += 1
        published = [
            d
            for d in client._call("GET", "/reef/scenarios/learns/decisions")["decisions"]  # noqa: SLF001
            if d["verdict"]["decision"] == "select"
        ]
    learner = next(s for s in client.status()["learning"]["learners"] if s["scenario"] == "learns")
    assert not {"no_tokens", "unverified", "unknown_release"} & set(learner["dropped"]), learner["dropped"]
    assert learner["last_error"] is None, learner["last_error"]

    def serving_a_published_release() -> dict | None:  # once vLLM loaded it (a later one may be out meanwhile)
        serving = client.scenario("learns")["serving"]
        decided = client._call("GET", "/reef/scenarios/learns/decisions")["decisions"]  # noqa: SLF001
        return (
            serving
            if serving["release_id"] in {d["release_id"] for d in decided if d["verdict"]["decision"] == "select"}
            else None
        )

    deadline = time.monotonic() + 30
    while (serving := serving_a_published_release()) is None:
        assert time.monotonic() < deadline, (client.scenario("learns"), client.releases("learns"))
        time.sleep(0.2)
    assert serving["runtime_load_id"] in client.status()["serving"]["adapters"]  # loaded into vLLM
    text, receipt = greedy(oai, "learns")
    record = fetch(client, receipt)
    # The learner may publish again between reading what is served and the request: the record is
    # then served by that later publication, which vLLM loaded in the same way.
    decided = client._call("GET", "/reef/scenarios/learns/decisions")["decisions"]  # noqa: SLF001
    selected = {d["release_id"] for d in decided if d["verdict"]["decision"] == "select"}
    assert record["verified"] is True and record["release"]["release_id"] in selected
    assert {span["runtime_load_id"] for span in record["spans"]} == {record["release"]["runtime_load_id"]}
    print(f"vLLM learning: first publication after {i} scored requests; greedy {base_text!r} -> {text!r}")


def test_a_canary_is_loaded_into_vllm_and_its_records_are_trained_on(
    reef: ReefServer, oai: openai.OpenAI, client: ReefClient, releases: dict[str, object]
) -> None:
    """`canaried` opts in at fraction 1: once the learner has a candidate, vLLM serves it (a LoRA
    load of its own) to the scenario's requests, recorded under `canary-<batch id>` with vLLM's
    token ids verified against that load, and a later batch (the commit log) trains on them."""
    log = Path(str(releases["work"])) / "state" / "commits"

    def batched() -> set[str]:  # record ids every logged batch of any scenario named
        return {
            rid
            for path in log.glob("*.jsonl")
            for line in path.read_text().splitlines()
            if (entry := json.loads(line)).get("operation") == "batch"
            for rid in entry["batch"]["record_ids"]
        }

    deadline, i = time.monotonic() + 240, 0
    by_canary: dict[str, str] = {}  # receipt -> the canary's release id
    while not set(by_canary) & batched():
        assert time.monotonic() < deadline, f"no canary record trained on: {client.status()['learning']}"
        for _ in range(4):
            raw = oai.chat.completions.with_raw_response.create(
                model="tiny",
                messages=[{"role": "user", "content": f"Say {i}."}],
                max_tokens=8,
                temperature=1.0,
                extra_headers={"x-reef-scenario": "canaried"},
            )
            receipt, release = raw.headers["x-reef-agent-record-id"], raw.headers["x-reef-release-id"]
            client.report(receipt, score=float(i % 2))
            if release.startswith("canary-"):
                by_canary[receipt] = release
            i += 1
        time.sleep(0.3)
    receipt = sorted(set(by_canary) & batched())[0]
    record = fetch(client, receipt)
    load = record["release"]["runtime_load_id"]
    assert record["verified"] is True and record["release"]["release_id"] == by_canary[receipt]
    assert load and {span["runtime_load_id"] for span in record["spans"]} == {load}
    assert load != client.scenario("canaried")["serving"]["runtime_load_id"]  # its own adapter in vLLM
    status = next(s for s in client.status()["learning"]["learners"] if s["scenario"] == "canaried")
    assert not {"no_tokens", "unverified", "unknown_release", "stale"} & set(status["dropped"]), status["dropped"]
    assert status["last_error"] is None, status["last_error"]
    print(f"vLLM canary: a canary-served record trained on after {i} scored requests")
