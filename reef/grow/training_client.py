"""The training primitives of one key (a scenario), as a recipe calls them from the parent.

Each call is one job in the training process (`reef.grow.worker`), queued behind the key's
earlier jobs; the weights trained (a LoRA adapter, or the whole model with `learner.weights:
full`) and their optimiser stay resident there between calls. Nothing here
imports torch: the data are plain (`reef.core.training`). With traces on, each call is a span
`reef.train.{method}` (a child of the learner's `reef.learn`, whose scenario, batch and recipe
it carries), with the call's numeric results as `reef.train.*` attributes.
"""

from __future__ import annotations

from typing import Any

from reef.core.training import AdamParams, Datum, LoraShape, LossConfig
from reef.grow.worker import TrainingWorker
from reef.observe import spans

Checkpoint = dict[str, bytes]
STEP_KEYS = ("loss", "kl", "clipped_fraction", "tokens", "samples")  # of forward_backward's metrics
MAX_STEPS = 64  # per candidate, the newest kept: a few lines of the commit log at most


class TrainingClient:
    def __init__(self, worker: TrainingWorker, key: str) -> None:
        self.worker = worker
        self.key = key
        self.steps: list[dict[str, float]] = []  # the candidate being made: one compact record per step

    async def load_state(self, checkpoint: Checkpoint | None, lora: LoraShape = LoraShape()) -> dict[str, float]:
        """Train from `checkpoint` (a release's content: its adapter or full weights, and the
        optimiser), or from the base (a fresh adapter shaped by `lora`; full weights ignore it)."""
        self.steps = []
        return await self._call("load_state", checkpoint, lora)  # type: ignore[no-any-return]

    async def forward_backward(
        self, data: list[Datum], loss: str = "clipped_is", config: LossConfig = LossConfig()
    ) -> dict[str, float]:
        """Add the gradient of the named loss's mean over `data`'s kept tokens; its metrics."""
        metrics: dict[str, float] = await self._call(
            "forward_backward",
            data,
            loss,
            config,
            attributes={"reef.train.samples": len(data), "reef.train.loss_fn": loss},
        )
        step = {k: _rounded(metrics[k]) for k in STEP_KEYS if k in metrics}
        self.steps = [*self.steps[-(MAX_STEPS - 1) :], {**step, "advantage": _rounded(mean_advantage(data))}]
        return metrics

    async def optim_step(self, adam: AdamParams) -> dict[str, float]:
        """One AdamW step on the gradient accumulated since the last one."""
        metrics: dict[str, float] = await self._call("optim_step", adam)
        if self.steps and "grad_norm" in metrics:
            self.steps[-1]["grad_norm"] = _rounded(metrics["grad_norm"])
        return metrics

    def take_steps(self) -> list[dict[str, float]]:
        """The step records since the last `load_state` (the dashboard's training curve), once."""
        steps, self.steps = self.steps, []
        return steps

    async def save_state(self) -> Checkpoint:
        """The checkpoint: the adapter files (or the full weights' Hugging Face folder) and, under
        `training/`, the optimiser's state."""
        return await self._call("save_state")  # type: ignore[no-any-return]

    async def logprobs(
        self, sequences: list[tuple[list[int], list[int]]], adapter: Checkpoint | None = None, temperature: float = 1.0
    ) -> list[list[float]]:
        """Per-token log-probs of each (prompt, completion) under `adapter` (a release's weights of
        the trainer's kind; None: the base model)."""
        return await self.worker.logprobs(adapter, sequences, temperature, key=self.key)

    async def _call(self, method: str, *args: Any, attributes: dict[str, Any] | None = None) -> Any:
        if not spans.enabled():
            return await self.worker.call(self.key, method, *args)
        with spans.span(f"reef.train.{method}", {"reef.scenario": self.key, **(attributes or {})}) as span:
            result = await self.worker.call(self.key, method, *args)
            if isinstance(result, dict) and method != "save_state":
                span.set_attributes(spans.numeric("reef.train.", result))
            return result


def mean_advantage(data: list[Datum]) -> float:
    """The mean advantage over the tokens the loss weighs (mask above 0)."""
    kept = [a for d in data for a, m in zip(d.advantages, d.mask) if m > 0]
    return sum(kept) / len(kept) if kept else 0.0


def _rounded(value: float) -> float:
    return float(f"{float(value):.5g}")
