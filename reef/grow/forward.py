"""What both trainers (`reef.grow.trainer.LoRATrainer`, `reef.grow.full_trainer.FullTrainer`)
compute the same way, on whichever causal LM they are given: completion log-probs of left-padded
batches, the loss of a micro-batch and its gradient, greedy answers, and the metrics of a
`forward_backward` call.

Everything that makes the importance ratio exactly 1 on-policy mirrors `reef.runtimes.embedded`:
the same fp32 weights, left padding with position ids `cumsum(mask) - 1`, logits divided by the
rollout's temperature (greedy rollouts record temperature-1 log-probs, so 0 counts as 1).
Completion tokens are found by position, never by id: the pad id is the EOS id (2), which also
ends every ChatML turn inside the prompt.
"""

from __future__ import annotations

import functools
import math
import time
from pathlib import Path
from typing import Any, Callable

import torch

from reef.core.chat import ChatRequest
from reef.core.prefix import MIN_SHARED_PREFIX, shared_prefix_length
from reef.core.training import Datum, LossConfig
from reef.grow.losses import kl_to_base, log_ratio
from reef.runtimes.chatml import MAX_CONTEXT, TextStream, prompt_ids, stop_token_ids

GENERATE_BATCH = 16  # rows decoded together by `generate`

Sequences = list[tuple[list[int], list[int]]]
# (sequences, temperatures) -> (log-probs [B, C] right-aligned, mask of real completion positions)
LogprobsFn = Callable[[Sequences, list[float]], tuple[torch.Tensor, torch.Tensor]]
# the chosen token ids of a decoding step -> the ids every rank goes on with (rank 0's)
Agree = Callable[[torch.Tensor], torch.Tensor]


def new_sums() -> dict[str, float]:
    return dict(loss=0.0, ratio=0.0, kept=0.0, outside=0.0, kl=0.0, max_log_ratio=0.0)


def check_data(data: list[Datum], loss: str) -> None:
    for i, datum in enumerate(data):
        try:
            datum.check(loss)
        except ValueError as exc:
            raise ValueError(f"datum {i}: {exc}") from None


def forward_backward_metrics(sums: dict[str, float], total: float, samples: int, started: float) -> dict[str, float]:
    """A `forward_backward` call's metrics from its micro-batches' summed numbers."""
    kept = int(sums["kept"])
    return {
        "loss": sums["loss"] / kept if kept else 0.0,
        "mean_ratio": sums["ratio"] / total if total else 1.0,
        "max_abs_log_ratio": sums["max_log_ratio"],
        "clipped_fraction": (total - kept) / total if total else 0.0,  # tokens that did not count
        "outside_clip_fraction": sums["outside"] / total if total else 0.0,  # ratio off (1 - eps, 1 + eps_high)
        "kl": sums["kl"] / kept if kept else 0.0,
        "tokens": float(total),
        "samples": float(samples),
        "seconds": time.monotonic() - started,
    }


