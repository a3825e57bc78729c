"""A bare on-policy RL loop on the embedded model, nanoGPT-short: the yardstick Reef races.

Repeat: sample `batch` training questions, answer them from the current weights (one batched
generation: left padding, position ids cumsum(mask) - 1, a KV cache, temperature T, stop on
<|endoftext|> / <|im_start|> / <|im_end|>), score each with the task's verifier, advantage =
score - an EMA baseline (as Reef's sao recipe keeps it), one clipped policy-gradient step
(AdamW) on a LoRA adapter shaped as the recipe's. Every `snapshot_every` seconds of wall clock
the adapter weights in effect at that moment are kept in memory (a 7 MB copy per step).
Used by bench/learning_race.py (`--arms bare`), which also evaluates with `generate`.
"""

from __future__ import annotations

import os
import random
import time
from typing import Any, Callable

import torch

from reef.core.training import LoraShape
from reef.recipes.sao import SAOConfig

STOP_IDS = (0, 1, 2)  # <|endoftext|>, <|im_start|>, <|im_end|> (EOS, also the pad id)
LORA = LoraShape(SAOConfig().lora_r, SAOConfig().lora_alpha)  # the sao recipe's adapter (q, k, v, o)


def load_model(threads: int | None = None) -> tuple[Any, Any]:
    """(tokenizer, peft model) on the model Reef serves, fp32, LoRA shaped as `sao`'s."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from reef.runtimes.model_files import ensure_embedded_model

    torch.set_num_threads(threads or os.cpu_count() or 1)
    folder = str(ensure_embedded_model())  # the converted fp32 folder Reef serves and trains
    base = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    torch.manual_seed(LORA.seed)
    lora = LoraConfig(
        r=LORA.r, lora_alpha=LORA.alpha, lora_dropout=LORA.dropout, target_modules=list(LORA.target_modules)
    )
    return AutoTokenizer.from_pretrained(folder), get_peft_model(base, lora)


def prompt_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _left_pad(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    width = max(map(len, rows))
    ids = torch.tensor([[STOP_IDS[2]] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


@torch.no_grad()
def generate(
    model: Any, prompts: list[list[int]], temperature: float, max_tokens: int
) -> tuple[list[list[int]], list[list[float]], list[str]]:
    """(completion ids with the stop token, their sampling log-probs, finish reasons);
    finished rows leave the batch, as in Reef's embedded runtime."""
    from transformers import DynamicCache

    step, mask, positions = _left_pad(prompts)
    cache, rows = DynamicCache(config=model.config), list(range(len(prompts)))
    out: list[list[int]] = [[] for _ in prompts]
    logps: list[list[float]] = [[] for _ in prompts]
    for _ in range(max_tokens):
        logits = (
            model(
                input_ids=step,
                attention_mask=mask,
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
            .logits[:, -1]
            .float()
        )
        logp = torch.log_softmax(logits / (temperature or 1.0), -1)
        tokens = logp.exp().multinomial(1).squeeze(1) if temperature > 0 else logits.argmax(-1)
        for j, token in enumerate(tokens.tolist()):
            out[rows[j]].append(token)
            logps[rows[j]].append(float(logp[j, token]))
        keep = [j for j, token in enumerate(tokens.tolist()) if token not in STOP_IDS]
        if not keep:
            break
        if len(keep) < len(rows):
            index = torch.tensor(keep)
            cache.batch_select_indices(index)
            tokens, mask, positions, rows = tokens[index], mask[index], positions[index], [rows[j] for j in keep]
        step, positions = tokens.view(-1, 1), positions[:, -1:] + 1
        mask = torch.cat([mask, mask.new_ones(len(rows), 1)], dim=1)
    return out, logps, ["stop" if o[-1] in STOP_IDS else "length" for o in out]


def decode(tokenizer: Any, ids: list[int]) -> str:
    return tokenizer.decode([t for t in ids if t not in STOP_IDS], skip_special_tokens=False)


def pg_step(
    model: Any,
    opt: Any,
    prompts: list[list[int]],
    comps: list[list[int]],
    old: list[list[float]],
    advantages: list[float],
    temperature: float,
    eps: tuple[float, float] = (0.2, 0.28),
    loss: str = "mask",
) -> dict[str, float]:
    """One policy-gradient step with importance ratios against the sampling log-probs (the mean
    over kept tokens), AdamW; the fraction of tokens whose ratio left the clip range. `loss`:
    `mask` leaves those tokens out (`clipped_is`); `nomask` keeps every token in PPO's surrogate
    (`ppo` without its dual clip); `cispo` weights every token's log-prob gradient by its ratio
    truncated at 1 + eps[1] (`cispo`)."""
    ids, mask, positions = _left_pad([p + c for p, c in zip(prompts, comps)])
    longest = max(map(len, comps))
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=longest + 1).logits
    logp = torch.log_softmax(logits[:, :-1].float() / (temperature or 1.0), -1)
    new = logp.gather(-1, ids[:, -longest:, None]).squeeze(-1)
    real = torch.arange(longest)[None] >= longest - torch.tensor([len(c) for c in comps])[:, None]
    old_t = torch.tensor([[0.0] * (longest - len(o)) + o for o in old])
    adv = torch.tensor(advantages)[:, None]
    ratio = torch.where(real, new - old_t, torch.zeros_like(new)).exp()
    outside = real & ((ratio.detach() <= 1 - eps[0]) | (ratio.detach() >= 1 + eps[1]))
    keep = real & ~outside if loss == "mask" else real
    per_token = -torch.minimum(ratio * adv, ratio.clamp(1 - eps[0], 1 + eps[1]) * adv)
    if loss == "cispo":
        per_token = -ratio.detach().clamp(max=1 + eps[1]) * new * adv
    (torch.where(keep, per_token, 0.0).sum() / keep.sum().clamp(min=1)).backward()
    torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return {"outside_clip": float(outside.sum() / real.sum())}


