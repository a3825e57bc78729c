"""What the embedded runtime's worker decodes: a request (`Job`), one load's rows decoding together
(`Batch`: their KV cache, mask and positions, rows joining and leaving), and a prompt start kept
to be reused (`Prefix`). Plain state and tensor bookkeeping; the scheduling is in embedded.py."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from reef.runtimes.chatml import TextStream

# -- one request on the worker -------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class FullModel:
    """The model of one full-weight release, resident beside the shared one while a load holds it."""

    model: Any


@dataclass(eq=False)  # jobs are compared by identity when taken off the queue
class Job:
    prompt_ids: list[int]
    load_id: str
    max_tokens: int
    temperature: float
    top_p: float
    generator: torch.Generator
    text: TextStream
    emit: Callable[[object], None]
    cancelled: threading.Event = field(default_factory=threading.Event)
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    queued_at: float = 0.0  # time.monotonic() when it joined the queue (queue wait, /metrics)

    def send(self, item: object) -> None:
        try:
            self.emit(item)
        except RuntimeError:  # the consumer's event loop is gone: nobody will read the rest
            self.cancelled.set()


@dataclass(eq=False)
class Batch:
    """One load's rows decoding together: their KV cache, attention mask and next position ids,
    and the logits each row samples its next token from. Rows of different prompt lengths are
    left-padded to one width; a row that joins later is padded on the left as well."""

    load_id: str
    adapter: str | None  # peft adapter name; None: the base model (or `full`'s)
    full: FullModel | None = None  # a full-weight release's own model: the batch decodes on it
    jobs: list[Job] = field(default_factory=list)
    cache: Any = None
    mask: torch.Tensor | None = None
    positions: torch.Tensor | None = None  # (rows, 1): where each row's next token goes
    logits: torch.Tensor | None = None
    turn_ended: float = 0.0  # time.monotonic() its last turn ended: how long it has waited since

    def merge(self, cache: Any, mask: torch.Tensor, positions: torch.Tensor, logits: torch.Tensor) -> None:
        """Take in the rows just prefilled into `cache` (the last `len(logits)` of `jobs`)."""
        if self.cache is None:
            self.cache, self.mask, self.positions, self.logits = cache, mask, positions, logits
            return
        width = max(self.mask.shape[1], mask.shape[1])
        for mine, theirs in zip(self.cache.layers, cache.layers, strict=True):
            mine.keys = torch.cat([_pad_left(mine.keys, width, -2), _pad_left(theirs.keys, width, -2)])
            mine.values = torch.cat([_pad_left(mine.values, width, -2), _pad_left(theirs.values, width, -2)])
        self.mask = torch.cat([_pad_left(self.mask, width, 1), _pad_left(mask, width, 1)])
        self.positions = torch.cat([self.positions, positions])
        self.logits = torch.cat([self.logits, logits])

    def keep(self, rows: list[int]) -> None:
        """Keep only `rows`, and drop the leading columns none of them attends to any more."""
        if not rows:
            self.clear()
            return
        index = torch.tensor(rows)
        self.cache.batch_select_indices(index)
        self.mask, self.positions = self.mask[index], self.positions[index]
        self.jobs = [self.jobs[i] for i in rows]
        unused = int((self.mask.sum(0) == 0).int().cumprod(0).sum())
        if unused:
            self.mask = self.mask[:, unused:]
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[..., unused:, :], layer.values[..., unused:, :]

    def clear(self) -> None:
        self.jobs, self.cache, self.mask, self.positions, self.logits = [], None, None, None, None


@dataclass(eq=False)
class Prefix:
    """A prompt start prefilled on its own for one load: its token ids and each layer's (keys,
    values), batch size one. Keys depend only on the tokens before them (and the load's adapter),
    so any prompt starting with the same tokens can copy them instead of prefilling them."""

    ids: list[int]
    layers: list[tuple[torch.Tensor, torch.Tensor]]

    def reusable(self, prompts: list[list[int]], minimum: int) -> int:
        """How many of its tokens every prompt starts with (each keeps its last token to run)."""
        length = min(len(self.ids), *(len(prompt) - 1 for prompt in prompts))
        common = next((i for i in range(length) if any(prompt[i] != self.ids[i] for prompt in prompts)), length)
        return common if minimum and common >= minimum else 0


def _pad_left(tensor: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    missing = width - tensor.shape[dim]
    if not missing:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)
