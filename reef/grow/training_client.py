"""The training primitives of one key (a scenario), as a recipe calls them from the parent.

Each call is one job in the training process (`reef.grow.worker`), queued behind the key's
earlier jobs; the adapter and its optimiser stay resident there between calls. Nothing here
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


class TrainingClient:
    def __init__(self, worker: TrainingWorker, key: str) -> None:
        self.worker = worker
        self.key = key

    async def load_state(self, checkpoint: Checkpoint | None, lora: LoraShape = LoraShape()) -> dict[str, float]:
        """Train from `checkpoint` (a release's content: adapter + optimiser), or a fresh adapter."""
        return await self._call("load_state", checkpoint, lora)  # type: ignore[no-any-return]

    async def forward_backward(
        self, data: list[Datum], loss: str = "clipped_is", config: LossConfig = LossConfig()
    ) -> dict[str, float]:
        """Add the gradient of the named loss's mean over `data`'s kept tokens; its metrics."""
        return await self._call(
            "forward_backward",
            data,
            loss,
            config,  # type: ignore[no-any-return]
            attributes={"reef.train.samples": len(data), "reef.train.loss_fn": loss},
        )

    async def optim_step(self, adam: AdamParams) -> dict[str, float]:
        """One AdamW step on the gradient accumulated since the last one."""
        return await self._call("optim_step", adam)  # type: ignore[no-any-return]

    async def save_state(self) -> Checkpoint:
        """The checkpoint: the adapter files and, under `training/`, the optimiser's state."""
        return await self._call("save_state")  # type: ignore[no-any-return]

    async def logprobs(
        self, sequences: list[tuple[list[int], list[int]]], adapter: Checkpoint | None = None, temperature: float = 1.0
    ) -> list[list[float]]:
        """Per-token log-probs of each (prompt, completion) under `adapter` (None: the base model)."""
        return await self.worker.logprobs(adapter, sequences, temperature, key=self.key)

    async def _call(self, method: str, *args: Any, attributes: dict[str, Any] | None = None) -> Any:
        if not spans.enabled():
            return await self.worker.call(self.key, method, *args)
        with spans.span(f"reef.train.{method}", {"reef.scenario": self.key, **(attributes or {})}) as span:
            result = await self.worker.call(self.key, method, *args)
            if isinstance(result, dict) and method != "save_state":
                span.set_attributes(spans.numeric("reef.train.", result))
            return result
