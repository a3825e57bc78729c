"""Full-weight releases on a runtime: the servable half of the content written out as a Hugging
Face folder (config, safetensors shards and index, tokenizer files; never `training/`, the
optimiser), and, for the embedded runtime, read back as a model of its own.

A full-weight release replaces every weight of the base model (`reef.core.training.weights_kind`
says "full"), so unlike a LoRA adapter it cannot sit beside other releases on one set of base
weights: the embedded runtime keeps a model per resident full-weight load, and an engine (vLLM,
SGLang) reloads its weights from the folder (docs/engines.md, "Full-weight releases").
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Mapping

from reef.core.training import full_weights_part


def write_full_weights(files: Mapping[str, bytes], folder: Path) -> Path:
    """Write the release's servable files into a fresh `folder` (replacing what is there)."""
    part = full_weights_part(files)
    if part is None:
        raise ValueError("the content holds no full weights (config.json and safetensors at its root)")
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for name, data in part.items():
        (folder / name).write_bytes(data)
    return folder


def load_full_model(files: Mapping[str, bytes], dtype: Any) -> Any:
    """The release's weights as a transformers model in eval mode (read from a temporary folder)."""
    import tempfile

    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a server's log is no place for tqdm bars
    with tempfile.TemporaryDirectory(prefix="reef-full-") as tmp:
        folder = write_full_weights(files, Path(tmp) / "weights")
        return AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype).eval()
