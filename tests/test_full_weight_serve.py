"""Full-weight releases through `reef serve` on the embedded tiny model: the head's full weights
serve (greedy token ids unlike the base's); the releases route says `"weights": "full"`; a
rollback to an older full-weight release serves its ids again, and a rollback to the first
release serves the base model's greedy token ids again; requests sent all through the swaps
never fail."""

from __future__ import annotations

import threading
from pathlib import Path

import openai

from reef.client import ReefClient
from reef.commit.release_chain import Candidate
from reef.commit.state import ReefState
from reef.core.types import ArtifactKind, Verdict
from tests.helpers.full_weights import full_weight_files
from tests.helpers.reef_server import ReefServer

SCENARIO = "full"
PROMPT = [{"role": "user", "content": "Tell me a long story about the sea"}]


def test_full_weight_releases_serve_and_roll_back_to_the_base(tiny_model_dir: Path, tmp_path: Path) -> None:
    with ReefState.open(tmp_path / "work" / "state") as state:
        chain = state.create(SCENARIO, "sao")
        ids = [chain.head().release_id]
        for seed in (1, 2):
            files = full_weight_files(tiny_model_dir, seed=seed, optimiser_bytes=1024)
            candidate = Candidate(files, ArtifactKind.WEIGHTS)
            ids.append(chain.publish(candidate, ids[-1], verdict=Verdict("select", {})).release_id)
    settings = {
        "embedded": {"model_dir": str(tiny_model_dir), "default_max_tokens": 8, "threads": 1},
        "learner": {"enabled": False},
    }
    with ReefServer(tmp_path / "work", settings) as reef, ReefClient(reef.url, timeout=60) as client:
        oai = openai.OpenAI(base_url=reef.base_url, api_key="x", max_retries=0, timeout=60)

        def greedy() -> tuple[list[int], str]:
            raw = oai.chat.completions.with_raw_response.create(
                model="m", messages=PROMPT, max_tokens=8, temperature=0, extra_headers={"x-reef-scenario": SCENARIO}
            )
            answer = client.record(raw.headers["x-reef-agent-record-id"])
            assert answer["verified"]  # every token came from the release the request was frozen to
            return answer["record"]["token_ids"], answer["record"]["release"]["release_id"]

        failures: list[BaseException] = []
        stop = threading.Event()

        def traffic() -> None:
            while not stop.is_set():
                try:
                    greedy()
                except BaseException as exc:  # counted, never raised in the thread
                    failures.append(exc)

        releases = client.releases(SCENARIO)["releases"]
        assert [r["weights"] for r in releases] == ["full", "full", None]
        second, second_release = greedy()
        assert second_release == ids[2]
        background = [threading.Thread(target=traffic) for _ in range(2)]
        for thread in background:
            thread.start()
        try:
            client.rollback(SCENARIO, ids[1])
            first, _ = greedy()
            client.rollback(SCENARIO, ids[0])
            base, served_by = greedy()
        finally:
            stop.set()
            for thread in background:
                thread.join()
        assert not failures
        assert served_by != ids[0]  # a rollback is a release of its own, serving the base's content
        assert len({tuple(first), tuple(second), tuple(base)}) == 3
        assert client.releases(SCENARIO)["releases"][0]["weights"] is None
    with ReefState.open(tmp_path / "work" / "state") as state:
        assert state.chain(SCENARIO).head().content_id == state.chain(SCENARIO).release(ids[0]).content_id
    import torch
    from transformers import (
        AutoModelForCausalLM,  # the base model alone answers with those ids
        AutoTokenizer,
    )

    from reef.core.chat import ChatRequest, Message
    from reef.runtimes.chatml import prompt_ids

    request = ChatRequest(model="m", messages=(Message("user", PROMPT[0]["content"]),), dialect="openai")
    prompt = prompt_ids(AutoTokenizer.from_pretrained(str(tiny_model_dir)), request)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    out = model.generate(torch.tensor([prompt]), max_new_tokens=len(base), do_sample=False)
    assert out[0, len(prompt) :].tolist()[: len(base)] == base
