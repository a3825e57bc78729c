"""A tiny random Llama that vLLM's CPU build can run (its attention kernels take head_dim 32 and
up, not the 16 of `build_tiny_model`), with SmolLM2's tokenizer copied from the tiny model."""

from __future__ import annotations

import shutil
from pathlib import Path


def build_vllm_tiny_model(tiny_model_dir: Path, dest: Path, seed: int = 0) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        tie_word_embeddings=True,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).to(torch.float32)
    dest.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(dest))
    for path in Path(tiny_model_dir).iterdir():
        if path.is_file() and (
            path.name.startswith("tokenizer") or path.name.endswith(".jinja") or path.name == "special_tokens_map.json"
        ):
            shutil.copy(path, dest / path.name)
    return dest
