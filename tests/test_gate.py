"""The weights gate decides on evidence: a paired test on tasks, or an offline check that a
candidate trained on inverted scores fails."""

from __future__ import annotations

import asyncio
import contextlib
import json
import zlib
from pathlib import Path
from typing import Any, AsyncIterator

import httpx
import openai
import pytest

from reef.commit.gate import (
    EVERY_TASK,
    TRAINER_JOB,
    WARM_CHUNK,
    WeightsGate,
    load_scorer,
    load_tasks,
    look_parts,
    paired_verdict,
    sequential_verdict,
    sign_test_p,
    split_halves,
)
from reef.commit.publisher import CandidatePublisher
from reef.commit.state import ReefState
from reef.config import GateConfig
from reef.core.chat import ChatRequest, ChatResult, Delta, Finish, Message, TextDelta
from reef.core.errors import InvalidInput
from reef.core.training import Rollout
from reef.core.types import ArtifactKind, Candidate, Operation, Release, ReleaseRef, Verdict
from reef.grow.trainer import TrainConfig
from reef.grow.worker import TrainingWorker
from reef.runtimes.base import Runtime
from reef.runtimes.embedded import EmbeddedRuntime
from tests.helpers.lora import lora_files


def test_sign_test_and_paired_verdict() -> None:
    assert sign_test_p(0, 0) == 1.0
    assert sign_test_p(3, 0) == pytest.approx(0.125)
    assert sign_test_p(5, 5) > 0.5
    better = paired_verdict([0, 0, 0, 1, 0, 0], [1, 1, 1, 1, 0, 1], margin=0.1, confidence=0.8)
    assert better.decision == "select" and better.metrics["wins"] == 4 and better.metrics["losses"] == 0
    assert better.metrics["candidate_success"] > better.metrics["current_success"]
    same = paired_verdict([1, 0, 1], [1, 0, 1], margin=0.0, confidence=0.8)
    assert same.decision == "reject"  # no evidence of a win is not a win
    worse = paired_verdict([1, 1, 1, 1], [0, 0, 0, 1], margin=0.0, confidence=0.8)
    assert worse.decision == "reject" and worse.metrics["gain"] < 0
    assert worse.metrics["p_worse"] == pytest.approx(0.125) and better.metrics["p_worse"] == 1.0


def test_the_tasks_are_looked_at_in_parts_of_a_mixed_order_drawn_per_candidate() -> None:
    parts = look_parts(range(92), 3, "sha256:a")
    assert [len(p) for p in parts] == [31, 30, 31] and sorted(sum(parts, [])) == list(range(92))
    assert parts == look_parts(range(92), 3, "sha256:a") and parts[0] != list(
        range(31)
    )  # the file's kinds mixed in every part
    firsts = {tuple(sorted(look_parts(range(92), 3, f"sha256:{name}")[0])) for name in "abcdefgh"}
    assert len(firsts) == 8  # no subset of tasks is every candidate's first look
    assert look_parts(range(2), 5, "x") == [[i] for i in look_parts(range(2), 1, "x")[0]]  # no more parts than tasks


def pairs(wins: int, losses: int, ties: int) -> tuple[list[float], list[float]]:
    return [0.0] * wins + [1.0] * losses + [0.0] * ties, [1.0] * wins + [0.0] * losses + [0.0] * ties


def test_the_sequential_gate_decides_early_only_on_strong_evidence() -> None:
    config = GateConfig(confidence=0.8, looks=3)  # early looks select at p <= 0.025, the last at p <= 0.15
    early = sequential_verdict(*pairs(6, 0, 24), config, look=1, looks=3)
    assert early is not None and early.decision == "select" and early.metrics["early"] is True
    assert sequential_verdict(*pairs(4, 0, 26), config, look=1, looks=3) is None  # p = 0.0625: look further
    assert sequential_verdict(*pairs(0, 0, 30), config, look=2, looks=3) is None  # no evidence either way
    assert sequential_verdict(*pairs(5, 6, 19), config, look=1, looks=3) is None  # a tie so far: look further
    losing = sequential_verdict(*pairs(1, 5, 24), config, look=1, looks=3)
    assert losing is not None and losing.decision == "reject" and losing.metrics["p_worse"] == pytest.approx(0.109375)
    final = sequential_verdict(*pairs(6, 2, 84), config, look=3, looks=3)  # p = 0.145
    assert final is not None and final.decision == "select" and final.metrics["early"] is False
    strict = sequential_verdict(*pairs(4, 1, 87), config, look=3, looks=3)  # p = 0.1875: over what is left at the end
    assert strict is not None and strict.decision == "reject"
    one_look = sequential_verdict(*pairs(4, 1, 87), GateConfig(confidence=0.8, looks=1), look=1, looks=1)
    assert one_look is not None and one_look.decision == "select"  # all of 1 - confidence at the only look


