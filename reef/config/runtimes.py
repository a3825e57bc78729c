"""Settings of the runtimes that serve the model: an upstream provider, the embedded model, vLLM, SGLang."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from reef.config.strict import Strict


class UpstreamConfig(Strict):
    url: str | None = Field(None, description="Provider base URL, e.g. https://api.openai.com/v1")
    api_key: str | None = Field(None, description="Provider key; never logged")
    model: str | None = Field(None, description="Model sent upstream (unless pass_model_through)")
    dialect: Literal["openai", "anthropic"] = Field("openai", description="The provider's API")
    pass_model_through: bool = Field(False, description="Send the client's model name upstream instead of model")
    timeout: float = Field(120.0, gt=0, description="Seconds before an upstream call fails with 502")
    max_response_bytes: int = Field(
        16 * 1024 * 1024,
        ge=1024,
        description="Largest provider answer (a whole body, or a stream in all); past it, 502",
    )


class EmbeddedConfig(Strict):
    model_dir: Path | None = Field(None, description="A transformers model folder; default: SmolLM2 from the cache")
    cache_dir: Path | None = Field(None, description="Where converted weights live; default ~/.cache/reef")
    max_batch: int = Field(8, ge=1, description="Concurrent requests generated together")
    default_max_tokens: int = Field(256, ge=1, description="Answer tokens when a request sets no limit")
    threads: int | None = Field(
        None, ge=1, description="Torch threads; default: half the cores when the learner is on, else all"
    )
    min_shared_prefix: int = Field(
        16,
        ge=0,
        description="Prefill a batch's common prompt prefix once when it has at least this many tokens; 0: off",
    )
    continuous_batching: bool = Field(
        False,
        description="A request joins its load's running batch between two "
        "decoding steps: lower latency behind long answers, fewer "
        "answers a second while Reef learns (docs/PERFORMANCE.md)",
    )
    turn_steps: int = Field(
        16,
        ge=1,
        description="Decoding steps one load's batch runs before another load "
        "with work (a gate's candidate, the serving release) takes a turn",
    )
    warm_start: bool = Field(
        True,
        description="reef serve: create the default scenario and generate one token on it before saying "
        "it is ready, so the first request does not wait for the model and the learner to load",
    )


class VLLMConfig(Strict):
    """The vLLM runtime (docs/engines.md): a vLLM OpenAI server Reef starts, or one it attaches to."""

    url: str | None = Field(
        None,
        description="Attach to this running vLLM (same machine: it reads adapter "
        "folders Reef writes); default: Reef starts its own",
    )
    model_dir: Path | None = Field(
        None,
        description="A Hugging Face model folder (with url: the weights the attached "
        "vLLM serves); default: embedded.model_dir, else SmolLM2",
    )
    model_name: str | None = Field(None, description="The base model's name in /v1/models; default: the folder's")
    env_dir: Path | None = Field(None, description="vLLM's own virtual environment; default <cache>/vllm-env")
    dtype: str = Field(
        "auto",
        description="--dtype of the engine; auto: float32 while the learner is on (the "
        "trainer's weights exactly), else bfloat16",
    )
    max_model_len: int = Field(2048, ge=16, description="The engine's context, prompt and answer together")
    max_lora_rank: int = Field(16, ge=1, description="Largest adapter rank vLLM accepts (>= learner.sao.lora_r)")
    max_loras: int = Field(4, ge=1, description="Adapters in one batch")
    kv_cache_gb: int = Field(1, ge=1, description="VLLM_CPU_KVCACHE_SPACE: GiB of KV cache (CPU build)")
    extra_args: list[str] = Field(default_factory=list, description="More vllm api_server flags")
    startup_timeout: float = Field(600.0, gt=0, description="Seconds vLLM may take to become healthy")
    load_timeout: float = Field(120.0, gt=0, description="Seconds an adapter load may take before it fails")
    timeout: float = Field(120.0, gt=0, description="Seconds one read from vLLM may wait")
    default_max_tokens: int = Field(256, ge=1, description="Answer tokens when a request sets no limit")


class SGLangConfig(Strict):
    """The SGLang runtime (docs/engines.md): an SGLang server started with --enable-lora, which Reef attaches to."""

    url: str | None = Field(None, description="The SGLang server's address (required by runtime sglang)")
    model_dir: Path | None = Field(
        None,
        description="The served model's folder here, whose tokenizer renders prompts "
        "and whose weights the learner trains; default: embedded.model_dir, "
        "else SGLang's tokenizer, and no weights learning",
    )
    model_name: str | None = Field(None, description="The model name /v1/models lists; default: SGLang's model_path")
    adapter_dir: Path | None = Field(
        None,
        description="Where adapter folders are written for SGLang to read (the same "
        "path on its machine); default <cache>/sglang-adapters",
    )
    load_timeout: float = Field(120.0, gt=0, description="Seconds an adapter load may take before it fails")
    timeout: float = Field(120.0, gt=0, description="Seconds one read from SGLang may wait")
    default_max_tokens: int = Field(256, ge=1, description="Answer tokens when a request sets no limit")
