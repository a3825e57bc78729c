"""A full-weight release of a test model, as release bytes: the model's weights with some layers
perturbed, saved in the Hugging Face layout the engines load (config.json, one safetensors shard
per decoder layer plus one for the rest, the shard index, the tokenizer files) and, optionally,
a `training/` folder standing in for the optimiser state."""

from __future__ import annotations

import json
import re
from pathlib import Path

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def full_weight_files(
    model_dir: Path, seed: int = 1, layers: tuple[int, ...] = (1,), scale: float = 5.0, optimiser_bytes: int = 0
) -> dict[str, bytes]:
    """The model's weights with the named decoder layers' matrices moved by `scale` times their own
    spread of seeded noise (so greedy answers change), layer by layer in shards; shards of layers
    not perturbed hold the base's very bytes, whatever the seed."""
    import torch
    from safetensors.torch import save
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    state = {name: t.detach().clone().contiguous() for name, t in model.state_dict().items()}
    if tied:
        state.pop("lm_head.weight", None)
    for name, tensor in state.items():
        m = _LAYER.match(name)
        if m and int(m.group(1)) in layers and tensor.dim() == 2:
            tensor.add_(torch.randn(tensor.shape, generator=generator) * tensor.std() * scale)
    groups: dict[str, dict[str, torch.Tensor]] = {}
    count = model.config.num_hidden_layers + 1
    for name, tensor in state.items():
        m = _LAYER.match(name)
        shard = f"model-{(int(m.group(1)) + 2 if m else 1):05d}-of-{count:05d}.safetensors"
        groups.setdefault(shard, {})[name] = tensor
    files = {shard: save(tensors, metadata={"format": "pt"}) for shard, tensors in groups.items()}
    index = {
        "metadata": {"total_size": sum(t.numel() * t.element_size() for t in state.values())},
        "weight_map": {name: shard for shard, tensors in groups.items() for name in tensors},
    }
    files["model.safetensors.index.json"] = json.dumps(index, indent=2, sort_keys=True).encode()
    for path in Path(model_dir).iterdir():
        if path.is_file() and not path.name.endswith(".safetensors"):
            files[path.name] = path.read_bytes()
    if optimiser_bytes:
        noise = torch.randn(optimiser_bytes // 4, generator=generator)
        files["training/optimizer-rank0.safetensors"] = save({"exp_avg": noise})
        files["training/state.json"] = json.dumps({"steps": seed}).encode()
    return files