def test_tasks_and_scorer_are_checked_when_loaded(tmp_path: Path) -> None:
    good = tmp_path / "tasks.jsonl"
    good.write_text(
        json.dumps({"prompt": "hi", "answer": "x"})
        + "\n\n"
        + json.dumps({"messages": [{"role": "user", "content": "yo"}]})
        + "\n"
    )
    assert len(load_tasks(good)) == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "hi"}) + "\n" + json.dumps({"nothing": 1}) + "\n")
    with pytest.raises(InvalidInput, match="bad.jsonl:2"):
        load_tasks(bad)
    with pytest.raises(InvalidInput, match="module:function"):
        load_scorer("no.such.module:score")
    assert load_scorer("tests.test_gate:length_scorer")({"x": 1}, "abc") == 3.0


def length_scorer(task: dict, text: str) -> float:
    return float(len(text))


def rollouts(model_dir: Path, n: int) -> list[tuple[list[int], list[int], list[float]]]:
    async def run() -> list[tuple[list[int], list[int], list[float]]]:
        runtime = EmbeddedRuntime(model_dir, threads=1, default_max_tokens=6)
        await runtime.start()
        load = await runtime.load("base", {})
        out = []
        for i in range(n):
            result = ChatResult()
            request = ChatRequest(
                model="m",
                messages=(Message("user", f"Tell me about {i}."),),
                dialect="openai",
                temperature=1.0,
                seed=i,
                max_tokens=6,
            )
            async for delta in runtime.generate(request, ReleaseRef("r", "c", load)):
                result.add(delta)
            out.append((result.prompt_token_ids, result.token_ids, result.logprobs))
        await runtime.close()
        return out

    return asyncio.run(run())


def test_offline_check_rejects_a_candidate_trained_on_inverted_scores(tiny_model_dir: Path) -> None:
    data = rollouts(tiny_model_dir, 8)
    scores = [1.0 if i % 2 == 0 else 0.0 for i in range(8)]  # the truth
    held = [Rollout(f"r{i}", "base", p, c, lp) for i, (p, c, lp) in enumerate(data)]
    holdout = list(zip(scores, held))
    # one small step: first-order effects dominate (with big steps LoRA's B·A product makes
    # second-order, sign-blind changes win on a random tiny model)
    config = TrainConfig(lr=0.01, eps_clip=0.99, eps_clip_high=100.0)

    async def decisions() -> dict[str, str]:
        worker = TrainingWorker(tiny_model_dir, threads=1)
        await worker.start()
        gate = WeightsGate(GateConfig(offline_bound=0.01), runtime=None, worker=worker)  # type: ignore[arg-type]
        out = {}
        try:
            for name, sign in (("inverted", -1.0), ("true", 1.0)):
                samples = [r.datum(sign * (s - 0.5)) for s, r in zip(scores, held)]
                files, _ = await worker.train(name, None, samples, config)
                verdict = await gate.judge(ReleaseRef("r", "c", None), {}, "sha256:x", files, holdout)
                out[name] = verdict.decision
        finally:
            await worker.close()
        return out

    assert asyncio.run(decisions()) == {"inverted": "reject", "true": "select"}


