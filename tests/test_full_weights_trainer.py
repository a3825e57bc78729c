"""Full-weight training (`learner.weights: full`): a torchrun job of two gloo ranks (FSDP2) trains
the tiny model's every weight, saves a checkpoint in the Hugging Face layout, resumes from it on
a restarted job and on one rank, and a killed rank fails the call and the job comes back."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from reef.core.chat import ChatRequest, Message  # noqa: E402
from reef.core.training import AdamParams, Datum, LoraShape, LossConfig, weights_kind  # noqa: E402
from reef.grow.rank_launch import RankLayout  # noqa: E402
from reef.grow.worker import TrainingFailed, TrainingWorker  # noqa: E402
from tests.helpers.process_tree import descendants  # noqa: E402

pytestmark = pytest.mark.slow

KEY = "s"
ADAM = AdamParams(full_lr=1e-3)
LOSS = LossConfig(kl_coef=0.1, micro_batch=1)  # one row a micro-batch: rank 1 runs one at weight 0
DATA = [
    Datum([5, 6, 7, 8], [9, 10, 11, 12], [], [1.0] * 4, [1.0] * 4),
    Datum([5, 6, 13], [14, 15], [], [1.0] * 2, [1.0] * 2),
    Datum([7, 8], [9, 9, 9], [], [1.0] * 3, [1.0] * 3),
]
PROBE = [([5, 6, 7, 8], [9, 10, 11, 12]), ([5, 6, 13], [14, 15])]
QUESTIONS = [
    ChatRequest(model="m", messages=(Message("user", q),), dialect="openai", max_tokens=6, temperature=0.0)
    for q in ("Name a colour.", "What is two and two? Answer in one long sentence, please.")
]


@dataclass
class TwoRanks:
    losses: list[float] = field(default_factory=list)
    norms: list[float] = field(default_factory=list)
    after_first: list[list[float]] = field(default_factory=list)  # PROBE's log-probs after step 1
    base: list[list[float]] = field(default_factory=list)
    checkpoints: list[dict[str, bytes]] = field(default_factory=list)  # after steps 1, 2, 3
    final: list[list[float]] = field(default_factory=list)  # under the step-3 checkpoint
    answers: list[str] = field(default_factory=list)  # greedy, under the step-3 checkpoint
    base_after: list[list[float]] = field(default_factory=list)  # the base's, after training
    killed_error: str = ""
    restarted_pid: int | None = None
    first_pid: int | None = None
    resumed: dict[str, float] = field(default_factory=dict)
    resumed_final: list[list[float]] = field(default_factory=list)
    after_close: str = ""


async def _step(worker: TrainingWorker, record: TwoRanks) -> None:
    metrics = await worker.call(KEY, "forward_backward", DATA, "cross_entropy", LOSS)
    stepped = await worker.call(KEY, "optim_step", ADAM)
    record.losses.append(metrics["loss"])
    record.norms.append(stepped["grad_norm"])


async def _run(model_dir: Path) -> TwoRanks:
    record = TwoRanks()
    worker = TrainingWorker(model_dir, threads=2, device="cpu", weights="full", layout=RankLayout(ranks=2))
    await worker.start()
    try:
        record.first_pid = worker.pid
        record.base = await worker.logprobs(None, PROBE)
        assert await worker.call(KEY, "load_state", None, LoraShape()) == {"steps": 0.0, "resumed": 0.0}
        for step in range(3):
            await _step(worker, record)
            record.checkpoints.append(await worker.call(KEY, "save_state"))
            if step == 0:
                record.after_first = await worker.logprobs(record.checkpoints[0], PROBE)
        record.final = await worker.logprobs(record.checkpoints[2], PROBE)
        record.answers = await worker.generate(record.checkpoints[2], QUESTIONS, 6)
        record.base_after = await worker.logprobs(None, PROBE)

        ranks = [pid for pid in descendants(worker.pid or 0) if b"reef.grow.rank_main" in _cmdline(pid)]
        assert len(ranks) == 2, ranks
        os.kill(ranks[-1], signal.SIGKILL)
        try:
            for _ in range(100):  # a call made after the kill fails (the job ends within seconds)
                await worker.logprobs(None, PROBE)
                await asyncio.sleep(0.1)
        except TrainingFailed as exc:
            record.killed_error = str(exc)
        record.resumed = await worker.call(KEY, "load_state", record.checkpoints[1], LoraShape())  # a new job
        record.restarted_pid = worker.pid
        await _step(worker, TwoRanks())
        files = await worker.call(KEY, "save_state")
        record.resumed_final = await worker.logprobs(files, PROBE)
    finally:
        await worker.close()
    try:
        await worker.logprobs(None, PROBE)
    except TrainingFailed as exc:  # closed on purpose: no new job
        record.after_close = str(exc)
    return record


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


@pytest.fixture(scope="module")
def two_ranks(tiny_model_dir: Path) -> TwoRanks:
    return asyncio.run(_run(tiny_model_dir))


@pytest.fixture(scope="module")
def one_rank(tiny_model_dir: Path) -> Any:
    from reef.grow.full_trainer import FullTrainer

    return FullTrainer(tiny_model_dir, threads=1, device="cpu")


def _close(a: list[list[float]], b: list[list[float]], tol: float = 1e-4) -> bool:
    return all(len(x) == len(y) and all(abs(p - q) <= tol for p, q in zip(x, y)) for x, y in zip(a, b))


def test_two_ranks_lower_the_loss_on_a_fixed_datum(two_ranks: TwoRanks) -> None:
    assert two_ranks.losses[0] > two_ranks.losses[1] > two_ranks.losses[2]
    assert not _close(two_ranks.final, two_ranks.base, 1e-2)  # the checkpoint's log-probs moved
    assert sum(map(sum, two_ranks.final)) > sum(map(sum, two_ranks.base))  # towards the data
    assert two_ranks.base_after == two_ranks.base  # the base (the KL's reference) did not train


def test_a_checkpoint_is_the_hf_layout_split_by_layer(two_ranks: TwoRanks, tiny_model_dir: Path) -> None:
    from safetensors import safe_open

    files = two_ranks.checkpoints[2]
    assert weights_kind(files) == "full"
    index = json.loads(files["model.safetensors.index.json"])["weight_map"]
    with safe_open(str(tiny_model_dir / "model.safetensors"), "pt") as base:
        assert set(index) == set(base.keys())  # the names transformers and the engines read
    shards = sorted({name for name in index.values()})
    assert shards == [
        "model-00001-of-00003.safetensors",
        "model-00002-of-00003.safetensors",
        "model-00003-of-00003.safetensors",
    ]
    assert {index["model.layers.1.mlp.up_proj.weight"]} == {n for k, n in index.items() if ".layers.1." in k}
    for name in ("config.json", "tokenizer.json", "generation_config.json"):
        assert files[name] == (tiny_model_dir / name).read_bytes()
    state = json.loads(files["training/state.json"])
    assert state == {"format": 1, "kind": "full", "ranks": 2, "steps": 3}
    assert any(n.startswith("training/optimizer-") for n in files)


def test_one_rank_takes_the_step_two_ranks_take(two_ranks: TwoRanks, one_rank: Any) -> None:
    one_rank.load_state("fresh", None, LoraShape())
    metrics = one_rank.forward_backward("fresh", DATA, "cross_entropy", LOSS)
    stepped = one_rank.optim_step("fresh", ADAM)
    assert metrics["loss"] == pytest.approx(two_ranks.losses[0], abs=1e-4)
    assert stepped["grad_norm"] == pytest.approx(two_ranks.norms[0], rel=1e-4)
    files = one_rank.save_state("fresh")
    assert _close(one_rank.logprobs(files, PROBE), two_ranks.after_first)


def test_one_rank_and_two_ranks_answer_alike(two_ranks: TwoRanks, one_rank: Any) -> None:
    assert two_ranks.answers == one_rank.generate(two_ranks.checkpoints[2], QUESTIONS, 6)
    assert all(two_ranks.answers)


def test_one_rank_resumes_a_two_rank_checkpoint(two_ranks: TwoRanks, one_rank: Any) -> None:
    assert one_rank.load_state("resumed", two_ranks.checkpoints[1], LoraShape()) == {"steps": 2.0, "resumed": 0.0}
    one_rank.forward_backward("resumed", DATA, "cross_entropy", LOSS)
    assert one_rank.optim_step("resumed", ADAM)["steps"] == 3.0
    files = one_rank.save_state("resumed")
    assert _close(one_rank.logprobs(files, PROBE), two_ranks.final)  # the moments came back too


def test_a_killed_rank_fails_the_call_and_the_next_call_resumes_on_a_new_job(two_ranks: TwoRanks) -> None:
    assert "training process died" in two_ranks.killed_error
    assert two_ranks.restarted_pid not in (None, two_ranks.first_pid)
    assert two_ranks.resumed == {"steps": 2.0, "resumed": 0.0}
    assert _close(two_ranks.resumed_final, two_ranks.final)  # the next step is the uninterrupted one's
    assert "not running" in two_ranks.after_close


def test_reef_serve_trains_full_weights_on_two_ranks_and_serves_the_candidate(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from reef.client import ReefClient
    from tests.helpers.reef_server import ReefServer
    from tests.test_learning import ask_and_report, decisions, feed_until, settings

    config = settings(tiny_model_dir, weights="full", ranks=2, train_threads=2)
    with ReefServer(tmp_path, config) as reef:
        selected = feed_until(
            reef, "full", lambda: [d for d in decisions(reef, "full") if d["verdict"]["decision"] == "select"]
        )
        with ReefClient(reef.url) as client:
            releases = client.releases("full")["releases"]
            published = {d["release_id"] for d in selected}
            assert [r["weights"] for r in releases if r["release_id"] in published] == ["full"] * len(published)
            deadline = time.monotonic() + 30  # serving follows the chain's head just after the verdict
            while True:
                record = client.record(ask_and_report(reef, "full", 1)[0])["record"]
                assert record["release"]["release_id"] in {r["release_id"] for r in releases}
                if record["release"]["release_id"] != releases[-1]["release_id"] or time.monotonic() > deadline:
                    break
            assert record["release"]["release_id"] != releases[-1]["release_id"]  # not the base's release