class SequenceModel:
    """The shared half of a trainer: batches through `model` (any causal LM of the base's
    vocabulary) and the tokenizer of `model_dir`."""

    def __init__(self, model_dir: Path, pad_id: int, device: torch.device, min_shared_prefix: int) -> None:
        self.model_dir = Path(model_dir)
        self.pad_id = pad_id  # any id will do: pads are masked out
        self.device = device
        self.min_shared_prefix = min_shared_prefix
        self.shared_prefix_tokens = 0  # prompt tokens not run again thanks to a shared prefix
        self.tokenizer: Any = None  # loaded for the first `generate`

    # -- the loss of a micro-batch --------------------------------------------------------------

    def _accumulate(
        self,
        rows: list[Datum],
        loss: str,
        loss_fn: Any,
        config: LossConfig,
        sums: dict[str, float],
        new_logprobs: LogprobsFn,
        base_logprobs: LogprobsFn,
        weight: float = 1.0,
        always_backward: bool = False,
    ) -> None:
        """Forward and backward one micro-batch, adding the summed (not averaged) loss's grads.
        A sharded model needs the backward on every rank alike (`always_backward`), even of a
        micro-batch with nothing to learn; `weight` 0 runs one for those collectives only (a rank
        with no rows left), counted nowhere."""
        seqs = [(d.prompt_ids, d.completion_ids) for d in rows]
        temps = [d.temperature for d in rows]
        base_lp = None
        if config.kl_coef > 0:
            with torch.no_grad():
                base_lp, _ = base_logprobs(seqs, temps)
        new_lp, real = new_logprobs(seqs, temps)
        width = new_lp.shape[1]

        def aligned(rows_: list[list[float]]) -> torch.Tensor:
            return _right_aligned(rows_, width).to(self.device)

        old_lp = new_lp.detach() if loss == "cross_entropy" else aligned([d.behaviour_logprobs for d in rows])
        weights = aligned([d.mask for d in rows])
        advantages = aligned([d.advantages for d in rows])
        live = real & (weights > 0)
        per_token, keep = loss_fn(new_lp, old_lp, advantages, live, config)
        if base_lp is not None:
            k3 = kl_to_base(new_lp, base_lp, live)
            per_token = per_token + config.kl_coef * k3
            sums["kl"] += weight * float(torch.where(keep, k3.detach(), 0.0).sum())
        total = torch.where(keep, per_token * weights, torch.zeros_like(per_token)).sum()
        if weight != 1.0:
            total = total * weight
        if always_backward or bool(keep.any()):
            total.backward()
        if weight == 0.0:
            return
        ratio = log_ratio(new_lp.detach(), old_lp, real)
        sums["loss"] += float(total.detach())
        sums["ratio"] += float(torch.where(real, ratio.exp(), 0.0).sum())
        sums["kept"] += float(keep.sum())
        inside = (ratio > math.log1p(-config.eps_clip)) & (ratio < math.log1p(config.eps_clip_high))
        sums["outside"] += float((live & ~inside).sum())
        sums["max_log_ratio"] = max(sums["max_log_ratio"], float(ratio.abs().max()))

    # -- log-probs ----------------------------------------------------------------------------

    def _sequence_logprobs(self, model: Any, sequences: Sequences, temperature: float) -> list[list[float]]:
        """Per-token log-probs of each completion given its prompt, under `model`, 8 rows a batch."""
        for prompt, _ in sequences:
            if not prompt:
                raise ValueError("every sequence needs a non-empty prompt")
        out: list[list[float]] = [[] for _ in sequences]
        todo = [i for i, (_, completion) in enumerate(sequences) if completion]
        with torch.no_grad():
            for start in range(0, len(todo), 8):
                chunk = todo[start : start + 8]
                lp, _ = self._completion_logprobs(model, [sequences[i] for i in chunk], [temperature] * len(chunk))
                for row, i in enumerate(chunk):
                    n = len(sequences[i][1])
                    out[i] = lp[row, lp.shape[1] - n :].tolist()
        return out

    def _completion_logprobs(
        self, model: Any, seqs: Sequences, temps: list[float], min_shared_prefix: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-probs [B, C] of the completions, right-aligned (C = the longest completion), and the
        mask of real completion positions. Left padding and `cumsum(mask) - 1` positions, as in
        generation; logits only for the last C + 1 positions (the 49k vocabulary is the cost).

        Rows sharing a long prompt prefix (a system prompt, a worked example) run it once: its
        keys and values, repeated to the batch, are the cache the rows' suffixes (the rest of the
        prompt plus the completion) attend to, left-padded after it. The numbers are the same;
        with gradients on they flow back through the cache into the weights on the prefix.
        `min_shared_prefix` overrides the trainer's threshold."""
        minimum = self.min_shared_prefix if min_shared_prefix is None else min_shared_prefix
        shared = shared_prefix_length([p for p, _ in seqs], minimum)
        longest = max(len(c) for _, c in seqs)
        ids, attention, positions, cache = self._after_prefix(
            model, seqs[0][0][:shared], [p[shared:] + c for p, c in seqs]
        )
        width = ids.shape[1]
        logits = (
            model(
                input_ids=ids,
                attention_mask=attention,
                position_ids=positions,
                past_key_values=cache,
                use_cache=cache is not None,
                logits_to_keep=longest + 1,
            )
            .logits[:, :-1, :]
            .float()
        )
        scale = torch.tensor([t if t > 0 else 1.0 for t in temps], dtype=torch.float32, device=self.device).view(
            -1, 1, 1
        )
        logprobs = torch.log_softmax(logits / scale, dim=-1)
        targets = ids[:, width - longest :]
        picked = logprobs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        lengths = torch.tensor([len(c) for _, c in seqs], device=self.device).unsqueeze(1)
        mask = torch.arange(longest, device=self.device).unsqueeze(0) >= (longest - lengths)
        return picked, mask

    def _after_prefix(
        self, model: Any, prefix: list[int], rows: list[list[int]]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Any]:
        """Rows that all follow `prefix` (empty: none shared), as one batch: the rows' ids left
        padded, the attention mask over prefix and row, the rows' position ids counting on from the
        prefix, and the prefix's key/value cache repeated to the batch (None without a prefix)."""
        shared = len(prefix)
        width = max(len(r) for r in rows)
        ids = torch.tensor([[self.pad_id] * (width - len(r)) + r for r in rows], device=self.device)
        attention = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=self.device)
        positions = shared + (attention.cumsum(-1) - 1).clamp(min=0)
        cache = None
        if shared:
            cache = self._prefix_cache(model, prefix, len(rows))
            attention = torch.cat([torch.ones_like(attention[:, :1]).expand(-1, shared), attention], dim=1)
            self.shared_prefix_tokens += shared * (len(rows) - 1)
        return ids, attention, positions, cache

    def _prefix_cache(self, model: Any, prefix: list[int], batch: int) -> Any:
        """The key/value cache of `prefix` (positions 0..P-1), run once and repeated `batch` times
        along the batch (`repeat_interleave`: autograd sees the copies, gradients sum back)."""
        ids = torch.tensor([prefix], device=self.device)
        positions = torch.arange(len(prefix), device=self.device).unsqueeze(0)
        cache = model(input_ids=ids, position_ids=positions, use_cache=True, logits_to_keep=1).past_key_values
        cache.batch_repeat_interleave(batch)
        return cache

    # -- greedy answers -------------------------------------------------------------------------

    def _answers(
        self, model: Any, requests: list[ChatRequest], max_tokens: int, agree: Agree | None = None
    ) -> list[str]:
        """Each request's greedy answer under `model`, as the embedded runtime would write it (the
        same prompt ids, stop tokens and text decoding). As there, an answer stops where the
        context (`MAX_CONTEXT`) ends, and a prompt that fills it is refused."""
        tokenizer = self._tokenizer()
        stops = stop_token_ids(tokenizer)
        decode = functools.partial(tokenizer.decode, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        answers: list[str] = []
        with torch.no_grad():
            for start in range(0, len(requests), GENERATE_BATCH):
                chunk = requests[start : start + GENERATE_BATCH]
                prompts = [prompt_ids(tokenizer, r) for r in chunk]
                for request, ids in zip(
                    chunk, self._greedy(model, prompts, answer_room(prompts, max_tokens), stops, agree)
                ):
                    answers.append(TextStream(decode, request.stop, watch_tools=False).finish(ids)[0])
        return answers

    def _greedy(
        self,
        model: Any,
        prompts: list[list[int]],
        max_tokens: list[int],
        stops: frozenset[int],
        agree: Agree | None = None,
    ) -> list[list[int]]:
        """The argmax continuation of each prompt, up to its first stop token (left out) or its
        row's `max_tokens`: left padding and position ids `cumsum(mask) - 1`, a key-value cache.
        The prompts' shared prefix (the gate's worked example and instructions) runs once, as in
        the embedded runtime's prefill, and only the last position's logits are computed. `agree`
        makes the ranks of a sharded model go on with the same tokens (rank 0's), so each takes
        the same number of steps."""
        shared = shared_prefix_length(prompts, self.min_shared_prefix)
        ids, attention, positions, cache = self._after_prefix(model, prompts[0][:shared], [p[shared:] for p in prompts])
        out: list[list[int]] = [[] for _ in prompts]
        live = list(range(len(prompts)))
        step = model(
            input_ids=ids,
            attention_mask=attention,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        for _ in range(max(max_tokens)):
            chosen = step.logits[:, -1, :].float().argmax(-1)
            if agree is not None:
                chosen = agree(chosen)
            for row in list(live):
                token = int(chosen[row])
                if token not in stops:
                    out[row].append(token)
                if token in stops or len(out[row]) >= max_tokens[row]:
                    live.remove(row)
            if not live:
                break
            attention = torch.cat([attention, torch.ones_like(attention[:, :1])], dim=1)
            positions = positions[:, -1:] + 1
            step = model(
                input_ids=chosen.unsqueeze(-1),
                attention_mask=attention,
                position_ids=positions,
                past_key_values=step.past_key_values,
                use_cache=True,
                logits_to_keep=1,
            )
        return out

    def _tokenizer(self) -> Any:
        if self.tokenizer is None:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir))
        return self.tokenizer


def _right_aligned(rows: list[list[float]], width: int) -> torch.Tensor:
    return torch.tensor([[0.0] * (width - len(r)) + list(r) for r in rows], dtype=torch.float32)


def answer_room(prompts: list[list[int]], max_tokens: int) -> list[int]:
    """How many tokens each prompt's answer may take: `max_tokens`, cut where the context ends,
    as the embedded runtime cuts it; a prompt with no room left is refused."""
    for prompt in prompts:
        if len(prompt) >= MAX_CONTEXT:
            raise ValueError(f"the prompt has {len(prompt)} tokens; the model's context is {MAX_CONTEXT}")
    return [max(1, min(max_tokens, MAX_CONTEXT - len(prompt))) for prompt in prompts]


__all__ = ["MIN_SHARED_PREFIX", "SequenceModel", "answer_room", "check_data", "forward_backward_metrics", "new_sums"]
