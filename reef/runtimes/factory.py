"""Build the runtime the config asks for. Heavy imports (torch) happen only for `embedded`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from reef.config import ServeConfig
from reef.runtimes.base import Runtime


def build_runtime(config: ServeConfig, progress: Callable[[str], None] | None = None) -> Runtime:
    if config.runtime_kind == "upstream":
        from reef.runtimes.upstream import UpstreamRuntime

        up = config.upstream
        if not up.url:
            raise ValueError("runtime 'upstream' needs upstream.url (or REEF_UPSTREAM_URL)")
        return UpstreamRuntime(
            up.url,
            api_key=up.api_key,
            model=up.model,
            dialect=up.dialect,
            pass_model_through=up.pass_model_through,
            timeout=up.timeout,
            max_response_bytes=up.max_response_bytes,
        )
    if config.runtime_kind == "vllm":
        from reef.runtimes.vllm import build_vllm_runtime

        return build_vllm_runtime(config, progress)
    if config.runtime_kind == "sglang":
        from reef.runtimes.sglang import build_sglang_runtime

        return build_sglang_runtime(config)
    require_embedded(config)
    from reef.runtimes.embedded import EmbeddedRuntime
    from reef.runtimes.model_files import default_cache_dir, ensure_embedded_model

    emb = config.embedded
    model_dir: Path = emb.model_dir or ensure_embedded_model(emb.cache_dir or default_cache_dir(), progress)
    return EmbeddedRuntime(
        model_dir,
        threads=emb.threads or half_the_cores(config),
        max_batch=emb.max_batch,
        default_max_tokens=emb.default_max_tokens,
        min_shared_prefix=emb.min_shared_prefix,
        continuous=emb.continuous_batching,
        turn_steps=emb.turn_steps,
    )


def require_embedded(config: ServeConfig) -> None:
    """The embedded runtime needs the `embedded` extra; without it, say how to get it, or how to
    serve without it, before anything starts."""
    from reef.extras import require

    if config.runtime == "embedded":
        require("the embedded runtime (runtime: embedded)", "embedded")
    else:
        require(
            "no upstream is configured, so reef serve would run the embedded model; it",
            "embedded",
            otherwise="or serve in front of a provider: --upstream-url URL (or REEF_UPSTREAM_URL, "
            "upstream.url in the config)",
        )


def half_the_cores(config: ServeConfig) -> int | None:
    """With a learner beside it, serving takes half the cores and training the other half:
    two torch processes that each take every core slow each other down many times over."""
    if not config.learner.enabled:
        return None
    return max(1, (os.cpu_count() or 2) // 2)
