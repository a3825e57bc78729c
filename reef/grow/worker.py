"""A `LoRATrainer` in its own process, behind an asyncio API, fair across scenarios.

Training runs for seconds of pure torch; in the serving process it would contend for the GIL
between kernels and stall the event loop and the embedded runtime's worker. So the trainer
lives in a child process (spawn: a fork of a process holding torch threads and an event loop is
unsafe), which loads the base model once and answers one job at a time over a pipe.

The queue lives here in the parent: one FIFO per key (scenario), served round-robin, so a
scenario with ten queued steps does not starve one with a single step; the gate's answers
(`BACKGROUND_KEYS`) go when no training job waits and none has come for `BACKGROUND_GRACE_S`,
or, with a trainer that never waits for samples, for `BACKGROUND_SHARE` of the trainer's time.
Only one job is in the child at a time, which keeps `pending()` exact and makes a crash lose at
most that job. If the child dies, every pending call fails with `TrainingFailed` and the next
call (or `start()`) makes a new child, until `close()`.

With full weights (`weights="full"`) the child trains a `FullTrainer`; with more than one rank
(`layout`), the child is a torchrun job (`reef.grow.rank_launch`) whose rank 0 answers here as
the one child does, so the queue, the supervision and `TrainingFailed` are the same.

Spawn re-imports the parent's main script in the child, so a script that starts a worker must
guard its entry point (`if __name__ == "__main__":`); `python -m reef`, the `reef` command and
pytest are safe as they are.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import multiprocessing
import os
import signal
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reef.core.errors import ReefError
from reef.grow.rank_launch import Launch, RankLayout, rank_command

if TYPE_CHECKING:
    from reef.core.chat import ChatRequest
    from reef.core.training import Datum, TrainConfig

LOGPROBS_KEY = "_logprobs"  # the queue of log-prob jobs that name no scenario
GENERATE_KEY = "_generate"  # the queue of the gate's greedy answers (`gate.answer_on: trainer`)
# Queues served only while no other has a job: the gate's answers fill the time training waits for
# samples and never hold a training job back by more than the one job already in the child.
BACKGROUND_KEYS = frozenset({GENERATE_KEY})
# ...and only once no other job has come for this long: a recipe's primitives come one after another,
# each sent as the one before returns, and a background job let in between them would hold every one.
BACKGROUND_GRACE_S = 0.5
# ...or, while training jobs keep coming, one at the next job boundary once training jobs have had
# their share of the time since the last one, because a trainer that never waits for samples would
# otherwise starve the gate; a share, not a clock, so it means the same on a CPU and on a GPU.
BACKGROUND_SHARE = 0.25
# LoRATrainer's methods a job may call: the primitives, `step` (the four of one SAO step in one
# job) and `generate`
METHODS = ("load_state", "forward_backward", "optim_step", "save_state", "logprobs", "step", "generate")


class TrainingFailed(ReefError):
    """The training process failed a job, died, or is not running."""

    kind = "training_error"


@dataclass(eq=False)
class _Job:
    key: str
    method: str  # one of METHODS
    args: tuple[Any, ...]
    future: asyncio.Future[Any] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class TrainingWorker:
    def __init__(
        self,
        model_dir: Path,
        threads: int | None = None,
        *,
        device: str = "auto",
        dtype: str = "auto",
        engine_dtype: str | None = None,
        close_timeout: float = 30.0,
        background_share: float = BACKGROUND_SHARE,
        weights: str = "lora",
        layout: RankLayout = RankLayout(),
    ) -> None:
        self.model_dir = Path(model_dir)
        self.threads = threads
        self.placement = (device, dtype, engine_dtype)  # the trainer's device, dtype and the engine's dtype
        self.weights = weights  # "lora": LoRATrainer; "full": FullTrainer
        self.layout = layout
        if weights == "lora" and (layout.ranks > 1 or layout.nodes > 1):
            raise ValueError("learner.ranks > 1 trains full weights only (learner.weights: full)")
        self.close_timeout = close_timeout
        self.background_share = background_share
        self._queues: dict[str, collections.deque[_Job]] = {}
        self._turns: collections.deque[str] = collections.deque()  # keys with queued jobs, in serving order
        self._inflight: _Job | None = None
        self._foreground_at = 0.0  # when the last job of a key not in BACKGROUND_KEYS ended (monotonic)
        self._background_s = 0.0  # how long the last job of a key in BACKGROUND_KEYS took
        self._trained_since_background = 0.0  # seconds of other jobs since it ended
        self.busy_s = {"training": 0.0, "gate_answers": 0.0}  # the child's time on jobs, since start
        self._process: Any = None
        self._conn: Connection | None = None
        self._dispatcher: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._closing = False
        self._started = False  # start() was called and close() was not: a dead child is replaced
        self._start_lock: asyncio.Lock | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the child and wait until it has loaded the model. A no-op while one runs."""
        self._started = True
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:  # two callers must not both spawn a child
            if not self.running():
                await self._reap()
                await self._spawn()

    async def _spawn(self) -> None:
        if self.layout.ranks > 1 or self.layout.nodes > 1:
            process, parent = await self._launch_ranks()
        else:
            context = multiprocessing.get_context("spawn")
            parent, child = context.Pipe()
            process = context.Process(
                target=_child_main,
                args=(child, str(self.model_dir), self.threads, self.placement, self.weights),
                name="reef-trainer",
                daemon=True,
            )
            process.start()
            child.close()  # the child holds the only other end, so its death reads as EOF here
        try:
            kind, value = await asyncio.to_thread(parent.recv)
        except asyncio.CancelledError:
            process.kill()  # our caller gave up; leave no half-started child behind
            parent.close()
            raise
        except (EOFError, OSError):
            await asyncio.to_thread(process.join, 5)
            parent.close()
            raise TrainingFailed(f"the training process died while starting (exit code {process.exitcode})") from None
        if kind != "ready":
            await asyncio.to_thread(process.join, 5)
            parent.close()
            raise TrainingFailed(f"the training process could not start: {value}")
        self._process, self._conn, self._closing = process, parent, False
        self._wake = asyncio.Event()
        self._dispatcher = asyncio.create_task(self._dispatch(), name="reef-trainer-dispatch")

    async def _launch_ranks(self) -> tuple[Any, Connection]:
        """torchrun with this machine's ranks, once rank 0 has connected back."""
        per_rank = max(1, (self.threads or 1) // self.layout.ranks)
        launch = Launch(rank_command(self.model_dir, self.layout, per_rank, self.placement), per_rank)
        try:
            return launch.job, await asyncio.to_thread(launch.connection)
        except asyncio.CancelledError:
            launch.job.kill()
            raise
        except (EOFError, OSError) as exc:
            await asyncio.to_thread(launch.job.join, 5)
            raise TrainingFailed(f"the training ranks died while starting: {exc}") from None

    async def close(self) -> None:
        """Fail queued jobs, let the job in the child finish (up to `close_timeout`), stop the
        child, and kill it if it does not stop."""
        self._started = False
        if self._process is None:
            return
        self._closing = True
        self._fail_queued(TrainingFailed("the training worker closed"))
        assert self._wake is not None
        self._wake.set()
        if self._dispatcher is not None:
            done, _ = await asyncio.wait({self._dispatcher}, timeout=self.close_timeout)
            if not done:
                self._process.kill()  # the job in flight fails with TrainingFailed
        await self._reap()

    async def _reap(self) -> None:
        """Wait for (or end) the old child and its dispatcher; clears the way for `start()`."""
        self._closing = True  # a dispatcher still waiting for work (its child died idle) ends now
        self._fail_queued(TrainingFailed("the training process is gone"))
        if self._wake is not None:
            self._wake.set()
        process, self._process = self._process, None
        if process is not None:
            await asyncio.to_thread(process.join, self.close_timeout)
            if process.is_alive():
                process.kill()
                await asyncio.to_thread(process.join)
        if self._dispatcher is not None:
            await asyncio.gather(self._dispatcher, return_exceptions=True)
            self._dispatcher = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def running(self) -> bool:
        return (
            self._process is not None
            and self._process.is_alive()
            and not self._closing
            and self._dispatcher is not None
            and not self._dispatcher.done()
        )

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def pending(self) -> dict[str, int]:
        """Jobs submitted and not yet answered, per key: queued ones plus the one in the child."""
        counts = {key: len(queue) for key, queue in self._queues.items() if queue}
        if self._inflight is not None and not self._inflight.future.done():
            counts[self._inflight.key] = counts.get(self._inflight.key, 0) + 1
        return counts

    # -- jobs -----------------------------------------------------------------------------------

    async def call(self, key: str, method: str, *args: Any) -> Any:
        """`LoRATrainer.<method>(key, *args)` in the child, after the jobs queued before it for
        `key` (`reef.grow.training_client.TrainingClient` names them)."""
        return await self._submit(key, method, (key, *args))

    async def train(
        self, key: str, checkpoint: dict[str, bytes] | None, data: list[Datum], config: TrainConfig
    ) -> tuple[dict[str, bytes], dict[str, float]]:
        """`LoRATrainer.step` (load, forward-backward, AdamW, save) in the child, as one job."""
        return await self.call(key, "step", checkpoint, data, config)  # type: ignore[no-any-return]

    async def logprobs(
        self,
        adapter_files: dict[str, bytes] | None,
        sequences: list[tuple[list[int], list[int]]],
        temperature: float = 1.0,
        *,
        key: str = LOGPROBS_KEY,
    ) -> list[list[float]]:
        """`LoRATrainer.logprobs` in the child; `key` chooses the queue it waits in."""
        return await self._submit(key, "logprobs", (adapter_files, sequences, temperature))  # type: ignore[no-any-return]

    async def generate(
        self,
        adapter_files: dict[str, bytes] | None,
        requests: list[ChatRequest],
        max_tokens: int,
        *,
        key: str = GENERATE_KEY,
    ) -> list[str]:
        """`LoRATrainer.generate` in the child: greedy answers, taking turns with training jobs."""
        return await self._submit(key, "generate", (adapter_files, requests, max_tokens))  # type: ignore[no-any-return]

    async def _submit(self, key: str, method: str, args: tuple[Any, ...]) -> Any:
        if not self.running() and self._started:
            await self.start()  # the child died (a killed rank, a crash): the next call gets a new one
        if not self.running():
            raise TrainingFailed("the training worker is not running (start() it)")
        job = _Job(key, method, args)
        queue = self._queues.setdefault(key, collections.deque())
        if not queue and key not in self._turns:
            self._turns.append(key)
        queue.append(job)
        assert self._wake is not None
        self._wake.set()
        return await job.future

    def _next_job(self) -> tuple[_Job | None, float | None]:
        """Round-robin over keys: take the head of the next key's FIFO and send the key to the
        back of the line if it has more. A background key goes first once training jobs have had
        their share since the last background job, else only when no other key has had a job for
        `BACKGROUND_GRACE_S`. No job: how long until a background one may go (None: none waits)."""
        background = [k for k in self._turns if k in BACKGROUND_KEYS]
        foreground = [k for k in self._turns if k not in BACKGROUND_KEYS]
        job = (self._take(background) if background and self._share_due() else None) or self._take(foreground)
        if job is not None:
            return job, None
        if not any(k in BACKGROUND_KEYS for k in self._turns):  # cancelled jobs dropped above
            return None, None
        wait = BACKGROUND_GRACE_S - (time.monotonic() - self._foreground_at)
        if wait > 0:
            return None, wait
        return self._take(background), None

    def _share_due(self) -> bool:
        """Whether training jobs have had their share since the last background job: with a share
        of a quarter, three times its seconds."""
        share = self.background_share
        return share > 0 and self._trained_since_background * share >= self._background_s * (1 - share)

    def _account(self, key: str, seconds: float, ended_at: float) -> None:
        if key in BACKGROUND_KEYS:
            self._background_s, self._trained_since_background = seconds, 0.0
            self.busy_s["gate_answers"] += seconds
        else:
            self._foreground_at = ended_at
            self._trained_since_background += seconds
            self.busy_s["training"] += seconds

    def _take(self, keys: list[str]) -> _Job | None:
        for key in keys:
            job = self._pop(key)
            if job is not None:
                return job
        return None

    def _pop(self, key: str) -> _Job | None:
        """The first job of `key` whose caller still waits (a cancelled caller's job is dropped
        unsent); the key keeps a turn at the back of the line while it has more."""
        self._turns.remove(key)
        queue = self._queues.get(key)
        while queue:
            job = queue.popleft()
            if not job.future.done():
                if queue:
                    self._turns.append(key)
                else:
                    del self._queues[key]
                return job
        self._queues.pop(key, None)
        return None

    async def _dispatch(self) -> None:
        assert self._wake is not None and self._conn is not None
        conn, process = self._conn, self._process
        while True:
            job, later = (None, None) if self._closing else self._next_job()
            if job is None:
                if self._closing:
                    await self._stop_child(conn)
                    return
                self._wake.clear()
                with contextlib.suppress(TimeoutError):  # a background job's grace ran out
                    await asyncio.wait_for(self._wake.wait(), later)
                continue
            self._inflight = job
            sent_at = time.monotonic()
            try:
                await asyncio.to_thread(conn.send, (job.method, job.args))
                kind, value = await asyncio.to_thread(conn.recv)
            except (EOFError, OSError) as exc:
                await asyncio.to_thread(process.join, 5)
                died = TrainingFailed(f"the training process died (exit code {process.exitcode}): {exc!r}")
                _settle(job.future, died)
                self._fail_queued(died)
                self._closing = True  # running() is False now; start() makes a new child
                return
            finally:
                self._inflight = None
                ended_at = time.monotonic()
                self._account(job.key, ended_at - sent_at, ended_at)
            _settle(
                job.future,
                value if kind == "ok" else TrainingFailed(f"training job {job.method} for {job.key!r} failed: {value}"),
            )

    async def _stop_child(self, conn: Connection) -> None:
        try:
            await asyncio.to_thread(conn.send, ("stop", ()))
        except (OSError, ValueError):
            pass  # already gone

    def _fail_queued(self, error: TrainingFailed) -> None:
        for queue in self._queues.values():
            for job in queue:
                _settle(job.future, error)
        self._queues.clear()
        self._turns.clear()


def _settle(future: asyncio.Future[Any], outcome: Any) -> None:
    if future.done():
        return  # the caller was cancelled; nobody reads this
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


def _child_main(
    conn: Connection,
    model_dir: str,
    threads: int | None,
    placement: tuple[str, str, str | None] = ("auto", "auto", None),
    weights: str = "lora",
) -> None:
    """The child: load the trainer, then answer jobs until told to stop or the parent goes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it stops us
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    try:
        import torch

        if threads:
            torch.set_num_threads(threads)
        from reef.grow.trainer import LoRATrainer

        device, dtype, engine_dtype = placement
        trainer: Any
        if weights == "full":
            from reef.grow.full_trainer import FullTrainer

            trainer = FullTrainer(Path(model_dir), threads, device, dtype, engine_dtype)
        else:
            trainer = LoRATrainer(Path(model_dir), threads, device, dtype, engine_dtype)
        conn.send(("ready", None))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which raises it
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    while True:
        try:
            method, args = conn.recv()
        except (EOFError, OSError):
            os._exit(0)  # the parent is gone
        if method == "stop":
            # Between jobs nothing is left to flush, and interpreter teardown with torch loaded
            # takes seconds; skip it.
            os._exit(0)
        try:
            if method not in METHODS:
                raise ValueError(f"unknown training job {method!r}")
            reply = ("ok", getattr(trainer, method)(*args))
        except Exception as exc:  # noqa: BLE001 - the parent raises it as TrainingFailed
            last = traceback.extract_tb(exc.__traceback__)[-1]
            reply = ("error", f"{type(exc).__name__}: {exc} (at {Path(last.filename).name}:{last.lineno})")
        try:
            conn.send(reply)
        except (OSError, ValueError):
            return