def test_each_answer_on_the_tasks_keeps_its_task_index(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Two candidates judged against one release: every per-task result names its task, in
    the order drawn for that candidate, and a task's current score is the same in both verdicts (the learner
    counts a task once across a line's verdicts by this index)."""
    config = GateConfig(
        tasks=str(twelve_tasks(tmp_path)),
        scorer="tests.test_gate:length_scorer",
        looks=3,
        max_tokens=6,
        temperature=0.0,
        confidence=0.8,
    )
    data = rollouts(tiny_model_dir, 4)

    async def verdicts() -> list[dict]:
        worker = TrainingWorker(tiny_model_dir, threads=1)
        runtime = EmbeddedRuntime(tiny_model_dir, threads=1, default_max_tokens=6)
        await worker.start()
        await runtime.start()
        try:
            current = ReleaseRef("r", "c", await runtime.load("c", {}))
            gate = WeightsGate(config, runtime, worker)
            out = []
            for name, lr in (("a", 0.05), ("b", 0.1)):
                samples = [
                    Rollout(f"r{i}", "base", p, c, lp).datum(1.0 if i % 2 else -1.0)
                    for i, (p, c, lp) in enumerate(data)
                ]
                files, _ = await worker.train(name, None, samples, TrainConfig(lr=lr))
                out.append((await gate.judge(current, {}, f"sha256:{name}", files, [])).metrics)
        finally:
            await runtime.close()
            await worker.close()
        return out

    first, second = asyncio.run(verdicts())
    for name, metrics in zip("ab", (first, second)):
        order = sum(look_parts(range(12), 3, f"sha256:{name}"), [])
        assert [t["index"] for t in metrics["per_task"]] == order[: metrics["n"]]
    current = {t["index"]: t["current"] for t in first["per_task"]}
    assert all(current[t["index"]] == t["current"] for t in second["per_task"] if t["index"] in current)


def twelve_tasks(folder: Path) -> Path:
    tasks = folder / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"prompt": f"Tell me about {i}."}) + "\n" for i in range(12)))
    return tasks


@contextlib.asynccontextmanager
async def observed_runtime(model_dir: Path) -> AsyncIterator[tuple[EmbeddedRuntime, ReleaseRef, list[int]]]:
    """The embedded runtime with the base loaded as the serving release, and the size of every
    batch it runs, in order."""
    runtime = EmbeddedRuntime(model_dir, threads=1, max_batch=8)
    sizes: list[int] = []
    runtime.batch_observer = lambda n, _waits: sizes.append(n)
    await runtime.start()
    try:
        yield runtime, ReleaseRef("r", "c", await runtime.load("c", {})), sizes
    finally:
        await runtime.close()


def test_the_gate_keeps_at_most_its_concurrency_in_flight(tiny_model_dir: Path, tmp_path: Path) -> None:
    """`gate.concurrency` bounds the gate's requests in flight (so live traffic keeps the rest of
    the runtime); without it a look's tasks go all at once. With `concurrency_when: starved` the
    bound holds only for a candidate the learner made while waiting for samples."""
    tasks = twelve_tasks(tmp_path)

    async def batch_sizes(
        concurrency: int | None, when: str = "always", starved: bool = False
    ) -> tuple[list[int], dict[str, Any]]:
        config = GateConfig(
            tasks=str(tasks),
            scorer="tests.test_gate:length_scorer",
            looks=1,
            max_tokens=4,
            concurrency=concurrency,
            concurrency_when=when,
        )
        async with observed_runtime(tiny_model_dir) as (runtime, current, sizes):
            verdict = await WeightsGate(config, runtime, worker=None).judge(  # type: ignore[arg-type]
                current, {}, "sha256:candidate", {}, [], starved=starved
            )
        return sizes, verdict.metrics

    bounded, metrics = asyncio.run(batch_sizes(2))
    assert metrics["n"] == 12 and max(bounded) <= 2 and sum(bounded) == 24  # both releases answered every task
    assert metrics["in_flight_bound"] == 2
    unbounded, metrics = asyncio.run(batch_sizes(None))
    assert max(unbounded) > 2 and metrics["in_flight_bound"] is None
    fed, metrics = asyncio.run(batch_sizes(2, "starved", starved=False))
    assert max(fed) > 2 and metrics["in_flight_bound"] is None
    starved, metrics = asyncio.run(batch_sizes(2, "starved", starved=True))
    assert max(starved) <= 2 and metrics["in_flight_bound"] == 2


