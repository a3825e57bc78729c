"""AdamW's state as files beside the adapter it trains, so a checkpoint resumes exactly.

    training/optimizer.safetensors   per adapter parameter: `<name>.exp_avg`, `<name>.exp_avg_sq`, `<name>.step`
    training/state.json              {"format": 1, "steps": optimiser steps taken}

Parameter names are peft's with the adapter's own name taken out, so a checkpoint loads into an
adapter of any name. The runtimes never read `training/`; the gate and the chain carry it along.
"""

from __future__ import annotations

import json
from typing import Any

import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from reef.core.training import TRAINING_FOLDER

OPTIMIZER_FILE = TRAINING_FOLDER + "optimizer.safetensors"
STATE_FILE = TRAINING_FOLDER + "state.json"
FORMAT = 1
MOMENTS = ("exp_avg", "exp_avg_sq", "step")


def optimizer_files(optimizer: torch.optim.Optimizer, names: list[str], steps: int) -> dict[str, bytes]:
    """The optimiser's moments per named parameter (none before its first step)."""
    state = optimizer.state_dict()["state"]
    tensors = {
        f"{names[index]}.{moment}": value.detach().cpu().clone().contiguous()
        for index, entry in state.items()
        for moment, value in entry.items()
        if moment in MOMENTS
    }
    return {
        OPTIMIZER_FILE: save_safetensors(tensors),
        STATE_FILE: json.dumps({"format": FORMAT, "steps": steps}, sort_keys=True).encode(),
    }


def restore_optimizer(optimizer: torch.optim.Optimizer, names: list[str], files: dict[str, bytes]) -> int:
    """Load the moments `optimizer_files` wrote into `optimizer` (its parameters in `names`
    order); returns the steps taken. A checkpoint without them leaves a fresh optimiser (0)."""
    if STATE_FILE not in files or OPTIMIZER_FILE not in files:
        return 0
    meta = json.loads(files[STATE_FILE])
    if meta.get("format") != FORMAT:
        raise ValueError(f"optimiser state format {meta.get('format')!r}, expected {FORMAT}")
    tensors = load_safetensors(files[OPTIMIZER_FILE])
    unknown = {key.rsplit(".", 1)[0] for key in tensors} - set(names)
    if unknown:
        raise ValueError(f"optimiser state for parameters the adapter lacks: {sorted(unknown)[:3]}")
    saved = optimizer.state_dict()
    state: dict[int, dict[str, Any]] = {}
    for index, name in enumerate(names):
        entry = {moment: tensors[f"{name}.{moment}"] for moment in MOMENTS if f"{name}.{moment}" in tensors}
        if entry:
            state[index] = entry
    optimizer.load_state_dict({"state": state, "param_groups": saved["param_groups"]})
    return int(meta["steps"])