def adapter_weights(model: Any) -> dict[str, torch.Tensor]:
    from peft import get_peft_model_state_dict

    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}


def snapshot_times(seconds: float, every: float) -> list[float]:
    """0, every, 2 every, ... and the end."""
    return [k * every for k in range(int(seconds // every) + 1) if k * every < seconds] + [seconds]


def run(
    model: Any,
    tokenizer: Any,
    tasks: Any,
    seconds: float,
    snapshot_every: float,
    *,
    lr: float,
    batch: int,
    temperature: float,
    max_tokens: int,
    decay: float = 0.9,
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> tuple[list[tuple[float, dict[str, torch.Tensor]]], list[dict]]:
    """Train for `seconds`; ([(second, adapter weights in effect then)], [per-step stats])."""
    rng, train = random.Random(seed), tasks.train_tasks()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    due = snapshot_times(seconds, snapshot_every)
    snaps, steps, baseline, started = [], [], None, time.monotonic()
    previous = adapter_weights(model)
    while True:
        now = time.monotonic() - started
        while due and due[0] <= now:  # the weights of the last step before that moment
            snaps.append((due.pop(0), previous))
        if not due:
            return snaps, steps
        previous = adapter_weights(model)
        chosen = [rng.choice(train) for _ in range(batch)]
        prompts = [prompt_ids(tokenizer, tasks.messages(t)) for t in chosen]
        comps, old, finish = generate(model, prompts, temperature, max_tokens)
        scores = [tasks.score(t, decode(tokenizer, c), f) for t, c, f in zip(chosen, comps, finish)]
        baseline = sum(scores) / len(scores) if baseline is None else baseline
        advantages = []
        for s in scores:
            advantages.append(s - baseline)
            baseline = decay * baseline + (1 - decay) * s
        pg_step(model, opt, prompts, comps, old, advantages, temperature)
        steps.append({"second": round(now, 2), "mean_score": sum(scores) / batch, "success": scores.count(1.0) / batch})
        if len(steps) % 10 == 0:
            log(
                f"bare: {now / 60:.1f} min, {len(steps)} steps, mean score of the last 10: "
                f"{sum(s['mean_score'] for s in steps[-10:]) / 10:.3f}"
            )