def test_warming_answers_the_serving_releases_tasks_once_ahead_of_a_verdict(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """While no candidate is ready the gate answers its tasks for the serving release (bounded as a
    verdict would be), a chunk a call; the verdict that follows asks only the candidate, and its
    current scores are the warmed ones. Warming again answers nothing."""
    config = GateConfig(
        tasks=str(twelve_tasks(tmp_path)), scorer="tests.test_gate:length_scorer", looks=1, max_tokens=4, concurrency=2
    )

    async def run() -> tuple[list[int], int, list[int], list[int], dict[str, Any]]:
        async with observed_runtime(tiny_model_dir) as (runtime, current, sizes):
            gate = WeightsGate(config, runtime, worker=None)  # type: ignore[arg-type]
            first = [await gate.warm(current, limit=0), await gate.warm(current, limit=5), await gate.warm(current)]
            warmed = list(sizes)
            again = await gate.warm(current)
            sizes.clear()
            verdict = await gate.judge(current, {}, "sha256:candidate", {}, [])
        return first, again, warmed, sizes, verdict.metrics

    first, again, warmed, judged, metrics = asyncio.run(run())
    assert (first, again) == ([0, 5, 7], 0)  # a limit of 0 answers none; no limit, a chunk (8: the rest)
    assert sum(warmed) == 12 and max(warmed) <= 2  # the bound holds for warming too
    assert sum(judged) == 12 and metrics["n"] == 12  # the candidate's answers only
    assert metrics["ties"] == 12  # the same weights, so the warmed answers are the candidate's too


class Grader(Runtime):
    """Answers "right" from the load of content "sha256:good", "wrong" from any other load."""

    def __init__(self) -> None:
        self.asked: dict[str, list[int]] = {}  # load id -> the task seeds it answered

    def served_models(self) -> list[str]:
        return ["grader"]

    async def generate(self, request: ChatRequest, release: ReleaseRef) -> AsyncIterator[Delta]:
        self.asked.setdefault(release.runtime_load_id or "", []).append(request.seed or 0)
        yield TextDelta("right" if release.runtime_load_id == "load:sha256:good" else "wrong")
        yield Finish("stop")

    async def count_tokens(self, request: ChatRequest) -> int:
        return 0

    async def load(self, content_id: str, files: Any) -> str:
        return f"load:{content_id}"

    async def unload(self, runtime_load_id: str) -> None:
        return None


def right_scorer(task: dict, text: str) -> float:
    return 1.0 if text == "right" else 0.0


def test_split_halves_are_fixed_disjoint_and_cover_every_task() -> None:
    first, second = split_halves(13)
    assert sorted(first + second) == list(range(13)) and abs(len(first) - len(second)) <= 1
    assert (first, second) == split_halves(13) and first != list(range(7))  # fixed, and not the file's first half


def test_with_halves_each_head_is_judged_on_the_half_it_was_not_selected_on(tmp_path: Path) -> None:
    """The base is judged on the first half; a candidate selected there becomes the serving release
    and its successors are judged (and its answers warmed) on the second half only. A new gate
    learns from the chain's verdicts which half chose the serving release (a restart)."""
    config = GateConfig(tasks=str(twelve_tasks(tmp_path)), scorer="tests.test_gate:right_scorer", looks=1, halves=True)
    first, second = split_halves(12)
    base, good = (
        ReleaseRef("r0", "sha256:base", "load:sha256:base"),
        ReleaseRef("r1", "sha256:good", "load:sha256:good"),
    )

    async def run() -> tuple[Grader, dict[str, Any], int, dict[str, Any], WeightsGate]:
        runtime = Grader()
        gate = WeightsGate(config, runtime, worker=None)  # type: ignore[arg-type]
        selected = await gate.judge(base, {}, "sha256:good", {}, [])
        warmed = await gate.warm(good, limit=100)
        after = await gate.judge(good, {}, "sha256:next", {}, [])
        return runtime, selected.metrics, warmed, after.metrics, gate

    runtime, selected, warmed, after, gate = asyncio.run(run())
    assert selected["half"] == 0 and selected["n"] == len(first) and selected["wins"] == len(first)
    assert sorted(t["index"] for t in selected["per_task"]) == first
    assert (
        warmed == len(second) and sorted(runtime.asked["load:sha256:good"][len(first) : len(first) + warmed]) == second
    )
    assert after["half"] == 1 and sorted(t["index"] for t in after["per_task"]) == second
    assert sorted(runtime.asked["load:sha256:next"]) == second  # the successor never saw the tasks that chose its head

    restarted = WeightsGate(config, Grader(), worker=None)  # type: ignore[arg-type]
    assert restarted.judged_on(good) == (0, first)  # before it reads the chain: as the base
    restarted.remember([Release("s", 1, Operation.TRAINING, good, "r0", Verdict("select", selected), False, {}, 0.0)])
    assert restarted.judged_on(good) == (1, second)
    assert gate.judged_on(good) == (1, second) and GateConfig().halves is False


class Ranks(Grader):
    """Answers "best" from the load of content "sha256:best", else as Grader does."""

    async def generate(self, request: ChatRequest, release: ReleaseRef) -> AsyncIterator[Delta]:
        if release.runtime_load_id != "load:sha256:best":
            async for delta in super().generate(request, release):
                yield delta
            return
        self.asked.setdefault(release.runtime_load_id, []).append(request.seed or 0)
        yield TextDelta("best")
        yield Finish("stop")


def rank_scorer(task: dict, text: str) -> float:
    return {"right": 0.5, "best": 1.0}.get(text, 0.0)


def test_with_halves_after_first_the_base_is_judged_on_every_task_and_later_heads_on_the_other_half(
    tmp_path: Path,
) -> None:
    """`halves: after_first`: the base's candidate is judged on every task (the start needs no more
    margin than without halves); the head it selected has its successors judged on the first half,
    and the head selected there on the second. A restarted gate reads the same from the chain."""
    config = GateConfig(
        tasks=str(twelve_tasks(tmp_path)), scorer="tests.test_gate:rank_scorer", looks=1, halves="after_first"
    )
    first, second = split_halves(12)
    base, good = (
        ReleaseRef("r0", "sha256:base", "load:sha256:base"),
        ReleaseRef("r1", "sha256:good", "load:sha256:good"),
    )
    best = ReleaseRef("r2", "sha256:best", "load:sha256:best")

    async def run() -> tuple[Ranks, list[Verdict], WeightsGate]:
        runtime = Ranks()
        gate = WeightsGate(config, runtime, worker=None)  # type: ignore[arg-type]
        verdicts = [
            await gate.judge(base, {}, "sha256:good", {}, []),
            await gate.judge(good, {}, "sha256:best", {}, []),
            await gate.judge(best, {}, "sha256:next", {}, []),
        ]
        return runtime, verdicts, gate

    runtime, (on_every, on_first, on_second), gate = asyncio.run(run())
    assert on_every.decision == "select" and on_every.metrics["half"] == EVERY_TASK and on_every.metrics["n"] == 12
    assert on_first.decision == "select" and on_first.metrics["half"] == 0
    chose, then = runtime.asked["load:sha256:best"][: len(first)], runtime.asked["load:sha256:best"][len(first) :]
    assert (sorted(chose), sorted(then)) == (first, second)  # selected on the first half, then the head of the second
    assert on_second.decision == "reject" and on_second.metrics["half"] == 1
    assert sorted(runtime.asked["load:sha256:next"]) == second  # never the tasks that chose its head
    assert gate.judged_on(base) == (EVERY_TASK, list(range(12)))

    restarted = WeightsGate(config, Ranks(), worker=None)  # type: ignore[arg-type]
    assert restarted.judged_on(good) == (EVERY_TASK, list(range(12)))  # before it reads the chain: as the base
    restarted.remember(
        [
            Release("s", 1, Operation.TRAINING, good, "r0", on_every, False, {}, 0.0),
            Release("s", 2, Operation.TRAINING, best, "r1", on_first, False, {}, 0.0),
        ]
    )
    assert (restarted.judged_on(good), restarted.judged_on(best)) == ((0, first), (1, second))


def test_halves_need_two_tasks(tmp_path: Path) -> None:
    one = tmp_path / "one.jsonl"
    one.write_text('{"prompt": "hi"}\n')
    with pytest.raises(InvalidInput, match="halves needs at least two tasks"):
        WeightsGate(
            GateConfig(tasks=str(one), scorer="tests.test_gate:right_scorer", halves=True), Grader(), worker=None
        )  # type: ignore[arg-type]


def test_after_a_restart_the_publisher_tells_the_gate_which_half_chose_the_head(tmp_path: Path) -> None:
    """The chain, on disk, keeps each verdict's half; a new publisher on it hands them to its gate."""
    config = GateConfig(tasks=str(twelve_tasks(tmp_path)), scorer="tests.test_gate:right_scorer", looks=1, halves=True)
    first, second = split_halves(12)

    async def select_one(chain: Any) -> ReleaseRef:
        gate = WeightsGate(config, Grader(), worker=None)  # type: ignore[arg-type]
        verdict = await gate.judge(chain.head().ref, {}, "sha256:good", {}, [])
        candidate = Candidate({"adapter_model.safetensors": b"good"}, ArtifactKind.WEIGHTS)
        return chain.publish(candidate, chain.head().release_id, verdict=verdict).ref

    with ReefState.open(tmp_path / "state") as state:
        head = asyncio.run(select_one(state.create("s", "sao")))
    with ReefState.open(tmp_path / "state") as state:
        gate = WeightsGate(config, Grader(), worker=None)  # type: ignore[arg-type]
        assert gate.judged_on(head) == (0, first)
        CandidatePublisher(state.chain("s"), gate)  # type: ignore[arg-type]
        assert gate.judged_on(head) == (1, second)


async def served_text(runtime: Runtime, load_id: str, request: ChatRequest) -> str:
    result = ChatResult()
    async for delta in runtime.generate(request, ReleaseRef("r", "c", load_id)):
        result.add(delta)
    return result.text


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_the_training_process_answers_the_tasks_as_the_serving_runtime_does(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """`answer_on: trainer`: the worker's greedy answers are the embedded runtime's, text for text,
    under the base and under an adapter, so a verdict is the same wherever the tasks are answered;
    on the trainer the gate never touches the serving runtime."""
    tasks = twelve_tasks(tmp_path)
    adapter = lora_files(tiny_model_dir, tmp_path / "adapter", seed=3)
    requests = [
        ChatRequest(
            model="m",
            messages=(Message("user", f"Tell me about {i}."),),
            dialect="openai",
            max_tokens=8,
            temperature=0.0,
            seed=i,
        )
        for i in range(12)
    ]

    async def run() -> tuple[dict[str, list[str]], dict[str, list[str]], dict[str, Any], int]:
        worker = TrainingWorker(tiny_model_dir, threads=1)
        runtime = EmbeddedRuntime(tiny_model_dir, threads=1, default_max_tokens=8)
        await worker.start()
        await runtime.start()
        try:
            loads = {"base": await runtime.load("base", {}), "adapter": await runtime.load("a", adapter)}
            served = {name: [await served_text(runtime, load, r) for r in requests] for name, load in loads.items()}
            trained = {
                "base": await worker.generate(None, requests, 8),
                "adapter": await worker.generate(adapter, requests, 8),
            }
            current = ReleaseRef("r", "sha256:base", loads["base"])
            verdicts = {}
            for answer_on in ("runtime", "trainer"):
                config = GateConfig(
                    tasks=str(tasks), scorer="tests.test_gate:length_scorer", looks=1, max_tokens=8, answer_on=answer_on
                )
                gate = WeightsGate(config, runtime if answer_on == "runtime" else None, worker)  # type: ignore[arg-type]
                if answer_on == "trainer":
                    gate.know_files(current, {})
                    warmed = await gate.warm(current)  # the serving release's answers ahead, from its files
                verdicts[answer_on] = (await gate.judge(current, {}, "sha256:a", adapter, [])).metrics
        finally:
            await runtime.close()
            await worker.close()
        return served, trained, verdicts, warmed

    served, trained, verdicts, warmed = asyncio.run(run())
    assert served["base"] != served["adapter"]  # the adapter changes the answers, so parity means something
    assert trained == served
    assert verdicts["trainer"]["per_task"] == verdicts["runtime"]["per_task"]
    assert warmed == min(TRAINER_JOB, len(requests))  # one job's worth ahead


def test_a_job_of_the_trainer_is_the_rows_it_decodes_together(tmp_path: Path) -> None:
    """On the trainer the gate's chunk is one batch of the trainer's decoding (bench/gate_jobs.py:
    jobs of 8 answer 1.2-1.3x slower, jobs of 32 no faster while a candidate waits longer behind
    them); on the runtime it stays small."""
    from reef.grow.trainer import GENERATE_BATCH

    tasks, scorer = str(twelve_tasks(tmp_path)), "tests.test_gate:length_scorer"
    on_trainer = WeightsGate(GateConfig(tasks=tasks, scorer=scorer, answer_on="trainer"), None, None)  # type: ignore[arg-type]
    on_runtime = WeightsGate(GateConfig(tasks=tasks, scorer=scorer), None, None)  # type: ignore[arg-type]
    assert on_trainer.chunk == TRAINER_JOB == GENERATE_BATCH
    assert on_runtime.chunk == WARM_CHUNK < TRAINER_JOB


def test_answering_on_the_trainer_is_greedy_only() -> None:
    with pytest.raises(ValueError, match="answers greedily"):
        GateConfig(answer_on="trainer", temperature=0.7)


def text_scorer(task: dict, text: str) -> float:
    return float(zlib.crc32(text.encode()))  # one score per distinct answer


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_the_publisher_hands_the_gate_the_serving_releases_files_to_answer_on_the_trainer(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Warming on the trainer answers the serving release's tasks from its adapter files, which the
    publisher reads from the chain: the same adapter judged after it ties every task (the base's
    answers would not)."""
    adapter = lora_files(tiny_model_dir, tmp_path / "adapter", seed=3)
    config = GateConfig(
        tasks=str(twelve_tasks(tmp_path)),
        scorer="tests.test_gate:text_scorer",
        looks=1,
        max_tokens=8,
        answer_on="trainer",
    )

    async def run(chain: Any) -> tuple[list[int], dict[str, Any], dict[str, Any]]:
        worker = TrainingWorker(tiny_model_dir, threads=1)
        await worker.start()
        try:
            gate = WeightsGate(config, None, worker)  # type: ignore[arg-type]
            publisher = CandidatePublisher(chain, gate)  # type: ignore[arg-type]
            warmed = [await publisher.warm(), await publisher.warm(), await publisher.warm()]
            same = await gate.judge(chain.serving(), {}, "sha256:same", adapter, [])  # answers all warmed already
            base = await WeightsGate(config, None, worker).judge(chain.serving(), {}, "sha256:x", adapter, [])  # type: ignore[arg-type]
        finally:
            await worker.close()
        return warmed, same.metrics, base.metrics

    with ReefState.open(tmp_path / "state") as state:
        chain = state.create("s", "sao")
        chain.publish(Candidate(adapter, ArtifactKind.WEIGHTS), chain.head().release_id, verdict=Verdict("select", {}))
        warmed, same, base = asyncio.run(run(chain))
    assert TRAINER_JOB >= 12 and warmed == [12, 0, 0]  # one job of the trainer answers all twelve
    assert same["ties"] == 12
    assert base["ties"] < 12  # a gate told the serving release is the base answers differently


@pytest.mark.parametrize("answer_on", ["runtime", "trainer"])
def test_a_gate_task_longer_than_the_context_idles_the_learner_with_the_reason(
    tiny_model_dir: Path, tmp_path: Path, answer_on: str
) -> None:
    """A task whose prompt fills the 2,048-token context would fail every verdict, so every
    candidate would be abandoned: the learner is refused at start instead, saying which task, and
    the scenario is still served."""
    from reef.config import ServeConfig
    from reef.runtimes.factory import build_runtime
    from reef.serve.app import create_app

    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"prompt": "Say hi."}) + "\n" + json.dumps({"prompt": "word " * 2100}) + "\n")
    config = ServeConfig(
        state_dir=tmp_path / "state",
        embedded={"model_dir": tiny_model_dir, "threads": 1},
        recipes={"scenarios": {"w": "sao"}},
        learner={"gate": {"tasks": str(tasks), "scorer": "tests.test_gate:length_scorer", "answer_on": answer_on}},
    )
    app = create_app(config, build_runtime(config))

    async def start_the_learner_then_ask() -> tuple[dict[str, Any], Any]:
        async with app.router.lifespan_context(app):
            reef = app.state.reef
            await reef.scenarios.resolve("w")
            status = reef.learning.status()
            http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1")
            async with openai.AsyncOpenAI(api_key="unused", base_url="http://127.0.0.1/v1", http_client=http) as client:
                answer = await client.chat.completions.with_raw_response.create(
                    model="reef",
                    messages=[{"role": "user", "content": "Say hi."}],
                    max_tokens=4,
                    extra_headers={"x-reef-scenario": "w"},
                )
            return status, answer

    status, answer = asyncio.run(start_the_learner_then_ask())
    assert answer.headers["x-reef-agent-record-id"] and answer.parse().choices[0].message.content  # still served
    assert status["learners"] == [] and status["training_queue"] == {}
    reason = {row["scenario"]: row["reason"] for row in status["idle"]}["w"]
    assert "gate task 2 of 2" in reason and "context is 2048 tokens" in reason, reason
