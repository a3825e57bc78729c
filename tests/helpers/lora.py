"""A LoRA adapter that visibly changes the tiny model's output, as release bytes."""

from __future__ import annotations

from pathlib import Path


def lora_files(model_dir: Path, folder: Path, seed: int = 1) -> dict[str, bytes]:
    """A peft LoRA adapter on the model with random, non-zero B matrices (so it changes the
    output), saved in `folder` and returned as {file name: bytes}. Every matrix comes from
    `seed` alone: peft draws A from torch's global generator, whose state depends on the tests
    that ran before, and an adapter that changed from run to run made greedy near-ties flaky."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(model_dir))
    config = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj"]
    )
    model = get_peft_model(base, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_A" in name:  # peft's own scale: uniform in +-1/sqrt(fan in)
                bound = param.shape[1] ** -0.5
                param.copy_((torch.rand(param.shape, generator=generator) * 2 - 1) * bound)
            elif "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator))
    model.save_pretrained(str(folder))
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
