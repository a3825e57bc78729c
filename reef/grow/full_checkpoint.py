"""A full-weight checkpoint as files: the Hugging Face layout the engines load, split by layer,
and the optimiser's moments beside it, split the same way.

    config.json, generation_config.json, tokenizer files   the base folder's, as they are
    model.safetensors.index.json                           {"metadata": {"total_size"}, "weight_map"}
    model-0000K-of-0000N.safetensors                       shard 1: what no layer holds (embeddings,
                                                           final norm, an untied head); shard 2 + i: layer i
    training/optimizer-0000K-of-0000N.safetensors          per parameter: `<name>.exp_avg`, `.exp_avg_sq`, `.step`
    training/state.json                                    {"format", "kind": "full", "steps", "ranks"}

One shard a layer means a layer whose weights did not change has the same bytes, and the same
content id in the artifact store, in every release. The moments are whole tensors (gathered
from the ranks), so a checkpoint resumes on any number of ranks. Parameter names are the
model's (`named_parameters`, a tied head once), which are the checkpoint keys transformers
writes and the engines read.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Mapping

import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from reef.core.training import FULL_INDEX, TRAINING_FOLDER

STATE_FILE = TRAINING_FOLDER + "state.json"
FORMAT = 1
MOMENTS = ("exp_avg", "exp_avg_sq", "step")
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
# what a model folder holds besides its weights: copied into every checkpoint as it is
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".index.json", ".msgpack", ".h5")


def shard_of(name: str) -> int:
    """The shard (0-based) a parameter is written to: 0 for what no layer holds, 1 + its layer."""
    found = _LAYER.search(name)
    return 0 if found is None else 1 + int(found.group(1))


def shard_name(prefix: str, index: int, count: int) -> str:
    return f"{prefix}-{index + 1:05d}-of-{count:05d}.safetensors"


def folder_files(model_dir: Path) -> dict[str, bytes]:
    """The base folder's files that are not weights (config, generation config, tokenizer,
    chat template): a checkpoint carries them so that it loads as a model folder of its own."""
    return {
        path.name: path.read_bytes()
        for path in sorted(Path(model_dir).iterdir())
        if path.is_file() and not path.name.endswith(WEIGHT_SUFFIXES) and not path.name.startswith(".")
    }


def _sharded(tensors: Mapping[str, torch.Tensor], count: int, prefix: str) -> dict[str, bytes]:
    groups: list[dict[str, torch.Tensor]] = [{} for _ in range(count)]
    for name, tensor in tensors.items():
        groups[shard_of(name)][name] = tensor.contiguous()
    return {
        shard_name(prefix, i, count): save_safetensors(group, metadata={"format": "pt"})
        for i, group in enumerate(groups)
    }


def weights_files(tensors: Mapping[str, torch.Tensor], layers: int, extra: Mapping[str, bytes]) -> dict[str, bytes]:
    """The servable files of a full-weight checkpoint: `extra` (the base folder's other files),
    the shards and their index."""
    count = layers + 1
    shards = _sharded(tensors, count, "model")
    weight_map = {name: shard_name("model", shard_of(name), count) for name in sorted(tensors)}
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    return {**extra, **shards, FULL_INDEX: json.dumps(index, indent=2, sort_keys=True).encode()}


def optimizer_files(
    moments: Mapping[str, Mapping[str, torch.Tensor]], layers: int, steps: int, ranks: int
) -> dict[str, bytes]:
    """The optimiser's state: each parameter's moments (whole tensors), split by layer."""
    flat = {f"{name}.{moment}": value for name, entry in moments.items() for moment, value in entry.items()}
    shards = _sharded(flat, layers + 1, TRAINING_FOLDER + "optimizer")
    state = {"format": FORMAT, "kind": "full", "steps": steps, "ranks": ranks}
    return {**shards, STATE_FILE: json.dumps(state, sort_keys=True).encode()}


def read_weights(files: Mapping[str, bytes]) -> dict[str, torch.Tensor]:
    """Every weight of a full-weight checkpoint, by name (from its index's shards, or one file)."""
    if FULL_INDEX in files:
        names = sorted(set(json.loads(files[FULL_INDEX])["weight_map"].values()))
    else:
        names = ["model.safetensors"]
    tensors: dict[str, torch.Tensor] = {}
    for name in names:
        if name not in files:
            raise ValueError(f"the checkpoint's index names {name}, which it does not hold")
        tensors.update(load_safetensors(files[name]))
    return tensors


def read_optimizer(files: Mapping[str, bytes]) -> tuple[int, dict[str, dict[str, torch.Tensor]]]:
    """The steps taken and each parameter's moments; (0, {}) without optimiser state."""
    if STATE_FILE not in files:
        return 0, {}
    meta = json.loads(files[STATE_FILE])
    if meta.get("format") != FORMAT or meta.get("kind") != "full":
        raise ValueError(f"optimiser state {meta.get('kind')!r} format {meta.get('format')!r}, expected full {FORMAT}")
    moments: dict[str, dict[str, torch.Tensor]] = {}
    for name, data in sorted(files.items()):
        if name.startswith(TRAINING_FOLDER + "optimizer-") and name.endswith(".safetensors"):
            for key, value in load_safetensors(data).items():
                param, moment = key.rsplit(".", 1)
                moments.setdefault(param, {})[moment] = value
    return int(meta["steps"]), moments
